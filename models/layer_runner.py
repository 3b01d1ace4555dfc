"""How a stage calls its decoder layers: as they are, under activation checkpointing, or compiled.

With checkpointing each layer runs under ``torch.utils.checkpoint.checkpoint(...,
use_reentrant=False)``: its forward keeps only its input, and the backward runs it again to get
the rest. That costs about one more forward per micro-batch and spares a stage all but one
hidden state per layer of the activations it holds for each micro-batch in flight; the planner
turns it on for a stage whose activations in flight would not fit otherwise.

With compile each layer is ``torch.compile``'d on its own (``dynamic=False``: a stage sees one
micro-batch shape), as torchtitan compiles per block: the blocks are alike, so one compiled
graph serves all, and the stage's parameters keep their names (the compiled wrapper is held
here, never registered as a submodule). Compilation is lazy and can fail on a machine without
a compiler or with an unsupported op; so the first micro-batch runs a **trial**, a forward and
backward of the compiled stage whose gradients are thrown away. If it fails, the stage goes
eager with a warning that says why; it never stops training. If it compiles, the trial then
times one more compiled pass against one eager pass of the same micro-batch and keeps the
compiled layers only if they **measure faster** (a CPU, or small layers on a GPU, often do not:
compiled code pays guards and launches that eager does not). Compiling is bounded: one graph
per layer shape (``dynamic=False``), made once, at the trial, and its time is logged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

logger = logging.getLogger(__name__)

COMPILE_BACKEND = "inductor"
"""torch.compile's backend for the layers (tests use "eager", which compiles in no time)."""


def _hidden_of(out: Any) -> torch.Tensor:
    # transformers 5 blocks return the hidden states; 4.x returned a tuple with them first.
    hidden: torch.Tensor = out[0] if isinstance(out, tuple) else out
    return hidden


def _reason(error: BaseException) -> str:
    """What failed, in a line: torch's message names the backend on its first line and the
    compiler's own error on the next; its advice on logging that follows is left out."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    kept = [line for line in lines[:2] if not line.startswith("Set TORCHDYNAMO_VERBOSE")]
    return " ".join([f"{type(error).__name__}:", *kept])


class LayerRunner:
    """Calls a stage's decoder layers, each checkpointed and/or compiled as configured."""

    def __init__(
        self,
        *,
        checkpointing: bool = False,
        compile: bool = False,
        backend: str | Callable[..., Any] = COMPILE_BACKEND,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        """``clock``: what the trial times the compiled and eager passes with (a test's fake)."""
        self.checkpointing = checkpointing
        self.compile = compile
        self.backend = backend
        self.compile_error: str | None = None
        """Why compiling failed (the stage then runs eager); None while it has not."""
        self.trial_s: dict[str, float] = {}
        """The trial's figures: "compile" (the first pass, compiling), "compiled" and "eager"."""
        self._clock = clock
        self._compiled: dict[int, Callable[..., Any]] = {}
        self._tried = not compile

    def call(self, block: nn.Module, hidden: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        """``block(hidden, **kwargs)``'s hidden states, run as this runner is set to."""
        fn: Callable[..., Any] = self._compiled_block(block) if self.compile else block
        if self.checkpointing and torch.is_grad_enabled():
            return _hidden_of(checkpoint(fn, hidden, use_reentrant=False, **kwargs))
        return _hidden_of(fn(hidden, **kwargs))

    def try_compile(self, forward: Callable[[], torch.Tensor], params: Sequence[torch.Tensor], where: str) -> None:
        """Once, before the first real forward: compile by running ``forward`` (the stage's) and
        its backward, then time a compiled and an eager pass; the gradients go nowhere. On a
        failure, or where compiled measures no faster, run eager from then on (module doc)."""
        if self._tried or not torch.is_grad_enabled():
            return
        self._tried = True
        trainable = [p for p in params if p.requires_grad]
        device = trainable[0].device if trainable else torch.device("cpu")

        def timed() -> float:
            started = self._clock()
            out = forward()
            torch.autograd.grad(out.float().sum(), trainable, allow_unused=True)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            return self._clock() - started

        try:
            self.trial_s["compile"] = timed()
            self.trial_s["compiled"] = timed()
        except Exception as e:  # anything the compiler raises: eager still computes the same
            self.compile_error = _reason(e)
            self._go_eager()
            logger.warning("%s: torch.compile of its layers failed (%s); running them eager", where, self.compile_error)
            return
        self.compile = False
        self.trial_s["eager"] = timed()
        self.compile = self.trial_s["compiled"] < self.trial_s["eager"]
        if not self.compile:
            self._go_eager()
        logger.info(
            "%s: layers compiled in %.1f s; a pass takes %.1f ms compiled, %.1f ms eager: running them %s",
            where,
            self.trial_s["compile"],
            self.trial_s["compiled"] * 1e3,
            self.trial_s["eager"] * 1e3,
            "compiled" if self.compile else "eager",
        )

    def _go_eager(self) -> None:
        self.compile = False
        self._compiled.clear()

    def _compiled_block(self, block: nn.Module) -> Callable[..., Any]:
        found = self._compiled.get(id(block))
        if found is None:
            found = self._compiled[id(block)] = torch.compile(block, dynamic=False, backend=self.backend)
        return found

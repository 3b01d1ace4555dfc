"""models/layer_runner.py: checkpointed and compiled layers compute what plain ones do; checkpointing
keeps fewer activations; compiled layers stay only if they measure faster; a compile that fails
leaves the stage eager, with a warning."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
import torch

from swarmd.models.build import ModelShape, build_model
from swarmd.models.layer_runner import LayerRunner
from swarmd.models.stages import StageModule

pytestmark = pytest.mark.timeout(120)

PLAN = [(0, 2), (2, 4)]


def _shape(family: str) -> ModelShape:
    return ModelShape(family=family, layers=4, hidden=32, heads=4, vocab=256, seq_len=16)


def _ids() -> torch.Tensor:
    return torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(5))


def _stage_grads(stage: StageModule, x: torch.Tensor, labels: torch.Tensor | None) -> tuple[torch.Tensor, dict]:
    """The stage's output (the loss on the last stage) and its parameters' gradients, after a
    backward of the output's sum."""
    stage.zero_grad(set_to_none=True)
    out = stage(x, labels=labels) if stage.is_last else stage(x)
    out.float().sum().backward()
    return out.detach(), {name: p.grad.clone() for name, p in stage.named_parameters() if p.grad is not None}


def _assert_same(a: tuple[torch.Tensor, dict], b: tuple[torch.Tensor, dict], atol: float, rtol: float) -> None:
    torch.testing.assert_close(a[0], b[0], atol=atol, rtol=rtol)
    assert a[1].keys() == b[1].keys() and a[1]
    for name in a[1]:
        torch.testing.assert_close(a[1][name], b[1][name], atol=atol, rtol=rtol, msg=name)


def _count_saved(stage: StageModule, x: torch.Tensor) -> tuple[int, int]:
    """Tensors, and their bytes, that autograd keeps for the backward of one forward."""
    saved: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        stage(x)
    # Parameters saved for their matmuls are kept anyway; count activations only.
    params = {p.data_ptr() for p in stage.parameters()}
    activations = [t for t in saved if t.data_ptr() not in params]
    return len(activations), sum(t.numel() * t.element_size() for t in activations)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_checkpointed_layers_give_the_plain_gradients_and_keep_fewer_activations(family: str) -> None:
    model = build_model(_shape(family), 3)
    ids = _ids()
    hidden = torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(1), requires_grad=True)
    for stage_index, x, labels in ((0, ids, None), (1, hidden, ids)):
        plain, checkpointed = StageModule(model, PLAN, stage_index), StageModule(model, PLAN, stage_index)
        checkpointed.set_layer_options(checkpointing=True)
        # The same ops again in the backward, in the same order: equal to float rounding.
        _assert_same(_stage_grads(checkpointed, x, labels), _stage_grads(plain, x, labels), atol=1e-6, rtol=1e-5)
    first = StageModule(model, PLAN, 0)
    kept_plain, bytes_plain = _count_saved(first, ids)
    first.set_layer_options(checkpointing=True)
    kept, kept_bytes = _count_saved(first, ids)
    # Each layer keeps its input alone (and the embeddings what they keep), not its attention's
    # and MLP's intermediates.
    assert kept < kept_plain / 4 and kept_bytes < bytes_plain / 4, (kept, kept_plain, kept_bytes, bytes_plain)


def _clock(*readings: float) -> Callable[[], float]:
    """A clock that reads ``readings`` in turn: the trial's start and end of each timed pass."""
    it = iter(readings)
    return lambda: next(it)


@pytest.mark.parametrize(
    ("family", "eager_s", "kept"), [("gpt2", 2.0, True), ("llama", 2.0, True), ("llama", 0.5, False)]
)
def test_compiled_layers_compute_what_eager_ones_do_and_stay_only_if_faster(
    family: str, eager_s: float, kept: bool
) -> None:
    torch._dynamo.reset()
    model = build_model(_shape(family), 3)
    ids = _ids()
    eager, compiled = StageModule(model, [(0, 4)], 0), StageModule(model, [(0, 4)], 0)
    # aot_eager traces forward and backward as inductor does, without a C compiler's minutes. The
    # trial's passes read: compiling 10 s, compiled 1 s, eager ``eager_s``.
    clock = _clock(0.0, 10.0, 10.0, 11.0, 11.0, 11.0 + eager_s)
    compiled.layers_run = LayerRunner(compile=True, backend="aot_eager", clock=clock)
    expected = _stage_grads(eager, ids, ids)
    for _ in range(2):  # the trial, then the compiled graphs reused (or eager, where it was faster)
        _assert_same(_stage_grads(compiled, ids, ids), expected, atol=1e-5, rtol=1e-4)
    assert compiled.layers_run.compile == kept and compiled.layers_run.compile_error is None
    assert compiled.layers_run.trial_s == {"compile": 10.0, "compiled": 1.0, "eager": eager_s}
    assert [n for n, _ in compiled.named_parameters()] == [n for n, _ in eager.named_parameters()]


def _failing_backend(graph: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> None:
    raise RuntimeError("no C compiler on this machine")


def test_a_compile_that_fails_leaves_the_stage_eager_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    torch._dynamo.reset()
    model = build_model(_shape("llama"), 3)
    ids = _ids()
    eager, failing = StageModule(model, [(0, 4)], 0), StageModule(model, [(0, 4)], 0)
    failing.layers_run = LayerRunner(compile=True, backend=_failing_backend)
    with caplog.at_level(logging.WARNING, logger="swarmd.models.layer_runner"):
        got = _stage_grads(failing, ids, ids)
    _assert_same(got, _stage_grads(eager, ids, ids), atol=0, rtol=0)  # eager: the same ops exactly
    assert not failing.layers_run.compile
    assert "no C compiler on this machine" in (failing.layers_run.compile_error or "")
    warned = [r.message for r in caplog.records if "torch.compile of its layers failed" in r.message]
    assert warned and "running them eager" in warned[0] and "no C compiler" in warned[0]

"""The peak of a process's live tensor memory, counted on any device, CPU included.

``torch.cuda.max_memory_allocated`` has no CPU counterpart, and a process's resident set
(``ru_maxrss``) counts the interpreter, the libraries and pages the allocator keeps: it cannot
tell a cell's memory model from noise. ``TensorPeak`` counts what the model predicts: the bytes
of tensor storage alive at once. It is a ``TorchDispatchMode``, so it sees every tensor an
operator returns, the autograd engine's backward operators and an activation checkpoint's
recompute included (the mode is part of the thread-local state the engine runs them under).
Each storage is counted once, whatever views of it exist, from the operator that returns it to
the moment it is freed (a finalizer on the storage, which torch keeps alive exactly as long as
the C++ storage). Tensors that exist before the mode is entered are counted from the start:
those given, or every tensor the garbage collector can reach.

Not counted: an operator's scratch memory that no tensor holds (a kernel's workspace), the
caching allocator's reserve and fragmentation, and storages made without an operator (a
deep copy's storage copy): measure a cell's work inside the mode, build it before.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class TensorPeak(TorchDispatchMode):
    """Live tensor bytes and their peak while the mode is on (``with TensorPeak() as peak:``)."""

    def __init__(self, tensors: Iterable[torch.Tensor] | None = None, device: str | None = None) -> None:
        """``tensors``: those alive at the start (None: every tensor the garbage collector
        reaches); ``device``: count only storages on that device type (``"cpu"``), None: all."""
        super().__init__()
        self.device = device
        self._start = tensors
        self._live: dict[int, int] = {}
        self.current = 0
        """Bytes of tensor storage alive now."""
        self.peak = 0
        """The most bytes alive at once since the start or ``reset_peak``."""

    def __enter__(self) -> TensorPeak:
        start = self._start if self._start is not None else _reachable_tensors()
        for tensor in start:
            self._track(tensor)
        self._start = None
        super().__enter__()
        return self

    def reset_peak(self) -> None:
        """From now on, the peak counts from what is alive now."""
        self.peak = self.current

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for value in tree_flatten(out)[0]:
            if isinstance(value, torch.Tensor):
                self._track(value)
        return out

    def _track(self, tensor: torch.Tensor) -> None:
        if tensor.is_meta or (self.device is not None and tensor.device.type != self.device):
            return
        storage = tensor.untyped_storage()
        key, size = storage._cdata, storage.nbytes()
        known = self._live.get(key)
        if known is None:
            weakref.finalize(storage, self._free, key)
        self._live[key] = size
        self.current += size - (known or 0)
        self.peak = max(self.peak, self.current)

    def _free(self, key: int) -> None:
        self.current -= self._live.pop(key, 0)


def _reachable_tensors() -> list[torch.Tensor]:
    gc.collect()
    return [obj for obj in gc.get_objects() if issubclass(type(obj), torch.Tensor)]

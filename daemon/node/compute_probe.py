"""The device's achieved TFLOPS: the matmuls of one of the run's blocks, timed as the cells run them.

A rated figure (``swarmd.node.rated_tflops``) is what the silicon could do; the planner needs
what a cell does: in the cells' precision (bf16 autocast on a GPU that has it, fp32 on a CPU),
with the compute's torch threads (``[limits] torch_threads``), at the run's sizes (a tiny
model's 128-wide products reach a fraction of a large one's speed). So the probe multiplies what
one transformer block of the run multiplies, forward and backward (``block_matmuls``): the
projections with ``micro_batch * seq_len`` rows, and attention's two per-head products. Before
the run's spec is known it multiplies a generic block (``GENERIC``). ``doctor`` and the daemon's
heartbeats (``swarmd.node.presence``) report what it measures.

It is bounded in time, not in work: a 350M model's block is 1.5 TFLOP, tens of seconds on a CPU.
Each distinct product is timed alone, for an equal share of ``budget_s``, at the largest
fraction of its micro-batch size (its rows, or its sequence-heads for attention) whose call
takes a ``MIN_PASSES``-th of that share, found by growing it from a small first call; the
figure is the block's FLOPs over the time its products take at the speeds measured (the time a
whole block would take). Warm-up calls (kernel selection, allocation, cuBLAS' start) are never
timed, and each timed pass ends with the device synchronised.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from swarmd.errors import SwarmdError
from swarmd.node.device import free_memory_bytes

if TYPE_CHECKING:
    from swarmd.config import ComputeConfig
    from swarmd.models.shape import ModelShape
    from swarmd.peers.records.run_spec import RunSpec

logger = logging.getLogger(__name__)

PROBE_BUDGET_S = 0.8
"""Seconds of timed calls; the sizing and warm-ups before them take at most half as long again."""
MIN_PASSES = 4
"""Timed passes each product gets at least: a pass is about this share of its time."""
FIRST_CALL_FLOPS = 2e7
"""A product's first (sizing) call: short on any device (under a millisecond on one CPU core)."""
MIN_ROWS = 128
"""A projection is never timed with fewer rows (tokens) than this, nor than the run has: with
a few rows it reads its whole weight for little work, and measures memory, not compute."""
MAX_CALLS_PER_PASS = 1000
"""Calls between two synchronisations, at most: a small product on a GPU is timed over many."""
MAX_PROBE_BYTES = 1 << 30
"""Operands the probe holds at once, at most (and a quarter of the free memory)."""
DTYPE_BYTES = {"bf16": 2, "fp32": 4}


class ProbeError(SwarmdError):
    """The probe could not run: an unknown dtype, or a device with too little free memory."""


@dataclass(frozen=True)
class StageDims:
    """The sizes one transformer block of a run multiplies (every block of a run alike)."""

    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    seq_len: int
    micro_batch: int
    gated: bool
    """A gated MLP (Llama's SwiGLU): two input projections where GPT-2 has one."""

    @classmethod
    def of_run(cls, shape: ModelShape, micro_batch: int) -> StageDims:
        return cls(
            hidden=shape.hidden,
            intermediate=shape.intermediate_size,
            heads=shape.heads,
            kv_heads=shape.key_value_heads,
            seq_len=shape.seq_len,
            micro_batch=micro_batch,
            gated=shape.family == "llama",
        )

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def rows(self) -> int:
        """Tokens of one micro-batch: the rows of every projection."""
        return self.micro_batch * self.seq_len


GENERIC = StageDims(hidden=2048, intermediate=5504, heads=16, kv_heads=16, seq_len=1024, micro_batch=4, gated=True)
"""A 1B-class Llama block, four sequences of 1,024: what the probe multiplies before it knows
the run. Large enough that a GPU's speed is not its launch overhead; the probe takes the
fraction of it that its budget allows on a CPU."""


@dataclass(frozen=True)
class Matmul:
    """``count`` products of ``batch`` (m x k) by (k x n) matrices, one of whose sizes
    (``grows``: "m", "k" or "batch") is the micro-batch's, the others the model's."""

    m: int
    k: int
    n: int
    batch: int = 1
    count: int = 1
    grows: str = "batch"

    @property
    def flops(self) -> float:
        """All ``count`` products' FLOPs."""
        return self.count * self.call_flops

    @property
    def call_flops(self) -> float:
        return 2.0 * self.batch * self.m * self.k * self.n

    def operand_elements(self) -> int:
        """Elements of its two inputs and its output."""
        return self.batch * (self.m * self.k + self.k * self.n + self.m * self.n)

    def at(self, fraction: float) -> Matmul:
        """The product with ``fraction`` of its micro-batch size (at least 1)."""
        return replace(self, **{self.grows: max(1, round(getattr(self, self.grows) * fraction))})


def matmul_flops(products: list[Matmul]) -> float:
    return sum(p.flops for p in products)


def block_matmuls(dims: StageDims) -> list[Matmul]:
    """Every product one block computes on one micro-batch, forward and backward (those of one
    shape merged into one, counted).

    The projections have a micro-batch's tokens as rows: Q and O (hidden x hidden), K and V
    (hidden x kv_heads * head_dim), the MLP's input (hidden x intermediate, twice when gated)
    and output (intermediate x hidden); each is three products: x W forward, and backward the
    input's gradient dy W^T and the weight's x^T dy (whose inner size is the rows). Attention
    has, per head of each sequence, the scores Q K^T, (seq x head_dim) by (head_dim x seq), and
    the values P V, (seq x seq) by (seq x head_dim); backward, dP = dO V^T (the scores' shape)
    and dQ, dK, dV (the values'). That is ``ModelSpec``'s count: 6 FLOPs per parameter and 12
    seq_len hidden per token (the causal mask's half not saved)."""
    rows, kv = dims.rows, dims.kv_heads * dims.head_dim
    weights = [(dims.hidden, dims.hidden, 2), (dims.hidden, kv, 2), (dims.intermediate, dims.hidden, 1)]
    weights.append((dims.hidden, dims.intermediate, 2 if dims.gated else 1))
    counts: dict[tuple[int, int, int, int, str], int] = {}
    for k, n, count in weights:
        for shape in ((rows, k, n, 1, "m"), (rows, n, k, 1, "m"), (k, rows, n, 1, "k")):
            counts[shape] = counts.get(shape, 0) + count
    s, d, sequence_heads = dims.seq_len, dims.head_dim, dims.micro_batch * dims.heads
    counts[(s, d, s, sequence_heads, "batch")] = 2
    counts[(s, s, d, sequence_heads, "batch")] = 4
    return [Matmul(m, k, n, batch, count, grows) for (m, k, n, batch, grows), count in counts.items()]


def compute_threads(torch_threads: int) -> int:
    """The torch threads the cells compute with: ``[limits] torch_threads``, or torch's default
    (one per core) for 0, as ``swarmd.node.limits.live`` sets them."""
    if torch_threads:
        return torch_threads
    import torch

    return torch.get_num_threads()


@dataclass(frozen=True)
class ProbeResult:
    """What one probe measured."""

    achieved_tflops: float
    """The block's FLOPs over the time its products take at the speeds measured."""
    dtype: str
    threads: int
    run_shapes: bool
    """Measured at the run's block (False: ``GENERIC``)."""
    min_fraction: float
    """The smallest fraction of a micro-batch a product was timed at (1.0: all at full size)."""
    free_memory_bytes: int
    """The device's free memory as the probe started."""
    seconds: float
    """How long the whole probe took, warm-ups and sizing included."""


def probe_device(device: str, compute: ComputeConfig, torch_threads: int, run: RunSpec | None) -> ProbeResult:
    """The probe as the cells would compute on ``device``: ``run``'s block (None: ``GENERIC``) in
    ``[compute]``'s precision, with ``[limits] torch_threads`` (0: torch's default)."""
    from swarmd.models.precision import resolve_precision  # imports torch: in the probe's thread

    dims = GENERIC if run is None else StageDims.of_run(run.model, run.micro_batch)
    dtype = resolve_precision(compute.precision, device)
    return measure_achieved_tflops(device, dtype, compute_threads(torch_threads), dims, run is not None)


def measure_achieved_tflops(
    device: str, dtype: str, threads: int, dims: StageDims, run_shapes: bool, budget_s: float = PROBE_BUDGET_S
) -> ProbeResult:
    """Time ``dims``' block on ``device`` in ``dtype`` ("bf16" or "fp32") with ``threads`` torch
    threads (restored after): ``budget_s`` of timed calls shared by its products, plus their
    warm-ups and sizing."""
    import torch

    from swarmd.models.precision import start_device

    if dtype not in DTYPE_BYTES:
        raise ProbeError(f"the probe computes in bf16 or fp32, not {dtype!r}")
    started = time.perf_counter()
    free = free_memory_bytes(device)
    cap_elements = (min(MAX_PROBE_BYTES, free // 4) if free else MAX_PROBE_BYTES) // DTYPE_BYTES[dtype]
    products = block_matmuls(dims)
    run = _Runner(torch, torch.device(device), torch.bfloat16 if dtype == "bf16" else torch.float32)
    start_device(run.device)  # fp32 matmuls on a GPU in TF32, as the cells will run them
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        speeds = [_product_speed(run, p, cap_elements, budget_s / len(products)) for p in products]
    finally:
        torch.set_num_threads(previous)
        run.operands = ()
        if run.device.type == "cuda":
            torch.cuda.empty_cache()  # the probe's operands go back to the device, not to the cache
    block_s = sum(p.flops / speed for p, (speed, _) in zip(products, speeds, strict=True))
    result = ProbeResult(
        achieved_tflops=matmul_flops(products) / block_s / 1e12,
        dtype=dtype,
        threads=threads,
        run_shapes=run_shapes,
        min_fraction=min(fraction for _, fraction in speeds),
        free_memory_bytes=free,
        seconds=time.perf_counter() - started,
    )
    logger.info(
        "Measured %.3g TFLOPS on %s (%s, %d thread(s), %s block, products at >= %.2g of a micro-batch) in %.2f s",
        result.achieved_tflops,
        device,
        dtype,
        threads,
        "the run's" if run_shapes else "a generic",
        result.min_fraction,
        result.seconds,
    )
    return result


class _Runner:
    """One product's operands on the device, and timed, synchronised calls of it."""

    def __init__(self, torch: Any, device: Any, dtype: Any) -> None:
        self.torch, self.device, self.dtype = torch, device, dtype
        self.operands: tuple[Any, ...] = ()

    def allocate(self, p: Matmul) -> None:
        """Operands filled with ones: values do not change a matmul's speed, but uninitialised
        memory might hold denormals, which do on a CPU. An input of the shape the last product
        had is kept (the weight, while the rows grow); the rest are freed first."""
        lead = (p.batch,) if p.batch > 1 else ()
        shapes = ((*lead, p.m, p.k), (*lead, p.k, p.n))
        kept = {tuple(t.shape): t for t in self.operands[:2] if tuple(t.shape) in shapes}
        self.operands = ()
        torch, device, dtype = self.torch, self.device, self.dtype
        a, b = (kept.pop(s) if s in kept else torch.ones(s, device=device, dtype=dtype) for s in shapes)
        self.operands = (a, b, torch.empty(*lead, p.m, p.n, device=device, dtype=dtype))

    def timed(self, calls: int, deadline: float = math.inf) -> tuple[float, int]:
        """(seconds, calls made) for up to ``calls`` calls, the device synchronised before and
        after. On a CPU the calls stop at ``deadline``: a core taken by another process can make
        one call a hundred times slower than the last (a GPU's are queued, and finish)."""
        a, b, out = self.operands
        self.synchronize()
        started, made = time.perf_counter(), 0
        cpu = self.device.type == "cpu"
        while made < calls and not (cpu and made and time.perf_counter() > deadline):
            self.torch.matmul(a, b, out=out)
            made += 1
        self.synchronize()
        return time.perf_counter() - started, made

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)


def _product_speed(run: _Runner, p: Matmul, cap_elements: int, slice_s: float) -> tuple[float, float]:
    """(FLOP/s, the fraction of its micro-batch size timed) of one product: grown from a small
    first call (``MIN_ROWS`` rows at least) until a call takes ``slice_s / MIN_PASSES`` (or it
    is full size, as large as memory allows, or half the slice has gone in growing it), then
    timed until ``slice_s`` of calls of that size (the first the last sizing call), or twice
    that since it began, has passed; a warm-up call at each size is never timed."""
    largest = _largest_fraction(p, cap_elements)
    floor = MIN_ROWS / getattr(p, p.grows) if p.grows != "batch" else 0.0
    fraction = min(largest, max(floor, FIRST_CALL_FLOPS / p.call_flops))
    started = time.perf_counter()
    target_s, growing, ending = slice_s / MIN_PASSES, started + slice_s / 2, started + 2 * slice_s
    run.allocate(p.at(fraction))
    run.timed(1)  # warm-up
    took, _ = run.timed(1)
    while fraction < largest and took < target_s and time.perf_counter() < growing:
        fraction = min(largest, fraction * min(16.0, max(2.0, target_s / max(took, 1e-9))))
        run.allocate(p.at(fraction))
        run.timed(1)  # warm-up at the new size
        took, _ = run.timed(1)
    calls, elapsed = 1, took
    while elapsed < slice_s and time.perf_counter() < ending:
        per_pass = max(1, min(MAX_CALLS_PER_PASS, int(target_s * calls / max(elapsed, 1e-9))))
        seconds, made = run.timed(per_pass, ending)  # a pass of about target_s, as the calls so far took
        elapsed, calls = elapsed + seconds, calls + made
    timed = p.at(fraction)
    return calls * timed.call_flops / elapsed, getattr(timed, p.grows) / getattr(p, p.grows)


def _largest_fraction(p: Matmul, cap_elements: int) -> float:
    """The largest fraction (1 at most, halving) whose operands fit ``cap_elements``."""
    fraction = 1.0
    while p.at(fraction).operand_elements() > cap_elements:
        if getattr(p.at(fraction), p.grows) == 1:
            raise ProbeError(
                f"the probe's smallest {p.m}x{p.k}x{p.n} product needs {p.at(fraction).operand_elements()} "
                f"elements, over the {cap_elements} a quarter of the device's free memory holds: free memory on it"
            )
        fraction /= 2
    return fraction

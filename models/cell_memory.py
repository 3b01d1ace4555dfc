"""What a cell allocates: the memory model of one stage's ``CellCompute``, without torch.

A pure function of the block's sizes, the stage's layers and edges, the micro-batch, the
micro-batches in flight, the precision, activation checkpointing and the mode, for SDPA
attention (no ``T x T`` scores kept). It predicts the peak of live tensor bytes that
``tensor_peak.TensorPeak`` counts on CPU and ``torch.cuda.max_memory_allocated`` reports on
CUDA (tests/unit/models/test_cell_memory.py holds it to 15% of the measured peak).

**Held all along** (per parameter of the stage, fp32): the weights (4), the global copy (4),
and the round's sum (4, gradient mode) or its base and the inner AdamW's two moments (12, local
mode); during a share the gradients (4).

**Activations** per micro-batch in flight, from what each operator saves for its backward
(transformers 5.25's GPT-2 and Llama blocks, read op by op; bytes per token, ``h`` hidden,
``f`` the MLP's width, ``n`` heads, ``kv`` the key/value width):

- GPT-2, fp32: layer norms' inputs and outputs, q/k/v (one ``3h`` tensor), SDPA's output and
  log-sum-exp, the residual sum, and ``gelu_new``'s five ``f``-wide tensors: ``32h + 20f + 4n``;
  bf16 autocast: the matmuls' inputs in bf16, the norms' in fp32: ``20h + 10f + 4n``.
- Llama, fp32: RMSNorm's input and normed tensor (twice), q after rotary, k and v, SDPA's output,
  the residual sum, and SwiGLU's four ``f``-wide tensors: ``32h + 8kv + 16f + 4n``; bf16
  autocast (each of q/k/v and gate/up casts the norm's output again): ``30h + 4kv + 8f + 4n``.
- bf16 autocast also keeps, per micro-batch, a bf16 copy of every matmul weight it cast
  (2 bytes per parameter of the layers and of the head).
- With checkpointing, a layer keeps only its input (``4h``); one layer's activations come back
  during its backward.
- Every stage but the last keeps its output (``4h``), Llama its rotary tables; the last stage's
  loss makes the largest tensors of all: the logits and the softmax and their gradients,
  ``HEAD_LOGIT_COPIES`` tensors of ``tokens x vocab`` fp32 at once.

Not modelled: the caching allocator's reserve and fragmentation (CUDA reserves more than it
allocates) and kernels' workspaces; torch.compile's fused graphs, which keep less.
"""

from __future__ import annotations

from dataclasses import dataclass

from swarmd.models.shape import ModelShape

PRECISIONS = ("fp32", "bf16")
MODES = ("gradient", "local")

HELD_BYTES_PER_PARAM = {"gradient": 12, "local": 20}
"""fp32 weights (4) and global copy (4), and the round's sum (4) or base (4) and AdamW's moments (8)."""
GRAD_BYTES_PER_PARAM = 4
ROUND_END_BYTES_PER_PARAM = {"gradient": 4, "local": 8}
"""What a contribution or a rebase allocates beside what is held: the mean gradient (4); the
local weights flattened and the pseudo-gradient (or the new base) (8)."""
HEAD_LOGIT_COPIES = 3.0
"""``tokens x vocab x 4`` bytes alive at the peak of the last stage's loss backward: the
softmax's output, its gradient and the logits' (measured: 3.0 in fp32 and in bf16 autocast,
whose logits are bf16 but whose loss upcasts them to fp32 first)."""
BACKWARD_WORK_TOKENS = {"fp32": (8, 4), "bf16": (8, 3)}
"""A layer's backward at its peak, bytes per token as (per hidden unit, per MLP unit): the
incoming gradient, the gradients of the MLP's inputs and outputs, measured."""


@dataclass(frozen=True)
class BlockShape:
    """The sizes a cell's memory depends on (a ``ModelShape`` gives them: ``from_model_shape``)."""

    family: str
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int
    layer_params: int
    """Parameters of one block (its norms and biases included)."""
    first_params: int
    """Parameters the first stage holds beside its blocks (the embeddings)."""
    last_params: int
    """Parameters the last stage holds beside its blocks (the final norm and the head)."""

    @classmethod
    def from_model_shape(cls, shape: ModelShape) -> BlockShape:
        """The sizes of a run's model shape (its parameter counts as transformers builds them)."""
        h, f, v = shape.hidden, shape.intermediate_size, shape.vocab
        kv = shape.key_value_heads * shape.head_dim
        if shape.family == "gpt2":
            layer = 4 * h * h + 2 * h * f + 9 * h + f
            first, last = v * h + shape.max_positions * h, v * h + 2 * h
        else:
            layer = 2 * h * h + 2 * h * kv + 3 * h * f + 2 * h
            first, last = v * h, v * h + h
        return cls(shape.family, h, f, shape.heads, shape.key_value_heads, v, layer, first, last)

    @property
    def kv_width(self) -> int:
        return self.kv_heads * (self.hidden // self.heads)

    def layer_matmul_params(self) -> int:
        """A block's parameters that autocast copies to bf16 (all but the norms')."""
        norms = 4 * self.hidden if self.family == "gpt2" else 2 * self.hidden
        return self.layer_params - norms

    def layer_bytes_per_token(self, precision: str) -> float:
        """What one block keeps for its backward, per token (the module doc's formulas)."""
        h, f, n, kv = self.hidden, self.intermediate, self.heads, self.kv_width
        bf16 = precision == "bf16"
        if self.family == "gpt2":
            return (20 * h + 10 * f if bf16 else 32 * h + 20 * f) + 4 * n + 16
        return (30 * h + 4 * kv + 8 * f if bf16 else 32 * h + 8 * kv + 16 * f) + 4 * n + 8


@dataclass(frozen=True)
class CellLoad:
    """How a cell runs its stage: everything but the stage's layer count."""

    first: bool
    last: bool
    micro_batch: int
    seq_len: int
    in_flight: int = 1
    """Micro-batches whose forward is kept until their backward (the last stage: always 1)."""
    precision: str = "fp32"
    checkpointing: bool = False
    mode: str = "gradient"
    tied: bool = False
    """The head is the embedding's weight (one stage only)."""

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS or self.mode not in MODES:
            raise ValueError(f"precision {self.precision!r} / mode {self.mode!r}: use {PRECISIONS} / {MODES}")
        if min(self.micro_batch, self.seq_len, self.in_flight) < 1:
            raise ValueError(
                f"micro_batch {self.micro_batch}, seq_len {self.seq_len}, in_flight {self.in_flight}: each must be >= 1"
            )


def stage_params(block: BlockShape, layers: int, load: CellLoad) -> int:
    """The stage's parameter count: its blocks, the embeddings on the first, the head on the last."""
    edges = block.first_params * load.first + block.last_params * load.last
    if load.tied and load.first and load.last:
        edges -= block.vocab * block.hidden
    return layers * block.layer_params + edges


def phase_lines(block: BlockShape, load: CellLoad) -> dict[str, tuple[float, float]]:
    """The cell's peak bytes in each phase of a share and a round, as ``(fixed, per_layer)``:
    the peak at ``L`` layers is ``max(fixed + per_layer * L)`` over the phases (all are linear
    in the layers, so a planner can solve for the most layers that fit)."""
    fixed_p, layer_p = stage_params(block, 0, load), block.layer_params
    held = HELD_BYTES_PER_PARAM[load.mode]
    tokens = load.micro_batch * load.seq_len
    h, f = block.hidden, block.intermediate
    bf16 = load.precision == "bf16"
    n = 1 if load.last else load.in_flight

    # One micro-batch's activations, and what one layer's backward adds at its peak.
    layer_act = block.layer_bytes_per_token(load.precision) * tokens + (2 * block.layer_matmul_params() if bf16 else 0)
    kept_layer = 4 * h * tokens if load.checkpointing else layer_act
    per_mb_fixed = 0.0 if load.last else 4.0 * h * tokens  # the output, kept for the backward
    if block.family == "llama":
        per_mb_fixed += 8.0 * load.seq_len * (h // block.heads)  # rotary cos and sin
    if load.last:
        per_mb_fixed += 8.0 * h * tokens + (2.0 * block.last_params if bf16 else 0.0)  # final norm
    work_h, work_f = BACKWARD_WORK_TOKENS[load.precision]
    work = (work_h * h + work_f * f) * tokens + (layer_act if load.checkpointing else 0.0)
    if load.last:
        work = max(work, HEAD_LOGIT_COPIES * 4.0 * tokens * block.vocab)

    share_fixed = (held + GRAD_BYTES_PER_PARAM) * fixed_p + n * per_mb_fixed + work
    share_layer = (held + GRAD_BYTES_PER_PARAM) * layer_p + n * kept_layer
    lines = {"share": (share_fixed, share_layer)}
    if load.mode == "local":  # the inner step: AdamW's moments appear beside the gradients
        lines["inner step"] = ((held + GRAD_BYTES_PER_PARAM) * fixed_p, (held + GRAD_BYTES_PER_PARAM) * layer_p)
    end = held + ROUND_END_BYTES_PER_PARAM[load.mode]
    lines["round end"] = (end * fixed_p, end * layer_p)
    return lines


def cell_peak_bytes(block: BlockShape, layers: int, load: CellLoad) -> float:
    """The most bytes of tensors a cell of ``layers`` blocks holds at once (``phase_lines``)."""
    return max(fixed + per_layer * layers for fixed, per_layer in phase_lines(block, load).values())

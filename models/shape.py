"""A model's shape: the few numbers every peer needs to build the same network.

Kept apart from ``build`` (which imports torch and transformers) so that reading a run spec,
in the CLI or in the DHT's validator, stays light.

The fields past ``seq_len`` are optional and default to what swarmd built before they existed
(``kv_heads = 0`` is "as many as ``heads``", ``intermediate = 0`` is the family's rule, and so
on). A value that equals what its default means is stored as the default, so one architecture
has one shape, and a run spec that leaves them out signs exactly as it did before.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, TypeGuard

from swarmd.errors import SwarmdError

FAMILIES = ("gpt2", "llama")

DEFAULT_ROPE_THETA = 10000.0
"""The rotary base of the original Llama (and ``LlamaConfig``'s default)."""
FAMILY_NORM_EPS = {"gpt2": 1e-5, "llama": 1e-6}
"""``GPT2Config.layer_norm_epsilon`` and ``LlamaConfig.rms_norm_eps`` by default: what swarmd
built before ``norm_eps`` existed (tests/unit/models/test_build.py checks them)."""
ROPE_SCALING = {
    # rope_type: (required entries, optional entries), as transformers 5.25 validates them.
    "linear": ({"factor"}, set()),
    "dynamic": ({"factor"}, set()),
    "yarn": (
        {"factor", "original_max_position_embeddings"},
        {"attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim"},
    ),
    "llama3": ({"factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"}, set()),
}
"""The rotary scalings a Llama shape may use. ``longrope`` is left out: its factors are lists."""
MAX_ROPE_SCALING_ENTRIES = 8

RopeScaling = tuple[tuple[str, str | int | float], ...]
"""A rope-scaling table as sorted ``(key, value)`` pairs: immutable, so a shape stays hashable."""


class ModelError(SwarmdError, ValueError):
    """A model shape, stage plan or stage input is malformed or does not fit the model.

    Also a ``ValueError``, so callers that validate plain numbers can catch either.
    """


def llama_intermediate_size(hidden: int) -> int:
    """Width of Llama's SwiGLU MLP: 2/3 of 4 * hidden, rounded up to a multiple of 64.

    SwiGLU has three matrices where GPT-2's MLP has two, so 2/3 of the usual 4x width keeps the
    parameter count (and compute) equal to a GPT-2 block of the same hidden size; this is the
    rule the Llama papers use. Rounding to 64 keeps matmuls aligned on accelerators.
    """
    target = (8 * hidden + 2) // 3  # ceil(8 * hidden / 3) in integers
    return ((target + 63) // 64) * 64


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """The architecture of a run's model: what every peer needs to build the same network."""

    family: str
    """``gpt2`` or ``llama``: the transformers model class built from this shape."""
    layers: int
    """Number of transformer blocks; a stage owns a contiguous range of them."""
    hidden: int
    """Width of the residual stream (the hidden states passed between stages)."""
    heads: int
    """Attention heads per block; ``hidden`` must be divisible by it."""
    vocab: int
    """Vocabulary size (256 for the byte-level default run)."""
    seq_len: int
    """Tokens per sequence that the run trains on."""
    kv_heads: int = 0
    """Key/value heads (grouped-query attention, Llama only); must divide ``heads``. 0: as many
    as ``heads`` (plain multi-head attention)."""
    rope_theta: float = DEFAULT_ROPE_THETA
    """The rotary embeddings' base (Llama only): larger bases suit longer contexts."""
    tied: bool = False
    """Whether the LM head shares the embedding's weight; needs a run of one stage, since the
    embedding sits on the first stage and the head on the last (see ``stages``)."""
    intermediate: int = 0
    """Width of each block's MLP. 0: ``llama_intermediate_size(hidden)`` for Llama, 4 * hidden
    for GPT-2."""
    positions: int = 0
    """Positions the model covers (``max_position_embeddings``), at least ``seq_len``. 0: ``seq_len``."""
    norm_eps: float = 0.0
    """Epsilon of the layer norms (RMSNorm for Llama). 0: the family's default, ``FAMILY_NORM_EPS``."""
    rope_scaling: RopeScaling = ()
    """Rotary scaling (Llama only), e.g. Llama 3's ``rope_type = "llama3"`` with its factors;
    empty: none. Given as a table, kept as sorted pairs (``rope_scaling_table`` gives the table)."""

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ModelError(f"model family {self.family!r} is unknown; use one of {', '.join(FAMILIES)}")
        for name in ("layers", "hidden", "heads", "vocab", "seq_len"):
            value = getattr(self, name)
            # bool is an int subclass; `layers = true` in a TOML file is a mistake, not 1.
            if not _is_int(value) or value < 1:
                raise ModelError(f"model {name} must be a positive integer, got {value!r}")
        if self.hidden % self.heads:
            raise ModelError(
                f"model hidden size {self.hidden} is not divisible by {self.heads} heads; "
                f"pick a hidden size that is a multiple of the head count"
            )
        if self.family == "llama" and (self.hidden // self.heads) % 2:
            raise ModelError(
                f"llama head size {self.hidden // self.heads} (hidden {self.hidden} / {self.heads} heads) "
                f"must be even for rotary position embeddings"
            )
        self._check_optional()
        # Explicit values that mean the default are stored as it (see the module docstring).
        canonical = {
            "kv_heads": 0 if self.kv_heads == self.heads else self.kv_heads,
            "intermediate": 0 if self.intermediate == self.default_intermediate else self.intermediate,
            "positions": 0 if self.positions == self.seq_len else self.positions,
            "norm_eps": 0.0 if self.norm_eps == FAMILY_NORM_EPS[self.family] else float(self.norm_eps),
            "rope_theta": float(self.rope_theta),
            "rope_scaling": _rope_scaling(self.rope_scaling, self.family),
        }
        for name, value in canonical.items():
            object.__setattr__(self, name, value)  # frozen: __post_init__ is the one place allowed

    def _check_optional(self) -> None:
        for name in ("kv_heads", "intermediate", "positions"):
            value = getattr(self, name)
            if not _is_int(value) or value < 0:
                raise ModelError(f"model {name} must be a positive integer (or 0 for the default), got {value!r}")
        if self.kv_heads and self.heads % self.kv_heads:
            raise ModelError(
                f"model kv_heads {self.kv_heads} does not divide heads {self.heads}; grouped-query attention "
                f"shares each key/value head among heads / kv_heads query heads: pick a divisor of {self.heads}"
            )
        if self.family == "gpt2" and self.kv_heads not in (0, self.heads):
            raise ModelError(
                f"model kv_heads {self.kv_heads} differs from heads {self.heads}, but gpt2 has no grouped-query "
                f"attention; leave kv_heads out, or use family llama"
            )
        if self.positions and self.positions < self.seq_len:
            raise ModelError(
                f"model positions {self.positions} is fewer than seq_len {self.seq_len}; the model must cover "
                f"every position of a sequence: raise positions or lower seq_len"
            )
        if not isinstance(self.tied, bool):
            raise ModelError(f"model tied must be true or false, got {self.tied!r}")
        if not _is_number(self.rope_theta) or not 0 < self.rope_theta < math.inf:
            raise ModelError(f"model rope_theta must be a positive finite number, got {self.rope_theta!r}")
        if self.family == "gpt2" and self.rope_theta != DEFAULT_ROPE_THETA:
            raise ModelError(
                f"model rope_theta {self.rope_theta} is set, but gpt2 has learned positions, not rotary ones; "
                f"leave rope_theta out, or use family llama"
            )
        if not _is_number(self.norm_eps) or not 0 <= self.norm_eps < 1:
            raise ModelError(f"model norm_eps must be in (0, 1) (or 0 for the family's default), got {self.norm_eps!r}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def key_value_heads(self) -> int:
        """The number of key/value heads the model has (``kv_heads``, or ``heads`` for 0)."""
        return self.kv_heads or self.heads

    @property
    def default_intermediate(self) -> int:
        return llama_intermediate_size(self.hidden) if self.family == "llama" else 4 * self.hidden

    @property
    def intermediate_size(self) -> int:
        """The MLP's width the model has (``intermediate``, or the family's rule for 0)."""
        return self.intermediate or self.default_intermediate

    @property
    def wire_half(self) -> str:
        """The 16-bit type hidden states, their gradients and contributions travel in between
        peers: bf16 for llama, whose activations can overflow fp16's range; fp16 (three more bits
        of mantissa) for gpt2."""
        return "bf16" if self.family == "llama" else "fp16"

    @property
    def max_positions(self) -> int:
        """The positions the model covers (``positions``, or ``seq_len`` for 0)."""
        return self.positions or self.seq_len

    @property
    def layer_norm_eps(self) -> float:
        """The norms' epsilon the model has (``norm_eps``, or the family's default for 0)."""
        return self.norm_eps or FAMILY_NORM_EPS[self.family]

    def rope_scaling_table(self) -> dict[str, str | int | float]:
        """``rope_scaling`` as the table a run spec or a transformers config holds (empty: none)."""
        return dict(self.rope_scaling)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelShape:
        """Read the run spec's ``model`` table: the first six keys are required, the others
        optional (left out: their defaults); an unknown key is an error."""
        if not isinstance(d, dict):
            raise ModelError(f"model table must be a table of key/value pairs, got {type(d).__name__}")
        names = {f.name for f in fields(cls)}
        required = {"family", "layers", "hidden", "heads", "vocab", "seq_len"}
        unknown = sorted(set(d) - names)
        missing = sorted(required - set(d))
        if unknown:
            raise ModelError(f"model table has unknown keys {unknown}; allowed: {sorted(names)}")
        if missing:
            raise ModelError(f"model table lacks keys {missing}")
        values = dict(d)
        if "rope_scaling" in values:
            values["rope_scaling"] = _rope_scaling_pairs(values["rope_scaling"])
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """The ``model`` table: optional keys at their defaults are left out (see the module
        docstring), ``rope_scaling`` as a table."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("family", "layers", "hidden", "heads", "vocab", "seq_len") or value != f.default:
                out[f.name] = self.rope_scaling_table() if f.name == "rope_scaling" else value
        return out


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _rope_scaling_pairs(value: object) -> RopeScaling:
    """A table (or pairs) as sorted pairs; the entries themselves are checked by ``_rope_scaling``."""
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, tuple | list) and all(isinstance(p, tuple | list) and len(p) == 2 for p in value):
        items = [(k, v) for k, v in value]
    else:
        raise ModelError(
            f'model rope_scaling must be a table such as {{rope_type = "linear", factor = 2.0}}, got {value!r}'
        )
    if len(items) > MAX_ROPE_SCALING_ENTRIES:
        raise ModelError(f"model rope_scaling has {len(items)} entries, over {MAX_ROPE_SCALING_ENTRIES}")
    if not all(isinstance(k, str) for k, _ in items) or len({k for k, _ in items}) != len(items):
        raise ModelError(f"model rope_scaling keys must be distinct strings, got {[k for k, _ in items]!r}")
    return tuple(sorted(items))


def _rope_scaling(value: object, family: str) -> RopeScaling:
    """Check a rope-scaling table against ``ROPE_SCALING``; returns it as sorted pairs."""
    pairs = _rope_scaling_pairs(value)
    if not pairs:
        return ()
    if family != "llama":
        raise ModelError(f"model rope_scaling is set, but {family} has no rotary embeddings; leave it out")
    table = dict(pairs)
    rope_type = table.pop("rope_type", None)
    if rope_type not in ROPE_SCALING:
        raise ModelError(
            f"model rope_scaling.rope_type {rope_type!r} is not one of {', '.join(ROPE_SCALING)}; "
            f"leave rope_scaling out for plain rotary embeddings"
        )
    required, optional = ROPE_SCALING[str(rope_type)]
    missing = sorted(required - set(table))
    unknown = sorted(set(table) - required - optional)
    if missing or unknown:
        hint = " (rope_theta is a key of model itself)" if "rope_theta" in unknown else ""
        raise ModelError(
            f"model rope_scaling for rope_type {rope_type!r} lacks {missing} and has unknown entries {unknown}{hint}; "
            f"it takes {sorted(required)}, and optionally {sorted(optional)}"
        )
    numbers: dict[str, int | float] = {}
    for key, number in table.items():
        if not _is_number(number) or not 0 < number < math.inf:
            raise ModelError(f"model rope_scaling.{key} must be a positive finite number, got {number!r}")
        numbers[key] = number
    if numbers["factor"] < 1:
        raise ModelError(f"model rope_scaling.factor {numbers['factor']} stretches nothing; it must be at least 1")
    if "original_max_position_embeddings" in table and not _is_int(table["original_max_position_embeddings"]):
        raise ModelError(
            f"model rope_scaling.original_max_position_embeddings must be an integer, "
            f"got {table['original_max_position_embeddings']!r}"
        )
    return pairs

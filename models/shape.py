"""A model's shape: the few numbers every peer needs to build the same network.

Kept apart from ``build`` (which imports torch and transformers) so that reading a run spec,
in the CLI or in the DHT's validator, stays light.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from swarmd.errors import SwarmdError

FAMILIES = ("gpt2", "llama")


class ModelError(SwarmdError, ValueError):
    """A model shape, stage plan or stage input is malformed or does not fit the model.

    Also a ``ValueError``, so callers that validate plain numbers can catch either.
    """


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
    """Tokens per sequence: the longest input the position embeddings cover."""

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ModelError(f"model family {self.family!r} is unknown; use one of {', '.join(FAMILIES)}")
        for name in ("layers", "hidden", "heads", "vocab", "seq_len"):
            value = getattr(self, name)
            # bool is an int subclass; `layers = true` in a TOML file is a mistake, not 1.
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
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

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelShape:
        """Read the run spec's ``model`` table; unknown or missing keys are errors, not defaults."""
        if not isinstance(d, dict):
            raise ModelError(f"model table must be a table of key/value pairs, got {type(d).__name__}")
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        missing = sorted(names - set(d))
        if unknown:
            raise ModelError(f"model table has unknown keys {unknown}; allowed: {sorted(names)}")
        if missing:
            raise ModelError(f"model table lacks keys {missing}")
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

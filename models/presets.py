"""Run specs that ship with swarmd, and what each needs made before it can run.

- ``tiny-bytes`` is the default run: a small GPT-2 with a byte-level vocabulary (256 tokens, so
  no tokenizer file is needed), trained on the corpus that ships with the package. It trains
  on a laptop CPU and needs no network and no download.
- ``tiny-llama-bpe`` is a real run in miniature: a Llama with grouped-query attention, a BPE
  tokenizer of 1,024 ids trained on the built-in corpus, and that corpus prepared into token
  shards with a held-out split, as ``swarmd tokenizer train`` and ``swarmd data prepare`` would
  do for a web corpus (``docs/real-run.md``). ``materialize`` makes its files (seconds, the same
  bytes every time); ``swarmd demo --run tiny-llama-bpe`` gives them to one daemon, and the
  others fetch the shards they need from it.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_RUN: dict[str, Any] = {
    "name": "tiny-bytes",
    "model": {"family": "gpt2", "layers": 4, "hidden": 128, "heads": 4, "vocab": 256, "seq_len": 128},
    "data": {"corpus": "builtin"},
    "batch": {"sequences": 16, "micro_batch": 4},
    "optimizer": {"name": "adamw", "lr": 0.001, "weight_decay": 0.01, "max_staleness": 4},
    "stages": 2,
    "exchange": {"local_steps": 1, "outer_lr": 0.0, "outer_momentum": 0.9},
}

LLAMA_BPE_RUN: dict[str, Any] = {
    "name": "tiny-llama-bpe",
    "model": {
        "family": "llama",
        "layers": 4,
        "hidden": 128,
        "heads": 4,
        "kv_heads": 2,
        "vocab": 1024,
        "seq_len": 128,
        "rope_theta": 50000.0,
    },
    "data": {"manifest": "data/manifest.json"},
    "batch": {"sequences": 16, "micro_batch": 4},
    # Warmed up: without, one seed in ten spiked early and ended 0.6 nats behind (lr_schedule).
    "optimizer": {"name": "adamw", "lr": 0.002, "weight_decay": 0.01, "max_staleness": 4, "warmup_steps": 20},
    "stages": 2,
    "exchange": {"local_steps": 1, "outer_lr": 0.0, "outer_momentum": 0.9},
    "eval": {"every": 20, "sequences": 64},
}
"""Its ``data.manifest`` is a path under the folder ``materialize`` fills."""


@dataclass(frozen=True)
class Preset:
    spec: dict[str, Any]
    description: str
    tokenizer_vocab: int = 0
    """A BPE of this many ids trained on the built-in corpus; 0: bytes, no tokenizer file."""
    shard_tokens: int = 0
    """The corpus prepared into shards of this many tokens; 0: the corpus is read whole, as bytes."""
    validation_fraction: float = 0.0

    @property
    def name(self) -> str:
        return str(self.spec["name"])


PRESETS: dict[str, Preset] = {
    "tiny-bytes": Preset(DEFAULT_RUN, "a 4-layer byte-level GPT-2 on the built-in corpus (the default)"),
    "tiny-llama-bpe": Preset(
        LLAMA_BPE_RUN,
        "a 4-layer Llama with grouped-query attention, a 1,024-id BPE and the corpus in token shards",
        tokenizer_vocab=1024,
        shard_tokens=16384,
        validation_fraction=0.05,
    ),
}


def materialize(preset: Preset, folder: Path, progress: Callable[[str], None] = lambda _: None) -> Path:
    """Make what ``preset`` needs in ``folder`` (its tokenizer and token shards, when it has
    them) and write its spec there; returns the spec file for ``swarmd run create``."""
    spec = copy.deepcopy(preset.spec)
    folder.mkdir(parents=True, exist_ok=True)
    if preset.shard_tokens:
        from swarmd.models.bpe_tokenizer import train_bpe
        from swarmd.models.data.corpus import load_corpus
        from swarmd.models.data.prepare import prepare
        from swarmd.models.data.text_inputs import documents

        text = folder / "builtin-corpus.txt"
        text.write_bytes(load_corpus("builtin"))
        progress(f"training a BPE tokenizer of {preset.tokenizer_vocab} ids on the built-in corpus")
        tokenizer = train_bpe(
            (doc for doc, _ in documents(text)), preset.tokenizer_vocab, folder / "tokenizer.json", overwrite=True
        )
        progress(f"preparing the corpus into shards of {preset.shard_tokens} tokens")
        result = prepare(
            [text],
            tokenizer,
            folder / "data",
            shard_tokens=preset.shard_tokens,
            validation_fraction=preset.validation_fraction,
            overwrite=True,
        )
        progress(
            f"{result.tokens} tokens of {result.documents} documents in {len(result.manifest.train)} train and "
            f"{len(result.manifest.validation)} held-out shards (manifest {result.manifest_sha256[:12]}...)"
        )
        spec["data"] = {"manifest": str(result.folder / "manifest.json")}
    path = folder / f"{preset.name}.json"
    path.write_text(json.dumps(spec, indent=2) + "\n")
    return path

"""Run specs that ship with swarmd.

``tiny-bytes`` is the default run: a small GPT-2 with a byte-level vocabulary (256 tokens, so
no tokenizer file is needed), trained on the corpus that ships with the package. It trains
on a laptop CPU and needs no network and no download.
"""

from typing import Any

DEFAULT_RUN: dict[str, Any] = {
    "name": "tiny-bytes",
    "model": {"family": "gpt2", "layers": 4, "hidden": 128, "heads": 4, "vocab": 256, "seq_len": 128},
    "data": {"corpus": "builtin"},
    "batch": {"sequences": 16, "micro_batch": 4},
    "optimizer": {"name": "adamw", "lr": 0.001, "weight_decay": 0.01, "max_staleness": 4},
    "stages": 2,
    "exchange": {"local_steps": 1, "outer_lr": 0.7, "outer_momentum": 0.9},
}

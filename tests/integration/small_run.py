"""The run the integration tests train when what they check is not the model: the default run
made small.

A daemon trains the default run (a 4-layer GPT-2 of hidden 128 on 128-byte sequences) at about
5 updates a second on one torch thread here, using 1.5 cores and 0.28 CPU-seconds an update;
this one trains at about 23, at 0.05 CPU-seconds an update. Tests that wait for a few updates,
a hand-over or a repair wait that much less, and the suite's two workers share two cores. The
tests that compare the swarm's learning with a reference, and ``swarmd demo``, keep their own.
"""

from __future__ import annotations

from typing import Any

from swarmd.models.presets import DEFAULT_RUN

SMALL_RUN: dict[str, Any] = {
    **DEFAULT_RUN,
    "model": {**DEFAULT_RUN["model"], "layers": 2, "hidden": 64, "heads": 2, "seq_len": 64},
    "batch": {"sequences": 8, "micro_batch": 2},
}
"""Two stages of one layer each, four micro-batches an update, as the default run has."""

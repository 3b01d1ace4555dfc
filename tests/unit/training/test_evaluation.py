"""The held-out score, in one process (swarm_in_process.py): the holder of shard (0, 0) scores the
swarm's weights every ``eval.every`` versions, starting from exactly the run's first weights."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest

from swarmd.models.build import build_model
from swarmd.models.data.corpus import load_corpus, train_eval_split
from swarmd.models.reference import held_out_loss
from swarmd.peers.records.heartbeat import HeldOut
from swarmd.peers.records.run_spec import SignedRunSpec, run_seed
from swarmd.training.evaluation import MICRO_BATCH, Score, newest_score
from tests.unit.training.swarm_in_process import Swarm

pytestmark = pytest.mark.timeout(240)

EVERY, SEQUENCES = 5, 16


def test_shard_zero_scores_the_held_out_split_every_few_versions(tmp_path: Path) -> None:
    async def main() -> tuple[list[Score], SignedRunSpec]:
        swarm = Swarm(tmp_path, 2, spec_changes={"eval": {"every": EVERY, "sequences": SEQUENCES}})
        swarm.start()

        def scores() -> list[Score]:
            found = [s for m in swarm.members.values() for s in m.trainer.evaluation.history]
            return sorted(found, key=lambda s: s.version)

        try:
            await swarm.wait_for("three held-out scores", lambda: len(scores()) >= 3, 200)
            return scores(), swarm.spec
        finally:
            await swarm.stop()

    scores, spec = asyncio.run(main())
    versions = [s.version for s in scores]
    # One score at the first version at or past each multiple of EVERY: 0, 6, 10 when 5 was skipped.
    buckets = [v // EVERY for v in versions]
    assert versions[0] == 0 and all(b > a for a, b in zip(buckets, buckets[1:], strict=False)), versions
    assert all(math.isfinite(s.loss) and s.sequences == SEQUENCES for s in scores)
    assert scores[-1].loss < scores[0].loss, [(s.version, s.loss) for s in scores]  # it learns, and the score shows it
    first = scores[0]
    if first.stage_versions == [0, 0]:  # scored before any update: exactly the loss of the run's first weights
        shape, seed = spec.spec.model, run_seed(spec.run_id)
        _, held_out = train_eval_split(load_corpus("builtin"), shape.seq_len, seed)
        expected = held_out_loss(build_model(shape, seed), held_out, sequences=SEQUENCES, micro_batch=MICRO_BATCH)
        assert first.loss == pytest.approx(expected, abs=1e-5)


def test_the_newest_score_any_member_carries_is_the_runs() -> None:
    members = [
        {"peer_id": "b", "held_out": [40, 2.5]},
        {"peer_id": "c", "held_out": None},
        {"peer_id": "d", "held_out": [60, 2.25]},
    ]
    assert newest_score(HeldOut(version=50, loss=2.4), members, "a") == {
        "version": 60,
        "loss": 2.25,
        "by": "d",
        "here": False,
    }
    newest = newest_score(HeldOut(version=70, loss=2.2), members, "a")
    assert newest is not None and newest["here"] is True
    assert newest_score(None, [], "a") is None

"""peers/sim/segments.py: a round's shares run as one event on a two-stage pipeline: they end
after their compute and their boundary streams, and a fault in the middle keeps the shares
done, gives back the one in flight to recompute and the rest unspent."""

from __future__ import annotations

import pytest

from swarmd.peers.sim.ledger_client import LedgerClient
from swarmd.peers.sim.pipeline_state import Pipeline
from swarmd.peers.sim.segments import Segments
from swarmd.peers.sim.world import World
from tests.unit.peers.sim.small_world import pipeline, sizes, world

pytestmark = pytest.mark.timeout(10)


def segment(w: World, answered: float) -> tuple[Segments, LedgerClient, list[tuple[float, Pipeline]], Pipeline]:
    """Pipeline (d0, d1) issued three shares of two micro-batches at 0, the answer in at ``answered``."""
    run = sizes(w, layers=(2, 2), shards=(1, 1), k=2, local_steps=4)
    ledger = LedgerClient(w, run)
    ended: list[tuple[float, Pipeline]] = []
    part = Segments(w, run, ledger, lambda now, p: ended.append((now, p)))
    p = pipeline(1, [0, 1])
    part.run(0.0, p, "d0", ledger.issue(0.0, "d0", 3), answered)
    return part, ledger, ended, p


def test_a_segments_shares_run_one_after_the_other_and_end_with_their_streams() -> None:
    w = world(2)
    _, _, ended, p = segment(w, answered=0.002)
    w.engine.run_until(60.0, 10_000)
    assert len(ended) == 1 and ended[0][1] is p
    assert ended[0][0] >= 0.002 + 3 * p.per_share_s and p.per_share_s > 0
    assert p.shares_done == 3 and p.segment == [] and [c.round_shares for c in p.cells] == [[0, 1, 2]] * 2
    status = w.phases.status()
    assert status["share_compute"]["n"] == 3 and status["share"]["n"] == 3
    sent, _ = w.engine.carried(60.0)
    assert sent[0] > 0 and sent[1] > 0  # activations one way, their gradients back


def test_a_fault_in_the_middle_keeps_the_shares_done_and_gives_back_the_rest() -> None:
    w = world(3)
    part, ledger, ended, p = segment(w, answered=0.0)
    w.engine.run_until(0.001, 100)  # the segment starts: its compute schedule is known
    at = p.started + 1.5 * p.per_share_s  # the second share is half done
    w.engine.run_until(at, 10_000)
    part.interrupt(at, p)
    assert p.shares_done == 1 and [c.round_shares for c in p.cells] == [[0], [0]] and p.segment == []
    assert w.counts["shares_broken"] == 1 and ledger.unspent == {2}  # 1 was begun: it is recomputed
    again = [s.share_id for s in ledger.issue(at, "d2", 3)]
    assert sorted(again)[:2] == [1, 2] and w.counts["reissued_unspent"] == 1
    p.epoch += 1  # the pipeline changed: its pending events lapse
    w.engine.run_until(60.0, 10_000)
    assert ended == []

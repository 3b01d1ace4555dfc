"""A segment: the shares of a round a pipeline runs as one event.

See the ``pipelines`` module doc, "Shares".

Once the ledger's answer is in, the segment's shares run one after the other, each lasting
``exchange.share_seconds`` (1F1B over the cells' compute and the boundaries' activation
transfers, flush to flush), while each boundary carries all their activations and gradients
as one stream each way on the shared links; the segment ends when both the compute and the
streams are through, so a boundary slower than the compute stretches it. A fault in the
middle splits it where the compute schedule stands (``interrupt``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from swarmd.peers.sim.pipeline_state import PipelineEpoch
from swarmd.peers.sim.timing import pipeline_timing
from swarmd.peers.taskpool.exchange import share_seconds

if TYPE_CHECKING:
    from swarmd.peers.sim.ledger_client import LedgerClient
    from swarmd.peers.sim.pipeline_state import Pipeline
    from swarmd.peers.sim.workload import RunSizes
    from swarmd.peers.sim.world import World
    from swarmd.peers.taskpool.shares import Share


class BoundaryStream(NamedTuple):
    """A segment's stream across one boundary, one way; ``tail``: once it is all in, the
    last micro-batch's way to the end of the pipeline and back."""

    at: PipelineEpoch
    tail: float


class Segments:
    def __init__(
        self, world: World, sizes: RunSizes, ledger: LedgerClient, done: Callable[[float, Pipeline], None]
    ) -> None:
        """``done(now, pipeline)``: a segment ended, its shares recorded in the round."""
        self.world, self.sizes = world, sizes
        self.ledger = ledger
        self.done = done

    def run(self, now: float, p: Pipeline, holder: str, shares: list[Share], answered: float) -> None:
        """``holder`` was issued ``shares`` at ``now``; the ledger's answer is in at ``answered``."""
        p.segment, p.holder, p.started = shares, holder, -1.0
        self.world.engine.at(answered, self._go, p.stamp())

    def _go(self, now: float, at: PipelineEpoch) -> None:
        """The ledger's answer is in: the segment's shares run one after the other, flushing
        between them, as one event; each boundary carries all their activations and gradients
        as one stream each way. A contribution's base is taken when the last share begins."""
        if not at.current():
            return
        world, p = self.world, at.pipeline
        m = len(p.segment)
        t = p.timing = p.timing or pipeline_timing(world, self.sizes.workload, [c.device for c in p.cells])
        k = self.sizes.share_micro_batches
        p.per_share_s = max(share_seconds(t.forward_s, t.backward_s, t.send_s, k), k * t.floor_s)
        world.phases.add("share_compute", p.per_share_s, m)
        p.started, p.compute_done, p.flow_end = now, False, now
        p.flows_left = 2 * len(t.send_s)
        if m == 1:
            self._take_base(now, at)
        else:
            world.engine.at(now + (m - 1) * p.per_share_s, self._take_base, at)
        world.engine.at(now + m * p.per_share_s, self._computed, at)
        for b, (nbytes, via) in enumerate(zip(t.nbytes, t.via, strict=True)):
            a, c = p.cells[b].device, p.cells[b + 1].device
            assert a is not None and c is not None
            forward, backward = BoundaryStream(at, t.tail_forward[b]), BoundaryStream(at, t.tail_backward[b])
            world.engine.stream(now, a, c, m * k * nbytes, self._boundary, forward, via)
            world.engine.stream(now, c, a, m * k * nbytes, self._boundary, backward, via)

    def _take_base(self, now: float, at: PipelineEpoch) -> None:
        """Between two shares every cell applies what its pulls brought; the last share's
        weights are the base its contribution is weighed against."""
        if at.current():
            for cell in at.pipeline.cells:
                cell.base = list(cell.arrived)

    def _boundary(self, now: float, stream: BoundaryStream) -> None:
        if not stream.at.current():
            return
        p = stream.at.pipeline
        p.flows_left -= 1
        p.flow_end = max(p.flow_end, now + stream.tail)
        self._maybe_done(now, stream.at)

    def _computed(self, now: float, at: PipelineEpoch) -> None:
        if not at.current():
            return
        at.pipeline.compute_done = True
        self._maybe_done(now, at)

    def _maybe_done(self, now: float, at: PipelineEpoch) -> None:
        p = at.pipeline
        if not p.compute_done or p.flows_left:
            return
        if p.flow_end > now:
            self.world.engine.at(p.flow_end, self._end, at)
        else:
            self._end(now, at)

    def _end(self, now: float, at: PipelineEpoch) -> None:
        p = at.pipeline
        if not at.current() or not p.segment:
            return
        m = len(p.segment)
        self.world.phases.add("share", (now - p.started) / m, m)
        for cell in p.cells:
            cell.round_shares.extend(x.share_id for x in p.segment)
        p.shares_done += m
        p.segment = []
        self.done(now, p)

    def interrupt(self, now: float, p: Pipeline) -> None:
        """The segment in flight cannot finish: the shares it completed by now (on its compute
        schedule) count for the round, the one in flight is abandoned at the ledger (issued
        again: recomputed), and those not begun go back unspent."""
        if not p.segment:
            return
        begun = 0 if p.started < 0 else min(len(p.segment), int((now - p.started) // p.per_share_s) + 1)
        done, p.segment = p.segment[: max(0, begun - 1)], p.segment[max(0, begun - 1) :]
        for cell in p.cells:
            cell.round_shares.extend(x.share_id for x in done)
        p.shares_done += len(done)
        self.ledger.give_back(p.holder, [x.share_id for x in p.segment], begun > 0)
        self.world.counts["shares_broken"] += 1
        p.segment = []

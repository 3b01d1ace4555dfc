"""daemon/training/cells/neighbours.py: activations go forward to the next cell and input gradients back
to the previous one, each naming its share, the pipeline's epoch and the weights' version; a
broken path is tried again, a pipeline that changed is not."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from swarmd.peers.wire.codecs import encode_tensor
from swarmd.peers.wire.errors import StreamBroken, Unreachable, WrongEpoch
from swarmd.peers.wire.messages import CellBackward, CellForward
from swarmd.peers.wire.sizes import codec_for
from swarmd.training.cells.cell_facts import CellFacts
from swarmd.training.cells.cell_stats import CellStats
from swarmd.training.cells.in_flight import ShareInFlight
from swarmd.training.cells.neighbours import Neighbours
from tests.unit.training.cells.cell_fakes import RUN_ID, FakeCell, facts

pytestmark = pytest.mark.timeout(60)

SHARE = ShareInFlight(share_id=11, first=44, count=2, round_end=True, epoch="e1", attempt=3, ticket="t11")


def neighbours(cell: FakeCell, of: CellFacts | None = None) -> tuple[Neighbours, CellStats]:
    """Cell (2, 1) of three stages (unless ``of`` says), its weights at version 7, on fast links."""
    stats = CellStats()
    return Neighbours(of or facts((2, 1), stages=3), cell, stats, lambda _: 1e9, lambda: 7), stats


def test_an_activation_goes_forward_and_a_gradient_back_each_naming_its_share_and_epoch() -> None:
    async def scenario() -> None:
        cell = FakeCell()
        n, _ = neighbours(cell)
        out, grad = torch.randn(2, 3), torch.randn(2, 3)
        await n.forward(SHARE, 45, out)
        await n.backward(SHARE, 45, grad)
        await n.backward(SHARE, 45, None)  # no input gradient: nothing to send
        (to_next, forward, [frame_f]), (to_prev, backward, [frame_b]) = cell.sent
        assert (to_next, to_prev) == ("next", "prev")
        assert isinstance(forward, CellForward) and isinstance(backward, CellBackward)
        assert (forward.stage, backward.stage) == (2, 0)
        for message in (forward, backward):
            assert (message.run_id, message.pipeline, message.epoch, message.version) == (RUN_ID, 2, "e1", 7)
            assert (message.share_id, message.share_first, message.share_count, message.attempt) == (11, 44, 2, 3)
            assert (message.micro_batch, message.round_end, message.ticket) == (45, True, "t11")
        codec = codec_for("activation", 1e9, half="fp16")
        assert frame_f == encode_tensor(out, codec) and frame_b == encode_tensor(grad, codec)

    asyncio.run(scenario())


def test_stage_zero_sends_no_gradient_back() -> None:
    async def scenario() -> None:
        cell = FakeCell()
        n, _ = neighbours(cell, facts((0, 0), stages=3))
        await n.backward(SHARE, 45, torch.randn(2, 3))
        assert cell.sent == []

    asyncio.run(scenario())


def test_a_broken_path_is_tried_again_and_a_changed_pipeline_is_not() -> None:
    async def scenario() -> None:
        failures = [Unreachable("no stream"), StreamBroken("reset")]

        def answer(peer: str, request: Any) -> Any:
            if failures:
                raise failures.pop(0)
            return None, []

        cell = FakeCell(answer=answer)
        n, stats = neighbours(cell)
        await n.forward(SHARE, 45, torch.randn(2, 3))
        assert len(cell.sent) == 3 and stats.send_failures == 2 and len(cell.slept) == 2

        def refuse(peer: str, request: Any) -> Any:
            raise WrongEpoch("the next cell is in epoch e2")

        cell.answer, cell.sent = refuse, []
        with pytest.raises(WrongEpoch):
            await n.forward(SHARE, 45, torch.randn(2, 3))
        assert len(cell.sent) == 1  # a refusal is not tried again

        cell.view.epoch = "e2"  # the pipeline changed: the share's tensors go nowhere
        cell.sent = []
        with pytest.raises(WrongEpoch, match="the pipeline changed"):
            await n.forward(SHARE, 45, torch.randn(2, 3))
        assert cell.sent == []

    asyncio.run(scenario())

"""A cell's tensors straight to its neighbours.

Activations to the next cell, input gradients back to the previous one (``CellForward`` /
``CellBackward``).

Each goes in the codec its link calls for, over the router (a relay only when the direct path
fails or is slower), and says which share, try and micro-batch it belongs to and the weights'
version it was computed with. A broken path is tried again a few times; a refusal is not (the
neighbour is in another epoch: the share is dropped).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from swarmd.peers.wire.codecs import encode_tensor
from swarmd.peers.wire.errors import StreamBroken, Unreachable, WrongEpoch
from swarmd.peers.wire.messages import CellBackward, CellForward
from swarmd.peers.wire.sizes import codec_for
from swarmd.training.cells.cell_facts import CellFacts, CellHandle
from swarmd.training.cells.cell_stats import CellStats
from swarmd.training.cells.in_flight import ShareInFlight

SEND_ATTEMPTS = 4
SEND_BACKOFF_S = 0.25


class Neighbours:
    def __init__(
        self,
        facts: CellFacts,
        cell: CellHandle,
        stats: CellStats,
        link_Bps: Callable[[str], float],
        version: Callable[[], int],
    ) -> None:
        """``link_Bps`` is a peer's link rate (it picks the codec); ``version`` the weights' version
        the tensors are computed with (``Puller.version``)."""
        self.facts, self.cell, self.stats = facts, cell, stats
        self.link_Bps, self.version = link_Bps, version

    async def forward(self, share: ShareInFlight, m: int, out: torch.Tensor) -> None:
        """Micro-batch ``m``'s activation to the next cell."""
        cell = self.cell
        codec = codec_for("activation", self.link_Bps(cell.view.next or ""), half=self.facts.half)
        frame = await cell.in_thread(encode_tensor, out, codec, what="codec")
        forward = CellForward(stage=self.facts.stage + 1, **self._hop(share, m))
        await self._deliver(cell.view.next, forward, frame)

    async def backward(self, share: ShareInFlight, m: int, grad_in: torch.Tensor | None) -> None:
        """Micro-batch ``m``'s input gradient to the previous cell (stage 0 has none to send)."""
        cell = self.cell
        if self.facts.is_first or grad_in is None:
            return
        codec = codec_for("activation", self.link_Bps(cell.view.prev or ""), half=self.facts.half)
        frame = await cell.in_thread(encode_tensor, grad_in, codec, what="codec")
        backward = CellBackward(stage=self.facts.stage - 1, **self._hop(share, m))
        await self._deliver(cell.view.prev, backward, frame)

    def _hop(self, share: ShareInFlight, m: int) -> dict[str, Any]:
        """What a tensor sent along the pipeline says of itself: its share and micro-batch, and
        the weights' version it was computed with."""
        return {
            "run_id": self.facts.run_id,
            "pipeline": self.facts.pipeline,
            "epoch": share.epoch,
            "share_id": share.share_id,
            "share_first": share.first,
            "share_count": share.count,
            "round_end": share.round_end,
            "attempt": share.attempt,
            "micro_batch": m,
            "version": self.version(),
            "ticket": share.ticket,
        }

    async def _deliver(self, peer: str | None, message: CellForward | CellBackward, frame: bytes) -> None:
        """Send to a neighbour, trying again a few times on a broken path (not on a refusal)."""
        cell = self.cell
        delay = SEND_BACKOFF_S
        for attempt in range(SEND_ATTEMPTS):
            if peer is None or message.epoch != cell.view.epoch:
                raise WrongEpoch(
                    f"cell {self.facts.cell}: the pipeline changed while micro-batch {message.micro_batch} "
                    "was on its way"
                )
            try:
                await cell.send(peer, message, [frame], 30.0)
                return
            except (Unreachable, StreamBroken):
                self.stats.send_failures += 1
                if attempt == SEND_ATTEMPTS - 1:
                    raise
                await cell.sleep(delay)
                delay *= 2

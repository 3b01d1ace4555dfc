"""What this peer holds now: its cells and shard servers, and what closed ones left behind.

``lifecycle`` changes it; the trainer, the handlers and the status read it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

from swarmd.peers.taskpool.servers import Shard
from swarmd.training.cells.cell import CellWorker
from swarmd.training.shards.ledger_host import LedgerHost
from swarmd.training.shards.shard_server import ShardServer


@dataclass
class Held:
    """What this peer holds now, and what its closed holdings left behind."""

    cells: dict[tuple[int, int], CellWorker] = field(default_factory=dict)
    cell_tasks: dict[tuple[int, int], asyncio.Task[None]] = field(default_factory=dict)
    servers: dict[Shard, ShardServer] = field(default_factory=dict)
    handed_over: dict[Shard, tuple[int, Path]] = field(default_factory=dict)
    """Shards this peer served and closed: their final state, for whoever holds them next."""
    rest_deliveries: set[asyncio.Task[bool]] = field(default_factory=set)
    """Stopped cells' contributions still on their way (``Lifecycle.close_cell``)."""
    ledger: LedgerHost | None = None
    """Set while this peer serves shard (0, 0), which keeps the share ledger."""

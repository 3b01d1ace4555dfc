"""Making a cell: its stage's module built from the run's seed, its compute, its worker.

The module is the run's seed stage (``run_facts.stage_module``), as the shard servers start
from; the cell's weights are then whatever its stage's shards serve. It computes as the run's
facts say (``RunFacts.compute``: device, precision, compile), with activation checkpointing
where the plan asks for it (``Assignment.checkpointed(stage)``: the planner's choice for a stage
whose activations in flight would not fit its devices otherwise). A cell keeps the choice it was
made with; a plan that changes it takes effect for the cells opened after it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

from swarmd.models.cell_compute import CellCompute
from swarmd.peers.taskpool.assignment import Assignment
from swarmd.peers.taskpool.cells import Cell
from swarmd.peers.taskpool.exchange import ExchangeConfig, window
from swarmd.training.cells.cell import CellWorker
from swarmd.training.run_facts import RunFacts, Send, stage_module
from swarmd.training.shards.head_relay import HeadRelays

if TYPE_CHECKING:  # the run's data loads where it is opened (``swarmd.data.run_files``)
    from swarmd.data.training_data import TrainingData


class CellMaker:
    """Builds the cells this peer is given. ``exchange_settings``: the exchange under the
    assignment in force; ``link_Bps``: the measured link from here to a peer; ``reducer``: the
    relays of the shards this peer's cells head (a heading cell hands them what it pulls)."""

    def __init__(
        self,
        facts: RunFacts,
        exchange_settings: Callable[[], ExchangeConfig],
        send: Send,
        link_Bps: Callable[[str], float],
        reducer: HeadRelays,
    ) -> None:
        self._facts = facts
        self._exchange_settings = exchange_settings
        self._send = send
        self._link_Bps = link_Bps
        self.reducer = reducer

    def make(self, cell: Cell, assignment: Assignment, data: TrainingData) -> CellWorker:
        """The worker of ``cell``, checkpointing its layers' activations where the plan says."""
        facts = self._facts
        s = facts.spec
        compute = CellCompute(
            stage_module(facts, cell[1]),
            mode=facts.mode,
            window=window(facts.stages),
            lr=s.lr,
            weight_decay=s.weight_decay,
            schedule=s.schedule,
            settings=dataclasses.replace(facts.compute, checkpointing=assignment.checkpointed(cell[1])),
        )
        return CellWorker(
            cell,
            facts.stages,
            self._exchange_settings(),
            compute,
            data,
            s.micro_batch,
            facts.run_id,
            self._send,
            self._link_Bps,
            shape=s.model,
            shards=assignment.shard_counts()[cell[1]],
            half=facts.half,
            reducer=self.reducer,
        )

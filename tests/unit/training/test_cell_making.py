"""daemon/training/cell_making.py: a cell is made with the run's compute and the plan's checkpointing."""

from __future__ import annotations

from pathlib import Path

import pytest

from swarmd.data.training_data import CorpusData
from swarmd.models.data.corpus import load_corpus, train_eval_split
from swarmd.models.precision import ComputeSettings
from swarmd.models.presets import DEFAULT_RUN
from swarmd.peers.records.identity import Identity
from swarmd.peers.records.run_spec import parse_spec_body, run_seed, sign_run_spec
from swarmd.peers.taskpool.assignment import Assignment
from swarmd.peers.taskpool.exchange import ExchangeConfig
from swarmd.training.cell_making import CellMaker
from swarmd.training.run_facts import RunFacts
from swarmd.training.shards.head_relay import HeadRelays

pytestmark = pytest.mark.timeout(60)


def test_cells_compute_as_the_run_says_and_checkpoint_where_the_plan_does(tmp_path: Path) -> None:
    creator = Identity.generate()
    signed = sign_run_spec(creator, parse_spec_body({**DEFAULT_RUN, "stages": 2}))
    shape = signed.spec.model
    facts = RunFacts(
        signed, creator, tmp_path, stages=2, mode="gradient", half="fp16", compute=ComputeSettings(compile=False)
    )
    maker = CellMaker(
        facts,
        lambda: ExchangeConfig(batch_micro_batches=2, share_micro_batches=2),
        send=None,  # type: ignore[arg-type]  # nothing is sent: no worker runs
        link_Bps=lambda peer: 0.0,
        reducer=HeadRelays(None, {}),  # type: ignore[arg-type]
    )
    data = CorpusData(*train_eval_split(load_corpus(signed.spec.corpus), shape.seq_len, run_seed(signed.run_id)))
    own = creator.peer_id
    plan = Assignment(1, ((own, own),), ((own,), (own,)), 1, 2, checkpointing=(False, True))
    first, last = maker.make((0, 0), plan, data), maker.make((0, 1), plan, data)
    assert (first.compute.settings.checkpointing, last.compute.settings.checkpointing) == (False, True)
    assert first.compute.settings.device == "cpu" and first.compute.settings.dtype == "fp32"
    plain = Assignment(2, ((own, own),), ((own,), (own,)), 1, 2)  # a plan that names none
    assert not maker.make((0, 1), plain, data).compute.settings.checkpointing

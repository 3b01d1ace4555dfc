"""The plan type (peers/planning/plan_cost.py): the data path's fields, their defaults and their checks."""

from __future__ import annotations

import pytest

from swarmd.peers.planning.plan_cost import Plan
from swarmd.peers.planning.scenario_gen import synthetic_scenario

pytestmark = pytest.mark.timeout(30)


def test_defaults_are_one_shard_at_the_parameter_server_gradients_and_the_batch_over_the_pipelines() -> None:
    sc = synthetic_scenario(6, regions=1, seed=1, batch={"sequences": 12, "micro_batch": 2})
    p = Plan(((0, 1), (2, 3)), (6, 6), (0, 3))
    assert p.shard_servers == ((0,), (3,)) and p.local_steps == 1 and p.spares == ()
    assert p.micro_batches_per_share(sc) == 3  # 12 sequences / (2 pipelines x 2 per micro-batch)
    assert Plan(((0, 1),), (6, 6), (0, 1), share_micro_batches=5).micro_batches_per_share(sc) == 5


def test_to_json_keeps_the_format_fields_and_adds_the_data_path_with_each_devices_roles() -> None:
    sc = synthetic_scenario(8, regions=1, seed=1)
    p = Plan(
        ((0, 1), (2, 3)),
        (6, 6),
        (0, 1),
        relays=(5,),
        shard_servers=((0, 4), (1, 5)),
        local_steps=8,
        share_micro_batches=16,
        spares=(4, 5, 6),
    )
    out = p.to_json(sc)
    assert list(out)[:4] == ["pipelines", "layers_per_stage", "parameter_servers", "relays"]
    assert out["shard_servers"] == [["d0000", "d0004"], ["d0001", "d0005"]]
    assert out["local_steps"] == 8 and out["share_micro_batches"] == 16 and out["spares"] == ["d0004", "d0005", "d0006"]
    assert out["roles"] == {
        "d0000": ["cell", "shard_server"],
        "d0001": ["cell", "shard_server"],
        "d0002": ["cell"],
        "d0003": ["cell"],
        "d0004": ["shard_server"],
        "d0005": ["shard_server", "relay"],
        "d0006": ["spare"],
    }


def test_remapped_moves_every_index_field() -> None:
    p = Plan(((0, 1),), (6, 6), (0, 1), relays=(2,), shard_servers=((0, 3), (1,)), spares=(2, 3))
    to = [10, 11, 12, 13]
    q = p.remapped(to)
    assert q.pipelines == ((10, 11),) and q.parameter_servers == (10, 11) and q.relays == (12,)
    assert q.shard_servers == ((10, 13), (11,)) and q.spares == (12, 13)
    assert q.local_steps == p.local_steps and q.layers_per_stage == p.layers_per_stage


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"shard_servers": ((1, 0), (1,))}, "must start with the stage's parameter server 0"),
        ({"shard_servers": ((0,),)}, "for 1 stages, the plan has 2"),
        ({"shard_servers": ((0, 0), (1,))}, "each device once"),
        ({"local_steps": 0}, "local_steps = 0"),
        ({"share_micro_batches": -1}, "share_micro_batches = -1"),
        ({"spares": (1, 4)}, r"spares \[1\] also hold a cell"),
        ({"checkpointing": (True,)}, "checkpointing names 1 stages, the plan has 2"),
    ],
)
def test_an_inconsistent_plan_is_refused_naming_the_field(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Plan(((0, 1),), (6, 6), (0, 1), **kwargs)  # type: ignore[arg-type]


def test_checkpointing_is_per_stage_false_by_default_and_in_the_json() -> None:
    sc = synthetic_scenario(4, regions=1, seed=1)
    assert not Plan(((0, 1),), (6, 6), (0, 1)).checkpointed(1)
    p = Plan(((0, 1),), (6, 6), (0, 1), checkpointing=(False, True))
    assert [p.checkpointed(s) for s in range(2)] == [False, True]
    assert p.to_json(sc)["checkpointing"] == [False, True]
    assert Plan(((0, 1),), (6, 6), (0, 1)).to_json(sc)["checkpointing"] == [False, False]

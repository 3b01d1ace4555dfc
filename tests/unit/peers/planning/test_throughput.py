"""The throughput model (peers/planning/throughput.py, transfers.py): cases worked out from the
data path's own pure functions, and the directions every change must move it."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from swarmd.peers.planning.learning import token_efficiency
from swarmd.peers.planning.plan_cost import Plan, stage_flops_per_sequence, stage_parameters
from swarmd.peers.planning.scenario import Scenario, parse_scenario
from swarmd.peers.planning.scenario_gen import synthetic_scenario, synthetic_scenario_dict
from swarmd.peers.planning.throughput import (
    NOTICE_S,
    SETTLED,
    compute_bound_tokens_per_s,
    fastest_device_tokens_per_s,
    predict_throughput,
)
from swarmd.peers.planning.transfers import bytes_on_links
from swarmd.peers.taskpool.exchange import share_seconds, trained_tokens
from swarmd.peers.wire.sizes import REQUEST_OVERHEAD_BYTES, SLOW_LINK_Bps, codec_for, message_bytes

pytestmark = pytest.mark.timeout(60)


def uniform(n: int, *, bw: float = 1e8, lat: float = 0.01, tflops: float = 100.0, **kw: Any) -> Scenario:
    raw = synthetic_scenario_dict(n, regions=1, seed=1, **kw)
    raw["latency_s"] = np.full((n, n), lat).tolist()
    raw["bandwidth_Bps"] = np.full((n, n), bw).tolist()
    for d in raw["devices"]:
        d["tflops"], d["memory_gib"] = tflops, 80
    return parse_scenario(raw)


def test_bytes_on_links_are_the_codecs_message_bytes_of_each_link() -> None:
    links = np.array([1.0, SLOW_LINK_Bps / 3, SLOW_LINK_Bps * 0.999, SLOW_LINK_Bps, 1e9, 0.0])
    for kind in ("activation", "contribution", "delta", "weights"):
        for half in ("fp16", "bf16"):
            got = bytes_on_links(kind, 12345, links, half, ndim=3)
            want = [message_bytes(12345, codec_for(kind, float(bw), half=half), 3) for bw in links]
            assert got.tolist() == want, (kind, half)


def test_one_cell_trains_its_rounds_over_the_longer_of_its_shares_and_its_exchange() -> None:
    # One device computes, one serves: the round is H shares or the contribution's upload,
    # whichever is longer. With one pipeline the server steps on each round (an outer step
    # averages one round of each pipeline), and the next round's contribution is based on the
    # version before: it counts between 1 / sqrt(2) (one version stale) and 1 of a round.
    sc = uniform(2, batch={"sequences": 256, "micro_batch": 1})
    for h in (2, 200):
        p = Plan(((0,),), (sc.model.layers,), (1,), local_steps=h, share_micro_batches=1)
        got = predict_throughput(sc, p)
        flops = float(stage_flops_per_sequence(sc, np.array([float(sc.model.layers)]))[0]) / 100e12
        ledger = 2 * (0.01 + REQUEST_OVERHEAD_BYTES / 1e8)
        share = max(ledger, share_seconds([flops / 3], [2 * flops / 3], [], 1))  # the next is asked for ahead
        upload = 0.01 + message_bytes(stage_parameters(sc, (sc.model.layers,))[0], "fp16") / 1e8
        want = trained_tokens(h, 1, sc.model.seq_len) / max(h * share, upload)
        assert want / math.sqrt(2) * 0.99 <= got.tokens_per_s <= want * 1.01, h
        assert got.share_s == pytest.approx(share) and got.churn_fraction == 0.0
    assert predict_throughput(sc, replace(p, local_steps=2)).exchange_s > 2 * share  # H = 2 does not hide it


def test_the_breakdown_adds_up_and_sits_under_the_bounds() -> None:
    sc = synthetic_scenario(24, regions=3, seed=2, churn=True)
    grid = tuple((d,) for d in range(16))
    p = Plan(grid, (12,), (16,), shard_servers=((16, 17, 18, 19),), local_steps=50, share_micro_batches=4)
    got = predict_throughput(sc, p)
    b = got.breakdown()
    assert b["iteration_s"] == pytest.approx(b["compute_s"] + b["pipeline_comm_s"] + b["sync_comm_s"] + b["churn_s"])
    assert all(v >= -1e-9 for v in b.values())
    assert got.tokens_per_s <= got.exchange_tokens_per_s <= got.pipeline_tokens_per_s <= got.compute_tokens_per_s
    assert got.compute_tokens_per_s <= compute_bound_tokens_per_s(sc)
    assert fastest_device_tokens_per_s(sc) < compute_bound_tokens_per_s(sc)
    assert len(got.to_json()) <= 16  # what the signed plan record carries


def test_a_busy_server_caps_the_swarm() -> None:
    # Sixteen cells of a 200M model on one shard server of the same link: the server takes in
    # sixteen contributions a round, so rounds stretch to its rate.
    sc = uniform(17)
    one = Plan(tuple((d,) for d in range(16)), (12,), (16,), local_steps=20, share_micro_batches=16)
    alone = predict_throughput(sc, one)
    assert alone.server_utilisation > 1.0
    spread = replace(one, shard_servers=(tuple([16, *range(16)]),))  # every cell serves a shard too
    assert predict_throughput(sc, spread).server_utilisation < alone.server_utilisation
    assert predict_throughput(sc, spread).tokens_per_s > alone.tokens_per_s


def test_reduction_groups_take_a_busy_servers_load_onto_their_members_links() -> None:
    # The same sixteen cells and one server, in groups of four: the server takes four sums a
    # round and sends each delta to four heads; its load falls about fourfold and the swarm
    # trains faster. Where the server's link is far faster than the cells', a head's link is
    # the new bottleneck, and the groups train less than the server alone.
    sc = uniform(17)
    one = Plan(tuple((d,) for d in range(16)), (12,), (16,), local_steps=20, share_micro_batches=16)
    alone = predict_throughput(sc, one)
    grouped = predict_throughput(sc, replace(one, reduce_groups=(4,)))
    assert grouped.server_utilisation < alone.server_utilisation / 3
    assert grouped.tokens_per_s > alone.tokens_per_s
    raw = synthetic_scenario_dict(17, regions=1, seed=1)
    bw = np.full((17, 17), 1e7)
    bw[16, :] = bw[:, 16] = 1e10  # a data-centre server among home links
    raw["latency_s"], raw["bandwidth_Bps"] = np.full((17, 17), 0.01).tolist(), bw.tolist()
    for d in raw["devices"]:
        d["tflops"], d["memory_gib"] = 100.0, 80
    fast = parse_scenario(raw)
    assert (
        predict_throughput(fast, replace(one, reduce_groups=(4,))).tokens_per_s
        < predict_throughput(fast, one).tokens_per_s
    )


def test_faster_links_and_devices_never_train_less() -> None:
    base = uniform(6, bw=2e7)
    p = Plan(((0, 1), (2, 3)), (8, 4), (4, 5), shard_servers=((4, 5), (5, 4)), local_steps=4, share_micro_batches=8)
    # (within the step rate's fixed point, settled to SETTLED of itself)
    slow = predict_throughput(base, p).tokens_per_s * (1 - SETTLED)
    assert predict_throughput(uniform(6, bw=2e8), p).tokens_per_s >= slow
    assert predict_throughput(uniform(6, bw=2e7, tflops=300.0), p).tokens_per_s >= slow


def test_churn_costs_half_a_round_and_the_wait_for_a_spare_per_departure() -> None:
    raw = synthetic_scenario_dict(2, regions=1, seed=1, batch={"sequences": 256, "micro_batch": 1})
    raw["latency_s"] = np.full((2, 2), 0.01).tolist()
    raw["bandwidth_Bps"] = np.full((2, 2), 1e8).tolist()
    p = Plan(((0,),), (12,), (1,), local_steps=100, share_micro_batches=1)
    steady = predict_throughput(parse_scenario(raw), p)
    raw["devices"][0] |= {"mean_uptime_h": 2.0, "mean_downtime_h": 0.5}  # type: ignore[index, operator]
    churned = predict_throughput(parse_scenario(raw), p)
    refetch = 0.01 + message_bytes(stage_parameters(parse_scenario(raw), (12,))[0], "fp32") / 1e8
    want = (steady.round_s / 2 + NOTICE_S + refetch) / (2.0 * 3600)
    assert churned.churn_fraction == pytest.approx(want, rel=1e-6)
    assert churned.tokens_per_s == pytest.approx(steady.tokens_per_s * (1 - want), rel=1e-6)


def test_stale_gradients_are_dropped_until_the_swarm_settles_at_the_staleness_bound() -> None:
    # Sixty-four pipelines against a batch of eight micro-batches: at full weight the servers
    # would step eight times a round and every gradient would arrive far past the bound. The
    # dropped ones do not count toward a step, so the servers step less: the swarm settles
    # where contributions arrive at the bound (4 versions), training a fraction of its work.
    sc = uniform(65, batch={"sequences": 8, "micro_batch": 1})
    many = Plan(tuple((d,) for d in range(64)), (12,), (64,), local_steps=1, share_micro_batches=1)
    got = predict_throughput(sc, many)
    assert 4.0 <= got.staleness <= 5.0 and 0 < got.staleness_weight < 1
    few = predict_throughput(sc, replace(many, pipelines=many.pipelines[:4]))
    assert few.staleness < 1 and few.staleness_weight == 1.0
    # Local steps: pseudo-gradients count 1 / sqrt(1 + staleness) up to the same bound.
    local = predict_throughput(sc, replace(many, local_steps=50))
    assert 0 < local.staleness_weight < 1


def test_a_late_round_is_trained_tokens_and_its_lateness_is_priced_by_the_efficiency() -> None:
    # Four pipelines of one-micro-batch shares, H = 50: rounds arrive a fraction of a server
    # step late and count less towards the next step, but every one is applied, so the raw
    # tokens are every round's; what the lateness costs is in the efficiency, and only there.
    sc = uniform(5, batch={"sequences": 8, "micro_batch": 1})
    plan = Plan(tuple((d,) for d in range(4)), (12,), (4,), local_steps=50, share_micro_batches=1)
    got = predict_throughput(sc, plan)
    f = got.per_pipeline
    assert (f.staleness > 0).all() and (f.weight < 1).all() and (f.applied == 1).all()
    rounds = (trained_tokens(50, 1, sc.model.seq_len) / f.round_s * (1 - f.churn)).sum()
    assert got.tokens_per_s == pytest.approx(rounds, rel=1e-9)
    assert got.efficiency == pytest.approx(token_efficiency(sc.model.params, 4, 50, sc.model.seq_len, got.staleness))
    assert got.efficiency < token_efficiency(sc.model.params, 4, 50, sc.model.seq_len)

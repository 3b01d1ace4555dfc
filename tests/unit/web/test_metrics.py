"""daemon/web/metrics.py: a status answer (shaped as ``swarmd status --json`` prints it on a
training daemon) mapped onto ``swarmd_*`` families, read back through Prometheus's own parser."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from swarmd.web.metrics import StatusCollector, member_state

pytestmark = pytest.mark.timeout(10)

OWN, OTHER, THIRD = "12D3KooWown", "12D3KooWother", "12D3KooWthird"
CELL = {
    "pipeline": 0,
    "stage": 1,
    "forwards": 174,
    "backwards": 0,
    "loss": 2.78,
    "weights": {"versions": [52], "full_pulls": 1, "delta_pulls": 43, "head_pulls": 0},
    "contributions": {"waiting": 2, "sent": 43, "resent": 1, "dropped": 0, "lost": 0, "bytes_sent": 36943364},
}
SHARD = {
    "stage": 1,
    "shard": 0,
    "version": 52,
    "contributions": 43,
    "duplicates": 1,
    "dropped_stale": 2,
    "refused": 0,
    "pulls": 45,
    "staleness": {"0": 40, "1": 3},
}
PLAN = {
    "version": 3,
    "pipelines": 1,
    "stages": 2,
    "predicted_iteration_s": 0.027,
    "grid": [[OTHER, OWN]],
    "parameter_servers": [OTHER, OWN],
    "spares": [THIRD],
}
STATUS: dict[str, Any] = {
    "peer_id": OWN,
    "version": "0.1.0",
    "state": "running",
    "paused": None,
    "run_id": "tiny-bytes.qghdfkuts2esr2cdpmfanjzg",
    "roles": ["worker", "parameter_server"],
    "uptime_s": 26.0,
    "device": {"kind": "cpu", "name": "AMD EPYC", "memory_bytes": 25275973632},
    "throughput_gflops": 1.5,
    "probe": {
        "achieved_tflops": 0.003,
        "rated_tflops": None,
        "of_rated": None,
        "cpu_share": 0.5,
        "precision": "fp32",
        "threads": 2,
        "run_shapes": True,
        "min_fraction": 1.0,
        "free_memory_bytes": 9 * 2**30,
        "seconds": 1.4,
    },
    "rejected_records": 4,
    "refused_members": {"bad_signature": 2},
    "dht_restarts": 0,
    "peers": [{"peer_id": OTHER, "roles": ["worker", "parameter_server"]}, {"peer_id": THIRD, "roles": ["worker"]}],
    "training": {
        "updates": 52,
        "loss": 2.78,
        "tokens_per_s": 3942.6,
        "trained_tokens": 106496,
        "cells": [CELL],
        "shards": [SHARD],
        "reducer": {"bytes_sent": 1000},
    },
    "swarm": {"coordinator": OWN, "plan": PLAN, "plans_refused": {"stale": 1}, "links": {"probe_bytes_last_hour": 0}},
    "relaying": {"relay": False, "forwarded_bytes": 0},
    "routes": {"direct": 236, "relayed": 5},
    "rpc": {
        "requests": 230,
        "answered": 229,
        "refused": {"NOT_HOLDER": 1},
        "slowed": 0,
        "ignored": 0,
        "banned": {OTHER: 2000.0, THIRD: 500.0},
        "bytes_in": 104597820,
        "bytes_out": 7136833,
    },
    "limits": {
        "cpu_share": 0.5,
        "torch_threads": 2,
        "gpu_memory_gib": 4.0,
        "upload_mbit_s": 10.0,
        "download_mbit_s": 0.0,
        "daily_transfer_gib": 1.5,
        "pause_on_battery": True,
        "pause_while_in_use": False,
        "pause_while_gpu_used": True,
        "pause_while": ["steam"],
        "windows": [],
        "applied": {"cpu_share": 0.5, "throttled_s": 12.5, "torch_threads": 2, "gpu_memory": "no cap"},
    },
}


def scrape(status: dict[str, Any]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of one scrape, by name and labels, as a Prometheus server would read it."""
    registry = CollectorRegistry()
    registry.register(StatusCollector(lambda: status))
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_training_figures_map_onto_their_families_in_base_units() -> None:
    m = scrape(STATUS)
    assert m[("swarmd_committed_updates", ())] == 52
    assert m[("swarmd_loss", ())] == 2.78
    assert m[("swarmd_tokens_per_second", ())] == 3942.6
    assert m[("swarmd_device_throughput_flops", ())] == 1.5e9
    assert m[("swarmd_cell_loss", (("pipeline", "0"), ("stage", "1")))] == 2.78
    assert m[("swarmd_contributions_total", (("outcome", "resent"), ("pipeline", "0"), ("stage", "1")))] == 1
    assert m[("swarmd_contributions_waiting", (("pipeline", "0"), ("stage", "1")))] == 2
    assert m[("swarmd_weight_pulls_total", (("kind", "delta"), ("pipeline", "0"), ("stage", "1")))] == 43
    assert m[("swarmd_shard_contributions_total", (("outcome", "stale"), ("shard", "0"), ("stage", "1")))] == 2
    staleness = (("shard", "0"), ("stage", "1"), ("staleness", "1"))
    assert m[("swarmd_shard_contributions_by_staleness_total", staleness)] == 3


def test_traffic_refusals_and_bans_are_counted_by_kind() -> None:
    m = scrape(STATUS)
    assert m[("swarmd_transferred_bytes_total", (("direction", "in"), ("kind", "requests")))] == 104597820
    assert m[("swarmd_transferred_bytes_total", (("direction", "out"), ("kind", "contributions")))] == 36943364
    assert m[("swarmd_rpc_refused_total", (("code", "NOT_HOLDER"),))] == 1
    assert m[("swarmd_refused_total", (("kind", "member"), ("reason", "bad_signature")))] == 2
    assert m[("swarmd_refused_total", (("kind", "plan"), ("reason", "stale")))] == 1
    assert m[("swarmd_routed_requests_total", (("route", "relayed"),))] == 5
    assert m[("swarmd_rejected_records_total", ())] == 4


def test_bans_count_only_while_they_last() -> None:
    from swarmd.web.metrics import status_metrics

    families = {f.name: f for f in status_metrics(STATUS, now_s=1000.0)}
    assert families["swarmd_banned_peers"].samples[0].value == 1  # the one until 2000, not the one until 500


def test_roles_members_and_the_plan_are_gauges_by_label() -> None:
    m = scrape(STATUS)
    roles = {labels[0][1]: v for (name, labels), v in m.items() if name == "swarmd_role"}
    # The coordinator is told by the swarm section; every known role is present, held or not.
    assert roles == {"worker": 1, "parameter_server": 1, "coordinator": 1, "relay": 0, "paused": 0}
    members = {labels[0][1]: v for (name, labels), v in m.items() if name == "swarmd_members"}
    assert members == {"in_plan": 2, "spare": 1, "waiting": 0, "provisional": 0, "paused": 0}
    assert m[("swarmd_peers", ())] == 2
    assert m[("swarmd_plan_version", ())] == 3 and m[("swarmd_plan_stages", ())] == 2


def test_member_states_under_and_before_a_plan() -> None:
    assert member_state(OWN, {"worker"}, PLAN) == "in_plan"
    assert member_state(THIRD, {"worker"}, PLAN) == "spare"
    assert member_state("12D3KooWnew", {"worker"}, PLAN) == "waiting"
    assert member_state(OWN, {"paused"}, PLAN) == "paused"
    assert member_state(OWN, {"worker"}, None) == "provisional"


def test_limits_in_base_units_and_pause_conditions() -> None:
    m = scrape(STATUS)
    assert m[("swarmd_limit_cpu_share_ratio", ())] == 0.5
    assert m[("swarmd_limit_upload_bytes_per_second", ())] == 1.25e6  # 10 Mbit/s
    assert m[("swarmd_limit_download_bytes_per_second", ())] == 0  # no cap
    assert m[("swarmd_limit_gpu_memory_bytes", ())] == 4 * 2**30
    assert m[("swarmd_limit_daily_transfer_bytes", ())] == 1.5 * 2**30
    assert m[("swarmd_compute_throttled_seconds_total", ())] == 12.5
    conditions = {labels[0][1]: v for (name, labels), v in m.items() if name == "swarmd_limit_pause_condition"}
    assert conditions == {
        "on_battery": 1,
        "while_in_use": 0,
        "while_gpu_used": 1,
        "while_program": 1,
        "outside_windows": 0,
    }


def test_a_paused_peer_says_so_with_its_reason() -> None:
    status = copy.deepcopy(STATUS)
    status["paused"] = {"since_s": 12.5, "left_s": None, "reason": "owner"}
    status["roles"] = ["paused"]
    m = scrape(status)
    assert m[("swarmd_paused", ())] == 1
    assert m[("swarmd_paused_seconds", (("reason", "owner"),))] == 12.5
    assert m[("swarmd_role", (("role", "paused"),))] == 1 and m[("swarmd_role", (("role", "worker"),))] == 0
    assert scrape(STATUS)[("swarmd_paused", ())] == 0


def test_a_peer_that_does_not_train_reports_no_training_figures() -> None:
    status = copy.deepcopy(STATUS)
    status.update(training=None, swarm=None, rpc=None, routes=None, relaying=None, limits=None)
    m = scrape(status)
    names = {name for name, _ in m}
    # No zeros that would read as a measurement: the families are absent.
    assert not names & {"swarmd_loss", "swarmd_tokens_per_second", "swarmd_committed_updates", "swarmd_plan_version"}
    assert not any(n.startswith("swarmd_limit_") for n in names)
    assert m[("swarmd_state", (("state", "running"),))] == 1
    assert m[("swarmd_members", (("state", "provisional"),))] == 3


def test_the_device_probes_figures_are_gauges_and_an_unknown_rated_figure_is_no_sample() -> None:
    m = scrape(STATUS)
    assert m[("swarmd_device_achieved_flops", ())] == 3e9  # the probe's, before cpu_share's half
    assert m[("swarmd_device_free_memory_bytes", ())] == 9 * 2**30
    assert m[("swarmd_device_probe_seconds", ())] == 1.4
    assert ("swarmd_device_rated_flops", ()) not in m
    rated = scrape({**STATUS, "probe": {**STATUS["probe"], "rated_tflops": 989.0}})
    assert rated[("swarmd_device_rated_flops", ())] == 989e12
    unmeasured = scrape({**STATUS, "probe": {"achieved_tflops": None, "rated_tflops": None, "cpu_share": 1.0}})
    assert ("swarmd_device_achieved_flops", ()) not in unmeasured
    assert ("swarmd_device_probe_seconds", ()) not in unmeasured

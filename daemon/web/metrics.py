"""Prometheus metrics of one daemon, read from its status answer at scrape time.

``StatusCollector`` keeps no counters of its own: every scrape asks the node for the same dict
``swarmd status --json`` prints (its ``limits``: the ``[limits]`` in force) and maps it onto
metric families named ``swarmd_*``, in base units (bytes, seconds, FLOP/s). What the status
counts since the daemon started is a counter (``_total``); what it holds now is a gauge. A
section the daemon does not have (``training`` on a peer that does not train, a plan not yet
made) yields no samples rather than zeros that would read as a measurement.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from swarmd.web.history import updates_seen

Status = dict[str, Any]

ROLES = ("worker", "parameter_server", "coordinator", "relay", "paused")
"""Roles always reported (1 held, 0 not), so that a dashboard's series do not come and go."""
MEMBER_STATES = ("in_plan", "spare", "waiting", "provisional", "paused")
"""Under the plan in force: placed in it, a spare, not yet placed; before any plan, everyone
follows the provisional assignment; a paused member takes no work."""
GIB = 2**30
MBIT = 1e6 / 8  # bytes per second in one Mbit/s


class StatusCollector(Collector):
    """A custom collector: ``collect`` maps one status answer onto the families below."""

    def __init__(self, status: Callable[[], Status]) -> None:
        self._status = status

    def collect(self) -> Iterator[Metric]:
        return iter(status_metrics(self._status(), now_s=None))


def status_metrics(s: Status, now_s: float | None) -> list[Metric]:
    """Every family for one status answer (``now_s``: the time bans are judged at; None: now)."""
    now = time.time() if now_s is None else now_s
    return [*_peer(s), *_training(s.get("training")), *_traffic(s, now), *_swarm(s), *_limits(s.get("limits"))]


def _gauge(name: str, doc: str, value: float | None) -> Iterable[Metric]:
    return [] if value is None else [GaugeMetricFamily(name, doc, value=value)]


def _counter(name: str, doc: str, value: float | None) -> Iterable[Metric]:
    return [] if value is None else [CounterMetricFamily(name, doc, value=value)]


def _labelled(family: GaugeMetricFamily | CounterMetricFamily, rows: Iterable[tuple[list[str], float]]) -> Metric:
    for labels, value in rows:
        family.add_metric(labels, value)
    return family


def _peer(s: Status) -> Iterator[Metric]:
    info = InfoMetricFamily("swarmd", "This daemon: its version, peer ID, run and state")
    info.add_metric([], {"version": s["version"], "peer_id": s["peer_id"] or "", "run_id": s["run_id"]})
    yield info
    yield _labelled(
        GaugeMetricFamily("swarmd_state", "The daemon's state (1: the one it is in)", labels=["state"]),
        [([s["state"]], 1)],
    )
    yield from _gauge("swarmd_uptime_seconds", "Seconds since the daemon started", s.get("uptime_s"))
    paused = s.get("paused")
    yield GaugeMetricFamily(
        "swarmd_paused", "1 while this peer is paused (its work handed back), else 0", int(bool(paused))
    )
    if paused:
        reason = GaugeMetricFamily(
            "swarmd_paused_seconds", "Seconds this peer has been paused, by the reason it paused", labels=["reason"]
        )
        yield _labelled(reason, [([str(paused.get("reason"))], float(paused.get("since_s") or 0))])
    held = set(s.get("roles") or [])
    swarm = s.get("swarm") or {}
    if s.get("peer_id") and swarm.get("coordinator") == s["peer_id"]:
        held.add("coordinator")
    if (s.get("relaying") or {}).get("relay"):
        held.add("relay")
    roles = GaugeMetricFamily("swarmd_role", "Roles this peer holds (1) or not (0)", labels=["role"])
    yield _labelled(roles, [([r], int(r in held)) for r in sorted(held | set(ROLES))])
    device = s.get("device") or {}
    yield from _gauge("swarmd_device_memory_bytes", "Memory of this peer's compute device", device.get("memory_bytes"))
    gflops = s.get("throughput_gflops")
    yield from _gauge(
        "swarmd_device_throughput_flops",
        "Compute this peer offers the planner: achieved at the run's shapes times cpu_share (0: not measured)",
        None if gflops is None else gflops * 1e9,
    )
    yield from _probe(s.get("probe") or {})


def _probe(p: Status) -> Iterator[Metric]:
    """The device probe's figures (``swarmd.node.compute_probe``): none before it measured."""
    achieved, rated = p.get("achieved_tflops"), p.get("rated_tflops")
    yield from _gauge(
        "swarmd_device_achieved_flops",
        "FLOP/s the device achieved at the run's shapes in the cells' precision and threads",
        None if achieved is None else achieved * 1e12,
    )
    yield from _gauge(
        "swarmd_device_rated_flops", "The device's rated dense bf16 FLOP/s", None if rated is None else rated * 1e12
    )
    free = p.get("free_memory_bytes")
    yield from _gauge("swarmd_device_free_memory_bytes", "The device's free memory when probed", free)
    yield from _gauge("swarmd_device_probe_seconds", "How long the device probe took", p.get("seconds"))


def _training(t: Status | None) -> Iterator[Metric]:
    if not t:
        return
    yield from _gauge(
        "swarmd_committed_updates",
        "The model's committed updates as this peer sees them (stage 0's version, else the newest of a stage it holds)",
        updates_seen(t),
    )
    yield from _gauge("swarmd_loss", "Mean training loss of the last micro-batches this peer saw", t.get("loss"))
    held_out = t.get("held_out") or {}
    yield from _gauge("swarmd_held_out_loss", "The run's newest loss on its held-out data", held_out.get("loss"))
    yield from _gauge(
        "swarmd_held_out_version",
        "Shard (0, 0)'s version the newest held-out loss was scored at",
        held_out.get("version"),
    )
    yield from _gauge(
        "swarmd_tokens_per_second",
        "Tokens the swarm trains per second, as shard (0, 0) applies them",
        t.get("tokens_per_s"),
    )
    yield from _gauge("swarmd_trained_tokens", "Tokens the model has been trained on", t.get("trained_tokens"))
    yield from _cells(t.get("cells") or [])
    yield from _shards(t.get("shards") or [])


def _cells(cells: list[Status]) -> Iterator[Metric]:
    if not cells:
        return
    key = ["pipeline", "stage"]

    def where(c: Status) -> list[str]:
        return [str(c["pipeline"]), str(c["stage"])]

    yield _labelled(
        GaugeMetricFamily(
            "swarmd_cell_loss", "Mean loss of the last micro-batches of a cell on the last stage", labels=key
        ),
        [(where(c), c["loss"]) for c in cells if c.get("loss") is not None],
    )
    passes = CounterMetricFamily("swarmd_cell_passes", "Forward and backward passes computed", labels=[*key, "pass"])
    yield _labelled(passes, [([*where(c), p], c.get(f"{p}s", 0)) for c in cells for p in ("forward", "backward")])
    outcomes = ("sent", "resent", "dropped", "lost")
    contributions = CounterMetricFamily(
        "swarmd_contributions", "Contributions of the cells to their shards, by outcome", labels=[*key, "outcome"]
    )
    yield _labelled(contributions, [([*where(c), o], c["contributions"].get(o, 0)) for c in cells for o in outcomes])
    waiting = GaugeMetricFamily("swarmd_contributions_waiting", "Contributions not yet committed", labels=key)
    yield _labelled(waiting, [(where(c), c["contributions"].get("waiting", 0)) for c in cells])
    pulls = CounterMetricFamily("swarmd_weight_pulls", "Weights pulled from the shards, by kind", labels=[*key, "kind"])
    kinds = ("full", "delta", "head")
    yield _labelled(pulls, [([*where(c), k], c["weights"].get(f"{k}_pulls", 0)) for c in cells for k in kinds])


def _shards(shards: list[Status]) -> Iterator[Metric]:
    if not shards:
        return
    key = ["stage", "shard"]

    def where(s: Status) -> list[str]:
        return [str(s["stage"]), str(s["shard"])]

    version = GaugeMetricFamily("swarmd_shard_version", "Version of a parameter shard this peer serves", labels=key)
    yield _labelled(version, [(where(s), s["version"]) for s in shards])
    outcomes = {"accepted": "contributions", "duplicate": "duplicates", "stale": "dropped_stale", "refused": "refused"}
    received = CounterMetricFamily(
        "swarmd_shard_contributions", "Contributions a served shard received, by outcome", labels=[*key, "outcome"]
    )
    yield _labelled(received, [([*where(s), o], s.get(f, 0)) for s in shards for o, f in outcomes.items()])
    staleness = CounterMetricFamily(
        "swarmd_shard_contributions_by_staleness",
        "Contributions a served shard applied, by how many updates behind they were computed",
        labels=[*key, "staleness"],
    )
    yield _labelled(
        staleness, [([*where(s), str(k)], n) for s in shards for k, n in sorted((s.get("staleness") or {}).items())]
    )
    served = CounterMetricFamily("swarmd_shard_pulls_served", "Weight pulls a served shard answered", labels=key)
    yield _labelled(served, [(where(s), s.get("pulls", 0)) for s in shards])


def _traffic(s: Status, now: float) -> Iterator[Metric]:
    moved = CounterMetricFamily(
        "swarmd_transferred_bytes", "Bytes of the data path, by direction and kind", labels=["direction", "kind"]
    )
    rows: list[tuple[list[str], float]] = []
    rpc = s.get("rpc")
    if rpc:
        rows += [(["in", "requests"], rpc["bytes_in"]), (["out", "answers"], rpc["bytes_out"])]
    t = s.get("training") or {}
    if t:
        sent = sum(c["contributions"].get("bytes_sent", 0) for c in t.get("cells") or [])
        rows += [
            (["out", "contributions"], sent),
            (["out", "reductions"], (t.get("reducer") or {}).get("bytes_sent", 0)),
        ]
    relaying = s.get("relaying")
    if relaying:
        rows.append((["out", "relayed"], relaying.get("forwarded_bytes", 0)))
    yield _labelled(moved, rows)
    links = (s.get("swarm") or {}).get("links") or {}
    yield from _gauge(
        "swarmd_probe_bytes_last_hour", "Bytes of link probes sent in the last hour", links.get("probe_bytes_last_hour")
    )
    if rpc:
        yield from _counter("swarmd_rpc_requests", "Data-path requests received", rpc["requests"])
        yield from _counter("swarmd_rpc_answered", "Data-path requests answered", rpc["answered"])
        refused = CounterMetricFamily("swarmd_rpc_refused", "Data-path requests refused, by code", labels=["code"])
        yield _labelled(refused, [([code], n) for code, n in sorted(rpc["refused"].items())])
        yield from _counter("swarmd_rpc_slowed", "Requests held back by their peer's rate quota", rpc.get("slowed"))
        yield from _counter("swarmd_rpc_ignored", "Streams of banned peers closed unread", rpc.get("ignored"))
        banned = sum(until > now for until in (rpc.get("banned") or {}).values())
        yield GaugeMetricFamily("swarmd_banned_peers", "Peers banned now for misbehaving", value=banned)
    routes = s.get("routes")
    if routes:
        routed = CounterMetricFamily("swarmd_routed_requests", "Our own data-path requests, by route", labels=["route"])
        yield _labelled(routed, [(["direct"], routes.get("direct", 0)), (["relayed"], routes.get("relayed", 0))])


def _swarm(s: Status) -> Iterator[Metric]:
    peers = s.get("peers") or []
    yield GaugeMetricFamily("swarmd_peers", "Other members this peer sees", value=len(peers))
    swarm = s.get("swarm") or {}
    plan = swarm.get("plan")
    roles = {p["peer_id"]: set(p.get("roles") or []) for p in peers}
    if s.get("peer_id"):
        roles[s["peer_id"]] = set(s.get("roles") or [])
    counts = dict.fromkeys(MEMBER_STATES, 0)
    for peer, held in roles.items():
        counts[member_state(peer, held, plan)] += 1
    members = GaugeMetricFamily(
        "swarmd_members", "Members of the swarm this peer sees (itself included), by state", labels=["state"]
    )
    yield _labelled(members, [([state], n) for state, n in counts.items()])
    refused = CounterMetricFamily(
        "swarmd_refused", "Records refused from others, by kind and reason", labels=["kind", "reason"]
    )
    rows = [(["member", r], n) for r, n in sorted((s.get("refused_members") or {}).items())]
    rows += [(["plan", r], n) for r, n in sorted((swarm.get("plans_refused") or {}).items())]
    yield _labelled(refused, rows)
    yield from _counter("swarmd_rejected_records", "DHT records that failed validation", s.get("rejected_records"))
    yield from _counter("swarmd_dht_restarts", "Times the DHT process died and was restarted", s.get("dht_restarts"))
    if plan:
        yield GaugeMetricFamily("swarmd_plan_version", "Version of the plan in force", value=plan["version"])
        yield GaugeMetricFamily("swarmd_plan_pipelines", "Pipelines of the plan in force", value=plan["pipelines"])
        yield GaugeMetricFamily("swarmd_plan_stages", "Stages of the plan in force", value=plan["stages"])
        yield from _gauge(
            "swarmd_plan_predicted_iteration_seconds",
            "The plan's predicted time of one iteration",
            plan.get("predicted_iteration_s"),
        )


def member_state(peer: str, roles: set[str], plan: Status | None) -> str:
    """What a member does under the plan: ``MEMBER_STATES``."""
    if "paused" in roles:
        return "paused"
    if plan is None:
        return "provisional"
    placed = {p for row in plan.get("grid") or [] for p in row} | set(plan.get("parameter_servers") or [])
    if peer in placed:
        return "in_plan"
    return "spare" if peer in (plan.get("spares") or []) else "waiting"


# [limits] field -> (metric, help, factor to base units). 0 means no cap, as in the config.
LIMITS = {
    "cpu_share": ("swarmd_limit_cpu_share_ratio", "The fraction of what compute runs on that swarmd may use", 1.0),
    "torch_threads": ("swarmd_limit_torch_threads", "torch threads for compute (0: one per core)", 1.0),
    "gpu_memory_gib": ("swarmd_limit_gpu_memory_bytes", "GPU memory compute may hold (0: no cap)", GIB),
    "upload_mbit_s": ("swarmd_limit_upload_bytes_per_second", "Training traffic sent (0: no cap)", MBIT),
    "download_mbit_s": ("swarmd_limit_download_bytes_per_second", "Training traffic received (0: no cap)", MBIT),
    "daily_transfer_gib": ("swarmd_limit_daily_transfer_bytes", "Training traffic per local day (0: no cap)", GIB),
}


def _limits(limits: Status | None) -> Iterator[Metric]:
    if not limits:
        return
    for field, (name, doc, factor) in LIMITS.items():
        value = limits.get(field)
        if isinstance(value, int | float) and not isinstance(value, bool):
            yield GaugeMetricFamily(name, doc, value=value * factor)
    switches = GaugeMetricFamily(
        "swarmd_limit_pause_condition", "Conditions that pause this peer: set (1) or not (0)", labels=["condition"]
    )
    rows: list[tuple[list[str], float]] = [
        ([when], int(bool(limits.get(f"pause_{when}"))))
        for when in ("on_battery", "while_in_use", "while_gpu_used")
        if f"pause_{when}" in limits
    ]
    rows += [
        (["while_program"], int(bool(limits.get("pause_while")))),
        (["outside_windows"], int(bool(limits.get("windows")))),
    ]
    yield _labelled(switches, rows)
    applied = limits.get("applied") or {}
    yield from _counter(
        "swarmd_compute_throttled_seconds",
        "Seconds compute was held back by [limits] cpu_share",
        applied.get("throttled_s"),
    )

"""peers/records/links.py, peers/records/plan_record.py and peers/planning/snapshot.py: measurements and plans as signed
records, probing within a budget, and the live swarm assembled into a scenario."""

from __future__ import annotations

import dataclasses

import pytest

from swarmd.errors import RecordError
from swarmd.peers.planning.snapshot import Member, build_snapshot, model_for_scenario
from swarmd.peers.records import links as links_mod
from swarmd.peers.records import plan_parts
from swarmd.peers.records import plan_record as plan_mod
from swarmd.peers.records.envelope import sign_record
from swarmd.peers.records.identity import Identity
from swarmd.peers.records.links import (
    RETRY_UNMEASURED_S,
    LinkEstimate,
    LinksRecord,
    ProbeBudget,
    bandwidth_from_transfer,
    make_record,
)
from swarmd.peers.records.plan_record import PlanRecord
from swarmd.peers.records.run_spec import derive_run_id

pytestmark = pytest.mark.timeout(30)

T0 = 1_800_000_000.0
A, B, C = Identity.generate(), Identity.generate(), Identity.generate()
RUN = derive_run_id("links", A.public_key)


def links_of(who: Identity, to: dict[str, LinkEstimate], tflops: float = 10.0) -> links_mod.LinksRecord:
    return make_record(RUN, who.peer_id, T0, 60, tflops, 16.0, to)


def test_estimates_smooth_and_bandwidth_subtracts_the_round_trip() -> None:
    est = LinkEstimate()
    est.add(T0, rtt_s=0.1, bandwidth_Bps=1e6)
    est.add(T0 + 1, rtt_s=0.2, bandwidth_Bps=2e6)
    assert 0.1 < est.rtt_s < 0.2 and 1e6 < est.bandwidth_Bps < 2e6  # type: ignore[operator]
    assert bandwidth_from_transfer(1_000_000, 1.1, 0.1) == pytest.approx(1e6)
    assert bandwidth_from_transfer(1000, 1.0, 0.0) is None  # too small to say anything about bandwidth


def test_probe_budget_bounds_bytes_and_frequency() -> None:
    budget = ProbeBudget(interval_s=60, bytes_per_hour=1_000_000, probe_bytes=400_000, max_peers=2)
    links = {"x": LinkEstimate(1e-3, 1e6, T0, 1), "y": LinkEstimate(1e-3, 1e6, T0 - 100, 1)}
    # unmeasured first, then the stalest; a fresh one waits for its interval; at most max_peers
    assert budget.due(T0 + 10, links, ["x", "y", "z", "w"]) == ["w", "z"]
    assert budget.due(T0 + 10, links, ["x", "y"]) == ["y"]
    assert budget.next_probe_bytes(T0) == 400_000
    budget.charge(T0, 400_000)
    budget.charge(T0, 400_000)
    assert budget.next_probe_bytes(T0 + 1) == 200_000  # what is left of the hour
    budget.charge(T0 + 1, 200_000)
    assert budget.next_probe_bytes(T0 + 2) == 0
    assert budget.next_probe_bytes(T0 + 3601) == 400_000  # an hour later the budget is back


def test_a_link_whose_bandwidth_probe_failed_is_tried_again_sooner_and_sooner_less() -> None:
    budget = ProbeBudget(interval_s=300)
    rtt_only = LinkEstimate(rtt_s=1e-3)
    rtt_only.add(T0, rtt_s=1e-3)  # the ping answered, the bandwidth probe did not
    assert budget.due(T0 + RETRY_UNMEASURED_S - 1, {"x": rtt_only}, ["x"]) == []
    assert budget.due(T0 + RETRY_UNMEASURED_S, {"x": rtt_only}, ["x"]) == ["x"]
    rtt_only.add(T0 + 10, rtt_s=1e-3)  # failed again: twice as long
    assert budget.due(T0 + 10 + 2 * RETRY_UNMEASURED_S - 1, {"x": rtt_only}, ["x"]) == []
    assert budget.due(T0 + 10 + 2 * RETRY_UNMEASURED_S, {"x": rtt_only}, ["x"]) == ["x"]
    for _ in range(10):
        rtt_only.add(T0 + 100, rtt_s=1e-3)
    assert budget.due(T0 + 399, {"x": rtt_only}, ["x"]) == []  # never more seldom than the interval
    assert budget.due(T0 + 400, {"x": rtt_only}, ["x"]) == ["x"]
    measured = LinkEstimate(1e-3, 1e6, T0, 1)
    assert budget.due(T0 + 299, {"y": measured}, ["y"]) == []


def test_links_record_round_trip_and_refusals() -> None:
    record = links_of(A, {B.peer_id: LinkEstimate(0.02, 5e6, T0 - 5, 3), C.peer_id: LinkEstimate(None, None, 0, 0)})
    parsed = LinksRecord.parse(record.sign(A), run_id=RUN, now=T0, peer_id=A.peer_id)
    assert parsed.links == {B.peer_id: (0.01, 5e6, 5.0)}  # one-way latency; unmeasured left out
    with pytest.raises(RecordError, match="signed by"):
        body = dataclasses.asdict(dataclasses.replace(record, peer_id=B.peer_id))
        body["links"] = {}
        LinksRecord.parse(sign_record(A, links_mod.KIND, body), run_id=RUN, now=T0)
    bad = dataclasses.asdict(record)
    bad["links"] = {B.peer_id: [0.01, -5.0, 1.0]}
    with pytest.raises(RecordError, match="out of range"):
        LinksRecord.parse(sign_record(A, links_mod.KIND, bad), run_id=RUN, now=T0)
    bad["links"] = {A.peer_id: [0.01, 5.0, 1.0]}
    with pytest.raises(RecordError, match="bad peer id"):
        LinksRecord.parse(sign_record(A, links_mod.KIND, bad), run_id=RUN, now=T0)
    bad["links"] = {f"p{i}": [0.01, 5.0, 1.0] for i in range(links_mod.MAX_LINKS + 1)}
    with pytest.raises(RecordError, match="at most"):
        LinksRecord.parse(sign_record(A, links_mod.KIND, bad), run_id=RUN, now=T0)
    with pytest.raises(RecordError, match="expired"):
        LinksRecord.parse(record.sign(A), run_id=RUN, now=T0 + 61)


def test_the_largest_links_record_fits_its_bound() -> None:
    """Every link at its most verbose: the record stays within MAX_LINKS_BYTES (16 KiB), whatever
    the swarm's size, since a peer publishes at most MAX_LINKS of them."""
    figures = (1.2345678901234567e-05, 1.2345678901234567e11, 86399.12345678901)
    links = {f"p{i:03d}" + "Q" * 124: figures for i in range(links_mod.MAX_LINKS)}
    record = dataclasses.replace(links_of(A, {}), tflops=123456.789012345, memory_gib=123456.789012345, links=links)
    raw = record.sign(A)
    assert len(raw) <= links_mod.MAX_LINKS_BYTES
    assert LinksRecord.parse(raw, run_id=RUN, now=T0).links == links


def plan_of(**kw: object) -> PlanRecord:
    fields: dict[str, object] = dict(
        run_id=RUN,
        peer_id=A.peer_id,
        issued_at=T0,
        expires_at=T0 + 60,
        version=3,
        kind="repair",
        devices=[A.peer_id, B.peer_id, C.peer_id],
        pipelines=[[0, 2]],
        layers_per_stage=[3, 1],
        parameter_servers=[0, 2],
        relays=[1],
        predicted={"iteration_s": 1.5},
    )
    fields.update(kw)
    return PlanRecord(**fields)  # type: ignore[arg-type]


def test_plan_record_round_trip_and_lookups() -> None:
    plan = plan_of()
    parsed = PlanRecord.parse(plan.sign(A), run_id=RUN, now=T0, peer_id=A.peer_id)
    assert parsed == plan
    assert parsed.stage_of(C.peer_id) == 1 and parsed.stage_of(B.peer_id) is None
    assert parsed.server_of(1) == C.peer_id
    sharded = plan_of(
        shard_servers=[[0, 1], [2]], local_steps=20, share_micro_batches=8, spares=[1], reduce_groups=[1, 2]
    )
    assert PlanRecord.parse(sharded.sign(A), run_id=RUN, now=T0) == sharded


def test_checkpointing_round_trips_and_a_plan_without_it_reads_as_none() -> None:
    flagged = plan_of(checkpointing=[True, False])
    parsed = PlanRecord.parse(flagged.sign(A), run_id=RUN, now=T0)
    assert parsed == flagged and parsed.checkpointed(0) and not parsed.checkpointed(1)
    body = dataclasses.asdict(plan_of())
    del body["checkpointing"]  # what a plan signed before the field existed holds
    old = PlanRecord.parse(signed_bundle(A, body), run_id=RUN, now=T0)
    assert old.checkpointing == [] and not old.checkpointed(0)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"pipelines": [[0, 2], [1]]}, "every pipeline"),
        ({"pipelines": [[0, 0]]}, "places a device twice"),
        ({"shard_servers": [[1, 0], [2]]}, "must start with its parameter server"),
        ({"shard_servers": [[0, 0], [2]]}, "no device twice"),
        ({"shard_servers": [[0]]}, "each of 2 stages"),
        ({"local_steps": 0}, "outside"),
        ({"pipelines": [[0, 7]]}, "not an index"),
        ({"parameter_servers": [0]}, "parameter servers for 2 stages"),
        ({"layers_per_stage": [3, 0]}, "at least one layer"),
        ({"devices": [A.peer_id, A.peer_id, C.peer_id]}, "twice"),
        ({"kind": "guess"}, "kind"),
        ({"predicted": {"iteration_s": -1}}, "not a figure"),
        ({"reduce_groups": [2]}, "reduce_groups must give each of 2 stages"),
        ({"reduce_groups": [2, 0]}, "reduce_groups must give each of 2 stages"),
        ({"reduce_groups": [2, 65]}, "reduce_groups holds"),
        ({"checkpointing": [True]}, "checkpointing must be 2 true/false"),
        ({"checkpointing": [1, 0]}, "checkpointing must be 2 true/false"),
    ],
)
def test_a_malformed_plan_is_refused(change: dict[str, object], message: str) -> None:
    body = dataclasses.asdict(plan_of())
    body.update(change)
    with pytest.raises(RecordError, match=message):
        PlanRecord.parse(signed_bundle(A, body), run_id=RUN, now=T0)


def signed_bundle(who: Identity, body: dict[str, object]) -> bytes:
    """A plan bundle of any body, as a hostile coordinator could sign it (``PlanRecord.sign``
    only signs well-formed plans)."""
    head = {k: body.pop(k) for k in ("run_id", "peer_id", "issued_at", "expires_at")}
    version, devices = body.pop("version"), body.pop("devices")
    found, parts = plan_parts.encode(RUN, devices, body)  # type: ignore[arg-type]
    manifest = plan_parts.PlanManifest(**head, version=version, **found)  # type: ignore[arg-type]
    return plan_parts.pack_bundle(manifest.sign(who), parts)


def test_a_plan_signed_as_a_bare_record_is_refused() -> None:
    """The old wire form (the whole plan in one signed record) is no plan bundle."""
    with pytest.raises(RecordError, match="plan bundle"):
        PlanRecord.parse(sign_record(A, plan_mod.KIND, dataclasses.asdict(plan_of())), run_id=RUN, now=T0)


def test_the_snapshot_fills_unmeasured_links_and_counts_them() -> None:
    members = [Member(p.peer_id, 16.0) for p in (A, B, C)]
    records = {
        A.peer_id: links_of(A, {B.peer_id: LinkEstimate(0.02, 5e6, T0, 1)}, tflops=20.0),
        B.peer_id: links_of(B, {C.peer_id: LinkEstimate(0.04, 1e6, T0, 1)}, tflops=40.0),
    }
    snap = build_snapshot(
        "live",
        members,
        records,
        {B.peer_id: (5.0, 1.0)},
        model_for_scenario(4, 128, 256, 128),
        {"sequences": 16, "micro_batch": 4},
    )
    sc = snap.scenario
    i = sc.index()
    assert snap.measured == 2 and snap.filled == 4
    assert sc.bandwidth_Bps[i[A.peer_id], i[B.peer_id]] == 5e6
    assert sc.bandwidth_Bps[i[B.peer_id], i[A.peer_id]] == 5e6  # the reverse direction, filled
    assert sc.latency_s[i[A.peer_id], i[C.peer_id]] == pytest.approx(0.015)  # the median of 0.01 and 0.02
    tflops = {d.id: d.tflops for d in sc.devices}
    assert tflops[A.peer_id] == 20.0 and tflops[C.peer_id] == 30.0  # C measured nothing: the median
    assert sc.devices[i[B.peer_id]].mean_uptime_h == 5.0 and sc.devices[i[A.peer_id]].mean_uptime_h is None
    assert sc.parallelism is None  # the planner keeps the run's stages and chooses the pipelines


def test_an_unreachable_link_is_published_at_the_floor_and_starts_afresh_when_it_opens() -> None:
    est = LinkEstimate()
    est.add(T0, rtt_s=0.05, bandwidth_Bps=4e6)
    est.mark_unreachable(T0 + 10)
    assert est.unreachable and est.bandwidth_Bps == links_mod.UNREACHABLE_BPS
    record = LinksRecord.parse(links_of(A, {B.peer_id: est}).sign(A), run_id=RUN, now=T0)  # within the schema
    assert record.links[B.peer_id][1] == links_mod.UNREACHABLE_BPS
    members = [Member(p.peer_id, 16.0) for p in (A, B)]
    snap = build_snapshot(
        "live",
        members,
        {A.peer_id: record},
        {},
        model_for_scenario(4, 128, 256, 128),
        {"sequences": 16, "micro_batch": 4},
    )
    i = snap.scenario.index()
    assert snap.scenario.bandwidth_Bps[i[A.peer_id], i[B.peer_id]] == links_mod.UNREACHABLE_BPS
    est.add(T0 + 20, bandwidth_Bps=2e6)  # it opens again: the new sample, not an average with the floor
    assert not est.unreachable and est.bandwidth_Bps == 2e6

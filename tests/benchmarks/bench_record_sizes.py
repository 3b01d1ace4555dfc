"""How big the records a swarm stores in the DHT are, for swarms of 100 to 10,000 members.

    .venv/bin/python tests/benchmarks/bench_record_sizes.py [--sizes 100 1000 10000] [--stages 8]

One request into hivemind's DHT process may carry at most 64 KiB
(``swarmd.peers.dht.process.MAX_REQUEST_BYTES``); every value a swarm stores should stay well
under it. For each size N the planner plans a synthetic scenario of N devices
(``scenario_gen``, three regions; the device names replaced by real peer IDs, sorted as the
live snapshot sorts them), and the table gives:

- the plan as one JSON record (what was stored before plans were split) and zlib over it;
- the plan as stored now (``swarmd.peers.records.plan_parts``): the manifest, the parts, the
  largest single value, and all bytes stored;
- what a reader that cached the plan fetches again when one member joins (the device inserted
  in sorted order, the grid kept): the changed parts and their bytes;
- the time to sign (encode) and to parse (join and check) the plan.

Then the per-peer records at their largest: a links record (``MAX_LINKS`` peers), an
observations record (``MAX_SUBJECTS`` subjects) and a heartbeat. Planning 10,000 devices takes
about a minute and 5 GB of memory. Figures only; nothing is asserted.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
import zlib

from swarmd.peers.membership.reliability import MAX_SUBJECTS, ObservationBook
from swarmd.peers.planning.planner import PlannerConfig, plan
from swarmd.peers.planning.scenario_gen import synthetic_scenario
from swarmd.peers.records.envelope import canonical_json
from swarmd.peers.records.heartbeat import MAX_ADDRS, DeviceInfo, Heartbeat
from swarmd.peers.records.identity import Identity, peer_id_from_public_key
from swarmd.peers.records.links import MAX_LINKS, LinksRecord
from swarmd.peers.records.plan_parts import PlanManifest, open_bundle
from swarmd.peers.records.plan_record import PlanRecord
from swarmd.peers.records.run_spec import derive_run_id

COORDINATOR = Identity.generate()
RUN = derive_run_id("sizes", COORDINATOR.public_key)
T0 = time.time()


def planned(n: int, stages: int) -> PlanRecord:
    """The planner's plan of N synthetic devices as the coordinator publishes it."""
    result = plan(synthetic_scenario(n), PlannerConfig(time_budget_s=0.5, stages=stages, even_layers=True))
    ids = sorted(peer_id_from_public_key(os.urandom(32)) for _ in range(n))
    return PlanRecord(
        run_id=RUN,
        peer_id=COORDINATOR.peer_id,
        issued_at=T0,
        expires_at=T0 + 300,
        version=1,
        kind="full",
        devices=ids,
        pipelines=[list(row) for row in result.pipelines],
        layers_per_stage=list(result.layers_per_stage),
        parameter_servers=list(result.parameter_servers),
        relays=list(result.relays),
        predicted={"tokens_per_s": 1234.5, "iteration_s": 2.5},
        shard_servers=[list(row) for row in result.shard_servers],
        local_steps=result.local_steps,
        share_micro_batches=result.share_micro_batches,
        spares=list(result.spares),
        reduce_groups=list(result.reduce_groups),
    )


def joined(record: PlanRecord) -> PlanRecord:
    """``record`` after one member joined: its ID in sorted place, made a spare, the rest kept."""
    newcomer = peer_id_from_public_key(os.urandom(32))
    devices = sorted([*record.devices, newcomer])
    at = {old: devices.index(peer) for old, peer in enumerate(record.devices)}

    def moved(rows: list[int]) -> list[int]:
        return [at[i] for i in rows]

    return dataclasses.replace(
        record,
        version=record.version + 1,
        devices=devices,
        pipelines=[moved(row) for row in record.pipelines],
        parameter_servers=moved(record.parameter_servers),
        relays=moved(record.relays),
        shard_servers=[moved(row) for row in record.shard_servers],
        spares=[*moved(record.spares), devices.index(newcomer)],
    )


def manifest_of(raw: bytes) -> PlanManifest:
    return PlanManifest.parse(open_bundle(raw).manifest, run_id=RUN, now=None)


def plan_row(n: int, stages: int) -> dict[str, object]:
    record = planned(n, stages)
    body = canonical_json(dataclasses.asdict(record))
    started = time.perf_counter()
    raw = record.sign(COORDINATOR)
    signed_s = time.perf_counter() - started
    started = time.perf_counter()
    PlanRecord.parse(raw, run_id=RUN, now=T0)
    parsed_s = time.perf_counter() - started
    bundle, manifest = open_bundle(raw), manifest_of(raw)
    after = joined(record).sign(COORDINATOR)
    fresh = {d: v for d, v in open_bundle(after).parts.items() if d not in bundle.parts}
    values = [bundle.manifest, *bundle.parts.values()]
    return {
        "devices": n,
        "pipelines": len(record.pipelines),
        "one record B": len(body),
        "zlib B": len(zlib.compress(body, 9)),
        "manifest B": len(bundle.manifest),
        "parts": f"{len(manifest.devices)}+{len(manifest.roles)}",
        "largest B": max(len(v) for v in values),
        "stored B": sum(len(v) for v in values),
        "join: parts": len(fresh),
        "join: B": sum(len(v) for v in fresh.values()),
        "sign ms": round(signed_s * 1000, 1),
        "parse ms": round(parsed_s * 1000, 1),
    }


def peer_records() -> dict[str, int]:
    """The per-peer records at their largest, as bytes stored."""
    peers = sorted(peer_id_from_public_key(os.urandom(32)) for _ in range(max(MAX_LINKS, MAX_SUBJECTS)))
    me = COORDINATOR.peer_id
    links = {p: (0.012345, 123456789.1, 12.3) for p in peers[:MAX_LINKS]}
    links_record = LinksRecord(
        run_id=RUN, peer_id=me, issued_at=T0, expires_at=T0 + 60, tflops=123.4, memory_gib=80.0, links=links
    )
    book = ObservationBook(me)
    for step in range(3):
        book.observe(T0 + 30 * step, peers[:MAX_SUBJECTS] if step != 1 else peers[: MAX_SUBJECTS // 2])
    heartbeat = Heartbeat(
        run_id=RUN,
        peer_id=me,
        issued_at=T0,
        expires_at=T0 + 60,
        addrs=[f"/ip4/203.0.113.{i}/tcp/31337/p2p/{me}" for i in range(MAX_ADDRS)],
        device=DeviceInfo(kind="cuda", name="NVIDIA H100 80GB HBM3", memory_bytes=80 << 30, cpus=64),
        throughput_gflops=400000.0,
        version="0.1.0",
        roles=["worker", "server", "relay"],
        uptime_s=86400.0,
    )
    return {
        f"links ({MAX_LINKS} peers)": len(links_record.sign(COORDINATOR)),
        f"observations ({MAX_SUBJECTS} subjects)": len(book.to_record(RUN, me, T0 + 90, 60.0).sign(COORDINATOR)),
        f"heartbeat ({MAX_ADDRS} addresses)": len(heartbeat.sign(COORDINATOR)),
    }


def table(rows: list[dict[str, object]]) -> str:
    heads = list(rows[0])
    widths = [max(len(h), *(len(str(r[h])) for r in rows)) for h in heads]
    lines = [" | ".join(h.rjust(w) for h, w in zip(heads, widths, strict=True))]
    lines.append("-+-".join("-" * w for w in widths))
    lines += [" | ".join(str(r[h]).rjust(w) for h, w in zip(heads, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 10_000])
    parser.add_argument("--stages", type=int, default=8)
    args = parser.parse_args()
    rows = []
    for n in args.sizes:
        started = time.perf_counter()
        rows.append(plan_row(n, args.stages))
        print(f"planned {n} devices in {time.perf_counter() - started:.1f} s", flush=True)
    print("\nPlans (B: bytes; parts: device parts + role parts; join: refetched after one member joins)")
    print(table(rows))
    print("\nPer-peer records at their largest")
    print(table([{"record": name, "bytes": size} for name, size in peer_records().items()]))


if __name__ == "__main__":
    main()

"""What the robust rule costs, and what it saves under a sign-flipper, in the swarm's own code.

    .venv/bin/python tests/benchmarks/bench_robust_swarm.py [--peers 6] [--updates 120]
        [--scenarios clean sign-flip] [--aggregations mean centred-clip] [--pairs 3]

``bench_robust.py`` feeds one shard by hand; this runs the daemon's trainers (cells, shard
servers, ledger, leases; ``tests/unit/training/swarm_in_process.py``) over an in-memory
network, with the default run (two stages; ``--peers`` // 2 pipelines under the provisional
assignment). Each pair of runs shares its keys, so its run ID, weights and data order; only
the aggregation differs (the run ID does not depend on it). The asynchronous schedule still
differs run to run, which is why the gaps are given per pair and as a mean over pairs.

- ``clean``: every member honest;
- ``sign-flip``: one member (the last key; the provisional assignment places members by peer
  ID, so its cell differs pair to pair) sends every contribution negated (same norm: no norm
  bound sees it), as the member of issue 26 did.

Prints, per run, the held-out loss when shard (0, 0) reaches ``--updates`` versions (the
swarm's own evaluation: the same held-out sequences every time), the seconds it took and what
each stage's shard server did (contributions clipped, senders distrusted); then each rule's
mean gap to the clean mean of the same pairs. Figures only; nothing is asserted. About a
minute a run on two cores.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from swarmd.models.presets import DEFAULT_RUN  # noqa: E402
from swarmd.peers.records.identity import Identity  # noqa: E402
from swarmd.training.cells.contributions import Contributions  # noqa: E402
from tests.unit.training.swarm_in_process import Swarm  # noqa: E402

SCENARIOS = ("clean", "sign-flip")
EVAL_SEQUENCES = 64


class SignFlip:
    """Negates every contribution a chosen set of cells hands to their delivery (the one place
    a cell's round becomes slices), as a member running a patched daemon would."""

    def __init__(self) -> None:
        self.cells: set[int] = set()  # id() of the lying member's cells' Contributions
        self.flipped = 0
        self._add = Contributions.add

    def __enter__(self) -> SignFlip:
        flipper = self

        def add(self: Contributions, shares: list[int], tickets: list[str], vector: torch.Tensor, *rest: Any) -> None:
            if id(self) in flipper.cells:
                vector, flipper.flipped = -vector, flipper.flipped + 1
            flipper._add(self, shares, tickets, vector, *rest)

        Contributions.add = add  # type: ignore[method-assign]
        return self

    def __exit__(self, *_: object) -> None:
        Contributions.add = self._add  # type: ignore[method-assign]


async def run(
    keys: list[Identity], aggregation: str, scenario: str, updates: int, timeout_s: float
) -> tuple[float, float, dict[str, Any]]:
    """(held-out loss at version 0, at ``updates``; what the servers and the liar did)."""
    changes = {
        "exchange": {**DEFAULT_RUN["exchange"], "aggregation": aggregation},
        "eval": {"every": updates, "sequences": EVAL_SEQUENCES},
    }
    with tempfile.TemporaryDirectory(prefix="swd-robust-") as folder, SignFlip() as flip:
        swarm = Swarm(Path(folder), len(keys), spec_changes=changes, identities=keys)
        liar = swarm.members[keys[-1].peer_id].trainer
        swarm.start()

        def scores() -> list[Any]:
            found = [s for m in swarm.members.values() for s in m.trainer.evaluation.history]
            return sorted(found, key=lambda s: s.version)

        def watch() -> bool:
            if scenario == "sign-flip":
                flip.cells |= {id(worker.contributions) for worker in liar.cells.values()}
            return any(s.version >= updates for s in scores())

        try:
            await swarm.wait_for(f"{updates} updates and their score", watch, timeout_s)
            servers = {}
            for member in swarm.members.values():
                for key, server in member.trainer.servers.items():
                    info = server.info()
                    servers[str(key)] = {k: info.get(k) for k in ("centre_clipped", "clipped", "distrusted")}
        finally:
            await swarm.stop()
        first, last = scores()[0], next(s for s in scores() if s.version >= updates)
        return first.loss, last.loss, {"flipped": flip.flipped, "servers": servers, "version": last.version}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peers", type=int, default=6, help="members (pipelines: peers // 2, the run's two stages)")
    parser.add_argument("--updates", type=int, default=120, help="shard (0, 0)'s version at the score")
    parser.add_argument("--pairs", type=int, default=3, help="key sets (run IDs), each run with every rule")
    parser.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    parser.add_argument("--aggregations", nargs="+", choices=("mean", "centred-clip"), default=["mean", "centred-clip"])
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds a run may take")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)
    print(
        f"default run in one process: {args.peers} members ({args.peers // 2} pipelines x 2 stages), "
        f"held-out loss ({EVAL_SEQUENCES} sequences) at shard (0, 0) version {args.updates}, {args.pairs} pairs",
        flush=True,
    )
    print(f"{'scenario':<10} {'aggregation':<13} {'pair':>4} {'seconds':>8} {'start':>7} {'final':>7}  servers")
    finals: dict[tuple[str, str], list[float]] = {}
    for pair in range(args.pairs):
        keys = [Identity.generate() for _ in range(args.peers)]
        for scenario in args.scenarios:
            for aggregation in args.aggregations:
                started = time.monotonic()
                start, final, what = asyncio.run(run(keys, aggregation, scenario, args.updates, args.timeout))
                finals.setdefault((scenario, aggregation), []).append(final)
                print(
                    f"{scenario:<10} {aggregation:<13} {pair:>4} {time.monotonic() - started:8.0f} {start:7.3f} "
                    f"{final:7.3f}  {what}",
                    flush=True,
                )
    clean = finals.get(("clean", "mean"))
    print("\nper rule: final held-out loss over the pairs, and the gap to the clean mean's of the same pair:")
    for (scenario, aggregation), values in finals.items():
        gaps = [v - c for v, c in zip(values, clean, strict=True)] if clean else []
        spread = f" +/- {statistics.stdev(gaps):.3f}" if len(gaps) > 1 else ""
        gap = f"gap {statistics.mean(gaps):+.3f}{spread}  per pair {[round(g, 3) for g in gaps]}" if gaps else ""
        print(f"  {scenario:<10} {aggregation:<13} final {statistics.mean(values):.3f}  {gap}")


if __name__ == "__main__":
    main()

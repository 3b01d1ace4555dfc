"""Is the simulator honest? Real daemons on emulated links against the simulator on the same swarm.

    sudo .venv/bin/python tests/benchmarks/calibrate_simulator.py --out calibration

1. **The devices.** This machine's compute, measured the way the daemons will meet it: as
   many processes as daemons, one torch thread each, timing forward and backward of the run's
   model at once; their rate becomes each device's ``tflops`` (the scenario's unit).
2. **The real swarm.** One network namespace per daemon on a bridge; ``tc tbf`` shapes each
   device's upload and download, and the data path's latency shim
   (``swarmd.peers.wire.emulated_delay``; no ``netem`` here) adds the one-way latency. Measured
   first: one TCP stream's goodput and the standing queue it keeps in the shaper's buffer (the
   delay it adds to other connections' packets); and on the daemons' own data path (hivemind
   P2P streams, swarmd's framing, the shim) a bulk request's goodput and how much longer a
   small request takes beside it on the same connection. The scenario's links get the data
   path's goodput, the simulation both delays. The daemons train the default run
   (``docs/data-path.md``: cells, shards, shares); once every daemon follows the coordinator's
   plan (its status shows the plan's version, works the cells the plan's grid gives it and
   serves shard ``(s, 0)`` of the stages the plan names it server of) and ``--warmup-updates``
   more updates are in, the trained micro-batches are sampled for ``--seconds`` at whichever
   daemon serves shard ``(0, 0)`` (its ``trained_micro_batches``, or its version times a step's
   micro-batches across a hand-over), and at ``--kill-at`` one daemon that works a cell and
   serves no shard (else any cell's worker) is killed (SIGKILL). The bytes each device sent
   and received, the share ledger's counters and shard ``(0, 0)``'s updates are counted over
   the window.
3. **The simulated swarm.** The same devices, links and model as a scenario file, simulated
   by ``swarmd.peers.sim.simulator`` with swarmd's planner (as the daemons' coordinator runs
   it: the run's stages and H fixed, the layers cut evenly), from the plan the daemons
   followed (and, apart, from its own plan), the same number of seconds, and the same daemon
   leaving at the same moment. The real window starts in a swarm that has trained a while, so
   the simulation runs ``SIM_WINDOWS`` windows, each after its own warm-up, and averages them.
4. **The comparison.** Trained tokens/s before the kill, after it, and over the whole window;
   the time until throughput was back to 90% of what it was (``recovery_times``, on 2 s
   buckets against the 20 s before the kill); real against simulated, with the ratio. A JSON
   file, a markdown table and a plot of both timelines go to ``--out``.

Figures, not assertions: the note of the change says how far apart they are. Every
namespace and process made here is removed on the way out, also when a step fails or the
harness is interrupted.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the calibration package
from tests.benchmarks.calibration.harness import calibrate, simulate_again  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument(
        "--rate-mbps",
        default="40",
        help="each device's upload and download: one figure for all, or one per device (40,40,20,10)",
    )
    parser.add_argument(
        "--access-latency-ms",
        default="10",
        help="one way; a link is the sum of its ends': one figure for all, or one per device",
    )
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--kill-at", type=float, default=60.0)
    parser.add_argument("--warmup-updates", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("calibration"))
    parser.add_argument("--real-from", type=Path, help="a calibration.json: simulate again against its real run")
    args = parser.parse_args()
    if args.real_from is not None:
        return simulate_again(args)
    return calibrate(args)


if __name__ == "__main__":
    sys.exit(main())

"""A real daemon that claims a fast device and never works: the silent member of issue 26.

Run as the ``command_prefix`` of a ``LocalDaemon``: ``python silent_daemon.py python -m swarmd
run ...``. It patches two things in this process and then runs the daemon unchanged: its
heartbeat announces ``CLAIMED_GFLOPS`` (so that a coordinator plans work for it), and its
trainer carries out none of what its rounds decide (so it never claims a cell or a shard,
while it follows the membership and the plan as every member does). Everything else (the DHT,
heartbeats, elections, the request server) is the real daemon's.
"""

from __future__ import annotations

import runpy
import sys

CLAIMED_GFLOPS = 5000.0
"""What it says it computes: far more than this machine's cores, so that the planner wants it."""


def main() -> None:
    from swarmd.node.presence import Presence
    from swarmd.training.lifecycle import Lifecycle

    measure = Presence.measure_device

    async def claim_fast(self: Presence, compute: object) -> None:
        await measure(self, compute)  # type: ignore[arg-type]
        self.throughput_gflops = CLAIMED_GFLOPS

    async def idle(self: Lifecycle, actions: object, now: float) -> None:
        return None

    Presence.measure_device = claim_fast  # type: ignore[method-assign]
    Lifecycle.apply = idle  # type: ignore[method-assign]
    argv = sys.argv[1:]
    at = argv.index("-m")  # [python, -m, swarmd, run, ...]: what LocalDaemon would have run
    sys.argv = [argv[at + 1], *argv[at + 2 :]]
    runpy.run_module(argv[at + 1], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()

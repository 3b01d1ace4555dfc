"""A real daemon that claims a device's speed, and (``--silent``) never works: issue 26's silent member.

Run as ``python -m tests.integration.hostile.silent_daemon GFLOPS [--silent] python -m swarmd run
...`` (the tests fork it: ``tests.integration.fork_launcher.WrappedDaemons``). It patches this
process and then runs the daemon unchanged: its heartbeat announces ``GFLOPS`` instead of what
its probe measured (so that what a coordinator plans does not hang on how loaded the machine is
while the probe runs), and with ``--silent``
its trainer carries out none of what its rounds decide (so it never claims a cell or a shard,
while it follows the membership and the plan as every member does). Everything else (the DHT,
heartbeats, elections, the request server) is the real daemon's.
"""

from __future__ import annotations

import runpy
import sys

SILENT_GFLOPS = 5000.0
"""What the silent member says it computes: far more than the others, so that the planner wants it."""


def main() -> None:
    from swarmd.node.presence import Presence
    from swarmd.training.lifecycle import Lifecycle

    claimed, args = float(sys.argv[1]), sys.argv[2:]
    silent = args[:1] == ["--silent"]
    measure = Presence.measure_device

    async def claim(self: Presence, *how: object) -> None:
        await measure(self, *how)  # type: ignore[arg-type]
        self.offering.achieved_tflops = claimed / 1000

    async def idle(self: Lifecycle, actions: object, now: float) -> None:
        return None

    Presence.measure_device = claim  # type: ignore[method-assign]
    if silent:
        Lifecycle.apply = idle  # type: ignore[method-assign]
        args = args[1:]
    at = args.index("-m")  # [python, -m, swarmd, run, ...]: what LocalDaemon would have run
    sys.argv = [args[at + 1], *args[at + 2 :]]
    runpy.run_module(args[at + 1], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()

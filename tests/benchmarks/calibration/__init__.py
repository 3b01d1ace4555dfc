"""The simulator's calibration against real daemons on emulated links, split by concept; the
entry script ``tests/benchmarks/calibrate_simulator.py`` holds the command line and the user's
documentation, and runs ``harness``.

- ``probes``: the programs run in child processes (compute, one TCP stream, the data path).
- ``measure``: this machine's compute and the emulated links, measured with those probes.
- ``scenario``: the swarm both sides run (model, heartbeat), and the devices and links as a
  scenario for the simulator.
- ``statuses``: what the real daemons' statuses say (the plan they follow, shard ``(0, 0)``'s
  holder, roles, whom to kill).
- ``real_run``: the real swarm started, sampled over the window and a daemon killed.
- ``sides``: a side's timeline reduced to the compared figures (before, after, recovery).
- ``simulated``: the same swarm simulated over averaged windows, and the comparison.
- ``report``: the markdown table, the JSON record and the plot.
- ``harness``: the whole calibration, or the simulated side again against a recorded run.
"""

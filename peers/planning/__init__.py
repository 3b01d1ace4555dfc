"""Planning a swarm: scenarios, what a plan costs, the planner and its baselines (``swarmd.peers.planning``).

- ``scenario``      a swarm on paper (devices, links, model, batch): the one input type
- ``scenario_gen``  synthetic scenarios of regions, drawn from a seed
- ``plan_cost``     the plan type, the reference yardstick and swarmd's own cost model
- ``open_path``     the cheapest order of stage groups along a pipeline
- ``planner``       swarmd's scheduler: full plans and incremental repairs, pure functions
- ``baselines``     the schedulers swarmd is measured against, reimplemented from their papers

Pure functions over a snapshot: the same code plans in the daemon, in ``swarmd plan`` and in
the simulator.
"""

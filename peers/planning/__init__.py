"""Planning a swarm: scenarios, what a plan trains per second, the planner and baselines (``swarmd.peers.planning``).

- ``scenario``      a swarm on paper (devices, links, model, batch): the one input type
- ``snapshot``      the live swarm as a scenario: members, measured links, reliability, the run
- ``scenario_gen``  synthetic scenarios of regions, drawn from a seed
- ``plan_cost``     the plan type, a cell's memory, and FORMAT.md's reference yardstick
- ``transfers``     what each piece of the data path takes on given devices and links
- ``throughput``    the predicted trained tokens per second of a plan, broken down, and what they teach
- ``learning``      what a token teaches against synchronous training (effective tokens/s: the objective)
- ``loss_curve``    a model's loss against its tokens (Chinchilla's fit): effective tokens to time to a loss
- ``settings``      what the planner is told and may know (its awareness, for ablations)
- ``construction``  grids for a shape: pipelines of close devices, ordered along their paths
- ``open_path``     the cheapest order of nodes along a pipeline
- ``layers``        the layer split for pipelines that run on their own
- ``schedule``      a grid's k, shard servers, H, relays and spares
- ``search``        local search on a grid, costed on the throughput model
- ``builder``       one planning's context: shapes, schedules, refinement, roles
- ``planner``       swarmd's scheduler: full plans (``plan``) and incremental repairs (``repair``)
- ``repair``        mending a plan after devices leave or join
- ``baselines``     the schedulers swarmd is measured against, reimplemented from their papers

Pure functions over a snapshot: the same code plans in the daemon, in ``swarmd plan`` and in
the simulator.
"""

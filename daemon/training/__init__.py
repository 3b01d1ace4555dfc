"""Training across the swarm, in the daemon (``swarmd.training``; the protocol is ``docs/data-path.md``).

- ``trainer``        the service: reads the pool, holds the cells and shards it is given, serves them
- ``bookkeeping``    the trainer's round as a pure step: readings of the pool in, claims and actions out
- ``lifecycle``      the step's actions done: cells and servers opened and closed, leases published
- ``status``         the training section of the daemon's status, and the swarm's rate of updates
- ``export``         every stage's newest weights gathered from its shards' holders (``swarmd export``)
- ``evaluation``     the swarm's weights scored on the held-out split every few versions, by shard (0, 0)'s holder
- ``run_facts``      what the trainer's parts are given: the run's facts, the seed's stage module, the inputs
- ``cell_making``    a cell built for its stage: the seed's stage module, its compute, its worker
- ``handlers``       the data path's requests, routed to what this peer holds
- ``held``           what this peer holds now: cells, shard servers, what closed ones left behind
- ``cells/``         the cell's side: one cell at work, its shares, its weights, its contributions
- ``shards/``        the shard server's side: a slice served, where its state comes from, its group's head
"""

"""Training across the swarm, in the daemon (``swarmd.training``; the protocol is ``docs/data-path.md``).

- ``trainer``        the service: reads the pool, holds the cells and shards it is given, serves them
- ``bookkeeping``    the trainer's round as a pure step: readings of the pool in, claims and actions out
- ``lifecycle``      the step's actions done: cells and servers opened and closed, leases published
- ``status``         the training section of the daemon's status, and the swarm's rate of updates
- ``export``         every stage's newest weights gathered from its shards' holders (``swarmd export``)
- ``evaluation``     the swarm's weights scored on the held-out split every few versions, by shard (0, 0)'s holder
- ``run_facts``      what the trainer's parts are given: the run's facts, the pool view, what is held
- ``opening``        a shard server opened on the newest state it may believe, replicated at its standby
- ``shard_sources``  where a shard's state comes from: replica, last holders, own file, seed; its geometry
- ``cell_making``    a cell built for its stage: the seed's stage module, its compute, its worker
- ``cell``           one cell at work: shares through the pipeline, tensors straight to its neighbours
- ``cell_facts``     what a cell's parts are built from: its facts, its view, narrow handles on it
- ``in_flight``      a cell's share in flight: its queued work, stage 0's window, how long shares take
- ``feeder``         stage 0's shares from the ledger: asked for, fed, given back when dropped
- ``neighbours``     a cell's tensors straight to its neighbours, tried again on a broken path
- ``rounds``         the end of a share at a cell and of its round: the contribution, the sync
- ``cell_stats``     a cell's counters and its entry in the status
- ``throttle``       [limits] cpu_share: each worker thread's duty cycle, and its torch threads
- ``puller``         a cell's weights: a whole pull, then committed deltas by long poll
- ``contributions``  a cell's one contribution per round, a slice per shard, kept until committed
- ``shard_server``   one slice of a stage's parameters served: contributions in, deltas out, steps logged
- ``contributors``   who may contribute to a shard, and which pipelines' ticketed shares
- ``reducer``        a reduction group's head: members' slices summed, sent to the server once
- ``head_relay``     a reduction group's head: the deltas it pulled, relayed to the members' pulls
- ``ledger_host``    the share ledger, served by the holder of shard (0, 0), and its signed tickets
- ``replicas``       a standby's replicas of the shards it stands by for
- ``handlers``       the data path's requests, routed to what this peer holds
"""

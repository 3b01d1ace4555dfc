"""Training across the swarm, in the daemon (``swarmd.training``; the protocol is ``docs/data-path.md``).

- ``trainer``        the service: reads the pool, holds the cells and shards it is given, serves them
- ``bookkeeping``    the trainer's round as a pure step: readings of the pool in, claims and actions out
- ``lifecycle``      the step's actions done: cells and servers opened and closed, leases published
- ``status``         the training section of the daemon's status, and the swarm's rate of updates
- ``export``         every stage's newest weights gathered from its shards' holders (``swarmd export``)
- ``opening``        a shard opened from the newest state it may believe; a cell built for its stage
- ``cell``           one cell at work: shares through the pipeline, tensors straight to its neighbours
- ``puller``         a cell's weights: a whole pull, then committed deltas by long poll
- ``contributions``  a cell's one contribution per round, a slice per shard, kept until committed
- ``shard_server``   one slice of a stage's parameters served: contributions in, deltas out, steps logged
- ``reducer``        a reduction group's head: members' slices summed, sent to the server once
- ``ledger_host``    the share ledger, served by the holder of shard (0, 0)
- ``replicas``       a standby's replicas of the shards it stands by for
- ``handlers``       the data path's requests, routed to what this peer holds
"""

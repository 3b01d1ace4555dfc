"""The task pool, which says who works which cell and serves which shard.

The task pool: who works which cell, who serves which shard, which data each pipeline trains
(``swarmd.peers.taskpool``; the protocol is ``docs/data-path.md``).

- ``exchange``  shares, rounds, shards, staleness and when a server steps: the exchange schedule
- ``shares``    the ledger of shares: data issued, renewed, completed, issued again
- ``tickets``   the ledger keeper's signed share tickets, and what a server checks of them
- ``lease``     what every lease is: a signed, expiring, renewable claim by one peer
- ``cells``     cell leases, the pool's rule (live members, the assignment, spares), pipeline epochs
- ``servers``   shard leases, take-over by the named standby, the versions the swarm has seen
- ``reduction``  reduction groups: a stage's cells sum their slices at a head before the servers
- ``assignment`` who should hold each cell and shard: the plan's, or the provisional rule

Pure rules over snapshots: the daemon, the planner's cost model and the simulator call the same
functions.
"""

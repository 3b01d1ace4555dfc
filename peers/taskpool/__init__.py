"""The task pool: who works which cell, who serves which shard, which data each pipeline trains
(``swarmd.peers.taskpool``; the protocol is ``docs/data-path.md``).

- ``exchange``  shares, rounds, shards, staleness and when a server steps: the exchange schedule
- ``shares``    the ledger of shares: data issued, renewed, completed, issued again

Pure rules over snapshots: the daemon, the planner's cost model and the simulator call the same
functions.
"""

"""The discrete-event simulator of a swarm over hours of churn (``swarmd.peers.sim``).

- ``churn``        when each device of a scenario comes and goes
- ``shared_links`` transfers sharing the network as concurrent TCP flows (max-min fair)
- ``engine``       the event queue, and messages as flows (direct, relayed, cut when an end leaves)
- ``workload``     a run's parameters per stage and shard, compute per micro-batch, bytes per message
- ``pipelines``    the cells: shares from the ledger, rounds, contributions, faults and spares
- ``shards``       the shard servers: staleness, steps, commits at the standby, pulls, failover
- ``reduction``    reduction groups: members' sums at a head before the servers, as the reducers run them
- ``allreduce``    a ring all-reduce among a group of devices, as flows on the shared links
- ``swarmd_path``  swarmd's own data path: the share ledger, the cells and the shard servers together
- ``sync_path``    the baselines' data paths, synchronous as their papers publish them
- ``op_times``     count and mean time per phase, for the results' breakdown
- ``control``      the elected coordinator's plans and repairs, and the relays
- ``results``      what a run measured, and the compute bound and single device it is held against
- ``simulator``    the settings, the strategy type and the run that composes the above
- ``strategies``   the placement strategies compared on the same seed and churn

It runs the daemon's own decision functions and data-path rules (planning, elections, the task
pool's ledger, cells and exchange schedule, the wire's message sizes and routing):
``docs/data-path.md`` is what it simulates.
"""

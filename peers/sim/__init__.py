"""The discrete-event simulator of a swarm over hours of churn (``swarmd.peers.sim``).

- ``churn``          when each device of a scenario comes and goes
- ``shared_links``   transfers sharing the network as concurrent TCP flows (max-min fair)
- ``engine``         the event queue, and messages as flows (direct, relayed, cut when an end leaves)
- ``world``          the settings, the devices' state, the engine and the counts every part reads
- ``workload``       a run's parameters per stage and shard, compute per micro-batch, bytes per message,
                     and the sizes swarmd's path fixes at its first plan (k, H, the exchange)
- ``timing``         a pipeline's compute and boundary times per micro-batch, for a share's length
- ``pipeline_state`` a pipeline and its cells as records, and the epoch stamp their events carry
- ``ledger_client``  the cells' side of the share ledger: shares held, renewed, given back unspent
- ``segments``       a round's shares run as one event: compute, boundary streams, a fault's split
- ``rounds``         when a pipeline's next shares start, and the contributions a round's end sends
- ``cell_holders``   who holds each cell: the plan's grid, departures, spares filling the holes
- ``pipelines``      the cells of the run: the list of pipelines and what the rest of the run calls
- ``shard_records``  a shard's, a contribution's and a round group's records, and the shards' clients
- ``contributions``  a shard's intake: arrivals, duplicates, staleness, the buffer, settling rounds
- ``commits``        a shard's steps, logged and committed at its standby; the tokens trained
- ``pulls``          the cells' pulls of committed versions (from a head or the server), whole slices
- ``shard_holders``  each shard's holder and standby: elections, failover, moves a plan names
- ``shards``         the shard servers: the four parts, built together, and what the path calls
- ``reduction``      reduction groups: members' sums at a head before the servers, as the reducers run them
- ``allreduce``      a ring all-reduce among a group of devices, as flows on the shared links
- ``swarmd_path``    swarmd's own data path: builds and owns the ledger, the cells and the shard servers
- ``sync_path``      the baselines' data paths, synchronous as their papers publish them
- ``op_times``       count and mean time per phase, for the results' breakdown
- ``control``        the elected coordinator's plans and repairs, and the relays
- ``results``        what a run measured, and the compute bound and single device it is held against
- ``time_to_target`` what a run's tokens teach, and when it reaches a target loss
- ``simulator``      the strategy type and the run: the world, the control plane and a data path
- ``strategies``     the placement strategies compared on the same seed and churn

It runs the daemon's own decision functions and data-path rules (planning, elections, the task
pool's ledger, cells and exchange schedule, the wire's message sizes and routing):
``docs/data-path.md`` is what it simulates.
"""

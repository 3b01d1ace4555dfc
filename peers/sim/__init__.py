"""The discrete-event simulator of a swarm over hours of churn (``swarmd.peers.sim``).

- ``churn``       when each device of a scenario comes and goes
- ``shared_links`` transfers sharing the network as concurrent TCP flows (max-min fair)
- ``strategies``  the placement strategies compared on the same seed and churn
- ``simulator``   the event loop: control plane, data plane and results

It runs the daemon's own decision functions (planning, elections, the task pool's rules).
"""

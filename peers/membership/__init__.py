"""Who is in the swarm and whom it trusts with a role (``swarmd.peers.membership``).

- ``members``      the swarm as this peer sees it: live heartbeats and round-trip times
- ``probes``       which members a round of RTT probes pings (a bounded number)
- ``versions``     whether the swarm runs a newer swarmd than this peer
- ``admission``    who the run's spec lets in (open, allowlist, join tokens), before any work
- ``reliability``  reliability from others' observations, never a peer's word on itself
- ``probation``    who the coordinator plans: members with a node behind them, a few a round
- ``standing``     who may stand for a role and whose word counts; a coordinator that never plans
- ``election``     elected roles: coordinator, shard server and its standby, relay
"""

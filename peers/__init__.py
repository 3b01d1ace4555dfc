"""Everything that talks to or reasons about other peers (import package ``swarmd.peers``).

- ``identity``    the peer's Ed25519 key and the libp2p peer ID it gives
- ``records``     the signed-record envelope and the checks on untrusted input
- ``heartbeat``   the signed, expiring membership record
- ``run_spec``    run specs and self-certifying run IDs
- ``swarm_dht``   one run's records in the hivemind DHT, behind typed keys and a validator
- ``membership``  the swarm as this peer sees it: live heartbeats and round-trip times
- ``lan``         LAN discovery with py-libp2p's mDNS and the hello protocol
- ``links``, ``reliability``, ``election``, ``swarm_snapshot``, ``plan_record``: knowing the swarm
  (measured links, reliability from others' observations, elected roles, the signed plan)
- ``taskpool/``   cell and shard leases, the share ledger, the exchange schedule
- ``wire/``       the data path's requests, tensor frames and routing through relays
- ``planning/``   scenarios, the cost model, the planner and its baselines
- ``sim/``        the discrete-event simulator

Nothing here imports the daemon's modules (only ``swarmd.errors``): decisions and protocols
know no process or CLI. ``lan`` (py-libp2p) and ``swarm_dht`` (hivemind) must not be imported
into one interpreter: both register the protobuf symbol ``crypto.pb.KeyType``.
"""

"""Everything that talks to or reasons about other peers (import package ``swarmd.peers``).

- ``records/``     the signed records peers publish: identity, heartbeat, run spec, links, plan
- ``dht/``         one run's records in the hivemind DHT, behind typed keys and a validator
- ``membership/``  live members, reliability from others' observations, elected roles
- ``lan/``         LAN discovery with py-libp2p's mDNS and the hello protocol
- ``taskpool/``    cell and shard leases, the share ledger, the exchange schedule
- ``wire/``        the data path's requests, tensor frames and routing through relays
- ``planning/``    scenarios, the cost model, the planner and its baselines
- ``sim/``         the discrete-event simulator

Layers, lowest first (``tests/unit/test_layout.py`` enforces them): ``records``; then ``dht``,
``membership``, ``lan``, ``taskpool``, ``wire``; then ``planning``; then ``sim``. Nothing here
imports the daemon's modules (only ``swarmd.errors``): decisions and protocols know no process
or CLI. ``lan`` (py-libp2p) and ``dht`` (hivemind) must not be imported into one interpreter:
both register the protobuf symbol ``crypto.pb.KeyType``.
"""

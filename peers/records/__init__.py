"""The signed records peers publish about themselves and the run (``swarmd.peers.records``).

- ``envelope``     the signed envelope every record travels in, and the checks on untrusted fields
- ``identity``     this peer's Ed25519 key and the libp2p peer ID it gives
- ``run_id``       the form of a run ID (standard library only: the CLI checks one at once)
- ``run_spec``     run specs and self-certifying run IDs
- ``signed``       the base of every record a peer signs about itself: subject, run and time checks
- ``heartbeat``    the signed, expiring membership record
- ``join_token``   the creator's signed word that one peer may join a private run
- ``links``        what a peer measured: RTTs and bandwidths to others, its own compute
- ``plan_record``  the elected coordinator's signed plan: cells, shard servers, relays, spares
- ``plan_parts``   a plan's wire form: a small signed manifest and compressed, content-addressed parts

The lowest layer of ``swarmd.peers``: records know no DHT, no pool and no planner.
"""

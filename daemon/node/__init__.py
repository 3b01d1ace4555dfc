"""One daemon (``swarmd.node``): the node and the services it composes on one asyncio loop.

- ``node``            the composition root: makes the services below, wires them, starts and stops them
- ``services``        periodic rounds with capped backoff, bounded DHT calls, the one stop request
- ``joining``         starting the DHT and finding the run's spec, retried until the join timeout
- ``dht_watch``       the DHT process's supervisor: a dead one is restarted, the node re-attached
- ``presence``        this peer's heartbeats (and its leave), membership scans, round-trip probes
- ``lan_service``     the LAN-discovery child while it runs, and the peers it introduces to the DHT
- ``lan_process``     LAN discovery (py-libp2p mDNS) in a child process, and the node's handle on it
- ``control_api``     what the control socket answers: status, peers, gather weights for export, pause
- ``limits/``         what the owner set in [limits], in one place: applied, paused for, counted
- ``measurements``    link probes, passive link samples, the observation book, and their signed records
- ``swarm_view``      what a round makes of everyone's records: reliability, the live links, the scenario
- ``plan_choice``     who coordinates and which plan every peer follows: rules all compute alike
- ``plan_publisher``  the elected coordinator's plans: made, repaired, compared, published
- ``coordination``    the coordination round, and the roles and plan in force that others ask about
- ``silent_members``  the coordinator's check that planned members took their cells and shards
- ``device``          what this machine offers: device model, memory (free too), the cells' precision
- ``compute_probe``   the device's achieved TFLOPS: a block of the run's matmuls, timed in seconds
- ``device_offer``    what this peer offers the planner: the probe's figures, else the rated one
- ``rated_tflops``    the vendors' rated dense bf16 TFLOPS by device name, for MFU and before a probe
- ``relay``           forwarding others' requests when elected a relay, and routing our own
- ``request_gate``    whom the request server serves: live members, and strangers only the public reads
- ``dial_back``       reachability from outside: members dial each other back on fresh connections
"""

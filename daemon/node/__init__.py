"""One daemon (``swarmd.node``): the node and the services it composes on one asyncio loop.

- ``node``          the composition root: identity, DHT, membership, training, control, watchdog
- ``coordination``  who coordinates, which plan every peer follows, publishing and repairing plans
- ``device``        what this machine offers: device model, memory, measured throughput
- ``relay``         forwarding others' requests when elected a relay, and routing our own
- ``lan_process``   LAN discovery (py-libp2p mDNS) in a child process, and the node's handle on it
"""

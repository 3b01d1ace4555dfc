"""The hivemind DHT, one run's records in it (``swarmd.peers.dht``).

- ``swarm_dht``  typed keys per record kind, the validator every stored value passes, and
  ``SwarmDHT``: publish and read heartbeats, links, observations, plans and leases
- ``process``    hivemind's DHT process made safe to talk to: whole-message reads, pipe writes
  off the caller's loop, one request's size bound
"""

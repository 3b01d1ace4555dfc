"""The hivemind DHT, one run's records in it (``swarmd.peers.dht``).

- ``swarm_dht``  typed keys per record kind, the validator every stored value passes, and
  ``SwarmDHT``: publish and read heartbeats, links, observations, plans and leases
"""

"""The hivemind DHT, one run's records in it (``swarmd.peers.dht``).

- ``swarm_dht``  which record may sit under which key (the validator every stored value
  passes), and ``SwarmDHT``: publish and read heartbeats, links, observations, plans and leases
- ``keys``       the key of each record kind (``swarmd/<run id>/…``), free of hivemind
- ``plan_reader``  plans joined from their manifests and parts: bounded fetching, a cache by digest
- ``process``    hivemind's DHT process made safe to talk to: whole-message reads, pipe writes
  off the caller's loop, answers tagged by request, one request's size bound
- ``in_process``  the coroutines ``SwarmDHT`` sends into that process: bounded reads, stores, pings
"""

"""Finding peers on the local network (``swarmd.peers.lan``).

- ``discovery``  LanDiscovery: the py-libp2p host in its own trio thread, started and stopped from the daemon
- ``greeter``    whom to say hello to and when: once per peer per interval, retries with backoff
- ``hello``      the hello protocol: one size-bounded payload from the peer the handshake authenticated
- ``mdns``       the mDNS service type private to a run, and our announcement and browser on it

Never imported beside hivemind (both register the protobuf symbol ``crypto.pb.KeyType``): the
daemon runs it in a child process (``swarmd.node.lan_process``).
"""

"""Finding peers on the local network (``swarmd.peers.lan``).

- ``mdns``  LanDiscovery: py-libp2p's mDNS, and the hello protocol that checks what a peer announces

Never imported beside hivemind (both register the protobuf symbol ``crypto.pb.KeyType``): the
daemon runs it in a child process (``swarmd.node.lan_process``).
"""

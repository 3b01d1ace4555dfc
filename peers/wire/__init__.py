"""What travels between peers on the data path, and how (``swarmd.peers.wire``).

- ``rpc``            framed requests over hivemind P2P streams: bounded, with deadlines, counted
- ``tensors``        tensor frames checked against the plan before use
- ``routing``        which way a request goes: direct, or through an elected relay
- ``emulated_delay`` a test-only latency shim for the calibration harness (this kernel has no netem)
"""

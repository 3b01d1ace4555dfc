"""What travels between peers on the data path, and how (``swarmd.peers.wire``).

- ``errors``         refusal codes and their typed exceptions; transport failures
- ``protocol``       requests and answers as frozen dataclasses, checked against their annotations
- ``messages``       every request and answer of the data path (``docs/data-path.md``), relaying, probes
- ``file_messages``  a run's files between members: a chunk of a file by digest, a slice of the initial weights
- ``framing``        one message on a stream: header, blobs, bounds checked before reading, deadlines
- ``rpc``            requests over hivemind P2P streams: admitted, bounded, paced, dispatched, counted
- ``quota``          each peer's share of the server: rates, in flight, bans; the byte budget; counters
- ``shaping``        the owner's caps on training traffic: token buckets up and down; bytes by method and day
- ``sizes``          the bytes of every message, as the planner and the simulator charge them
- ``codecs``         tensor frames in fp32, fp16, bf16 or int8, checked before use; error feedback
- ``routing``        which way a request goes: direct, or through an elected relay
- ``relay_modes``    the operator's choice of relaying (auto, always, never), without numpy
- ``emulated_delay`` a test-only latency shim for the calibration harness (this kernel has no netem)
"""

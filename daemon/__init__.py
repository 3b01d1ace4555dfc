"""swarmd: a peer-to-peer volunteer-computing daemon for training transformer models.

The process side lives here (import package ``swarmd``, folder ``daemon/``):

- ``cli``          the ``swarmd`` command: run, run create, status, peers, demo; signal handling
- ``config``       the TOML config file as per-section dataclasses
- ``node``         composes the services of one daemon and runs them on one asyncio loop
- ``state_dir``    what a daemon keeps on disk, and the lock that makes it one daemon's
- ``control``      the local control API: a Unix socket in the state directory
- ``lan_process``  LAN discovery (py-libp2p) in a child process, and the daemon's handle on it
- ``service``      systemd integration: sd_notify and the watchdog interval
- ``device``       what this machine has: CPU/GPU model, memory, measured throughput
- ``children``     ties child processes' lives to the daemon's
- ``local_swarm``  daemons as subprocesses on this machine (``swarmd demo``, integration tests)
- ``demo``         ``swarmd demo``: a local swarm on 127.0.0.1
- ``export``       ``swarmd export``: a run's stage weights as a from_pretrained folder
- ``training/``    the data path: cells, shard servers, the share ledger, replicas (docs/data-path.md)
- ``relay``        forwarding others' requests when elected a relay, and routing our own
- ``errors``       the one error hierarchy every package raises from

``swarmd.peers`` holds everything that talks to or reasons about other peers;
``swarmd.models`` what is trained. This file stays tiny: importing either subpackage runs it.
"""

__version__ = "0.1.0"

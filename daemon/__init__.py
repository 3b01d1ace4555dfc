"""swarmd: a peer-to-peer volunteer-computing daemon for training transformer models.

The process side lives here (import package ``swarmd``, folder ``daemon/``):

- ``cli/``       the ``swarmd`` command, one module per command, and the status view
- ``node/``      one daemon: the node that composes the services, coordination, the device, relaying
- ``training/``  the data path: cells, shard servers, the share ledger, replicas (docs/data-path.md)
- ``data/``      a run's files: tokenizer, data manifest, token shards, initial weights; found, fetched, served
- ``system/``    the process and its machine: systemd, the control socket, the state directory, children
- ``web/``       the opt-in dashboard and Prometheus metrics, on a loopback address
- ``config``     the TOML config file as per-section dataclasses
- ``errors``     the one error hierarchy every package raises from

``swarmd.peers`` holds everything that talks to or reasons about other peers;
``swarmd.models`` what is trained. This file stays tiny: importing either subpackage runs it.
"""

__version__ = "0.1.0"

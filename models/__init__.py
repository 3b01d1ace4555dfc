"""What is trained and how a stage computes (import package ``swarmd.models``).

- ``presets``  the run specs that ship with swarmd (``tiny-bytes``, the default run)

Nothing here imports ``swarmd.peers`` or the daemon's modules: a stage computes; it knows no
network.
"""

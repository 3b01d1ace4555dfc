"""The cell's side of training: one cell (pipeline p, stage s) at work (``swarmd.training.cells``).

Nothing here imports the shard server's side (``swarmd.training.shards``) or the trainer: a cell
reaches its shards over the wire, and its parts are given values and narrow handles.

- ``cell``           one cell at work: shares through the pipeline, tensors straight to its neighbours
- ``cell_facts``     what a cell's parts are built from: its facts, its view, narrow handles on it
- ``in_flight``      a cell's share in flight: its queued work, stage 0's window, how long shares take
- ``feeder``         stage 0's shares from the ledger: asked for, fed, given back when dropped
- ``neighbours``     a cell's tensors straight to its neighbours, tried again on a broken path
- ``rounds``         the end of a share at a cell and of its round: the contribution, the sync
- ``cell_stats``     a cell's counters and its entry in the status
- ``throttle``       [limits] cpu_share: each worker thread's duty cycle, and its torch threads
- ``puller``         a cell's weights: a whole pull, then committed deltas by long poll
- ``contributions``  a cell's one contribution per round, a slice per shard, kept until committed
"""

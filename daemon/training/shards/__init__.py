"""The shard server's side of training: slices of a stage's parameters served (``swarmd.training.shards``).

Nothing here imports the cell's side (``swarmd.training.cells``) or the trainer: a server hears
from cells over the wire, and its parts are given values, a pool view and narrow handles.

- ``opening``        a shard server opened on the newest state it may believe, replicated at its standby
- ``shard_sources``  where a shard's state comes from: replica, last holders, own file, seed; its geometry
- ``shard_server``   one slice of a stage's parameters served: contributions in, deltas out, steps logged
- ``contributors``   who may contribute to a shard, and which pipelines' ticketed shares
- ``standby_link``   a server's replication at its standby: steps logged, copies sent, a lagging view waited for
- ``give_backs``     whom a server told of the shares a dropped step gave back: once a sender and drop
- ``reducer``        a reduction group's head: members' slices summed, sent to the server once
- ``head_relay``     a reduction group's head: the deltas it pulled, relayed to the members' pulls
- ``ledger_host``    the share ledger, served by the holder of shard (0, 0), and its signed tickets
- ``replicas``       a standby's replicas of the shards it stands by for
- ``pool_view``      the pool as this peer last read it, as the shard side's parts see it
"""

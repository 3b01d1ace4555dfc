"""What each piece of the data path takes on given devices and links: shares and exchanges.

The pieces the throughput model (``swarmd.peers.planning.throughput``) composes, each over many
pipelines or cells at once, each priced with the same functions the daemon and the simulator
use (``swarmd.peers.taskpool.exchange``, ``swarmd.peers.wire.sizes``):

- ``Links``: the scenario's latencies, bandwidths and interface rates, and the bytes of a
  message in the codec each link calls for (``bytes_on``);
- ``PipelineTimes``: per pipeline, each stage's forward and backward seconds per micro-batch
  (a third and two thirds of its flops over the device's TFLOPS: a cell keeps its activations),
  each boundary's seconds for one activation (the slower direction: the gradient comes back the
  same way), the activation bytes each cell carries, and the stage-0 cell's round trip to the
  ledger at shard (0, 0), which it asks for every share once the last one drained;
- ``StageShards``: one stage's servers and the bytes of each shard's messages;
- ``cell_links`` and ``exchange``: a round's contributions and pulls for cells of one stage,
  each slice to its server or, where the stage reduces in groups
  (``swarmd.peers.taskpool.reduction``), to its group's head, who sends the sum on.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from swarmd.peers.planning.plan_cost import recompute_flops_per_sequence, stage_flops_per_sequence, stage_parameters
from swarmd.peers.planning.scenario import Scenario
from swarmd.peers.taskpool.exchange import shard_sizes, share_seconds
from swarmd.peers.wire.sizes import REQUEST_OVERHEAD_BYTES, SLOW_LINK_Bps, activation_elements, codec_for, message_bytes

KEEP_VERSIONS = 64
"""Deltas a shard server keeps for pulls (``swarmd.models.shard_config``'s default); a cell further
behind gets the whole slice."""


def bytes_on_links(kind: str, elements: int, bandwidth_Bps: np.ndarray, half: str, ndim: int = 1) -> np.ndarray:
    """``sizes.message_bytes`` of ``elements`` in the codec ``codec_for`` gives each link of
    ``bandwidth_Bps``: its rule (8-bit below ``SLOW_LINK_Bps``) over an array of links at once."""
    fast = message_bytes(elements, codec_for(kind, 0.0, half=half), ndim)
    slow = message_bytes(elements, codec_for(kind, SLOW_LINK_Bps / 2, half=half), ndim)
    return np.where((bandwidth_Bps > 0) & (bandwidth_Bps < SLOW_LINK_Bps), slow, fast).astype(float)


class Links:
    """The scenario's network as the data path uses it."""

    def __init__(self, scenario: Scenario, half: str = "fp16") -> None:
        self.latency, self.bandwidth = scenario.latency_s, scenario.bandwidth_Bps
        self.up_Bps, self.down_Bps = scenario.interface_Bps
        self.half = half
        m = scenario.model
        self.activation = activation_elements(scenario.micro_batch, m.seq_len, m.hidden)

    def activation_s(self, a: np.ndarray | int, b: np.ndarray | int) -> tuple[np.ndarray, np.ndarray]:
        """One activation from ``a`` to ``b`` (indices, as numpy pairs them): its seconds and bytes."""
        bw = self.bandwidth[a, b]
        nbytes = self.activation_bytes(bw)
        return self.latency[a, b] + nbytes / bw, nbytes

    def activation_bytes(self, bandwidth_Bps: np.ndarray) -> np.ndarray:
        """One activation's message on links of these rates."""
        return bytes_on_links("activation", self.activation, bandwidth_Bps, self.half, ndim=3)

    def activation_block(self, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """[i, j]: one activation's seconds from ``rows[i]`` to ``cols[j]``. Blocks, not the
        whole matrix: that is 800 MB at 10,000 devices."""
        return self.activation_s(*np.ix_(rows, cols))[0]

    def activation_symmetric(self, members: np.ndarray) -> np.ndarray:
        """Both directions summed among ``members``."""
        sub = self.activation_block(members, members)
        return sub + sub.T

    def round_trip_s(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """A small request from ``a`` to ``b`` and its answer."""
        there = self.latency[a, b] + REQUEST_OVERHEAD_BYTES / self.bandwidth[a, b]
        return there + self.latency[b, a] + REQUEST_OVERHEAD_BYTES / self.bandwidth[b, a]


class PipelineTimes(NamedTuple):
    forward_s: np.ndarray
    """[p, s]: stage s's forward of one micro-batch in pipeline p."""
    backward_s: np.ndarray
    send_s: np.ndarray
    """[p, b]: one activation across boundary b, the slower way."""
    carried: np.ndarray
    """[p, s]: activation bytes cell (p, s) sends, and receives, per micro-batch."""
    ledger_s: np.ndarray
    """[p]: the stage-0 cell's round trip to the ledger, once per share; it asks for the next
    share as one opens (``training.feeder``), so the trip costs only what it outlasts a share."""

    def share_s(self, share_micro_batches: int) -> np.ndarray:
        """Each pipeline's share, flush to flush, or the ledger's round trip for the next where that
        is longer (it is asked for as the share opens)."""
        return np.maximum(self.ledger_s, self.flush_s(share_micro_batches))

    def flush_s(self, share_micro_batches: int) -> np.ndarray:
        """Each pipeline's share, flush to flush (``exchange.share_seconds``)."""
        rows = zip(self.forward_s.tolist(), self.backward_s.tolist(), self.send_s.tolist(), strict=True)
        return np.array([share_seconds(f, b, e, share_micro_batches) for f, b, e in rows])

    def slowest_s(self) -> np.ndarray:
        """Each pipeline's slowest stage, forward and backward, per micro-batch."""
        return (self.forward_s + self.backward_s).max(axis=1)


def pipeline_times(
    scenario: Scenario,
    links: Links,
    rows: np.ndarray,
    layers: tuple[int, ...],
    ledger: int,
    checkpointing: tuple[bool, ...] = (),
) -> PipelineTimes:
    """``PipelineTimes`` of each row of ``rows`` (a pipeline's devices) with ``layers`` per stage
    (``checkpointing``: the stages whose backward runs their forward again) and the ledger at
    device ``ledger``."""
    flops = stage_flops_per_sequence(scenario, np.asarray(layers, dtype=float)) * scenario.micro_batch
    speed = scenario.device_arrays.tflops[rows] * 1e12
    step = flops[None, :] / speed
    again = recompute_flops_per_sequence(scenario, layers, checkpointing)[None, :] * scenario.micro_batch / speed
    a, b = rows[:, :-1], rows[:, 1:]
    there_s, there = links.activation_s(a, b)
    back_s, back = links.activation_s(b, a)
    carried = np.zeros(rows.shape)
    carried[:, :-1] += np.maximum(there, back)
    carried[:, 1:] += np.maximum(there, back)
    ledger_s = links.round_trip_s(rows[:, 0], np.full(len(rows), ledger))
    return PipelineTimes(step / 3.0, 2.0 * step / 3.0 + again, np.maximum(there_s, back_s), carried, ledger_s)


class StageShards(NamedTuple):
    """One stage's shard servers and each shard's messages' bytes."""

    servers: np.ndarray
    contribution_fast: np.ndarray
    contribution_slow: np.ndarray
    """A contribution slice on a link below ``SLOW_LINK_Bps`` (int8)."""
    delta: np.ndarray
    whole: np.ndarray
    group: int = 1
    """G: the pipelines that reduce together before the servers (1: none)."""


def stage_shards(
    scenario: Scenario,
    layers: tuple[int, ...],
    shard_servers: tuple[tuple[int, ...], ...],
    half: str = "fp16",
    groups: tuple[int, ...] = (),
) -> list[StageShards]:
    out = []
    for s, (params, servers) in enumerate(zip(stage_parameters(scenario, layers), shard_servers, strict=True)):
        sizes = shard_sizes(params, len(servers))

        def each(kind: str, bw: float, sizes: list[int] = sizes) -> np.ndarray:
            # (shard sizes differ by one at most: price each size once)
            priced = {e: message_bytes(e, codec_for(kind, bw, half=half)) for e in set(sizes)}
            return np.array([priced[e] for e in sizes], dtype=float)

        fast, slow = each("contribution", 0.0), each("contribution", SLOW_LINK_Bps / 2)
        group = groups[s] if s < len(groups) else 1
        out.append(
            StageShards(np.asarray(servers, dtype=int), fast, slow, each("delta", 0.0), each("weights", 0.0), group)
        )
    return out


class CellLinks(NamedTuple):
    """One stage's cells and their links to its shard servers, gathered once per grid: what
    does not change as the swarm's step rate settles."""

    cells: np.ndarray
    servers: np.ndarray
    sent: np.ndarray
    """[c, k]: contribution bytes the cell sends for shard k per round: its slice to its group's
    head, or (a head, or no group) to the server (0 where that is the cell itself)."""
    to_server: np.ndarray
    """[c, k]: of those, the bytes that reach shard k's server (a head's sum, a lone cell's slice)."""
    received: np.ndarray
    """[c]: the group's slices a head takes per round."""
    send_s: np.ndarray
    """[c]: the longest contribution link, latency included (to the head, then the head's on)."""
    latency_down: np.ndarray
    """[c, k]: from where the cell pulls shard k (its server, or its group's head for k)."""
    inverse_down: np.ndarray
    """[c, k]: 1 / bandwidth from there, 0 where that is the cell itself (nothing crosses)."""
    from_server: np.ndarray
    """[c, k]: 1 where the cell pulls shard k from its server, 0 from its group's head."""
    relays: np.ndarray
    """[c, k]: the members the cell passes shard k's deltas on to (a head's group less itself)."""
    head_rows: np.ndarray
    """[c, k]: the row (in ``cells``) of the cell's head for shard k (its own where it has none):
    a member's slice goes on only once its head has the group's, and its delta only once the
    head has it."""
    server_up: np.ndarray
    server_down: np.ndarray
    """[k]: shard k's server's interface rates."""
    delta: np.ndarray
    whole: np.ndarray
    up_Bps: np.ndarray
    down_Bps: np.ndarray
    refetch_s: np.ndarray
    """[c]: fetching the whole stage in fp32, as a spare taking the cell does."""


def cell_links(links: Links, cells: np.ndarray, stage: StageShards) -> CellLinks:
    """``cells`` (one stage's, in pipeline order: a stage reducing in groups groups them as the
    plan does, ``reduction.head_of``) and their links to the stage's servers and heads."""
    servers = stage.servers
    lat_up, bw_up = links.latency[np.ix_(cells, servers)], links.bandwidth[np.ix_(cells, servers)]
    lat_down, bw_down = links.latency[np.ix_(servers, cells)].T, links.bandwidth[np.ix_(servers, cells)].T
    local = servers[None, :] == cells[:, None]  # a cell's own shard stays local

    def slice_bytes(bw: np.ndarray) -> np.ndarray:
        slow = (bw > 0) & (bw < SLOW_LINK_Bps)
        return np.where(slow, stage.contribution_slow[None, :], stage.contribution_fast[None, :])

    to_server = np.where(local, 0.0, slice_bytes(bw_up))
    server_s = lat_up + to_server / bw_up
    n, shards = len(cells), len(servers)
    heads, members = _heads(n, shards, stage.group)
    received = np.zeros(n)
    send_s = server_s.max(axis=1)
    sent = to_server
    inverse_down = np.where(local, 0.0, 1.0 / bw_down)
    pull_lat, pull_inverse = lat_down, inverse_down
    from_server, relays = np.ones((n, shards)), np.zeros((n, shards))
    head_rows = np.repeat(np.arange(n)[:, None], shards, axis=1)
    if heads is not None:
        head_rows = heads
        head_cells = cells[heads]
        own = heads == np.arange(n)[:, None]
        hop_bw = np.where(own, np.inf, links.bandwidth[cells[:, None], head_cells])
        hop_lat = np.where(own, 0.0, links.latency[cells[:, None], head_cells])
        to_head = np.where(own, 0.0, slice_bytes(hop_bw))
        to_server = np.where(own, to_server, 0.0)  # only heads reach the servers
        sent = to_head + to_server
        # A head takes each other member's slice of every shard it heads (priced fast: the
        # members' links to it are mostly fast where a plan groups them).
        received = (np.where(own, members - 1, 0) * stage.contribution_fast[None, :]).sum(axis=1)
        send_s = (hop_lat + to_head / hop_bw).max(axis=1) + np.where(own, server_s, 0.0).max(axis=1)
        # The deltas come back the same way: a member pulls from its head, the head from the server.
        back_bw = links.bandwidth[head_cells, cells[:, None]]
        pull_lat = np.where(own, lat_down, links.latency[head_cells, cells[:, None]])
        pull_inverse = np.where(own, inverse_down, 1.0 / np.where(own, 1.0, back_bw))
        from_server = own.astype(float)
        relays = np.where(own, members - 1, 0).astype(float)
    up, down = links.up_Bps[cells], links.down_Bps[cells]
    whole = np.where(local, 0.0, stage.whole[None, :])
    refetch = np.maximum((lat_down + whole * inverse_down).max(axis=1), whole.sum(axis=1) / down)
    return CellLinks(
        cells,
        servers,
        sent,
        to_server,
        received,
        send_s,
        pull_lat,
        pull_inverse,
        from_server,
        relays,
        head_rows,
        links.up_Bps[servers],
        links.down_Bps[servers],
        np.where(local, 0.0, stage.delta[None, :]),
        whole,
        up,
        down,
        refetch,
    )


def _heads(n: int, shards: int, group: int) -> tuple[np.ndarray | None, np.ndarray]:
    """[c, k]: the row of cell c's head for shard k (None: no groups), and [c, 1]: the size of
    c's group; ``reduction.head_of`` over whole arrays."""
    row = np.arange(n)
    first = (row // max(1, group)) * max(1, group)
    size = np.minimum(max(1, group), n - first)[:, None]
    if group < 2 or n < 2:
        return None, size
    heads = first[:, None] + np.arange(shards)[None, :] % size
    return np.where(size >= 2, heads, row[:, None]), size


class Exchange(NamedTuple):
    seconds: np.ndarray
    """[c]: the round's exchange: the longest shard link either way, or all of it through the
    cell's interface (its contributions, pulls and activations)."""
    sent: np.ndarray
    """[c, k]: contribution bytes the cell sends for shard k per round."""
    to_server: np.ndarray
    """[c, k]: of those, the bytes that reach shard k's server."""
    received: np.ndarray
    """[c]: the group's slices the cell takes as a head per round."""
    relayed: np.ndarray
    """[c]: the deltas the cell passes on to its group's members per round (a head)."""
    pulled: np.ndarray
    """[c, k]: delta (or whole slice) bytes from shard k per round."""


def exchange(cl: CellLinks, deltas: np.ndarray, carried: np.ndarray, sequential: bool = False) -> Exchange:
    """A round's exchange for the cells of ``cl`` that pull ``deltas`` steps each and carry
    ``carried`` activation bytes each way in the round: a delta per step, the whole slice in
    fp32 past ``KEEP_VERSIONS`` (``docs/data-path.md``).

    ``sequential`` (gradient mode): the deltas come only after the step the contributions went
    into, so the round's exchange is the contributions' time and then the pulls' (each the
    longest link, or its bytes through the interface; the activations ran during the share).
    Otherwise (local steps) the next round computes meanwhile and everything overlaps: the
    longest link either way, or all of the round's bytes through the interface."""
    behind = deltas[:, None]
    pulled = np.where(behind <= KEEP_VERSIONS, behind * cl.delta, cl.whole)
    pull_s = (cl.latency_down + pulled * cl.inverse_down).max(axis=1)
    relayed = (cl.relays * behind * cl.delta).sum(axis=1)
    if sequential:
        # Every contribution of the round reaches its server before the step, and every pull
        # leaves it after: a shard's server takes them all in one burst each way. In a group,
        # the sums go once the heads have every member's slice, and a member's delta comes once
        # its head has passed it on: one more hop each way, after (or before) the server's.
        burst_in = (cl.to_server.sum(axis=0) / cl.server_down).max()
        burst_out = ((pulled * cl.from_server).sum(axis=0) / cl.server_up).max()
        gather, spread = cl.received / cl.down_Bps, relayed / cl.up_Bps
        send = np.maximum(np.maximum(cl.send_s, cl.sent.sum(axis=1) / cl.up_Bps), burst_in)
        back = np.maximum(np.maximum(pull_s, pulled.sum(axis=1) / cl.down_Bps), burst_out)
        send = send + gather[cl.head_rows].max(axis=1)
        back = back + spread[cl.head_rows].max(axis=1)
        return Exchange(send + back, cl.sent, cl.to_server, cl.received, relayed, pulled)
    each = np.maximum(cl.send_s, pull_s)
    through = np.maximum(
        (cl.sent.sum(axis=1) + relayed + carried) / cl.up_Bps,
        (pulled.sum(axis=1) + cl.received + carried) / cl.down_Bps,
    )
    seconds = np.maximum(each, through)
    return Exchange(
        np.maximum(seconds, seconds[cl.head_rows].max(axis=1)), cl.sent, cl.to_server, cl.received, relayed, pulled
    )

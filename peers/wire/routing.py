"""Which way a request goes: straight to its peer, or through an elected relay.

A cell's requests carry tensors to its neighbours and to the shard servers. The direct path is the default;
a relay (elected among reliable, well-connected peers and named in the plan) is taken when

- the direct path does not open: the peer cannot be reached from here (a firewall, a NAT
  the libp2p daemon could not get through), remembered with a growing back-off so that every
  request does not first wait for a failing dial; or
- the measured matrix says the relay path is clearly faster: both hops' latency plus the
  bytes over the slower hop beats the direct link by ``RELAY_GAIN`` (forwarding is
  store-and-forward per message, so the slower hop carries all of it). Only for requests
  that ask it (``for_speed``: a pipeline link's activations and gradients, for which the plan
  elects its relays); the exchange goes direct while the direct path opens, since every
  cell's contributions to every shard, sent through the few relays because each looked
  faster on its own, make the relays' links the swarm's bottleneck (measured in the
  simulator, 1.3B on 1,000 devices: 64% of contributions relayed, their 90th percentile 51 s
  against 18 s direct, and 359k against 644k trained tokens/s); or
- the operator asked for it (``[swarm] data_via_relay = "always"``), as for a peer whose
  outbound connections are filtered.

Pure functions and a small bookkeeping class, no network: the trainer (``swarmd.trainer``)
applies them per request.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from swarmd.peers.wire.relay_modes import MODES

RELAY_GAIN = 0.8
"""A relay path is taken for speed only when it takes at most this fraction of the direct
path's time: measurements are noisy and a hop costs a relay's bandwidth."""
BLOCKED_FIRST_S = 15.0
BLOCKED_MAX_S = 300.0


@dataclass(frozen=True)
class Matrix:
    """The live latency and bandwidth matrix (``swarmd.peers.planning.snapshot``), by peer ID."""

    index: Mapping[str, int]
    latency_s: np.ndarray
    bandwidth_Bps: np.ndarray

    def transfer_s(self, a: str, b: str, nbytes: float) -> float | None:
        i, j = self.index.get(a), self.index.get(b)
        if i is None or j is None:
            return None
        return float(self.latency_s[i, j] + nbytes / self.bandwidth_Bps[i, j])

    def via_s(self, a: str, relay: str, b: str, nbytes: float) -> float | None:
        i, r, j = self.index.get(a), self.index.get(relay), self.index.get(b)
        if i is None or r is None or j is None:
            return None
        slower = min(self.bandwidth_Bps[i, r], self.bandwidth_Bps[r, j])
        return float(self.latency_s[i, r] + self.latency_s[r, j] + nbytes / slower)


def choose_route(
    own: str,
    dst: str,
    relays: Sequence[str],
    matrix: Matrix | None,
    nbytes: float,
    *,
    direct_blocked: bool,
    mode: str = "auto",
    for_speed: bool = True,
) -> str | None:
    """The relay to send through, or None for the direct path (module doc). With the direct
    path blocked and no usable relay, None too: trying direct is all that is left.
    ``for_speed`` False: a relay only when the direct path is blocked (or ``mode`` says always)."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not one of {', '.join(MODES)}")
    usable = [r for r in dict.fromkeys(relays) if r not in (own, dst)]
    if not usable or mode == "never" or dst == own:
        return None
    if not (for_speed or direct_blocked or mode == "always"):
        return None
    timed = [(matrix.via_s(own, r, dst, nbytes), r) if matrix is not None else (None, r) for r in usable]
    # Unmeasured paths rank after measured ones, in the plan's order (its best relay first).
    ranked = sorted(timed, key=lambda t: (t[0] is None, t[0] if t[0] is not None else 0.0))
    best_time, best = ranked[0]
    if direct_blocked or mode == "always":
        return best
    direct = matrix.transfer_s(own, dst, nbytes) if matrix is not None else None
    if best_time is None or direct is None or not math.isfinite(direct):
        return None
    return best if best_time <= RELAY_GAIN * direct else None


@dataclass
class DirectPaths:
    """Peers whose direct path failed to open, each blocked until a time that doubles with
    every further failure (``BLOCKED_FIRST_S`` up to ``BLOCKED_MAX_S``); a success clears it.
    Bounded: at most ``max_peers`` are remembered (the oldest entries go first)."""

    max_peers: int = 1024
    _blocked: dict[str, tuple[float, float]] = field(default_factory=dict)  # peer -> (until, last wait)

    def blocked(self, peer: str, now: float) -> bool:
        entry = self._blocked.get(peer)
        return entry is not None and now < entry[0]

    def failed(self, peer: str, now: float) -> float:
        """Record a failed dial; returns how long the direct path is now avoided."""
        last = self._blocked.pop(peer, (0.0, 0.0))[1]
        wait = BLOCKED_FIRST_S if last == 0.0 else min(BLOCKED_MAX_S, 2.0 * last)
        self._blocked[peer] = (now + wait, wait)
        while len(self._blocked) > self.max_peers:
            self._blocked.pop(next(iter(self._blocked)))
        return wait

    def succeeded(self, peer: str) -> None:
        self._blocked.pop(peer, None)

    def count(self, now: float) -> int:
        return sum(1 for until, _ in self._blocked.values() if now < until)

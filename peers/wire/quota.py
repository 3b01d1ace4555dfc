"""Each peer's share of this peer's request server: quotas, bans, the memory budget, offenders.

Pure bookkeeping over an injected clock (``now`` in seconds); ``swarmd.peers.wire.rpc`` asks
it at each step of a request and sleeps, refuses or closes as it says.

- ``PeerQuotas``: per speaker, requests in flight (checked when the stream opens, before
  anything is read), requests per second and bytes per second (token buckets). A peer past a
  bucket is first **slowed** (told to wait until its tokens are back, at most ``max_delay_s``),
  then **refused** ``QUOTA``; every protocol-level refusal is a **strike**, and a peer whose
  strikes outrun their decay is **banned**: its streams are closed unread until the ban
  expires, each ban of the same peer twice as long as the last (up to ``max_ban_s``).
- ``ByteBudget``: what all requests being read or handled may hold together, reserved from each
  blob's declared length before a byte of it is read; one peer may hold at most a share of it.
- ``RpcCounters``: what the server did, shown by ``swarmd status``: refusals by code, and by
  peer for the top offenders (``count_offence``: a bounded table), bans, slowed requests.

How the defaults are sized (``QuotaLimits``): every data-path message is at most the server's
limit (``rpc.DEFAULT_MAX_MESSAGE_BYTES``, 256 MiB: a shard's checkpoint, the largest honest
request, must fit in it), so the byte bucket holds two of them (a replica's checkpoint and the
log after it pass unslowed) and refills at 256 MiB/s, about 2 Gbit/s: more than any volunteer's
WAN link or a 1 GbE LAN carries, so a stage's tensors at full speed are never slowed. The
request bucket (200/s, bursts of 400) is far above what a peer's cells send one peer (a
forward or backward per micro-batch, one long poll per shard, a contribution per round). The
budget is four of the largest messages (1 GiB), and one peer may hold half of it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from swarmd.peers.wire.errors import Busy, Code, OverQuota

MiB = 1024 * 1024

STRIKES: dict[Code, float] = {
    Code.TIMEOUT: 1.0,
    Code.TOO_LARGE: 1.0,
    Code.BAD_REQUEST: 1.0,
    Code.QUOTA: 1.0,
    Code.NOT_MEMBER: 0.25,
    Code.WRONG_RUN: 0.25,
}
"""What a refusal costs its peer toward a ban. Only the sender's own faults count: never a
refusal that churn causes (NOT_HOLDER, EPOCH, STALE, BUSY...). A newcomer not yet seen in the
membership scan is refused NOT_MEMBER a few times before it is, so that costs a quarter."""


@dataclass(frozen=True, kw_only=True)
class QuotaLimits:
    """What one peer may ask of this peer's request server (module doc: how they are sized)."""

    max_in_flight: int = 8
    """Requests of one speaker served at once; more are refused QUOTA when their stream opens."""
    requests_per_s: float = 200.0
    """Requests one peer may make per second, sustained."""
    request_burst: float = 400.0
    """Requests it may make at once after a quiet spell."""
    bytes_per_s: float = 256.0 * MiB
    """Request bytes one peer may send per second, sustained."""
    byte_burst: float = 512.0 * MiB
    """Bytes it may send at once: at least the largest message, or that message is always slowed."""
    max_delay_s: float = 2.0
    """The longest a peer over a bucket is slowed; past this it is refused QUOTA."""
    ban_after: float = 32.0
    """Strikes (``STRIKES``) that ban a peer, net of their decay."""
    strike_decay_per_s: float = 0.2
    """Strikes forgiven per second."""
    ban_s: float = 60.0
    """The first ban's length; each later ban of the same peer doubles it."""
    max_ban_s: float = 900.0
    max_peers: int = 4096
    """Peers tracked; past this, the longest idle with nothing in flight is forgotten."""

    def __post_init__(self) -> None:
        for name in ("max_in_flight", "max_peers"):
            if getattr(self, name) < 1:
                raise ValueError(f"QuotaLimits.{name} = {getattr(self, name)} must be at least 1")
        for name in ("requests_per_s", "request_burst", "bytes_per_s", "byte_burst", "ban_after", "ban_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"QuotaLimits.{name} = {value} must be a finite number above 0")
        if not 0 <= self.max_delay_s <= 60 or not self.strike_decay_per_s >= 0:
            raise ValueError(
                f"QuotaLimits: max_delay_s = {self.max_delay_s} must be in [0, 60] and strike_decay_per_s = "
                f"{self.strike_decay_per_s} at least 0"
            )
        if self.max_ban_s < self.ban_s:
            raise ValueError(f"QuotaLimits.max_ban_s = {self.max_ban_s} is below ban_s = {self.ban_s}")


@dataclass
class TokenBucket:
    """Tokens refill at ``rate`` per second up to ``burst``; a taker may run into debt, which the
    next taker waits out (so a peer slowed once stays slowed while it keeps asking)."""

    rate: float
    burst: float
    tokens: float
    stamp: float

    def _refill(self, now: float) -> None:
        if now > self.stamp:
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now

    def wait_s(self, amount: float, now: float) -> float:
        """How long a taker of ``amount`` must wait for it (an amount over the burst waits for a
        full bucket, never forever)."""
        self._refill(now)
        return max(0.0, (min(amount, self.burst) - self.tokens) / self.rate)

    def take(self, amount: float, now: float) -> None:
        self._refill(now)
        self.tokens -= amount


@dataclass
class _Peer:
    requests: TokenBucket
    bytes: TokenBucket
    seen_at: float
    in_flight: int = 0
    strikes: float = 0.0
    struck_at: float = 0.0
    banned_until: float = 0.0
    bans: int = 0


class PeerQuotas:
    """Per-peer quotas and bans (module doc). Every call takes the current time."""

    def __init__(self, limits: QuotaLimits | None = None) -> None:
        self.limits = limits or QuotaLimits()
        self._peers: dict[str, _Peer] = {}

    def _peer(self, peer: str, now: float) -> _Peer:
        state = self._peers.pop(peer, None)  # popped and put back: the dict stays in order of use
        if state is None:
            lim = self.limits
            state = _Peer(
                requests=TokenBucket(lim.requests_per_s, lim.request_burst, lim.request_burst, now),
                bytes=TokenBucket(lim.bytes_per_s, lim.byte_burst, lim.byte_burst, now),
                seen_at=now,
            )
            if len(self._peers) >= lim.max_peers:
                self._forget_one(now)
        state.seen_at = now
        self._peers[peer] = state
        return state

    def _forget_one(self, now: float) -> None:
        """Forget the least recently seen peer with nothing in flight and no ban in force (the
        table is larger than the server's slots, so one is always found before a banned one)."""
        idle = [p for p, s in self._peers.items() if not s.in_flight]
        free = [p for p in idle if self._peers[p].banned_until <= now]
        for candidates in (free, idle):
            if candidates:
                del self._peers[candidates[0]]
                return

    def banned_s(self, peer: str, now: float) -> float:
        """Seconds left of ``peer``'s ban (0: not banned)."""
        state = self._peers.get(peer)
        return 0.0 if state is None else max(0.0, state.banned_until - now)

    def open(self, peer: str, now: float) -> None:
        """A request of ``peer`` starts (its stream opened): refused QUOTA past its in-flight share."""
        state = self._peer(peer, now)
        if state.in_flight >= self.limits.max_in_flight:
            raise OverQuota(f"{self.limits.max_in_flight} requests of yours in flight here; wait for their answers")
        state.in_flight += 1

    def in_flight(self, peer: str) -> int:
        state = self._peers.get(peer)
        return 0 if state is None else state.in_flight

    def close(self, peer: str) -> None:
        state = self._peers.get(peer)
        if state is not None and state.in_flight:
            state.in_flight -= 1

    def request(self, peer: str, now: float) -> float:
        """Charge one request; returns how long to slow it, or raises OverQuota."""
        lim = self.limits
        return self._charge(self._peer(peer, now).requests, 1.0, now, f"{lim.requests_per_s:g} requests per second")

    def transfer(self, peer: str, nbytes: int, now: float) -> float:
        """Charge ``nbytes`` about to be read; returns how long to slow them, or raises OverQuota."""
        bucket, rate = self._peer(peer, now).bytes, self.limits.bytes_per_s / MiB
        return self._charge(bucket, float(nbytes), now, f"{rate:g} MiB per second")

    def _charge(self, bucket: TokenBucket, amount: float, now: float, quota: str) -> float:
        wait_s = bucket.wait_s(amount, now)
        if wait_s > self.limits.max_delay_s:
            raise OverQuota(f"over your quota of {quota} here by {wait_s:.1f} s of it; slow down")
        bucket.take(amount, now)
        return wait_s

    def strike(self, peer: str, code: Code, now: float) -> float:
        """Count a refusal against ``peer``; returns the ban it earned in seconds (0: none)."""
        weight = STRIKES.get(code, 0.0)
        if not weight:
            return 0.0
        lim, state = self.limits, self._peer(peer, now)
        forgiven = max(0.0, now - state.struck_at) * lim.strike_decay_per_s
        state.strikes, state.struck_at = max(0.0, state.strikes - forgiven) + weight, now
        if state.strikes < lim.ban_after or state.banned_until > now:
            return 0.0
        ban_s = min(lim.max_ban_s, lim.ban_s * 2.0**state.bans)
        state.banned_until, state.strikes = now + ban_s, 0.0
        state.bans += 1
        return ban_s

    def banned(self, now: float) -> dict[str, float]:
        """The peers banned now, and the seconds left of each ban."""
        return {p: round(s.banned_until - now, 1) for p, s in self._peers.items() if s.banned_until > now}


@dataclass
class ByteBudget:
    """What the requests being read or handled may hold together, in bytes (module doc)."""

    total: int = 1024 * MiB
    per_peer: int = 512 * MiB
    """The most one peer may hold: at least the largest message, and less than ``total``."""
    held: int = 0
    _by_peer: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0 < self.per_peer <= self.total:
            raise ValueError(f"ByteBudget: per_peer = {self.per_peer} must be in (0, total = {self.total}]")

    def reserve(self, peer: str, nbytes: int) -> None:
        """Reserve ``nbytes`` for ``peer`` before they are read; raises Busy when they do not fit."""
        mine = self._by_peer.get(peer, 0)
        if mine + nbytes > self.per_peer:
            raise Busy(
                f"your requests in flight here would hold {mine + nbytes} bytes, over your share of "
                f"{self.per_peer}; wait for their answers"
            )
        if self.held + nbytes > self.total:
            raise Busy(f"{self.held} bytes of requests are held here (limit {self.total}); retry later")
        self.held += nbytes
        self._by_peer[peer] = mine + nbytes

    def release(self, peer: str, nbytes: int) -> None:
        mine = self._by_peer.get(peer, 0) - nbytes
        self.held -= nbytes
        if mine > 0:
            self._by_peer[peer] = mine
        else:
            self._by_peer.pop(peer, None)


TOP_OFFENDERS = 32


def count_offence(table: dict[str, dict[str, int]], peer: str, code: Code, limit: int = TOP_OFFENDERS) -> None:
    """Count a refusal of ``peer`` in ``table`` (peer -> code -> count), which keeps at most
    ``limit`` peers: a newcomer to a full table replaces the one with the fewest refusals (a
    flood of fresh keys churns the bottom, never the top offenders)."""
    counts = table.get(peer)
    if counts is None:
        if len(table) >= limit:
            del table[min(table, key=lambda p: sum(table[p].values()))]
        counts = table[peer] = {}
    counts[code.value] = counts.get(code.value, 0) + 1


@dataclass
class RpcCounters:
    requests: int = 0
    answered: int = 0
    refused: dict[str, int] = field(default_factory=dict)
    """Refusals by code (``Code``): malformed, oversized and slow requests, unknown methods,
    non-members, quotas, and what the handlers refused."""
    offenders: dict[str, dict[str, int]] = field(default_factory=dict)
    """Refusals by peer and code, for the top offenders (at most ``quota.TOP_OFFENDERS`` peers)."""
    slowed: int = 0
    """Requests held back by their peer's rate quota (then served)."""
    ignored: int = 0
    """Streams of banned peers, closed unread and unanswered."""
    banned: dict[str, float] = field(default_factory=dict)
    """Peers banned lately: when each ban ends (Unix time)."""
    bytes_in: int = 0
    """Bytes of the requests' blobs and framing (their JSON headers left out)."""
    bytes_out: int = 0
    """Bytes of the answers sent, headers included."""

    def refuse(self, code: Code, peer: str) -> None:
        self.refused[code.value] = self.refused.get(code.value, 0) + 1
        count_offence(self.offenders, peer, code)

    def ban(self, peer: str, until: float) -> None:
        now = time.time()
        for old in [p for p, t in self.banned.items() if t <= now]:
            del self.banned[old]
        self.banned.pop(peer, None)
        self.banned[peer] = round(until, 1)
        while len(self.banned) > TOP_OFFENDERS:
            del self.banned[next(iter(self.banned))]

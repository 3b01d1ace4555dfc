"""Whom this daemon's request server serves.

The run's live members, and strangers only for the reads the run spec opens to them.

The server (``swarmd.peers.wire.rpc``) asks twice, both before a byte of a request's blobs is
read: when a stream opens, whether its speaker is a member (a member's slot, else one of the
few slots strangers share); once the header is read, whether the speaker may make that kind of
request. A member is a peer whose signed heartbeat was live in the run at the last membership
scan (the set the relay and the training handlers trust too; a private run's allowlist or join
token is checked where heartbeats become members), or this peer itself. A stranger may only
pull a shard's weights (``Pull``: "read a checkpoint"), and only when the run spec's
``checkpoint_access`` is ``public``: an open run's by default, a private run's (allowlist or
join token) only when its creator signed ``checkpoints = "public"``
(``swarmd.peers.records.run_spec.default_checkpoint_access``). Any other request of a stranger
(a reduction head's pull, a replica, a data file or a chunk of the initial weights, work,
probes, relaying) is refused NOT_MEMBER, in every run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from swarmd.peers.records.run_spec import CHECKPOINT_ACCESS
from swarmd.peers.wire.errors import NotMember
from swarmd.peers.wire.messages import Pull
from swarmd.peers.wire.protocol import Request

PUBLIC_READS: frozenset[type[Request[Any]]] = frozenset({Pull})
"""What a stranger may ask of a run whose checkpoints are public: a shard's weights, read only.
Not a reduction head's pull (``PullFromHead``, for its group's members), nor a standby's replica
(``ReplicaFetch``: optimizer state and the ledger, a server's business)."""


class RunAdmission:
    """The daemon's ``rpc.Admit`` (module doc)."""

    def __init__(self, own: str, is_member: Callable[[str], bool], checkpoint_access: str) -> None:
        """``own``: this peer's ID; ``is_member``: whether a peer was live at the last scan;
        ``checkpoint_access``: the run spec's, one of ``CHECKPOINT_ACCESS``."""
        if checkpoint_access not in CHECKPOINT_ACCESS:
            raise ValueError(f"checkpoint access {checkpoint_access!r} is not one of {', '.join(CHECKPOINT_ACCESS)}")
        self.own, self.is_member, self.checkpoint_access = own, is_member, checkpoint_access
        self.public = PUBLIC_READS if checkpoint_access == "public" else frozenset()

    def member(self, peer: str) -> bool:
        return peer == self.own or self.is_member(peer)

    def check(self, peer: str, request_type: type[Request[Any]]) -> None:
        if request_type in self.public or self.member(peer):
            return
        opened = f"; strangers may make only {sorted(r.METHOD for r in self.public)}" if self.public else ""
        raise NotMember(
            f"{peer[:16]}... is not a live member of this run (no live heartbeat at the last scan), so it may not "
            f"make {request_type.METHOD}{opened}; join the run first"
        )

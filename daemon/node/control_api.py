"""What the node answers its owner on the control socket (``swarmd status``, ``peers``, ``export``).

The socket (``swarmd.system.control``) serves these handlers from its own thread; they only
read the node's parts, each of which reports itself (``status()``), and assemble the answer.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Protocol

from swarmd import __version__
from swarmd.errors import SwarmdError
from swarmd.node.coordination import Coordination
from swarmd.node.dial_back import DialBackService
from swarmd.node.limits.live import LiveLimits, Reloads
from swarmd.node.limits.pausing import MAX_PAUSE_S, Pausing
from swarmd.node.presence import Presence
from swarmd.node.relay import RelayService, Router
from swarmd.peers.records.identity import Identity
from swarmd.peers.records.run_spec import SignedRunSpec
from swarmd.peers.wire.rpc import RpcServer
from swarmd.peers.wire.shaping import TRAFFIC
from swarmd.system.control import Handler

if TYPE_CHECKING:
    from swarmd.data.run_files import RunFiles
    from swarmd.training.trainer import Trainer
    from swarmd.web.server import DashboardServer


class NodeParts(Protocol):
    """The parts of a node (``swarmd.node.node.Node``) the control API reads; None until started."""

    @property
    def run_id(self) -> str: ...

    @property
    def state(self) -> str: ...

    @property
    def identity(self) -> Identity | None: ...

    @property
    def spec(self) -> SignedRunSpec | None: ...

    @property
    def presence(self) -> Presence | None: ...

    @property
    def trainer(self) -> Trainer | None: ...

    @property
    def files(self) -> RunFiles | None: ...

    @property
    def coordination(self) -> Coordination | None: ...

    @property
    def relay(self) -> RelayService | None: ...

    @property
    def router(self) -> Router | None: ...

    @property
    def rpc(self) -> RpcServer | None: ...

    @property
    def pausing(self) -> Pausing: ...

    @property
    def limits(self) -> LiveLimits: ...

    @property
    def reloads(self) -> Reloads: ...

    @property
    def dashboard(self) -> DashboardServer: ...

    @property
    def dial_back(self) -> DialBackService | None: ...


class ControlApi:
    def __init__(self, node: NodeParts) -> None:
        self.node = node

    def handlers(self) -> dict[str, Handler]:
        return {
            "status": self.status,
            "peers": self.peers,
            "gather_weights": self.gather_weights,
            "pause": self.pause,
            "resume": self.resume,
            "reload": self.reload,
            "dial_back": self.dial_back,
        }

    ARGUMENTS = {"pause": {"for_s": float}}
    """The commands' arguments and their types (the socket checks them before a handler runs)."""

    async def reload(self, request: dict[str, Any]) -> dict[str, Any]:
        """``swarmd config reload`` (and ``set``): re-read the config; ``[limits]`` applies at once.
        A config that fails to load is the owner's to fix, not a daemon failure: it is answered."""
        try:
            return await self.node.reloads.reload()
        except SwarmdError as e:
            return {"refused": str(e)}

    async def pause(self, request: dict[str, Any]) -> dict[str, Any]:
        """``swarmd pause [--for D]``: hand the work back, for ``for_s`` seconds or until resumed."""
        for_s = request.get("for_s")
        if for_s is not None and not 0 < for_s <= MAX_PAUSE_S:
            raise SwarmdError(f"pause for {for_s} s: give more than 0 and at most {MAX_PAUSE_S:.0f} s")
        return {"paused": await self.node.pausing.owner_pauses(for_s)}

    async def resume(self, request: dict[str, Any]) -> dict[str, Any]:
        return {"paused": None, "waived": await self.node.pausing.owner_resumes()}

    async def dial_back(self, request: dict[str, Any]) -> dict[str, Any]:
        """``swarmd doctor``: a few members (the longest seen first) dial this daemon back."""
        node = self.node
        if node.dial_back is None or node.presence is None:
            raise SwarmdError(f"the daemon is {node.state}: its request server is not up yet; try again shortly")
        peers = sorted(node.presence.membership.snapshot(time.time()), key=lambda p: -float(p["seen_for_s"]))
        own = node.identity.peer_id if node.identity else None
        asked = [str(p["peer_id"]) for p in peers if p["peer_id"] != own]
        return {"addrs": list(node.presence.addrs), "answers": await node.dial_back.ask(asked)}

    def status(self, request: dict[str, Any]) -> dict[str, Any]:
        node, now = self.node, time.time()
        # The socket opens only once the node knows its identity and has a presence.
        assert node.presence is not None
        spec = node.spec.spec if node.spec is not None else None
        return {
            "peer_id": node.identity.peer_id if node.identity else None,
            "version": __version__,
            "state": node.state,
            "paused": node.pausing.status(),
            "pid": os.getpid(),
            "dashboard": node.dashboard.url,
            "run_id": node.run_id,
            "run": None
            if spec is None
            else {
                "name": spec.name,
                "model": spec.model.family,
                "layers": spec.model.layers,
                "hidden": spec.model.hidden,
                "stages": spec.stages,
                "creator": node.spec.creator if node.spec else None,
                "access": spec.access_summary(),
            },
            **node.presence.status(now),
            "training": node.trainer.status() if node.trainer is not None else None,
            "data": node.files.status() if node.files is not None else None,
            "swarm": node.coordination.status() if node.coordination is not None else None,
            "relaying": node.relay.status() if node.relay is not None else None,
            "routes": node.router.status() if node.router is not None else None,
            "rpc": None if node.rpc is None else asdict(node.rpc.counters),
            "traffic": TRAFFIC.status(),
            "limits": node.limits.status(),
        }

    async def gather_weights(self, request: dict[str, Any]) -> dict[str, Any]:
        """For ``swarmd export``: every stage's weights from its shards, written to our state directory."""
        if self.node.trainer is None:
            raise SwarmdError("this daemon does not train; export from the state directory as it is")
        return {"run_id": self.node.run_id, **await self.node.trainer.gather_weights()}

    def peers(self, request: dict[str, Any]) -> dict[str, Any]:
        presence = self.node.presence
        return {"run_id": self.node.run_id, "peers": presence.membership.snapshot(time.time()) if presence else []}

"""One daemon: joins a run's swarm, keeps its membership fresh, and answers its owner.

``Node`` is the composition root: it makes the services and wires them together, and each
service is a module of its own (``swarmd.node`` maps them). The services run as periodic tasks
on one asyncio loop (``swarmd.node.services``); the hivemind DHT has its own process, and
py-libp2p (LAN discovery) a child process of its own. Nothing here blocks the loop: DHT calls
return futures with deadlines (written to its pipe by a thread of their own), torch work runs in
a worker thread. A service whose round fails (a DHT hiccup) retries with capped backoff; a DHT
process that dies is restarted (``swarmd.node.dht_watch``), and only one that keeps dying stops
the daemon, so that the service manager restarts it. Shutdown is bounded by ``[node] stop_timeout_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from swarmd.config import Config
from swarmd.errors import SwarmdError
from swarmd.node.control_api import ControlApi
from swarmd.node.coordination import Coordination
from swarmd.node.dht_watch import DhtWatch
from swarmd.node.dial_back import DialBackService
from swarmd.node.joining import Joining
from swarmd.node.lan_service import LanService
from swarmd.node.limits.auto_pause import limits_reason
from swarmd.node.limits.live import LiveLimits, Reloads
from swarmd.node.limits.pausing import Pausing
from swarmd.node.limits.traffic import SAVE_EVERY_S, TrafficDay
from swarmd.node.measurements import Measurements
from swarmd.node.presence import MEMBERSHIP_SCAN_S, Presence
from swarmd.node.relay import RelayService, Router
from swarmd.node.request_gate import RunAdmission
from swarmd.node.services import Services, dht_call
from swarmd.peers.dht.swarm_dht import SPEC_TTL_S, SwarmDHT
from swarmd.peers.membership.election import ElectionConfig, coordination_round_s
from swarmd.peers.membership.members import Membership
from swarmd.peers.membership.probation import probation_s
from swarmd.peers.records.identity import Identity, load_or_create_identity, write_p2pd_identity
from swarmd.peers.records.links import ProbeBudget
from swarmd.peers.records.run_id import check_run_id
from swarmd.peers.records.run_spec import SignedRunSpec
from swarmd.peers.wire.messages import DialBack, Forward, Probe
from swarmd.peers.wire.rpc import RpcServer
from swarmd.system import systemd
from swarmd.system.children import LivenessPipe
from swarmd.system.control import SOCKET_FILENAME, ControlServer
from swarmd.system.state_dir import StateDirLock, prepare_state_dir, run_checkpoint_dir
from swarmd.web.server import DashboardServer

if TYPE_CHECKING:
    from swarmd.data.fetching import Send
    from swarmd.data.run_files import RunFiles
    from swarmd.training.trainer import Trainer

logger = logging.getLogger(__name__)

TRAINER_STOP_TIMEOUT_S = 25.0
TRAINER_TICK_S = 1.0
PROBE_ROUND_S = 5.0
PUBLISH_MEASUREMENTS_S = 15.0
PAUSE_CHECK_S = 1.0
LIMITS_CHECK_S = 10.0


def make_coordination(
    config: Config,
    run_id: str,
    identity: Identity,
    dht: SwarmDHT,
    state_dir: Path,
    presence: Presence,
    spec: SignedRunSpec,
) -> tuple[Measurements, Coordination]:
    """The node's measurements of the swarm, and its coordination (elections, the plan), by
    ``[probes]`` and ``[roles]``."""
    probes, roles = config.probes, config.roles
    budget = ProbeBudget(
        interval_s=probes.interval_s,
        bytes_per_hour=probes.bytes_per_hour,
        probe_bytes=probes.probe_bytes,
        max_peers=probes.max_peers,
    )
    thresholds = ElectionConfig(
        min_reliability=roles.min_reliability,
        min_relay_reliability=roles.min_relay_reliability,
        min_connectivity_Bps=roles.min_connectivity_Bps,
        hysteresis=roles.hysteresis,
    )
    scan_s = min(config.heartbeat.interval_s, MEMBERSHIP_SCAN_S)
    offer = presence.offer
    measurements = Measurements(run_id, identity, dht, state_dir, budget, offer, scan_s)
    probation = probation_s(config.heartbeat.interval_s)
    return measurements, Coordination(spec, identity, dht, measurements, thresholds, offer, probation)


def run_files(
    config: Config, state_dir: Path, spec: SignedRunSpec, send: Send, membership: Membership, measurements: Measurements
) -> RunFiles:
    """This node's store of the run's files, asking the members whose heartbeats say they hold them."""
    from swarmd.data.run_files import RunFiles

    def holders() -> list[tuple[str, list[str]]]:
        return [(str(m["peer_id"]), list(m.get("holds") or [])) for m in membership.snapshot(time.time())]

    cache_bytes = int(config.limits.data_cache_gib * 2**30)
    return RunFiles(spec, state_dir, config.data.paths, cache_bytes, send, holders, measurements.is_member)


def _paced(heartbeat_s: float, floor_s: float, ceiling_s: float) -> float:
    """Two heartbeats, within [floor_s, ceiling_s]."""
    return min(ceiling_s, max(floor_s, 2 * heartbeat_s))


class Node:
    """The services of one daemon in one run, made and wired together, started and stopped."""

    def __init__(self, config: Config, run_id: str) -> None:
        self.config = config
        self.run_id = check_run_id(run_id)
        self.state_dir = prepare_state_dir(config.node.state_path)
        self.identity: Identity | None = None
        self.spec: SignedRunSpec | None = None
        self.dht: SwarmDHT | None = None
        self.dht_watch: DhtWatch | None = None  # restarts the DHT process if it dies
        self.presence: Presence | None = None  # heartbeats and membership, once the DHT exists
        self.lan: LanService | None = None
        self.trainer: Trainer | None = None  # when [compute] train is on (swarmd.training)
        self.rpc: RpcServer | None = None
        self.relay: RelayService | None = None
        self.router: Router | None = None  # our own data-path requests: direct, or through a relay
        self.files: RunFiles | None = None  # the run's files here: found, fetched, served (swarmd.data)
        self.dial_back: DialBackService | None = None  # reachability checks, ours and the members'
        self._p2p: Any = None  # hivemind P2P replica: the data path's requests go through it
        self.membership: Membership | None = None
        self.measurements: Measurements | None = None
        self.coordination: Coordination | None = None
        self.roles = ["worker"] if config.compute.train else []
        self.pausing = Pausing(self)
        self.limits = LiveLimits(config.limits)  # [limits] applied to this process, live
        self.reloads = Reloads(config, self.limits, self._check_limits)  # SIGHUP, swarmd config reload
        self.traffic_day = TrafficDay(self.state_dir)  # today's bytes, against [limits] daily_transfer_gib
        self.state = "starting"
        self.started_at = time.time()
        self.services = Services()
        self._lock = StateDirLock(self.state_dir)
        self._liveness = LivenessPipe()
        api = ControlApi(self)
        self._control = ControlServer(self.state_dir / SOCKET_FILENAME, api.handlers(), api.ARGUMENTS)
        self.dashboard = DashboardServer(config.dashboard, lambda: api.status({}))

    # --- lifecycle -------------------------------------------------------------------------

    def request_stop(self, exit_code: int = 0) -> None:
        self.services.stop(exit_code)

    async def run(self) -> int:
        """Join, serve until asked to stop, then leave. Returns the process exit code."""
        self._lock.acquire()
        starting = asyncio.create_task(self._start())
        stopping = asyncio.create_task(self.services.stopped())
        try:
            await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if not starting.done():  # asked to stop while still joining: not a failure
                starting.cancel()
                with contextlib.suppress(asyncio.CancelledError, SwarmdError):
                    await starting
                return self.services.exit_code
            starting.result()  # a start-up error propagates from here
            systemd.notify_ready(f"member of {self.run_id}")
            self.state = "running"
            logger.info("Running as %s in run %s", self.identity_peer_id, self.run_id)
            await stopping
            return self.services.exit_code
        finally:
            stopping.cancel()
            await self._shutdown()
            self._lock.release()

    async def _start(self) -> None:
        self.identity = load_or_create_identity(self.state_dir)
        self.limits.start()
        self.traffic_day.load()  # before any traffic: a restart does not reset the daily cap
        self.membership = Membership(self.identity.peer_id)
        cfg, services = self.config.swarm, self.services
        self.dht = dht = SwarmDHT(
            self.run_id,
            identity_path=str(write_p2pd_identity(self.identity, self.state_dir)),
            initial_peers=cfg.initial_peers,
            host_maddrs=cfg.host_maddrs,
            announce_maddrs=cfg.announce_maddrs,
            nat_port_map=cfg.nat_port_map,
            relay=cfg.relay,
            child_init=self._init_dht_child,
        )
        self.lan = lan = LanService(self.state_dir, self.run_id, cfg.lan_maddr, dht)
        hb = self.config.heartbeat
        self.presence = presence = Presence(
            self.run_id, self.identity, dht, self.membership, lan, hb, self.current_roles, self.started_at
        )
        await self._control.start()  # after the presence: every status answer reads it
        await self.dashboard.start()  # when [dashboard] listen is set
        self.state = "joining"
        systemd.notify_status(f"joining run {self.run_id}")
        joining = Joining(dht, self.state_dir, self.run_id, cfg, services.sleep_or_stop)
        # The DHT forks before torch starts threads: fork after that is unsafe.
        await joining.start_dht()
        self.dht_watch = DhtWatch(dht, self._after_dht_restart, self.request_stop)
        logger.info("DHT listening on %s", " ".join(await presence.refresh_addrs()))
        if cfg.mdns:
            try:
                await lan.start(presence.sign_heartbeat)
            except SwarmdError as e:
                logger.warning("%s; going on without it for now", e)
        device_task = asyncio.create_task(presence.measure_device(self.config.compute, self.config.limits))
        self.spec = spec = await joining.find_spec()
        self.membership.follow(spec, cfg.join_token)  # a private run's refusal stops us here
        await device_task
        assert self.identity is not None
        made = make_coordination(self.config, self.run_id, self.identity, dht, self.state_dir, presence, spec)
        self.measurements, self.coordination = measurements, coordination = made
        coordination.own_works = lambda: "paused" not in self.roles
        observe = functools.partial(presence.scan_members, measurements.observe)
        services.spawn("heartbeat", lambda: hb.interval_s, presence.publish_heartbeat)
        services.spawn("membership", lambda: min(hb.interval_s, MEMBERSHIP_SCAN_S), observe)
        services.spawn("rtt", lambda: max(hb.interval_s, 2.0), presence.probe_rtts)
        # Every member keeps the run's spec alive in the DHT: the run outlives its creator.
        services.spawn("spec", lambda: SPEC_TTL_S / 4, lambda: joining.publish_spec(spec), run_first=False)
        services.spawn("watchdog", lambda: systemd.watchdog_interval_s() or 2.0, self._watchdog)
        services.spawn("pause", lambda: PAUSE_CHECK_S, self.pausing.end_timed_pause, run_first=False)
        services.spawn("limits", lambda: LIMITS_CHECK_S, self._check_limits)
        services.spawn("traffic day", lambda: SAVE_EVERY_S, self.traffic_day.keep, run_first=False)
        await self._start_rpc(measurements, coordination)
        self._start_files(spec, measurements)
        # Paced by the heartbeat (a swarm tuned for quick membership also re-plans quickly), but
        # never faster than these floors: every round is DHT traffic that heartbeats and leases,
        # which must stay prompt, share.
        services.spawn("probes", lambda: PROBE_ROUND_S, measurements.probe)
        services.spawn("measurements", lambda: _paced(hb.interval_s, 5.0, PUBLISH_MEASUREMENTS_S), measurements.publish)
        services.spawn("coordination", lambda: coordination_round_s(hb.interval_s), coordination.coordinate)
        await presence.measure_device(self.config.compute, self.config.limits, spec.spec)
        if self.config.compute.train:
            await self._start_trainer(spec, measurements, coordination)
        if cfg.mdns:
            keep_lan = functools.partial(lan.keep, presence.sign_heartbeat, services.sleep_or_stop)
            services.spawn_once("LAN discovery", keep_lan)  # restarts its child whenever it dies

    async def _start_rpc(self, measurements: Measurements, coordination: Coordination) -> None:
        """The data path's request server on the DHT's libp2p host (the trainer adds its own)."""
        assert self.dht is not None
        self._p2p = await dht_call(self.dht.replicate_p2p())
        self.relay = RelayService(coordination.own, coordination.is_relay, measurements.is_member)
        # The server believes a relayed request only from a relay of the plan in force.
        admit = RunAdmission(coordination.own, measurements.is_member, coordination.spec.spec.checkpoint_access)
        self.rpc = RpcServer(run_id=self.run_id, is_relay=coordination.is_relay, admit=admit)
        self.rpc.register(Probe, measurements.handle_probe)
        self.rpc.register(Forward, self.relay.handle)
        membership = self.membership
        assert membership is not None

        def addrs_of(peer: str) -> list[str] | None:
            view = membership.peers.get(peer)
            return view.heartbeat.addrs if view is not None and measurements.is_member(peer) else None

        # Only the host a member's stream comes from, public unless we listen only on a LAN or loopback.
        self.dial_back = DialBackService(self.run_id, addrs_of, self.rpc.seen_at, self.config.swarm.host_maddrs)
        self.rpc.register(DialBack, self.dial_back.handle)
        await self.rpc.attach(self._p2p)
        measurements.p2p = self.dial_back.p2p = self._p2p
        self.relay.p2p = self._p2p
        mode = self.config.swarm.data_via_relay
        self.router = router = Router(coordination.own, coordination.relays, coordination.matrix, mode=mode)
        router.on_transfer = measurements.observe_transfer

    async def send(self, peer: str, request: Any, blobs: list[bytes], timeout_s: float) -> Any:
        """One request to a member, direct or through a relay (``swarmd.node.relay.Router``)."""
        assert self.router is not None
        return await self.router.call(self._p2p, peer, request, blobs, timeout_s)

    def _start_files(self, spec: SignedRunSpec, measurements: Measurements) -> None:
        """The run's files: found here, fetched when missing, served to members (``swarmd.data``)."""
        from swarmd.peers.wire.file_messages import FileFetch

        assert self.rpc is not None and self.membership is not None and self.presence is not None
        self.files = files = run_files(self.config, self.state_dir, spec, self.send, self.membership, measurements)
        self.rpc.register(FileFetch, files.server.handle)
        self.presence.holds = files.holds
        self.limits.on_data_cache = files.store.resize
        self.services.spawn_once("data", files.open)

    async def _start_trainer(self, spec: SignedRunSpec, measurements: Measurements, coordination: Coordination) -> None:
        # transformers loads only on peers that train (seconds of start-up otherwise).
        from swarmd.node.device import resolve_device
        from swarmd.training.run_facts import compute_settings
        from swarmd.training.trainer import Trainer

        assert self.identity is not None and self.dht is not None
        assert self.membership is not None and self.rpc is not None and self.files is not None
        self.limits.start_compute(device := resolve_device(self.config.compute.device))
        membership = self.membership

        def members() -> list[dict[str, Any]]:
            return membership.snapshot(time.time())

        self.trainer = Trainer(
            spec,
            self.identity,
            self.dht,
            run_checkpoint_dir(self.state_dir, self.run_id),
            members,
            coordination,
            self.send,
            self.files,
            lambda: membership.scans > 0,
            compute_settings(device, self.config.compute.precision, self.config.compute.compile),
        )
        assert self.presence is not None
        self.presence.held_out = self.trainer.evaluation.held_out
        for request_type, handler in self.trainer.handlers.table().items():
            self.rpc.register(request_type, handler)
        self.services.spawn("trainer", lambda: TRAINER_TICK_S, self.trainer.tick)

    def _init_dht_child(self) -> None:
        """First thing in the forked DHT process: tie its life to ours, drop what is ours alone."""
        self._liveness.watch_in_child()
        # A lingering copy would hold the state-dir lock, or accept on the control socket.
        for fd in (self._lock.fd, *self._control.fds()):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)

    async def _watchdog(self) -> None:
        # A restart runs in a task of its own: the service manager's watchdog is fed meanwhile.
        if self.dht_watch is not None:
            self.dht_watch.check()
        if systemd.watchdog_interval_s() is not None:
            systemd.notify_watchdog()

    async def _after_dht_restart(self) -> None:
        """On a new DHT process: the data path rides on its p2pd, and what we published lived in the old one."""
        assert self.dht is not None
        old, self._p2p = self._p2p, await dht_call(self.dht.replicate_p2p())
        if self.rpc is not None:
            await self.rpc.attach(self._p2p)
        for holder in (self.measurements, self.relay):
            if holder is not None:
                holder.p2p = self._p2p
        if old is not None:  # its p2pd is gone: closing it only frees our end
            with contextlib.suppress(Exception):
                await asyncio.wait_for(old.shutdown(), 2.0)
        if self.presence is not None:
            await self.presence.publish_heartbeat()
        if self.spec is not None:
            await dht_call(self.dht.publish_spec(self.spec.raw))

    async def _shutdown(self) -> None:
        self.state = "stopping"
        systemd.notify_stopping()
        budget = self.config.node.stop_timeout_s
        try:
            await asyncio.wait_for(self._leave(), budget)
        except TimeoutError:
            logger.warning("Shutdown took over [node] stop_timeout_s = %.0f s; exiting anyway", budget)
        if self.measurements is not None:
            self.measurements.save()  # what we observed of others outlives this run of the daemon
        self.traffic_day.save()
        if self.dht is not None:
            await asyncio.to_thread(self.dht.shutdown)

    async def _leave(self) -> None:
        """Stop the loops, announce leaving, stop the rest; each step runs whatever the others did."""
        # Every task is cancelled before any is awaited: a LAN dial must not outlive the loops.
        await asyncio.gather(
            self.services.cancel(),
            *([self.lan.cancel_dials()] if self.lan is not None else []),
            *([self.dht_watch.stop()] if self.dht_watch is not None else []),
        )
        if self.trainer is not None and self.dht is not None and self.dht.is_alive():
            try:  # checkpoint every stage we train, and free the stages for the others at once
                await asyncio.wait_for(self.trainer.release(), TRAINER_STOP_TIMEOUT_S)
            except Exception as e:
                logger.warning("Could not release our stages cleanly (%s); they free when their leases expire", e)
        # After the loops: a regular heartbeat still in flight would overwrite the leave.
        if self.dht is not None and self.dht.is_alive() and self.spec is not None and self.presence is not None:
            await self.presence.announce_leaving()
        for step in (
            self.files.stop if self.files is not None else None,
            self.lan.stop if self.lan is not None else None,
            self._p2p.shutdown if self._p2p is not None else None,
            self._control.stop,
            self.dashboard.stop,
        ):
            if step is not None:
                try:
                    await step()
                except Exception:
                    logger.exception("Shutdown step %s failed; continuing", step.__qualname__)

    @property
    def identity_peer_id(self) -> str:
        assert self.identity is not None
        return self.identity.peer_id

    async def _check_limits(self) -> None:
        """Pause while ``[limits]`` says so (``swarmd.node.limits.auto_pause``), resume when it no longer does."""
        if self.config.compute.train:
            limits, device = self.config.limits, self.config.compute.device
            await self.pausing.follow_limits(await asyncio.to_thread(limits_reason, limits, None, device))

    def current_roles(self) -> list[str]:
        """What this peer does now: it works if it trains, and serves parameters while it holds shards."""
        hosting = self.trainer is not None and bool(self.trainer.servers)
        return self.roles + (["parameter_server"] if hosting else [])

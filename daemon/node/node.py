"""One daemon: joins a run's swarm, keeps its membership fresh, and answers its owner.

The services of a node run as periodic tasks on one asyncio loop; the hivemind DHT has its
own process, and py-libp2p (LAN discovery) a child process of its own. Nothing here blocks
the loop: DHT calls return futures with deadlines, torch work runs in a worker thread. A
service whose round fails (a DHT hiccup) retries with capped backoff; only the DHT process
dying stops the daemon, so that the service manager restarts it. Shutdown is bounded by
``[node] stop_timeout_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, TypeVar

from swarmd import __version__
from swarmd.config import Config
from swarmd.errors import JoinError, RecordError, SwarmdError
from swarmd.node.coordination import Coordination
from swarmd.node.device import describe_device, measure_throughput_gflops, resolve_device
from swarmd.node.lan_process import LanDiscoveryProcess
from swarmd.node.relay import RelayService, Router
from swarmd.peers.dht.swarm_dht import SPEC_TTL_S, BootstrapError, SwarmDHT
from swarmd.peers.membership.election import ElectionConfig, coordination_round_s
from swarmd.peers.membership.members import Membership
from swarmd.peers.records.heartbeat import MAX_ADDRS, DeviceInfo, Heartbeat, parse_heartbeat
from swarmd.peers.records.identity import Identity, load_or_create_identity, write_p2pd_identity
from swarmd.peers.records.links import ProbeBudget
from swarmd.peers.records.run_spec import SignedRunSpec, check_run_id
from swarmd.peers.wire.messages import Forward, Probe
from swarmd.peers.wire.rpc import RpcServer
from swarmd.system import systemd
from swarmd.system.children import LivenessPipe
from swarmd.system.control import SOCKET_FILENAME, ControlServer
from swarmd.system.state_dir import (
    StateDirLock,
    load_cached_spec,
    prepare_state_dir,
    run_checkpoint_dir,
    save_spec,
    spec_cache_path,
)

if TYPE_CHECKING:
    from swarmd.training.trainer import Trainer

logger = logging.getLogger(__name__)

T = TypeVar("T")

# How long the last ("leaving") heartbeat may take to reach the DHT during shutdown.
LEAVE_ANNOUNCE_TIMEOUT_S = 3.0
LEAVING_RECORD_TTL_S = 30.0
DHT_CALL_TIMEOUT_S = 10.0
RTT_PROBE_TIMEOUT_S = 2.0
MAX_RETRY_DELAY_S = 30.0
# LAN peers introduced to the DHT at once; more hellos than this wait for the next minute.
MAX_LAN_DIALS = 8
LAN_RESTART_INTERVAL_S = 10.0
TRAINER_STOP_TIMEOUT_S = 25.0
TRAINER_TICK_S = 1.0
PROBE_ROUND_S = 5.0
MEMBERSHIP_SCAN_S = 5.0
PUBLISH_MEASUREMENTS_S = 15.0


def _paced(heartbeat_s: float, floor_s: float, ceiling_s: float) -> float:
    """Two heartbeats, within [floor_s, ceiling_s]."""
    return min(ceiling_s, max(floor_s, 2 * heartbeat_s))


class Node:
    def __init__(self, config: Config, run_id: str) -> None:
        self.config = config
        self.run_id = check_run_id(run_id)
        self.state_dir = prepare_state_dir(config.node.state_path)
        self.identity: Identity | None = None
        self.spec: SignedRunSpec | None = None
        self.dht: SwarmDHT | None = None
        self.lan: LanDiscoveryProcess | None = None  # when mDNS is on and it started
        self.trainer: Trainer | None = None  # when [compute] train is on (swarmd.training)
        self.rpc: RpcServer | None = None
        self.relay: RelayService | None = None
        self.router: Router | None = None  # our own data-path requests: direct, or through a relay
        self._p2p: Any = None  # hivemind P2P replica: the data path's requests go through it
        self.membership: Membership | None = None
        self.coordination: Coordination | None = None
        self.device = DeviceInfo(kind="cpu", name="unknown", memory_bytes=0, cpus=1)
        self.throughput_gflops = 0.0
        self.roles = ["worker"] if config.compute.train else []
        self.state = "starting"
        self.started_at = time.time()
        self.rejected_records = 0
        self.addrs: list[str] = []  # the DHT's visible multiaddrs, refreshed with each heartbeat
        self._last_expires_at = 0.0  # of the last heartbeat published: a later one must outlive it
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._lan_dials: set[asyncio.Task[int]] = set()
        self._lock = StateDirLock(self.state_dir)
        self._liveness = LivenessPipe()
        self._control = ControlServer(
            self.state_dir / SOCKET_FILENAME,
            {"status": self.status, "peers": self.peers, "gather_weights": self.gather_weights},
        )
        self._exit_code = 0

    # --- lifecycle -------------------------------------------------------------------------

    def request_stop(self, exit_code: int = 0) -> None:
        if not self._stop.is_set():
            logger.info("Stopping (announcing leave, then stopping every component)")
            self._exit_code = exit_code
            self._stop.set()

    async def run(self) -> int:
        """Join, serve until asked to stop, then leave. Returns the process exit code."""
        self._lock.acquire()
        starting = asyncio.create_task(self._start())
        stopping = asyncio.create_task(self._stop.wait())
        try:
            await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if not starting.done():  # asked to stop while still joining: not a failure
                starting.cancel()
                with contextlib.suppress(asyncio.CancelledError, SwarmdError):
                    await starting
                return self._exit_code
            starting.result()  # a start-up error propagates from here
            systemd.notify_ready(f"member of {self.run_id}")
            self.state = "running"
            logger.info("Running as %s in run %s", self.identity_peer_id, self.run_id)
            await stopping
            return self._exit_code
        finally:
            stopping.cancel()
            await self._shutdown()
            self._lock.release()

    async def _start(self) -> None:
        self.identity = load_or_create_identity(self.state_dir)
        self.membership = Membership(self.identity.peer_id)
        await self._control.start()
        self.state = "joining"
        systemd.notify_status(f"joining run {self.run_id}")
        cfg = self.config.swarm
        self.dht = SwarmDHT(
            self.run_id,
            identity_path=str(write_p2pd_identity(self.identity, self.state_dir)),
            initial_peers=cfg.initial_peers,
            host_maddrs=cfg.host_maddrs,
            announce_maddrs=cfg.announce_maddrs,
            nat_port_map=cfg.nat_port_map,
            relay=cfg.relay,
            child_init=self._init_dht_child,
        )
        # The DHT forks before torch starts threads: fork after that is unsafe.
        await self._start_dht()
        self.addrs = await self._dht_call(self.dht.visible_maddrs())
        logger.info("DHT listening on %s", " ".join(self.addrs))
        if cfg.mdns:
            try:
                await self._start_lan()
            except SwarmdError as e:
                logger.warning("%s; going on without it, retrying in %.0f s", e, LAN_RESTART_INTERVAL_S)
        device_task = asyncio.create_task(self._measure_device())
        self.spec = await self._join()
        await device_task
        hb = self.config.heartbeat
        self.coordination = self._make_coordination()
        self._spawn("heartbeat", lambda: hb.interval_s, self._publish_heartbeat)
        self._spawn("membership", lambda: min(hb.interval_s, MEMBERSHIP_SCAN_S), self._scan_members)
        self._spawn("rtt", lambda: max(hb.interval_s, 2.0), self._probe_rtts)
        self._spawn("spec", lambda: SPEC_TTL_S / 4, self._republish_spec, run_first=False)
        self._spawn("watchdog", lambda: systemd.watchdog_interval_s() or 2.0, self._watchdog)
        await self._start_rpc()
        assert self.coordination is not None
        # Paced by the heartbeat (a swarm tuned for quick membership also re-plans quickly), but
        # never faster than these floors: every round is DHT traffic that heartbeats and leases,
        # which must stay prompt, share.
        self._spawn("probes", lambda: PROBE_ROUND_S, self.coordination.probe)
        self._spawn(
            "measurements", lambda: _paced(hb.interval_s, 5.0, PUBLISH_MEASUREMENTS_S), self.coordination.publish
        )
        self._spawn("coordination", lambda: coordination_round_s(hb.interval_s), self.coordination.coordinate)
        if self.config.compute.train:
            await self._start_trainer()
        if cfg.mdns:
            self._spawn("LAN discovery", lambda: LAN_RESTART_INTERVAL_S, self._keep_lan, run_first=False)

    def _make_coordination(self) -> Coordination:
        assert self.spec is not None and self.identity is not None and self.dht is not None
        probes, roles = self.config.probes, self.config.roles
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

        def own_device() -> tuple[float, float]:
            return self.throughput_gflops / 1000, self.device.memory_bytes / (1 << 30)

        scan_s = min(self.config.heartbeat.interval_s, MEMBERSHIP_SCAN_S)
        return Coordination(self.spec, self.identity, self.dht, self.state_dir, budget, thresholds, own_device, scan_s)

    async def _start_trainer(self) -> None:
        # transformers loads only on peers that train (seconds of start-up otherwise).
        from swarmd.training.trainer import Trainer

        assert self.identity is not None and self.spec is not None and self.dht is not None
        assert self.membership is not None and self.rpc is not None
        if self.config.compute.threads:
            import torch

            torch.set_num_threads(self.config.compute.threads)
        membership, own, coordination = self.membership, self.identity.peer_id, self.coordination
        assert coordination is not None

        def members() -> list[dict[str, Any]]:
            return membership.snapshot(time.time())

        router = Router(own, coordination.relays, coordination.matrix, mode=self.config.swarm.data_via_relay)
        router.on_transfer = coordination.observe_transfer

        async def send(peer: str, request: Any, blobs: list[bytes], timeout_s: float) -> Any:
            return await router.call(self._p2p, peer, request, blobs, timeout_s)

        self.router = router
        self.trainer = Trainer(
            self.spec,
            self.identity,
            self.dht,
            run_checkpoint_dir(self.state_dir, self.run_id),
            members,
            coordination,
            send,
            lambda: membership.scans > 0,
        )
        for request_type, handler in self.trainer.handlers.table().items():
            self.rpc.register(request_type, handler)
        self._spawn("trainer", lambda: TRAINER_TICK_S, self.trainer.tick)

    def _init_dht_child(self) -> None:
        """First thing in the forked DHT process: tie its life to ours, drop what is ours alone."""
        self._liveness.watch_in_child()
        # A lingering copy would hold the state-dir lock, or accept on the control socket.
        for fd in (self._lock.fd, *self._control.fds()):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)

    async def _retry(self, attempt: Callable[[], Awaitable[T | str]], timeout: float) -> T | str:
        """Call ``attempt`` until it returns a result, backing off while it returns a reason.

        Returns the last reason once ``timeout`` has passed. While joining, systemd is asked to
        extend the start timeout, so a long join is not mistaken for a hung start.
        """
        deadline, delay = time.monotonic() + timeout, 0.5
        while True:
            outcome = await attempt()
            if not isinstance(outcome, str) or time.monotonic() + delay > deadline:
                return outcome
            logger.info("%s; retrying in %.0f s", outcome, delay)
            systemd.sd_notify(f"EXTEND_TIMEOUT_USEC={int((delay + DHT_CALL_TIMEOUT_S) * 1e6)}")
            await self._sleep_or_stop(delay)
            delay = min(delay * 2, MAX_RETRY_DELAY_S)

    async def _start_dht(self) -> None:
        """Start the DHT; while no initial peer answers (it may be restarting), retry until the join timeout."""
        assert self.dht is not None
        dht = self.dht

        async def attempt() -> bool | str:
            try:
                await asyncio.to_thread(dht.start)
            except BootstrapError as e:
                return str(e)
            return True

        outcome = await self._retry(attempt, self.config.swarm.join_timeout_s)
        if isinstance(outcome, str):
            timeout = self.config.swarm.join_timeout_s
            raise JoinError(f"cannot join run {self.run_id} within {timeout:.0f} s: {outcome}")

    async def _start_rpc(self) -> None:
        """The data path's request server on the DHT's libp2p host (the trainer adds its own)."""
        assert self.dht is not None and self.spec is not None and self.coordination is not None
        self._p2p = await self._dht_call(self.dht.replicate_p2p())
        coordination = self.coordination
        self.relay = RelayService(coordination.own, coordination.is_relay, lambda peer: peer in coordination.members)
        # The server believes a relayed request only from a relay of the plan in force.
        self.rpc = RpcServer(run_id=self.run_id, is_relay=coordination.is_relay)
        self.rpc.register(Probe, coordination.handle_probe)
        self.rpc.register(Forward, self.relay.handle)
        await self.rpc.attach(self._p2p)
        self.coordination.p2p = self._p2p
        self.relay.p2p = self._p2p

    async def _start_lan(self) -> None:
        """LAN discovery only introduces peers; the DHT is the source of truth, so its failure is
        not fatal: it is logged here, and the "lan" service tries again later."""
        lan = LanDiscoveryProcess(self.state_dir, self.run_id, self.config.swarm.lan_maddr, self._on_lan_hello)
        await lan.start()
        self.lan = lan
        # Answer hellos from the start: a LAN peer greets us once a minute at most.
        lan.set_hello(self._sign_heartbeat())
        logger.info("LAN discovery (mDNS) on %s", " ".join(lan.listen_maddrs))

    async def _shutdown(self) -> None:
        self.state = "stopping"
        systemd.notify_stopping()
        budget = self.config.node.stop_timeout_s
        try:
            await asyncio.wait_for(self._leave(), budget)
        except TimeoutError:
            logger.warning("Shutdown took over [node] stop_timeout_s = %.0f s; exiting anyway", budget)
        if self.coordination is not None:
            self.coordination.save()  # what we observed of others outlives this run of the daemon
        if self.dht is not None:
            await asyncio.to_thread(self.dht.shutdown)

    async def _leave(self) -> None:
        """Stop the loops, announce leaving, stop the rest; each step runs whatever the others did."""
        for task in [*self._tasks, *self._lan_dials]:
            task.cancel()
        await asyncio.gather(*self._tasks, *self._lan_dials, return_exceptions=True)
        if self.trainer is not None and self.dht is not None and self.dht.is_alive():
            try:  # checkpoint every stage we train, and free the stages for the others at once
                await asyncio.wait_for(self.trainer.release(), TRAINER_STOP_TIMEOUT_S)
            except Exception as e:
                logger.warning("Could not release our stages cleanly (%s); they free when their leases expire", e)
        # After the loops: a regular heartbeat still in flight would overwrite the leave.
        if self.dht is not None and self.dht.is_alive() and self.spec is not None:
            try:
                raw = self._sign_heartbeat(leaving=True)
                await asyncio.wait_for(
                    self.dht.publish_heartbeat(self.identity_peer_id, raw, self._last_expires_at),
                    LEAVE_ANNOUNCE_TIMEOUT_S,
                )
            except Exception as e:
                logger.warning("Could not announce leaving (%s); peers will drop us when our heartbeat expires", e)
        for step in (
            self.lan.stop if self.lan is not None else None,
            self._p2p.shutdown if self._p2p is not None else None,
            self._control.stop,
        ):
            if step is not None:
                try:
                    await step()
                except Exception:
                    logger.exception("Shutdown step %s failed; continuing", step.__qualname__)

    def _spawn(
        self, name: str, interval: Callable[[], float], body: Callable[[], Awaitable[None]], run_first: bool = True
    ) -> None:
        self._tasks.append(asyncio.create_task(self._periodic(name, interval, body, run_first), name=name))

    async def _periodic(
        self, name: str, interval: Callable[[], float], body: Callable[[], Awaitable[None]], run_first: bool
    ) -> None:
        """Run ``body`` every ``interval()`` seconds; a failed round is retried with capped backoff."""
        failures = 0
        if not run_first and await self._sleep_or_stop(interval()):
            return
        while True:
            try:
                await body()
                failures, delay = 0, interval()
            except Exception as e:
                failures += 1
                delay = min(interval() * 2**failures, 60.0)
                logger.warning("%s failed (%s: %s); retrying in %.0f s", name, type(e).__name__, e, delay)
            if await self._sleep_or_stop(delay):
                return

    async def _sleep_or_stop(self, seconds: float) -> bool:
        """Sleep ``seconds``; True when the node was asked to stop meanwhile."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)
        return self._stop.is_set()

    async def _dht_call(self, call: Awaitable[T]) -> T:
        """A DHT request with a deadline: a dead or wedged DHT process must not wedge the loop."""
        return await asyncio.wait_for(call, DHT_CALL_TIMEOUT_S)

    # --- joining ---------------------------------------------------------------------------

    async def _join(self) -> SignedRunSpec:
        """Find the run's spec: from the local cache (the creator's, or an earlier join), else the DHT."""
        assert self.dht is not None
        dht = self.dht
        cached = load_cached_spec(self.state_dir, self.run_id)
        if cached is not None:
            logger.info("Serving the spec of run %s from %s", self.run_id, spec_cache_path(self.state_dir, self.run_id))
            await self._publish_spec(cached)
            return cached

        async def attempt() -> SignedRunSpec | str:
            return await self._dht_call(dht.fetch_spec()) or f"no peer has served the spec of run {self.run_id} yet"

        outcome = await self._retry(attempt, self.config.swarm.join_timeout_s)
        if not isinstance(outcome, str):
            save_spec(self.state_dir, outcome)
            logger.info(
                "Joined run %s (model %s, created by %s)", self.run_id, outcome.spec.model.family, outcome.creator
            )
            return outcome
        known = await self._dht_call(dht.known_peers())
        swarm = self.config.swarm
        if not swarm.initial_peers and not swarm.mdns:
            hint = "no --initial-peers were given and mDNS is off; pass the address of a peer in the run"
        elif known == 0:
            given = ", ".join(swarm.initial_peers) or "none given"
            hint = f"no peer was reached (initial peers: {given}); check the addresses and that those daemons run"
        else:
            hint = f"{known} peer(s) answered but none serves this run; check the run ID"
        raise JoinError(f"run {self.run_id} is not served by any peer after {swarm.join_timeout_s:.0f} s: {hint}")

    async def _publish_spec(self, spec: SignedRunSpec) -> None:
        assert self.dht is not None
        if not await self._dht_call(self.dht.publish_spec(spec.raw)):
            logger.debug("Spec of run %s is stored only locally for now (no other DHT node yet)", self.run_id)

    async def _measure_device(self) -> None:
        cfg = self.config.compute
        device = await asyncio.to_thread(resolve_device, cfg.device)
        self.device = await asyncio.to_thread(describe_device, device)
        if cfg.benchmark:
            self.throughput_gflops = await asyncio.to_thread(measure_throughput_gflops, device)

    # --- service rounds --------------------------------------------------------------------

    @property
    def identity_peer_id(self) -> str:
        assert self.identity is not None
        return self.identity.peer_id

    def current_roles(self) -> list[str]:
        """What this peer does now: it works if it trains, and serves parameters while it holds shards."""
        hosting = self.trainer is not None and bool(self.trainer.servers)
        return self.roles + (["parameter_server"] if hosting else [])

    def _sign_heartbeat(self, leaving: bool = False) -> bytes:
        """Sign this peer's heartbeat; it must pass the very checks every reader applies."""
        assert self.identity is not None
        now = time.time()
        if leaving:
            # hivemind keeps the value with the later expiration: the leave must outlive the last beat.
            expires_at = max(now + LEAVING_RECORD_TTL_S, self._last_expires_at + 1)
        else:
            expires_at = now + self.config.heartbeat.ttl_s
        heartbeat = Heartbeat(
            run_id=self.run_id,
            peer_id=self.identity.peer_id,
            issued_at=now,
            expires_at=expires_at,
            addrs=self.addrs[:MAX_ADDRS],
            lan_addrs=self.lan.listen_maddrs[:MAX_ADDRS] if self.lan is not None else [],
            device=self.device,
            throughput_gflops=self.throughput_gflops,
            version=__version__,
            roles=self.current_roles(),
            uptime_s=now - self.started_at,
            leaving=leaving,
        )
        raw = heartbeat.sign(self.identity)
        parse_heartbeat(raw, run_id=self.run_id, now=now, peer_id=self.identity.peer_id)  # raises RecordError
        self._last_expires_at = expires_at
        return raw

    async def _publish_heartbeat(self) -> None:
        assert self.dht is not None
        self.addrs = await self._dht_call(self.dht.visible_maddrs())
        raw = self._sign_heartbeat()
        if self.lan is not None:
            self.lan.set_hello(raw)
        if not await self._dht_call(self.dht.publish_heartbeat(self.identity_peer_id, raw, self._last_expires_at)):
            logger.debug("Heartbeat stored only locally (no other DHT node accepted it yet)")

    async def _scan_members(self) -> None:
        assert self.dht is not None and self.membership is not None
        scan = await self._dht_call(self.dht.scan_members(time.time()))
        self.rejected_records += scan.rejected
        joined, left = self.membership.update(scan.live, scan.leaving, time.time())
        if self.coordination is not None:
            self.coordination.observe(self.membership.snapshot(time.time()))
        if joined or left:  # what `systemctl status swarmd` shows
            systemd.notify_status(f"member of {self.run_id}; {len(self.membership.peers)} other peer(s) seen")

    async def _probe_rtts(self) -> None:
        assert self.dht is not None and self.membership is not None
        dht, membership = self.dht, self.membership

        async def probe(peer_id: str) -> None:
            with contextlib.suppress(Exception):
                membership.record_rtt(peer_id, await asyncio.wait_for(dht.ping(peer_id), RTT_PROBE_TIMEOUT_S))

        await asyncio.gather(*(probe(p) for p in list(membership.peers)))

    async def _republish_spec(self) -> None:
        """Every member keeps the run's spec alive in the DHT: the run outlives its creator."""
        assert self.spec is not None
        await self._publish_spec(self.spec)

    async def _keep_lan(self) -> None:
        """Restart LAN discovery if it failed to start or its child died."""
        if self.lan is not None and self.lan.alive:
            return
        if self.lan is not None:
            await self.lan.stop()
            self.lan = None
        await self._start_lan()

    async def _watchdog(self) -> None:
        if self.dht is not None and not self.dht.is_alive():
            logger.error("The DHT process died; stopping so that the service manager restarts swarmd")
            self.request_stop(exit_code=1)
            return
        if systemd.watchdog_interval_s() is not None:
            systemd.notify_watchdog()

    def _on_lan_hello(self, peer_id: str, payload: bytes) -> None:
        """A peer found on the LAN sent its heartbeat: if it is of our run, reach it through the DHT."""
        try:
            heartbeat = parse_heartbeat(payload, run_id=self.run_id, now=time.time(), peer_id=peer_id)
        except RecordError as e:
            logger.debug("Ignoring LAN peer %s: %s", peer_id[:60], e)
            return
        if self.dht is None or not heartbeat.addrs or len(self._lan_dials) >= MAX_LAN_DIALS:
            return
        logger.info("Found %s on the LAN; connecting its DHT node", peer_id)
        task = asyncio.create_task(self.dht.add_peers(heartbeat.peer_id, heartbeat.addrs))
        self._lan_dials.add(task)
        task.add_done_callback(self._lan_dial_done)

    def _lan_dial_done(self, task: asyncio.Task[int]) -> None:
        self._lan_dials.discard(task)
        # Best effort (failures are logged inside); retrieve the outcome so none goes unobserved.
        if not task.cancelled() and task.exception() is not None:
            logger.debug("Introducing a LAN peer failed: %r", task.exception())

    # --- control API -----------------------------------------------------------------------

    def status(self, request: dict[str, Any]) -> dict[str, Any]:
        now = time.time()
        spec = self.spec.spec if self.spec is not None else None
        return {
            "peer_id": self.identity.peer_id if self.identity else None,
            "version": __version__,
            "state": self.state,
            "pid": os.getpid(),
            "run_id": self.run_id,
            "run": None
            if spec is None
            else {
                "name": spec.name,
                "model": spec.model.family,
                "layers": spec.model.layers,
                "hidden": spec.model.hidden,
                "stages": spec.stages,
                "creator": self.spec.creator if self.spec else None,
            },
            "roles": self.current_roles(),
            "uptime_s": round(now - self.started_at, 1),
            "addrs": self.addrs,
            "lan_addrs": self.lan.listen_maddrs if self.lan is not None else [],
            "device": {"kind": self.device.kind, "name": self.device.name, "memory_bytes": self.device.memory_bytes},
            "throughput_gflops": round(self.throughput_gflops, 1),
            "rejected_records": self.rejected_records,
            "peers": self.membership.snapshot(now) if self.membership is not None else [],
            "training": self.trainer.status() if self.trainer is not None else None,
            "swarm": self.coordination.status() if self.coordination is not None else None,
            "relaying": self.relay.status() if self.relay is not None else None,
            "routes": self.router.status() if self.router is not None else None,
            "rpc": None if self.rpc is None else asdict(self.rpc.counters),
        }

    async def gather_weights(self, request: dict[str, Any]) -> dict[str, Any]:
        """For ``swarmd export``: every stage's weights from its shards, written to our state directory."""
        if self.trainer is None:
            raise SwarmdError("this daemon does not train; export from the state directory as it is")
        return {"run_id": self.run_id, "versions": await self.trainer.gather_weights()}

    def peers(self, request: dict[str, Any]) -> dict[str, Any]:
        now = time.time()
        return {"run_id": self.run_id, "peers": self.membership.snapshot(now) if self.membership is not None else []}

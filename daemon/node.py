"""One daemon: joins a run's swarm, keeps its membership fresh, and answers its owner.

The services of a node run as tasks on one asyncio loop; the hivemind DHT has its own process
and py-libp2p (LAN discovery) its own trio thread. Nothing here blocks the loop: DHT calls
return futures, torch work runs in a worker thread. ``stop()`` is bounded by the config's
``stop_timeout_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from swarmd import __version__, service
from swarmd.children import LivenessPipe
from swarmd.config import Config
from swarmd.control import SOCKET_FILENAME, ControlServer
from swarmd.device import describe_device, measure_throughput_gflops, resolve_device
from swarmd.errors import AlreadyRunningError, JoinError, RecordError, RunSpecError, SwarmdError
from swarmd.lan_process import LanDiscoveryProcess
from swarmd.peers.heartbeat import Device, Heartbeat, parse_heartbeat
from swarmd.peers.identity import Identity, load_or_create_identity, write_p2pd_identity
from swarmd.peers.membership import Membership
from swarmd.peers.run_spec import SignedRunSpec, check_run_id, verify_run_spec
from swarmd.peers.swarm_dht import SPEC_TTL_S, BootstrapError, SwarmDHT

logger = logging.getLogger(__name__)

RUNS_DIRNAME = "runs"
# How long the last ("leaving") heartbeat may take to reach the DHT during shutdown.
LEAVE_ANNOUNCE_TIMEOUT_S = 3.0
RTT_PROBE_TIMEOUT_S = 2.0


def prepare_state_dir(path: Path) -> Path:
    """Create the state directory (0700) or check that an existing one is ours alone."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as e:
        raise SwarmdError(f"cannot create state directory {path}: {e.strerror}; set [node] state_dir") from None
    if not os.access(path, os.W_OK):
        raise SwarmdError(f"state directory {path} is not writable by this user; fix its owner or set [node] state_dir")
    return path


def spec_cache_path(state_dir: Path, run_id: str) -> Path:
    return state_dir / RUNS_DIRNAME / f"{run_id}.spec"


def save_spec(state_dir: Path, signed: SignedRunSpec) -> Path:
    path = spec_cache_path(state_dir, signed.run_id)
    path.parent.mkdir(mode=0o700, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_bytes(signed.raw)
    os.replace(tmp, path)
    return path


def load_cached_spec(state_dir: Path, run_id: str) -> SignedRunSpec | None:
    """A spec cached by an earlier join or by ``run create``; re-verified, never trusted blindly."""
    path = spec_cache_path(state_dir, run_id)
    if not path.exists():
        return None
    try:
        return verify_run_spec(path.read_bytes(), run_id)
    except RunSpecError as e:
        logger.warning("Ignoring the cached spec %s: %s", path, e)
        return None


class StateDirLock:
    """One daemon per state directory: two on one identity would fight over the same peer ID."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / "lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise AlreadyRunningError(
                f"another swarmd (pid {holder}) uses state directory {self.path.parent}; stop it, or give this "
                "one its own [node] state_dir"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class Node:
    def __init__(self, config: Config, run_id: str) -> None:
        self.config = config
        self.run_id = check_run_id(run_id)
        self.state_dir = prepare_state_dir(config.node.state_path)
        self.identity: Identity | None = None
        self.spec: SignedRunSpec | None = None
        self.dht: SwarmDHT | None = None
        self.lan: LanDiscoveryProcess | None = None  # when mDNS is on
        self.membership: Membership | None = None
        self.device = Device(kind="cpu", name="unknown", memory_bytes=0, cpus=1)
        self.throughput_gflops = 0.0
        self.roles = ["worker"]
        self.state = "starting"
        self.started_at = time.time()
        self.rejected_records = 0
        self.addrs: list[str] = []  # the DHT's visible multiaddrs, cached: asking is a blocking call
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._lock = StateDirLock(self.state_dir)
        self._liveness = LivenessPipe()
        self._control = ControlServer(self.state_dir / SOCKET_FILENAME, {"status": self.status, "peers": self.peers})
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
        try:
            await self._start()
            service.notify_ready(f"member of {self.run_id}")
            self.state = "running"
            logger.info("Running as %s in run %s", self.identity.peer_id if self.identity else "?", self.run_id)
            await self._stop.wait()
            return self._exit_code
        finally:
            await self._shutdown()
            self._lock.release()

    async def _start(self) -> None:
        self.identity = load_or_create_identity(self.state_dir)
        self.membership = Membership(self.identity.peer_id)
        await self._control.start()
        self.state = "joining"
        cfg = self.config.swarm
        self.dht = SwarmDHT(
            self.run_id,
            identity_path=str(write_p2pd_identity(self.identity, self.state_dir)),
            initial_peers=cfg.initial_peers,
            host_maddrs=cfg.host_maddrs,
            announce_maddrs=cfg.announce_maddrs,
            nat_port_map=cfg.nat_port_map,
            relay=cfg.relay,
            child_init=self._liveness.watch_in_child,
        )
        # The DHT forks before torch starts threads: fork after that is unsafe.
        await self._start_dht()
        self.addrs = await asyncio.to_thread(self.dht.visible_maddrs)
        logger.info("DHT listening on %s", " ".join(self.addrs))
        if cfg.mdns:
            await self._start_lan()
        device_task = asyncio.create_task(self._measure_device())
        self.spec = await self._join()
        await device_task
        self._spawn(self._heartbeat_loop, self._member_loop, self._rtt_loop, self._spec_loop, self._watchdog_loop)

    async def _start_dht(self) -> None:
        """Start the DHT; while no initial peer answers, retry with capped backoff until the join timeout."""
        assert self.dht is not None
        timeout = self.config.swarm.join_timeout_s
        deadline, delay = time.monotonic() + timeout, 1.0
        while True:
            try:
                await asyncio.to_thread(self.dht.start)
                return
            except BootstrapError as e:
                if time.monotonic() + delay > deadline or self._stop.is_set():
                    raise JoinError(f"cannot join run {self.run_id} within {timeout:.0f} s: {e}") from None
                logger.warning("%s; retrying in %.0f s", e, delay)
                await self._sleep_or_stop(delay)
                delay = min(delay * 2, 30.0)

    async def _start_lan(self) -> None:
        self.lan = LanDiscoveryProcess(self.state_dir, self.run_id, self.config.swarm.lan_maddr, self._on_lan_hello)
        await self.lan.start()
        # Answer hellos from the start: a LAN peer greets us once a minute at most.
        self.lan.set_hello(self._sign_heartbeat()[0])
        logger.info("LAN discovery (mDNS) on %s", " ".join(self.lan.listen_maddrs))

    async def _shutdown(self) -> None:
        self.state = "stopping"
        service.notify_stopping()
        budget = self.config.node.stop_timeout_s
        try:
            await asyncio.wait_for(self._leave(), budget)
        except TimeoutError:
            logger.warning("Shutdown took over [node] stop_timeout_s = %.0f s; exiting anyway", budget)
        if self.dht is not None:
            self.dht.shutdown()

    async def _leave(self) -> None:
        if self.dht is not None and self.dht.is_alive() and self.spec is not None:
            with contextlib.suppress(Exception):
                raw, expires_at = self._sign_heartbeat(leaving=True)
                await asyncio.wait_for(
                    self.dht.publish_heartbeat(self.identity_peer_id, raw, expires_at),
                    LEAVE_ANNOUNCE_TIMEOUT_S,
                )
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.lan is not None:
            await self.lan.stop()
        await self._control.stop()

    def _spawn(self, *loops: Callable[[], Awaitable[None]]) -> None:
        for loop_fn in loops:
            task = asyncio.create_task(self._guarded(loop_fn), name=loop_fn.__name__)
            self._tasks.append(task)

    async def _guarded(self, loop_fn: Callable[[], Awaitable[None]]) -> None:
        """A service loop that dies takes the daemon down with it (systemd restarts us)."""
        try:
            await loop_fn()
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("Service %s failed; stopping the daemon", loop_fn.__name__)
            self.request_stop(exit_code=1)

    async def _sleep_or_stop(self, seconds: float) -> bool:
        """Sleep ``seconds``; True when the node was asked to stop meanwhile."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)
        return self._stop.is_set()

    # --- joining ---------------------------------------------------------------------------

    async def _join(self) -> SignedRunSpec:
        """Find the run's spec: from the local cache (the creator's, or an earlier join), else the DHT."""
        assert self.dht is not None
        cached = load_cached_spec(self.state_dir, self.run_id)
        if cached is not None:
            logger.info(
                "Serving the spec of run %s from %s",
                self.run_id,
                spec_cache_path(self.state_dir, self.run_id),
            )
            await self._publish_spec(cached)
            return cached
        timeout = self.config.swarm.join_timeout_s
        deadline, delay = time.monotonic() + timeout, 0.5
        while True:
            spec = await self.dht.fetch_spec()
            if spec is not None:
                save_spec(self.state_dir, spec)
                logger.info(
                    "Joined run %s (model %s, created by %s)",
                    self.run_id,
                    spec.spec.model.family,
                    spec.creator,
                )
                return spec
            if time.monotonic() + delay > deadline or self._stop.is_set():
                break
            await self._sleep_or_stop(delay)
            delay = min(delay * 2, 5.0)
        known = await self.dht.known_peers()
        if not self.config.swarm.initial_peers and not self.config.swarm.mdns:
            hint = "no --initial-peers were given and mDNS is off; pass the address of a peer in the run"
        elif known == 0:
            hint = (f"none of the initial peers answered ({', '.join(self.config.swarm.initial_peers) or 'none given'})"
                    "; check the addresses and that those daemons run")  # fmt: skip
        else:
            hint = f"{known} peer(s) answered but none serves this run; check the run ID"
        raise JoinError(f"run {self.run_id} is not served by any peer after {timeout:.0f} s: {hint}")

    async def _publish_spec(self, spec: SignedRunSpec) -> None:
        assert self.dht is not None
        if not await self.dht.publish_spec(spec.raw):
            logger.debug("Spec of run %s is stored only locally for now (no other DHT node yet)", self.run_id)

    async def _measure_device(self) -> None:
        cfg = self.config.compute
        device = await asyncio.to_thread(resolve_device, cfg.device)
        self.device = await asyncio.to_thread(describe_device, device)
        if cfg.benchmark:
            self.throughput_gflops = await asyncio.to_thread(measure_throughput_gflops, device)

    # --- service loops ---------------------------------------------------------------------

    @property
    def identity_peer_id(self) -> str:
        assert self.identity is not None
        return self.identity.peer_id

    def _sign_heartbeat(self, leaving: bool = False) -> tuple[bytes, float]:
        assert self.identity is not None and self.dht is not None
        now = time.time()
        expires_at = now + (LEAVE_ANNOUNCE_TIMEOUT_S * 10 if leaving else self.config.heartbeat.ttl_s)
        heartbeat = Heartbeat(
            run_id=self.run_id,
            peer_id=self.identity.peer_id,
            issued_at=now,
            expires_at=expires_at,
            addrs=self.addrs,
            lan_addrs=self.lan.listen_maddrs if self.lan is not None else [],
            device=self.device,
            throughput_gflops=self.throughput_gflops,
            version=__version__,
            roles=self.roles,
            uptime_s=now - self.started_at,
            leaving=leaving,
        )
        return heartbeat.sign(self.identity), expires_at

    async def _heartbeat_loop(self) -> None:
        assert self.dht is not None
        while True:
            self.addrs = await asyncio.to_thread(self.dht.visible_maddrs)
            raw, expires_at = self._sign_heartbeat()
            if self.lan is not None:
                self.lan.set_hello(raw)
            if not await self.dht.publish_heartbeat(self.identity_peer_id, raw, expires_at):
                logger.debug("Heartbeat stored only locally (no other DHT node accepted it yet)")
            if await self._sleep_or_stop(self.config.heartbeat.interval_s):
                return

    async def _member_loop(self) -> None:
        assert self.dht is not None and self.membership is not None
        while True:
            scan = await self.dht.scan_members(time.time())
            self.rejected_records += scan.rejected
            self.membership.update(scan.live, scan.leaving, time.time())
            if await self._sleep_or_stop(min(self.config.heartbeat.interval_s, 5.0)):
                return

    async def _rtt_loop(self) -> None:
        assert self.dht is not None and self.membership is not None
        while True:
            peer_ids = list(self.membership.peers)

            async def probe(peer_id: str) -> None:
                assert self.dht is not None and self.membership is not None
                with contextlib.suppress(Exception):
                    rtt = await asyncio.wait_for(self.dht.ping(peer_id), RTT_PROBE_TIMEOUT_S)
                    self.membership.record_rtt(peer_id, rtt)

            await asyncio.gather(*(probe(p) for p in peer_ids))
            if await self._sleep_or_stop(max(self.config.heartbeat.interval_s, 2.0)):
                return

    async def _spec_loop(self) -> None:
        """Every member keeps the run's spec alive in the DHT: the run outlives its creator."""
        assert self.spec is not None
        while not await self._sleep_or_stop(SPEC_TTL_S / 4):
            await self._publish_spec(self.spec)

    async def _watchdog_loop(self) -> None:
        interval = service.watchdog_interval_s()
        while True:
            if self.dht is not None and not self.dht.is_alive():
                logger.error("The DHT process died; stopping so that the service manager restarts swarmd")
                self.request_stop(exit_code=1)
                return
            if interval is not None:
                service.notify_watchdog()
            if await self._sleep_or_stop(interval or 2.0):
                return

    def _on_lan_hello(self, peer_id: str, payload: bytes) -> None:
        """A peer found on the LAN sent its heartbeat: if it is of our run, reach it through the DHT."""
        try:
            heartbeat = parse_heartbeat(payload, run_id=self.run_id, now=time.time(), peer_id=peer_id)
        except RecordError as e:
            logger.debug("Ignoring LAN peer %s: %s", peer_id, e)
            return
        if self.dht is not None and heartbeat.addrs:
            logger.info("Found %s on the LAN; connecting its DHT node", peer_id)
            task = asyncio.ensure_future(self.dht.add_peers(heartbeat.addrs))
            # Best effort (failures are logged inside); retrieve the outcome so none goes unobserved.
            task.add_done_callback(lambda t: t.cancelled() or t.exception())

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
            "run": None if spec is None else {
                "name": spec.name, "model": spec.model.family, "layers": spec.model.layers,
                "hidden": spec.model.hidden, "stages": spec.stages,
                "creator": self.spec.creator if self.spec else None,
            },
            "roles": self.roles,
            "uptime_s": round(now - self.started_at, 1),
            "addrs": self.addrs,
            "lan_addrs": self.lan.listen_maddrs if self.lan is not None else [],
            "device": {"kind": self.device.kind, "name": self.device.name, "memory_bytes": self.device.memory_bytes},
            "throughput_gflops": round(self.throughput_gflops, 1),
            "rejected_records": self.rejected_records,
            "peers": self.membership.snapshot(now) if self.membership is not None else [],
        }  # fmt: skip

    def peers(self, request: dict[str, Any]) -> dict[str, Any]:
        now = time.time()
        return {
            "run_id": self.run_id,
            "peers": self.membership.snapshot(now) if self.membership is not None else [],
        }

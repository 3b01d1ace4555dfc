"""The daemon's configuration: one TOML file, one dataclass per section, CLI flags on top.

Each field's docstring says what it is; ``__post_init__`` checks ranges and names the value
and the limit. The example file ``packaging/config.example.toml`` documents every key.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from swarmd.errors import ConfigError, MalformedRunId
from swarmd.peers.records.heartbeat import MAX_TTL_S
from swarmd.peers.records.join_token import MAX_TOKEN_CHARS, is_token_text
from swarmd.peers.records.run_id import check_run_id
from swarmd.peers.wire.relay_modes import MODES as RELAY_MODES
from swarmd.system.log_format import FORMATS as LOG_FORMATS

DEFAULT_STATE_DIR = "~/.local/state/swarmd"
LOG_LEVELS = ("debug", "info", "warning", "error")
MIN_TRAINING_MBIT_S = 4.0
"""The lowest bandwidth cap: peers cut off a request whose blobs arrive under 2 Mbit/s
(``swarmd.peers.wire.framing.MIN_RATE_Bps``), so a cap must leave room above it."""
LOOPBACK_HOSTS = ("127.0.0.1", "::1", "localhost")
PRECISIONS = ("auto", "bf16", "fp32")
"""``[compute] precision``'s choices: ``swarmd.models.precision.PRECISIONS`` (a test ties the two),
not imported from there, which would load torch with every command."""


def _check_range(section: str, name: str, value: float, lo: float, hi: float) -> None:
    if not lo <= value <= hi:
        raise ConfigError(f"[{section}] {name} = {value} is outside the allowed range [{lo}, {hi}]")


@dataclass(kw_only=True)
class NodeConfig:
    state_dir: str = DEFAULT_STATE_DIR
    """Identity key, control socket and cached run specs live here (mode 0700)."""
    log_level: str = "info"
    """debug, info, warning or error."""
    log_format: str = "text"
    """text (with syslog priorities when systemd's journal reads it) or json (one object a line)."""
    stop_timeout_s: float = 30.0
    """How long a SIGTERM may take before the daemon exits anyway."""

    def __post_init__(self) -> None:
        if self.log_level not in LOG_LEVELS:
            raise ConfigError(f"[node] log_level = {self.log_level!r} is not one of {', '.join(LOG_LEVELS)}")
        if self.log_format not in LOG_FORMATS:
            raise ConfigError(f"[node] log_format = {self.log_format!r} is not one of {', '.join(LOG_FORMATS)}")
        _check_range("node", "stop_timeout_s", self.stop_timeout_s, 1, 600)

    @property
    def state_path(self) -> Path:
        return Path(self.state_dir).expanduser()


@dataclass(kw_only=True)
class SwarmConfig:
    run_id: str = ""
    """The run to join; ``swarmd run --run-id`` overrides."""
    initial_peers: list[str] = field(default_factory=list)
    """Multiaddrs of peers already in the swarm."""
    host_maddrs: list[str] = field(default_factory=lambda: ["/ip4/0.0.0.0/tcp/31337"])
    """Where the DHT's libp2p daemon listens."""
    announce_maddrs: list[str] = field(default_factory=list)
    """Public addresses to announce when behind port forwarding."""
    lan_maddr: str = "/ip4/0.0.0.0/tcp/0"
    """Where the py-libp2p host for LAN discovery listens."""
    mdns: bool = True
    """Find peers of the same run on the LAN with mDNS."""
    nat_port_map: bool = True
    """Ask the router for a port mapping (UPnP / NAT-PMP)."""
    relay: bool = True
    """Allow reaching and being reached through libp2p circuit relays."""
    data_via_relay: str = "auto"
    """How our cells' requests reach their neighbours and the shard servers: "auto" (direct, through an elected
    relay when the direct path does not open or the relay path is measured faster),
    "always" (through a relay whenever the plan names one: outbound connections filtered) or
    "never"."""
    join_timeout_s: float = 60.0
    """Give up when no peer serves the run spec within this time."""
    join_token: str = ""
    """This peer's join token for a private run, as the run's creator printed it with
    ``swarmd run token``; ``swarmd run --join-token`` overrides."""

    def __post_init__(self) -> None:
        if self.run_id:
            try:
                check_run_id(self.run_id)
            except MalformedRunId as e:
                raise MalformedRunId(f"[swarm] run_id: {e}") from None
        _check_range("swarm", "join_timeout_s", self.join_timeout_s, 1, 3600)
        for name in ("initial_peers", "host_maddrs", "announce_maddrs"):
            for maddr in getattr(self, name):
                _check_maddr(f"[swarm] {name}", maddr)
        _check_maddr("[swarm] lan_maddr", self.lan_maddr)
        if self.data_via_relay not in RELAY_MODES:
            raise ConfigError(
                f"[swarm] data_via_relay = {self.data_via_relay!r} is not one of {', '.join(map(repr, RELAY_MODES))}"
            )
        if not self.host_maddrs:
            raise ConfigError("[swarm] host_maddrs is empty; give at least one address to listen on")
        if self.join_token and not is_token_text(self.join_token):
            raise ConfigError(
                f"[swarm] join_token is not a join token ({len(self.join_token)} characters; a token is base64 "
                f"text of at most {MAX_TOKEN_CHARS}): pass it exactly as 'swarmd run token' printed it"
            )


@dataclass(kw_only=True)
class HeartbeatConfig:
    interval_s: float = 15.0
    """How often this peer re-publishes its signed heartbeat."""
    ttl_s: float = 60.0
    """How long a heartbeat stays valid; peers silent longer are dropped."""

    def __post_init__(self) -> None:
        _check_range("heartbeat", "interval_s", self.interval_s, 0.2, 600)
        # Readers refuse longer-lived heartbeats (a flood of one-off keys must age out soon).
        _check_range("heartbeat", "ttl_s", self.ttl_s, 1, MAX_TTL_S - 1)
        if self.ttl_s < 2 * self.interval_s:
            raise ConfigError(
                f"[heartbeat] ttl_s = {self.ttl_s} is under twice interval_s = {self.interval_s}: one lost "
                "heartbeat would drop this peer; raise ttl_s or lower interval_s"
            )


@dataclass(kw_only=True)
class ComputeConfig:
    device: str = "auto"
    """auto, cpu, cuda or cuda:N."""
    benchmark: bool = True
    """Measure matmul throughput at start (published in heartbeats)."""
    train: bool = True
    """Work cells of the plan and serve shards when elected to."""
    precision: str = "auto"
    """The cells' autocast dtype: auto (bf16 on a GPU that has it, fp32 on the CPU), bf16 or fp32."""
    compile: bool = False
    """torch.compile the stages' layers (off until measured faster; eager if compiling fails)."""

    def __post_init__(self) -> None:
        if self.device not in ("auto", "cpu", "cuda") and not (
            self.device.startswith("cuda:") and self.device[5:].isdigit()
        ):
            raise ConfigError(f"[compute] device = {self.device!r} is not auto, cpu, cuda or cuda:N")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"[compute] precision = {self.precision!r} is not one of {', '.join(PRECISIONS)}")


@dataclass(kw_only=True)
class ProbesConfig:
    interval_s: float = 300.0
    """Each peer that matters is probed (RTT and bandwidth) at most this often."""
    bytes_per_hour: int = 64 * 1024 * 1024
    """Bandwidth probes send at most this much per hour in all (a metered link stays cheap)."""
    probe_bytes: int = 256 * 1024
    """Bytes one bandwidth probe sends."""
    max_peers: int = 32
    """Peers probed per round at most."""

    def __post_init__(self) -> None:
        _check_range("probes", "interval_s", self.interval_s, 1, 86400)
        _check_range("probes", "bytes_per_hour", self.bytes_per_hour, 0, 1 << 40)
        _check_range("probes", "probe_bytes", self.probe_bytes, 16 * 1024, 1024 * 1024)
        _check_range("probes", "max_peers", self.max_peers, 1, 1024)


@dataclass(kw_only=True)
class RolesConfig:
    min_reliability: float = 0.5
    """A shard server, standby or coordinator needs at least this measured reliability
    (0..1, swarmd.peers.membership.reliability); an incumbent keeps its role down to this minus hysteresis."""
    min_relay_reliability: float = 0.6
    """What a relay needs (it forwards others' tensors: a little more than a server)."""
    min_connectivity_Bps: float = 1e6
    """Median measured bandwidth to the others that a role needs, bytes/s."""
    hysteresis: float = 0.1
    """How far below the thresholds an incumbent may drift before it loses its role."""

    def __post_init__(self) -> None:
        _check_range("roles", "min_reliability", self.min_reliability, 0, 1)
        _check_range("roles", "min_relay_reliability", self.min_relay_reliability, 0, 1)
        _check_range("roles", "min_connectivity_Bps", self.min_connectivity_Bps, 0, 1e12)
        _check_range("roles", "hysteresis", self.hysteresis, 0, 0.5)


MAX_LIST = 64
_WINDOW = re.compile(r"([01]?\d|2[0-3]):([0-5]\d)-([01]?\d|2[0-3]|24):([0-5]\d)")


@dataclass(frozen=True)
class Window:
    """Minutes of the day [start, end); one that ends at or before its start spans midnight."""

    start: int
    end: int

    def holds(self, minute: int) -> bool:
        if self.start < self.end:
            return self.start <= minute < self.end
        return minute >= self.start or minute < self.end


def parse_window(text: str) -> Window:
    """``"22:00-07:30"``; ValueError saying the form otherwise."""
    found = _WINDOW.fullmatch(text.strip())
    if found is None:
        raise ValueError(f'time window {text!r} is not HH:MM-HH:MM (for example "22:00-07:00")')
    h1, m1, h2, m2 = (int(g) for g in found.groups())
    start, end = h1 * 60 + m1, min(24 * 60, h2 * 60 + m2)  # "24:00": the end of the day
    if start == end:
        raise ValueError(f"time window {text!r} is empty; leave [limits] windows empty to train at any time")
    return Window(start, end)


@dataclass(kw_only=True)
class LimitsConfig:
    windows: list[str] = field(default_factory=list)
    """Times of day, local time, this peer may train in: "HH:MM-HH:MM" each (one that ends before
    it starts spans midnight, e.g. "22:00-07:00"); outside them it pauses. Empty: any time."""
    pause_on_battery: bool = True
    """Pause while the machine runs on battery (a battery present, no mains power)."""
    pause_while: list[str] = field(default_factory=list)
    """Program names, as the process list shows them (e.g. "steam", "blender"): pause while one runs."""
    pause_while_in_use: bool = False
    """Pause while the owner uses the machine: keyboard or mouse input within ``in_use_idle_s``
    (as the login sessions or terminals show it)."""
    in_use_idle_s: float = 180.0
    """How long without input before the machine counts as not in use."""
    pause_while_gpu_used: bool = True
    """Pause while another process computes on this peer's GPU (seen through NVML)."""
    cpu_share: float = 1.0
    """The fraction of what compute runs on that swarmd may use, in (0, 1]. On a CPU: of the
    compute's cores (``torch_threads``), every swarmd process's CPU time counted (the daemon, its
    DHT process, p2pd); on a GPU: of the time compute runs. 0.5: at most half."""
    torch_threads: int = 0
    """torch threads for compute (0: torch's default, one per core)."""
    gpu_memory_gib: float = 0.0
    """The most GPU memory this peer's compute may hold, in GiB (0: no cap)."""
    upload_mbit_s: float = 0.0
    """Training traffic sent, at most this many Mbit/s (0: no cap). The DHT's small records are not counted."""
    download_mbit_s: float = 0.0
    """Training traffic received, at most this many Mbit/s (0: no cap)."""
    daily_transfer_gib: float = 0.0
    """Training traffic sent and received per local day, in GiB; past it the peer pauses until
    midnight (0: no cap)."""
    data_cache_gib: float = 8.0
    """Disk for the run's token shards fetched from other peers or mirrors, in GiB; the least
    recently used are deleted past it. Files in ``[data] dirs`` are not counted (nor deleted)."""

    @cached_property
    def time_windows(self) -> tuple[Window, ...]:
        """``windows`` parsed (once: ``__post_init__`` parses them to check them)."""
        return tuple(parse_window(str(text)) for text in self.windows)

    def __post_init__(self) -> None:
        _check_range("limits", "in_use_idle_s", self.in_use_idle_s, 10, 86400)
        if not 0 < self.cpu_share <= 1:
            raise ConfigError(
                f"[limits] cpu_share = {self.cpu_share} must be in (0, 1] (0.5: at most half of what it computes on)"
            )
        if isinstance(self.torch_threads, bool) or not 0 <= self.torch_threads <= 1024:
            raise ConfigError(f"[limits] torch_threads = {self.torch_threads!r} must be in [0, 1024] (0: one per core)")
        _check_range("limits", "gpu_memory_gib", self.gpu_memory_gib, 0, 4096)
        _check_range("limits", "upload_mbit_s", self.upload_mbit_s, 0, 1e6)
        _check_range("limits", "download_mbit_s", self.download_mbit_s, 0, 1e6)
        _check_range("limits", "daily_transfer_gib", self.daily_transfer_gib, 0, 1e6)
        if not 0 < self.data_cache_gib <= 1e6:
            raise ConfigError(
                f"[limits] data_cache_gib = {self.data_cache_gib} must be in (0, 1e6]: a peer without its run's "
                "data fetches the shards its work needs into this much disk"
            )
        for name in ("upload_mbit_s", "download_mbit_s"):
            rate = getattr(self, name)
            if 0 < rate < MIN_TRAINING_MBIT_S:
                raise ConfigError(
                    f"[limits] {name} = {rate} is under {MIN_TRAINING_MBIT_S} Mbit/s, the least a peer can train "
                    f"over (peers cut off a request slower than that); use 0 for no cap, or pause instead"
                )

        if len(self.windows) > MAX_LIST or len(self.pause_while) > MAX_LIST:
            raise ConfigError(f"[limits] windows and pause_while take at most {MAX_LIST} entries each")
        try:
            self.time_windows  # noqa: B018 (parsed and kept: the check is the parse)
        except ValueError as e:
            raise ConfigError(f"[limits] windows: {e}") from None
        for name in self.pause_while:
            if not isinstance(name, str) or not 0 < len(name) <= 64:
                raise ConfigError(f"[limits] pause_while: {name!r} is not a program name of 1 to 64 characters")


MAX_DATA_DIRS = 64


@dataclass(kw_only=True)
class DataConfig:
    dirs: list[str] = field(default_factory=list)
    """Folders this peer holds a run's files in: prepared datasets (``swarmd data prepare``'s
    output, found by their manifest), tokenizers, and checkpoints a run starts from. Each file
    is checked against the digest the run pins before it is used; a file not found here is
    fetched from the manifest's sources or from the members that hold it."""

    def __post_init__(self) -> None:
        if len(self.dirs) > MAX_DATA_DIRS:
            raise ConfigError(f"[data] dirs names {len(self.dirs)} folders, over {MAX_DATA_DIRS}")
        for folder in self.dirs:
            if not isinstance(folder, str) or not folder:
                raise ConfigError(f"[data] dirs: {folder!r} is not a folder path")

    @property
    def paths(self) -> list[Path]:
        return [Path(d).expanduser() for d in self.dirs]


@dataclass(kw_only=True)
class DashboardConfig:
    listen: str = ""
    """Serve the dashboard and Prometheus metrics at this host:port, e.g. "127.0.0.1:9470" (port
    0: any free port; ``swarmd status`` names it). Empty: off. Only this machine may connect."""

    def __post_init__(self) -> None:
        if self.listen:
            host, _, port = self.listen.rpartition(":")
            host = host.strip("[]")
            if host not in LOOPBACK_HOSTS or not port.isdigit() or int(port) > 65535:
                raise ConfigError(
                    f'[dashboard] listen = {self.listen!r} is not a loopback host:port such as "127.0.0.1:9470"; '
                    "the dashboard is for this machine only (reach it from elsewhere through an SSH tunnel)"
                )

    @property
    def address(self) -> tuple[str, int]:
        host, _, port = self.listen.rpartition(":")
        return host.strip("[]"), int(port)


@dataclass(kw_only=True)
class Config:
    node: NodeConfig = field(default_factory=NodeConfig)
    swarm: SwarmConfig = field(default_factory=SwarmConfig)
    heartbeat: HeartbeatConfig = field(default_factory=HeartbeatConfig)
    compute: ComputeConfig = field(default_factory=ComputeConfig)
    probes: ProbesConfig = field(default_factory=ProbesConfig)
    roles: RolesConfig = field(default_factory=RolesConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    data: DataConfig = field(default_factory=DataConfig)
    dashboard: DashboardConfig = field(default_factory=DashboardConfig)


def _check_maddr(where: str, maddr: object) -> None:
    from multiaddr import Multiaddr  # deferred: keeps `swarmd --help` fast

    if not isinstance(maddr, str):
        raise ConfigError(f"{where}: {maddr!r} is not a string multiaddr")
    try:
        Multiaddr(maddr)
    except Exception as e:
        raise ConfigError(
            f"{where}: {maddr!r} is not a valid multiaddr ({e}); e.g. /ip4/1.2.3.4/tcp/31337/p2p/12D3…"
        ) from None


_SECTIONS: dict[str, type] = {
    "node": NodeConfig,
    "swarm": SwarmConfig,
    "heartbeat": HeartbeatConfig,
    "compute": ComputeConfig,
    "probes": ProbesConfig,
    "roles": RolesConfig,
    "limits": LimitsConfig,
    "data": DataConfig,
    "dashboard": DashboardConfig,
}


def _field_type(f: dataclasses.Field[Any]) -> type:
    """The Python type of a field's default: what a TOML value for it must be."""
    factory = f.default_factory
    return type(factory() if callable(factory) else f.default)


def _build_section(name: str, cls: type, values: Any, source: str) -> Any:
    if not isinstance(values, dict):
        raise ConfigError(f"{source}: [{name}] must be a table")
    values = dict(values)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key, value in values.items():
        if key not in fields:
            raise ConfigError(f"{source}: [{name}] has unknown key {key!r}; known keys: {', '.join(fields)}")
        expected = _field_type(fields[key])
        ok = isinstance(value, expected) and not (isinstance(value, bool) and expected is not bool)
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            ok, values[key] = True, float(value)
        if not ok:
            raise ConfigError(
                f"{source}: [{name}] {key} = {value!r} should be a {expected.__name__}, not {type(value).__name__}"
            )
    return cls(**values)


def config_from_dict(data: dict[str, Any], source: str = "config") -> Config:
    unknown = set(data) - set(_SECTIONS)
    if unknown:
        raise ConfigError(f"{source}: unknown section(s) {sorted(unknown)}; known: {', '.join(_SECTIONS)}")
    return Config(**{name: _build_section(name, cls, data.get(name, {}), source) for name, cls in _SECTIONS.items()})


ENV_PREFIX = "SWARMD_"


def env_overrides(environ: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """``SWARMD_<SECTION>_<KEY>=value`` as config entries (a container is configured this way):
    ``SWARMD_SWARM_RUN_ID=name.hash``, ``SWARMD_SWARM_INITIAL_PEERS='["/ip4/..."]'``. A value is
    read as a TOML value (numbers, booleans, arrays, quoted strings), else taken as a string.
    Variables whose first word is no section (``SWARMD_CONFIG``, the installer's) are not keys."""
    found: dict[str, dict[str, Any]] = {}
    for name, text in environ.items():
        section, _, key = name[len(ENV_PREFIX) :].lower().partition("_")
        if not name.startswith(ENV_PREFIX) or section not in _SECTIONS:
            continue
        try:
            value: Any = tomllib.loads(f"v = {text}")["v"]
        except tomllib.TOMLDecodeError:
            value = text
        found.setdefault(section, {})[key] = value
    return found


def load_config(path: Path | None, environ: Mapping[str, str] | None = None) -> Config:
    """Read ``path`` (None: all defaults), then the ``SWARMD_<SECTION>_<KEY>`` environment
    variables over it. Errors name the file or variable, the key and the fix."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist; copy packaging/config.example.toml there") from None
        except OSError as e:
            raise ConfigError(f"cannot read config file {path}: {e.strerror}") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise ConfigError(f"config file {path} is not valid TOML: {e}") from None
    overrides = env_overrides(os.environ if environ is None else environ)
    for section, values in overrides.items():
        if not isinstance(data.get(section, {}), dict):
            raise ConfigError(f"config file {path}: [{section}] is not a table")
        data[section] = {**data.get(section, {}), **values}
    source = str(path) if path is not None else "config"
    return config_from_dict(data, source + (" with SWARMD_* variables" if overrides else ""))

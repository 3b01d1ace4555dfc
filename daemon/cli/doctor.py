"""``swarmd doctor``: can this machine join its run, and what to fix if not.

Each check prints ``pass``, ``warn`` or ``fail`` with what it found and, when it is not a pass,
the fix. The exit code is 0 when the daemon can join (warnings allowed), 1 when a check
failed. Checks: the config and run ID, the state directory and identity key, torch and the
device it will use, the device's achieved TFLOPS at the run's shapes against its rated figure
(``swarmd.node.compute_probe``) and its free memory, a dry run of one cell of the run (the heaviest stage's forward and
backward on one micro-batch, its peak memory against the device's), and, when a daemon runs,
the swarm as it sees it: clock skew against the peers' heartbeats, whether peers reach this
daemon directly or through a relay, and whether peers run a newer swarmd.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swarmd.errors import SwarmdError
from swarmd.node.dial_back import scope, tcp_target

MAX_CLOCK_SKEW_S = 5.0
MEMORY_MODEL_TOLERANCE = 0.15
"""How far the cell memory model may miss the dry run's measured peak before doctor says so:
what its unit test holds it to on the CPU (``tests/unit/models/test_cell_memory.py``)."""
"""Heartbeats and leases are judged by their signer's clock: a few seconds of skew make a peer's
records look stale or from the future; NTP keeps clocks within milliseconds."""
MARK = {"pass": "pass", "warn": "WARN", "fail": "FAIL"}
Ask = Callable[[str], dict[str, Any]]
"""Sends a control command (``status``, ``dial_back``) to the running daemon; its answer."""


@dataclass
class Check:
    name: str
    outcome: str  # pass, warn or fail
    found: str
    fix: str = ""

    def line(self) -> str:
        text = f"{MARK[self.outcome]:<5} {self.name:<14} {self.found}"
        return text + (f"\n      {'':<14} fix: {self.fix}" if self.fix and self.outcome != "pass" else "")


@dataclass
class Context:
    """What the checks found so far, for the ones after them."""

    config: Any = None
    run_id: str = ""
    device: str = "cpu"
    memory_bytes: int = 0
    torch_ready: bool = False
    """torch imports and ``device`` is the one the config asks for."""
    status: dict[str, Any] | None = None


def check_config(ctx: Context, load: Callable[[], Any], run_id: str | None) -> list[Check]:
    from swarmd.peers.records.run_id import check_run_id

    try:
        ctx.config = load()
    except SwarmdError as e:
        return [
            Check("config", "fail", str(e), "correct the file or variable named; see packaging/config.example.toml")
        ]
    checks = [Check("config", "pass", "the config and SWARMD_* variables load")]
    ctx.run_id = run_id or ctx.config.swarm.run_id
    if not ctx.run_id:
        checks.append(Check("run ID", "fail", "no run to join", "pass --run-id NAME.HASH or set [swarm] run_id"))
        return checks
    try:
        check_run_id(ctx.run_id)
        checks.append(Check("run ID", "pass", ctx.run_id))
    except SwarmdError as e:
        checks.append(Check("run ID", "fail", str(e), "copy the run ID exactly as 'swarmd run create' printed it"))
    return checks


def check_state_dir(ctx: Context) -> list[Check]:
    from swarmd.peers.records.identity import KEY_FILENAME, load_or_create_identity

    path = ctx.config.node.state_path
    if not path.exists():
        return [Check("state dir", "warn", f"{path} does not exist yet", "the daemon creates it (mode 0700) on start")]
    st = path.stat()
    checks = []
    if st.st_uid != os.geteuid():
        checks.append(
            Check(
                "state dir",
                "fail",
                f"{path} belongs to uid {st.st_uid}, not this user ({os.geteuid()})",
                "run as its owner (sudo -u swarmd swarmd doctor) or chown it",
            )
        )
    elif st.st_mode & 0o077:
        checks.append(Check("state dir", "fail", f"{path} has mode {st.st_mode & 0o777:04o}", f"chmod 700 {path}"))
    else:
        checks.append(Check("state dir", "pass", f"{path} (0700, ours)"))
    key = path / KEY_FILENAME
    if not key.exists():
        checks.append(Check("identity", "warn", "no identity key yet", "the daemon makes one on its first start"))
        return checks
    try:
        identity = load_or_create_identity(path)
        checks.append(Check("identity", "pass", f"{identity.peer_id} ({key}, 0600)"))
    except SwarmdError as e:
        checks.append(Check("identity", "fail", str(e)))
    return checks


def check_torch(ctx: Context) -> list[Check]:
    try:
        import torch
    except ImportError as e:
        return [
            Check(
                "torch", "fail", f"cannot import torch ({e})", "reinstall: packaging/install.sh --torch cpu|cuda|rocm"
            )
        ]
    from swarmd.node.device import describe_device, resolve_device

    try:
        ctx.device = resolve_device(ctx.config.compute.device)
    except SwarmdError as e:
        return [Check("torch", "fail", str(e), 'set [compute] device = "auto" or "cpu"')]
    info = describe_device(ctx.device)
    ctx.memory_bytes, ctx.torch_ready = info.memory_bytes, True
    found = f"torch {torch.__version__} on {ctx.device}: {info.name}, {info.memory_bytes / 2**30:.1f} GiB"
    if ctx.device == "cpu" and _has_gpu_device_node():
        return [
            Check(
                "torch",
                "warn",
                found + "; this machine has a GPU torch does not use",
                "install a GPU build: packaging/install.sh --torch cuda (or rocm)",
            )
        ]
    return [Check("torch", "pass", found)]


def _has_gpu_device_node() -> bool:
    return Path("/dev/nvidia0").exists() or Path("/dev/kfd").exists()


def check_compute(ctx: Context) -> list[Check]:
    """The device probe, as the daemon runs it: the TFLOPS the cells' matmuls achieve at the run's
    block (a generic one when the run's spec is not here yet), of the rated figure, free memory."""
    from swarmd.node.compute_probe import probe_device
    from swarmd.node.device import describe_device
    from swarmd.node.rated_tflops import rated_tflops
    from swarmd.system.state_dir import load_cached_spec

    if not ctx.torch_ready:
        return []
    if ctx.device.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()  # what the dry run left cached is not in use: count it free
    spec = load_cached_spec(ctx.config.node.state_path, ctx.run_id) if ctx.run_id else None
    threads = ctx.config.limits.torch_threads
    try:
        probe = probe_device(ctx.device, ctx.config.compute, threads, spec.spec if spec is not None else None)
    except (SwarmdError, RuntimeError) as e:  # torch reports a device fault as a RuntimeError
        fix = "run doctor again; if it fails again, the device or its driver is at fault (nvidia-smi shows which)"
        return [Check("compute", "fail", f"the device probe failed on {ctx.device}: {e}", fix)]
    info = describe_device(ctx.device)
    name, rated = info.name, rated_tflops(info.name, info.kind)
    where = "the run's shapes" if probe.run_shapes else "a generic block (the run's spec is not here yet)"
    found = (
        f"{probe.achieved_tflops:.3g} TFLOPS achieved at {where}, {probe.dtype}, {probe.threads} thread(s)"
        + (f", {probe.achieved_tflops / rated:.1%} of {name}'s {rated:g} rated" if rated else ", no rated figure known")
        + f"; {probe.free_memory_bytes / 2**30:.1f} GiB free; probed in {probe.seconds:.1f} s"
    )
    share = ctx.config.limits.cpu_share
    if share < 1:
        found += f"; the planner is offered {probe.achieved_tflops * share:.3g} at cpu_share {share:g}"
    return [Check("compute", "pass", found)]


def check_cell_memory(ctx: Context) -> list[Check]:
    """One cell of the run, tried: the heaviest stage's forward and backward on one micro-batch."""
    from swarmd.system.state_dir import load_cached_spec

    spec = load_cached_spec(ctx.config.node.state_path, ctx.run_id) if ctx.run_id else None
    if spec is None:
        return [
            Check(
                "cell memory",
                "warn",
                "the run's spec is not here yet, so its cells are not known",
                "start the daemon once (it fetches the spec), then run doctor again",
            )
        ]
    peak, stage, predicted = _dry_run(spec.spec, ctx.device, ctx.config.compute.precision)
    found = (
        f"stage {stage} of {spec.spec.stages}: a cell's share of one micro-batch peaked at {peak / 2**20:.0f} MiB "
        f"(the memory model predicts {predicted / 2**20:.0f} MiB)"
    )
    if peak > 0 and abs(predicted - peak) > MEMORY_MODEL_TOLERANCE * peak:
        return [
            Check(
                "cell memory",
                "warn",
                found + f": {predicted / peak - 1:+.0%}, past the model's {MEMORY_MODEL_TOLERANCE:.0%}",
                "the planner sizes cells with that model, so it may place too much or too little here: "
                "report this line (with `swarmd doctor`'s torch line) as an issue",
            )
        ]
    if ctx.memory_bytes and peak > 0.9 * ctx.memory_bytes:
        return [
            Check(
                "cell memory",
                "fail",
                found + f" of {ctx.memory_bytes / 2**30:.1f} GiB",
                "free memory on the device, or join a run with smaller stages",
            )
        ]
    return [
        Check("cell memory", "pass", found + (f" of {ctx.memory_bytes / 2**30:.1f} GiB" if ctx.memory_bytes else ""))
    ]


def _dry_run(spec: Any, device: str, precision: str) -> tuple[int, int, float]:
    """A cell of the heaviest stage through one share of one micro-batch and its round's end,
    computing as the daemon's cells will (``device``, ``[compute] precision``): the peak of
    tensor memory it took, the stage, and what the cell memory model predicts."""
    import torch

    from swarmd.models.cell_compute import CellCompute
    from swarmd.models.cell_memory import BlockShape, CellLoad, cell_peak_bytes
    from swarmd.models.precision import ComputeSettings, resolve_precision
    from swarmd.models.stages import StageModule, split_layers

    settings = ComputeSettings(device=device, dtype=resolve_precision(precision, device))

    shape, stages = spec.model, spec.stages
    ranges = split_layers(shape.layers, stages)
    stage = 0 if stages == 1 else (stages - 1 if shape.vocab >= shape.hidden else 0)  # the head's stage
    module = StageModule.from_shape(shape, 0, ranges, stage)
    ids = torch.randint(0, shape.vocab, (spec.micro_batch, shape.seq_len), device=device)
    hidden = (spec.micro_batch, shape.seq_len, shape.hidden)
    load = CellLoad(
        first=stage == 0,
        last=module.is_last,
        micro_batch=spec.micro_batch,
        seq_len=shape.seq_len,
        precision=settings.dtype,
    )
    predicted = cell_peak_bytes(BlockShape.from_model_shape(shape), ranges[stage][1] - ranges[stage][0], load)

    def share() -> None:
        cell = CellCompute(module, mode="gradient", window=1, lr=0.0, settings=settings)
        x = ids if module.is_first else torch.randn(hidden, device=device)
        if module.is_last:
            cell.forward_backward_last(0, x, ids)
        else:
            cell.forward(0, x)
            cell.backward(0, torch.randn(hidden, device=device))
        cell.end_share()
        cell.contribution()

    return _peak_bytes(device, share, [*module.parameters(), *module.buffers(), ids]), stage, predicted


def _peak_bytes(device: str, run: Callable[[], None], held: list[Any]) -> int:
    """The most tensor bytes alive at once while ``run`` runs, ``held`` (tensors made before)
    included: CUDA's allocator counts them (``max_memory_allocated``); on CPU, ``TensorPeak``."""
    import torch

    if device.startswith("cuda"):
        where = torch.device(device)
        torch.cuda.synchronize(where)
        torch.cuda.reset_peak_memory_stats(where)
        before = torch.cuda.memory_allocated(where) - sum(t.nbytes for t in held if t.device == where)
        run()
        torch.cuda.synchronize(where)
        return int(torch.cuda.max_memory_allocated(where) - before)
    from swarmd.models.tensor_peak import TensorPeak

    with TensorPeak(held, device="cpu") as peak:
        run()
    return peak.peak


def check_swarm(ctx: Context, ask: Ask) -> list[Check]:
    """What a running daemon sees: clock skew, reachability, newer versions."""
    from swarmd import __version__
    from swarmd.peers.membership.versions import newer_in_swarm

    try:
        ctx.status = result = ask("status")
    except SwarmdError as e:
        return [
            Check(
                "daemon",
                "warn",
                f"no daemon answers ({e})",
                "start it (systemctl start swarmd, or swarmd run) to check clock, reachability and versions",
            )
        ]
    peers = result.get("peers") or []
    checks = [Check("daemon", "pass", f"{result.get('state')}, {len(peers)} peer(s) seen")]
    offsets = [p["clock_offset_s"] for p in peers if p.get("clock_offset_s") is not None]
    if offsets:
        # A heartbeat is read up to a heartbeat interval after it was signed, so a positive
        # offset is mostly its age; a negative one is the peers' clock ahead of ours. (Ours far
        # ahead would show no peers at all: their heartbeats would look expired.)
        offset = statistics.median(offsets)
        outcome = "fail" if offset < -MAX_CLOCK_SKEW_S else "pass"
        found = f"the peers' heartbeats were signed {offset:+.1f} s before we read them (median of {len(offsets)})"
        checks.append(Check("clock", outcome, found, "this clock is behind: enable NTP (timedatectl set-ntp true)"))
    checks.append(check_reachability(result, peers, ask))
    newer = newer_in_swarm(__version__, [str(p.get("version", "")) for p in peers])
    checks.append(
        Check("version", "warn", newer.warning(__version__), "upgrade: packaging/install.sh (or pip install -U swarmd)")
        if newer
        else Check("version", "pass", f"swarmd {__version__}, none newer among the peers")
    )
    return checks


def check_reachability(status: dict[str, Any], peers: list[Any], ask: Ask) -> Check:
    """Members dial this daemon back on fresh connections (``swarmd.node.dial_back``); without
    an answer, whether any peer's request reached it at all."""
    port = next((t[1] for t in map(tcp_target, status.get("addrs") or []) if t), None)
    fix = (
        f"open TCP port {port or 31337} in the firewall (e.g. ufw allow {port or 31337}/tcp) and forward it on "
        "the router, or set [swarm] announce_maddrs to the address the internet sees; until then peers reach "
        "this daemon through a relay"
    )
    if not peers:
        return Check("reachability", "warn", "no peer to ask yet", "run doctor again once the daemon sees peers")
    try:
        answers = ask("dial_back").get("answers") or []
    except SwarmdError as e:
        answers = [{"error": str(e)}]
    tried = [a for answer in answers for a in answer.get("addrs") or []]
    reached = [a["addr"] for a in tried if a.get("reached")]
    if reached:
        scopes = sorted({scope(t[0]) for t in map(tcp_target, reached) if t})
        where = "" if "public" in scopes else f" (a {scopes[0]} address: peers on other networks may need a relay)"
        return Check("reachability", "pass", f"a peer opened a fresh connection to {reached[0]}{where}")
    if tried:
        details = "; ".join(sorted({f"{a['addr']}: {a.get('detail', '')}" for a in tried}))[:300]
        return Check("reachability", "warn", f"no peer could connect to this daemon ({details})", fix)
    errors = "; ".join(str(a.get("error", "")) for a in answers)[:200]
    rpc = status.get("rpc") or {}
    if rpc.get("answered"):
        return Check(
            "reachability",
            "pass",
            f"peers' requests reach this daemon ({rpc['answered']} answered), perhaps through a relay; "
            f"no peer could dial back ({errors or 'no address to dial'})",
        )
    return Check("reachability", "warn", f"no peer has reached this daemon ({errors or 'no address'})", fix)


def check_in_use(ctx: Context) -> list[Check]:
    """``[limits] pause_while_in_use`` needs input idle time this machine shows (else it never pauses)."""
    from swarmd.node.limits.machine_use import input_idle_s

    limits = ctx.config.limits
    if not limits.pause_while_in_use:
        return []
    idle = input_idle_s()
    if idle is None:
        found = "no login session (loginctl) or terminal shows input idle time here: pause_while_in_use never pauses"
        fix = "run swarmd where logind sees your sessions (not in a container), or set [limits] windows instead"
        return [Check("in use", "warn", found, fix)]
    return [Check("in use", "pass", f"input seen {idle:.0f} s ago; pauses while under {limits.in_use_idle_s:.0f} s")]


def run_doctor(load: Callable[[], Any], run_id: str | None, ask: Ask) -> int:
    ctx = Context()
    started = time.monotonic()
    checks = check_config(ctx, load, run_id)
    _print(checks)
    if ctx.config is not None:
        # The probe after the dry run: its operands would raise the peak the dry run reads.
        for step in (check_state_dir, check_torch, check_cell_memory, check_compute, check_in_use):
            found = step(ctx)
            _print(found)
            checks += found
        found = check_swarm(ctx, ask)
        _print(found)
        checks += found
    failed = [c.name for c in checks if c.outcome == "fail"]
    print(
        f"\n{len(checks)} checks in {time.monotonic() - started:.1f} s: "
        + (
            f"{len(failed)} failed ({', '.join(failed)}): fix them before joining"
            if failed
            else "this machine can join"
        )
    )
    return 1 if failed else 0


def _print(checks: list[Check]) -> None:
    for check in checks:
        print(check.line(), flush=True)
    sys.stdout.flush()

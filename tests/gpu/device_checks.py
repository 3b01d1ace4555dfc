"""The GPU check's checks of swarmd's own CUDA branches, run for real against running daemons.

- ``[limits] gpu_memory_gib``: a daemon given a cap says in its status that it set that
  fraction of the device (``LiveLimits._apply_gpu_memory``: ``set_per_process_memory_fraction``)
  and its compute's peak stays under it.
- NVML detection (``machine_use.gpu_users``): from outside the daemons, NVML (else nvidia-smi)
  lists the daemons' processes on the GPU, the reason a daemon with ``pause_while_gpu_used``
  pauses for another one.
- ``swarmd doctor``: its dry run of the run's heaviest cell on the daemon's device, with the
  daemon running, ends in "this machine can join".

Without CUDA the first two are said to be skipped, never faked; doctor's dry run is real on the
CPU too, and says so.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swarmd.system.local_swarm import LocalDaemon


@dataclass(frozen=True)
class CheckLine:
    name: str
    outcome: str  # pass, fail or skip
    found: str

    def line(self) -> str:
        return f"{self.outcome.upper():<5} {self.name:<16} {self.found}"


def gpu_memory_cap(statuses: list[dict[str, Any]], cap_gib: float, total_bytes: int) -> list[CheckLine]:
    """Each capped daemon's status: the cap it applied, and its peak against it."""
    out = []
    expected = f"{min(cap_gib * 2**30, total_bytes) / 2**30:.1f} of {total_bytes / 2**30:.1f} GiB"
    for i, s in enumerate(statuses):
        applied = (s.get("limits") or {}).get("applied") or {}
        said, peak = applied.get("gpu_memory"), applied.get("gpu_memory_peak_bytes")
        ok = said == expected and peak is not None and peak <= cap_gib * 2**30
        peak_text = "no peak" if peak is None else f"peak {peak / 2**30:.2f} GiB"
        found = f"d{i} applied {said!r} (expected {expected!r}), {peak_text} under the {cap_gib:.2f} GiB cap"
        out.append(CheckLine("gpu_memory_gib", "pass" if ok else "fail", found))
    return out


def nvml_sees(daemons: list[LocalDaemon], index: int = 0) -> list[CheckLine]:
    """NVML's (and nvidia-smi's) list of the GPU's processes holds every daemon's."""
    import os

    from swarmd.node.limits.machine_use import gpu_users, load_nvml, nvml_pids, run_command, smi_pids

    wanted = {d.pid for d in daemons}
    out = []
    nvml = load_nvml()
    if nvml is None:
        out.append(CheckLine("NVML", "skip", "pynvml is not importable here (pip install nvidia-ml-py): not tried"))
    else:
        pids = nvml_pids(nvml, index)
        ok = pids is not None and wanted <= set(pids)
        out.append(CheckLine("NVML", "pass" if ok else "fail", f"GPU {index} processes {pids}; the daemons {wanted}"))
    pids = smi_pids(run_command, index)
    if pids is None:
        out.append(CheckLine("nvidia-smi", "skip", "nvidia-smi does not answer here"))
    else:
        ok = wanted <= set(pids)
        out.append(CheckLine("nvidia-smi", "pass" if ok else "fail", f"GPU {index} processes {pids}"))
    users = gpu_users(index, nvml, ours={os.getpid()})
    ok = bool(users)
    found = f"the other programs a daemon would pause for: {users}"
    out.append(CheckLine("gpu_users", "pass" if ok else "fail", found))
    return out


def doctor(daemon: LocalDaemon, config: Path, timeout_s: float = 240) -> CheckLine:
    """``swarmd doctor`` for the daemon's run, state and config, while it runs."""
    command = [sys.executable, "-m", "swarmd", "doctor", "--run-id", daemon.run_id]
    command += ["--state-dir", str(daemon.state_dir), "--config", str(config)]
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return CheckLine("doctor", "fail", f"did not finish in {timeout_s:.0f} s")
    lines = out.stdout.splitlines()
    torch_line = next((x.strip() for x in lines if x.split()[1:2] == ["torch"]), "no torch line")
    cell = next((x.strip() for x in lines if "cell memory" in x), "no cell memory line")
    ok = out.returncode == 0 and cell.startswith("pass")
    found = f"exit {out.returncode}; {torch_line}; {cell}"
    if not ok:
        found += "\n" + out.stdout[-1500:] + out.stderr[-1500:]
    return CheckLine("doctor", "pass" if ok else "fail", found)


def skipped_without_cuda() -> list[CheckLine]:
    why = "skipped: no CUDA device (--cpu)"
    return [CheckLine("gpu_memory_gib", "skip", why), CheckLine("NVML", "skip", why)]

"""Input idle time and the GPU's other users, from fake loginctl answers, tty dirs and NVML."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from swarmd.node.limits import machine_use
from swarmd.node.limits.machine_use import (
    gpu_index,
    gpu_reason,
    gpu_users,
    in_use_reason,
    input_idle_s,
    other_gpu_programs,
    parse_sessions,
    session_idle_s,
    smi_pids,
    terminal_idle_s,
)
from swarmd.node.limits.pausing import limit_key

pytestmark = pytest.mark.timeout(20)

NOW = 1_800_000_000.0

SHOW = """Class=user
Type=x11
State=active
IdleHint=yes
IdleSinceHint={desktop_us}

Class=user
Type=tty
State=online
IdleHint=yes
IdleSinceHint={ssh_us}

Class=manager
Type=unspecified
State=active
IdleHint=no
IdleSinceHint=0

Class=user
Type=unspecified
State=active
IdleHint=no
IdleSinceHint=0
"""


def show(desktop_idle_s: float, ssh_idle_s: float) -> str:
    return SHOW.format(desktop_us=int((NOW - desktop_idle_s) * 1e6), ssh_us=int((NOW - ssh_idle_s) * 1e6))


def test_the_least_idle_user_session_wins_and_background_sessions_do_not_count() -> None:
    # The manager session and the cron-like "unspecified" one say IdleHint=no: not someone at the machine.
    assert sorted(parse_sessions(show(600, 45), NOW)) == pytest.approx([45, 600])


def test_a_session_not_idle_is_in_use_now() -> None:
    text = "Class=user\nType=wayland\nState=active\nIdleHint=no\nIdleSinceHint=0\n"
    assert parse_sessions(text, NOW) == [0.0]


def test_closing_and_lingering_sessions_do_not_count() -> None:
    text = "Class=user\nType=tty\nState=closing\nIdleHint=no\nIdleSinceHint=0\n"
    assert parse_sessions(text, NOW) == []


def fake_run(answers: dict[str, str | None]) -> Any:
    calls: list[list[str]] = []

    def run(argv: list[str]) -> str | None:
        calls.append(argv)
        return answers.get(argv[1] if argv[0] == "loginctl" else argv[0])

    run.calls = calls  # type: ignore[attr-defined]
    return run


def test_session_ids_from_list_sessions_go_to_show_session() -> None:
    run = fake_run({"list-sessions": "3 1000 ann seat0 tty2\nc7 1001 bob\n", "show-session": show(600, 45)})
    assert sorted(session_idle_s(run, NOW)) == pytest.approx([45, 600])
    assert run.calls[1][:4] == ["loginctl", "show-session", "3", "c7"]


def test_no_loginctl_is_no_session() -> None:
    assert session_idle_s(fake_run({}), NOW) == []


def make_ttys(root: Path, idle: dict[str, float]) -> Path:
    (root / "pts").mkdir()
    for name, seconds in idle.items():
        path = root / name
        path.touch()
        os.utime(path, (NOW - seconds, NOW - seconds))
    return root


def test_terminal_idle_is_read_from_access_times(tmp_path: Path) -> None:
    dev = make_ttys(tmp_path, {"pts/0": 30, "pts/1": 4000, "tty2": 90, "ttyS0": 1, "pts/ptmx": 0})
    # ttyS0 (a serial line) and ptmx (the multiplexer) are not terminals someone types into.
    assert sorted(terminal_idle_s(dev, NOW)) == pytest.approx([30, 90, 4000])


def test_the_least_idle_source_wins_and_none_is_unknown(tmp_path: Path) -> None:
    dev = make_ttys(tmp_path, {"pts/0": 300})
    run = fake_run({"list-sessions": "3 1000 ann\n", "show-session": show(600, 45)})
    assert input_idle_s(run, dev, NOW) == pytest.approx(45)
    assert input_idle_s(fake_run({}), dev, NOW) == pytest.approx(300)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert input_idle_s(fake_run({}), empty, NOW) is None


def test_in_use_pauses_under_the_threshold_only_and_unknown_never() -> None:
    reason = in_use_reason(12.4, 180)
    assert reason is not None and "input 12 s ago" in reason
    assert limit_key(reason) == "[limits] pause_while_in_use"
    assert in_use_reason(180, 180) is None
    assert in_use_reason(None, 180) is None


class FakeNvml:
    def __init__(self, compute: list[int], graphics: list[int], fail: bool = False) -> None:
        self.compute, self.graphics, self.fail = compute, graphics, fail
        self.index: int | None = None

    def nvmlInit(self) -> None:
        if self.fail:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        self.index = index
        return "handle"

    def nvmlDeviceGetComputeRunningProcesses(self, handle: str) -> list[Any]:
        return [SimpleNamespace(pid=p, usedGpuMemory=1) for p in self.compute]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: str) -> list[Any]:
        return [SimpleNamespace(pid=p, usedGpuMemory=1) for p in self.graphics]


NAMES = {10: "swarmd", 11: "p2pd", 20: "blender", 21: "Xorg", 22: "blender"}


def test_other_programs_on_our_gpu_are_named_and_ours_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine_use, "program_name", NAMES.get)
    nvml = FakeNvml(compute=[10, 20, 22], graphics=[11, 21])
    assert gpu_users(1, nvml, fake_run({}), ours={10, 11}) == ["Xorg", "blender"]
    assert nvml.index == 1
    reason = gpu_reason(["Xorg", "blender"])
    assert reason is not None and reason.startswith("Xorg, blender using the GPU")
    assert limit_key(reason) == "[limits] pause_while_gpu_used"


def test_only_ours_on_the_gpu_is_no_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine_use, "program_name", NAMES.get)
    assert gpu_users(0, FakeNvml([10], [11]), fake_run({}), ours={10, 11}) == []
    assert gpu_reason([]) is None


def test_without_nvml_nvidia_smi_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine_use, "program_name", NAMES.get)
    run = fake_run({"nvidia-smi": "20, blender\n10, swarmd\n[Not Supported], x\n"})
    assert gpu_users(0, FakeNvml([], [], fail=True), run, ours={10}) == ["blender"]
    assert run.calls[0][:3] == ["nvidia-smi", "-i", "0"]
    assert smi_pids(fake_run({}), 0) is None


def test_neither_source_is_unknown() -> None:
    assert gpu_users(0, None, fake_run({}), ours=set()) is None


def test_a_process_in_another_pid_namespace_is_left_out() -> None:
    assert other_gpu_programs([5, 6], set(), {5: "game"}.get) == ["game"]


def test_the_device_names_the_gpu() -> None:
    assert gpu_index("cpu") is None
    assert gpu_index("auto") == 0 and gpu_index("cuda") == 0 and gpu_index("cuda:2") == 2


def test_an_unseen_source_is_said_once(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine_use, "input_idle_s", lambda: None)
    monkeypatch.setattr(machine_use, "UNSEEN", machine_use.Unseen())
    for _ in range(3):
        assert machine_use.machine_use_reason(True, 180, False, "cpu") is None
    assert caplog.text.count("cannot tell when the machine is in use") == 1


def test_doctor_warns_when_no_input_idle_time_is_visible(monkeypatch: pytest.MonkeyPatch) -> None:
    from swarmd.cli.doctor import Context, check_in_use
    from swarmd.config import Config, LimitsConfig

    ctx = Context(config=Config(limits=LimitsConfig(pause_while_in_use=True)))
    monkeypatch.setattr(machine_use, "input_idle_s", lambda: None)
    (check,) = check_in_use(ctx)
    assert check.outcome == "warn" and "never pauses" in check.found and "[limits] windows" in check.fix
    monkeypatch.setattr(machine_use, "input_idle_s", lambda: 42.0)
    (check,) = check_in_use(ctx)
    assert check.outcome == "pass" and "42 s ago" in check.found
    assert check_in_use(Context(config=Config())) == []  # not asked for: nothing to check

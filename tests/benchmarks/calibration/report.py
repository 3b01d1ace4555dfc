"""The comparison written out: a markdown table of real against simulated (also printed), the
whole record as JSON (which ``--real-from`` reads back), and a plot of both timelines.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict
from typing import Any

from tests.benchmarks.calibration.measure import DataPath
from tests.benchmarks.calibration.scenario import tokens_per_micro_batch
from tests.benchmarks.calibration.sides import BUCKET_S, LEDGER_COUNTS, Side
from tests.benchmarks.calibration.simulated import WARMUP_S, WARMUP_STEP_S


def links_lines(real: dict[str, Any], simulated: dict[str, Any]) -> list[str]:
    """What was measured of the links, and what the simulation took."""
    dp = DataPath(**real["data_path"])
    return [
        f"Links: one TCP stream gets {real['goodput_Bps'] / 1e6:.2f} MB/s and keeps "
        f"{real['standing_queue_s'] * 1e3:.0f} ms queued in the shaper; the daemons' data path gets "
        f"{dp.goodput_Bps / 1e6:.2f} MB/s (the simulated links' rate), a small request takes "
        f"{dp.idle_rtt_s * 1e3:.0f} ms on an idle connection and {dp.loaded_rtt_s * 1e3:.0f} ms beside a transfer "
        f"on the same one (simulated: {simulated['connection_queue_bytes'] / 1e3:.0f} kB more, "
        f"{simulated['connection_queue_bytes'] / dp.goodput_Bps * 1e3:.0f} ms at that rate).",
        "",
    ]


def roles_line(real: dict[str, Any], simulated: dict[Any, list[str]]) -> str:
    """What each daemon held, real (at the window's start and end) and simulated (at the end)."""

    def where(roles: dict[Any, list[str]]) -> str:
        return "; ".join(f"d{i} {', '.join(r)}" for i, r in sorted(roles.items(), key=lambda kv: int(kv[0])))

    return (
        f"Roles: real at the start {where(real['start'])}; real at the end {where(real['end'])}; "
        f"simulated at the end {where(simulated)}."
    )


def report(
    args: argparse.Namespace, sides: dict[str, Side], tflops: float, real: dict, simulated: dict[str, Any]
) -> None:
    """The comparison as a markdown table (printed, and ``calibration.md``), the whole record as
    ``calibration.json`` (what ``--real-from`` reads back) and the plot, in ``args.out``."""
    r, s = sides["real"], sides["simulated"]
    windows = [w["tokens_per_s"] for w in simulated["windows"]]

    def ratio(a: float | None, b: float | None) -> str:
        return f"{b / a:.2f}" if a and b is not None else "-"

    def fmt(v: float | None) -> str:
        return "not back" if v is None else f"{v:,.1f}"

    rows = [
        ("trained tokens/s over the window", r.tokens_per_s, s.tokens_per_s),
        ("trained tokens/s before the kill", r.before_kill, s.before_kill),
        ("trained tokens/s after recovery", r.after_kill, s.after_kill),
        ("recovery after the kill, s", r.recovery_s, s.recovery_s),
    ]
    victim = real.get("victim")
    killed = f"d{victim} killed" if victim is not None else "nobody killed"
    lines = [
        f"# Calibration: {args.devices} daemons, {args.rate_mbps} Mbit/s up and down each, "
        f"{args.access_latency_ms} ms one way to the switch each, {args.seconds:g} s with {killed} at "
        f"{args.kill_at:g} s",
        "",
        f"Devices measured at {tflops * 1e3:.2f} GFLOPS each ({args.devices} processes at once, one thread each).",
        "",
        *links_lines(real, simulated),
        f"Simulated: the mean of {len(windows)} windows after {WARMUP_S:g} to "
        f"{WARMUP_S + (len(windows) - 1) * WARMUP_STEP_S:g} s of warm-up; tokens/s over a window "
        f"{min(windows):,.1f} to {max(windows):,.1f}.",
        "",
        "| figure | real | simulated | simulated / real |",
        "|---|---:|---:|---:|",
        *(f"| {name} | {fmt(a)} | {fmt(b)} | {ratio(a, b)} |" for name, a, b in rows),
    ]
    plans = simulated["plans"]
    if plans.get("real"):
        lines += [
            "",
            f"The simulation starts from the plan the real daemons followed (v{real['plan']['version']}): "
            f"{plans['real']}.",
        ]
    own = sides.get("simulated on its own plan")
    if own is not None:
        lines += [
            "",
            f"From its own plan of the emulated links instead ({plans['own']}), the simulation makes "
            f"{own.tokens_per_s:,.1f} tokens/s over the window ({ratio(r.tokens_per_s, own.tokens_per_s)} of real), "
            f"{own.before_kill:,.1f} before the kill and {own.after_kill:,.1f} after: what the real swarm would gain, "
            "or lose, had its coordinator measured the links as they are.",
        ]
    lines += [
        "",
        "| MB over the window | " + " | ".join(f"d{i}" for i in range(args.devices)) + " |",
        "|---|" + "---:|" * args.devices,
    ]
    for key in ("sent_MB", "received_MB"):
        lines.append(f"| {key[:-3]}, real | " + " | ".join(f"{v:.1f}" for v in real[key]) + " |")
        lines.append(f"| {key[:-3]}, simulated | " + " | ".join(f"{v:.1f}" for v in simulated[key]) + " |")
    counts = [("updates of shard (0, 0)", real["updates_in_window"], simulated["updates"])]
    if real.get("ledger_in_window"):  # the ledger stayed with one daemon over the window
        counts += [(f"shares {key}", real["ledger_in_window"][key], simulated["ledger"][key]) for key in LEDGER_COUNTS]
    lines += ["", "| in the window | real | simulated |", "|---|---:|---:|"]
    lines += [f"| {name} | {a} | {b:.1f} |" for name, a, b in counts]
    lines += ["", roles_line(real["roles"], simulated["roles"])]
    lines += ["", f"This machine's {os.cpu_count()} cores were {real['cpu_busy']:.0%} busy over the real window."]
    text = "\n".join(lines) + "\n"
    print(text)
    (args.out / "calibration.md").write_text(text)
    (args.out / "calibration.json").write_text(
        json.dumps(
            {
                "args": {k: str(v) for k, v in vars(args).items()},
                "tflops": tflops,
                "sides": {k: asdict(v) for k, v in sides.items()},
                "real": real,
                "simulated": simulated,
            },
            indent=1,
            default=str,
        )
    )
    if plot(args, sides):
        print(f"wrote {args.out}/calibration.md, calibration.json, calibration.png")


def plot(args: argparse.Namespace, sides: dict[str, Side]) -> bool:
    """Both timelines in tokens/s, with the kill marked, as ``calibration.png``; matplotlib is
    optional (the ``dev`` extra), so without it there is no plot and it says False."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(8, 3.5))
    tokens = tokens_per_micro_batch() / BUCKET_S
    for name, side in sides.items():
        ax.plot([i * BUCKET_S for i in range(len(side.timeline))], [n * tokens for n in side.timeline], label=name)
    ax.axvline(args.kill_at, color="grey", linestyle="--", label="kill")
    ax.set(xlabel="seconds", ylabel="trained tokens/s", title="Real daemons against the simulator")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out / "calibration.png", dpi=120)
    return True

"""The ``swarmd`` command.

    swarmd run --run-id ID [--initial-peers MADDR ...]   join a run and stay in it
    swarmd run create --spec FILE                         sign a run spec, print its run ID
    swarmd run token --run-id ID --peer PEER_ID           the creator admits a peer to a private run
    swarmd status [--json | --watch]                      this peer, its run and the peers it sees
    swarmd peers [--json]                                 the swarm, one line a peer
    swarmd pause [--for D] | swarmd resume                hand this peer's work back, and take it again
    swarmd doctor [--run-id ID]                           can this machine join its run; what to fix
    swarmd config show | get K | set K V | reload         the config; [limits] changes apply live
    swarmd export --run-id ID DIR                         a folder transformers' from_pretrained loads
    swarmd demo                                           a local swarm on 127.0.0.1
    swarmd plan --scenario FILE [--json]                  place a swarm described on paper
    swarmd simulate --scenario FILE --hours H --seed S    play a scenario out over time, strategy by strategy
    swarmd tokenizer train --vocab N --out FILE TEXT...   train a byte-level BPE tokenizer.json
    swarmd data prepare --tokenizer FILE|bytes --out DIR INPUT...   token shards and a manifest for a run
    swarmd completion bash | swarmd man                    shell completion and the man page, from this parser

User errors print one line and exit non-zero; ``--debug`` adds the traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from swarmd import __version__
from swarmd.cli import config_command, data_command, tokenizer_command
from swarmd.cli.status_view import fmt_newer_version, fmt_peers, format_status
from swarmd.errors import ConfigError, SwarmdError
from swarmd.models.presets import PRESETS
from swarmd.peers.wire.relay_modes import MODES as RELAY_MODES

logger = logging.getLogger("swarmd")

EXIT_USAGE = 2
EXIT_FAILURE = 1


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, help="TOML config file (default: $SWARMD_CONFIG, else built-in defaults)")
    p.add_argument("--state-dir", help="state directory (overrides [node] state_dir)")
    p.add_argument("--debug", action="store_true", help="debug logging, and tracebacks on errors")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="swarmd", description="Peer-to-peer volunteer training daemon.")
    parser.add_argument("--version", action="version", version=f"swarmd {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="join a run's swarm (or 'run create' a new run)")
    run.add_argument(
        "action",
        nargs="?",
        choices=["create", "token"],
        help="'create': sign a run spec and print its run ID; 'token': sign a join token for --peer",
    )
    run.add_argument("--run-id", help="the run to join (overrides [swarm] run_id)")
    run.add_argument("--spec", type=Path, help="with 'create': the run spec file (TOML or .json)")
    run.add_argument("--peer", metavar="PEER_ID", help="with 'token': the peer the token admits")
    run.add_argument("--days", type=float, metavar="N", help="with 'token': days it admits the peer (default 30)")
    run.add_argument("--join-token", metavar="TOKEN", help="a private run's join token (overrides [swarm] join_token)")
    run.add_argument("--initial-peers", nargs="+", metavar="MADDR", help="multiaddrs of peers in the swarm")
    run.add_argument("--host-maddrs", nargs="+", metavar="MADDR", help="where the DHT listens")
    run.add_argument("--lan-maddr", metavar="MADDR", help="where the LAN-discovery host listens")
    run.add_argument("--no-mdns", action="store_true", help="no LAN discovery")
    run.add_argument("--no-nat-port-map", action="store_true", help="no UPnP/NAT-PMP port mapping")
    run.add_argument("--join-timeout", type=float, metavar="S", help="give up joining after S seconds")
    run.add_argument("--heartbeat-interval", type=float, metavar="S")
    run.add_argument("--heartbeat-ttl", type=float, metavar="S")
    run.add_argument("--no-benchmark", action="store_true", help="skip the throughput measurement at start")
    run.add_argument("--no-train", action="store_true", help="join and stay, but train nothing")
    run.add_argument("--data-via-relay", choices=RELAY_MODES, help="overrides [swarm] data_via_relay")
    run.add_argument("--threads", type=int, metavar="N", help="torch threads for compute (0: one per core)")
    run.add_argument("--dashboard", metavar="HOST:PORT", help="serve the dashboard and metrics, e.g. 127.0.0.1:9470")
    run.add_argument(
        "--data-dir",
        action="append",
        type=Path,
        metavar="DIR",
        help="a folder holding the run's prepared data or checkpoint (adds to [data] dirs; repeatable)",
    )
    _add_common(run)

    for name, help_text in (
        ("status", "this peer, its run and the peers it sees"),
        ("peers", "list the swarm"),
    ):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--json", action="store_true", help="machine-readable output")
        if name == "status":
            p.add_argument("--watch", action="store_true", help="a live view, refreshed in place (Ctrl-C to leave)")
            p.add_argument("--interval", type=float, default=2.0, metavar="S", help="with --watch: refresh every S s")
            p.add_argument("--count", type=int, default=0, metavar="N", help="with --watch: stop after N views")
        _add_common(p)

    doctor = sub.add_parser("doctor", help="check that this machine can join its run, and say what to fix")
    doctor.add_argument("--run-id", help="the run to check for (overrides [swarm] run_id)")
    _add_common(doctor)

    pause = sub.add_parser("pause", help="hand this peer's work back and take none until resumed (or --for D)")
    pause.add_argument("--for", dest="for_", metavar="D", help="resume by itself after D (90s, 30m, 2h, 1d)")
    _add_common(pause)
    resume = sub.add_parser("resume", help="take work again after 'swarmd pause'")
    _add_common(resume)

    export = sub.add_parser("export", help="write a run's weights as a folder transformers loads")
    export.add_argument("--run-id", required=True, help="the run to export")
    export.add_argument("out_dir", type=Path, metavar="DIR", help="the folder to write")
    export.add_argument("--overwrite", action="store_true", help="replace DIR if it exists")
    _add_common(export)

    demo = sub.add_parser("demo", help="start a local swarm of daemons on 127.0.0.1 and show it")
    demo.add_argument("--peers", type=int, default=3, help="how many daemons (default 3)")
    demo.add_argument("--duration", type=float, default=0, help="stop after S seconds (default: until Ctrl-C)")
    demo.add_argument(
        "--run",
        default="tiny-bytes",
        choices=sorted(PRESETS),
        help="the preset run: tiny-bytes (the default) or tiny-llama-bpe (GQA Llama, BPE, token shards fetched)",
    )
    demo.add_argument("--debug", action="store_true")

    plan = sub.add_parser("plan", help="plan the swarm a scenario file describes (scenarios/FORMAT.md)")
    plan.add_argument("--scenario", type=Path, required=True, metavar="FILE", help="the scenario (JSON)")
    plan.add_argument("--json", action="store_true", help="print the plan object of FORMAT.md")
    plan.add_argument("--time-budget", type=float, default=1.5, metavar="S", help="local search time (default 1.5)")
    for concern in ("network", "devices", "reliability"):
        plan.add_argument(f"--no-{concern}", action="store_true", help=f"plan blind to {concern} (ablation)")
    plan.add_argument("--debug", action="store_true")

    completion = sub.add_parser("completion", help="print a shell completion script (bash)")
    completion.add_argument("shell", choices=["bash"], help="the shell: source the output from its rc file")
    sub.add_parser("man", help="print the man page (roff): swarmd man > /usr/local/share/man/man1/swarmd.1")
    config_command.add_parser(sub, _add_common)

    sim = sub.add_parser("simulate", help="simulate a scenario over time with churn, comparing strategies")
    sim.add_argument("--scenario", type=Path, required=True, metavar="FILE", help="the scenario (JSON)")
    sim.add_argument("--hours", type=float, required=True, metavar="H", help="simulated hours")
    sim.add_argument("--seed", type=int, default=0, metavar="S", help="the churn's and the planners' seed")
    sim.add_argument(
        "--strategies",
        metavar="A,B",
        help="which to compare (default all: swarmd, its three ablations, dtfm-static, swarm-wiring, petals-greedy)",
    )
    sim.add_argument("--out", type=Path, metavar="DIR", help="where the report and plots go (default simulate-NAME)")
    sim.add_argument(
        "--time-budget",
        type=float,
        default=0.5,
        metavar="S",
        help="the planner's local search time per full plan (default 0.5)",
    )
    sim.add_argument(
        "--target-loss",
        type=float,
        metavar="L",
        help="the loss whose time to reach is the headline (default: Chinchilla's fit at 20 tokens per parameter)",
    )
    sim.add_argument("--debug", action="store_true")
    tokenizer_command.add_parser(sub)
    data_command.add_parser(sub)
    return parser


def _configure_logging(level: str, log_format: str = "text") -> None:
    from swarmd.system.log_format import configure_logging

    configure_logging(level, log_format)


def _check_run_id_arg(args: argparse.Namespace) -> None:
    """A typed ``--run-id`` of the wrong form is refused before anything heavy is imported."""
    if args.run_id:
        from swarmd.peers.records.run_id import check_run_id

        check_run_id(args.run_id)


def _load(args: argparse.Namespace) -> Any:
    from swarmd.config import load_config

    path = args.config or (Path(os.environ["SWARMD_CONFIG"]) if os.environ.get("SWARMD_CONFIG") else None)
    config = load_config(path)
    if args.state_dir:
        config.node.state_dir = args.state_dir
    return config


def cmd_run(args: argparse.Namespace) -> int:
    _check_run_id_arg(args)
    from swarmd.cli.run_command import run_node, sign_new_run, with_run_flags
    from swarmd.config import ConfigError

    config = _load(args)
    _configure_logging("debug" if args.debug else config.node.log_level, config.node.log_format)
    if args.action == "create":
        return sign_new_run(args, config)
    if args.action == "token":
        from swarmd.cli.token_command import run_token

        return run_token(config.node.state_path, args.run_id or config.swarm.run_id, args.peer or "", args.days)
    if args.spec:
        raise ConfigError("--spec goes with 'swarmd run create'; to join a run give --run-id")
    if args.peer or args.days is not None:
        raise ConfigError("--peer and --days go with 'swarmd run token' (the creator admits a peer)")
    from swarmd.peers.wire.emulated_delay import configured_delays

    configured_delays()  # a calibration harness's delay file that is wrong stops us here, in one line
    config = with_run_flags(config, args)
    if not config.swarm.run_id:
        raise ConfigError("no run to join: pass --run-id ID (or set [swarm] run_id); 'swarmd run create' makes one")
    if config.swarm.join_token:
        from swarmd.cli.token_command import check_join_token

        check_join_token(config.node.state_path, config.swarm.run_id, config.swarm.join_token)
    return run_node(config, lambda: with_run_flags(_load(args), args))


def _control_path(args: argparse.Namespace) -> Path:
    from swarmd.system.control import SOCKET_FILENAME

    if args.state_dir or args.config or os.environ.get("SWARMD_CONFIG"):
        return _load(args).node.state_path / SOCKET_FILENAME
    from swarmd.config import DEFAULT_STATE_DIR, load_config

    user_socket = Path(DEFAULT_STATE_DIR).expanduser() / SOCKET_FILENAME
    system_config = Path("/etc/swarmd/config.toml")
    if not user_socket.exists() and system_config.exists():
        return load_config(system_config).node.state_path / SOCKET_FILENAME
    return user_socket


def cmd_status(args: argparse.Namespace) -> int:
    from swarmd.system.control import call

    if args.watch:
        from swarmd.cli.status_watch import watch_status

        if not 0.2 <= args.interval <= 3600 or args.count < 0:
            raise ConfigError(f"--interval {args.interval:g} must be 0.2 to 3600 s, --count {args.count} at least 0")
        return watch_status(_control_path(args), args.interval, args.count)
    result = call(_control_path(args), "status")
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(format_status(result))
    return 0


def cmd_peers(args: argparse.Namespace) -> int:
    from swarmd.system.control import call

    result = call(_control_path(args), "peers")
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"run {result['run_id']}: {len(result['peers'])} other peer(s)")
        newer = fmt_newer_version(__version__, result["peers"])
        if newer:
            print(newer)
        if result["peers"]:
            print("\n".join(fmt_peers(result["peers"])))
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from swarmd.cli.doctor import run_doctor
    from swarmd.system.control import call

    def ask(command: str) -> dict[str, Any]:
        # A dial-back waits for the peers' connections (up to 15 s each, in parallel).
        result: dict[str, Any] = call(_control_path(args), command, timeout=40 if command == "dial_back" else 5)
        return result

    return run_doctor(lambda: _load(args), args.run_id, ask)


def cmd_pause(args: argparse.Namespace) -> int:
    from swarmd.node.limits.pausing import parse_duration
    from swarmd.system.control import call

    try:
        for_s = parse_duration(args.for_) if args.for_ is not None else None
    except ValueError as e:
        raise ConfigError(f"--for {e}") from None
    # Handing shards back copies each to its standby: allow it the daemon's own stop budget.
    result = call(_control_path(args), "pause", timeout=60, **({} if for_s is None else {"for_s": for_s}))
    left = (result.get("paused") or {}).get("left_s")
    print("paused: this peer's cells and shards are handed back" + (f"; resuming in {left:.0f} s" if left else ""))
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    from swarmd.system.control import call

    answer = call(_control_path(args), "resume", timeout=30)
    print("resumed: this peer offers work again")
    if answer.get("waived"):
        print(f"{answer['waived']} still holds: swarmd will not pause for it again until it ends")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    _check_run_id_arg(args)
    from swarmd.cli.export import export_run

    config = _load(args)
    _configure_logging("debug" if args.debug else config.node.log_level, config.node.log_format)
    gathered = _gather_from_running_daemon(config.node.state_path, args.run_id)
    out_dir, versions = export_run(config.node.state_path, args.run_id, args.out_dir, overwrite=args.overwrite)
    print(f"exported run {args.run_id} (stage weight versions {versions}) to {out_dir}")
    if gathered and gathered.get("held_out_loss") is not None:
        print(f"held-out loss {gathered['held_out_loss']:.4f} ({gathered['held_out_sequences']} held-out sequences)")
    print(f"load it with: AutoModelForCausalLM.from_pretrained({str(out_dir)!r})")
    return 0


GATHER_TIMEOUT_S = 150.0


def _gather_from_running_daemon(state_dir: Path, run_id: str) -> dict[str, Any] | None:
    """When a daemon of this run runs on ``state_dir``, have it bring every stage's newest
    checkpoint here first (its stages are spread over the swarm), with the run's tokenizer;
    returns what it answered (the versions, the held-out loss), None when none ran."""
    from swarmd.errors import ControlError
    from swarmd.system.control import SOCKET_FILENAME, call

    socket = state_dir / SOCKET_FILENAME
    if not socket.exists():
        return None
    try:
        status = call(socket, "status")
        if status.get("run_id") != run_id or not status.get("training"):
            return None
        from swarmd.cli.progress import ProgressLine

        gathering = ProgressLine("the running daemon gathers every stage's weights from the swarm's shards")
        with gathering.waiting(GATHER_TIMEOUT_S):
            gathered: dict[str, Any] = call(socket, "gather_weights", timeout=GATHER_TIMEOUT_S)
        gathering.done()
        return gathered
    except ControlError as e:
        print(f"could not gather stages from the swarm ({e}); exporting what is on this peer", file=sys.stderr)
        return None


def cmd_demo(args: argparse.Namespace) -> int:
    from swarmd.cli.demo import run_demo

    _configure_logging("debug" if args.debug else "info")
    return run_demo(args.peers, args.duration, args.run)


def cmd_plan(args: argparse.Namespace) -> int:
    from swarmd.cli.plan_command import run_plan

    if not args.time_budget >= 0:
        raise SwarmdError(f"--time-budget {args.time_budget}: must be a number of seconds >= 0")
    return run_plan(
        args.scenario,
        as_json=args.json,
        network=not args.no_network,
        devices=not args.no_devices,
        reliability=not args.no_reliability,
        time_budget_s=args.time_budget,
    )


def cmd_simulate(args: argparse.Namespace) -> int:
    from swarmd.cli.simulate_command import run_simulate
    from swarmd.peers.sim.strategies import NAMES

    if not args.time_budget >= 0:
        raise SwarmdError(f"--time-budget {args.time_budget}: must be a number of seconds >= 0")
    names = [n.strip() for n in args.strategies.split(",") if n.strip()] if args.strategies else list(NAMES)
    out = args.out or Path(f"simulate-{args.scenario.stem}")
    return run_simulate(
        args.scenario,
        hours=args.hours,
        seed=args.seed,
        strategies=names,
        out=out,
        time_budget_s=args.time_budget,
        target_loss=args.target_loss,
    )


def cmd_completion(args: argparse.Namespace) -> int:
    from swarmd.cli.parser_docs import bash_completion

    print(bash_completion(build_parser()), end="")
    return 0


def cmd_man(args: argparse.Namespace) -> int:
    from swarmd.cli.parser_docs import man_page

    print(man_page(build_parser()), end="")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handlers = {
        "run": cmd_run,
        "status": cmd_status,
        "peers": cmd_peers,
        "export": cmd_export,
        "doctor": cmd_doctor,
        "pause": cmd_pause,
        "resume": cmd_resume,
        "demo": cmd_demo,
        "plan": cmd_plan,
        "simulate": cmd_simulate,
        "completion": cmd_completion,
        "man": cmd_man,
        "config": lambda a: config_command.run(a, _control_path),
        "tokenizer": tokenizer_command.run,
        "data": data_command.run,
    }
    try:
        return handlers[args.command](args)
    except SwarmdError as e:
        if getattr(args, "debug", False):
            logger.exception("Failed")
        print(f"swarmd: error: {e}", file=sys.stderr)
        return EXIT_USAGE if isinstance(e, ConfigError) else EXIT_FAILURE
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        if getattr(args, "debug", False):
            raise
        print(
            f"swarmd: internal error: {type(e).__name__}: {e} (rerun with --debug for the traceback, "
            "and please report it)",
            file=sys.stderr,
        )
        return EXIT_FAILURE

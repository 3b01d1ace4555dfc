"""What ``swarmd run`` does once its arguments are checked.

``swarmd run``'s work once its arguments are checked: the config with the command line's
flags over it (at start, and again at each reload), the node on its asyncio loop with the
signals a service gets (SIGTERM and SIGINT stop it, a second exits at once; SIGHUP reloads),
and ``swarmd run create``, which signs a new run's spec."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from typing import Any

logger = logging.getLogger("swarmd")

EXIT_FAILURE = 1


def with_run_flags(config: Any, args: argparse.Namespace) -> Any:
    """``config`` with ``swarmd run``'s flags over it (at start, and again at each reload)."""
    from swarmd.config import HeartbeatConfig, SwarmConfig

    sw = config.swarm
    overrides: dict[str, Any] = {
        "run_id": args.run_id,
        "initial_peers": args.initial_peers,
        "host_maddrs": args.host_maddrs,
        "lan_maddr": args.lan_maddr,
        "join_timeout_s": args.join_timeout,
        "data_via_relay": args.data_via_relay,
        "join_token": args.join_token,
    }
    values = {**sw.__dict__, **{k: v for k, v in overrides.items() if v is not None}}
    if args.no_mdns:
        values["mdns"] = False
    if args.no_nat_port_map:
        values["nat_port_map"] = False
    config.swarm = SwarmConfig(**values)  # re-validates the flags
    hb = config.heartbeat
    config.heartbeat = HeartbeatConfig(
        interval_s=args.heartbeat_interval or hb.interval_s, ttl_s=args.heartbeat_ttl or hb.ttl_s
    )
    if args.no_benchmark:
        config.compute.benchmark = False
    if args.no_train:
        config.compute.train = False
    if args.threads is not None:
        config.limits = dataclasses.replace(config.limits, torch_threads=args.threads)  # re-validates
    if args.dashboard is not None:
        config.dashboard = dataclasses.replace(config.dashboard, listen=args.dashboard)  # re-validates
    if args.data_dir:
        folders = [*config.data.dirs, *(str(d) for d in args.data_dir if str(d) not in config.data.dirs)]
        config.data = dataclasses.replace(config.data, dirs=folders)
    return config


def run_node(config: Any, reload_source: Any) -> int:
    import asyncio
    import signal

    from swarmd.node.node import Node

    node = Node(config, config.swarm.run_id)
    node.reloads.source = reload_source

    async def main() -> int:
        loop = asyncio.get_running_loop()
        signals_seen = 0

        def on_signal(signum: int) -> None:
            nonlocal signals_seen
            signals_seen += 1
            if signals_seen == 1:
                logger.info("Got %s; stopping (send it again to exit at once)", signal.Signals(signum).name)
                node.request_stop()
            else:
                logger.warning("Second signal: exiting at once")
                if node.dht is not None:
                    node.dht.kill_now()
                os._exit(EXIT_FAILURE)

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal, sig)
        loop.add_signal_handler(signal.SIGHUP, node.reloads.request)  # systemctl reload
        return await node.run()

    code = asyncio.run(main())
    logger.info("Stopped")
    return code


def sign_new_run(args: argparse.Namespace, config: Any) -> int:
    from swarmd.cli.run_create import create
    from swarmd.config import ConfigError
    from swarmd.system.state_dir import prepare_state_dir

    if args.spec is None:
        raise ConfigError("'swarmd run create' needs --spec FILE (see README for the format)")
    run_id, _ = create(args.spec, prepare_state_dir(config.node.state_path))
    print(run_id)
    print(
        f"Serve it with:  swarmd run --run-id {run_id}\n"
        f"Others join with:  swarmd run --run-id {run_id} --initial-peers <this daemon's address>",
        file=sys.stderr,
    )
    return 0

"""The text of ``swarmd status`` and ``swarmd peers``: a daemon's status answer, as lines to read.

Pure formatting of the control socket's JSON answer; ``swarmd status`` and ``swarmd demo``
print the same view.
"""

from __future__ import annotations

import time
from typing import Any

from swarmd.peers.membership.versions import newer_in_swarm


def format_status(result: dict[str, Any]) -> str:
    """The whole status view: this peer, its training, the swarm it sees, and its peers."""
    run = result["run"]
    run_text = result["run_id"] + (
        f" ({run['model']}, {run['layers']} layers, hidden {run['hidden']}, {run['stages']} stages)" if run else ""
    )
    device = result["device"]
    lines = [
        f"peer      {result['peer_id']}",
        f"state     {result['state']}, up {fmt_duration(result['uptime_s'])}, swarmd {result['version']}",
        f"run       {run_text}",
        *([f"access    {run['access']}"] if run and run.get("access") else []),
        f"roles     {', '.join(result['roles'])}",
        f"device    {device['kind']}: {device['name']}, {device['memory_bytes'] / 2**30:.1f} GiB",
        fmt_probe(result.get("probe")),
        f"addresses {' '.join(result['addrs']) or '-'}",
        f"peers     {len(result['peers'])} seen",
    ]
    if result.get("dashboard"):
        lines.append(f"dashboard {result['dashboard']} (metrics: {result['dashboard']}metrics)")
    paused = result.get("paused")
    if paused:
        left = "until 'swarmd resume'" if paused["left_s"] is None else f"{paused['left_s']:.0f} s left"
        lines.insert(2, f"paused    {paused['since_s']:.0f} s ago ({paused['reason']}), {left}")
    newer = fmt_newer_version(result["version"], result["peers"])
    if newer:
        lines.insert(2, newer)
    if result.get("training"):
        lines += fmt_training(result["training"])
    if result.get("data"):
        lines += fmt_data(result["data"])
    if result.get("swarm"):
        lines += fmt_swarm(result["swarm"], result["peer_id"])
    if result.get("traffic"):
        lines.append(fmt_traffic(result["traffic"]))
    refused = fmt_refused(result)
    if refused:
        lines.append(refused)
    if result["peers"]:
        lines += fmt_peers(result["peers"])
    return "\n".join(lines)


def fmt_newer_version(own: str, peers: list[dict[str, Any]]) -> str:
    """A warning line when peers run a newer swarmd (empty: none does)."""
    newer = newer_in_swarm(own, [str(p.get("version", "")) for p in peers])
    return f"WARNING   {newer.warning(own)}" if newer else ""


def fmt_probe(probe: dict[str, Any] | None) -> str:
    """The compute line: what the device achieved at the run's shapes (or a generic block's), of
    its rated figure, its free memory, and what the planner is offered under ``cpu_share``."""
    if not probe or probe.get("achieved_tflops") is None:
        rated = probe.get("rated_tflops") if probe else None
        return "compute   not measured" + (f"; rated {rated:g} TFLOPS" if rated else "")
    achieved, rated = probe["achieved_tflops"], probe.get("rated_tflops")
    how = [probe.get("precision"), "the run's shapes" if probe.get("run_shapes") else "a generic block"]
    if probe.get("threads"):
        how.append(f"{probe['threads']} thread(s)")
    text = f"compute   {achieved:.3g} TFLOPS achieved ({', '.join(h for h in how if h)})"
    if rated:
        text += f", {probe['of_rated']:.0%} of {rated:g} rated"
    if probe.get("free_memory_bytes"):
        text += f"; {probe['free_memory_bytes'] / 2**30:.1f} GiB free"
    if probe.get("seconds") is not None:
        text += f"; probed in {probe['seconds']:.1f} s"
    share = probe.get("cpu_share", 1.0)
    return text + (f"; offers {achieved * share:.3g} at cpu_share {share:g}" if share < 1 else "")


def fmt_refused(result: dict[str, Any]) -> str:
    """One line of what this peer refused from others, by kind and reason (empty: nothing):
    an operator sees an attack, or a misconfigured peer, without reading the JSON."""

    def counts(what: str, by: dict[str, int] | None) -> str | None:
        by = {k: v for k, v in (by or {}).items() if v}
        return f"{what} {', '.join(f'{k} {v}' for k, v in sorted(by.items()))}" if by else None

    rpc = result.get("rpc") or {}
    banned = sum(until > time.time() for until in (rpc.get("banned") or {}).values())
    swarm = result.get("swarm") or {}
    parts = [
        counts("requests:", rpc.get("refused")),
        counts("members:", result.get("refused_members")),
        counts("plans:", swarm.get("plans_refused")),
        f"{banned} peer(s) banned now"
        if (banned := sum(t > time.time() for t in rpc.get("banned", {}).values()))
        else None,
        f"DHT restarted {result['dht_restarts']}x" if result.get("dht_restarts") else None,
    ]
    shown = [p for p in parts if p]
    return f"refused   {'; '.join(shown)}" if shown else ""


def fmt_traffic(t: dict[str, Any]) -> str:
    """The training traffic: what went each way since start, the caps, and today against the daily cap."""

    def size(n: float) -> str:
        return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"

    def cap(bps: float) -> str:
        return f"{bps * 8 / 1e6:g} Mbit/s" if bps else "no cap"

    today = t["today"]
    daily = f"of {t['daily_cap_bytes'] / 2**30:g} GiB" if t["daily_cap_bytes"] else "(no daily cap)"
    return (
        f"traffic   sent {size(t['sent_bytes'])}, received {size(t['received_bytes'])}; up {cap(t['up_cap_Bps'])}, "
        f"down {cap(t['down_cap_Bps'])}; today {size(today['bytes'])} {daily}"
    )


def fmt_duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def fmt_peers(peers: list[dict[str, Any]]) -> list[str]:
    lines = [f"  {'PEER':<54} {'AGE':>6} {'RTT':>9} {'DEVICE':<6} {'TFLOPS':>8} {'UPTIME':>8}  ROLES"]
    for p in peers:
        rtt = "-" if p["rtt_ms"] is None else f"{p['rtt_ms']:.1f}ms"
        lines.append(
            f"  {p['peer_id']:<54} {p['age_s']:>5.1f}s {rtt:>9} {p['device']['kind']:<6} "
            f"{p['throughput_gflops'] / 1000:>8.3g} {fmt_duration(p['uptime_s']):>8}  {','.join(p['roles'])}"
        )
    return lines


def fmt_training(t: dict[str, Any]) -> list[str]:
    state = t["state"] + (f" ({t['error']})" if t.get("error") else "")
    a = t.get("assignment")
    following = "nothing yet"
    if a:
        source = "the provisional assignment" if a["provisional"] else f"plan v{a['version']}"
        following = (
            f"{source}: {a['pipelines']} pipeline(s) x {t['stages']} stage(s), shards {a['shards']}, "
            f"H = {a['local_steps']}, {a['share_micro_batches']} micro-batch(es) a share"
        )
    lines = [f"training  {state}; {t['mode']} mode; following {following}"]
    if t.get("trained_tokens") is not None:
        lines.append(
            f"swarm     {t['trained_tokens']} trained tokens, {t['tokens_per_s'] or 0:.0f} tokens/s "
            f"(as shard (0, 0) applied them), update {t['updates']}"
        )
    held_out = t.get("held_out")
    if held_out:
        by = "this peer" if held_out.get("here") else f"{held_out['by'][:16]}..."
        lines.append(f"held-out  loss {held_out['loss']:.4f} at update {held_out['version']} (scored by {by})")
    for c in t.get("cells") or []:
        loss = f", loss {c['loss']:.3f}" if c.get("loss") is not None else ""
        x = c["contributions"]
        lines.append(
            f"cell      ({c['pipeline']}, {c['stage']}): {c['shares']} share(s), {c['rounds']} round(s), "
            f"{c['abandoned']} abandoned{loss}; weights {c['weights']['versions']}"
        )
        lines.append(
            f"          contributions {x['sent']} sent ({x['resent']} again, {x['dropped']} refused), "
            f"{x['waiting']} waiting to be committed"
        )
    for s in t.get("shards") or []:
        lines.append(
            f"shard     ({s['stage']}, {s['shard']}) of {s['shards']}: version {s['version']}, "
            f"{s['contributions']} contribution(s) ({s['duplicates']} duplicate, {s['dropped_stale']} too "
            f"stale, {s['refused']} refused), {s['unreplicated']} step(s) unreplicated"
        )
        if distrusted := s.get("distrusted"):  # senders that point against the others
            weighed = ", ".join(
                f"{peer[-8:]} x{w:g}" + (" (excluded)" if w == 0 else "") for peer, w in distrusted.items()
            )
            lines.append(f"          weighed down: {weighed}")
    ledger = t.get("ledger")
    if ledger:
        lines.append(
            f"ledger    data cursor {ledger['cursor']} (all below {ledger['done_below']} trained), "
            f"{ledger['open']} share(s) open, {ledger['waiting']} to train again; issued {ledger['issued']} "
            f"({ledger['reissued']} again), completed {ledger['completed']}"
        )
    return lines


def fmt_data(d: dict[str, Any]) -> list[str]:
    """The run's files on this peer: what it reads, what it holds, fetched and served."""
    store, fetch, serve = d["store"], d["fetch"], d["serve"]
    training = d.get("training") or {}
    if training.get("kind") == "shards":
        source = (
            f"{training['shards']} train shard(s) of {training['tokens']} tokens, {training['shards_here']} here, "
            f"reading {training['reading']}, fetching ahead {training['fetching_ahead']}"
        )
    elif d.get("manifest"):
        source = f"manifest {d['manifest'][:12]}... (opening)"
    else:
        source = f"corpus {d.get('corpus')}"
    fetched = sum(fetch["fetched_bytes"].values())
    return [
        f"data      {source}; holds {', '.join(d['holds']) or 'nothing to serve'}",
        f"          cache {store['cached_bytes'] / 2**20:.1f} of {store['cache_bytes'] / 2**30:.2f} GiB "
        f"({store['cached_files']} file(s), {store['evicted']} evicted); fetched {fetched / 2**20:.1f} MiB "
        f"({fetch['refused']} refused, {fetch['failed_tries']} failed tries), served "
        f"{serve['served_bytes'] / 2**20:.1f} MiB to {serve['served_peers']} peer(s)",
    ]


def fmt_swarm(sw: dict[str, Any], own: str) -> list[str]:
    coordinator = sw.get("coordinator") or "none elected yet"
    if coordinator == own:
        coordinator += " (this peer)"
    p = sw.get("plan")
    if p:
        predicted = p.get("predicted_iteration_s")
        figure = f"predicted iteration {predicted:.3f} s" if predicted is not None else "no prediction"
        mine = "left out" if p["my_stage"] is None else f"stage {p['my_stage']}"
        plan_text = (
            f"v{p['version']} ({p['kind']}) by {p['by'][:16]}...: {p['pipelines']} pipelines x "
            f"{p['stages']} stages, layers {p['layers_per_stage']}; {figure}; this peer: {mine}"
        )
    else:
        plan_text = sw.get("plan_error") or "none yet (fewer peers than stages, or still measuring)"
    links = sw["links"]
    own_score = sw.get("reliability", {}).get(own)
    return [
        f"plan      {plan_text}",
        f"coord     {coordinator}",
        f"measured  links to {links['measured']} peer(s); matrix {links['matrix_measured']} measured, "
        f"{links['matrix_filled']} filled; probes {links['probes_sent']} ({links['probe_failures']} failed), "
        f"{links['probe_bytes_last_hour'] / 2**20:.1f} MiB this hour",
        f"reliable  {'not observed yet' if own_score is None else f'{own_score:.2f}'} (as others observed this peer)",
    ]

// The swarmd dashboard: reads /api/status and /api/history and draws them; no build step, no
// network resources. Everything shown comes through textContent, never as HTML: member records
// (device names, roles, versions) come from other peers and are not to be trusted as markup.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const CURVES = ["loss", "held_out_loss", "tokens_per_s", "updates_per_min", "peers"];
let refreshMs = 5000;

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}

function row(table, cells, header) {
  const tr = el("tr");
  for (const c of cells) tr.appendChild(c instanceof Node ? wrap(header ? "th" : "td", c) : el(header ? "th" : "td", c));
  table.appendChild(tr);
  return tr;
}

function wrap(tag, child) {
  const node = el(tag);
  node.appendChild(child);
  return node;
}

function short(peer) {
  return peer ? peer.slice(0, 8) + "…" + peer.slice(-6) : "-";
}

function duration(s) {
  s = Math.floor(s);
  if (s < 60) return s + "s";
  if (s < 3600) return Math.floor(s / 60) + "m" + String(s % 60).padStart(2, "0") + "s";
  return Math.floor(s / 3600) + "h" + String(Math.floor((s % 3600) / 60)).padStart(2, "0") + "m";
}

function fmt(v, digits) {
  if (v === null || v === undefined) return "-";
  if (Number.isInteger(v) || Math.abs(v) >= 1000) return Math.round(v).toLocaleString("en");
  return Number(v).toFixed(digits);
}

function clear(id) {
  const node = document.getElementById(id);
  node.replaceChildren();
  return node;
}

// One curve: a polyline path over the samples that have a value, scaled to the SVG's box.
function drawCurve(name, samples) {
  const svg = clear("chart-" + name);
  const points = samples.filter((s) => typeof s[name] === "number").map((s) => [s.t, s[name]]);
  // The box is the drawn size, so that the labels are not stretched with the curve.
  const w = Math.max(200, Math.round(svg.getBoundingClientRect().width) || 600), h = 150, pad = 18;
  svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
  const axis = document.createElementNS(SVG, "line");
  for (const [k, v] of Object.entries({ x1: 0, y1: h - pad, x2: w, y2: h - pad, class: "axis" })) axis.setAttribute(k, v);
  svg.appendChild(axis);
  const path = document.createElementNS(SVG, "path");
  path.setAttribute("id", "curve-" + name);
  path.setAttribute("class", "curve");
  path.setAttribute("data-points", String(points.length));
  document.getElementById(name + "-now").textContent = points.length ? fmt(points[points.length - 1][1], 3) : "-";
  if (points.length) {
    const t0 = points[0][0], t1 = points[points.length - 1][0];
    let lo = Math.min(...points.map((p) => p[1])), hi = Math.max(...points.map((p) => p[1]));
    if (hi === lo) { hi += 1; lo = Math.max(0, lo - 1); }
    const x = (t) => (t1 === t0 ? w / 2 : ((t - t0) / (t1 - t0)) * w);
    const y = (v) => pad / 2 + (1 - (v - lo) / (hi - lo)) * (h - 2 * pad);
    path.setAttribute("d", points.map((p, i) => (i ? "L" : "M") + x(p[0]).toFixed(1) + " " + y(p[1]).toFixed(1)).join(" "));
    for (const [text, yy] of [[fmt(hi, 3), 12], [fmt(lo, 3), h - pad - 4]]) label(svg, text, 4, yy);
    label(svg, "-" + duration(t1 - t0), 4, h - 3);
  }
  svg.appendChild(path);
}

function label(svg, text, x, y) {
  const node = document.createElementNS(SVG, "text");
  node.setAttribute("x", x);
  node.setAttribute("y", y);
  node.textContent = text;
  svg.appendChild(node);
}

function showSelf(s) {
  const state = document.getElementById("state");
  state.textContent = s.state;
  state.className = "badge " + (s.state === "running" ? "ok" : "warn");
  const paused = document.getElementById("paused");
  paused.replaceChildren();
  if (s.paused) {
    const left = s.paused.left_s === null ? "until resumed" : duration(s.paused.left_s) + " left";
    paused.appendChild(el("span", "paused: " + s.paused.reason + " (" + left + ")", "badge warn"));
  }
  const run = s.run ? ` (${s.run.model}, ${s.run.layers} layers, ${s.run.stages} stages)` : "";
  document.getElementById("run").textContent = "run " + s.run_id + run;
  document.getElementById("peer").textContent = "peer " + s.peer_id + " · swarmd " + s.version;
  const table = clear("self");
  const t = s.training || {};
  const rows = [
    ["state", s.state + (t.state ? "; training: " + t.state : "")],
    ["uptime", duration(s.uptime_s)],
    ["roles", (s.roles || []).join(", ") || "-"],
    ["device", `${s.device.kind}: ${s.device.name}, ${(s.device.memory_bytes / 2 ** 30).toFixed(1)} GiB`],
    ["updates", t.updates ?? "-"],
    ["trained tokens", fmt(t.trained_tokens, 0)],
    ["cells", (t.cells || []).map((c) => `(${c.pipeline}, ${c.stage})`).join(" ") || "-"],
    ["shards", (t.shards || []).map((x) => `(${x.stage}, ${x.shard}) v${x.version}`).join(" ") || "-"],
    ["addresses", (s.addrs || []).join(" ") || "-"],
  ];
  for (const r of rows) row(table, r);
}

function showLimits(limits) {
  const table = clear("limits");
  if (!limits) return;
  const cap = (v, unit) => (v ? v + " " + unit : "no cap");
  const rows = [
    ["CPU share", Math.round(limits.cpu_share * 100) + "%"],
    ["torch threads", limits.torch_threads || "one per core"],
    ["GPU memory", cap(limits.gpu_memory_gib, "GiB")],
    ["upload", cap(limits.upload_mbit_s, "Mbit/s")],
    ["download", cap(limits.download_mbit_s, "Mbit/s")],
    ["daily transfer", cap(limits.daily_transfer_gib, "GiB")],
    ["time windows", (limits.windows || []).join(", ") || "any time"],
    ["pause on battery", limits.pause_on_battery ? "yes" : "no"],
    ["pause while in use", limits.pause_while_in_use ? `yes (idle ${limits.in_use_idle_s} s)` : "no"],
    ["pause while", (limits.pause_while || []).join(", ") || "-"],
  ];
  const applied = limits.applied || {};
  if (applied.gpu_memory) rows[2][1] = applied.gpu_memory;  // as applied to this device
  if (typeof applied.throttled_s === "number") rows.push(["compute held back", duration(applied.throttled_s)]);
  for (const r of rows) row(table, r);
}

function showPlan(s) {
  const plan = s.swarm && s.swarm.plan;
  const table = clear("plan");
  const summary = document.getElementById("plan-summary");
  if (!plan) {
    summary.textContent = (s.swarm && s.swarm.plan_error) || "no plan yet (fewer peers than stages, or still measuring)";
    return;
  }
  const predicted = plan.predicted_iteration_s === null ? "" : `, predicted iteration ${plan.predicted_iteration_s.toFixed(3)} s`;
  summary.textContent = `v${plan.version} (${plan.kind}) by ${short(plan.by)}: ${plan.pipelines} pipeline(s) × ${plan.stages} stage(s), layers ${plan.layers_per_stage.join("/")}${predicted}`;
  const stages = [...Array(plan.stages).keys()];
  row(table, ["", ...stages.map((i) => `stage ${i} (${plan.layers_per_stage[i]} layers)`)], true);
  plan.grid.forEach((pipeline, p) => row(table, [`pipeline ${p}`, ...pipeline.map(peerCell(s.peer_id))]));
  row(table, ["shard servers", ...stages.map((i) => (plan.shard_servers[i] || []).map(short).join(", "))]);
  if ((plan.spares || []).length) row(table, ["spares", plan.spares.map(short).join(", ")]);
}

function peerCell(own) {
  return (peer) => el("span", short(peer) + (peer === own ? " (this peer)" : ""), "mono");
}

function memberState(peer, roles, plan) {
  if (roles.includes("paused")) return "paused";
  if (!plan) return "provisional";
  const placed = plan.grid.flat().concat(plan.parameter_servers || []);
  if (placed.includes(peer)) return "in plan";
  return (plan.spares || []).includes(peer) ? "spare" : "waiting";
}

function showMembers(s) {
  const table = clear("members");
  const plan = s.swarm && s.swarm.plan;
  const coordinator = s.swarm && s.swarm.coordinator;
  row(table, ["peer", "state", "roles", "device", "RTT", "uptime", "version"], true);
  const self = { peer_id: s.peer_id, roles: s.roles || [], device: s.device, rtt_ms: null, uptime_s: s.uptime_s, version: s.version };
  for (const m of [self, ...(s.peers || [])]) {
    const roles = (m.roles || []).concat(m.peer_id === coordinator ? ["coordinator"] : []);
    const tr = row(table, [
      peerCell(s.peer_id)(m.peer_id),
      memberState(m.peer_id, m.roles || [], plan),
      roles.join(", ") || "-",
      m.device ? `${m.device.kind}: ${m.device.name}` : "-",
      m.rtt_ms === null ? "-" : m.rtt_ms.toFixed(1) + " ms",
      duration(m.uptime_s || 0),
      m.version || "-",
    ]);
    tr.className = "member";
    tr.dataset.peer = m.peer_id;
  }
}

async function getJson(path) {
  const response = await fetch(path, { cache: "no-store" });
  if (!response.ok) throw new Error(`${path}: HTTP ${response.status}`);
  return response.json();
}

async function refresh() {
  try {
    const [status, history] = await Promise.all([getJson("/api/status"), getJson("/api/history")]);
    refreshMs = Math.max(1000, history.interval_s * 1000);
    showSelf(status);
    showLimits(status.limits);
    showPlan(status);
    showMembers(status);
    for (const name of CURVES) drawCurve(name, history.samples);
    document.getElementById("error").textContent = "";
  } catch (e) {
    document.getElementById("error").textContent = "cannot reach the daemon: " + e.message + "; retrying";
  }
  setTimeout(refresh, refreshMs);
}

refresh();

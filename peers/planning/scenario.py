"""A swarm on paper: devices, the network between them, the model and the batch.

The scheduler (``swarmd.peers.planning.planner``), its baselines, ``swarmd plan`` and the simulator all
read this one type. A scenario comes from a file in the format of ``scenarios/FORMAT.md`` or,
in a running daemon, from the live measurements (probes and reliability records); either way
it is checked here once, so that nothing downstream meets a NaN, a zero bandwidth or an
unknown id. Every refusal names the field (``devices[3].tflops``, ``bandwidth_Bps[2][5]``),
the value and the rule.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from swarmd.errors import SwarmdError

MAX_DEVICES = 20_000
"""A scenario this large is already far beyond any swarm we plan online; past it, refuse
instead of allocating matrices of hundreds of millions of entries."""
MAX_SCENARIO_BYTES = 4 << 30


class ScenarioError(SwarmdError):
    """A scenario file is malformed: the message names the field, the value and the rule."""


@dataclass(frozen=True)
class Device:
    id: str
    tflops: float
    memory_gib: float
    region: str | None = None
    mean_uptime_h: float | None = None
    """Absent: the device is always up."""
    mean_downtime_h: float | None = None
    achieved_tflops: float | None = None
    """Measured: what the device's probe achieved at the run's shapes (``swarmd.node.compute_probe``).
    Absent: only ``tflops``, the rated figure, is known."""

    @property
    def speed_tflops(self) -> float:
        """What the planner and the simulator price the device at: its achieved TFLOPS where
        measured, else its rated ``tflops``."""
        return self.tflops if self.achieved_tflops is None else self.achieved_tflops

    @property
    def availability(self) -> float:
        """Long-run fraction of time the device is up."""
        if self.mean_uptime_h is None:
            return 1.0
        down = self.mean_downtime_h or 0.0
        return self.mean_uptime_h / (self.mean_uptime_h + down)

    @property
    def leave_rate_per_s(self) -> float:
        """How often it leaves while up (1 / mean uptime): 0 for a device that never does."""
        return 0.0 if self.mean_uptime_h is None else 1.0 / (self.mean_uptime_h * 3600.0)


@dataclass(frozen=True)
class ModelSpec:
    layers: int
    hidden: int
    seq_len: int
    vocab: int
    params: float
    dtype_bytes: int

    @property
    def embedding_params(self) -> float:
        return float(self.vocab * self.hidden)

    @property
    def layer_params(self) -> float:
        """Parameters of one transformer block: what is left after the embedding, shared by
        the blocks (about 12 hidden^2 each for GPT-style blocks)."""
        rest = self.params - self.embedding_params
        return max(rest, 12.0 * self.hidden * self.hidden) / self.layers

    def layer_flops_per_sequence(self) -> float:
        """Forward and backward of one block on one sequence: 6 flops per parameter per token,
        plus attention's score and value products (12 * seq_len * hidden per token)."""
        return self.seq_len * (6.0 * self.layer_params + 12.0 * self.seq_len * self.hidden)

    def head_flops_per_sequence(self) -> float:
        """The output head and loss of the last stage (the embedding lookup is free)."""
        return self.seq_len * 6.0 * self.embedding_params


@dataclass(frozen=True)
class Shape:
    stages: int
    data_parallel: int

    @property
    def devices(self) -> int:
        return self.stages * self.data_parallel


@dataclass(frozen=True)
class DeviceArrays:
    tflops: np.ndarray
    """Each device's ``speed_tflops``: achieved where measured, else rated."""
    memory_gib: np.ndarray
    availability: np.ndarray
    leave_rate_per_s: np.ndarray


@dataclass(frozen=True)
class Scenario:
    name: str
    devices: tuple[Device, ...]
    latency_s: np.ndarray = field(repr=False)
    """latency_s[i][j]: one-way latency from device i to device j, seconds (diagonal 0)."""
    bandwidth_Bps: np.ndarray = field(repr=False)
    """bandwidth_Bps[i][j]: bytes per second from i to j (diagonal +inf)."""
    model: ModelSpec
    batch_sequences: int
    micro_batch: int
    parallelism: Shape | None = None
    activation_bytes_given: float | None = None
    grad_bytes_given: float | None = None

    @property
    def n(self) -> int:
        return len(self.devices)

    @property
    def ids(self) -> list[str]:
        return [d.id for d in self.devices]

    @cached_property
    def device_arrays(self) -> DeviceArrays:
        """The devices' figures as arrays, built once per scenario: the planner and its repair
        read them on every call, and at 10,000 devices the Python loop is not free."""
        return DeviceArrays(
            tflops=np.array([d.speed_tflops for d in self.devices], dtype=float),
            memory_gib=np.array([d.memory_gib for d in self.devices]),
            availability=np.array([d.availability for d in self.devices]),
            leave_rate_per_s=np.array([d.leave_rate_per_s for d in self.devices]),
        )

    @cached_property
    def interface_Bps(self) -> tuple[np.ndarray, np.ndarray]:
        """Each device's uplink and downlink rate (``interface_rates``), built once per scenario."""
        return interface_rates(self.bandwidth_Bps)

    def copy(self) -> Scenario:
        """A shallow copy (the same matrices) that shares what is already built from them."""
        out = replace(self)
        for cached in ("device_arrays", "interface_Bps"):
            if cached in self.__dict__:
                out.__dict__[cached] = self.__dict__[cached]  # (cached_property's slot)
        return out

    def index(self) -> dict[str, int]:
        return {d.id: i for i, d in enumerate(self.devices)}

    def activation_bytes(self, shape: Shape) -> float:
        """Bytes one device sends to the next stage per iteration (forward; as much again
        backward): its pipeline's share of the batch, as hidden states of ``dtype_bytes``."""
        if self.activation_bytes_given is not None:
            return self.activation_bytes_given
        per_pipeline = self.batch_sequences / shape.data_parallel
        return per_pipeline * self.model.seq_len * self.model.hidden * self.model.dtype_bytes

    def grad_bytes(self, shape: Shape) -> float:
        """Bytes of one stage's gradient: the model's parameters split evenly over the stages."""
        if self.grad_bytes_given is not None:
            return self.grad_bytes_given
        return self.model.params * self.model.dtype_bytes / shape.stages

    def transfer_s(self, nbytes: float) -> np.ndarray:
        """Matrix of the time to send ``nbytes`` on each edge i->j: latency + bytes / bandwidth."""
        return self.latency_s + nbytes / self.bandwidth_Bps

    def with_devices(self, keep: list[int]) -> Scenario:
        """The same scenario restricted to the devices at ``keep`` (in that order). The devices
        keep their interface rates: an access link does not slow because others left."""
        ix = np.asarray(keep, dtype=int)
        up, down = self.interface_Bps
        out = Scenario(
            name=self.name,
            devices=tuple(self.devices[i] for i in keep),
            latency_s=self.latency_s[np.ix_(ix, ix)],
            bandwidth_Bps=self.bandwidth_Bps[np.ix_(ix, ix)],
            model=self.model,
            batch_sequences=self.batch_sequences,
            micro_batch=self.micro_batch,
            parallelism=self.parallelism,
            activation_bytes_given=self.activation_bytes_given,
            grad_bytes_given=self.grad_bytes_given,
        )
        out.__dict__["interface_Bps"] = (up[ix], down[ix])  # (cached_property's slot)
        return out


INTERFACE_ROWS = 1024
"""Rows of the bandwidth matrix read at a time for the interface rates: no n x n copy is made."""


def interface_rates(bandwidth_Bps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each device's uplink and downlink rate: its fastest outgoing and incoming link (the
    diagonal ignored). What all of a device's concurrent flows share: a volunteer's access
    link, not each pair's path, is what a device sends and receives through."""
    n = bandwidth_Bps.shape[0]
    up, down = np.zeros(n), np.zeros(n)
    for a in range(0, n, INTERFACE_ROWS):
        rows = np.array(bandwidth_Bps[a : a + INTERFACE_ROWS], dtype=float)
        rows[np.arange(len(rows)), np.arange(a, a + len(rows))] = 0.0
        up[a : a + len(rows)] = rows.max(axis=1)
        np.maximum(down, rows.max(axis=0), out=down)
    return np.maximum(up, 1e-9), np.maximum(down, 1e-9)


# -- parsing -----------------------------------------------------------------------------------


def _err(path: str, value: Any, rule: str) -> ScenarioError:
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return ScenarioError(f"scenario field {path} = {shown}: {rule}")


def _obj(raw: Any, path: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise _err(path, raw, "must be a JSON object")
    return raw


def _number(raw: dict[str, Any], key: str, path: str, *, positive: bool = True, required: bool = True) -> float | None:
    where = f"{path}.{key}" if path else key
    if key not in raw:
        if required:
            raise ScenarioError(f"scenario field {where} is missing")
        return None
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _err(where, value, "must be a number")
    if not math.isfinite(value):
        raise _err(where, value, "must be finite")
    if positive and value <= 0:
        raise _err(where, value, "must be > 0")
    if not positive and value < 0:
        raise _err(where, value, "must be >= 0")
    return float(value)


def _integer(raw: dict[str, Any], key: str, path: str, *, required: bool = True) -> int | None:
    value = _number(raw, key, path, required=required)
    if value is None:
        return None
    if value != int(value):
        raise _err(f"{path}.{key}" if path else key, raw[key], "must be a whole number")
    return int(value)


def _matrix(
    raw: Any, key: str, n: int, *, positive: bool, rows_done: Callable[[int], None] | None = None
) -> np.ndarray:
    """An n x n matrix from a list of rows (``rows_done(i)`` after each row: progress at scale).
    Each row's item types are checked at C speed and its values converted at once; the values'
    rules are ``_array_matrix``'s (at 10,000 devices a matrix is 100 million numbers: checked
    one by one in Python it took 45 s of the file's load)."""
    if isinstance(raw, np.ndarray):
        return _array_matrix(raw, key, n, positive=positive)
    if not isinstance(raw, list) or len(raw) != n:
        size = len(raw) if isinstance(raw, list) else type(raw).__name__
        raise _err(key, size, f"must be a list of {n} rows, one per device")
    out = np.zeros((n, n), dtype=float)
    for i, row in enumerate(raw):
        if not isinstance(row, list) or len(row) != n:
            size = len(row) if isinstance(row, list) else type(row).__name__
            raise _err(f"{key}[{i}]", size, f"must be a list of {n} numbers, one per device")
        if not set(map(type, row)) <= _NUMBER_TYPES:  # else item by item (a bool is no number here)
            for j, v in enumerate(row):
                if j != i and (isinstance(v, bool) or not isinstance(v, int | float)):
                    raise _err(f"{key}[{i}][{j}]", v, "must be a finite number")
            row = [*row[:i], 0.0, *row[i + 1 :]]  # the diagonal is ignored, whatever it holds
        try:
            out[i] = row
        except OverflowError:  # an integer beyond float range
            raise _err(f"{key}[{i}]", "a huge integer", "must hold finite numbers") from None
        if rows_done is not None:
            rows_done(i + 1)
    return _array_matrix(out, key, n, positive=positive)


_NUMBER_TYPES = frozenset({int, float})


def _rows(progress: Callable[[float], None] | None, before: int, n: int) -> Callable[[int], None] | None:
    """A matrix's rows done as the fraction of both matrices' 2n rows."""
    return None if progress is None else lambda i: progress((before + i) / (2 * n))


def _array_matrix(raw: np.ndarray, key: str, n: int, *, positive: bool) -> np.ndarray:
    """The rules of ``_matrix`` checked over a whole array at once, for scenarios built in
    memory (``swarmd.peers.planning.scenario_gen``): at 10,000 devices a matrix as lists is 100 million
    Python floats, minutes to check one by one and gigabytes to hold. A float64 array is
    adopted as it is, not copied (its diagonal is overwritten), for the same reason."""
    if raw.shape != (n, n):
        raise _err(key, list(raw.shape), f"must be a list of {n} rows of {n} numbers, one per device")
    if raw.dtype.kind not in "fiu":
        raise _err(key, str(raw.dtype), "must hold numbers")
    out = raw if raw.dtype == np.float64 else raw.astype(float)
    np.fill_diagonal(out, 0.0)  # the diagonal is ignored
    bad = ~np.isfinite(out)
    bad |= out <= 0 if positive else out < 0
    np.fill_diagonal(bad, False)
    if bad.any():
        i, j = (int(x) for x in divmod(int(np.argmax(bad)), n))
        value = float(out[i, j])
        if not math.isfinite(value):
            raise _err(f"{key}[{i}][{j}]", value, "must be a finite number")
        if positive:
            raise _err(f"{key}[{i}][{j}]", value, "must be > 0 (bytes per second between two devices)")
        raise _err(f"{key}[{i}][{j}]", value, "must be >= 0 (seconds)")
    return out


def _device(raw: Any, i: int) -> Device:
    path = f"devices[{i}]"
    d = _obj(raw, path)
    ident = d.get("id")
    if not isinstance(ident, str) or not ident or len(ident) > 128:
        raise _err(f"{path}.id", ident, "must be a non-empty string of at most 128 characters")
    region = d.get("region")
    if region is not None and not isinstance(region, str):
        raise _err(f"{path}.region", region, "must be a string")
    up = _number(d, "mean_uptime_h", path, required=False)
    down = _number(d, "mean_downtime_h", path, positive=False, required=False)
    if down is not None and up is None:
        raise _err(f"{path}.mean_downtime_h", down, "needs mean_uptime_h beside it")
    tflops = _number(d, "tflops", path)
    memory = _number(d, "memory_gib", path)
    assert tflops is not None and memory is not None
    # Not bounded by the rated figure: a GeForce card boosting past its rated clock beats it.
    achieved = _number(d, "achieved_tflops", path, required=False)
    return Device(ident, tflops, memory, region, up, down, achieved)


def parse_scenario(raw: Any, progress: Callable[[float], None] | None = None) -> Scenario:
    """Check a decoded scenario object and build the ``Scenario``; raises ``ScenarioError``.
    ``progress(fraction)`` after each matrix row (there are 2n)."""
    top = _obj(raw, "(top level)")
    name = top.get("name", "unnamed")
    if not isinstance(name, str):
        raise _err("name", name, "must be a string")
    devices_raw = top.get("devices")
    if not isinstance(devices_raw, list) or not devices_raw:
        raise _err("devices", devices_raw, "must be a non-empty list of devices")
    if len(devices_raw) > MAX_DEVICES:
        raise _err("devices", len(devices_raw), f"at most {MAX_DEVICES} devices")
    devices = tuple(_device(d, i) for i, d in enumerate(devices_raw))
    seen: dict[str, int] = {}
    for i, d in enumerate(devices):
        if d.id in seen:
            raise _err(f"devices[{i}].id", d.id, f"repeats the id of devices[{seen[d.id]}]")
        seen[d.id] = i
    n = len(devices)
    for key in ("latency_s", "bandwidth_Bps"):
        if key not in top:
            raise ScenarioError(f"scenario field {key} is missing (an {n}x{n} matrix)")
    latency = _matrix(top["latency_s"], "latency_s", n, positive=False, rows_done=_rows(progress, 0, n))
    bandwidth = _matrix(top["bandwidth_Bps"], "bandwidth_Bps", n, positive=True, rows_done=_rows(progress, n, n))
    np.fill_diagonal(bandwidth, np.inf)  # a device talks to itself for free

    m = _obj(top.get("model"), "model")
    layers, hidden, seq_len, vocab = (_integer(m, k, "model") for k in ("layers", "hidden", "seq_len", "vocab"))
    params, dtype_bytes = _number(m, "params", "model"), _integer(m, "dtype_bytes", "model")
    assert layers and hidden and seq_len and vocab and params and dtype_bytes
    model = ModelSpec(layers, hidden, seq_len, vocab, params, dtype_bytes)

    b = _obj(top.get("batch"), "batch")
    sequences, micro = _integer(b, "sequences", "batch"), _integer(b, "micro_batch", "batch")
    assert sequences and micro
    if micro > sequences:
        raise _err("batch.micro_batch", micro, f"must be at most batch.sequences ({sequences})")

    shape = None
    if top.get("parallelism") is not None:
        p = _obj(top["parallelism"], "parallelism")
        stages, dp = _integer(p, "stages", "parallelism"), _integer(p, "data_parallel", "parallelism")
        assert stages and dp
        if stages > layers:
            raise _err("parallelism.stages", stages, f"must be at most model.layers ({layers})")
        if stages * dp > n:
            raise _err(
                "parallelism",
                {"stages": stages, "data_parallel": dp},
                f"needs {stages * dp} devices, the scenario has {n}",
            )
        shape = Shape(stages, dp)
    act = grad = None
    if top.get("cost") is not None:
        c = _obj(top["cost"], "cost")
        act = _number(c, "activation_bytes", "cost", required=False)
        grad = _number(c, "grad_bytes", "cost", required=False)
    return Scenario(name, devices, latency, bandwidth, model, sequences, micro, shape, act, grad)


def load_scenario(path: Path, progress: Callable[[float], None] | None = None) -> Scenario:
    """Read and check a scenario file; every failure is a ``ScenarioError`` naming the file.
    ``progress(fraction)`` follows the check of its matrices, the long part past parsing."""
    try:
        size = path.stat().st_size
    except OSError as e:
        raise ScenarioError(f"cannot read scenario file {path}: {e.strerror}") from None
    if size > MAX_SCENARIO_BYTES:
        raise ScenarioError(f"scenario file {path} is {size} bytes; at most {MAX_SCENARIO_BYTES}")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise ScenarioError(f"cannot read scenario file {path}: {e}") from None
    except json.JSONDecodeError as e:
        raise ScenarioError(f"scenario file {path} is not JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    try:
        return parse_scenario(raw, progress)
    except ScenarioError as e:
        raise ScenarioError(f"{path}: {e}") from None

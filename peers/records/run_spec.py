"""Run specs and self-certifying run IDs.

A run's creator signs its spec (model, data, batch, optimizer, stages). The run ID is derived
from the run's name and the creator's public key, so a joiner that fetches the spec from
anyone can check it: the signature must verify, and the key that made it must hash, with the
name, to the very run ID the joiner asked for. Nobody but the creator can make a spec that
passes both, so nobody else can replace it.
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swarmd.errors import RecordError, RunSpecError
from swarmd.models.shape import FAMILIES, ModelError, ModelShape
from swarmd.peers.records.envelope import Fields, OpenedRecord, open_record, sign_record
from swarmd.peers.records.identity import Identity
from swarmd.peers.records.run_id import NAME, derive_run_id

KIND = "run-spec"
MAX_SPEC_BYTES = 32 * 1024
MAX_SPEC_FILE_BYTES = 256 * 1024
MODEL_FAMILIES = FAMILIES
OPTIMIZERS = ("adamw", "sgd")
MEMBERSHIP = ("open", "allowlist", "token")
"""Who may join: anyone with the run ID; the peers the spec lists; holders of a join token the
creator signed (``swarmd.peers.records.join_token``)."""
CHECKPOINT_ACCESS = ("public", "members")
"""Who may fetch a stage's checkpoint: anyone (an open run's weights are public), or members only."""
AGGREGATIONS = ("mean", "centred-clip")
"""How a shard server combines a round's contributions: their mean, or centred clipping (each
contribution clipped to a radius around the last update before averaging: a few outliers
cannot drag the step, ``swarmd.models.robust_aggregation``)."""
MAX_ALLOWLIST = 400
"""Enough for a lab or a team, and small enough for the spec to stay one small DHT value; a larger
private run admits by join token."""


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    name: str
    model: ModelShape
    corpus: str
    """Where training text comes from: ``builtin`` (ships with swarmd) or a local path on every peer."""
    batch_sequences: int
    """Sequences per optimizer step, across the whole swarm."""
    micro_batch: int
    """Sequences per micro-batch (one pipeline task)."""
    optimizer: str
    lr: float
    weight_decay: float
    max_staleness: int
    """How many updates a micro-batch's weights may lag behind the parameter server's."""
    stages: int
    local_steps: int = 1
    """H: 1 contributes gradients every share (the servers step AdamW); more runs that many inner
    optimizer steps per round on every pipeline and contributes pseudo-gradients (DiLoCo);
    0 leaves H to the planner (``docs/data-path.md``)."""
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    aggregation: str = "mean"
    """One of ``AGGREGATIONS``: the rule every shard server of the run applies."""
    membership: str = "open"
    """One of ``MEMBERSHIP``."""
    allowlist: tuple[str, ...] = ()
    """The peer IDs that may join when ``membership`` is ``allowlist``."""
    checkpoint_access: str = "public"
    """One of ``CHECKPOINT_ACCESS``."""

    def to_body(self) -> dict[str, Any]:
        """The signed body. Settings at their defaults are left out, so that an open run's spec
        reads (and signs) as it did before private runs and robust aggregation existed."""
        body = self._base_body()
        if self.aggregation != "mean":
            body["exchange"]["aggregation"] = self.aggregation
        access = {
            "membership": (self.membership, "open"),
            "allowlist": (list(self.allowlist), []),
            "checkpoints": (self.checkpoint_access, "public"),
        }
        if any(value != default for value, default in access.values()):
            body["access"] = {name: value for name, (value, default) in access.items() if value != default}
        return body

    def _base_body(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "model": {
                "family": self.model.family,
                "layers": self.model.layers,
                "hidden": self.model.hidden,
                "heads": self.model.heads,
                "vocab": self.model.vocab,
                "seq_len": self.model.seq_len,
            },
            "data": {"corpus": self.corpus},
            "batch": {"sequences": self.batch_sequences, "micro_batch": self.micro_batch},
            "optimizer": {
                "name": self.optimizer,
                "lr": self.lr,
                "weight_decay": self.weight_decay,
                "max_staleness": self.max_staleness,
            },
            "stages": self.stages,
            "exchange": {
                "local_steps": self.local_steps,
                "outer_lr": self.outer_lr,
                "outer_momentum": self.outer_momentum,
            },
        }


def parse_spec_body(body: dict[str, Any]) -> RunSpec:
    """Check a spec's schema and ranges; raises RecordError naming the field."""
    f = Fields(body, "run spec")
    f.only({"name", "model", "data", "batch", "optimizer", "stages", "exchange", "access"})
    name = f.string("name", 40)
    if not NAME.fullmatch(name):
        raise RecordError(f"run spec: name {name!r} must be 1-40 characters of a-z, 0-9 and '-'")
    m = f.object("model")
    m.only({"family", "layers", "hidden", "heads", "vocab", "seq_len"})
    family = m.string("family", 16)
    if family not in MODEL_FAMILIES:
        raise RecordError(f"run spec: model.family {family!r} is not one of {', '.join(MODEL_FAMILIES)}")
    # Bounds first (a peer's numbers), then the shape's own rules (divisibility, rotary).
    try:
        model = ModelShape(
            family=family,
            layers=m.integer("layers", 1, 1024),
            hidden=m.integer("hidden", 8, 65536),
            heads=m.integer("heads", 1, 1024),
            vocab=m.integer("vocab", 2, 1_000_000),
            seq_len=m.integer("seq_len", 2, 1_000_000),
        )
    except ModelError as e:
        raise RecordError(f"run spec: {e}") from None
    d = f.object("data")
    d.only({"corpus"})
    b = f.object("batch")
    b.only({"sequences", "micro_batch"})
    sequences, micro_batch = b.integer("sequences", 1, 10_000_000), b.integer("micro_batch", 1, 100_000)
    if micro_batch > sequences:
        raise RecordError(f"run spec: batch.micro_batch {micro_batch} exceeds batch.sequences {sequences}")
    o = f.object("optimizer")
    o.only({"name", "lr", "weight_decay", "max_staleness"})
    optimizer = o.string("name", 16)
    if optimizer not in OPTIMIZERS:
        raise RecordError(f"run spec: optimizer.name {optimizer!r} is not one of {', '.join(OPTIMIZERS)}")
    stages = f.integer("stages", 1, 1024)
    if stages > model.layers:
        raise RecordError(f"run spec: stages {stages} exceeds model.layers {model.layers}")
    exchange: dict[str, Any] = {"local_steps": 1, "outer_lr": 0.7, "outer_momentum": 0.9}
    if "exchange" in body:  # specs signed before local steps existed have none
        x = f.object("exchange")
        x.only({*exchange, "aggregation"})
        exchange = {
            "local_steps": x.integer("local_steps", 0, 1000),
            "outer_lr": x.number("outer_lr", 1e-6, 10.0),
            "outer_momentum": x.number("outer_momentum", 0.0, 0.999),
        }
        if "aggregation" in body["exchange"]:
            exchange["aggregation"] = _one_of(x.string("aggregation", 32), AGGREGATIONS, "exchange.aggregation")
    if "access" in body:  # specs signed before private runs existed are open
        exchange.update(_access(f.object("access"), body["access"]))
    return RunSpec(
        name=name,
        model=model,
        corpus=d.string("corpus", 1024),
        batch_sequences=sequences,
        micro_batch=micro_batch,
        optimizer=optimizer,
        lr=o.number("lr", 0.0, 10.0),
        weight_decay=o.number("weight_decay", 0.0, 10.0),
        max_staleness=o.integer("max_staleness", 0, 1000),
        stages=stages,
        **exchange,
    )


def _one_of(value: str, allowed: tuple[str, ...], name: str) -> str:
    if value not in allowed:
        raise RecordError(f"run spec: {name} {value!r} is not one of {', '.join(allowed)}")
    return value


def _access(a: Fields, raw: dict[str, Any]) -> dict[str, Any]:
    a.only({"membership", "allowlist", "checkpoints"})
    out: dict[str, Any] = {}
    if "membership" in raw:
        out["membership"] = _one_of(a.string("membership", 16), MEMBERSHIP, "access.membership")
    if "allowlist" in raw:
        out["allowlist"] = tuple(a.strings("allowlist", MAX_ALLOWLIST, 128))
    if "checkpoints" in raw:
        out["checkpoint_access"] = _one_of(a.string("checkpoints", 16), CHECKPOINT_ACCESS, "access.checkpoints")
    if out.get("membership") == "allowlist" and not out.get("allowlist"):
        raise RecordError("run spec: access.membership is 'allowlist' but access.allowlist names nobody")
    return out


def run_seed(run_id: str) -> int:
    """The run's seed for weights and data order: every peer derives the same one."""
    return int.from_bytes(hashlib.sha256(run_id.encode()).digest()[:4], "little")


@dataclass(frozen=True)
class SignedRunSpec:
    run_id: str
    spec: RunSpec
    creator: str
    """Peer ID of the creator."""
    raw: bytes
    """The signed record as published; re-published unchanged by every member."""


def sign_run_spec(identity: Identity, spec: RunSpec) -> SignedRunSpec:
    raw = sign_record(identity, KIND, spec.to_body())
    return SignedRunSpec(derive_run_id(spec.name, identity.public_key), spec, identity.peer_id, raw)


def open_run_spec(raw: object) -> SignedRunSpec:
    """Check a signed spec and derive the one run ID its creator's key certifies."""
    try:
        record: OpenedRecord = open_record(raw, KIND, MAX_SPEC_BYTES)
        spec = parse_spec_body(record.body)
    except RecordError as e:
        raise RunSpecError(f"run spec is invalid: {e}") from None
    return SignedRunSpec(derive_run_id(spec.name, record.public_key), spec, record.signer, record.raw)


def verify_run_spec(raw: object, run_id: str) -> SignedRunSpec:
    """Accept ``raw`` as the spec of ``run_id`` only if its creator's key certifies that ID."""
    try:
        signed = open_run_spec(raw)
    except RunSpecError as e:
        raise RunSpecError(
            f"spec offered for run {run_id} is invalid: {str(e).removeprefix('run spec is invalid: ')}"
        ) from None
    if signed.run_id != run_id:
        raise RunSpecError(
            f"spec offered for run {run_id} was signed by {signed.creator}, whose key certifies run "
            f"{signed.run_id} instead; someone tried to replace the run's spec"
        )
    return signed


def load_spec_file(path: Path) -> RunSpec:
    """Read a user's spec file (TOML, or JSON by extension) and check it."""
    try:
        size = path.stat().st_size
        if size > MAX_SPEC_FILE_BYTES:
            raise RunSpecError(f"spec file {path} is {size} bytes, over the {MAX_SPEC_FILE_BYTES}-byte limit")
        text = path.read_text()
        body = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except OSError as e:
        raise RunSpecError(f"cannot read spec file {path}: {e.strerror}") from None
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RunSpecError(f"spec file {path} is not valid {path.suffix.lstrip('.') or 'TOML'}: {e}") from None
    if not isinstance(body, dict):
        raise RunSpecError(f"spec file {path} must hold an object (a table of settings), not {type(body).__name__}")
    try:
        return parse_spec_body(body)
    except RecordError as e:
        raise RunSpecError(f"spec file {path}: {str(e).removeprefix('run spec: ')}") from None

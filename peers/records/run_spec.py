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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swarmd.errors import RecordError, RunSpecError
from swarmd.models.lr_schedule import LrSchedule
from swarmd.models.shape import FAMILIES, MAX_ROPE_SCALING_ENTRIES, ROPE_SCALING, ModelError, ModelShape
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
"""Who may pull a stage's weights: anyone, or members only. The default follows ``membership``
(``default_checkpoint_access``): an open run's weights are public, a private run's are its
members'. A run's data files, optimizer state and replicas are members' in every run."""
AGGREGATIONS = ("mean", "centred-clip")
"""How a shard server combines a round's contributions: their mean, or centred clipping (each
contribution clipped to a radius around the last update before averaging: a few outliers
cannot drag the step, ``swarmd.models.robust_aggregation``). The default follows
``membership`` (``default_aggregation``)."""
DEFAULT_EVAL = {"every": 50, "sequences": 64}
DEFAULT_MIN_LR_RATIO = 0.1
MAX_ALLOWLIST = 400
"""Enough for a lab or a team, and small enough for the spec to stay one small DHT value; a larger
private run admits by join token."""


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    name: str
    model: ModelShape
    corpus: str
    """Where training text comes from: ``builtin`` (ships with swarmd) or a local path on every
    peer, read as bytes; empty when the run trains on a prepared dataset (``manifest_sha256``)."""
    batch_sequences: int
    """Sequences per optimizer step, across the whole swarm."""
    micro_batch: int
    """Sequences per micro-batch (one pipeline task)."""
    optimizer: str
    lr: float
    weight_decay: float
    max_staleness: int
    """How many updates a micro-batch's weights may lag behind the parameter server's."""
    warmup_steps: int = 0
    """Steps over which the rate rises linearly to ``lr`` (``swarmd.models.lr_schedule``)."""
    decay_steps: int = 0
    """The step by which a cosine brings the rate down to ``min_lr_ratio * lr`` (0: no decay)."""
    min_lr_ratio: float = DEFAULT_MIN_LR_RATIO
    stages: int
    local_steps: int = 1
    """H: 1 contributes gradients every share (the servers step AdamW); more runs that many inner
    optimizer steps per round on every pipeline and contributes pseudo-gradients (DiLoCo);
    0 leaves H to the planner (``docs/data-path.md``)."""
    outer_lr: float = 0.0
    """The outer step's rate in local mode; 0 lets ``exchange.outer_step_for`` set rate and
    momentum by the round's H (specs made before it name DiLoCo's 0.7 and 0.9)."""
    outer_momentum: float = 0.9
    aggregation: str = ""
    """One of ``AGGREGATIONS``: the rule every shard server of the run applies; left empty,
    ``default_aggregation(membership)``."""
    membership: str = "open"
    """One of ``MEMBERSHIP``."""
    allowlist: tuple[str, ...] = ()
    """The peer IDs that may join when ``membership`` is ``allowlist``."""
    checkpoint_access: str = ""
    """One of ``CHECKPOINT_ACCESS``; left empty, ``default_checkpoint_access(membership)``.
    Both defaults are filled in when the spec is made: ``dataclasses.replace`` that changes
    ``membership`` keeps the old run's values, so name them again."""
    manifest_sha256: str = ""
    """The prepared dataset's manifest (``swarmd data prepare``), which pins every token shard
    and the tokenizer; empty for a corpus run."""
    tokenizer_sha256: str = ""
    """The tokenizer the manifest was prepared with (``tokenizer.json``); empty for bytes."""
    init_sha256: str = ""
    """The initial weights' manifest of the checkpoint the run starts from
    (``swarmd.models.initial_weights``); empty: the run starts from its seed."""
    eval_every: int = DEFAULT_EVAL["every"]
    """Versions of shard (0, 0) between two held-out scores (0: never)."""
    eval_sequences: int = DEFAULT_EVAL["sequences"]
    """Held-out sequences a score averages over."""

    def __post_init__(self) -> None:
        if not self.aggregation:
            object.__setattr__(self, "aggregation", default_aggregation(self.membership))
        if not self.checkpoint_access:
            object.__setattr__(self, "checkpoint_access", default_checkpoint_access(self.membership))

    @property
    def private(self) -> bool:
        return self.membership != "open"

    def access_summary(self) -> str:
        """Who may join, who may pull the weights, and the aggregation rule, in one line (``swarmd
        run create`` and ``swarmd status`` print it)."""
        who = {
            "open": "open to anyone with the run ID",
            "allowlist": "private: its allowlist",
            "token": "private: join-token holders",
        }[self.membership]
        if self.membership == "allowlist":
            who += f" ({len(self.allowlist)} peer{'' if len(self.allowlist) == 1 else 's'})"
        weights = "anyone" if self.checkpoint_access == "public" else "members only"
        return f"{who}; weights and checkpoints to {weights}, data to members only; aggregation {self.aggregation}"

    @property
    def schedule(self) -> LrSchedule | None:
        """The rate of each step (None: ``lr`` throughout)."""
        s = LrSchedule(self.lr, self.warmup_steps, self.decay_steps, self.min_lr_ratio)
        return None if s.constant else s

    def to_body(self) -> dict[str, Any]:
        """The signed body. Settings at their defaults are left out, so that the default run's
        spec reads (and signs) as it always did; a private run's ``checkpoints`` is always
        written, so that a peer of a version that read a missing one as ``public`` reads it as
        meant. An open run's missing ``aggregation`` was read as the mean before centred
        clipping became its default: such a peer, serving a shard, averages (weaker against a
        poisoner, not a leak), and a run that wants the mean writes it."""
        body = self._base_body()
        if self.aggregation != default_aggregation(self.membership):
            body["exchange"]["aggregation"] = self.aggregation
        access = {
            "membership": (self.membership, "open"),
            "allowlist": (list(self.allowlist), []),
            "checkpoints": (self.checkpoint_access, None if self.private else "public"),
        }
        if any(value != default for value, default in access.values()):
            body["access"] = {name: value for name, (value, default) in access.items() if value != default}
        if self.manifest_sha256:
            body["data"] = {"manifest": self.manifest_sha256}
            if self.tokenizer_sha256:  # none: the dataset was prepared as bytes
                body["data"]["tokenizer"] = self.tokenizer_sha256
        schedule = {
            "warmup_steps": (self.warmup_steps, 0),
            "decay_steps": (self.decay_steps, 0),
            "min_lr_ratio": (self.min_lr_ratio, DEFAULT_MIN_LR_RATIO),
        }
        body["optimizer"].update({name: value for name, (value, default) in schedule.items() if value != default})
        evaluation = {"every": self.eval_every, "sequences": self.eval_sequences}
        if evaluation != DEFAULT_EVAL:
            body["eval"] = evaluation
        return body

    def _base_body(self) -> dict[str, Any]:
        return {
            "name": self.name,
            # The optional keys at their defaults are left out: a spec signed before they
            # existed signs the same.
            "model": self.model.to_dict() | ({"init": self.init_sha256} if self.init_sha256 else {}),
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
    f.only({"name", "model", "data", "batch", "optimizer", "stages", "exchange", "access", "eval"})
    name = f.string("name", 40)
    if not NAME.fullmatch(name):
        raise RecordError(f"run spec: name {name!r} must be 1-40 characters of a-z, 0-9 and '-'")
    model = _model(f.object("model"), body["model"])
    data = _data(f.object("data"), body["data"])
    if "init" in body["model"]:  # the initial weights' manifest of the checkpoint the run starts from
        data["init_sha256"] = _sha256(f.object("model"), "init")
    b = f.object("batch")
    b.only({"sequences", "micro_batch"})
    sequences, micro_batch = b.integer("sequences", 1, 10_000_000), b.integer("micro_batch", 1, 100_000)
    if micro_batch > sequences:
        raise RecordError(f"run spec: batch.micro_batch {micro_batch} exceeds batch.sequences {sequences}")
    o = f.object("optimizer")
    o.only({"name", "lr", "weight_decay", "max_staleness", "warmup_steps", "decay_steps", "min_lr_ratio"})
    optimizer = o.string("name", 16)
    if optimizer not in OPTIMIZERS:
        raise RecordError(f"run spec: optimizer.name {optimizer!r} is not one of {', '.join(OPTIMIZERS)}")
    stages = f.integer("stages", 1, 1024)
    if stages > model.layers:
        raise RecordError(f"run spec: stages {stages} exceeds model.layers {model.layers}")
    if model.tied and stages > 1:
        raise RecordError(
            f"run spec: model.tied is true but stages is {stages}: tied embeddings share one weight between "
            f"the first stage's embedding and the last stage's head, which sit on different peers; "
            f"set stages = 1, or model.tied = false (a tied checkpoint is untied on import)"
        )
    # A spec signed before the exchange section existed trained with DiLoCo's outer step.
    exchange: dict[str, Any] = {"local_steps": 1, "outer_lr": 0.7, "outer_momentum": 0.9}
    if "exchange" in body:  # specs signed before local steps existed have none
        x = f.object("exchange")
        x.only({*exchange, "aggregation"})
        given = body["exchange"]
        exchange = {
            "local_steps": x.integer("local_steps", 0, 1000),
            # Either may be left out: 0, the rate and momentum that suit the plan's H.
            "outer_lr": x.number("outer_lr", 0.0, 10.0) if "outer_lr" in given else 0.0,
            "outer_momentum": x.number("outer_momentum", 0.0, 0.999) if "outer_momentum" in given else 0.9,
        }
        if "aggregation" in body["exchange"]:
            exchange["aggregation"] = _one_of(x.string("aggregation", 32), AGGREGATIONS, "exchange.aggregation")
    if "access" in body:  # specs signed before private runs existed are open
        exchange.update(_access(f.object("access"), body["access"]))
    if "eval" in body:
        scores = f.object("eval")
        scores.only(set(DEFAULT_EVAL))
        exchange.update(
            eval_every=scores.integer("every", 0, 10**9), eval_sequences=scores.integer("sequences", 1, 65536)
        )
    lr = o.number("lr", 0.0, 10.0)
    warmup = o.integer("warmup_steps", 0, 10**9) if "warmup_steps" in o.obj else 0
    decay = o.integer("decay_steps", 0, 10**12) if "decay_steps" in o.obj else 0
    floor = o.number("min_lr_ratio", 0.0, 1.0) if "min_lr_ratio" in o.obj else DEFAULT_MIN_LR_RATIO
    try:
        LrSchedule(lr, warmup, decay, floor)
    except ValueError as e:
        raise RecordError(f"run spec: optimizer: {e}") from None
    return RunSpec(
        name=name,
        model=model,
        **data,
        batch_sequences=sequences,
        micro_batch=micro_batch,
        optimizer=optimizer,
        lr=lr,
        weight_decay=o.number("weight_decay", 0.0, 10.0),
        max_staleness=o.integer("max_staleness", 0, 1000),
        warmup_steps=warmup,
        decay_steps=decay,
        min_lr_ratio=floor,
        stages=stages,
        **exchange,
    )


def _data(d: Fields, raw: dict[str, Any]) -> dict[str, Any]:
    """A corpus (bytes, on every peer) or a prepared dataset's manifest and its tokenizer."""
    d.only({"corpus", "manifest", "tokenizer"})
    if ("corpus" in raw) == ("manifest" in raw):
        raise RecordError("run spec: data needs either corpus (text, as bytes) or manifest (a prepared dataset)")
    if "corpus" in raw:
        return {"corpus": d.string("corpus", 1024)}
    tokenizer = _sha256(d, "tokenizer") if "tokenizer" in raw else ""
    return {"corpus": "", "manifest_sha256": _sha256(d, "manifest"), "tokenizer_sha256": tokenizer}


def _sha256(f: Fields, name: str) -> str:
    value = f.string(name, 64)
    if len(value) != 64 or set(value) - set("0123456789abcdef"):
        raise RecordError(f"run spec: {f.what.removeprefix('run spec.')}.{name} must be a SHA-256 (64 hex digits)")
    return value


OPTIONAL_MODEL_KEYS: dict[str, Callable[[Fields, str], Any]] = {
    "kv_heads": lambda m, key: m.integer(key, 1, 1024),
    "rope_theta": lambda m, key: m.number(key, 0.0, 1e9),
    "tied": lambda m, key: m.boolean(key),
    "intermediate": lambda m, key: m.integer(key, 1, 1_000_000),
    "positions": lambda m, key: m.integer(key, 2, 10_000_000),
    "norm_eps": lambda m, key: m.number(key, 0.0, 1.0),
}
"""The model table's optional keys (``rope_scaling`` apart) and how each is read, bounded."""


def _model(m: Fields, raw: dict[str, Any]) -> ModelShape:
    """The model table: bounds first (a peer's numbers), then the shape's own rules
    (divisibility, rotary, grouped-query heads, what each family has)."""
    m.only({"family", "layers", "hidden", "heads", "vocab", "seq_len", "rope_scaling", "init", *OPTIONAL_MODEL_KEYS})
    family = m.string("family", 16)
    if family not in MODEL_FAMILIES:
        raise RecordError(f"run spec: model.family {family!r} is not one of {', '.join(MODEL_FAMILIES)}")
    optional: dict[str, Any] = {}
    for key, read in OPTIONAL_MODEL_KEYS.items():
        if key in raw:
            optional[key] = read(m, key)
    if "rope_theta" in optional and not optional["rope_theta"] > 0:
        raise RecordError(f"run spec: model.rope_theta = {optional['rope_theta']} must be above 0 (Llama 3: 500000)")
    if "norm_eps" in optional and not 0 < optional["norm_eps"] < 1:
        raise RecordError(f"run spec: model.norm_eps = {optional['norm_eps']} must be in (0, 1), e.g. 1e-5")
    if "rope_scaling" in raw:
        optional["rope_scaling"] = _rope_scaling(m.object("rope_scaling"), raw["rope_scaling"])
    try:
        return ModelShape(
            family=family,
            layers=m.integer("layers", 1, 1024),
            hidden=m.integer("hidden", 8, 65536),
            heads=m.integer("heads", 1, 1024),
            vocab=m.integer("vocab", 2, 1_000_000),
            seq_len=m.integer("seq_len", 2, 1_000_000),
            **optional,
        )
    except ModelError as e:
        raise RecordError(f"run spec: {e}") from None


def _rope_scaling(r: Fields, raw: dict[str, Any]) -> tuple[tuple[str, str | int | float], ...]:
    """A small table: its rope_type a name, its other entries numbers (the shape checks which)."""
    r.only({"rope_type", *(key for required, optional in ROPE_SCALING.values() for key in required | optional)})
    if len(raw) > MAX_ROPE_SCALING_ENTRIES:
        raise RecordError(f"run spec: model.rope_scaling has {len(raw)} entries, over {MAX_ROPE_SCALING_ENTRIES}")
    table: dict[str, str | int | float] = {}
    for key in raw:
        if key == "rope_type":
            table[key] = r.string(key, 16)
        elif key == "original_max_position_embeddings":  # an integer: transformers compares it with positions
            table[key] = r.integer(key, 1, 10_000_000)
        else:
            table[key] = r.number(key, 0.0, 1e6)
    return tuple(sorted(table.items()))


def default_checkpoint_access(membership: str) -> str:
    """Who may pull the weights when the spec does not say: anyone in an open run (anyone can
    join it in seconds anyway), members in a private one (a spec signed before this default
    existed, private and silent on it, meant ``public`` then and means ``members`` now: the
    safe reading; its creator can sign ``checkpoints = "public"`` again)."""
    return "public" if membership == "open" else "members"


def default_aggregation(membership: str) -> str:
    """The rule when the spec does not say: centred clipping (with its sender-trust rule) for an
    open run, which anyone with a key may join; the mean for a private one, whose members the
    creator chose. Measured on the swarm's own code (``bench_robust_swarm.py``, the default run,
    paired runs to version 150): with honest members centred clipping ended -0.010 +/- 0.008
    nats from the mean (4 members, 3 pairs) and -0.145 +/- 0.091 (6 members, 4 pairs); with one
    member negating every contribution, +0.050 from its own clean run where a stage has three
    senders (the negator at weight 0). Where it has two, no rule can tell which is honest."""
    return "centred-clip" if membership == "open" else "mean"


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


def read_spec_file(path: Path) -> dict[str, Any]:
    """A user's spec file (TOML, or JSON by extension) as a table, its size and syntax checked."""
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
    return body


def load_spec_file(path: Path) -> RunSpec:
    """Read a user's spec file and check it (its files already named by digest)."""
    body = read_spec_file(path)
    try:
        return parse_spec_body(body)
    except RecordError as e:
        raise RunSpecError(f"spec file {path}: {str(e).removeprefix('run spec: ')}") from None

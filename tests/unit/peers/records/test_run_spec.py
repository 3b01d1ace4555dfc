"""peers/records/run_spec.py: self-certifying run IDs, signed specs, and spec files."""

from __future__ import annotations

import base64
import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest

from swarmd.errors import RecordError, RunSpecError
from swarmd.models.presets import DEFAULT_RUN
from swarmd.peers.records.envelope import sign_record
from swarmd.peers.records.identity import Identity
from swarmd.peers.records.run_id import check_run_id, derive_run_id
from swarmd.peers.records.run_spec import (
    KIND,
    MAX_SPEC_FILE_BYTES,
    RunSpec,
    load_spec_file,
    parse_spec_body,
    sign_run_spec,
    verify_run_spec,
)

pytestmark = pytest.mark.timeout(30)

SPEC_TOML = """\
name = "toml-run"
stages = 2

[model]
family = "llama"
layers = 4
hidden = 64
heads = 8
vocab = 1000
seq_len = 32

[data]
corpus = "builtin"

[batch]
sequences = 16
micro_batch = 2

[optimizer]
name = "sgd"
lr = 0.1
weight_decay = 0
max_staleness = 2
"""


@pytest.fixture(scope="module")
def creator() -> Identity:
    return Identity.generate()


def body(**changes: Any) -> dict[str, Any]:
    """DEFAULT_RUN with ``section__key=value`` (or top-level ``key=value``) changes."""
    b = copy.deepcopy(DEFAULT_RUN)
    for name, value in changes.items():
        section, _, key = name.partition("__")
        if key:
            b[section][key] = value
        else:
            b[section] = value
    return b


def test_default_run_parses() -> None:
    spec = parse_spec_body(copy.deepcopy(DEFAULT_RUN))
    assert isinstance(spec, RunSpec)
    assert spec.name == DEFAULT_RUN["name"]
    assert spec.to_body() == DEFAULT_RUN


def test_derive_run_id_deterministic(creator: Identity) -> None:
    run_id = derive_run_id("my-run", creator.public_key)
    assert run_id == derive_run_id("my-run", creator.public_key)
    name, _, digest = run_id.partition(".")
    assert name == "my-run"
    assert len(digest) == 24
    assert check_run_id(run_id) == run_id
    assert derive_run_id("my-run", Identity.generate().public_key) != run_id
    assert derive_run_id("my-run2", creator.public_key) != run_id


@pytest.mark.parametrize(
    "run_id",
    [
        "",
        "my-run",
        "my-run.",
        "My-run.abcdefghijklmnopqrstuvwx",
        "-run.abcdefghijklmnopqrstuvwx",
        "my-run.abcdefghijklmnopqrstuvw",  # 23 chars
        "my-run.abcdefghijklmnopqrstuvwxy",  # 25 chars
        "my-run.abcdefghijklmnopqrstuv01",  # 0 and 1 are not base32
        "my-run.ABCDEFGHIJKLMNOPQRSTUVWX",
        "a" * 41 + ".abcdefghijklmnopqrstuvwx",
        "my_run.abcdefghijklmnopqrstuvwx",
        "my-run.abcdefghijklmnopqrstuvwx/x",
        " my-run.abcdefghijklmnopqrstuvwx",
    ],
)
def test_check_run_id_rejects_malformed(run_id: str) -> None:
    with pytest.raises(RunSpecError, match="malformed"):
        check_run_id(run_id)


@pytest.mark.parametrize("run_id", [None, 123, b"my-run.abcdefghijklmnopqrstuvwx"])
def test_check_run_id_rejects_non_strings(run_id: object) -> None:
    with pytest.raises(RunSpecError, match="malformed"):
        check_run_id(run_id)  # type: ignore[arg-type]


def test_check_run_id_rejects_trailing_newline() -> None:
    with pytest.raises(RunSpecError):
        check_run_id("my-run.abcdefghijklmnopqrstuvwx\n")


def test_spec_name_with_trailing_newline_rejected() -> None:
    with pytest.raises(RecordError, match="name"):
        parse_spec_body(body(name="tiny-bytes\n"))


def test_sign_and_verify_round_trip(creator: Identity) -> None:
    spec = parse_spec_body(copy.deepcopy(DEFAULT_RUN))
    signed = sign_run_spec(creator, spec)
    assert signed.run_id == derive_run_id(spec.name, creator.public_key)
    assert signed.creator == creator.peer_id
    verified = verify_run_spec(signed.raw, signed.run_id)
    assert verified.spec == spec
    assert verified.run_id == signed.run_id
    assert verified.creator == creator.peer_id
    assert verified.raw == signed.raw


def test_verify_with_another_run_id_fails(creator: Identity) -> None:
    signed = sign_run_spec(creator, parse_spec_body(copy.deepcopy(DEFAULT_RUN)))
    other = derive_run_id("other-run", creator.public_key)
    with pytest.raises(RunSpecError, match="certifies run"):
        verify_run_spec(signed.raw, other)


def test_impostor_spec_fails(creator: Identity) -> None:
    spec = parse_spec_body(copy.deepcopy(DEFAULT_RUN))
    original = sign_run_spec(creator, spec)
    impostor = Identity.generate()
    # Same name, different content, signed by someone else.
    forged = sign_run_spec(impostor, parse_spec_body(body(optimizer__lr=5.0)))
    assert forged.spec.name == original.spec.name
    with pytest.raises(RunSpecError) as info:
        verify_run_spec(forged.raw, original.run_id)
    message = str(info.value)
    assert "certifies run" in message
    assert forged.run_id in message
    assert impostor.peer_id in message
    assert original.run_id in message


def test_tampered_spec_fails(creator: Identity) -> None:
    signed = sign_run_spec(creator, parse_spec_body(copy.deepcopy(DEFAULT_RUN)))
    envelope = json.loads(signed.raw)
    envelope["body"] = envelope["body"].replace('"lr":0.001', '"lr":0.002')
    with pytest.raises(RunSpecError, match="bad signature"):
        verify_run_spec(json.dumps(envelope).encode(), signed.run_id)


def test_spec_with_bad_schema_fails_verification(creator: Identity) -> None:
    raw = sign_record(creator, KIND, body(stages=99))
    run_id = derive_run_id("tiny-bytes", creator.public_key)
    with pytest.raises(RunSpecError, match="is invalid: run spec: stages 99 exceeds model.layers 4"):
        verify_run_spec(raw, run_id)


@pytest.mark.parametrize("raw", [None, "text", b"", b"garbage", b"{}"])
def test_verify_garbage(raw: object) -> None:
    with pytest.raises(RunSpecError, match="is invalid"):
        verify_run_spec(raw, "tiny-bytes.abcdefghijklmnopqrstuvwx")


def test_verify_wrong_kind(creator: Identity) -> None:
    raw = sign_record(creator, "heartbeat", copy.deepcopy(DEFAULT_RUN))
    with pytest.raises(RunSpecError, match="expected a run-spec record"):
        verify_run_spec(raw, derive_run_id("tiny-bytes", creator.public_key))


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"stages": 5}, "stages 5 exceeds model.layers 4"),
        ({"model__hidden": 130}, "not divisible by 4 heads"),
        ({"optimizer__name": "lion"}, "optimizer.name 'lion'"),
        ({"batch__micro_batch": 64}, "micro_batch 64 exceeds batch.sequences 16"),
        ({"model__family": "bert"}, "model.family 'bert'"),
        ({"name": "Bad Name"}, "name 'Bad Name'"),
        ({"name": ""}, "name ''"),
        ({"stages": 0}, "stages"),
        ({"stages": 2.0}, "stages"),
        ({"stages": True}, "boolean"),
        ({"model__layers": 0}, "layers"),
        ({"model__vocab": 1}, "vocab"),
        ({"optimizer__lr": -0.1}, "lr"),
        ({"optimizer__lr": "0.1"}, "lr"),
        ({"optimizer__max_staleness": 1001}, "max_staleness"),
        ({"data__corpus": 5}, "corpus"),
        ({"model": [1]}, "model"),
    ],
)
def test_bad_schema(changes: dict[str, Any], match: str) -> None:
    with pytest.raises(RecordError, match=match):
        parse_spec_body(body(**changes))


@pytest.mark.parametrize(
    ("section", "match"),
    [
        (None, "run spec: unknown"),
        ("model", "run spec.model: unknown"),
        ("data", "run spec.data: unknown"),
        ("batch", "run spec.batch: unknown"),
        ("optimizer", "run spec.optimizer: unknown"),
    ],
)
def test_unknown_fields(section: str | None, match: str) -> None:
    b = body()
    (b if section is None else b[section])["surprise"] = 1
    with pytest.raises(RecordError, match=match):
        parse_spec_body(b)


def test_missing_section() -> None:
    b = body()
    del b["batch"]
    with pytest.raises(RecordError, match="missing field 'batch'"):
        parse_spec_body(b)


def test_int_lr_accepted() -> None:
    assert parse_spec_body(body(optimizer__lr=1)).lr == 1.0


def test_load_toml_file(tmp_path: Path) -> None:
    path = tmp_path / "spec.toml"
    path.write_text(SPEC_TOML)
    spec = load_spec_file(path)
    assert spec.name == "toml-run"
    assert spec.model.family == "llama"
    assert spec.model.heads == 8
    assert spec.optimizer == "sgd"
    assert spec.weight_decay == 0.0
    assert spec.micro_batch == 2


def test_load_json_file(tmp_path: Path) -> None:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(DEFAULT_RUN))
    assert load_spec_file(path).to_body() == DEFAULT_RUN


def test_non_json_suffix_is_read_as_toml(tmp_path: Path) -> None:
    path = tmp_path / "spec.txt"
    path.write_text(SPEC_TOML)
    assert load_spec_file(path).name == "toml-run"


def test_malformed_toml(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('name = "x"\n[model\nlayers = 4\n')
    with pytest.raises(RunSpecError, match="not valid toml") as info:
        load_spec_file(path)
    assert str(path) in str(info.value)


def test_malformed_json(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text("{'name': 1}")
    with pytest.raises(RunSpecError, match="not valid json") as info:
        load_spec_file(path)
    assert str(path) in str(info.value)


def test_non_utf8_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_bytes(b'name = "\xff\xfe"\n')
    with pytest.raises(RunSpecError, match=str(path)):
        load_spec_file(path)


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    with pytest.raises(RunSpecError, match="cannot read spec file") as info:
        load_spec_file(path)
    assert str(path) in str(info.value)


def test_oversized_file(tmp_path: Path) -> None:
    path = tmp_path / "big.toml"
    path.write_text(SPEC_TOML + "#" * MAX_SPEC_FILE_BYTES + "\n")
    with pytest.raises(RunSpecError, match=f"over the {MAX_SPEC_FILE_BYTES}-byte limit") as info:
        load_spec_file(path)
    assert str(path) in str(info.value)


def test_file_schema_error_names_file_and_field(tmp_path: Path) -> None:
    path = tmp_path / "spec.toml"
    path.write_text(SPEC_TOML.replace("stages = 2", "stages = 9"))
    with pytest.raises(RunSpecError) as info:
        load_spec_file(path)
    assert str(info.value) == f"spec file {path}: stages 9 exceeds model.layers 4"


@pytest.mark.parametrize("content", ["5", "null", "true"])
def test_json_file_that_is_not_an_object(tmp_path: Path, content: str) -> None:
    path = tmp_path / "spec.json"
    path.write_text(content)
    with pytest.raises(RunSpecError, match=str(path)):
        load_spec_file(path)


def test_run_id_pk_is_the_creators(creator: Identity) -> None:
    # The run ID binds the key in the record, not the (unsigned) peer ID anyone could claim.
    signed = sign_run_spec(creator, parse_spec_body(copy.deepcopy(DEFAULT_RUN)))
    envelope = json.loads(signed.raw)
    assert base64.b64decode(envelope["pk"]) == creator.public_key


def test_exchange_section_is_optional_and_checked() -> None:
    body = copy.deepcopy(DEFAULT_RUN)
    del body["exchange"]
    assert parse_spec_body(body).local_steps == 1  # a spec signed before local steps existed
    body["exchange"] = {"local_steps": 50, "outer_lr": 0.7, "outer_momentum": 0.9}
    spec = parse_spec_body(body)
    assert (spec.local_steps, spec.outer_lr) == (50, 0.7)
    # Without an outer step the exchange's rule sets it by H (outer_lr 0, DiLoCo's momentum).
    spec = parse_spec_body({**body, "exchange": {"local_steps": 8}})
    assert (spec.outer_lr, spec.outer_momentum) == (0.0, 0.9)
    assert parse_spec_body(copy.deepcopy(DEFAULT_RUN)).outer_lr == 0.0
    body["exchange"]["local_steps"] = 5000
    with pytest.raises(RecordError, match="local_steps"):
        parse_spec_body(body)


def test_access_and_aggregation_round_trip_and_defaults_stay_out_of_the_body() -> None:
    body = copy.deepcopy(DEFAULT_RUN)
    body["exchange"] = {**body.get("exchange", {}), "aggregation": "centred-clip"}
    body["access"] = {"membership": "allowlist", "allowlist": ["12D3KooWabc"], "checkpoints": "members"}
    spec = parse_spec_body(body)
    assert (spec.aggregation, spec.membership, spec.allowlist, spec.checkpoint_access) == (
        "centred-clip",
        "allowlist",
        ("12D3KooWabc",),
        "members",
    )
    assert parse_spec_body(spec.to_body()) == spec
    assert "access" not in parse_spec_body(copy.deepcopy(DEFAULT_RUN)).to_body()


@pytest.mark.parametrize(
    ("access", "words"),
    [
        ({"membership": "closed"}, "access.membership 'closed' is not one of open, allowlist, token"),
        ({"membership": "allowlist"}, "names nobody"),
        ({"checkpoints": "friends"}, "access.checkpoints"),
        ({"allowlist": ["x"] * 401}, "401 items, over 400"),
        ({"who": 1}, "unknown fields"),
    ],
)
def test_bad_access_is_refused_naming_the_field(access: dict[str, object], words: str) -> None:
    body = copy.deepcopy(DEFAULT_RUN)
    body["access"] = access
    with pytest.raises(RecordError, match=re.escape(words)):
        parse_spec_body(body)


def test_the_specs_aggregations_are_the_ones_a_shard_applies() -> None:
    from swarmd.models.robust_aggregation import AGGREGATIONS as APPLIED
    from swarmd.peers.records.run_spec import AGGREGATIONS

    assert AGGREGATIONS == APPLIED


def test_a_prepared_dataset_and_a_held_out_score_are_pinned_and_signed(creator: Identity) -> None:
    body = copy.deepcopy(DEFAULT_RUN)
    body["data"] = {"manifest": "ab" * 32, "tokenizer": "cd" * 32}
    body["eval"] = {"every": 10, "sequences": 128}
    spec = parse_spec_body(body)
    assert (spec.corpus, spec.manifest_sha256, spec.tokenizer_sha256) == ("", "ab" * 32, "cd" * 32)
    assert (spec.eval_every, spec.eval_sequences) == (10, 128)
    assert spec.to_body() == body
    signed = sign_run_spec(creator, spec)
    assert verify_run_spec(signed.raw, signed.run_id).spec == spec
    # A dataset prepared as bytes has no tokenizer file to pin.
    body["data"] = {"manifest": "ab" * 32}
    assert parse_spec_body(body).to_body()["data"] == {"manifest": "ab" * 32}


def test_the_default_run_signs_as_before_the_data_and_eval_tables(creator: Identity) -> None:
    spec = parse_spec_body(copy.deepcopy(DEFAULT_RUN))
    assert (spec.eval_every, spec.eval_sequences) == (50, 64)
    assert spec.to_body() == DEFAULT_RUN  # no eval table, data as it was


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"corpus": "builtin", "manifest": "ab" * 32}, "either corpus .* or manifest"),
        ({}, "either corpus .* or manifest"),
        ({"manifest": "AB" * 32}, "data.manifest must be a SHA-256"),
        ({"manifest": "ab" * 31}, "data.manifest must be a SHA-256"),
        ({"manifest": "ab" * 32, "tokenizer": "x"}, "data.tokenizer must be a SHA-256"),
        ({"manifest": "ab" * 32, "shards": []}, "unknown fields"),
    ],
)
def test_a_malformed_data_table_is_refused(data: dict[str, Any], message: str) -> None:
    body = copy.deepcopy(DEFAULT_RUN)
    body["data"] = data
    with pytest.raises(RecordError, match=message):
        parse_spec_body(body)


def test_eval_bounds() -> None:
    body = copy.deepcopy(DEFAULT_RUN)
    body["eval"] = {"every": 0, "sequences": 1}
    assert parse_spec_body(body).eval_every == 0  # never scored
    body["eval"] = {"every": 5, "sequences": 0}
    with pytest.raises(RecordError, match="'sequences' = 0 is outside"):
        parse_spec_body(body)


def test_a_run_that_starts_from_a_checkpoint_pins_its_initial_weights(creator: Identity) -> None:
    body = copy.deepcopy(DEFAULT_RUN)
    body["model"] = {**body["model"], "init": "ef" * 32}
    spec = parse_spec_body(body)
    assert spec.init_sha256 == "ef" * 32 and spec.to_body() == body
    assert verify_run_spec(sign_run_spec(creator, spec).raw, sign_run_spec(creator, spec).run_id).spec == spec
    body["model"]["init"] = "/models/llama"  # a path is for the spec file: run create pins it
    with pytest.raises(RecordError, match="model.init must be a SHA-256"):
        parse_spec_body(body)


def test_the_rate_schedule_round_trips_and_stays_out_of_a_constant_runs_body() -> None:
    body = copy.deepcopy(DEFAULT_RUN)
    body["optimizer"] = {**body["optimizer"], "warmup_steps": 100, "decay_steps": 10_000, "min_lr_ratio": 0.05}
    spec = parse_spec_body(body)
    assert spec.schedule is not None and (spec.warmup_steps, spec.decay_steps, spec.min_lr_ratio) == (100, 10_000, 0.05)
    assert spec.schedule.at(0) == pytest.approx(spec.lr / 100) and spec.schedule.at(10_000) == pytest.approx(
        spec.lr * 0.05
    )
    assert parse_spec_body(spec.to_body()) == spec
    constant = parse_spec_body(copy.deepcopy(DEFAULT_RUN))
    assert constant.schedule is None and set(constant.to_body()["optimizer"]) == set(DEFAULT_RUN["optimizer"])
    body["optimizer"]["decay_steps"] = 50
    with pytest.raises(RecordError, match="optimizer: decay_steps = 50 must exceed warmup_steps = 100"):
        parse_spec_body(body)

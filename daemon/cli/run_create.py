"""``swarmd run create --spec FILE``: a new run's spec, its local files pinned by digest, signed.

A spec file names files on the creator's machine; the signed spec carries their SHA-256 only:

- ``[data] manifest = "DIR/manifest.json"`` (``swarmd data prepare``'s output): the manifest's
  digest, and the tokenizer's it pins (``[data] tokenizer``, when given, must be that file);
- ``[model] init = "FOLDER"`` (a Hugging Face checkpoint): the initial weights' manifest is
  made (every chunk of every stage's weights read once and hashed, with progress) and pinned;
  the model's shape comes from the checkpoint's ``config.json`` (keys given beside ``init``
  must agree with it; ``seq_len`` is the run's own).

The creator's daemon finds these files again where they are (recorded beside the run's
spec); every other peer fetches what it needs and checks it against the digests.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from swarmd.errors import RunSpecError, SwarmdError

_HEX = frozenset("0123456789abcdef")


def _is_digest(value: object) -> bool:
    return isinstance(value, str) and len(value) == 64 and set(value) <= _HEX


def _local(spec_path: Path, value: object, what: str) -> Path:
    if not isinstance(value, str) or not value:
        raise RunSpecError(f"spec file {spec_path}: {what} must be a path, got {value!r}")
    path = Path(value).expanduser()
    return path if path.is_absolute() else (spec_path.parent / path).resolve()


def resolve_files(spec_path: Path, body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The spec body with its paths replaced by digests, and the local files to record."""
    body = json.loads(json.dumps(body))  # a deep copy the caller's dict does not share
    local: dict[str, Any] = {}
    data = body.get("data")
    if isinstance(data, dict) and "manifest" in data and not _is_digest(data["manifest"]):
        from swarmd.models.data.manifest import Manifest

        path = _local(spec_path, data["manifest"], "[data] manifest")
        try:
            raw = path.read_bytes()
        except OSError as e:
            raise RunSpecError(f"cannot read the data manifest {path}: {e.strerror}") from None
        manifest = Manifest.parse(raw)
        data["manifest"] = hashlib.sha256(raw).hexdigest()
        pinned = manifest.tokenizer.sha256
        if "tokenizer" in data and not _is_digest(data["tokenizer"]):
            tokenizer = _local(spec_path, data["tokenizer"], "[data] tokenizer")
            from swarmd.data.store import sha256_file

            if pinned is None or sha256_file(tokenizer) != pinned:
                raise RunSpecError(
                    f"[data] tokenizer {tokenizer} is not the tokenizer the manifest {path} was prepared with; "
                    "leave it out (the manifest names its own) or prepare the data again with it"
                )
        if pinned is not None:
            data["tokenizer"] = pinned
        model = body.get("model")
        vocab = model.get("vocab") if isinstance(model, dict) else None
        if isinstance(vocab, int) and vocab < manifest.tokenizer.vocab:
            raise RunSpecError(
                f"[model] vocab = {vocab} is smaller than the tokenizer's {manifest.tokenizer.vocab} ids; "
                f"set vocab to at least {manifest.tokenizer.vocab} (a multiple of 64 is kind to accelerators)"
            )
        local["manifest"] = str(path)
    model = body.get("model")
    if isinstance(model, dict) and "init" in model and not _is_digest(model["init"]):
        local["init_folder"] = _local(spec_path, model["init"], "[model] init")
        shape = _shape_of_checkpoint(spec_path, local["init_folder"], model, body.get("stages"))
        model.clear()
        model.update(shape, init=str(local["init_folder"]))
    return body, local


def _shape_of_checkpoint(spec_path: Path, folder: Path, given: dict[str, Any], stages: object) -> dict[str, Any]:
    """The model table of a run that starts from ``folder``: its config's shape. A tied
    checkpoint is untied on import for a run of several stages (its head starts as a copy of the
    embedding: ``models/stages.py`` says why tied needs one stage); keys given beside ``init``
    must describe the same model."""
    from swarmd.models.pretrained import shape_from_checkpoint
    from swarmd.models.shape import ModelShape

    if "seq_len" not in given:
        raise RunSpecError(f"spec file {spec_path}: [model] init needs seq_len, the run's sequence length")
    tied = given.get("tied", None if stages == 1 else False)
    shape = shape_from_checkpoint(folder, seq_len=int(given["seq_len"]), tied=tied)
    table = shape.to_dict()
    extra = {k: v for k, v in given.items() if k not in ("init", "seq_len")}
    try:
        same = ModelShape.from_dict({**table, **extra}) == shape
    except (SwarmdError, TypeError, ValueError):
        same = False
    if not same:
        differ = sorted(k for k, v in extra.items() if table.get(k, v) != v or k not in table)
        raise RunSpecError(
            f"spec file {spec_path}: [model] {', '.join(differ) or 'keys'} disagree with the checkpoint {folder} "
            f"({', '.join(f'{k} = {table.get(k)!r}' for k in differ)}); leave them out: its config.json says them"
        )
    return table


def create(spec_path: Path, state_dir: Path) -> tuple[str, Path]:
    """Sign the run ``spec_path`` describes with this peer's key; returns its run ID and where
    the signed spec was saved."""
    from swarmd.peers.records.identity import load_or_create_identity
    from swarmd.peers.records.run_spec import parse_spec_body, read_spec_file, sign_run_spec
    from swarmd.system.state_dir import record_local_files, save_spec

    raw_body = read_spec_file(spec_path)
    body, local = resolve_files(spec_path, raw_body)
    folder = local.pop("init_folder", None)
    initial_bytes = None
    if folder is not None:
        shape_spec = parse_spec_body({**body, "model": {k: v for k, v in body["model"].items() if k != "init"}})
        from swarmd.cli.progress import ProgressLine
        from swarmd.models.initial_weights import describe

        progress = ProgressLine(f"reading the checkpoint {folder} (every stage's weights, hashed chunk by chunk)")
        weights = describe(folder, shape_spec.model, shape_spec.stages, progress.update)
        progress.done(f"{sum(weights.sizes):,} parameters in {sum(map(len, weights.chunks))} chunks")
        initial_bytes = weights.to_json()
        body["model"]["init"] = hashlib.sha256(initial_bytes).hexdigest()
        local["init"] = str(folder)
    try:
        spec = parse_spec_body(body)
    except Exception as e:
        raise RunSpecError(f"spec file {spec_path}: {str(e).removeprefix('run spec: ')}") from None
    identity = load_or_create_identity(state_dir)
    signed = sign_run_spec(identity, spec)
    path = save_spec(state_dir, signed)
    if initial_bytes is not None:
        from swarmd.system.state_dir import run_checkpoint_dir

        stored = run_checkpoint_dir(state_dir, signed.run_id) / "initial-weights.json"
        stored.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        stored.write_bytes(initial_bytes)
        local["initial"] = str(stored)
    if local:
        record_local_files(state_dir, signed.run_id, local)
    print(f"Signed by {identity.peer_id}; saved to {path}.", file=sys.stderr)
    print(f"Access: {spec.access_summary()}.", file=sys.stderr)
    return signed.run_id, path

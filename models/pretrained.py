"""Reading a local Hugging Face checkpoint folder: its digest, its shape, and any stage's slice.

A run that starts from a released model names a folder (``config.json`` and safetensors
weights, one file or shards with an index). :func:`checkpoint_digest` pins it: one SHA-256 over
the config and every weight file. :func:`shape_from_checkpoint` reads the model's shape from
its config, refusing what swarmd would build differently. :func:`read_stage_slice` reads one
span of a stage's flat parameter vector (the order a shard slices) straight from the
safetensors files, touching only the tensors, and the rows of them, that the span covers: a
parameter server of a 70B model reads its own slice, never the model.

Tied checkpoints (Llama 3.2 1B, GPT-2) store the embedding alone. Read into an untied shape
they are *untied on import*: the head starts as a copy of the embedding and trains on its own
from there, which is what a run of more than one stage needs (``stages.check_tied_stages``).

Nothing here downloads anything, and nothing in a folder is trusted: the config's size is
bounded, the index's file names must be plain names in the folder, every tensor's shape is
checked against the model's.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import safe_open

from swarmd.models.shape import FAMILIES, ModelError, ModelShape
from swarmd.models.stages import EMBEDDING_KEYS, HEAD_KEY, stage_parameter_shapes, stage_sizes

if TYPE_CHECKING:
    from transformers import PretrainedConfig

__all__ = [
    "PretrainedError",
    "checkpoint_digest",
    "checkpoint_files",
    "read_stage_slice",
    "shape_from_checkpoint",
    "stage_sizes",
]

logger = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
MAX_CONFIG_BYTES = 1024 * 1024
MAX_INDEX_BYTES = 64 * 1024 * 1024
"""An index names every tensor once; a 400B model's is a few MB."""
DIGEST_FORMAT = b"swarmd-checkpoint/1\n"
_FLOAT_DTYPES = {"F32", "F16", "BF16", "F64"}


def _config_class(family: str) -> type[PretrainedConfig]:
    from transformers import GPT2Config, LlamaConfig  # where a checkpoint is read: not at a daemon's start

    return {"gpt2": GPT2Config, "llama": LlamaConfig}[family]


_TIED_BY_DEFAULT = {"gpt2": True, "llama": False}
"""``tie_word_embeddings`` when a config.json leaves it out (GPT2Config's and LlamaConfig's defaults)."""
_BASE_PREFIX = {"gpt2": "transformer.", "llama": "model."}
"""A checkpoint saved from the base model (``GPT2Model``, OpenAI's GPT-2 files) names its
tensors without this prefix; transformers adds it on loading, and so does the reader here."""


class PretrainedError(ModelError):
    """A checkpoint folder is unreadable or malformed, or holds a model swarmd would build differently."""


# ---- which files, and their digest ----


def checkpoint_files(folder: str | Path) -> list[str]:
    """The names, relative to ``folder``, of the files its digest covers: ``config.json`` and the
    safetensors weights (``model.safetensors``, or the index and every shard it lists), sorted."""
    folder = Path(folder)
    if not (folder / CONFIG_FILE).is_file():
        raise PretrainedError(f"{folder} has no {CONFIG_FILE}; name a Hugging Face checkpoint folder")
    # The order transformers looks in: one file first, then an index.
    if (folder / WEIGHTS_FILE).is_file():
        return sorted([CONFIG_FILE, WEIGHTS_FILE])
    if (folder / INDEX_FILE).is_file():
        return sorted({CONFIG_FILE, INDEX_FILE, *_read_index(folder).values()})
    if any((folder / name).is_file() for name in ("pytorch_model.bin", "pytorch_model.bin.index.json")):
        raise PretrainedError(
            f"{folder} holds pytorch_model.bin weights, which are pickles (they can run code when read) "
            f"and cannot be read in slices; re-save it with safetensors: "
            f"AutoModelForCausalLM.from_pretrained(folder).save_pretrained(new_folder)"
        )
    raise PretrainedError(f"{folder} has no {WEIGHTS_FILE} or {INDEX_FILE}; it holds no safetensors weights")


def checkpoint_digest(folder: str | Path) -> str:
    """The SHA-256 that pins a checkpoint: over each of :func:`checkpoint_files`'s names and its
    own SHA-256, in sorted order. Files are hashed in chunks, so memory stays flat."""
    folder = Path(folder)
    outer = hashlib.sha256(DIGEST_FORMAT)
    for name in checkpoint_files(folder):
        with (folder / name).open("rb") as f:
            inner = hashlib.file_digest(f, "sha256")
        outer.update(f"{name}\t{inner.hexdigest()}\n".encode())
    return outer.hexdigest()


def _read_index(folder: Path) -> dict[str, str]:
    """A sharded checkpoint's tensor -> file map; the file names are untrusted and checked."""
    path = folder / INDEX_FILE
    index = _read_json(path, MAX_INDEX_BYTES)
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise PretrainedError(f"{path} has no weight_map table of tensor names to files")
    for key, name in weight_map.items():
        if not isinstance(key, str) or not isinstance(name, str) or not _plain_file_name(name):
            raise PretrainedError(
                f"{path} maps {key!r} to {name!r}; shard names must be plain .safetensors file names "
                f"in the checkpoint folder (no directories, no '..')"
            )
    for name in set(weight_map.values()):
        if not (folder / name).is_file():
            raise PretrainedError(f"{path} names shard {name!r}, which is not in {folder}; copy the whole folder")
    return dict(weight_map)


def _plain_file_name(name: str) -> bool:
    return (
        name.endswith(".safetensors")
        and Path(name).name == name
        and "/" not in name
        and "\\" not in name
        and ".." not in name
        and name.isprintable()
    )


def _read_json(path: Path, limit: int) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise PretrainedError(f"cannot read {path}: {e}") from None
    if len(data) > limit:
        raise PretrainedError(f"{path} is over {limit} bytes; that is no checkpoint's {path.name}")
    try:
        value = json.loads(data)
    except ValueError as e:
        raise PretrainedError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise PretrainedError(f"{path} must hold a JSON object, not {type(value).__name__}")
    return value


# ---- the shape ----


def shape_from_checkpoint(folder: str | Path, *, seq_len: int, tied: bool | None = None) -> ModelShape:
    """The shape of the checkpoint's model, for a run of ``seq_len`` tokens a sequence.

    ``tied`` None keeps the checkpoint's choice; False unties a tied checkpoint on import (the
    head starts as a copy of the embedding: what a run of more than one stage needs). A config
    that swarmd would build differently is refused, naming the key and its value. Dropout
    settings are not part of the shape (swarmd trains with none) and are ignored.
    """
    folder = Path(folder)
    path = folder / CONFIG_FILE
    raw = _read_json(path, MAX_CONFIG_BYTES)
    family = raw.get("model_type")
    if not isinstance(family, str) or family not in FAMILIES:
        raise PretrainedError(
            f"{path}: model_type {family!r} is not a family swarmd builds; supported: {', '.join(FAMILIES)}"
        )
    if "quantization_config" in raw:
        raise PretrainedError(f"{path}: quantization_config is set; swarmd reads float weights only (bf16, fp16, fp32)")
    try:
        # The family's config class reads the file as from_pretrained would: legacy keys
        # (rope_scaling, rope_theta at the top) land where transformers 5 keeps them.
        config = _config_class(family).from_dict(raw)
    except (TypeError, ValueError, KeyError) as e:
        raise PretrainedError(f"{path}: transformers cannot read it as a {family} config: {e}") from None
    fields = _gpt2_fields(config, path) if family == "gpt2" else _llama_fields(config, path)
    if not isinstance(seq_len, int) or isinstance(seq_len, bool) or seq_len < 1:
        raise PretrainedError(f"seq_len must be a positive integer, got {seq_len!r}")
    positions = fields["positions"]
    if isinstance(positions, int) and seq_len > positions:
        raise PretrainedError(
            f"seq_len {seq_len} is longer than the {positions} positions the checkpoint {folder} covers "
            f"({'n_positions' if family == 'gpt2' else 'max_position_embeddings'}); use seq_len <= {positions}"
        )
    checkpoint_tied = bool(fields.pop("tied"))
    if tied and not checkpoint_tied:
        raise PretrainedError(
            f"{path}: tie_word_embeddings is false (the checkpoint has a head of its own), so it cannot be "
            f"read as tied = true; leave tied out"
        )
    try:
        return ModelShape(family=family, seq_len=seq_len, tied=checkpoint_tied if tied is None else tied, **fields)
    except ModelError as e:
        raise PretrainedError(f"{path}: {e}") from None


def _refuse(path: Path, checks: dict[str, tuple[object, object]]) -> None:
    """Refuse the first key whose value differs from what swarmd builds."""
    for key, (value, built) in checks.items():
        if value != built:
            raise PretrainedError(
                f"{path}: {key} = {value!r}, but swarmd builds {key} = {built!r}; "
                f"this checkpoint's model would compute differently, so it cannot start a run"
            )


def _gpt2_fields(config: Any, path: Path) -> dict[str, Any]:
    _refuse(
        path,
        {
            "activation_function": (config.activation_function, "gelu_new"),
            "scale_attn_weights": (config.scale_attn_weights, True),
            "scale_attn_by_inverse_layer_idx": (config.scale_attn_by_inverse_layer_idx, False),
            "reorder_and_upcast_attn": (config.reorder_and_upcast_attn, False),
            "add_cross_attention": (config.add_cross_attention, False),
        },
    )
    return {
        "layers": config.n_layer,
        "hidden": config.n_embd,
        "heads": config.n_head,
        "vocab": config.vocab_size,
        "intermediate": config.n_inner or 0,
        "positions": config.n_positions,
        "norm_eps": config.layer_norm_epsilon,
        "tied": config.tie_word_embeddings,
    }


def _llama_fields(config: Any, path: Path) -> dict[str, Any]:
    heads, hidden = config.num_attention_heads, config.hidden_size
    rope = dict(config.rope_parameters or {})
    if any(isinstance(value, dict) for value in rope.values()):
        raise PretrainedError(
            f"{path}: rope_parameters differ per layer type ({sorted(rope)}); swarmd builds one rotary"
        )
    rope.pop("type", None)  # the legacy name of rope_type, which transformers copied over
    rope_type = rope.get("rope_type", "default")
    _refuse(
        path,
        {
            "hidden_act": (config.hidden_act, "silu"),
            "attention_bias": (config.attention_bias, False),
            "mlp_bias": (config.mlp_bias, False),
            "head_dim": (config.head_dim, hidden // heads if isinstance(heads, int) and heads > 0 else None),
            "rope_parameters.partial_rotary_factor": (rope.pop("partial_rotary_factor", 1.0), 1.0),
        },
    )
    theta = rope.pop("rope_theta", None)
    if rope_type == "default":
        rope = {}  # plain rotary embeddings: no scaling table (anything else left is refused below)
    return {
        "layers": config.num_hidden_layers,
        "hidden": hidden,
        "heads": heads,
        "kv_heads": config.num_key_value_heads or heads,
        "vocab": config.vocab_size,
        "rope_theta": theta if theta is not None else 10000.0,
        "intermediate": config.intermediate_size,
        "positions": config.max_position_embeddings,
        "norm_eps": config.rms_norm_eps,
        "rope_scaling": rope,
        "tied": config.tie_word_embeddings,
    }


# ---- a stage's slice ----


def read_stage_slice(
    folder: str | Path, shape: ModelShape, ranges: Sequence[tuple[int, int]], stage: int, lo: int, hi: int
) -> torch.Tensor:
    """Values ``[lo, hi)`` of stage ``stage``'s flat vector, float32, read from the checkpoint.

    The vector is the one ``cell_compute.flatten_parameters`` gives for
    ``StageModule.from_shape(shape, seed, ranges, stage)``: its parameters in
    ``named_parameters()`` order. Only the tensors that overlap ``[lo, hi)`` are opened, and of
    those only the rows the span covers, so memory is bounded by the slice, not the model.
    bf16 and fp16 weights are widened to float32 exactly.
    """
    folder = Path(folder)
    plan = tuple((int(a), int(b)) for a, b in ranges)
    layout = stage_parameter_shapes(shape, plan, stage)
    total = sum(math.prod(dims) for _, dims in layout)
    if not 0 <= lo <= hi <= total:
        raise PretrainedError(f"slice [{lo}, {hi}) of stage {stage} is outside its {total} values")
    locate = _Locator(folder, shape.family)
    if shape.tied and not locate.tied:
        raise PretrainedError(
            f"the shape is tied, but the checkpoint {folder} has a head of its own (tie_word_embeddings is "
            f"false) that a tied model would drop; read it into an untied shape (tied = false)"
        )
    wanted: dict[str, list[tuple[str, str, tuple[int, ...], int, int, int]]] = {}
    start = 0
    for name, dims in layout:
        size = math.prod(dims)
        a, b = max(lo, start), min(hi, start + size)
        if a < b:
            key, file = locate(name)
            wanted.setdefault(file, []).append((name, key, dims, a - start, b - start, a - lo))
        start += size
    out = torch.empty(hi - lo, dtype=torch.float32)
    for file, reads in wanted.items():
        with safe_open(str(folder / file), framework="pt") as f:
            for name, key, dims, a, b, at in reads:
                out[at : at + (b - a)] = _read_span(f, key, name, dims, a, b, folder / file)
    return out


class _Locator:
    """Where each of the model's parameters lies in the checkpoint: its key and its file."""

    def __init__(self, folder: Path, family: str) -> None:
        names = checkpoint_files(folder)
        if INDEX_FILE in names:
            self.files = _read_index(folder)
        else:
            with safe_open(str(folder / WEIGHTS_FILE), framework="pt") as f:
                self.files = dict.fromkeys(f.keys(), WEIGHTS_FILE)
        raw = _read_json(folder / CONFIG_FILE, MAX_CONFIG_BYTES)
        self.folder = folder
        self.family = family
        self.tied = bool(raw.get("tie_word_embeddings", _TIED_BY_DEFAULT.get(family, False)))

    def __call__(self, name: str) -> tuple[str, str]:
        found = self._find(name)
        if found is None and name == HEAD_KEY and self.tied:
            # Untie on import: a tied checkpoint stores the embedding alone, and the head of an
            # untied shape starts as a copy of it.
            found = self._find(EMBEDDING_KEYS[self.family])
        if found is None:
            raise PretrainedError(
                f"the checkpoint {self.folder} has no tensor {name!r} (nor without its "
                f"{_BASE_PREFIX[self.family]!r} prefix); it is not the model this shape describes"
            )
        return found

    def _find(self, name: str) -> tuple[str, str] | None:
        prefix = _BASE_PREFIX[self.family]
        for key in (name, name.removeprefix(prefix)) if name.startswith(prefix) else (name,):
            if key in self.files:
                return key, self.files[key]
        return None


def _read_span(f: Any, key: str, name: str, dims: tuple[int, ...], a: int, b: int, path: Path) -> torch.Tensor:
    """Values ``[a, b)`` of tensor ``key`` flattened, as float32, reading only the rows they lie in."""
    try:
        part = f.get_slice(key)
    except Exception as e:  # safetensors raises its own error types for a key a shard lacks
        raise PretrainedError(f"{path} lacks tensor {key!r} that its index places there: {e}") from None
    stored = tuple(part.get_shape())
    if stored != dims:
        raise PretrainedError(f"{path}: tensor {key!r} has shape {stored}, but the model's {name} has {dims}")
    dtype = part.get_dtype()
    if dtype not in _FLOAT_DTYPES:
        raise PretrainedError(f"{path}: tensor {key!r} is {dtype}; swarmd reads float weights (F32, F16, BF16)")
    if not dims:
        return part[...].reshape(-1)[a:b].to(torch.float32)
    row = math.prod(dims[1:])
    first, last = a // row, -(-b // row)
    values = part[first:last].reshape(-1)
    return values[a - first * row : b - first * row].to(torch.float32)

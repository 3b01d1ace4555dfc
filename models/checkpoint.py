"""Checkpoints (safetensors, written so a crash never leaves a corrupt one) and model export.

A parameter server checkpoints its stage with :func:`save_safetensors_atomic`: the file is
written under a temporary name in the same folder, flushed to disk, then renamed over the
old one, and the folder is flushed so the rename itself survives a power cut. A reader sees
the old checkpoint or the new one, never half of one.

:func:`export_pretrained` writes the folder that ``AutoModelForCausalLM.from_pretrained``
loads: ``config.json``, ``model.safetensors``, the run's tokenizer's files (the byte tokenizer
unless told otherwise) and a model card that says which tokenizer it is.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load as load_tensors_from_bytes
from safetensors.torch import save_file

from swarmd.errors import SwarmdError
from swarmd.models.tokenizer import ByteTokenizer

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from swarmd.models.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

MODEL_FILE = "model.safetensors"
"""The weights file of an exported folder (the name ``from_pretrained`` looks for)."""


class CheckpointError(SwarmdError):
    """A checkpoint or export could not be written, or one on disk is missing or corrupt."""


def save_safetensors_atomic(
    tensors: dict[str, torch.Tensor], path: str | Path, metadata: dict[str, str] | None = None
) -> None:
    """Write ``tensors`` to ``path`` as safetensors; a crash at any point leaves the old file whole.

    Tensors are copied to CPU and made contiguous; tensors that share memory (tied weights)
    are stored as separate copies.
    """
    path = Path(path)
    if metadata is not None:
        bad = {k: v for k, v in metadata.items() if not isinstance(k, str) or not isinstance(v, str)}
        if bad:
            raise CheckpointError(f"checkpoint metadata must map str to str; not so for {sorted(map(str, bad))}")
    prepared = _prepare(tensors)
    folder = path.parent
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    tmp = Path(tmp_name)
    try:
        os.close(fd)
        save_file(prepared, tmp, metadata=metadata)
        _fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(e, OSError | SafetensorError):
            raise CheckpointError(f"could not write checkpoint {path}: {e}") from e
        raise
    _fsync_dir(folder)
    logger.debug("wrote checkpoint %s (%d tensors)", path, len(prepared))


def load_safetensors(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The tensors and metadata of a safetensors file, on CPU.

    Raises CheckpointError naming the path when the file is missing, truncated or corrupt.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}")
    try:
        tensors: dict[str, torch.Tensor] = {}
        with safe_open(str(path), framework="pt", device="cpu") as f:
            metadata = dict(f.metadata() or {})
            for key in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                tensors[key] = f.get_tensor(key)
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        size = path.stat().st_size if path.exists() else 0
        raise CheckpointError(
            f"checkpoint {path} ({size} bytes) is corrupt or truncated: {e}; restore it from another copy or delete it"
        ) from e
    return tensors, metadata


def load_safetensors_bytes(data: bytes) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The tensors and metadata of a safetensors file held in memory (one received from a peer).

    Raises CheckpointError when the bytes are not a whole safetensors file.
    """
    # The header is 8 bytes of little-endian length, then that much JSON; safetensors checks
    # that the tensors' offsets cover the rest exactly.
    if len(data) < 8:
        raise CheckpointError(f"a {len(data)}-byte checkpoint is too short for a safetensors header (8 bytes)")
    length = int.from_bytes(data[:8], "little")
    if length > len(data) - 8:
        raise CheckpointError(f"checkpoint header claims {length} bytes; only {len(data) - 8} follow: truncated")
    try:
        header = json.loads(data[8 : 8 + length])
        tensors = load_tensors_from_bytes(data)
    except (SafetensorError, ValueError, RuntimeError) as e:  # JSONDecodeError is a ValueError
        raise CheckpointError(f"a {len(data)}-byte checkpoint is corrupt or truncated: {e}") from e
    raw = header.get("__metadata__") if isinstance(header, dict) else None
    if raw is not None and not (isinstance(raw, dict) and all(isinstance(v, str) for v in raw.values())):
        raise CheckpointError("checkpoint metadata is not a map of strings")
    return tensors, dict(raw or {})


def tensors_digest(tensors: dict[str, torch.Tensor]) -> str:
    """SHA-256 over every tensor's name, dtype, shape and bytes, in name order (hex).

    Covers what a reader uses, so the same tensors always give the same digest whatever the
    file's layout; the metadata is not covered (a writer stores the digest there).
    """
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu").contiguous()
        h.update(json.dumps([name, str(t.dtype), list(t.shape)]).encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy().data)
    return h.hexdigest()


def export_pretrained(
    config: PretrainedConfig,
    state_dict: dict[str, torch.Tensor],
    out_dir: str | Path,
    *,
    overwrite: bool = False,
    corpus: str = "builtin",
    corpus_sha256: str | None = None,
    run_id: str | None = None,
    tokenizer: Tokenizer | None = None,
) -> Path:
    """Write a folder that ``AutoModelForCausalLM.from_pretrained(out_dir)`` loads, and return it.

    ``state_dict`` must have exactly the keys and shapes of the model ``config`` describes
    (checked against a weightless instance of it). The folder is assembled under a temporary
    name next to ``out_dir`` and renamed into place, so a crash leaves no half-written export.
    An existing non-empty ``out_dir`` is refused unless ``overwrite``. ``tokenizer`` is the one
    the run trained with (default: bytes); its end-of-text id becomes the config's eos and bos.
    """
    out_dir = Path(out_dir)
    tokenizer = tokenizer if tokenizer is not None else ByteTokenizer()
    _check_destination(out_dir, overwrite)
    if tokenizer.vocab_size > int(config.vocab_size):
        raise CheckpointError(
            f"the tokenizer has {tokenizer.vocab_size} ids, more than the model's vocabulary of "
            f"{config.vocab_size}: export with the tokenizer the run trained with"
        )
    config = _special_token_config(config, tokenizer.eot_id)
    _check_state_dict(config, state_dict)

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
    try:
        config.save_pretrained(tmp)
        save_safetensors_atomic(state_dict, tmp / MODEL_FILE, metadata={"format": "pt"})
        max_length = getattr(config, "n_positions", None) or getattr(config, "max_position_embeddings", None)
        tokenizer.save_pretrained_files(tmp, model_max_length=max_length)
        card = _model_card(config, tokenizer, corpus=corpus, corpus_sha256=corpus_sha256, run_id=run_id)
        (tmp / "README.md").write_text(card, encoding="utf-8")
        for file in tmp.iterdir():
            _fsync_file(file)
        _fsync_dir(tmp)
        _move_into_place(tmp, out_dir, overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    logger.info("exported model to %s", out_dir)
    return out_dir


def _prepare(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """CPU, contiguous, detached tensors, none sharing memory with another (safetensors refuses that)."""
    prepared: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for key, tensor in tensors.items():
        if not isinstance(tensor, torch.Tensor):
            raise CheckpointError(f"checkpoint entry {key!r} is a {type(tensor).__name__}, not a tensor")
        t = tensor.detach().to("cpu").contiguous()
        storage = t.untyped_storage().data_ptr()
        if t.numel() and storage in seen:
            t = t.clone()
        elif t.numel():
            seen.add(storage)
        prepared[key] = t
    return prepared


def _special_token_config(config: PretrainedConfig, eot_id: int | None) -> PretrainedConfig:
    """A copy of ``config`` whose eos and bos are the tokenizer's end of text, and with no id outside its vocabulary.

    GPT-2's config defaults to bos/eos id 50256, which a 256-byte vocabulary cannot produce;
    ``generate`` would warn about it or pad with it. A byte model has no special tokens; a BPE
    model's documents were separated by its end-of-text token, so generation stops at it.
    """
    config = copy.deepcopy(config)
    if eot_id is not None:
        config.eos_token_id = eot_id
        config.bos_token_id = eot_id
    vocab = int(config.vocab_size)
    for attr in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = getattr(config, attr, None)
        ids = value if isinstance(value, list) else [value]
        if value is not None and any(i is None or not 0 <= int(i) < vocab for i in ids):
            logger.debug("export: dropping %s=%s, outside the vocabulary of %d", attr, value, vocab)
            setattr(config, attr, None)
    return config


def _check_state_dict(config: PretrainedConfig, state_dict: dict[str, torch.Tensor]) -> None:
    """Refuse a state dict whose keys or shapes differ from those of the model ``config`` builds."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        expected = AutoModelForCausalLM.from_config(config).state_dict()
    missing = sorted(set(expected) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(expected))
    wrong = sorted(
        f"{k}: {tuple(state_dict[k].shape)} != {tuple(expected[k].shape)}"
        for k in set(expected) & set(state_dict)
        if tuple(state_dict[k].shape) != tuple(expected[k].shape)
    )
    if missing or unexpected or wrong:
        raise CheckpointError(
            f"the weights do not fit a {config.model_type} model of this config: "
            f"missing {missing[:5]} ({len(missing)}), unexpected {unexpected[:5]} ({len(unexpected)}), "
            f"wrong shape {wrong[:5]} ({len(wrong)})"
        )


def _check_destination(out_dir: Path, overwrite: bool) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise CheckpointError(f"export destination {out_dir} exists and is not a folder; choose another path")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not overwrite:
        raise CheckpointError(
            f"export destination {out_dir} exists and is not empty; choose another path or pass overwrite"
        )


def _move_into_place(tmp: Path, out_dir: Path, overwrite: bool) -> None:
    """Rename the finished folder ``tmp`` to ``out_dir``; an old ``out_dir`` goes only once the new one is in."""
    _check_destination(out_dir, overwrite)  # again: it may have changed while we wrote
    old: Path | None = None
    if out_dir.is_dir():
        if any(out_dir.iterdir()):
            old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".old", dir=out_dir.parent))
            os.replace(out_dir, old)  # onto the empty folder mkdtemp made
        else:
            out_dir.rmdir()
    os.replace(tmp, out_dir)
    _fsync_dir(out_dir.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _tokenizer_lines(tokenizer: Tokenizer) -> tuple[str, str]:
    """The model card's tokenizer line, and the comment on its ``AutoTokenizer`` line."""
    if tokenizer.kind == "bytes":
        return (
            "bytes. Token id = UTF-8 byte value (0-255); there are no special tokens, so\n"
            "  generation stops only at `max_new_tokens`.",
            "byte-level: ids are UTF-8 bytes",
        )
    eot = (
        f"end of text `{tokenizer.eot_token}` = id {tokenizer.eot_id} (the eos: documents were separated by it)"
        if tokenizer.eot_token
        else "no end-of-text token, so generation stops only at `max_new_tokens`"
    )
    return (
        f"{tokenizer.kind.upper()}, `tokenizer.json` of {tokenizer.vocab_size} ids, SHA-256\n"
        f"  `{tokenizer.sha256}`; {eot}.",
        "the tokenizer.json the run trained with",
    )


def _model_card(
    config: PretrainedConfig, tokenizer: Tokenizer, *, corpus: str, corpus_sha256: str | None, run_id: str | None
) -> str:
    layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", "?")
    hidden = getattr(config, "hidden_size", None) or getattr(config, "n_embd", "?")
    corpus_line = (
        "the corpus built into swarmd: the Python reference documentation shipped with CPython "
        "(`pydoc_data.topics`, PSF License)"
        if corpus == "builtin"
        else f"`{corpus}`"
    )
    digest_line = f"\n- Corpus SHA-256: `{corpus_sha256}`" if corpus_sha256 else ""
    run_line = f"\n- swarmd run ID: `{run_id}`" if run_id else ""
    tokenizer_line, tokenizer_comment = _tokenizer_lines(tokenizer)
    plain = (
        "\nWithout the tokenizer files the ids are plain bytes:\n"
        '`ids = torch.tensor([list(text.encode())])` and `bytes(out[0].tolist()).decode("utf-8", "replace")`.\n'
        if tokenizer.kind == "bytes"
        else ""
    )
    return f"""\
# swarmd model

A causal language model trained by swarmd, a peer-to-peer volunteer training daemon.

- Architecture: `{config.model_type}`, {layers} layers, hidden size {hidden}, vocabulary {config.vocab_size}
- Training data: {corpus_line}{digest_line}{run_line}
- Tokenizer: {tokenizer_line}

## Generate

```python
from transformers import AutoModelForCausalLM, AutoTokenizer

model = AutoModelForCausalLM.from_pretrained("PATH")
tokenizer = AutoTokenizer.from_pretrained("PATH")  # {tokenizer_comment}
ids = tokenizer("The for statement", return_tensors="pt").input_ids
out = model.generate(ids, max_new_tokens=200, do_sample=True, top_k=40)
print(tokenizer.decode(out[0]))
```
{plain}"""


def _fsync_file(path: Path) -> None:
    with path.open("rb") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    """Flush a folder's entries (a rename) to disk; POSIX only, a no-op where folders cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)

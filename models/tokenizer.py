"""The byte tokenizer: token id = UTF-8 byte value, 256 ids, no special tokens, no file needed.

It is also where the interface every tokenizer shares is written down (:class:`Tokenizer`);
``swarmd.models.bpe_tokenizer`` has the other kind, a ``tokenizers`` ``tokenizer.json``, and
``load_tokenizer``, which gives the one a run names.

A byte vocabulary is what lets the default run train with no download: any text on any
machine encodes the same way, and the model's vocabulary is exactly the 256 byte values.

For an exported model, :func:`save_pretrained_files` writes a ``tokenizer.json`` that the
``tokenizers`` library (and so ``AutoTokenizer.from_pretrained``) reads, and that maps every
byte to the same id as :class:`ByteTokenizer`: a byte-level BPE with the 256 single-byte
symbols and no merges. ``transformers.ByT5Tokenizer`` was not used: it reserves ids 0-2 for
pad/eos/unk and shifts every byte by 3 (and adds 125 sentinel ids), so its ids do not match
a model trained on raw bytes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from swarmd.errors import SwarmdError

if TYPE_CHECKING:
    import numpy as np

BYTES = "bytes"
"""The name of the byte tokenizer, where a tokenizer is named (``swarmd data prepare --tokenizer``)."""

VOCAB_SIZE = 256
"""Number of token ids: one per byte value."""

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
"""The files :func:`save_pretrained_files` writes."""


class TokenizerError(SwarmdError):
    """A tokenizer file is missing, too large, malformed, or has a vocabulary over the limit."""


class Tokenizer(Protocol):
    """What preparation, export and a run need of a tokenizer."""

    kind: str
    """``"bytes"`` or ``"bpe"``: what a data manifest records."""
    vocab_size: int
    """Number of token ids, special tokens included."""
    eot_id: int | None
    """The end-of-text id that separates documents; None when the tokenizer has none (bytes)."""
    eot_token: str | None
    """The end-of-text token's text (``<|endoftext|>``); None with ``eot_id``."""
    sha256: str | None
    """SHA-256 of the tokenizer file a run pins; None for bytes (there is no file)."""
    raw: bytes | None
    """The tokenizer file's bytes (copied beside prepared data); None for bytes."""

    def encode(self, text: str) -> list[int]: ...

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """The ids of each text as an unsigned integer array (preparation encodes in batches)."""
        ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def save_pretrained_files(self, directory: str | Path, *, model_max_length: int | None = None) -> list[Path]:
        """Write the files with which ``AutoTokenizer.from_pretrained(directory)`` gives the same ids."""
        ...


class ByteTokenizer:
    """Text to token ids and back, where a token id is a UTF-8 byte value (0-255)."""

    kind: str = BYTES
    vocab_size: int = VOCAB_SIZE
    eot_id: int | None = None
    eot_token: str | None = None
    sha256: str | None = None
    raw: bytes | None = None

    def encode(self, text: str) -> list[int]:
        """The UTF-8 bytes of ``text``, as ints."""
        return list(text.encode("utf-8"))

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """The UTF-8 bytes of each text, as uint8 arrays (no copy beyond the encoding)."""
        import numpy as np

        return [np.frombuffer(text.encode("utf-8"), dtype=np.uint8) for text in texts]

    def decode(self, ids: Sequence[int]) -> str:
        """The text of byte ids; an invalid UTF-8 sequence (a model may emit one) becomes U+FFFD.

        Raises ValueError for an id outside 0-255: that is a bug in the caller, not bad text.
        """
        bad = [i for i in ids if not 0 <= int(i) < VOCAB_SIZE]
        if bad:
            raise ValueError(f"token ids must be in 0..{VOCAB_SIZE - 1}, got {bad[:5]}")
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")

    def save_pretrained_files(self, directory: str | Path, *, model_max_length: int | None = None) -> list[Path]:
        """Write the tokenizer files of an exported model folder and return their paths.

        ``AutoTokenizer.from_pretrained(directory)`` then gives a tokenizer whose ids are the
        byte values (the same as :meth:`encode`) and whose ``decode`` replaces invalid UTF-8.
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        tokenizer_json = directory / "tokenizer.json"
        tokenizer_json.write_text(_tokenizers_json(), encoding="utf-8")
        config: dict[str, object] = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "swarmd_tokenizer": "bytes",
            "comment": (
                "Token id = UTF-8 byte value (0-255); no special tokens. "
                "Encoding: list(text.encode('utf-8')); decoding: bytes(ids).decode('utf-8', 'replace')."
            ),
        }
        if model_max_length is not None:
            config["model_max_length"] = int(model_max_length)
        tokenizer_config = directory / "tokenizer_config.json"
        tokenizer_config.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        return [tokenizer_json, tokenizer_config]


def _byte_symbols() -> list[str]:
    """The printable stand-in character of each byte value, as GPT-2's byte-level BPE maps them.

    ``tokenizers``' ByteLevel pre-tokenizer turns each byte into one of these characters, so a
    vocabulary of exactly these 256 characters, in byte order, gives id == byte value.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    symbols: dict[int, str] = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(VOCAB_SIZE):
        if b not in symbols:
            symbols[b] = chr(256 + shifted)
            shifted += 1
    return [symbols[b] for b in range(VOCAB_SIZE)]


def _tokenizers_json() -> str:
    """The serialized ``tokenizers`` tokenizer: byte-level BPE, 256 single-byte symbols, no merges."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {symbol: b for b, symbol in enumerate(_byte_symbols())}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    # No prefix space and no regex split: the text is cut into bytes and nothing else, exactly
    # like ByteTokenizer.encode.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    return str(tokenizer.to_str(pretty=True))

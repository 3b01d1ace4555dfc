"""A BPE tokenizer read from a ``tokenizers`` ``tokenizer.json``, and the training of a new one.

A run that trains on real text names its tokenizer by the SHA-256 of that file
(:func:`tokenizer_digest`): every peer encodes, decodes and exports with the very same bytes.
Any ``tokenizer.json`` the ``tokenizers`` library reads will do (GPT-2's, Llama 3's, one trained
here); :func:`train_bpe` makes a byte-level BPE as GPT-2 has: the 256 byte symbols as the initial
alphabet, so any text encodes without an unknown token, and ``<|endoftext|>`` as the one special
token, the separator of documents in prepared data.

The file is read with a size bound and its vocabulary with a bound (:data:`MAX_VOCAB`): a file
named by a run may come from anyone, and a vocabulary of millions of ids would make an embedding
no peer can hold.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from swarmd.models.data.manifest import MAX_VOCAB
from swarmd.models.files import write_atomically
from swarmd.models.tokenizer import BYTES, ByteTokenizer, Tokenizer, TokenizerError

if TYPE_CHECKING:
    import numpy as np
    from tokenizers import Tokenizer as HfTokenizer

logger = logging.getLogger(__name__)

KIND = "bpe"
"""What a data manifest records for a tokenizer of this module."""

EOT_TOKEN = "<|endoftext|>"
"""The special token that ends a document (GPT-2's); what :func:`train_bpe` adds."""

EOT_CANDIDATES = (EOT_TOKEN, "<|end_of_text|>", "</s>")
"""End-of-text tokens looked for among a file's special tokens, in order: GPT-2's (and this
module's), Llama 3's, then SentencePiece models' (Llama 2, Mistral)."""


MAX_TOKENIZER_BYTES = 64 * 1024 * 1024
"""Largest ``tokenizer.json`` read (Llama 3's is 9 MB, Gemma's about 33 MB)."""

MIN_TRAIN_VOCAB = 257
"""The 256 byte symbols and ``<|endoftext|>``: the smallest vocabulary :func:`train_bpe` makes."""

TOKENIZER_FILE = "tokenizer.json"


def load_tokenizer(name: str | Path) -> Tokenizer:
    """``"bytes"``: the byte tokenizer; otherwise the path of a ``tokenizer.json`` (checked, bounded).

    Raises TokenizerError naming the path when the file is missing, too large or malformed.
    """
    if str(name) == BYTES:
        return ByteTokenizer()
    return BpeTokenizer.from_file(name)


def tokenizer_digest(path: str | Path) -> str:
    """SHA-256 of a tokenizer file's bytes, hex: what a run spec pins."""
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


class BpeTokenizer:
    """Text to ids and back with a ``tokenizers`` ``tokenizer.json``, kept as the exact bytes read."""

    kind: str = KIND

    def __init__(self, raw: bytes, *, source: str = "tokenizer.json", max_vocab: int = MAX_VOCAB) -> None:
        from tokenizers import Tokenizer as HfTokenizer

        try:
            tokenizer = HfTokenizer.from_str(raw.decode("utf-8"))
        except Exception as e:  # UnicodeDecodeError, or the plain Exception tokenizers raises on bad JSON
            raise TokenizerError(f"{source} is not a tokenizers tokenizer.json: {e}") from None
        vocab = int(tokenizer.get_vocab_size(with_added_tokens=True))
        if not 1 <= vocab <= max_vocab:
            raise TokenizerError(
                f"{source} has a vocabulary of {vocab} ids, over the limit of {max_vocab}; use a smaller tokenizer"
            )
        # Pieces of documents that spell a special token (a web page quoting "<|endoftext|>") must
        # encode as text, not as the separator: only preparation puts the separator in.
        tokenizer.encode_special_tokens = True
        self._tokenizer = tokenizer
        self.file_bytes = raw
        """The file's bytes, written unchanged by :meth:`save_pretrained_files`."""
        self.raw: bytes | None = raw
        self.sha256: str | None = hashlib.sha256(raw).hexdigest()
        self.vocab_size = vocab
        self.eot_token: str | None = None
        self.eot_id: int | None = None
        special = {t.content: i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special}
        for candidate in EOT_CANDIDATES:
            if candidate in special:
                self.eot_token, self.eot_id = candidate, int(special[candidate])
                break

    @classmethod
    def from_file(
        cls, path: str | Path, *, max_bytes: int = MAX_TOKENIZER_BYTES, max_vocab: int = MAX_VOCAB
    ) -> BpeTokenizer:
        """Read ``path``; TokenizerError naming it when missing, over ``max_bytes``, malformed, or of too many ids."""
        path = Path(path).expanduser()
        try:
            size = path.stat().st_size
            if not path.is_file():
                raise TokenizerError(f"tokenizer {path} is not a file; give the path of a tokenizer.json or 'bytes'")
            if size > max_bytes:
                raise TokenizerError(
                    f"tokenizer {path} is {size} bytes, over the limit of {max_bytes}; is it a tokenizer.json?"
                )
            raw = path.read_bytes()
        except FileNotFoundError:
            raise TokenizerError(
                f"tokenizer {path} does not exist; give the path of a tokenizer.json "
                "('swarmd tokenizer train' makes one) or 'bytes'"
            ) from None
        except OSError as e:
            raise TokenizerError(f"cannot read tokenizer {path}: {e.strerror or e}") from None
        return cls(raw, source=f"tokenizer {path}", max_vocab=max_vocab)

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """The ids of each text as uint32 arrays, encoded on every core (``tokenizers``' thread pool)."""
        import numpy as np

        # encode_batch_fast skips the character offsets, which nothing here reads.
        encodings = self._tokenizer.encode_batch_fast(list(texts), add_special_tokens=False)
        return [np.array(e.ids, dtype=np.uint32) for e in encodings]

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tokenizer.decode([int(i) for i in ids], skip_special_tokens=False))

    def describe(self) -> str:
        eot = f"end of text {self.eot_token} = id {self.eot_id}" if self.eot_token else "no end-of-text token"
        return f"BPE tokenizer.json, {self.vocab_size} ids, {eot}, SHA-256 {self.sha256}"

    def save_pretrained_files(self, directory: str | Path, *, model_max_length: int | None = None) -> list[Path]:
        """Write ``tokenizer.json`` (the bytes read, unchanged) and ``tokenizer_config.json``.

        ``AutoTokenizer.from_pretrained(directory)`` then gives the same ids as :meth:`encode` for
        text without special tokens, and the end-of-text token as its eos (and bos, as GPT-2 has).
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        tokenizer_json = directory / TOKENIZER_FILE
        tokenizer_json.write_bytes(self.file_bytes)
        config: dict[str, object] = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "swarmd_tokenizer": KIND,
            "swarmd_tokenizer_sha256": self.sha256,
            # No bos/eos is added when encoding: a prepared dataset has the separator between
            # documents only, so the model never saw one put in front of a prompt.
            "add_bos_token": False,
            "add_eos_token": False,
        }
        if self.eot_token is not None:
            config["eos_token"] = self.eot_token
            config["bos_token"] = self.eot_token
        if model_max_length is not None:
            config["model_max_length"] = int(model_max_length)
        tokenizer_config = directory / "tokenizer_config.json"
        tokenizer_config.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        return [tokenizer_json, tokenizer_config]


def train_bpe(texts: Iterable[str], vocab_size: int, out: str | Path, *, overwrite: bool = False) -> BpeTokenizer:
    """Train a byte-level BPE of ``vocab_size`` ids on ``texts`` and write it to ``out`` (atomically).

    The same texts in the same order give the same file, byte for byte. The vocabulary may come
    out smaller than asked when the text has fewer distinct pairs to merge.
    """
    from tokenizers import Tokenizer as HfTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    if not MIN_TRAIN_VOCAB <= vocab_size <= MAX_VOCAB:
        raise TokenizerError(
            f"a vocabulary of {vocab_size} ids: give {MIN_TRAIN_VOCAB} (the 256 bytes and {EOT_TOKEN}) to {MAX_VOCAB}"
        )
    out = Path(out)
    if out.exists() and not overwrite:
        raise TokenizerError(f"{out} exists; choose another path or pass overwrite")
    tokenizer: HfTokenizer = HfTokenizer(models.BPE())
    # GPT-2's scheme: bytes mapped to printable symbols, words split by its regex, no prefix space
    # (so decoding gives the text back exactly).
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOT_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    # The trainer breaks ties between pairs by the pairs themselves and ``to_str`` writes the
    # vocabulary in id order: the same texts give the same bytes, whatever the thread count or
    # PYTHONHASHSEED (tests/unit/models/test_tokenizer.py checks it across processes).
    raw = tokenizer.to_str(pretty=True).encode("utf-8")
    write_atomically(out, raw)
    logger.info("trained a BPE of %d ids: %s", tokenizer.get_vocab_size(), out)
    return BpeTokenizer(raw, source=str(out))

"""``swarmd tokenizer train --vocab N --out FILE TEXT...``: a byte-level BPE ``tokenizer.json``.

The texts are read as ``swarmd data prepare`` reads them (plain text, JSON lines, parquet;
``swarmd.models.data.text_inputs``), streamed into ``tokenizers``' trainer. The same texts in
the same order give the same file, byte for byte, so two people can check they made the same
tokenizer by its SHA-256, which is what a run pins.

No heavy imports at module level: ``swarmd --help`` loads this (``tests/unit/cli/test_quick_checks.py``).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from swarmd.errors import ConfigError
from swarmd.models.bpe_tokenizer import MAX_VOCAB
from swarmd.models.bpe_tokenizer import MIN_TRAIN_VOCAB as MIN_VOCAB


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "tokenizer",
        help="train a byte-level BPE tokenizer (tokenizer.json) on text files",
        description="Train a byte-level BPE tokenizer (a tokenizers tokenizer.json) on text files.",
    )
    p.add_argument("action", choices=["train"], help="train: write a new tokenizer.json from TEXT files")
    p.add_argument("--vocab", type=int, required=True, metavar="N", help=f"vocabulary size, {MIN_VOCAB} to {MAX_VOCAB}")
    p.add_argument("--out", type=Path, required=True, metavar="FILE", help="the tokenizer.json to write")
    p.add_argument(
        "--text-field", default="text", metavar="NAME", help="the text field of JSON lines and parquet (default text)"
    )
    p.add_argument("--overwrite", action="store_true", help="replace FILE if it exists")
    p.add_argument(
        "inputs",
        nargs="+",
        metavar="TEXT",
        help=".txt (documents split at blank lines), .jsonl or .parquet files; .gz for gzipped text or JSON lines",
    )
    p.add_argument("--debug", action="store_true", help="tracebacks on errors")


def run(args: argparse.Namespace) -> int:
    if not MIN_VOCAB <= args.vocab <= MAX_VOCAB:
        raise ConfigError(
            f"--vocab {args.vocab}: give {MIN_VOCAB} (the 256 bytes and <|endoftext|>) to {MAX_VOCAB} ids"
        )
    if args.out.exists() and not args.overwrite:
        raise ConfigError(f"--out {args.out} exists; choose another path or pass --overwrite")
    from swarmd.cli.progress import ProgressLine
    from swarmd.models.bpe_tokenizer import train_bpe
    from swarmd.models.data.text_inputs import check_inputs, documents, total_bytes

    paths = check_inputs(args.inputs)
    total = total_bytes(paths)
    progress = ProgressLine(f"reading {len(paths)} input(s), {total / 1e6:.1f} MB, into the trainer")
    counts = {"documents": 0, "chars": 0}

    def texts() -> Iterator[str]:
        before = 0
        for path in paths:
            for text, read in documents(path, text_field=args.text_field):
                counts["documents"] += 1
                counts["chars"] += len(text)
                progress.update((before + read) / max(total, 1))
                yield text
            before += path.stat().st_size

    started = time.monotonic()
    tokenizer = train_bpe(texts(), args.vocab, args.out, overwrite=args.overwrite)
    seconds = time.monotonic() - started
    progress.done(str(args.out))
    eot = f"end of text {tokenizer.eot_token} = id {tokenizer.eot_id}" if tokenizer.eot_token else "no end of text"
    print(
        f"trained {args.out}: a byte-level BPE of {tokenizer.vocab_size:,} ids ({eot}) on "
        f"{counts['documents']:,} documents, {counts['chars'] / 1e6:.1f} M characters, in {seconds:.1f} s"
    )
    print(f"SHA-256 {tokenizer.sha256}")
    if tokenizer.vocab_size < args.vocab:
        print(
            f"note: {args.vocab:,} ids were asked for; the text has pairs for only {tokenizer.vocab_size:,}",
            file=sys.stderr,
        )
    return 0

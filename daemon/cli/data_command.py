"""``swarmd data prepare --tokenizer FILE|bytes --out DIR INPUT...``: token shards and their manifest.

What a run that trains on real text starts from: the folder it writes (shards, the tokenizer,
``manifest.json``) is named in the run spec (``[data] manifest = "DIR/manifest.json"``) and
pinned by the manifest's SHA-256, which this command prints (``swarmd.models.data.prepare``).

No heavy imports at module level: ``swarmd --help`` loads this (``tests/unit/cli/test_quick_checks.py``).
The defaults in the help are ``swarmd.models.data.prepare``'s (``tests/unit/cli/test_data_command.py``
checks they agree).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from swarmd.errors import ConfigError

DEFAULT_SHARD_TOKENS = 1 << 25
DEFAULT_VALIDATION_FRACTION = 0.005
DEFAULT_VALIDATION_MAX_TOKENS = 10_000_000


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "data",
        help="prepare token shards and a manifest from text files, for a run's [data] manifest",
        description="Tokenize text files into token shards, a held-out split and manifest.json.",
    )
    p.add_argument("action", choices=["prepare"], help="prepare: write a dataset folder from INPUT files")
    p.add_argument(
        "--tokenizer",
        required=True,
        metavar="FILE",
        help="a tokenizer.json (swarmd tokenizer train makes one) or bytes",
    )
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="the dataset folder to write")
    p.add_argument(
        "--shard-tokens",
        type=int,
        default=DEFAULT_SHARD_TOKENS,
        metavar="N",
        help=f"tokens per shard file (default {DEFAULT_SHARD_TOKENS}: 64 MiB of uint16)",
    )
    p.add_argument(
        "--validation-fraction",
        type=float,
        default=DEFAULT_VALIDATION_FRACTION,
        metavar="F",
        help=f"share of documents held out for the validation loss (default {DEFAULT_VALIDATION_FRACTION}; 0: none)",
    )
    p.add_argument(
        "--validation-max-tokens",
        type=int,
        default=DEFAULT_VALIDATION_MAX_TOKENS,
        metavar="N",
        help=f"held-out tokens at most (default {DEFAULT_VALIDATION_MAX_TOKENS})",
    )
    p.add_argument(
        "--text-field", default="text", metavar="NAME", help="the text field of JSON lines and parquet (default text)"
    )
    p.add_argument(
        "--source",
        action="append",
        default=[],
        metavar="DIR_OR_URL",
        help="where peers can also fetch the files (a folder or http(s) URL: SOURCE/FILE); repeatable",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an earlier dataset in DIR")
    p.add_argument(
        "inputs",
        nargs="+",
        metavar="INPUT",
        help=".txt (documents split at blank lines), .jsonl or .parquet files; .gz for gzipped text or JSON lines",
    )
    p.add_argument("--debug", action="store_true", help="tracebacks on errors")


def run(args: argparse.Namespace) -> int:
    if args.shard_tokens < 1:
        raise ConfigError(f"--shard-tokens {args.shard_tokens}: must be at least 1")
    if not 0.0 <= args.validation_fraction <= 0.5:
        raise ConfigError(f"--validation-fraction {args.validation_fraction}: give 0 (none held out) to 0.5")
    if args.validation_max_tokens < 0:
        raise ConfigError(f"--validation-max-tokens {args.validation_max_tokens}: must be 0 or more")
    from swarmd.cli.progress import ProgressLine
    from swarmd.models.bpe_tokenizer import load_tokenizer
    from swarmd.models.data.manifest import ManifestError, check_sources
    from swarmd.models.data.prepare import prepare
    from swarmd.models.data.text_inputs import check_inputs, total_bytes

    sources = [s.rstrip("/") or s for s in args.source]
    try:
        check_sources(sources)
    except ManifestError as e:
        raise ConfigError(f"--source: {e}") from None
    tokenizer = load_tokenizer(args.tokenizer)
    paths = check_inputs(args.inputs)
    progress = ProgressLine(f"preparing {len(paths)} input(s), {total_bytes(paths) / 1e6:.1f} MB")
    result = prepare(
        paths,
        tokenizer,
        args.out,
        shard_tokens=args.shard_tokens,
        validation_fraction=args.validation_fraction,
        validation_max_tokens=args.validation_max_tokens,
        text_field=args.text_field,
        sources=sources,
        overwrite=args.overwrite,
        progress=lambda done, total: progress.update(done / max(total, 1)),
    )
    progress.done(str(result.folder))
    m = result.manifest
    tokens = m.tokens
    print(
        f"prepared {result.folder}: {result.documents:,} documents, {result.tokens:,} tokens "
        f"({tokens['train']:,} training in {len(m.train)} shards, {tokens['validation']:,} held out in "
        f"{len(m.validation)}), {m.dtype}, {result.tokens_per_s:,.0f} tokens/s, "
        f"{result.input_bytes / 1e6 / max(result.seconds, 1e-9):.1f} MB/s of input"
    )
    print(f"manifest SHA-256 {result.manifest_sha256}")
    print(f'a run uses it with [data] manifest = "{result.folder / "manifest.json"}" in its spec')
    return 0

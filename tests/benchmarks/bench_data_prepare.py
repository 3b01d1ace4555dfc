"""How fast ``swarmd data prepare`` turns text into token shards, against the ``tokenizers`` library alone.

    .venv/bin/python tests/benchmarks/bench_data_prepare.py [--mb 64] [--vocab 8192] [--threads N]

The input is the built-in corpus repeated until it is ``--mb`` MB of text (each copy's
documents marked with their copy's number, so no two documents are equal), in one ``.txt``
file. A byte-level BPE of ``--vocab`` ids is trained on the corpus once. Then, each in a fresh
process (so its peak resident set is its own):

- ``encode_batch``: the documents read into memory, then ``tokenizers``' ``encode_batch_fast``
  over batches of the size ``prepare`` uses, and nothing else: the ceiling;
- ``prepare (bpe)``: ``swarmd.models.data.prepare`` with that tokenizer, from the file to the
  finished folder (reading, hashing, spreading over shards, writing, the manifest);
- ``prepare (bytes)``: the same with the byte tokenizer.

Each line gives tokens/s, input MB/s and the process's peak RSS (``VmHWM``). ``--threads`` sets
``RAYON_NUM_THREADS`` (the tokenizer's thread pool; default: every core). Figures only.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import json, resource, sys, time
from pathlib import Path
mode, text, tokenizer, out = sys.argv[1:5]
started = time.monotonic()
if mode == "encode_batch":
    from tokenizers import Tokenizer
    from swarmd.models.data.prepare import BATCH_CHARS
    from swarmd.models.data.text_inputs import documents
    docs = [d for d, _ in documents(Path(text))]
    started = time.monotonic()  # the ceiling: encoding alone, the text already in memory
    tok = Tokenizer.from_file(tokenizer)
    tokens, batch, chars = 0, [], 0
    for d in docs:
        batch.append(d); chars += len(d)
        if chars >= BATCH_CHARS:
            tokens += sum(len(e.ids) for e in tok.encode_batch_fast(batch, add_special_tokens=False))
            batch, chars = [], 0
    tokens += sum(len(e.ids) for e in tok.encode_batch_fast(batch, add_special_tokens=False))
else:
    from swarmd.models.bpe_tokenizer import load_tokenizer
    from swarmd.models.data.prepare import prepare
    result = prepare([text], load_tokenizer(tokenizer), out, overwrite=True)
    tokens = result.tokens
seconds = time.monotonic() - started
# VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the parent across fork and exec.
status = Path("/proc/self/status")
hwm = [l for l in status.read_text().splitlines() if l.startswith("VmHWM")] if status.exists() else []
peak = int(hwm[0].split()[1]) * 1024 if hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"tokens": tokens, "seconds": seconds, "peak_rss": peak}))
"""


def make_input(folder: Path, mb: float) -> Path:
    from swarmd.models.data.corpus import load_corpus

    corpus = load_corpus("builtin").decode("utf-8")
    docs = [d.strip("\n") for d in corpus.split("\n\n") if d.strip()]
    path = folder / "input.txt"
    written = 0
    copy = 0
    with path.open("w", encoding="utf-8") as f:
        while written < mb * 1e6:
            for d in docs:
                piece = f"[{copy}] {d}\n\n"
                f.write(piece)
                written += len(piece.encode("utf-8"))
            copy += 1
    return path


def run(mode: str, text: Path, tokenizer: str, out: Path, threads: int | None) -> dict[str, float]:
    env = dict(os.environ)
    if threads:
        env["RAYON_NUM_THREADS"] = str(threads)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, mode, str(text), tokenizer, str(out)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{mode} failed:\n{done.stderr[-2000:]}")
    figures: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=64.0, help="input size in MB (default 64)")
    parser.add_argument("--vocab", type=int, default=8192, help="BPE vocabulary (default 8192)")
    parser.add_argument("--threads", type=int, default=None, help="RAYON_NUM_THREADS for tokenizers")
    args = parser.parse_args()

    from swarmd.models.bpe_tokenizer import train_bpe
    from swarmd.models.data.corpus import load_corpus

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        text = make_input(folder, args.mb)
        size = text.stat().st_size
        docs = [d for d in load_corpus("builtin").decode("utf-8").split("\n\n") if d.strip()]
        started = time.monotonic()
        train_bpe(docs, args.vocab, folder / "tokenizer.json")
        print(f"trained a BPE of {args.vocab} ids on the built-in corpus in {time.monotonic() - started:.1f} s")
        print(
            f"input: {size / 1e6:.1f} MB of text in one .txt file; {os.cpu_count()} CPUs; "
            f"RAYON_NUM_THREADS={args.threads or 'default'}"
        )
        print(f"{'':18} {'tokens':>12} {'seconds':>8} {'tokens/s':>12} {'MB/s':>7} {'peak RSS MB':>12}")
        rows = (
            ("encode_batch", str(folder / "tokenizer.json")),
            ("prepare (bpe)", str(folder / "tokenizer.json")),
            ("prepare (bytes)", "bytes"),
        )
        for label, tokenizer in rows:
            mode = "encode_batch" if label == "encode_batch" else "prepare"
            f = run(mode, text, tokenizer, folder / "out", args.threads)
            print(
                f"{label:18} {int(f['tokens']):>12,} {f['seconds']:>8.2f} {f['tokens'] / f['seconds']:>12,.0f} "
                f"{size / 1e6 / f['seconds']:>7.1f} {f['peak_rss'] / 1e6:>12.0f}"
            )
    print(f"(this process's own peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB)")


if __name__ == "__main__":
    main()

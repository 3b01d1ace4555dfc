"""``swarmd tokenizer train``: a tokenizer.json from text files, end to end; user errors in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from swarmd.cli.main import main
from swarmd.models.bpe_tokenizer import BpeTokenizer, tokenizer_digest
from swarmd.models.data.corpus import load_corpus

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def texts(tmp_path: Path) -> list[Path]:
    docs = [d for d in load_corpus("builtin").decode().split("\n\n") if d.strip()][:800]
    text = tmp_path / "a.txt"
    text.write_text("\n\n".join(docs[:400]))
    jsonl = tmp_path / "b.jsonl"
    jsonl.write_text("".join(json.dumps({"body": d}) + "\n" for d in docs[400:]))
    return [text, jsonl]


def test_trains_a_tokenizer_from_text_and_json_lines(
    tmp_path: Path, texts: list[Path], capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "tokenizer.json"
    args = ["tokenizer", "train", "--vocab", "600", "--out", str(out), "--text-field", "body", *map(str, texts)]
    assert main(args) == 0
    captured = capsys.readouterr()
    tok = BpeTokenizer.from_file(out)
    assert tok.vocab_size == 600 and tok.eot_id == 0
    assert f"SHA-256 {tokenizer_digest(out)}" in captured.out and "800 documents" in captured.out
    assert "done in" in captured.err  # the progress line's last word
    first = out.read_bytes()
    assert main([*args[:5], str(tmp_path / "again.json"), *args[6:]]) == 0
    assert (tmp_path / "again.json").read_bytes() == first  # the same texts, the same file


def test_user_errors_are_one_line(tmp_path: Path, texts: list[Path], capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t.json"
    assert main(["tokenizer", "train", "--vocab", "600", "--out", str(out), str(tmp_path / "missing.txt")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("swarmd: error: input") and "missing.txt does not exist" in err
    assert len(err.strip().splitlines()) == 1 and not out.exists()
    assert main(["tokenizer", "train", "--vocab", "100", "--out", str(out), str(texts[0])]) == 2
    assert "--vocab 100: give 257" in capsys.readouterr().err
    out.write_text("{}")
    assert main(["tokenizer", "train", "--vocab", "600", "--out", str(out), str(texts[0])]) == 2
    assert "exists; choose another path or pass --overwrite" in capsys.readouterr().err
    assert main(["tokenizer", "train", "--vocab", "600", "--out", str(out), "--overwrite", str(texts[0])]) == 0


def test_help_loads_nothing_heavy() -> None:
    probe = (
        "import sys\nfrom swarmd.cli.main import main\n"
        "try:\n    main(['tokenizer', '--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'numpy', 'torch', 'tokenizers', 'pyarrow'}))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=50, check=True)
    assert "--vocab" in out.stdout and out.stdout.strip().splitlines()[-1] == "[]"

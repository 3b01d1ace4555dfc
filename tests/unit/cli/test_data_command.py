"""``swarmd data prepare``: a dataset folder from text files, end to end; user errors in one line."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from swarmd.cli import data_command
from swarmd.cli.main import main
from swarmd.models.data import prepare as prepare_module
from swarmd.models.data.manifest import Manifest
from swarmd.models.data.shard_files import open_prepared

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def inputs(tmp_path: Path) -> list[Path]:
    text = tmp_path / "a.txt"
    text.write_text("".join(f"document {i}: {'words ' * (i % 50 + 5)}\n\n" for i in range(400)))
    jsonl = tmp_path / "b.jsonl.gz"
    jsonl.write_bytes(
        gzip.compress("".join(json.dumps({"text": f"line {i} " * 20}) + "\n" for i in range(300)).encode())
    )
    return [text, jsonl]


def test_prepares_a_dataset_with_bytes(tmp_path: Path, inputs: list[Path], capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "data"
    args = ["data", "prepare", "--tokenizer", "bytes", "--out", str(out), "--shard-tokens", "20000"]
    assert main([*args, "--validation-fraction", "0.05", "--source", "https://example.org/d/", *map(str, inputs)]) == 0
    captured = capsys.readouterr()
    m = Manifest.parse((out / "manifest.json").read_bytes())
    assert m.sources == ("https://example.org/d",) and m.dtype == "uint8" and len(m.train) > 1
    assert "700 documents" in captured.out and "tokens/s" in captured.out and "manifest SHA-256" in captured.out
    assert "done in" in captured.err
    data = open_prepared(out, 64, seed=0, verify=True)
    assert len(data.train) > 100
    data.close()
    assert main([*args, *map(str, inputs)]) == 1  # the folder is not empty now
    assert "not empty; choose another path or pass --overwrite" in capsys.readouterr().err
    assert main([*args, "--overwrite", *map(str, inputs)]) == 0


def test_prepares_with_a_trained_tokenizer(
    tmp_path: Path, inputs: list[Path], capsys: pytest.CaptureFixture[str]
) -> None:
    tokenizer = tmp_path / "tokenizer.json"
    assert main(["tokenizer", "train", "--vocab", "400", "--out", str(tokenizer), *map(str, inputs)]) == 0
    out = tmp_path / "data"
    assert main(["data", "prepare", "--tokenizer", str(tokenizer), "--out", str(out), *map(str, inputs)]) == 0
    m = Manifest.parse((out / "manifest.json").read_bytes())
    assert m.tokenizer.kind == "bpe" and m.tokenizer.eos_id == 0 and (out / "tokenizer.json").is_file()
    assert m.documents["train"] + m.documents["validation"] == 700


@pytest.mark.parametrize(
    ("extra", "code", "message"),
    [
        (["MISSING"], 1, "MISSING does not exist"),
        (["--shard-tokens", "0", "INPUT"], 2, "--shard-tokens 0"),
        (["--validation-fraction", "0.7", "INPUT"], 2, "--validation-fraction 0.7"),
        (["--source", "ftp://x/y", "INPUT"], 2, "--source: manifest sources[0]"),
        (["--tokenizer", "nothing.json", "INPUT"], 1, "tokenizer nothing.json does not exist"),
    ],
)
def test_user_errors_are_one_line(
    tmp_path: Path,
    inputs: list[Path],
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    code: int,
    message: str,
) -> None:
    args = [str(inputs[0]) if a == "INPUT" else str(tmp_path / a) if a == "MISSING" else a for a in extra]
    base = ["data", "prepare", "--out", str(tmp_path / "o")]
    if "--tokenizer" not in args:
        base += ["--tokenizer", "bytes"]
    assert main([*base, *args]) == code
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_help_defaults_are_the_library_s() -> None:
    assert data_command.DEFAULT_SHARD_TOKENS == prepare_module.DEFAULT_SHARD_TOKENS
    assert data_command.DEFAULT_VALIDATION_FRACTION == prepare_module.DEFAULT_VALIDATION_FRACTION
    assert data_command.DEFAULT_VALIDATION_MAX_TOKENS == prepare_module.DEFAULT_VALIDATION_MAX_TOKENS


def test_help_loads_nothing_heavy() -> None:
    probe = (
        "import sys\nfrom swarmd.cli.main import main\n"
        "try:\n    main(['data', '--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'numpy', 'torch', 'tokenizers', 'pyarrow'}))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=50, check=True)
    assert "--shard-tokens" in out.stdout and out.stdout.strip().splitlines()[-1] == "[]"

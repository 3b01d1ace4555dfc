"""``swarmd export``: stage checkpoints merged into a folder that transformers loads and generates from."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from swarmd.local_pipeline import LocalPipeline, PipelineSettings
from swarmd.local_swarm import create_run
from swarmd.models.corpus import load_corpus, train_eval_split
from swarmd.models.param_server import read_checkpoint_weights
from swarmd.models.presets import DEFAULT_RUN
from swarmd.models.tokenizer import ByteTokenizer
from swarmd.peers.run_spec import load_spec_file
from swarmd.state_dir import run_checkpoint_dir

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TINY = {**DEFAULT_RUN, "name": "tiny-export",
        "model": {"family": "gpt2", "layers": 2, "hidden": 32, "heads": 2, "vocab": 256, "seq_len": 32}}  # fmt: skip


def swarmd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "swarmd", *args], capture_output=True, text=True, timeout=120)


def test_export_after_training_loads_and_generates(workdir: Path) -> None:
    state = workdir / "s"
    spec_path = workdir / "tiny.json"
    spec_path.write_text(json.dumps(TINY))
    run_id = create_run(state, spec_path)
    shape = load_spec_file(spec_path).model
    train, _ = train_eval_split(load_corpus("builtin"), shape.seq_len, seed=0)
    settings = PipelineSettings(seed=0, stages=2, micro_batch=4, accumulate=2, lr=3e-3, checkpoint_every=5)
    LocalPipeline(shape, train, settings, checkpoint_dir=run_checkpoint_dir(state, run_id)).run(10)

    out = workdir / "exported"
    result = swarmd("export", "--run-id", run_id, str(out), "--state-dir", str(state))
    assert result.returncode == 0, result.stderr
    assert "stage weight versions [10, 10]" in result.stdout

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out)
    for stage in (0, 1):
        _, weights = read_checkpoint_weights(run_checkpoint_dir(state, run_id) / f"stage{stage}.safetensors")
        for name, tensor in weights.items():
            assert torch.equal(model.state_dict()[name], tensor), name
    tokenizer = ByteTokenizer()
    prompt = torch.tensor([tokenizer.encode("The ")])
    generated = model.generate(prompt, max_new_tokens=8, do_sample=False)
    assert generated.shape == (1, prompt.shape[1] + 8)
    assert isinstance(tokenizer.decode(generated[0].tolist()), str)

    # A second export into the same folder is refused unless asked for.
    again = swarmd("export", "--run-id", run_id, str(out), "--state-dir", str(state))
    assert again.returncode == 1 and "Traceback" not in again.stderr
    assert swarmd("export", "--run-id", run_id, str(out), "--state-dir", str(state), "--overwrite").returncode == 0


def test_export_without_checkpoints_says_so(workdir: Path) -> None:
    state = workdir / "s"
    spec_path = workdir / "tiny.json"
    spec_path.write_text(json.dumps(TINY))
    run_id = create_run(state, spec_path)
    result = swarmd("export", "--run-id", run_id, str(workdir / "out"), "--state-dir", str(state))
    assert result.returncode == 1 and "no stage checkpoints" in result.stderr and "Traceback" not in result.stderr
    result = swarmd(
        "export", "--run-id", "unknown.aaaaaaaaaaaaaaaaaaaaaaaa", str(workdir / "o"), "--state-dir", str(state)
    )
    assert result.returncode == 1 and "no spec of run" in result.stderr

"""``swarmd export``: stage weights gathered from the shards, merged into a folder transformers loads."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest
import torch

from swarmd.models.checkpoint import load_safetensors
from swarmd.models.presets import DEFAULT_RUN
from swarmd.models.tokenizer import ByteTokenizer
from swarmd.system.local_swarm import create_run
from swarmd.system.state_dir import prepare_state_dir, run_checkpoint_dir, save_spec
from tests.integration.conftest import Swarmd
from tests.unit.training.swarm_in_process import Swarm

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TINY = {
    **DEFAULT_RUN,
    "name": "tiny-export",
    "model": {"family": "gpt2", "layers": 2, "hidden": 32, "heads": 2, "vocab": 256, "seq_len": 32},
}


def test_export_after_training_loads_and_generates(workdir: Path, swarmd: Swarmd) -> None:
    # Train 10 updates with the daemon's own trainer (in this process, over an in-memory DHT and
    # network), gather every stage's weights from its shards as a running daemon does for
    # export, and put them where the daemon's state directory keeps them.
    async def train() -> Swarm:
        swarm = Swarm(workdir / "swarm", 1, spec_changes={"name": TINY["name"], "model": TINY["model"]})
        swarm.start()
        try:
            await swarm.wait_for("10 updates", lambda: swarm.updates() >= 10, 150)
            (member,) = swarm.members.values()
            gathered = await member.trainer.gather_weights()
            assert min(gathered["versions"]) >= 10 and gathered["held_out_loss"] is not None
        finally:
            await swarm.stop()
        return swarm

    swarm = asyncio.run(train())
    (member,) = swarm.members.values()
    state = prepare_state_dir(workdir / "s")
    run_id = swarm.spec.run_id
    save_spec(state, swarm.spec)
    folder = run_checkpoint_dir(state, run_id)
    folder.mkdir(parents=True, exist_ok=True)
    for stage in (0, 1):
        shutil.copy(member.trainer.checkpoint_dir / f"stage{stage}.safetensors", folder)

    out = workdir / "exported"
    result = swarmd("export", "--run-id", run_id, str(out), "--state-dir", str(state))
    assert result.returncode == 0, result.stderr
    versions = [int(v) for v in result.stdout.split("versions [")[1].split("]")[0].split(",")]
    assert min(versions) >= 10, result.stdout

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out)
    for stage in (0, 1):
        weights, _ = load_safetensors(folder / f"stage{stage}.safetensors")
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


def test_export_without_checkpoints_says_so(workdir: Path, swarmd: Swarmd) -> None:
    state = workdir / "s"
    spec_path = workdir / "tiny.json"
    spec_path.write_text(json.dumps(TINY))
    run_id = create_run(state, spec_path)
    result = swarmd("export", "--run-id", run_id, str(workdir / "out"), "--state-dir", str(state))
    assert result.returncode == 1 and "no gathered stage weights" in result.stderr and "Traceback" not in result.stderr
    result = swarmd(
        "export", "--run-id", "unknown.aaaaaaaaaaaaaaaaaaaaaaaa", str(workdir / "o"), "--state-dir", str(state)
    )
    assert result.returncode == 1 and "no spec of run" in result.stderr

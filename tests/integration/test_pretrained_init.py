"""A run that starts from a pretrained checkpoint: two daemons, only the creator holds the folder.

The checkpoint is a small random Llama with grouped-query attention, saved here with
``save_pretrained`` (nothing is downloaded). ``swarmd run create`` pins its initial weights'
manifest; the creator's daemon (which trains nothing: it only serves) computes chunks from
the folder, and the other, which trains, fetches the chunks its shards start from, checked
against the manifest. The first share's micro-batches run on the weights before any update:
their losses must be the checkpoint's own on the same sequences, to float rounding.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from swarmd.models.data.corpus import load_corpus, train_eval_split
from swarmd.peers.records.run_spec import run_seed
from swarmd.system.local_swarm import LocalDaemon, create_run, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SEQ_LEN, MICRO_BATCH = 64, 4
SPEC = """\
name = "from-checkpoint"
stages = 2

[model]
init = "{folder}"
seq_len = {seq_len}

[data]
corpus = "builtin"

[batch]
sequences = 8
micro_batch = {micro_batch}

[optimizer]
name = "adamw"
lr = 0.001
weight_decay = 0.0
max_staleness = 4
"""


def save_checkpoint(folder: Path) -> None:
    config = LlamaConfig(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=192,
        vocab_size=256,
        max_position_embeddings=128,
        rope_theta=20000.0,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
    )
    torch.manual_seed(1234)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)


def test_a_run_starts_from_exactly_the_checkpoints_weights(
    workdir: Path, daemon_factory: Callable[..., LocalDaemon]
) -> None:
    checkpoint = workdir / "checkpoint"
    save_checkpoint(checkpoint)
    spec = workdir / "run.toml"
    spec.write_text(SPEC.format(folder=checkpoint, seq_len=SEQ_LEN, micro_batch=MICRO_BATCH))
    run_id = create_run(workdir / "d0", spec)
    daemons = [daemon_factory(workdir / f"d{i}", run_id, train=i == 1) for i in range(2)]
    addrs = daemons[0].start().wait_running()["addrs"]
    daemons[1].start(addrs).wait_running()

    def first_losses() -> list[tuple[int, float]] | None:
        losses: list[tuple[int, float]] = []
        for daemon in daemons:
            losses += [(m, loss) for m, loss in ((daemon.status() or {}).get("training") or {}).get("losses") or []]
        losses.sort()
        return losses if len(losses) >= 2 and [m for m, _ in losses[:2]] == [0, 1] else None

    def fetched(daemon: LocalDaemon) -> dict[str, Any]:
        return (((daemon.status() or {}).get("data") or {}).get("fetch") or {}).get("fetched_files") or {}

    losses = wait_for(first_losses, 180, "the first share's losses")
    # The joiner took the initial weights' manifest and its shards' chunks from the creator: it
    # has no copy of the checkpoint, and it serves every shard.
    wait_for(lambda: fetched(daemons[1]).get("member", 0) >= 3, 60, "the joiner to fetch from the creator")
    statuses: list[dict[str, Any]] = [d.status() or {} for d in daemons]
    print("creator:", statuses[0]["data"], "\njoiner:", statuses[1]["data"])
    assert "init" in statuses[0]["data"]["holds"] and "init" not in statuses[1]["data"]["holds"]
    for daemon in daemons:
        assert daemon.stop(timeout=60) == 0, daemon.log_tail()

    model = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    train, _ = train_eval_split(load_corpus("builtin"), SEQ_LEN, run_seed(run_id))
    with torch.no_grad():
        for m, swarm_loss in losses[:2]:  # micro-batches 0 and 1: the first share, before any update
            ids = train.micro_batch(m, MICRO_BATCH)
            expected = float(model(input_ids=ids, labels=ids).loss)
            print(f"micro-batch {m}: swarm {swarm_loss:.5f}, checkpoint {expected:.5f}")
            assert swarm_loss == pytest.approx(expected, abs=2e-4)

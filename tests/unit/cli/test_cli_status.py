"""daemon/cli/status_view.py's status lines for training: the assignment followed, each cell, shard and the ledger."""

from __future__ import annotations

from typing import Any

import pytest

from swarmd.cli.status_view import fmt_training

pytestmark = pytest.mark.timeout(30)

CELL = {
    "pipeline": 1,
    "stage": 0,
    "shares": 12,
    "rounds": 3,
    "abandoned": 1,
    "loss": None,
    "weights": {"versions": [7, 7]},
    "contributions": {"sent": 6, "resent": 1, "dropped": 0, "waiting": 1},
}
SHARD = {
    "stage": 0,
    "shard": 1,
    "shards": 2,
    "version": 7,
    "contributions": 9,
    "duplicates": 1,
    "dropped_stale": 2,
    "refused": 0,
    "unreplicated": 0,
}
LEDGER = {"cursor": 96, "done_below": 80, "open": 2, "waiting": 1, "issued": 25, "reissued": 1, "completed": 22}


def training(**changes: Any) -> dict[str, Any]:
    status = {
        "state": "training",
        "error": None,
        "stages": 2,
        "mode": "local",
        "updates": 7,
        "assignment": {
            "version": 4,
            "provisional": False,
            "pipelines": 2,
            "local_steps": 4,
            "share_micro_batches": 8,
            "shards": [2, 1],
        },
        "cells": [CELL],
        "shards": [SHARD],
        "ledger": None,
        "trained_tokens": None,
        "tokens_per_s": None,
    }
    return {**status, **changes}


def test_a_cell_and_a_shard_say_what_they_did() -> None:
    text = "\n".join(fmt_training(training()))
    assert "local mode; following plan v4: 2 pipeline(s) x 2 stage(s), shards [2, 1], H = 4" in text
    assert "cell      (1, 0): 12 share(s), 3 round(s), 1 abandoned; weights [7, 7]" in text
    assert "contributions 6 sent (1 again, 0 refused), 1 waiting to be committed" in text
    assert "shard     (0, 1) of 2: version 7, 9 contribution(s) (1 duplicate, 2 too stale" in text
    assert "ledger" not in text and "trained tokens" not in text and "weighed down" not in text
    liar, doubter = "12D3KooW" + "L" * 44, "12D3KooW" + "D" * 44
    shard = {**SHARD, "distrusted": {liar: 0.0, doubter: 0.5}}
    text = "\n".join(fmt_training(training(shards=[shard])))
    assert "weighed down: LLLLLLLL x0 (excluded), DDDDDDDD x0.5" in text


def test_the_holder_of_shard_0_0_shows_the_ledger_and_the_swarms_tokens() -> None:
    text = "\n".join(fmt_training(training(ledger=LEDGER, trained_tokens=4096, tokens_per_s=512.0)))
    assert "4096 trained tokens, 512 tokens/s" in text
    assert "data cursor 96 (all below 80 trained), 2 share(s) open, 1 to train again" in text
    provisional = "\n".join(fmt_training(training(assignment={**training()["assignment"], "provisional": True})))
    assert "following the provisional assignment" in provisional


def test_what_was_refused_shows_in_one_line_and_nothing_when_nothing_was() -> None:
    from swarmd.cli.status_view import fmt_refused

    assert fmt_refused({"rpc": {"refused": {}, "banned": {}}, "swarm": {"plans_refused": {}}}) == ""
    line = fmt_refused(
        {
            "rpc": {"refused": {"QUOTA": 3, "NOT_MEMBER": 12}, "banned": {"a": 4e12, "b": 1.0}},
            "refused_members": {"no-token": 1},
            "swarm": {"plans_refused": {"version_jump": 2}},
            "dht_restarts": 1,
        }
    )
    assert line == (
        "refused   requests: NOT_MEMBER 12, QUOTA 3; members: no-token 1; plans: version_jump 2; "
        "1 peer(s) banned now; DHT restarted 1x"
    )

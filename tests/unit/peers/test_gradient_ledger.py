"""peers/gradient_ledger.py: carried leases are pushable once, by their worker, under their
epoch, until they expire; applied micro-batches are remembered within a bound; a checkpoint's
ledger round-trips, and a malformed one is ignored rather than trusted."""

from __future__ import annotations

import json

import pytest

from swarmd.peers.gradient_ledger import MAX_APPLIED_KEPT, MAX_CARRIED, GradientLedger

pytestmark = pytest.mark.timeout(30)


def test_a_carried_lease_is_taken_once_by_its_worker_under_its_epoch() -> None:
    ledger = GradientLedger(carry_s=10.0)
    ledger.carry("e1", [("1.4", "w1", 7), ("1.5", "w1", 8), ("1.6", "w2", 9)], now=0.0)
    assert ledger.carries("e1") and not ledger.carries("e2") and not ledger.carries(None)
    assert ledger.take("e2", ["1.4"], "w1", now=1.0) is None  # another epoch's lease 1.4
    assert ledger.take("e1", ["1.4", "1.6"], "w1", now=1.0) is None  # 1.6 is w2's: refused whole
    assert ledger.take("e1", ["1.4", "1.4"], "w1", now=1.0) is None  # one lease named twice
    assert ledger.take("e1", [], "w1", now=1.0) is None
    assert ledger.carried_count == 3  # nothing was taken by a refusal
    assert ledger.take("e1", ["1.5", "1.4"], "w1", now=1.0) == [8, 7]
    assert ledger.take("e1", ["1.4"], "w1", now=1.0) is None  # never twice
    assert ledger.take("e1", ["1.6"], "w2", now=1.0) == [9]
    assert not ledger.carries("e1")


def test_a_carried_lease_expires() -> None:
    ledger = GradientLedger(carry_s=10.0)
    ledger.carry("e1", [("0.1", "w", 3)], now=0.0)
    assert ledger.take("e1", ["0.1"], "w", now=10.0) is None
    assert ledger.carried_count == 0
    with pytest.raises(ValueError, match="carry_s is 0"):
        GradientLedger(carry_s=0)


def test_carried_leases_and_applied_micro_batches_are_bounded() -> None:
    ledger = GradientLedger(carry_s=10.0)
    ledger.carry("e1", [(f"0.{i}", "w", i) for i in range(MAX_CARRIED + 5)], now=0.0)
    assert ledger.carried_count == MAX_CARRIED
    assert ledger.take("e1", ["0.0"], "w", now=1.0) is None  # the oldest went first
    assert ledger.take("e1", [f"0.{MAX_CARRIED + 4}"], "w", now=1.0) == [MAX_CARRIED + 4]
    ledger.note_applied(list(range(MAX_APPLIED_KEPT + 10)))
    assert not ledger.was_applied(0) and ledger.was_applied(10) and ledger.was_applied(MAX_APPLIED_KEPT + 9)
    ledger.note_applied([10])  # noted again: newest now, kept longest
    ledger.note_applied([MAX_APPLIED_KEPT + 100 + i for i in range(5)])
    assert ledger.was_applied(10) and not ledger.was_applied(11)


def test_the_ledger_goes_to_the_next_host_in_the_checkpoint() -> None:
    old = GradientLedger(carry_s=10.0)
    old.carry("e1", [("1.4", "w1", 7)], now=0.0)
    old.carry("e1", [("1.9", "w1", 8)], now=0.0)
    assert old.take("e1", ["1.9"], "w1", now=0.0) == [8]
    old.note_applied([5, 6, 8])
    new = GradientLedger(carry_s=10.0)
    new.load_metadata(old.to_metadata(now=5.0), now=100.0)  # carried afresh from the successor's clock
    assert [new.was_applied(m) for m in (5, 6, 7, 8)] == [True, True, False, True]
    assert new.take("e1", ["1.9"], "w1", now=101.0) is None
    assert new.take("e1", ["1.4"], "w1", now=101.0) == [7]
    expired = GradientLedger(carry_s=10.0)
    expired.carry("e1", [("1.4", "w1", 7)], now=0.0)
    assert json.loads(expired.to_metadata(now=20.0))["carried"] == []


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[]",
        json.dumps({"carried": [["e1", "1.4", "w1"]], "applied": []}),  # three fields
        json.dumps({"carried": [["e1", "1.4", "w1", -1]], "applied": []}),
        json.dumps({"carried": [["e1", "x" * 129, "w1", 1]], "applied": []}),
        json.dumps({"carried": [["e1", "1.4", "w1", True]], "applied": []}),
        json.dumps({"carried": [], "applied": ["3"]}),
        json.dumps({"carried": [], "applied": list(range(MAX_APPLIED_KEPT + 1))}),
        json.dumps({"carried": [], "applied": [1]}) + " " * (256 * 1024),
        "[" * 100_000,  # nested past the parser's recursion limit
    ],
)
def test_a_malformed_ledger_in_a_checkpoint_is_ignored(text: str, caplog: pytest.LogCaptureFixture) -> None:
    ledger = GradientLedger(carry_s=10.0)
    ledger.load_metadata(text, now=0.0)
    assert ledger.carried_count == 0 and not ledger.was_applied(1) and not ledger.was_applied(3)
    assert "ignoring the gradient ledger" in caplog.text


def test_a_lately_carried_micro_batch_is_awaited_for_a_while() -> None:
    ledger = GradientLedger(carry_s=30.0)
    ledger.carry("e1", [("1.4", "w1", 7)], now=100.0)
    assert ledger.awaits(7, now=105.0, within_s=10.0)
    assert not ledger.awaits(8, now=105.0, within_s=10.0)
    assert not ledger.awaits(7, now=105.0, within_s=10.0, besides=("e1", ["1.4"]))  # the push of it itself
    assert ledger.awaits(7, now=105.0, within_s=10.0, besides=("e2", ["1.4"]))
    assert not ledger.awaits(7, now=110.0, within_s=10.0)  # waited long enough: both get applied
    assert ledger.take("e1", ["1.4"], "w1", now=101.0) == [7]
    assert not ledger.awaits(7, now=102.0, within_s=10.0)  # arrived

"""peers/membership/reliability.py and peers/membership/election.py: what others saw makes a peer's reliability, and
roles go to reliable, connected peers without flapping."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest

from swarmd.errors import RecordError
from swarmd.peers.membership import reliability as rel
from swarmd.peers.membership.election import (
    ElectionConfig,
    RoleCandidate,
    elect_coordinator,
    elect_relays,
    elect_standby,
    eligible,
    relays_wanted,
)
from swarmd.peers.membership.reliability import ObservationBook, Observations, score, swarm_reliability
from swarmd.peers.records.envelope import sign_record
from swarmd.peers.records.identity import Identity
from swarmd.peers.records.run_spec import derive_run_id

pytestmark = pytest.mark.timeout(30)

T0 = 1_800_000_000.0
A, B = Identity.generate(), Identity.generate()
RUN = derive_run_id("rel", A.public_key)


def watch(book: ObservationBook, seconds: int, live: dict[int, set[str]], step: int = 5, start: float = T0) -> None:
    """Scans every ``step`` s for ``seconds``; ``live[t]`` changes who is live from time t on."""
    now_live: set[str] = set()
    for t in range(0, seconds + 1, step):
        now_live = live.get(t, now_live)
        book.observe(start + t, now_live)


def test_staying_beats_flapping_beats_never_seen() -> None:
    book = ObservationBook("me")
    flaps = {t: ({"steady", "flappy"} if (t // 60) % 2 == 0 else {"steady"}) for t in range(0, 3601, 60)}
    watch(book, 3600, flaps)
    steady, flappy = book.watches["steady"], book.watches["flappy"]
    assert steady.up_s == pytest.approx(3600) and steady.departures == 0
    assert flappy.departures == 30 and flappy.up_s < 2000
    s_steady = score(steady.watched_s, steady.up_s, steady.departures)
    s_flappy = score(flappy.watched_s, flappy.up_s, flappy.departures)
    assert s_steady > 0.7 > s_flappy > score(0, 0, 0) == 0.0
    assert "me" not in book.watches  # an observer never rates itself


def test_the_observers_own_absence_counts_for_no_one(tmp_path: Path) -> None:
    book = ObservationBook("me")
    watch(book, 600, {0: {"p"}})
    before = dataclasses.replace(book.watches["p"])
    book.observe(T0 + 600 + 3 * rel.MAX_GAP_S, {"p"})  # we were suspended for six minutes
    assert book.watches["p"].watched_s == before.watched_s and book.watches["p"].up_s == before.up_s
    # ... and across a restart: saved, loaded, the gap until the first scan counts for nobody
    path = tmp_path / "observations.json"
    book.save(path)
    again = ObservationBook.load(path, "me")
    assert again.watches["p"].watched_s == before.watched_s
    watch(again, 300, {0: {"p"}}, start=T0 + 10_000)
    assert again.watches["p"].watched_s == pytest.approx(before.watched_s + 300)


def test_a_damaged_or_foreign_book_starts_afresh(tmp_path: Path) -> None:
    path = tmp_path / "observations.json"
    assert ObservationBook.load(path, "me").watches == {}  # missing
    path.write_text("{not json")
    assert ObservationBook.load(path, "me").watches == {}
    path.write_text('{"observer": "someone-else", "peers": {}}')
    assert ObservationBook.load(path, "me").watches == {}
    path.write_text('{"observer": "me", "peers": {"p": [10, 20, 0, 0]}}')  # up longer than watched
    assert ObservationBook.load(path, "me").watches == {}


def record(observer: Identity, peers: dict[str, tuple[float, float, int]]) -> Observations:
    return Observations(run_id=RUN, peer_id=observer.peer_id, issued_at=T0, expires_at=T0 + 60, peers=peers)


def test_observations_record_round_trip_and_refusals() -> None:
    obs = record(A, {B.peer_id: (600.0, 500.0, 2)})
    assert Observations.parse(obs.sign(A), run_id=RUN, now=T0, peer_id=A.peer_id) == obs
    body = {"run_id": RUN, "peer_id": A.peer_id, "issued_at": T0, "expires_at": T0 + 60, "peers": {}}
    with pytest.raises(RecordError, match="signed by"):
        Observations.parse(sign_record(B, rel.KIND, body), run_id=RUN, now=T0)
    for bad in ([600, 700, 0], [600, 500, 1.5], [600, 500], [-1, 0, 0]):
        body["peers"] = {B.peer_id: bad}
        with pytest.raises(RecordError):
            Observations.parse(sign_record(A, rel.KIND, body), run_id=RUN, now=T0)
    body["peers"] = {f"p{i}": [60, 60, 0] for i in range(rel.MAX_SUBJECTS + 1)}
    with pytest.raises(RecordError, match="at most"):
        Observations.parse(sign_record(A, rel.KIND, body), run_id=RUN, now=T0)
    body["peers"], body["extra"] = {}, 1
    with pytest.raises(RecordError):
        Observations.parse(sign_record(A, rel.KIND, body), run_id=RUN, now=T0)
    with pytest.raises(RecordError, match="expired"):
        Observations.parse(obs.sign(A), run_id=RUN, now=T0 + 61)


def test_self_reports_are_ignored_and_a_lying_minority_cannot_lift_a_flapper() -> None:
    flapper = (3600.0, 1800.0, 30)  # what honest observers saw
    honest = [
        Observations(run_id=RUN, peer_id=f"h{i}", issued_at=T0, expires_at=T0 + 60, peers={"x": flapper})
        for i in range(3)
    ]
    liars = [
        Observations(run_id=RUN, peer_id=f"l{i}", issued_at=T0, expires_at=T0 + 60, peers={"x": (86400.0, 86400.0, 0)})
        for i in range(2)
    ]
    itself = Observations(run_id=RUN, peer_id="x", issued_at=T0, expires_at=T0 + 60, peers={"x": (1e6, 1e6, 0)})
    result = swarm_reliability([*honest, *liars, itself], ["x", "nobody"])
    assert result["x"].observers == 5  # its own word is not among them
    assert result["x"].score == pytest.approx(score(*flapper)) and result["x"].score < 0.5
    assert result["nobody"].score == 0.0 and result["nobody"].mean_uptime_h is None
    assert result["x"].mean_uptime_h == pytest.approx((1800 + rel.PRIOR_SESSION_S) / 31 / 3600)


def test_a_peer_never_seen_leaving_is_not_taken_to_leave_every_minute() -> None:
    # Up a minute, never gone: a session of about the prior, not of one minute.
    assert rel.uptime_estimates(60.0, 60.0, 0)[0] == pytest.approx((60 + rel.PRIOR_SESSION_S) / 3600)
    # Gone 30 times in an hour up: its departures outweigh the prior.
    assert rel.uptime_estimates(3600.0, 3600.0, 30)[0] * 3600 < 180


T = ElectionConfig(min_reliability=0.5, min_relay_reliability=0.6, min_connectivity_Bps=1e6, hysteresis=0.1)


def test_eligibility_has_hysteresis_for_incumbents() -> None:
    slightly_below = RoleCandidate("a", 0.45, 2e6)
    assert not eligible(slightly_below, T, incumbent=False) and eligible(slightly_below, T, incumbent=True)
    assert not eligible(RoleCandidate("a", 0.3, 2e6), T, incumbent=True)
    assert not eligible(RoleCandidate("a", 0.9, 0.5e6), T, incumbent=True)  # too poorly connected
    assert not eligible(RoleCandidate("a", 0.55, 2e6), T, incumbent=False, relay=True)


def test_the_coordinator_is_sticky_and_the_same_for_everyone() -> None:
    cands = [RoleCandidate("a", 0.6, 2e6), RoleCandidate("b", 0.9, 5e6), RoleCandidate("c", 0.2, 9e6)]
    assert elect_coordinator(cands, None, T) == "b"
    assert elect_coordinator(cands, "a", T) == "a"  # a better challenger does not displace it
    drifted = [RoleCandidate("a", 0.45, 2e6), *cands[1:]]
    assert elect_coordinator(drifted, "a", T) == "a"  # within the hysteresis
    fallen = [RoleCandidate("a", 0.2, 2e6), *cands[1:]]
    assert elect_coordinator(fallen, "a", T) == "b"
    assert elect_coordinator([c for c in cands if c.peer_id != "a"], "a", T) == "b"  # gone
    rng = random.Random(1)
    for _ in range(10):
        shuffled = cands[:]
        rng.shuffle(shuffled)
        assert elect_coordinator(shuffled, None, T) == "b"
    newcomers = [RoleCandidate("b", 0.11, 2e6), RoleCandidate("a", 0.1, 1e3)]
    assert elect_coordinator(newcomers, None, T) == "a"  # nobody passes: the lowest ID, whatever the noise
    assert elect_coordinator(newcomers, "b", T) == "b"  # ... or whoever plans already
    assert elect_coordinator([], None, T) is None


def test_relays_keep_incumbents_and_fill_vacancies_with_the_best() -> None:
    cands = [
        RoleCandidate("a", 0.62, 2e6),
        RoleCandidate("b", 0.9, 5e6),
        RoleCandidate("c", 0.8, 9e6),
        RoleCandidate("d", 0.3, 9e6),
    ]
    assert elect_relays(cands, [], T, 2) == ["b", "c"]
    assert elect_relays(cands, ["a"], T, 2) == ["a", "b"]
    assert elect_relays(cands, ["d"], T, 2) == ["b", "c"]  # d fell far below
    # the planner's choice (a pipeline link is faster through it) goes first among the eligible
    assert elect_relays(cands, [], T, 2, preferred=["a", "d"]) == ["a", "b"]
    assert elect_relays(cands, ["c"], T, 2, preferred=["a"]) == ["c", "a"]  # incumbents stay first
    assert elect_relays(cands, [], T, 0) == []


def test_a_swarm_of_newcomers_still_gets_one_relay() -> None:
    newcomers = [RoleCandidate("a", 0.02, 2e6), RoleCandidate("b", 0.03, 5e6), RoleCandidate("c", 0.01, 9e6)]
    assert elect_relays(newcomers, [], T, 2) == ["b"]  # nobody passes: the best-ranked serves alone
    assert elect_relays(newcomers, ["c", "gone"], T, 2) == ["c"]  # ... or the incumbents still live


def test_one_relay_per_sixteen_members_from_three() -> None:
    assert [relays_wanted(n) for n in (0, 2, 3, 31, 32, 1000)] == [0, 0, 1, 1, 2, 62]


def test_the_standby_is_the_likeliest_to_stay_then_the_best_linked_then_the_longest_up() -> None:
    need = T.min_reliability
    assert elect_standby([], need) is None
    assert elect_standby([("b", 0.9, 10.0, 1e6), ("a", 0.8, 1e6, 1e9)], need) == "b"  # reliability first
    assert elect_standby([("b", 0.9, 1e6, 1e6), ("c", 0.9, 10.0, 5e6)], need) == "c"  # then the link from the host
    assert elect_standby([("b", 0.9, 10.0, 0.0), ("c", 0.9, 20.0, 0.0)], need) == "c"  # then uptime
    assert elect_standby(iter([("c", 0.9, 20.0, 0.0), ("b", 0.9, 20.0, 0.0)]), need) == "b"  # then the ID


def test_hostile_books_and_records_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "observations.json"
    path.write_text("[" * 100_000)  # nesting deep enough to exhaust the parser's recursion
    assert ObservationBook.load(path, "me").watches == {}
    path.write_text('{"observer": "me", "peers": {"p": [10, 5, 0, 1e300]}}')  # seen in the far future
    assert ObservationBook.load(path, "me").watches == {}
    body = {
        "run_id": RUN,
        "peer_id": A.peer_id,
        "issued_at": T0,
        "expires_at": T0 + 60,
        "peers": {"evil\x1b[31m\n": [60, 60, 0]},
    }
    with pytest.raises(RecordError, match="bad subject"):
        Observations.parse(sign_record(A, rel.KIND, body), run_id=RUN, now=T0)


def test_a_flood_of_new_keys_does_not_evict_a_long_watched_peer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rel, "MAX_BOOK_PEERS", 50)
    book = ObservationBook("me")
    watch(book, 3600, {0: {"old"}}, step=60)
    book.observe(T0 + 3660, {"old", *(f"new{i}" for i in range(100))})
    assert "old" in book.watches and len(book.watches) == 50


def test_the_gap_that_counts_follows_the_scan_interval() -> None:
    book = ObservationBook("me", max_gap_s=15)
    watch(book, 60, {0: {"p"}})
    book.observe(T0 + 60 + 20, {"p"})  # 20 s without a scan: three 5-second intervals missed
    assert book.watches["p"].watched_s == pytest.approx(60)

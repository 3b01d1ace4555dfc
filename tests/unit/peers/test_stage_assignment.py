"""peers/stage_assignment.py: fair shares of stages, the same answer on every peer."""

from __future__ import annotations

from swarmd.peers.stage_assignment import (
    HAND_OVER_AGAIN_S,
    HAND_OVER_HELD_S,
    HAND_OVER_SETTLED_S,
    Trainer,
    decide,
    epoch_of,
    fair_share,
    follows_plan,
)
from swarmd.peers.stage_leases import StageLease

T0 = 1_700_000_000.0


def lease(stage: int, peer: str, claimed_at: float = T0) -> StageLease:
    return StageLease(run_id="r.x", stage=stage, peer_id=peer, claimed_at=claimed_at, issued_at=T0, expires_at=T0 + 30)


def test_fair_share() -> None:
    assert [fair_share(2, n) for n in (0, 1, 2, 3, 4)] == [2, 2, 1, 1, 1]
    assert [fair_share(5, n) for n in (1, 2, 3)] == [5, 3, 2]


def test_a_peer_alone_claims_every_free_stage() -> None:
    d = decide("a", [None, None, None], [Trainer("a", 5)], [0, 0, 0], grace_s=10)
    assert d.claim == (0, 1, 2) and d.release == ()


def test_free_stages_go_to_the_fewest_held_then_longest_uptime() -> None:
    trainers = [Trainer("a", 100), Trainer("b", 50), Trainer("c", 10)]
    holders = [lease(0, "a"), None, None]
    # b (fewest held, longer uptime than c) gets stage 1, then c gets stage 2: each peer agrees.
    assert decide("b", holders, trainers, [0, 0, 0], 10).claim == (1,)
    assert decide("c", holders, trainers, [0, 0, 0], 10).claim == (2,)
    assert decide("a", holders, trainers, [0, 0, 0], 10).claim == ()


def test_after_the_grace_anyone_within_its_share_may_claim() -> None:
    trainers = [Trainer("a", 100), Trainer("b", 50)]
    holders = [lease(0, "a"), None]
    assert decide("a", holders, trainers, [0, 5], 10).claim == ()  # b's turn
    assert decide("a", holders, trainers, [0, 11], 10).claim == ()  # a already holds its share (1)
    three = [lease(0, "a"), None, None]  # share 2: stage 1 is b's, stage 2 a's
    assert decide("a", three, trainers, [0, 0, 0], 10).claim == (2,)
    assert decide("a", three, trainers, [0, 11, 11], 10).claim == (1,)  # b is slow: a takes stage 1 instead


def test_a_peer_over_its_share_hands_over_its_highest_stage_one_per_round() -> None:
    holders = [lease(0, "a"), lease(1, "a"), lease(2, "a"), lease(3, "a")]
    d = decide("a", holders, [Trainer("a", 100), Trainer("b", 1)], [0] * 4, 10)
    assert d.release == (3,) and d.claim == ()
    # Within its share, a peer keeps what it has: no flapping.
    assert decide("a", holders[:2] + [lease(2, "b"), lease(3, "b")], [Trainer("a", 1), Trainer("b", 9)],
                  [0] * 4, 10).release == ()  # fmt: skip


def test_departed_holders_do_not_count_and_unknown_self_is_included() -> None:
    # "a" is not in the member list (it does not see itself) yet must count as a trainer.
    d = decide("a", [None, None], [Trainer("b", 5)], [0, 0], 10)
    assert d.claim == (1,)  # b (longer uptime) is designated first, then a


def test_epoch_names_the_hosting() -> None:
    one = [lease(0, "a"), lease(1, "b")]
    assert epoch_of(one) == epoch_of(list(one))
    assert epoch_of(one) != epoch_of([lease(0, "a"), lease(1, "c")])
    assert epoch_of(one) != epoch_of([lease(0, "a"), lease(1, "b", claimed_at=T0 + 1)])  # re-claimed
    assert epoch_of([lease(0, "a"), None]) is None


def test_only_eligible_trainers_host_unless_none_is() -> None:
    trainers = [Trainer("a", 100, 0.2, eligible=False), Trainer("b", 10, 0.9), Trainer("c", 5, 0.8)]
    free = [None, None]
    # a has the longest uptime but is not eligible: the stages go to b and c
    assert decide("a", free, trainers, [0, 0], 10).claim == ()
    assert decide("b", free, trainers, [0, 0], 10).claim == (0,)
    assert decide("c", free, trainers, [0, 0], 10).claim == (1,)
    # past the grace, an ineligible peer still does not claim
    assert decide("a", free, trainers, [60, 60], 10).claim == ()
    # nobody eligible: everyone may host (a swarm of newcomers must still train)
    newcomers = [Trainer(t.peer_id, t.uptime_s, t.reliability, eligible=False) for t in trainers]
    assert decide("b", free, newcomers, [0, 0], 10).claim == (0,)
    assert decide("a", free, [newcomers[0]], [0, 0], 10).claim == (0, 1)


def test_an_ineligible_holder_hands_over_while_an_eligible_peer_has_room() -> None:
    trainers = [Trainer("a", 100, 0.1, eligible=False), Trainer("b", 10, 0.9)]
    assert decide("a", [lease(0, "a"), lease(1, "b")], trainers, [0, 0], 10).release == (0,)
    # b already holds its fair share (all of them, being the only eligible one, is its share)
    holders = [lease(0, "a"), lease(1, "b"), lease(2, "b"), lease(3, "b")]
    assert decide("a", holders, trainers, [0] * 4, 10).release == (0,)


def test_reliability_orders_free_stages_and_the_standby_takes_over_first() -> None:
    trainers = [Trainer("a", 100, 0.6), Trainer("b", 10, 0.9), Trainer("c", 50, 0.7)]
    # measured reliability, not uptime, picks who gets a free stage
    assert decide("b", [None], trainers, [0], 10).claim == (0,)
    # the stage's standby (it holds the replica) comes first, whatever its rank
    assert decide("a", [None], trainers, [0], 10, preferred=["a"]).claim == (0,)
    assert decide("b", [None], trainers, [0], 10, preferred=["a"]).claim == ()
    # a preferred peer that is not eligible is passed over
    trainers[0] = Trainer("a", 100, 0.6, eligible=False)
    assert decide("b", [None], trainers, [0], 10, preferred=["a"]).claim == (0,)


def test_a_stage_claimed_before_the_plan_goes_to_the_planned_server_once_it_has_room() -> None:
    trainers = [Trainer("a", 100), Trainer("b", 50), Trainer("c", 10), Trainer("d", 5)]
    holders = [lease(0, "a"), lease(1, "d")]  # claimed by uptime and timing, before any plan
    planned = ["b", "a"]  # the plan: b serves stage 0, a serves stage 1
    first = decide("a", holders, trainers, [0, 0], 10, planned, provisional={0})
    assert first.release == (0,) and first.claim == ()
    # d must wait: a, the planned server of stage 1, still holds its share
    assert decide("d", holders, trainers, [0, 0], 10, planned, provisional={1}).release == ()
    # once a has let stage 0 go, d hands stage 1 to it, and b and a take theirs
    after = [None, lease(1, "d")]
    assert decide("d", after, trainers, [0, 0], 10, planned, provisional={1}).release == (1,)
    assert decide("b", after, trainers, [0, 0], 10, planned).claim == (0,)
    assert decide("a", [None, None], trainers, [0, 0], 10, planned).claim == (1,)
    # a stage claimed under a plan stays where it is until the trainer finds it should follow
    # the plan (``follows_plan``) and passes it as provisional
    assert decide("d", holders, trainers, [0, 0], 10, planned).release == ()


def test_a_held_stage_follows_the_plans_server_once_the_plan_settled_and_it_was_held_a_while() -> None:
    settled, held = HAND_OVER_SETTLED_S, HAND_OVER_HELD_S
    assert follows_plan("a", "b", settled, held)
    assert not follows_plan("a", "b", settled - 1, held)  # the plan may still change
    assert not follows_plan("a", "b", settled, held - 1)  # it moved here a moment ago
    assert not follows_plan("a", "a", settled, held) and not follows_plan("a", None, settled, held)
    # it handed the stage to that very peer a while ago, and that peer's plan had it decline
    assert not follows_plan("a", "b", settled, held, HAND_OVER_AGAIN_S - 1)
    assert follows_plan("a", "b", settled, held, HAND_OVER_AGAIN_S)


def test_over_its_share_a_peer_first_hands_over_a_stage_the_plan_gives_another() -> None:
    trainers = [Trainer("a", 100), Trainer("b", 50)]
    both = [lease(0, "a"), lease(1, "a")]
    assert decide("a", both, trainers, [0, 0], 10, ["b", "a"]).release == (0,)  # keeps stage 1, its own
    assert decide("a", both, trainers, [0, 0], 10, ["a", "b"]).release == (1,)
    assert decide("a", both, trainers, [0, 0], 10).release == (1,)  # no plan: the highest, as before


def test_two_peers_holding_each_others_planned_stages_swap_them() -> None:
    trainers = [Trainer("a", 100), Trainer("b", 50), Trainer("c", 10)]
    crossed = [lease(0, "a"), lease(1, "b")]  # both claimed before the plan, each the other's
    planned = ["b", "a"]
    assert decide("a", crossed, trainers, [0, 0], 10, planned, provisional={0}).release == (0,)
    assert decide("b", crossed, trainers, [0, 0], 10, planned, provisional={1}).release == (1,)
    # b let go at once too: both are free, each goes to its planned server
    assert decide("a", [None, None], trainers, [0, 0], 10, planned).claim == (1,)
    assert decide("b", [None, None], trainers, [0, 0], 10, planned).claim == (0,)
    # b's stage 1 was claimed under the plan and stays: stage 0 waits for b, then a takes it back
    half = [None, lease(1, "b")]
    assert decide("a", half, trainers, [5, 0], 10, planned).claim == ()
    assert decide("c", half, trainers, [5, 0], 10, planned).claim == ()
    assert decide("a", half, trainers, [11, 0], 10, planned).claim == (0,)

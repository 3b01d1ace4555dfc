"""models/robust_aggregation.py: a median that gives each sender one vote, centred clipping as
Karimireddy et al. define it, each sender's trust from its agreement with the aggregates, and a
shard that aggregates with them when its config says so."""

from __future__ import annotations

import pytest
import torch

from swarmd.models.parameter_shard import Outcome, ParameterShard
from swarmd.models.robust_aggregation import TRUST_WARMUP, CentredClip, RecentVotes, SenderTrust, VoteMedian
from swarmd.models.shard_config import ShardConfig

pytestmark = pytest.mark.timeout(60)

SIZE = 400


def noise(seed: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(SIZE, generator=torch.Generator().manual_seed(seed)) * scale


def config(aggregation: str, **kw: object) -> ShardConfig:
    base: dict[str, object] = dict(mode="local", lr=1e-3, outer_lr=1.0, outer_momentum=0.0, aggregation=aggregation)
    base.update(kw)
    return ShardConfig(**base)  # type: ignore[arg-type]


def test_a_sender_gets_one_vote_however_often_it_sends() -> None:
    votes = VoteMedian(window=100, warmup=3)
    votes.add("honest-a", 1.0)
    votes.add("honest-b", 2.0)
    assert votes.median() is None  # below the warm-up
    for _ in range(50):
        votes.add("liar", 1e6)
    assert votes.median() == 2.0  # three votes: 1, 2 and the liar's; the middle one decides
    lone = VoteMedian(window=10, warmup=1)
    lone.add("honest", 1.0)
    lone.add("liar", 1e6)
    assert lone.median() == 1.0  # two voters: the lower decides, so one liar cannot raise it
    window = VoteMedian(window=2, warmup=1)
    for value in (9.0, 1.0, 3.0):
        window.add("same", value)
    assert window.median() == 2.0  # only the recent window counts
    with pytest.raises(ValueError, match="window = 0"):
        VoteMedian(window=0, warmup=1)


def test_centred_clipping_clips_the_difference_from_the_centre_and_records_it_clipped() -> None:
    clip = CentredClip(SIZE, radius_factor=2.0, window=64, warmup=2)
    centre = noise(1)
    clip.recentre(centre)
    near_a, near_b = centre + noise(2, 0.1), centre + noise(3, 0.1)
    assert clip.radius() is None
    for sender, x in (("a", near_a), ("b", near_b)):
        taken, clipped = clip.clip(x, sender)
        assert not clipped and torch.equal(taken, x)  # no radius yet: taken as it is
    distances = sorted(float((x - centre).norm()) for x in (near_a, near_b))
    tau = clip.radius()
    assert tau == pytest.approx(2.0 * distances[0])  # the lower of the two senders' votes
    far = centre + noise(4, 100.0)
    taken, clipped = clip.clip(far, "liar")
    assert clipped
    # The paper's step: centre + (x - centre) * min(1, tau / ||x - centre||).
    expected = centre + (far - centre) * (tau / float((far - centre).norm()))
    assert torch.allclose(taken, expected, atol=1e-5)
    assert float((taken - centre).norm()) == pytest.approx(tau, rel=1e-5)
    # Its distance counts as tau, and as one vote of three: the radius rises to the larger
    # honest distance's, never toward the liar's.
    assert clip.radius() == pytest.approx(2.0 * distances[1])
    with pytest.raises(ValueError, match="radius_factor"):
        CentredClip(SIZE, radius_factor=0.0, window=1, warmup=1)


def rounds(aggregation: str, poison: float, steps: int) -> tuple[torch.Tensor, ParameterShard]:
    """``steps`` rounds of four honest cells (noisy copies of one pseudo-gradient) and, with
    ``poison``, one more whose contribution is that far off; outer SGD with lr 1, so each step
    moves the weights by exactly the round's aggregate. Returns the drift from the honest path."""
    shard = ParameterShard(0, SIZE, torch.zeros(SIZE), config(aggregation, norm_warmup=4), step_micro_batches=99)
    truth = noise(0, 0.05)
    honest_path = torch.zeros(SIZE)
    share = 0
    for r in range(steps):
        if poison and r > 0:  # from the second round: after the warm-up (module doc: its weakness)
            share += 1
            shard.contribute(noise(10_000 + r, poison), shard.version, 1, [share], 1.0, sender="liar")
        for cell in range(4):
            share += 1
            honest = truth + noise(100 * r + cell, 0.01)
            result = shard.contribute(honest, shard.version, 1, [share], 1.0, sender=str(cell))
            assert result.outcome is Outcome.BUFFERED
        step = shard.flush()  # the round's step, the poisoner's contribution in it
        assert step is not None
        shard.confirm(step.version)
        honest_path -= truth  # SGD: weights -= lr * pseudo-gradient
    weights = shard.weights()
    assert weights is not None
    return (weights[1] - honest_path).norm(), shard


def test_centred_clipping_holds_a_poisoner_to_its_radius_where_the_mean_follows_it() -> None:
    clean_mean, _ = rounds("mean", poison=0.0, steps=12)
    clean_clip, _ = rounds("centred-clip", poison=0.0, steps=12)
    poisoned_mean, _ = rounds("mean", poison=0.5, steps=12)
    poisoned_clip, shard = rounds("centred-clip", poison=0.5, steps=12)
    truth_norm = float(noise(0, 0.05).norm())
    # Without an attacker, clipping around the last aggregate leaves the path as the mean's
    # (both drift by the honest noise alone).
    assert abs(clean_clip - clean_mean) < 0.1 * clean_mean and clean_mean < 0.5 * truth_norm
    # The poisoner (10x the honest norm, below the norm bound's refusal) drags the mean far off
    # the honest path; clipped to the honest spread, it moves each step by at most tau / 5.
    assert poisoned_mean > 3 * truth_norm
    assert poisoned_clip < 0.2 * poisoned_mean  # measured: 7.04 against 0.84
    assert shard.counters.centre_clipped >= 8
    assert shard.clip_radius() is not None


def test_a_reduction_heads_sum_is_clipped_as_one_point_with_all_its_micro_batches() -> None:
    shard = ParameterShard(0, SIZE, torch.zeros(SIZE), config("centred-clip", norm_warmup=1), step_micro_batches=4)
    # A head's mean of three cells (3 micro-batches) and one cell alone: the step is their mean
    # weighted by micro-batches, exactly as with the plain mean when nothing is clipped.
    head, alone = noise(1, 0.1), noise(2, 0.1)
    shard.contribute(head, 0, 3, [1, 2, 3], 1.0, parts=3, sender="head")
    result = shard.contribute(alone, 0, 1, [4], 1.0, sender="cell")
    assert result.step is not None and shard.counters.centre_clipped == 0
    weights = shard.weights()
    assert weights is None  # the step awaits confirmation
    shard.confirm(result.step.version)
    weights = shard.weights()
    assert weights is not None
    assert torch.allclose(weights[1], -(3 * head + alone) / 4, atol=1e-3)  # outer lr 1, no momentum


def test_aggregation_is_validated() -> None:
    with pytest.raises(ValueError, match="aggregation"):
        config("trimmed")
    with pytest.raises(ValueError, match="clip_radius_factor"):
        config("centred-clip", clip_radius_factor=-1.0)
    assert ParameterShard(0, SIZE, torch.zeros(SIZE), config("mean"), step_micro_batches=1).clip_radius() is None


def test_a_sender_that_points_against_the_others_loses_its_weight() -> None:
    trust = SenderTrust(window=8, warmup=4, max_senders=7)
    for _ in range(4):
        for sender, cosine in (("a", 0.2), ("b", 0.2), ("c", 0.2), ("doubter", -0.05), ("liar", -0.1)):
            trust.add(sender, {"others": cosine})
    # The typical sender's mean is 0.2: a mean of -0.05 keeps half its weight, -0.1 none.
    assert [trust.weight(s) for s in ("a", "b", "c")] == [1.0, 1.0, 1.0]
    assert trust.weight("doubter") == pytest.approx(0.5)
    assert trust.weight("liar") == 0.0
    assert trust.weight("newcomer") == 1.0  # nothing known of it yet
    assert trust.distrusted() == {"liar": 0.0, "doubter": pytest.approx(0.5)}  # what status shows
    for _ in range(3):
        trust.add("newcomer", {"others": -1.0})
    assert trust.weight("newcomer") == 1.0  # below the warm-up
    for _ in range(8):
        trust.add("liar", {"others": 0.2})  # it mends its ways: only its recent window counts
    assert trust.weight("liar") == 1.0
    trust.add("f", {"others": 0.1})
    trust.add("g", {"others": 0.1})  # over seven senders: the least recently heard ("a") is forgotten
    assert trust.mean("a") is None and trust.mean("b") == pytest.approx(0.2)
    with pytest.raises(ValueError, match="too small"):
        SenderTrust(window=0, warmup=1)


def test_no_one_loses_weight_where_no_majority_agrees() -> None:
    """Where the median sender disagrees too there is nothing to stand against: down-weighting
    then fed on itself (the excluded vote for the centre, the last step) until every member had
    none and the shard repeated its last step for good."""
    trust = SenderTrust(window=8, warmup=4)
    for _ in range(4):
        for sender, cosine in (("a", -0.1), ("b", -0.2), ("c", 0.3)):
            trust.add(sender, {"others": cosine})
    assert [trust.weight(s) for s in "abc"] == [1.0, 1.0, 1.0] and trust.distrusted() == {}


def flip_rounds(aggregation: str, steps: int) -> tuple[float, ParameterShard]:
    """``steps`` rounds of three members (noisy copies of one pseudo-gradient), the third one
    sending its own negated; outer SGD with lr 1. Returns the drift from the honest path."""
    shard = ParameterShard(0, SIZE, torch.zeros(SIZE), config(aggregation, norm_warmup=4), step_micro_batches=99)
    truth = noise(0, 0.05)
    honest_path = torch.zeros(SIZE)
    share = 0
    for r in range(steps):
        for member in range(3):
            share += 1
            vector = truth + noise(100 * r + member, 0.05)
            vector = -vector if member == 2 else vector
            shard.contribute(vector, shard.version, 1, [share], 1.0, sender=f"member-{member}")
        step = shard.flush()
        assert step is not None
        shard.confirm(step.version)
        honest_path -= truth
    weights = shard.weights()
    assert weights is not None
    return float((weights[1] - honest_path).norm()), shard


def test_a_sign_flipper_is_given_no_weight_where_the_mean_lets_it_cancel_a_member() -> None:
    early, late = 2 * TRUST_WARMUP, 4 * TRUST_WARMUP
    truth_norm = float(noise(0, 0.05).norm())
    mean_early, mean_late = (flip_rounds("mean", steps)[0] for steps in (early, late))
    (clip_early, _), (clip_late, shard) = (flip_rounds("centred-clip", steps) for steps in (early, late))
    # The mean steps a third of the way (2 honest, 1 against): it loses two thirds of each step.
    assert mean_late - mean_early > 0.6 * (late - early) * truth_norm
    # Once its warm-up is over and its mean agreement is negative, the flipper's contributions
    # count for the centre (the last aggregate): the drift stops growing.
    assert clip_late - clip_early < 0.1 * (mean_late - mean_early)  # measured: 0.7 against 10.5
    assert shard.counters.centre_clipped >= late - TRUST_WARMUP - 2  # measured: 23
    assert shard.distrusted() == {"member-2": 0.0}  # excluded, as the shard's status shows


def test_a_sender_agrees_when_it_agrees_with_at_least_half_of_the_others_pair_by_pair() -> None:
    truth = noise(0, 0.05)
    honest = {f"cell-{k}": truth + noise(k + 1, 0.05) for k in range(4)}
    mean = torch.stack(list(honest.values())).mean(0)
    # One liar, large and twice among the votes: it is one voice (its directions averaged).
    votes = RecentVotes(window=8)
    for sender, x in honest.items():
        votes.add(sender, x)
    votes.add("liar", -8 * mean)
    votes.add("liar", -8 * mean + noise(9, 0.01))
    cosines = votes.agreement("cell-0", honest["cell-0"])
    assert set(cosines) == {"cell-1", "cell-2", "cell-3", "liar"}
    assert cosines["liar"] < -0.2 and all(cosines[c] > 0.2 for c in ("cell-1", "cell-2", "cell-3"))
    # Two honest members and one that negates its gradients, pair by pair: each honest one
    # agrees with one of its two others (half), the negator with neither; the negator is given
    # no weight and the honest ones keep theirs.
    trust = SenderTrust(window=16, warmup=4)
    for r in range(16):
        x = {m: truth + noise(100 * r + k, 0.05) for k, m in enumerate("ab")} | {
            "liar": -truth - noise(100 * r + 7, 0.05)
        }
        for sender in x:
            others = [o for o in x if o != sender]
            trust.add(sender, {o: float(torch.nn.functional.cosine_similarity(x[sender], x[o], dim=0)) for o in others})
    assert trust.distrusted() == {"liar": 0.0}
    # Two senders, one against the other: each disagrees with half; which one lies, no one can say.
    two = SenderTrust(window=16, warmup=4)
    for _ in range(8):
        two.add("a", {"liar": -0.3})
        two.add("liar", {"a": -0.3})
    assert two.distrusted() == {}
    # Votes span rounds but not forever: the window keeps the last ones only.
    lone = RecentVotes(window=2)
    lone.add("a", truth)
    assert lone.agreement("a", truth) == {}  # nobody else to agree with
    lone.add("b", -truth)
    lone.add("a", truth)
    lone.add("a", truth)  # b's vote has left the window
    assert lone.agreement("c", truth) == {"a": pytest.approx(1.0)}
    lone.add("b", torch.zeros(SIZE))  # no direction: not a vote
    assert lone.agreement("b", truth) == {"a": pytest.approx(1.0)}
    assert lone.agreement("a", truth) == {}


def test_a_sign_flipper_is_found_where_every_round_holds_one_contribution() -> None:
    """The asynchronous swarm's shape: members in turn, one contribution a round. Judged within
    its round, no contribution had anyone to agree with; judged against the recent votes, the
    flipper loses its weight and the honest members keep theirs."""
    shard = ParameterShard(0, SIZE, torch.zeros(SIZE), config("centred-clip", norm_warmup=4), step_micro_batches=1)
    truth = noise(0, 0.05)
    for r in range(4 * TRUST_WARMUP * 3):
        member = r % 3
        vector = truth + noise(r + 1, 0.05)
        vector = -vector if member == 2 else vector
        result = shard.contribute(vector, shard.version, 1, [r + 1], 1.0, sender=f"member-{member}")
        assert result.step is not None
        shard.confirm(result.step.version)
    assert shard.distrusted() == {"member-2": 0.0}

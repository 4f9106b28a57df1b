"""Tests for memtp_sim.exactness: exact speculative sampling on a small vocabulary.

Oracles: hand-computed acceptance probabilities, the target distribution itself
(exactness, Leviathan et al. 2023 Theorem 3.5), the closed form for expected tokens
per round, and the DSpark Appendix A worked example (0.85 vs 0.7).

Statistical tests use a seeded numpy Generator, so each run is deterministic; the
thresholds are chosen so that a correct implementation would fail with probability
about 1e-3 per test under a fresh seed (chi-square / binomial alpha = 1e-3, or a
4-standard-error band), while the broken variants fail by tens of standard errors.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binomtest, chisquare

from memtp_sim.exactness import (
    RoundBatch,
    analytical_acceptance,
    early_stop_length,
    residual_distribution,
    retrospective_length,
    sample_first_tokens,
    simulate_rounds,
    speculative_step,
)

ALPHA = 1e-3  # significance level for "the distribution matches" assertions
A, B = 0, 1  # Appendix A vocabulary

# context-independent per-position distributions over V = 4 tokens, gamma = 3
P_DRAFT = np.array(
    [
        [0.40, 0.30, 0.20, 0.10],
        [0.25, 0.25, 0.25, 0.25],
        [0.10, 0.10, 0.40, 0.40],
    ]
)
P_TARGET = np.array(
    [
        [0.10, 0.20, 0.30, 0.40],
        [0.50, 0.20, 0.20, 0.10],
        [0.10, 0.30, 0.30, 0.30],
        [0.70, 0.10, 0.10, 0.10],  # bonus position 3
    ]
)


def _target_ctx(prefix: tuple[int, ...]) -> list[float]:
    """Target whose next-token distribution depends on the previous token."""
    if not prefix:
        return [0.6, 0.3, 0.1]
    return {0: [0.1, 0.2, 0.7], 1: [0.3, 0.3, 0.4], 2: [0.8, 0.1, 0.1]}[prefix[-1]]


def _draft_ctx(prefix: tuple[int, ...]) -> list[float]:
    """Draft that is a poor, differently context-dependent guess of the target."""
    if not prefix:
        return [0.2, 0.5, 0.3]
    return [0.5, 0.25, 0.25] if prefix[-1] == 0 else [0.2, 0.4, 0.4]


def _chisquare_p(tokens: np.ndarray, expected_probs: np.ndarray) -> float:
    counts = np.bincount(tokens, minlength=len(expected_probs))
    return float(chisquare(counts, tokens.size * np.asarray(expected_probs)).pvalue)


# ------------------------------------------------------------------------------
# analytical acceptance and residual
# ------------------------------------------------------------------------------


def test_analytical_acceptance_hand_cases() -> None:
    # min(0.5, 0.7) + min(0.5, 0.3) = 0.5 + 0.3 = 0.8
    assert analytical_acceptance((0.5, 0.5), (0.7, 0.3)) == pytest.approx(0.8, abs=1e-15)
    assert analytical_acceptance((0.2, 0.3, 0.5), (0.2, 0.3, 0.5)) == pytest.approx(1.0)
    assert analytical_acceptance((1.0, 0.0), (0.0, 1.0)) == pytest.approx(0.0)
    # 3 tokens: min(0.6,0.2) + min(0.3,0.3) + min(0.1,0.5) = 0.2 + 0.3 + 0.1 = 0.6
    # (check: 1 - (0.4 + 0 + 0.4)/2 = 0.6)
    assert analytical_acceptance((0.6, 0.3, 0.1), (0.2, 0.3, 0.5)) == pytest.approx(0.6)


def test_residual_distribution_hand_cases() -> None:
    # max(0, (0.7-0.5, 0.3-0.5)) = (0.2, 0) -> (1, 0)
    np.testing.assert_allclose(residual_distribution((0.5, 0.5), (0.7, 0.3)), [1.0, 0.0])
    # max(0, (0.2-0.6, 0, 0.5-0.1)) = (0, 0, 0.4) -> (0, 0, 1)
    np.testing.assert_allclose(
        residual_distribution((0.6, 0.3, 0.1), (0.2, 0.3, 0.5)), [0.0, 0.0, 1.0]
    )
    # max(0, (0.5-0.1, 0.3-0.1, 0.2-0.8)) = (0.4, 0.2, 0) -> (2/3, 1/3, 0)
    np.testing.assert_allclose(
        residual_distribution((0.1, 0.1, 0.8), (0.5, 0.3, 0.2)), [2 / 3, 1 / 3, 0.0]
    )
    # identical distributions: zero residual mass -> documented fallback p_target
    np.testing.assert_allclose(residual_distribution((0.3, 0.7), (0.3, 0.7)), [0.3, 0.7])


# ------------------------------------------------------------------------------
# single round
# ------------------------------------------------------------------------------


def test_speculative_step_structure() -> None:
    rng = np.random.default_rng(0)
    for ell in (0, 1, 3):
        for _ in range(50):
            step = speculative_step(rng, P_DRAFT, P_TARGET, ell)
            assert step.length == ell
            assert 0 <= step.n_accepted <= ell
            assert len(step.tokens) == step.n_accepted + 1
            assert len(step.drafts) == ell
            # accepted tokens are the drafted ones
            assert step.tokens[: step.n_accepted] == step.drafts[: step.n_accepted]


def test_speculative_step_deterministic_cases() -> None:
    rng = np.random.default_rng(1)
    # target puts all mass on token 2 and so does the draft: always accepted, bonus 2
    one_hot = np.array([0.0, 0.0, 1.0])
    step = speculative_step(rng, one_hot, one_hot, 4)
    assert step.tokens == (2, 2, 2, 2, 2) and step.n_accepted == 4
    # draft always proposes 0, target never emits 0: rejected at once, residual is 1
    step = speculative_step(rng, [1.0, 0.0], [0.0, 1.0], 3)
    assert step.tokens == (1,) and step.n_accepted == 0
    # length 0: plain decoding, a sample from the target, nothing drafted
    step = speculative_step(rng, [1.0, 0.0], [0.0, 1.0], 0)
    assert step.tokens == (1,) and step.drafts == ()


def test_same_seed_same_rounds() -> None:
    a = simulate_rounds(np.random.default_rng(42), 1000, _draft_ctx, _target_ctx, 3)
    b = simulate_rounds(np.random.default_rng(42), 1000, _draft_ctx, _target_ctx, 3)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_array_equal(a.n_accepted, b.n_accepted)


# ------------------------------------------------------------------------------
# Monte Carlo: exactness and acceptance rates
# ------------------------------------------------------------------------------


@pytest.mark.parametrize("ell", [0, 1, 3])
def test_first_token_follows_target(ell: int) -> None:
    # N = 60k rounds, chi-square goodness of fit to p_t at position 0, alpha = 1e-3
    rng = np.random.default_rng(100 + ell)
    first = sample_first_tokens(rng, 60_000, P_DRAFT, P_TARGET, length=ell)
    assert _chisquare_p(first, P_TARGET[0]) > ALPHA


@pytest.mark.parametrize("ell", [1, 3])
def test_first_token_follows_context_dependent_target(ell: int) -> None:
    rng = np.random.default_rng(200 + ell)
    first = sample_first_tokens(rng, 60_000, _draft_ctx, _target_ctx, length=ell)
    assert _chisquare_p(first, _target_ctx(())) > ALPHA


def _check_tokens_follow_target_given_prefix(batch: RoundBatch, gamma: int) -> int:
    """Chi-square test of each emitted token against p_t(. | previous token).

    One test per (position k >= 1, previous token) with >= 2000 samples, alpha = 1e-3
    each. Returns the number of tests run.
    """
    n_tested = 0
    for k in range(1, gamma + 1):
        reached = batch.n_emitted > k
        for prev in range(3):
            sel = reached & (batch.tokens[:, k - 1] == prev)
            if sel.sum() < 2000:
                continue
            # the target here depends on the previous token only
            assert _chisquare_p(batch.tokens[sel, k], _target_ctx((prev,))) > ALPHA, (k, prev)
            n_tested += 1
    return n_tested


def test_every_emitted_token_follows_target_given_prefix() -> None:
    # Stronger than the first-token test: for a fixed verify length, the token emitted
    # at position k, given the tokens emitted before it in the round, follows
    # p_t(. | prefix): each accepted, residual and bonus token is exact. N = 100k rounds.
    rng = np.random.default_rng(300)
    batch = simulate_rounds(rng, 100_000, _draft_ctx, _target_ctx, 3)
    assert _check_tokens_follow_target_given_prefix(batch, 3) >= 6


@pytest.mark.slow
@pytest.mark.parametrize("ell", [1, 2, 4])
def test_every_emitted_token_follows_target_given_prefix_large(ell: int) -> None:
    # Same oracle at N = 400k rounds and more verify lengths (gamma = 4 drafted).
    rng = np.random.default_rng(310 + ell)
    batch = simulate_rounds(rng, 400_000, _draft_ctx, _target_ctx, ell, gamma=4)
    assert _check_tokens_follow_target_given_prefix(batch, ell) >= 2 * ell


def test_early_stop_scheduler_is_exact() -> None:
    # The early-stop scheduler reads c_2 (which depends on the sampled x_1) only if it
    # admitted position 1; with Appendix A numbers it never does, so l = 0 always and
    # the first token is a plain target sample. N = 60k, alpha = 1e-3.
    rng = np.random.default_rng(400)
    p_t, p_d = np.array([0.7, 0.3]), np.array([0.5, 0.5])
    first = sample_first_tokens(rng, 60_000, p_d, p_t, length=_early_stop_scheduler, gamma=2)
    assert _chisquare_p(first, p_t) > ALPHA


def test_early_stop_scheduler_exact_when_it_verifies() -> None:
    # With a flat SPS table the same early-stop rule admits positions (l = 1 or 2,
    # depending on the draft-dependent c_2), and stays exact for the first token:
    # a_1 = 0.8 is fixed, Theta_1 = 1.8 > Theta_0 = 1, so l >= 1 before x_1 is read.
    rng = np.random.default_rng(401)
    p_t, p_d = np.array([0.7, 0.3]), np.array([0.5, 0.5])

    def scheduler(drafts: tuple[int, ...]) -> int:
        return early_stop_length([0.8, 0.8 * _c2(drafts[0])], [1.0, 1.0, 1.0])

    batch = simulate_rounds(rng, 60_000, p_d, p_t, scheduler, gamma=2)
    assert set(np.unique(batch.lengths)) == {1, 2}
    assert _chisquare_p(batch.tokens[:, 0], p_t) > ALPHA


def test_per_position_acceptance_matches_analytical() -> None:
    # N = 100k rounds of length 3. Given positions < k accepted, position k is accepted
    # with probability sum_x min(p_d, p_t) at that position. The band is 4 binomial
    # standard errors of the empirical rate (two-sided ~6e-5 false-alarm rate).
    rng = np.random.default_rng(500)
    batch = simulate_rounds(rng, 100_000, P_DRAFT, P_TARGET, 3)
    # hand values: pos 0: .1+.2+.2+.1 = 0.6; pos 1: .25+.2+.2+.1 = 0.75; pos 2: .1+.1+.3+.3 = 0.8
    expected = [0.6, 0.75, 0.8]
    for k in range(3):
        assert analytical_acceptance(P_DRAFT[k], P_TARGET[k]) == pytest.approx(expected[k])
        reached = batch.n_accepted >= k
        m = int(reached.sum())
        rate = float((batch.n_accepted[reached] >= k + 1).mean())
        se = math.sqrt(expected[k] * (1 - expected[k]) / m)
        assert abs(rate - expected[k]) < 4 * se, (k, rate, m)


def test_expected_tokens_per_round_closed_form() -> None:
    # i.i.d. acceptance alpha = 0.8 ((0.5,0.5) vs (0.7,0.3)) and gamma = 4:
    # E[tokens] = (1 - 0.8^5) / (1 - 0.8) = (1 - 0.32768) / 0.2 = 3.3616.
    # N = 100k; band = 4 standard errors using the sample standard deviation.
    rng = np.random.default_rng(600)
    batch = simulate_rounds(rng, 100_000, [0.5, 0.5], [0.7, 0.3], 4)
    emitted = batch.n_emitted.astype(float)
    se = emitted.std(ddof=1) / math.sqrt(emitted.size)
    assert abs(emitted.mean() - 3.3616) < 4 * se


# ------------------------------------------------------------------------------
# DSpark Appendix A: early stop is lossless, retrospective search is not
# ------------------------------------------------------------------------------

SPS_APPENDIX_A = [1.0, 0.5, 0.45]  # SPS(1), SPS(2), SPS(3)


def _c2(x1: int) -> float:
    """Appendix A: the confidence of position 2 depends on the sampled x_1."""
    return 0.9 if x1 == A else 0.0


def _early_stop_scheduler(drafts: tuple[int, ...]) -> int:
    return early_stop_length([0.8, 0.8 * _c2(drafts[0])], SPS_APPENDIX_A)


def _retrospective_scheduler(drafts: tuple[int, ...]) -> int:
    return retrospective_length([0.8, 0.8 * _c2(drafts[0])], SPS_APPENDIX_A)


def test_appendix_a_scheduler_arithmetic() -> None:
    # Theta_0 = 1 * SPS(1) = 1.0; Theta_1 = (1 + 0.8) * SPS(2) = 0.9 < 1.0 -> early stop l = 0
    assert early_stop_length([0.8, 0.72], SPS_APPENDIX_A) == 0
    assert early_stop_length([0.8, 0.0], SPS_APPENDIX_A) == 0
    # c_2 = 0.9 -> a_2 = 0.72, Theta_2 = (1 + 0.8 + 0.72) * 0.45 = 2.52 * 0.45 = 1.134 > 1.0
    assert retrospective_length([0.8, 0.72], SPS_APPENDIX_A) == 2
    # c_2 = 0 -> Theta_2 = 1.8 * 0.45 = 0.81 < Theta_0 = 1.0 -> l = 0
    assert retrospective_length([0.8, 0.0], SPS_APPENDIX_A) == 0
    # flat SPS: every admitted position adds throughput -> both verify everything
    assert early_stop_length([0.8, 0.72], [1.0, 1.0, 1.0]) == 2
    assert retrospective_length([0.8, 0.72], [1.0, 1.0, 1.0]) == 2


def test_appendix_a_retrospective_is_biased() -> None:
    # Hand derivation of P(first token = A) for the retrospective scheduler:
    #   x_1 = A (prob 0.5) -> c_2 = 0.9 -> l = 2; x_1 = A is accepted with
    #     prob min(1, 0.7/0.5) = 1, so the first token is A: contributes 0.5 * 1 = 0.5
    #   x_1 = B (prob 0.5) -> c_2 = 0 -> l = 0 -> plain target sample, A w.p. 0.7:
    #     contributes 0.5 * 0.7 = 0.35
    #   total 0.85 (the target says 0.7).
    # N = 20k: binomial test at alpha = 1e-3 accepts 0.85 and rejects 0.7
    # (0.15 apart is ~60 standard errors).
    rng = np.random.default_rng(700)
    n = 20_000
    p_t, p_d = [0.7, 0.3], [0.5, 0.5]
    first = sample_first_tokens(rng, n, p_d, p_t, length=_retrospective_scheduler, gamma=2)
    n_a = int((first == A).sum())
    assert binomtest(n_a, n, 0.85).pvalue > ALPHA
    assert binomtest(n_a, n, 0.7).pvalue < 1e-12


def test_appendix_a_early_stop_is_exact() -> None:
    # Early stop: l = 0 whatever x_1 is, so P(first = A) = p_t(A) = 0.7. N = 20k.
    rng = np.random.default_rng(701)
    n = 20_000
    first = sample_first_tokens(
        rng, n, [0.5, 0.5], [0.7, 0.3], length=_early_stop_scheduler, gamma=2
    )
    n_a = int((first == A).sum())
    assert binomtest(n_a, n, 0.7).pvalue > ALPHA
    assert binomtest(n_a, n, 0.85).pvalue < 1e-12


# ------------------------------------------------------------------------------
# the test catches a broken verifier
# ------------------------------------------------------------------------------


def test_broken_verifier_is_caught() -> None:
    # Resampling rejections from p_t instead of the residual biases the output.
    # Appendix A distributions, l = 1: P(A) = 0.5 (draft A, always accepted)
    #   + 0.5 * 0.6 * 0 (draft B accepted w.p. 0.3/0.5 -> B)
    #   + 0.5 * 0.4 * 0.7 (draft B rejected, resample from p_t) = 0.64, not 0.7.
    # Same chi-square test and N as test_first_token_follows_target.
    p_t = np.array([0.7, 0.3])
    exact = sample_first_tokens(np.random.default_rng(800), 60_000, [0.5, 0.5], p_t, length=1)
    assert _chisquare_p(exact, p_t) > ALPHA
    broken = sample_first_tokens(
        np.random.default_rng(800), 60_000, [0.5, 0.5], p_t, length=1, residual=False
    )
    assert _chisquare_p(broken, p_t) < 1e-12
    # and on the 4-token, 3-position chain
    broken4 = sample_first_tokens(
        np.random.default_rng(801), 60_000, P_DRAFT, P_TARGET, length=3, residual=False
    )
    assert _chisquare_p(broken4, P_TARGET[0]) < 1e-12


# ------------------------------------------------------------------------------
# bad input
# ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        ((0.5, -0.1, 0.6), "negative"),
        ((0.5, 0.4), "sums to 0.9"),
        (((0.5, 0.5), (0.5, 0.5)), "2-D"),
        ((), "empty"),
        ((float("nan"), 1.0), "NaN"),
    ],
)
def test_bad_distribution_names_argument(bad: tuple, why: str) -> None:
    good = (0.5, 0.5)
    with pytest.raises(ValueError, match="p_draft"):
        analytical_acceptance(bad, good)
    with pytest.raises(ValueError, match="p_target"):
        analytical_acceptance(good, bad)
    with pytest.raises(ValueError, match="p_target"):
        residual_distribution(good, bad)


def test_bad_input_messages() -> None:
    with pytest.raises(ValueError, match=r"p_draft: entries must sum to 1 .* got 0\.9"):
        analytical_acceptance((0.5, 0.4), (0.5, 0.5))
    with pytest.raises(ValueError, match="p_target: vocabulary size 3"):
        analytical_acceptance((0.5, 0.5), (0.2, 0.3, 0.5))


def test_bad_input_rounds() -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="length"):
        speculative_step(rng, P_DRAFT, P_TARGET, -1)
    with pytest.raises(ValueError, match="length"):
        speculative_step(rng, P_DRAFT, P_TARGET, 3, gamma=2)
    with pytest.raises(ValueError, match="gamma"):
        speculative_step(rng, P_DRAFT, P_TARGET, lambda d: 0)
    with pytest.raises(ValueError, match="length"):
        speculative_step(rng, P_DRAFT, P_TARGET, lambda d: 5, gamma=2)
    with pytest.raises(ValueError, match="p_target"):
        # target table has 4 rows: positions 0..3, but l = 4 needs a bonus at position 4
        speculative_step(rng, [0.25] * 4, P_TARGET, 4)
    with pytest.raises(ValueError, match="p_target"):
        speculative_step(rng, [0.5, 0.5], [0.2, 0.3, 0.5], 1)
    with pytest.raises(ValueError, match="p_target"):
        speculative_step(rng, [0.5, 0.5], lambda prefix: [0.2, 0.3, 0.5], 1)
    with pytest.raises(ValueError, match="p_draft"):
        speculative_step(rng, lambda prefix: [0.6, 0.6], [0.5, 0.5], 1)
    with pytest.raises(ValueError, match="n"):
        simulate_rounds(rng, 0, P_DRAFT, P_TARGET, 1)
    with pytest.raises(TypeError, match="rng"):
        simulate_rounds(0, 10, P_DRAFT, P_TARGET, 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sps"):
        early_stop_length([0.8, 0.7], [1.0, 0.5])
    with pytest.raises(ValueError, match="cumulative_confidences"):
        retrospective_length([1.2], [1.0, 0.5])


def test_round_batch_shapes() -> None:
    batch = simulate_rounds(np.random.default_rng(3), 500, P_DRAFT, P_TARGET, 2, gamma=3)
    assert isinstance(batch, RoundBatch)
    assert batch.tokens.shape == (500, 4)
    assert batch.drafts.shape == (500, 3)
    assert np.all(batch.lengths == 2)
    # exactly n_emitted non-padding tokens, left-aligned
    filled = batch.tokens >= 0
    np.testing.assert_array_equal(filled.sum(axis=1), batch.n_emitted)
    assert np.all(filled[:, :1]) and not np.any(filled[:, 3])

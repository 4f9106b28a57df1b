"""Tests for memtp_sim.confidence (calibration metrics and STS).

Oracles are hand-computed values (arithmetic in the comments) and data drawn from a
known generating process; no test re-computes the implementation's own formula.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import expit

from memtp_sim.confidence import (
    DEFAULT_TEMPERATURE_GRID,
    PositionMetrics,
    apply_temperature,
    auc_score,
    brier_score,
    expected_calibration_error,
    per_position_metrics,
    reliability_curve,
    sequential_temperature_scaling,
)

# ------------------------------------------------------------------------------
# helpers: a known generating process
# ------------------------------------------------------------------------------


def _overconfident_rounds(
    seed: int, n_rounds: int, t_true: list[float], mu: float = 1.2, sd: float = 1.0
) -> tuple[np.ndarray, np.ndarray]:
    """Rounds whose true conditional acceptance is p = sigmoid(z), z ~ N(mu, sd).

    Acceptance is sampled left to right and stops at the first rejection. The raw head
    reports c = sigmoid(z * T_true) (over-confident for T_true > 1), so dividing its
    logit by T_true recovers p exactly: the correct STS temperature is T_true.
    """
    rng = np.random.default_rng(seed)
    gamma = len(t_true)
    z = rng.normal(mu, sd, size=(n_rounds, gamma))
    p_true = expit(z)
    accepted = np.cumprod(rng.random((n_rounds, gamma)) < p_true, axis=1).astype(bool)
    raw = expit(z * np.asarray(t_true))
    return raw, accepted


# ------------------------------------------------------------------------------
# ECE and reliability curve
# ------------------------------------------------------------------------------


def test_ece_perfectly_calibrated_is_zero() -> None:
    # Bin of 0.25 (15 bins: (3/15, 4/15]) holds four samples with one positive:
    # mean prob 0.25, frac 1/4 = 0.25 -> gap 0. Bin of 0.75 holds three of four
    # positive: 0.75 vs 0.75 -> gap 0. ECE = 0.
    probs = [0.25] * 4 + [0.75] * 4
    outcomes = [1, 0, 0, 0] + [1, 1, 1, 0]
    assert expected_calibration_error(probs, outcomes) == pytest.approx(0.0, abs=1e-15)


def test_ece_single_bin() -> None:
    # n_bins=1: one bin with mean prob (0.9+0.9+0.6+0.6)/4 = 0.75 and
    # frac positive 2/4 = 0.5 -> ECE = |0.5 - 0.75| = 0.25.
    probs = [0.9, 0.9, 0.6, 0.6]
    outcomes = [True, False, True, False]
    assert expected_calibration_error(probs, outcomes, n_bins=1) == pytest.approx(0.25)


def test_ece_two_bins_hand_computed() -> None:
    # n_bins=2, bins (0, 0.5] and (0.5, 1].
    # bin 0: probs 0.2, 0.4 (mean 0.3), outcomes 0, 1 (frac 0.5): weight 2/5 * 0.2 = 0.08
    # bin 1: probs 0.6, 0.8, 1.0 (mean 0.8), outcomes 1, 1, 0 (frac 2/3):
    #        weight 3/5 * |2/3 - 0.8| = 3/5 * 2/15 = 0.08
    # ECE = 0.16
    probs = np.array([0.2, 0.4, 0.6, 0.8, 1.0])
    outcomes = np.array([0, 1, 1, 1, 0])
    assert expected_calibration_error(probs, outcomes, n_bins=2) == pytest.approx(0.16)


def test_ece_bin_edges_are_right_closed() -> None:
    # two bins: [0, 0.5] holds 0.0 (p == 0 joins the first bin) and both 0.5s (right-
    # closed); (0.5, 1] holds 0.5000001 and 1.0 -> counts [3, 2]
    curve = reliability_curve([0.0, 0.5, 0.5, 0.5000001, 1.0], [0, 1, 0, 1, 1], n_bins=2)
    assert curve.counts.tolist() == [3, 2]
    # every i/15 lands in its own bin ((i-1)/15, i/15]
    curve15 = reliability_curve(np.arange(1, 16) / 15, np.ones(15), n_bins=15)
    assert curve15.counts.tolist() == [1] * 15


@pytest.mark.parametrize("n_bins", [15, 25, 49])
def test_bin_edges_exact_at_float_boundaries(n_bins: int) -> None:
    # Each bin ((i-1)/n, i/n] must receive its own upper edge i/n (as Python computes
    # it) and the next float above its lower edge. Naive ceil(p * n) - 1 misplaces some
    # of these (e.g. 7/25 * 25 rounds to 7.000000000000001), so this pins the convention.
    edges = np.arange(n_bins + 1) / n_bins
    probs = np.concatenate([edges[1:], np.nextafter(edges[:-1], 2.0)])
    curve = reliability_curve(probs, np.zeros(probs.size), n_bins=n_bins)
    assert curve.counts.tolist() == [2] * n_bins


def test_reliability_curve_values_and_empty_bins() -> None:
    # 4 bins of width 0.25: bin 0 holds 0.1, 0.2 (mean 0.15, outcomes 0, 1 -> 0.5),
    # bins 1 and 2 are empty, bin 3 holds 0.9 (outcome 1 -> 1.0).
    curve = reliability_curve([0.1, 0.2, 0.9], [0, 1, 1], n_bins=4)
    np.testing.assert_allclose(curve.bin_centers, [0.125, 0.375, 0.625, 0.875])
    assert curve.counts.tolist() == [2, 0, 0, 1]
    np.testing.assert_allclose(curve.mean_prob[[0, 3]], [0.15, 0.9])
    np.testing.assert_allclose(curve.frac_positive[[0, 3]], [0.5, 1.0])
    assert np.isnan(curve.mean_prob[1:3]).all() and np.isnan(curve.frac_positive[1:3]).all()


# ------------------------------------------------------------------------------
# AUC and Brier
# ------------------------------------------------------------------------------


def test_auc_perfect_and_reversed() -> None:
    assert auc_score([0.1, 0.2, 0.8, 0.9], [0, 0, 1, 1]) == pytest.approx(1.0)
    assert auc_score([0.9, 0.8, 0.2, 0.1], [0, 0, 1, 1]) == pytest.approx(0.0)


def test_auc_hand_cases() -> None:
    # positives 0.35, 0.8; negatives 0.1, 0.4. Pairs (pos > neg):
    # 0.35>0.1 yes, 0.35>0.4 no, 0.8>0.1 yes, 0.8>0.4 yes -> 3/4 = 0.75
    assert auc_score([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == pytest.approx(0.75)
    # with a tie: positives 0.5, 0.9; negatives 0.2, 0.5.
    # 0.5 vs 0.2 win (1), 0.5 vs 0.5 tie (1/2), 0.9 wins twice (2) -> 3.5/4 = 0.875
    assert auc_score([0.2, 0.5, 0.5, 0.9], [0, 1, 0, 1]) == pytest.approx(0.875)
    # all scores tied: every pair counts 1/2 -> 0.5
    assert auc_score([0.3, 0.3, 0.3], [1, 0, 1]) == pytest.approx(0.5)


def test_brier_hand_case() -> None:
    # ((0.9 - 1)^2 + (0.2 - 0)^2) / 2 = (0.01 + 0.04) / 2 = 0.025
    assert brier_score([0.9, 0.2], [1, 0]) == pytest.approx(0.025)


# ------------------------------------------------------------------------------
# temperature scaling
# ------------------------------------------------------------------------------


def test_apply_temperature_hand_values() -> None:
    # logit(0.8) = ln 4; / 0.5 -> ln 16 -> sigmoid = 16/17
    assert apply_temperature(0.8, 0.5) == pytest.approx(16 / 17)
    # logit(0.8) / 2 = ln 2 -> 2/3
    assert apply_temperature(0.8, 2.0) == pytest.approx(2 / 3)
    # 0.5 is a fixed point of every temperature
    np.testing.assert_allclose(apply_temperature([0.5, 0.5], [0.3, 7.0]), [0.5, 0.5])
    # per-position temperatures broadcast along the last axis
    out = apply_temperature([[0.8, 0.8], [0.2, 0.2]], [0.5, 2.0])
    np.testing.assert_allclose(out, [[16 / 17, 2 / 3], [1 / 17, 1 / 3]])
    # clipping keeps 0 and 1 finite: logit(1 - 1e-6) ~ 13.8155
    assert 0.0 < apply_temperature(0.0, 1.0) < 1e-5
    assert 1.0 - 1e-5 < apply_temperature(1.0, 1.0) < 1.0


@pytest.mark.slow
def test_sts_recovers_known_temperature() -> None:
    # 80k rounds, 5 positions, T_true = 2 everywhere. Over 40 seeds the fitted T_k had
    # standard deviation 0.027, 0.041, 0.065, 0.083, 0.107 at 40k rounds (positions
    # 1..5; deeper positions see fewer positives and a noisier product), i.e. at most
    # ~0.076 at 80k; +-0.25 is > 3 standard deviations at every position, and is far
    # from the uncorrected T = 1.
    raw, accepted = _overconfident_rounds(seed=11, n_rounds=80_000, t_true=[2.0] * 5)
    temps = sequential_temperature_scaling(raw, accepted)
    assert temps.shape == (5,)
    np.testing.assert_allclose(temps, 2.0, atol=0.25)


@pytest.mark.slow
def test_sts_recovers_per_position_temperatures() -> None:
    # Different T_true per position. Seed study (40 seeds, 40k rounds): sd 0.020, 0.055,
    # 0.113 -> <= 0.08 at 80k rounds, so +-0.25 is > 3 sd; the three truths are
    # >= 0.5 apart, so a fit that ignored position would fail.
    t_true = [1.5, 2.0, 3.0]
    raw, accepted = _overconfident_rounds(seed=12, n_rounds=80_000, t_true=t_true)
    temps = sequential_temperature_scaling(raw, accepted)
    np.testing.assert_allclose(temps, t_true, atol=0.25)


def test_sts_small_sample_recovers_temperature() -> None:
    # Fast variant: 20k rounds, 2 positions. Seed-study sd at 40k was 0.027 and 0.041,
    # so about 0.06 at 20k; +-0.25 is > 4 sd.
    raw, accepted = _overconfident_rounds(seed=3, n_rounds=20_000, t_true=[2.5, 2.5])
    temps = sequential_temperature_scaling(raw, accepted)
    np.testing.assert_allclose(temps, 2.5, atol=0.25)


def test_sts_keeps_calibrated_head_near_one() -> None:
    # A head that already reports the true probability (T_true = 1) needs no fix.
    raw, accepted = _overconfident_rounds(seed=5, n_rounds=20_000, t_true=[1.0, 1.0, 1.0])
    temps = sequential_temperature_scaling(raw, accepted)
    np.testing.assert_allclose(temps, 1.0, atol=0.15)


def test_sts_lowers_ece_of_every_cumulative_product() -> None:
    raw, accepted = _overconfident_rounds(seed=7, n_rounds=20_000, t_true=[2.0, 2.0, 2.0])
    before = per_position_metrics(raw, accepted)
    temps = sequential_temperature_scaling(raw, accepted)
    after = per_position_metrics(apply_temperature(raw, temps), accepted)
    assert isinstance(after, PositionMetrics)
    assert np.all(after.ece < before.ece)
    # the over-confident head is badly calibrated (> 5%), the scaled one well (< 2%)
    assert np.all(before.ece > 0.05)
    assert np.all(after.ece < 0.02)
    # position 1's score is a monotone map of the raw one: same AUC
    assert after.auc[0] == pytest.approx(before.auc[0])


def test_sts_ties_prefer_temperature_one() -> None:
    # Confidence 0.5 is a fixed point of every temperature, so every grid value gives
    # the same ECE; the documented tie-break keeps the raw scores (T = 1).
    conf = np.full((6, 2), 0.5)
    accepted = np.array([[1, 1], [1, 0], [0, 0]] * 2, dtype=bool)
    np.testing.assert_allclose(sequential_temperature_scaling(conf, accepted), [1.0, 1.0])
    # off-grid 1: the nearest in log scale wins (|ln 0.8| = 0.22 < |ln 1.3| = 0.26)
    temps = sequential_temperature_scaling(conf, accepted, grid=[3.0, 1.3, 0.8])
    np.testing.assert_allclose(temps, [0.8, 0.8])


def test_default_grid_covers_useful_range() -> None:
    assert DEFAULT_TEMPERATURE_GRID.min() <= 0.5
    assert DEFAULT_TEMPERATURE_GRID.max() >= 5.0
    assert np.all(np.diff(DEFAULT_TEMPERATURE_GRID) > 0)


def test_sts_custom_grid_returns_grid_values() -> None:
    raw, accepted = _overconfident_rounds(seed=9, n_rounds=5_000, t_true=[2.0, 2.0])
    grid = [1.0, 2.0, 4.0]
    temps = sequential_temperature_scaling(raw, accepted, grid=grid)
    assert set(temps.tolist()) <= set(grid)
    assert temps.tolist() == [2.0, 2.0]


@st.composite
def _rounds(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    n_rounds = draw(st.integers(1, 40))
    gamma = draw(st.integers(1, 4))
    # scores on a 0.001 grid in [0.001, 0.999] (duplicates allowed): distinct scores stay
    # distinguishable in float64 after any grid temperature in [0.25, 8]
    ints = draw(
        st.lists(st.integers(1, 999), min_size=n_rounds * gamma, max_size=n_rounds * gamma)
    )
    raw = np.array(ints, dtype=np.float64).reshape(n_rounds, gamma) / 1000.0
    lengths = draw(st.lists(st.integers(0, gamma), min_size=n_rounds, max_size=n_rounds))
    accepted = np.arange(gamma)[None, :] < np.array(lengths)[:, None]
    return raw, accepted


@settings(max_examples=60, deadline=None)
@given(_rounds())
def test_sts_preserves_ranking(data: tuple[np.ndarray, np.ndarray]) -> None:
    raw, accepted = data
    temps = sequential_temperature_scaling(raw, accepted)
    assert temps.shape == (raw.shape[1],)
    assert np.all(temps > 0)
    calibrated = apply_temperature(raw, temps)
    for k in range(raw.shape[1]):
        np.testing.assert_array_equal(
            np.argsort(raw[:, k], kind="stable"), np.argsort(calibrated[:, k], kind="stable")
        )


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(0.0, 1.0), min_size=2, max_size=30),
    st.floats(0.05, 20.0),
)
def test_apply_temperature_is_monotone(values: list[float], temperature: float) -> None:
    # for arbitrary floats (including 0, 1 and near-ties) the map never reverses order
    raw = np.array(values)
    order = np.argsort(raw, kind="stable")
    scaled = apply_temperature(raw, temperature)[order]
    assert np.all(np.diff(scaled) >= 0)


# ------------------------------------------------------------------------------
# per-position metrics
# ------------------------------------------------------------------------------


def test_per_position_metrics_hand_case() -> None:
    # c = 0.5 everywhere -> a_1 = 0.5, a_2 = 0.25.
    # rounds: accepted prefixes of length 2, 1, 0, 0.
    # position 1 outcomes 1,1,0,0 vs 0.5: ECE |0.5-0.5| = 0, Brier 0.25, AUC 0.5 (ties)
    # position 2 outcomes 1,0,0,0 vs 0.25: ECE |0.25-0.25| = 0,
    #   Brier (0.75^2 + 3 * 0.25^2)/4 = (0.5625 + 0.1875)/4 = 0.1875
    conf = np.full((4, 2), 0.5)
    accepted = np.array([[1, 1], [1, 0], [0, 0], [0, 0]], dtype=bool)
    m = per_position_metrics(conf, accepted)
    np.testing.assert_allclose(m.ece, [0.0, 0.0], atol=1e-15)
    np.testing.assert_allclose(m.brier, [0.25, 0.1875])
    np.testing.assert_allclose(m.auc, [0.5, 0.5])


def test_per_position_metrics_nan_auc_for_one_class() -> None:
    conf = np.array([[0.9, 0.5], [0.8, 0.4]])
    accepted = np.array([[True, False], [True, False]])
    m = per_position_metrics(conf, accepted)
    assert np.isnan(m.auc).all()


# ------------------------------------------------------------------------------
# bad input
# ------------------------------------------------------------------------------


def test_bad_input_probs_and_outcomes() -> None:
    with pytest.raises(ValueError, match="probs"):
        expected_calibration_error([0.2, 1.2], [0, 1])
    with pytest.raises(ValueError, match="probs"):
        expected_calibration_error([], [])
    with pytest.raises(ValueError, match="probs"):
        expected_calibration_error([0.2, float("nan")], [0, 1])
    with pytest.raises(ValueError, match="outcomes"):
        expected_calibration_error([0.2, 0.3], [0, 1, 1])
    with pytest.raises(ValueError, match="outcomes"):
        expected_calibration_error([0.2, 0.3], [0, 2])
    with pytest.raises(ValueError, match="n_bins"):
        expected_calibration_error([0.2, 0.3], [0, 1], n_bins=0)
    with pytest.raises(ValueError, match="probs"):
        brier_score([-0.1], [0])
    with pytest.raises(ValueError, match="probs"):
        reliability_curve([[0.1]], [[1]])


def test_bad_input_auc() -> None:
    with pytest.raises(ValueError, match="labels"):
        auc_score([0.1, 0.2], [1, 1])
    with pytest.raises(ValueError, match="labels"):
        auc_score([0.1, 0.2], [1, 0, 1])
    with pytest.raises(ValueError, match="scores"):
        auc_score([], [])


def test_bad_input_temperatures() -> None:
    with pytest.raises(ValueError, match="confidences"):
        apply_temperature([0.5, -0.2], 1.0)
    with pytest.raises(ValueError, match="temperatures"):
        apply_temperature([0.5, 0.2], [1.0, 0.0])
    with pytest.raises(ValueError, match="temperatures"):
        apply_temperature([[0.5, 0.2]], [1.0, 2.0, 3.0])


def test_bad_input_sts() -> None:
    good_conf = np.full((3, 2), 0.5)
    good_acc = np.array([[1, 1], [1, 0], [0, 0]], dtype=bool)
    with pytest.raises(ValueError, match="confidences"):
        sequential_temperature_scaling(np.full((3, 2), 1.5), good_acc)
    with pytest.raises(ValueError, match="confidences"):
        sequential_temperature_scaling(np.full(3, 0.5), good_acc[:, 0])
    with pytest.raises(ValueError, match="confidences"):
        sequential_temperature_scaling(np.empty((0, 2)), np.empty((0, 2), dtype=bool))
    with pytest.raises(ValueError, match="accepted"):
        sequential_temperature_scaling(good_conf, good_acc[:2])
    with pytest.raises(ValueError, match="accepted"):
        # True after False: not a prefix
        sequential_temperature_scaling(good_conf, np.array([[0, 1], [1, 0], [0, 0]]))
    with pytest.raises(ValueError, match="grid"):
        sequential_temperature_scaling(good_conf, good_acc, grid=[0.5, 0.0, 2.0])
    with pytest.raises(ValueError, match="grid"):
        sequential_temperature_scaling(good_conf, good_acc, grid=[-1.0])
    with pytest.raises(ValueError, match="grid"):
        sequential_temperature_scaling(good_conf, good_acc, grid=[])
    with pytest.raises(ValueError, match="accepted"):
        per_position_metrics(good_conf, np.array([[0, 1], [1, 0], [0, 0]]))


def test_error_message_reports_offending_value() -> None:
    expected = r"confidences: values must lie in \[0, 1\], got min -0\.2"
    with pytest.raises(ValueError, match=expected):
        apply_temperature([0.5, -0.2], 1.0)


def test_per_position_metrics_without_auc_keeps_ece_and_brier():
    # auc=False (the run metrics' raw head, whose AUC is not reported) changes nothing else
    from memtp_sim import per_position_metrics

    rng = np.random.default_rng(5)
    conf = rng.uniform(0.2, 1.0, size=(3000, 4))
    ok = np.logical_and.accumulate(rng.random((3000, 4)) < conf, axis=1)
    full, lean = per_position_metrics(conf, ok), per_position_metrics(conf, ok, auc=False)
    assert np.isnan(lean.auc).all() and np.isfinite(full.auc).all()
    assert full.ece.tobytes() == lean.ece.tobytes() and full.brier.tobytes() == lean.brier.tobytes()


@pytest.mark.parametrize("n_bins", [1, 10, 15])
def test_reliability_rows_equal_one_curve_per_row(n_bins):
    # the batched curves (the run metrics' reliability diagrams) against the public one-row function
    from memtp_sim.confidence import reliability_rows

    rng = np.random.default_rng(3)
    probs = np.cumprod(rng.uniform(0.2, 1.0, (4, 500)), axis=0)
    probs[0, :6] = [0.0, 1.0, 0.1, 0.2, 1 / 15, 14 / 15]  # edges and ends
    outcomes = rng.random((4, 500)) < probs
    for row, curve in enumerate(reliability_rows(probs, outcomes, n_bins=n_bins)):
        want = reliability_curve(probs[row], outcomes[row], n_bins=n_bins)
        for got_a, want_a in zip(curve, want):
            assert np.asarray(got_a).tobytes() == np.asarray(want_a).tobytes()


@pytest.mark.parametrize("seed", range(8))
def test_one_position_of_ragged_rounds_scores_as_per_position_metrics(seed):
    # an elastic ensemble drafts different depths round to round: the run's position-k metrics
    # are those of the rounds that drafted k, and metrics._position_metrics scores position k
    # alone. Oracle: per_position_metrics of those rounds' first k positions, its k-th values,
    # bit for bit (the Brier sum in numpy's order: row by row over several columns, pairwise
    # over one), on confidences with exact 0s, 1s and ties
    from memtp_sim.confidence import per_position_metrics
    from memtp_sim.metrics import _position_metrics

    rng = np.random.default_rng(seed)
    n, width = int(rng.integers(60, 4000)), int(rng.integers(1, 17))
    conf = rng.random((n, width))
    conf = np.where(rng.random((n, width)) < 0.3, np.round(conf, 1), conf)  # ties, and exact 0s and 1s
    ok = np.cumprod(rng.random((n, width)) < conf, axis=1).astype(bool)  # prefix-shaped
    widths = rng.integers(1, width + 1, n)
    cum = np.cumprod(conf, axis=1)
    checked = 0
    for k in range(1, width + 1):
        rows = widths >= k
        if rows.sum() < 2:
            continue
        want = per_position_metrics(conf[rows, :k], ok[rows, :k])
        got = _position_metrics(cum[rows, k - 1], ok[rows, k - 1], several=k > 1, auc=True)
        for w, g in zip((want.ece[-1], want.auc[-1], want.brier[-1]), got):
            assert np.array_equal(np.float64(w), np.float64(g), equal_nan=True), (k, w, g)
        checked += 1
    assert checked >= 1

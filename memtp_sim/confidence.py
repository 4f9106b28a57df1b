"""The drafter's confidence head and its calibration: ECE, reliability, AUC, Brier, STS.

A draft confidence head gives every draft position ``k`` a *conditional* survival
estimate ``c_k`` (probability that position ``k`` is accepted given that positions
``1..k-1`` were). Schedulers rank candidates by the *joint* survival, the cumulative
product ``a_k = prod_{i<=k} c_i``, so calibration is judged on ``a_k`` against the
outcome "positions ``1..k`` were all accepted".

Raw heads are over-confident. Sequential Temperature Scaling (STS; DSpark paper,
Cheng et al. 2026, §3.2) fixes this with one temperature per position, fitted left to
right by a 1-D grid search that minimises the ECE of ``a_k`` with the temperatures of
earlier positions held fixed. Temperature scaling is monotone, so it never changes
the order of the scores at a position.

Array conventions: ``confidences`` and ``accepted`` are ``(n_rounds, gamma)`` arrays,
one row per verification round, one column per draft position (column ``k - 1`` is
position ``k``). ``accepted[r, k - 1]`` is True when positions ``1..k`` of round ``r``
were all accepted, so each row is a run of True followed by a run of False.

:class:`ConfidenceHead` models the head itself (a noisy, over-confident view of the true
acceptance of :mod:`memtp_sim.acceptance`); :func:`calibration_stream` draws the held-out rounds
STS is fitted on.

Every function raises :class:`~memtp_sim.errors.InvalidArgumentError` (a ``ValueError``) whose
message starts with the name of the offending argument.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

from . import _compiled
from ._lazy import expit, logit
from .acceptance import AcceptanceModel
from .errors import InvalidArgumentError

__all__ = [
    "CONFIDENCE_CLIP",
    "ConfidenceHead",
    "calibration_stream",
    "DEFAULT_TEMPERATURE_GRID",
    "PositionMetrics",
    "ReliabilityCurve",
    "apply_temperature",
    "auc_score",
    "brier_score",
    "expected_calibration_error",
    "per_position_metrics",
    "reliability_curve",
    "sequential_temperature_scaling",
]

#: Confidences are clipped to ``[CONFIDENCE_CLIP, 1 - CONFIDENCE_CLIP]`` before the logit.
CONFIDENCE_CLIP: float = 1e-6

#: Default STS search grid: 121 temperatures, log-spaced over [0.25, 8.0] (ratio ~1.029
#: between neighbours), which covers the 0.5..5 range seen for over-confident heads.
DEFAULT_TEMPERATURE_GRID: NDArray[np.float64] = np.geomspace(0.25, 8.0, 121)
DEFAULT_TEMPERATURE_GRID.setflags(write=False)


class ReliabilityCurve(NamedTuple):
    """Per-bin summary for a reliability diagram.

    Attributes:
        bin_centers: ``(n_bins,)`` midpoints of the equal-width bins on [0, 1].
        mean_prob: ``(n_bins,)`` mean predicted probability in each bin; NaN for an
            empty bin.
        frac_positive: ``(n_bins,)`` fraction of positive outcomes in each bin; NaN for
            an empty bin.
        counts: ``(n_bins,)`` int64 number of samples in each bin (0 for an empty bin).

    Source:
        The reliability diagram of DeGroot and Fienberg (1983); DSpark paper (Cheng et al.
        2026) Fig. 6 plots these per position.
    """

    bin_centers: NDArray[np.float64]
    mean_prob: NDArray[np.float64]
    frac_positive: NDArray[np.float64]
    counts: NDArray[np.int64]


@dataclass(frozen=True)
class PositionMetrics:
    """Calibration and ranking quality of the cumulative confidence at each position.

    Entry ``k - 1`` of each array describes position ``k``: the score is the cumulative
    product ``a_k`` and the outcome is ``accepted[:, k - 1]``.

    Attributes:
        ece: ``(gamma,)`` expected calibration error of ``a_k`` (a fraction, not %).
        auc: ``(gamma,)`` ROC AUC of ``a_k``; NaN where only one outcome class occurs.
        brier: ``(gamma,)`` Brier score of ``a_k``.

    Source:
        DSpark paper (Cheng et al. 2026) Fig. 6 reports ECE and AUC per position; Brier (1950)
        for the Brier score.
    """

    ece: NDArray[np.float64]
    auc: NDArray[np.float64]
    brier: NDArray[np.float64]


# ----------------------------------------------------------------------------------
# validation helpers
# ----------------------------------------------------------------------------------


def _unit_interval_array(values: ArrayLike, name: str, ndim: int | None = None) -> NDArray:
    """Return ``values`` as a non-empty float64 array with entries in [0, 1]."""
    arr = np.asarray(values, dtype=np.float64)
    if ndim is not None and arr.ndim != ndim:
        raise InvalidArgumentError(f"{name}: must be {ndim}-D, got shape {arr.shape}")
    if arr.size == 0:
        raise InvalidArgumentError(f"{name}: must not be empty, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise InvalidArgumentError(f"{name}: values must be finite, found NaN or inf")
    lo, hi = float(arr.min()), float(arr.max())
    if lo < 0.0 or hi > 1.0:
        raise InvalidArgumentError(f"{name}: values must lie in [0, 1], got min {lo:g} and max {hi:g}")
    return arr


def _binary_array(values: ArrayLike, name: str, shape: tuple[int, ...], other: str) -> NDArray:
    """Return ``values`` as a bool array of ``shape``; entries must be bool or 0/1."""
    arr = np.asarray(values)
    if arr.shape != shape:
        raise InvalidArgumentError(f"{name}: shape {arr.shape} does not match {other} shape {shape}")
    if arr.dtype == np.bool_:
        return arr
    if not np.issubdtype(arr.dtype, np.number):
        raise InvalidArgumentError(f"{name}: must be bool or 0/1 numbers, got dtype {arr.dtype}")
    ok = (arr == 0) | (arr == 1)
    if not np.all(ok):
        bad = arr[~ok].flat[0]
        raise InvalidArgumentError(f"{name}: values must be bool or 0/1, got {bad!r}")
    return arr.astype(bool)


def _check_n_bins(n_bins: int) -> int:
    if isinstance(n_bins, bool) or not isinstance(n_bins, (int, np.integer)):
        raise InvalidArgumentError(f"n_bins: must be an integer, got {n_bins!r}")
    if n_bins < 1:
        raise InvalidArgumentError(f"n_bins: must be >= 1, got {n_bins}")
    return int(n_bins)


def _bin_index(probs: NDArray, n_bins: int) -> NDArray[np.intp]:
    """Bin of each probability; bin ``i`` holds ``p`` in ``(i/n, (i+1)/n]``, 0 -> bin 0.

    Edges are ``np.arange(n_bins + 1) / n_bins`` (each ``i / n`` correctly rounded), so a
    value typed as ``i / n`` lands exactly on an edge and goes to the lower bin.
    """
    edges = np.arange(n_bins + 1) / n_bins
    # fast guess from ceil(p * n) - 1, then one exact correction step against the edges
    # (p * n is off by at most an ulp, so the guess is off by at most one bin)
    idx = np.clip(np.ceil(probs * n_bins).astype(np.intp) - 1, 0, n_bins - 1)
    idx -= (probs <= edges[idx]) & (idx > 0)
    idx += (probs > edges[idx + 1]) & (idx < n_bins - 1)
    return idx


def _paired_inputs(
    probs: ArrayLike, outcomes: ArrayLike, probs_name: str = "probs"
) -> tuple[NDArray, NDArray]:
    p = _unit_interval_array(probs, probs_name, ndim=1)
    y = _binary_array(outcomes, "outcomes", p.shape, probs_name)
    return p, y


def _ece_rows(probs: NDArray, outcomes: NDArray, n_bins: int) -> NDArray[np.float64]:
    """ECE of every row of ``probs`` (shape ``(m, n)``) against ``outcomes``: ``(n,)`` shared by
    every row, or ``(m, n)`` one row each.

    Vectorised with one ``bincount`` over row-offset bin indices.
    """
    m, n = probs.shape
    _, sum_prob, sum_pos = _binned_rows(probs, outcomes, n_bins, counts=False)
    # sum_b (n_b/N) |mean_pos_b - mean_prob_b| = sum_b |sum_pos_b - sum_prob_b| / N
    gap = np.abs(sum_pos - sum_prob)
    return gap.sum(axis=1) / n


def _binned_rows(probs: NDArray, outcomes: NDArray, n_bins: int,
                 counts: bool = True) -> tuple[NDArray[np.int64] | None, NDArray[np.float64], NDArray[np.float64]]:
    """Per row of ``probs`` ``(m, n)`` and bin: the count (None unless ``counts``), the sum of
    the probabilities and the sum of the outcomes (``(n,)`` shared, or ``(m, n)``), each
    ``(m, n_bins)``. Each bin's sums add its values in row order (``bincount``), whatever ``m``."""
    m, _ = probs.shape
    kernels = _compiled.active()
    if kernels is not None and probs.dtype == np.float64 and outcomes.dtype == np.bool_:
        out = (np.empty((m, n_bins), dtype=np.int64), np.empty((m, n_bins)), np.empty((m, n_bins)))
        kernels.binned_rows(np.ascontiguousarray(probs), np.ascontiguousarray(outcomes), n_bins, *out)
        return out
    flat = (_bin_index(probs, n_bins) + (np.arange(m) * n_bins)[:, None]).ravel()
    sum_prob = np.bincount(flat, weights=probs.ravel(), minlength=m * n_bins).reshape(m, n_bins)
    pos = np.broadcast_to(outcomes.astype(np.float64), probs.shape).ravel()
    sum_pos = np.bincount(flat, weights=pos, minlength=m * n_bins).reshape(m, n_bins)
    num = np.bincount(flat, minlength=m * n_bins).astype(np.int64).reshape(m, n_bins) if counts else None
    return num, sum_prob, sum_pos


def reliability_rows(probs: NDArray, outcomes: NDArray, *, n_bins: int = 15) -> list[ReliabilityCurve]:
    """:func:`reliability_curve` of every row of ``probs`` ``(m, n)`` against the same row of
    ``outcomes`` ``(m, n)``, binned at once (the same values as one call per row, bit for bit).

    Args:
        probs: ``(m, n)`` probabilities in [0, 1] (not checked: the callers built them).
        outcomes: ``(m, n)`` bool outcomes.
        n_bins: number of equal-width bins on [0, 1], >= 1.

    Returns:
        ``m`` curves.

    Source:
        DeGroot and Fienberg (1983) reliability diagram; DSpark paper Fig. 6.
    """
    n_bins = _check_n_bins(n_bins)
    return _curves(*_binned_rows(probs, outcomes, n_bins))


def _curves(num: NDArray[np.int64], sum_prob: NDArray[np.float64], sum_pos: NDArray[np.float64]) -> list[ReliabilityCurve]:
    """One :class:`ReliabilityCurve` per row of binned counts and sums (``(m, n_bins)`` each)."""
    n_bins = num.shape[1]
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_prob = np.where(num > 0, sum_prob / num, np.nan)
        frac_pos = np.where(num > 0, sum_pos / num, np.nan)
    edges = np.arange(n_bins + 1) / n_bins
    centers = 0.5 * (edges[:-1] + edges[1:])
    return [ReliabilityCurve(centers, mean_prob[k], frac_pos[k], num[k]) for k in range(num.shape[0])]


# ----------------------------------------------------------------------------------
# metrics
# ----------------------------------------------------------------------------------


def expected_calibration_error(
    probs: ArrayLike, outcomes: ArrayLike, *, n_bins: int = 15
) -> float:
    """Expected calibration error with equal-width bins.

    Bin convention: bin ``i`` (0-based) holds ``p`` in ``(i/n_bins, (i+1)/n_bins]``;
    ``p == 0`` goes to the first bin. Then
    ``ECE = sum_b (n_b / N) * |mean(outcome in b) - mean(prob in b)|``.

    Args:
        probs: ``(N,)`` predicted probabilities in [0, 1].
        outcomes: ``(N,)`` observed outcomes, bool or 0/1.
        n_bins: number of equal-width bins on [0, 1], >= 1.

    Returns:
        ECE as a fraction in [0, 1] (multiply by 100 for %).

    Raises:
        InvalidArgumentError: ``probs`` empty, not 1-D, non-finite or outside [0, 1];
            ``outcomes`` of another shape or not bool/0/1; ``n_bins`` < 1.

    Source:
        Naeini, Cooper and Hauskrecht (2015, AAAI), who introduced ECE; Guo et al. (2017,
        ICML), *On calibration of modern neural networks*, section 2 (this binned form); the
        metric of DSpark paper section 3.2 and Fig. 6.
    """
    n_bins = _check_n_bins(n_bins)
    p, y = _paired_inputs(probs, outcomes)
    return float(_ece_rows(p[None, :], y, n_bins)[0])


def reliability_curve(
    probs: ArrayLike, outcomes: ArrayLike, *, n_bins: int = 15
) -> ReliabilityCurve:
    """Per-bin mean probability and positive fraction, for reliability diagrams.

    Uses the same bins as :func:`expected_calibration_error`.

    Args:
        probs: ``(N,)`` predicted probabilities in [0, 1].
        outcomes: ``(N,)`` observed outcomes, bool or 0/1.
        n_bins: number of equal-width bins on [0, 1], >= 1.

    Returns:
        A :class:`ReliabilityCurve` of ``(n_bins,)`` arrays; empty bins have NaN means
        and a count of 0.

    Raises:
        InvalidArgumentError: as :func:`expected_calibration_error`.

    Source:
        DeGroot and Fienberg (1983) reliability diagram; DSpark paper Fig. 6.
    """
    n_bins = _check_n_bins(n_bins)
    p, y = _paired_inputs(probs, outcomes)
    idx = _bin_index(p, n_bins)
    counts = np.bincount(idx, minlength=n_bins).astype(np.int64)
    sum_prob = np.bincount(idx, weights=p, minlength=n_bins)
    sum_pos = np.bincount(idx, weights=y.astype(np.float64), minlength=n_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_prob = np.where(counts > 0, sum_prob / counts, np.nan)
        frac_pos = np.where(counts > 0, sum_pos / counts, np.nan)
    edges = np.arange(n_bins + 1) / n_bins
    centers = 0.5 * (edges[:-1] + edges[1:])
    return ReliabilityCurve(centers, mean_prob, frac_pos, counts)


def auc_score(scores: ArrayLike, labels: ArrayLike) -> float:
    """Area under the ROC curve via the Mann-Whitney rank statistic.

    ``AUC = (R_pos - n_pos (n_pos + 1) / 2) / (n_pos n_neg)`` where ``R_pos`` is the sum
    of the (average-tie) ranks of the positive scores. Equals the probability that a
    random positive scores above a random negative, ties counting one half.

    Args:
        scores: ``(N,)`` finite real scores (any scale; higher means "more positive").
        labels: ``(N,)`` bool or 0/1 labels.

    Returns:
        AUC in [0, 1].

    Raises:
        InvalidArgumentError: ``scores`` empty, not 1-D or non-finite; ``labels`` of another shape,
            not bool/0/1, or containing only one class.

    Source:
        Mann and Whitney (1947) U statistic; Hanley and McNeil (1982), *The meaning and use of
        the area under a ROC curve* (AUC equals U / (n_pos n_neg)). Reported per position in
        DSpark paper Fig. 6.
    """
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim != 1:
        raise InvalidArgumentError(f"scores: must be 1-D, got shape {s.shape}")
    if s.size == 0:
        raise InvalidArgumentError("scores: must not be empty")
    if not np.all(np.isfinite(s)):
        raise InvalidArgumentError("scores: values must be finite, found NaN or inf")
    y = _binary_array(labels, "labels", s.shape, "scores")
    n_pos = int(y.sum())
    n_neg = y.size - n_pos
    if n_pos == 0 or n_neg == 0:
        raise InvalidArgumentError(
            f"labels: both classes are needed for AUC, got {n_pos} positive and {n_neg} negative"
        )
    return _auc_checked(s, y, n_pos)


def _auc_checked(s: NDArray, y: NDArray, n_pos: int) -> float:
    """:func:`auc_score` of checked scores and labels with ``0 < n_pos < len(y)`` positives."""
    return _auc_of_rank_sum(_positive_rank_sum(s, y), n_pos, y.size)


def _auc_of_rank_sum(rank_sum: float, n_pos: int, n: int) -> float:
    """The AUC from the positives' rank sum: the Mann-Whitney U over ``n_pos * (n - n_pos)``."""
    u_stat = rank_sum - n_pos * (n_pos + 1) / 2.0
    return float(u_stat / (n_pos * (n - n_pos)))


def _positive_rank_sum(s: NDArray, y: NDArray) -> float:
    """Sum of the 1-based ranks of the ``y`` entries of ``s``, ties sharing their average rank
    (``scipy.stats.rankdata``'s ``average`` method; scipy.stats costs a cold process 0.3 s to import).

    Summed in sorted order: ranks are half-integers, so every order of summation gives the same
    float, and an unstable sort (6x faster than mergesort) gives tied entries the same rank anyway."""
    order = np.argsort(s)
    srt = s[order]
    kernels = _compiled.active()
    if kernels is not None:  # the ties and ranks in one pass (numpy's five passes cost ~60% of the AUC)
        return kernels.positive_rank_sum(srt, np.ascontiguousarray(y[order], dtype=np.bool_))
    first = np.r_[True, srt[1:] != srt[:-1]]
    dense = first.cumsum()
    count = np.r_[np.nonzero(first)[0], len(first)]
    ranks = 0.5 * (count[dense] + count[dense - 1] + 1)  # in sorted order
    return ranks[y[order]].sum()


def brier_score(probs: ArrayLike, outcomes: ArrayLike) -> float:
    """Mean squared error of probabilities against binary outcomes.

    Args:
        probs: ``(N,)`` predicted probabilities in [0, 1].
        outcomes: ``(N,)`` bool or 0/1 outcomes.

    Returns:
        ``mean((probs - outcomes)^2)`` in [0, 1].

    Raises:
        InvalidArgumentError: as :func:`expected_calibration_error`.

    Source:
        Brier (1950), *Verification of forecasts expressed in terms of probability*.
    """
    p, y = _paired_inputs(probs, outcomes)
    return float(np.mean((p - y) ** 2))


# ----------------------------------------------------------------------------------
# temperature scaling
# ----------------------------------------------------------------------------------


def _positive_temperatures(temperatures: ArrayLike, name: str) -> NDArray[np.float64]:
    t = np.asarray(temperatures, dtype=np.float64)
    if t.size == 0:
        raise InvalidArgumentError(f"{name}: must not be empty")
    if not np.all(np.isfinite(t)):
        raise InvalidArgumentError(f"{name}: values must be finite, found NaN or inf")
    if np.any(t <= 0):
        raise InvalidArgumentError(f"{name}: values must be > 0, got min {float(t.min()):g}")
    return t


def _scaled(conf: NDArray, temps: NDArray) -> NDArray:
    """``sigmoid(logit(clip(c)) / T)`` without validation (broadcasting)."""
    c = np.clip(conf, CONFIDENCE_CLIP, 1.0 - CONFIDENCE_CLIP)
    return expit(logit(c) / temps)


def apply_temperature(confidences: ArrayLike, temperatures: ArrayLike) -> NDArray[np.float64]:
    """Temperature-scale confidences: ``c -> sigmoid(logit(c) / T_k)``.

    Confidences are clipped to ``[1e-6, 1 - 1e-6]`` first so the logit is finite. The
    map is strictly increasing in ``c`` for any ``T > 0`` (it never reorders scores;
    values in the clipped tails, or so close that float64 cannot separate them after
    scaling, may become equal). ``T > 1`` softens over-confident scores toward 0.5.

    Args:
        confidences: ``(..., gamma)`` conditional confidences in [0, 1].
        temperatures: scalar, or ``(gamma,)`` with one temperature per position
            (broadcast along the last axis); all > 0.

    Returns:
        Array of the broadcast shape (the shape of ``confidences`` for the documented
        inputs) with scaled confidences in (0, 1).

    Raises:
        InvalidArgumentError: ``confidences`` empty, non-finite or outside [0, 1];
            ``temperatures`` non-positive, non-finite, or not broadcastable along the
            last axis of ``confidences``.

    Source:
        Guo et al. (2017) temperature scaling; per-position form of DSpark paper §3.2.
    """
    c = _unit_interval_array(confidences, "confidences")
    t = _positive_temperatures(temperatures, "temperatures")
    if t.ndim > 1 or (t.ndim == 1 and c.ndim >= 1 and t.shape[0] not in (1, c.shape[-1])):
        raise InvalidArgumentError(
            f"temperatures: shape {t.shape} does not broadcast along the last axis of "
            f"confidences with shape {c.shape}"
        )
    return _scaled(c, t)


def _sequence_inputs(
    confidences: ArrayLike, accepted: ArrayLike
) -> tuple[NDArray[np.float64], NDArray[np.bool_]]:
    """Validate ``(n_rounds, gamma)`` confidences and prefix-shaped ``accepted``."""
    c = _unit_interval_array(confidences, "confidences", ndim=2)
    acc = _binary_array(accepted, "accepted", c.shape, "confidences")
    # a row must be True...True False...False: no True may follow a False
    broken = acc[:, 1:] & ~acc[:, :-1]
    if np.any(broken):
        row, col = np.argwhere(broken)[0]
        raise InvalidArgumentError(
            f"accepted: row {row} has True at position {col + 2} after False at position "
            f"{col + 1}; acceptance must be a prefix (once False, stays False)"
        )
    return c, acc


def sequential_temperature_scaling(
    confidences: ArrayLike,
    accepted: ArrayLike,
    *,
    grid: ArrayLike | None = None,
    n_bins: int = 15,
) -> NDArray[np.float64]:
    """Fit one temperature per draft position by Sequential Temperature Scaling (STS).

    For ``k = 1..gamma`` in order, with ``T_1..T_{k-1}`` fixed, pick ``T_k`` from
    ``grid`` minimising ``ECE(a_k, accepted[:, k-1])`` where
    ``a_k = prod_{i<=k} sigmoid(logit(c_i) / T_i)``. All rounds are used at every
    position: a round rejected before ``k`` is a negative example for ``a_k``. Ties in
    ECE are broken toward the temperature closest to 1 (in log scale), so an
    uninformative position keeps its raw scores as far as the grid allows.

    Args:
        confidences: ``(n_rounds, gamma)`` raw conditional confidences ``c_k`` in [0, 1].
        accepted: ``(n_rounds, gamma)`` bool or 0/1; ``accepted[r, k-1]`` is True when
            positions ``1..k`` of round ``r`` were all accepted (once False, stays False).
        grid: 1-D candidate temperatures, all > 0; default
            :data:`DEFAULT_TEMPERATURE_GRID` (121 log-spaced values in [0.25, 8]).
        n_bins: ECE bins, >= 1.

    Returns:
        ``(gamma,)`` fitted temperatures (dimensionless), each an element of ``grid``.

    Raises:
        InvalidArgumentError: ``confidences`` empty, not 2-D, non-finite or outside [0, 1];
            ``accepted`` of another shape, not bool/0/1, or not a prefix; ``grid``
            empty, not 1-D, non-finite or with a value <= 0; ``n_bins`` < 1.

    Source:
        DSpark paper (Cheng et al., 2026) §3.2, Sequential Temperature Scaling.
    """
    n_bins = _check_n_bins(n_bins)
    c, acc = _sequence_inputs(confidences, accepted)
    if grid is None:
        g = np.asarray(DEFAULT_TEMPERATURE_GRID, dtype=np.float64)
    else:
        g = _positive_temperatures(grid, "grid")
        if g.ndim != 1:
            raise InvalidArgumentError(f"grid: must be 1-D, got shape {g.shape}")
    n_rounds, gamma = c.shape
    # tie-break order: candidates sorted by |log T| so argmin's first hit is nearest 1
    order = np.argsort(np.abs(np.log(g)), kind="stable")
    g_sorted = g[order]
    logits = logit(np.clip(c, CONFIDENCE_CLIP, 1.0 - CONFIDENCE_CLIP))
    temps = np.empty(gamma, dtype=np.float64)
    cum = np.ones(n_rounds, dtype=np.float64)
    # grid rows per block: keeps the (rows, n_rounds) work arrays a few MiB (cache-sized)
    block = max(1, 2**18 // n_rounds)
    ece = np.empty(g_sorted.size, dtype=np.float64)
    for k in range(gamma):
        outcome = acc[:, k]
        for start in range(0, g_sorted.size, block):
            t = g_sorted[start : start + block, None]
            cand = cum[None, :] * expit(logits[None, :, k] / t)  # (rows, n_rounds)
            ece[start : start + block] = _ece_rows(cand, outcome, n_bins)
        best = int(np.argmin(ece))
        temps[k] = g_sorted[best]
        cum = cum * expit(logits[:, k] / temps[k])
    return temps


def per_position_metrics(
    confidences: ArrayLike, accepted: ArrayLike, *, n_bins: int = 15, auc: bool = True
) -> PositionMetrics:
    """ECE, AUC and Brier score of the cumulative confidence at every position.

    Scores are ``a_k = prod_{i<=k} c_i`` (no clipping or scaling; pass
    ``apply_temperature(confidences, temps)`` for calibrated metrics) and outcomes
    ``accepted[:, k-1]``.

    Args:
        confidences: ``(n_rounds, gamma)`` conditional confidences in [0, 1].
        accepted: ``(n_rounds, gamma)`` bool or 0/1 prefix-shaped acceptance.
        n_bins: ECE bins, >= 1.
        auc: compute the AUC (a sort of every position's scores); False leaves it NaN.

    Returns:
        :class:`PositionMetrics` of ``(gamma,)`` arrays; ``auc`` is NaN at positions
        where every round has the same outcome (and everywhere with ``auc=False``).

    Raises:
        InvalidArgumentError: as :func:`sequential_temperature_scaling` for the shared arguments.

    Source:
        DSpark paper §3.2 and Fig. 6 (per-position ECE and AUC of joint survival).
    """
    n_bins = _check_n_bins(n_bins)
    c, acc = _sequence_inputs(confidences, accepted)
    return survival_metrics(np.cumprod(c, axis=1), acc, n_bins=n_bins, auc=auc)


def survival_metrics(survival: NDArray, accepted: NDArray, *, n_bins: int = 15, auc: bool = True) -> PositionMetrics:
    """:func:`per_position_metrics` of joint survivals already multiplied out and checked (the
    engine's own diagnostics): ``survival[:, k]`` is ``a_{k+1}``, ``accepted`` ``(n_rounds,
    gamma)`` bool. Positions are scored as rows of the transposed arrays (contiguous: a column of
    a ``(n_rounds, gamma)`` array is strided), with the same values bit for bit.

    Args:
        survival: ``(n_rounds, gamma)`` float64 joint survivals in [0, 1] (not checked).
        accepted: ``(n_rounds, gamma)`` bool prefix-shaped acceptance.
        n_bins: ECE bins, >= 1.
        auc: compute the AUC; False leaves it NaN.

    Returns:
        :class:`PositionMetrics`, as :func:`per_position_metrics`.

    Source:
        DSpark paper §3.2 and Fig. 6 (per-position ECE and AUC of joint survival).
    """
    gamma = survival.shape[1]
    a_rows, acc_rows = np.ascontiguousarray(survival.T), np.ascontiguousarray(accepted.T)
    ece = _ece_rows(a_rows, acc_rows, n_bins)
    brier = np.mean((survival - accepted) ** 2, axis=0)
    return PositionMetrics(ece=ece, auc=_auc_rows(a_rows, acc_rows) if auc else np.full(gamma, np.nan), brier=brier)


def survival_calibration(confidences: NDArray, accepted: NDArray, *, n_bins: int = 15, curve_bins: int = 10,
                         auc: bool = True) -> tuple[PositionMetrics, list[ReliabilityCurve]]:
    """:func:`survival_metrics` and :func:`reliability_rows` (``curve_bins`` bins) of the joint
    survivals of ``confidences`` (``np.cumprod(confidences, axis=1)``) at every position: with the
    compiled kernels in one pass over the rounds (``_kernels.survival_bins``, up to its
    ``MAX_BINS`` bins; numpy beyond), the same values bit for bit (the engine's diagnostics at the
    end of a run: 20,000 request-rounds at most).

    Args:
        confidences: ``(n_rounds, gamma)`` float64 C-contiguous conditional confidences in [0, 1]
            (not checked beyond the range).
        accepted: ``(n_rounds, gamma)`` bool C-contiguous prefix-shaped acceptance.
        n_bins: ECE bins, >= 1; curve_bins: reliability-curve bins, >= 1.
        auc: compute the AUC; False leaves it NaN.

    Returns:
        ``(metrics, curves)``: :class:`PositionMetrics` of ``(gamma,)`` arrays and one
        :class:`ReliabilityCurve` per position.

    Raises:
        InvalidArgumentError: ``n_bins`` or ``curve_bins`` < 1.
        ValueError: with the compiled kernels, a confidence outside [0, 1] (NaN included).

    Source:
        DSpark paper section 3.2 and Fig. 6 (per-position ECE, AUC and reliability of joint survival).
    """
    n_bins, curve_bins = _check_n_bins(n_bins), _check_n_bins(curve_bins)
    kernels = _compiled.active()
    if (kernels is None or confidences.dtype != np.float64 or accepted.dtype != np.bool_
            or max(n_bins, curve_bins) > kernels.MAX_BINS):  # (the kernel keeps its bins in the stack)
        survival = np.cumprod(confidences, axis=1)
        return (survival_metrics(survival, accepted, n_bins=n_bins, auc=auc),
                reliability_rows(np.ascontiguousarray(survival.T), np.ascontiguousarray(accepted.T), n_bins=curve_bins))
    n, gamma = confidences.shape
    keys = np.empty((gamma, n), dtype=np.uint64) if auc else None  # the AUC's sort keys
    sq_err_sums = np.empty(gamma)
    ece_sums = (np.empty((gamma, n_bins), dtype=np.int64), np.empty((gamma, n_bins)), np.empty((gamma, n_bins)))
    curve_sums = (np.empty((gamma, curve_bins), dtype=np.int64), np.empty((gamma, curve_bins)), np.empty((gamma, curve_bins)))
    confidences, accepted = np.ascontiguousarray(confidences), np.ascontiguousarray(accepted)
    kernels.survival_bins(confidences, accepted, keys, sq_err_sums, n_bins, *ece_sums, curve_bins, *curve_sums)
    ece = np.abs(ece_sums[2] - ece_sums[1]).sum(axis=1) / n  # as _ece_rows reduces the same sums
    # numpy sums one column pairwise, several in row order (the kernel's order): one column stays numpy's
    brier = sq_err_sums / n if gamma > 1 else np.mean((confidences - accepted) ** 2, axis=0)
    auc_k = np.full(gamma, np.nan)
    if auc:
        keys.sort(axis=1)
        rank_sums, num_pos = np.empty(gamma), np.empty(gamma, dtype=np.int64)
        kernels.positive_rank_sums(keys, rank_sums, num_pos)
        for k in range(gamma):
            if 0 < num_pos[k] < n:
                auc_k[k] = _auc_of_rank_sum(float(rank_sums[k]), int(num_pos[k]), n)
    return PositionMetrics(ece=ece, auc=auc_k, brier=brier), _curves(*curve_sums)


def _auc_rows(a_rows: NDArray, acc_rows: NDArray) -> NDArray[np.float64]:
    """AUC of every row of scores ``a_rows`` ``(m, n)`` against ``acc_rows``; NaN where a row's
    outcomes are all one value."""
    auc_k = np.full(a_rows.shape[0], np.nan)
    n_pos = acc_rows.sum(axis=1)
    for k in range(a_rows.shape[0]):
        if 0 < n_pos[k] < acc_rows.shape[1]:
            auc_k[k] = _auc_checked(a_rows[k], acc_rows[k], int(n_pos[k]))
    return auc_k


@dataclass(frozen=True)
class ConfidenceHead:
    """The drafter's confidence head: a noisy, over-confident view of the true acceptance.

    ``c_raw = sigmoid(overconfidence * (logit(p) + e))`` with ``e ~ N(0, noise_sd^2)`` per
    position: ``noise_sd`` lowers discrimination (AUC), ``overconfidence > 1`` pushes scores away
    from 0.5 (the raw heads' over-confidence the DSpark paper reports, Fig. 6). The serving engine
    then calibrates: ``c = sigmoid(logit(c_raw) / (T_k * temperature))`` with per-position STS
    temperatures ``T_k`` and a global ``temperature`` knob. ``oracle=True`` reports the true ``p``
    (a perfectly calibrated, maximally discriminative head).

    Attributes:
        noise_sd: standard deviation of the logit noise ``e`` (logit units), >= 0.
        overconfidence: logit gain (dimensionless), > 0; 1.0 adds no over-confidence.
        oracle: report the true acceptance probability instead (``noise_sd`` and
            ``overconfidence`` ignored).

    Raises:
        InvalidArgumentError: on construction, ``noise_sd < 0`` or ``overconfidence <= 0``.

    Source:
        DSpark paper (Cheng et al. 2026) section 3.2 (c_k, STS) and Fig. 6 (raw ECE 3-8%,
        AUC 0.81-0.91).
    """

    noise_sd: float = 0.4
    overconfidence: float = 1.35
    oracle: bool = False

    def __post_init__(self) -> None:
        if self.noise_sd < 0:
            raise InvalidArgumentError(f"noise_sd: must be >= 0, got {self.noise_sd}")
        if self.overconfidence <= 0:
            raise InvalidArgumentError(f"overconfidence: must be > 0, got {self.overconfidence}")

    def raw_logits(self, rng: np.random.Generator, true_logits: np.ndarray) -> np.ndarray:
        """Raw head logits ``overconfidence * (true_logits + e)``, ``e ~ N(0, noise_sd^2)``.

        Args:
            rng: the confidence stream's generator (one normal draw per entry; none when
                ``oracle`` or ``noise_sd == 0``).
            true_logits: ``(R, gamma)`` float64 logits of the true conditional acceptance.

        Returns:
            ``(R, gamma)`` float64 raw logits (``true_logits`` itself when ``oracle``).

        Source:
            The over-confident raw head of DSpark paper Fig. 6 (model of this package, see the
            class docstring).
        """
        if self.oracle:
            return true_logits
        noisy = true_logits + rng.normal(0.0, self.noise_sd, size=true_logits.shape) if self.noise_sd else true_logits
        return self.overconfidence * noisy


def calibration_stream(acceptance: AcceptanceModel, head: ConfidenceHead, rng: np.random.Generator,
                       num_rounds: int, gamma: int, domain_probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Held-out (confidence, outcome) pairs for fitting STS, independent of any evaluated run.

    Draws ``num_rounds`` fresh requests (domain from ``domain_probs``) with one round each, the
    head's raw confidences and the acceptance outcome of every position (True while all positions
    up to k are accepted).

    Args:
        acceptance: the true per-domain, per-position acceptance.
        head: the confidence head whose raw scores STS will calibrate.
        rng: a generator reserved for calibration (not the run's streams).
        num_rounds: held-out rounds to draw, >= 1.
        gamma: draft positions per round, >= 1.
        domain_probs: ``(len(acceptance.domains),)`` float64 domain mix summing to 1.

    Returns:
        (raw confidences ``(num_rounds, gamma)`` float64 in (0, 1), accepted prefix flags
        ``(num_rounds, gamma)`` bool), the inputs of :func:`sequential_temperature_scaling`.

    Source:
        DSpark paper (Cheng et al. 2026) section 3.2: STS is fitted on held-out data.
    """
    dom = rng.choice(len(acceptance.domains), size=num_rounds, p=domain_probs)
    diff = acceptance.sample_difficulty(rng, num_rounds)
    logits = acceptance.round_logits(rng, dom, diff, gamma)
    accepted = np.cumprod(rng.random(logits.shape) < expit(logits), axis=1).astype(bool)
    conf = expit(head.raw_logits(rng, logits))
    return conf, accepted

"""Measuring a drafter in the lab: exact verification, acceptance by block position, confidence.

A round: a context drawn from the source's stationary process, a block of ``gamma`` drafted
tokens, and verification of the whole block by the exact rule of :mod:`memtp_sim.exactness`
(Leviathan et al. 2023, Algorithm 1): position k's draft x is accepted with probability
``min(1, p(x) / q(x))`` (both laws after the drafted prefix), the first rejection is replaced by a
draw from ``norm(max(0, p - q))`` and ends the round, and a fully accepted block earns a bonus
token from the target. So acceptance is measured, not assumed.

Per position k: *tested* = rounds whose positions 1..k-1 were accepted, *accepted* = rounds whose
positions 1..k were; ``c_k = accepted / tested`` is the population conditional acceptance
P(k accepted | 1..k-1 accepted), the DSpark paper's Fig. 2 quantity, with binomial standard error
``sqrt(c (1 - c) / tested)``. ``tau(g)`` is the mean of ``1 + min(accepted prefix, g)`` (static
verification of g positions, bonus included).

Along the drafted path the lab also records, per round and position, the true acceptance
probability ``alpha = sum_x min(q(x), p(x))`` (``1 - TV(q, p)``: :func:`memtp_sim.exactness.analytical_acceptance`)
and the drafter's own confidence, ``q(x)`` of the token it drafted; from them
:func:`fit_engine_parameters` derives the engine-side noise and confidence head.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import brentq
from scipy.special import expit, logit

from ..acceptance import fit_per_position_logits
from ..confidence import auc_score
from ..errors import InvalidArgumentError
from ..exactness import residual_rows  # the exact rule's own residual norm(max(0, p - q)), shared
from .source import MarkovSource, sample_categorical

__all__ = [
    "BlockVerdict",
    "DraftFn",
    "EngineFit",
    "LabMeasurement",
    "acceptance_by_position",
    "fit_engine_parameters",
    "fit_round_sigma",
    "measure_drafter",
    "target_along",
    "verify_block",
]

#: A drafter for measurement: ``(rng, context (n, L)) -> (tokens (n, gamma), probs (n, gamma, V))``.
DraftFn = Callable[[np.random.Generator, NDArray[np.int64]], tuple[NDArray[np.int64], NDArray[np.float64]]]

#: Probabilities are clipped to [CLIP, 1 - CLIP] before a logit.
CLIP = 1e-4


@dataclass(frozen=True)
class BlockVerdict:
    """Outcome of verifying ``n`` blocks.

    Attributes:
        n_accepted: (n,) int64 leading accepted drafts (0..gamma).
        tokens: (n, gamma + 1) int64 emitted tokens, left-aligned (accepted drafts, then the
            resampled or bonus token); -1 past ``n_accepted + 1``.
    """

    n_accepted: NDArray[np.int64]
    tokens: NDArray[np.int64]


def verify_block(rng: np.random.Generator, drafts: NDArray[np.int64], draft_probs: NDArray[np.float64],
                 target_probs: NDArray[np.float64], *, residual: bool = True) -> BlockVerdict:
    """Verify whole blocks with the exact rule (module docstring), vectorised over rounds.

    Same steps as :func:`memtp_sim.exactness.simulate_rounds` with the laws along the drafted path
    given as tables (so every round may have its own context).

    Args:
        rng: numpy Generator.
        drafts: (n, gamma) int64 drafted tokens.
        draft_probs: (n, gamma, V) the law each draft was drawn from.
        target_probs: (n, gamma + 1, V) the target's law at positions 1..gamma + 1 after the
            drafted prefix (the last one for the bonus token).
        residual: False resamples a rejection from the target instead of the residual (a broken
            verifier, for tests that must catch it).

    Returns:
        A :class:`BlockVerdict`.

    Raises:
        InvalidArgumentError: shapes that do not match.
    """
    n, g = drafts.shape
    v = draft_probs.shape[-1]
    if draft_probs.shape != (n, g, v) or target_probs.shape != (n, g + 1, v):
        raise InvalidArgumentError(f"draft_probs, target_probs: need ({n}, {g}, V) and ({n}, {g + 1}, V), got "
                                   f"{draft_probs.shape} and {target_probs.shape}")
    tokens = np.full((n, g + 1), -1, dtype=np.int64)
    n_acc = np.zeros(n, dtype=np.int64)
    alive = np.ones(n, dtype=bool)
    for k in range(g):
        idx = np.flatnonzero(alive)
        if idx.size == 0:
            break
        x = drafts[idx, k]
        pd, pt = draft_probs[idx, k], target_probs[idx, k]
        rows = np.arange(idx.size)
        acc = rng.random(idx.size) * pd[rows, x] < pt[rows, x]  # accept w.p. min(1, p/q)
        ok, bad = idx[acc], idx[~acc]
        tokens[ok, k] = x[acc]
        n_acc[ok] += 1
        if bad.size:
            fix = residual_rows(pd[~acc], pt[~acc]) if residual else pt[~acc]
            tokens[bad, k] = sample_categorical(rng, fix)
            alive[bad] = False
    done = np.flatnonzero(alive)
    if done.size:
        tokens[done, g] = sample_categorical(rng, target_probs[done, g])
    return BlockVerdict(n_acc, tokens)


def target_along(source: MarkovSource, context: NDArray[np.int64], drafts: NDArray[np.int64]) -> NDArray[np.float64]:
    """Target laws at positions 1..gamma + 1 after the drafted prefix; (n, gamma + 1, V)."""
    seq = np.concatenate([np.asarray(context, dtype=np.int64), drafts], axis=1)
    width = context.shape[1]
    return np.stack([source.next_dist(seq[:, : width + k]) for k in range(drafts.shape[1] + 1)], axis=1)


def acceptance_by_position(n_accepted: NDArray[np.int64], gamma: int) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """(accepted (gamma,), tested (gamma,)) counts from the leading accepted drafts per round,
    every round verifying all ``gamma`` positions."""
    a = np.asarray(n_accepted)
    k = np.arange(1, gamma + 1)
    accepted = (a[:, None] >= k[None, :]).sum(axis=0)
    tested = (a[:, None] >= k[None, :] - 1).sum(axis=0)
    return accepted.astype(np.int64), tested.astype(np.int64)


@dataclass(frozen=True)
class LabMeasurement:
    """One drafter's acceptance by position (module docstring).

    Attributes:
        name: drafter label.
        accepted, tested: (gamma,) int64 counts per position.
        n_accepted: (n,) leading accepted drafts per round.
        alpha: (n, gamma) true acceptance probability of each position along the drafted path.
        confidence: (n, gamma) the drafter's probability of the token it drafted.
        beta: (n, gamma) the acceptance probability of the drafted token itself,
            ``min(1, p(x) / q(x))`` (its mean over x is ``alpha``).
    """

    name: str
    accepted: NDArray[np.int64]
    tested: NDArray[np.int64]
    n_accepted: NDArray[np.int64]
    alpha: NDArray[np.float64]
    confidence: NDArray[np.float64]
    beta: NDArray[np.float64]

    @property
    def gamma(self) -> int:
        """Block positions measured."""
        return int(self.tested.size)

    @property
    def conditional(self) -> NDArray[np.float64]:
        """c_k = accepted / tested (NaN where nothing was tested)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.tested > 0, self.accepted / np.maximum(self.tested, 1), np.nan)

    @property
    def stderr(self) -> NDArray[np.float64]:
        """Binomial standard error of c_k."""
        c = self.conditional
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.sqrt(c * (1 - c) / self.tested)

    def tau(self, gamma: int) -> float:
        """Mean tokens per round (bonus included) under static verification of ``gamma`` positions.

        Raises:
            InvalidArgumentError: ``gamma`` outside 0..the measured positions.
        """
        if not 0 <= gamma <= self.gamma:
            raise InvalidArgumentError(f"gamma: must lie in 0..{self.gamma}, got {gamma}")
        return float(np.mean(1 + np.minimum(self.n_accepted, gamma)))


def measure_drafter(rng: np.random.Generator, source: MarkovSource, draft: DraftFn, contexts: NDArray[np.int64],
                    name: str, *, chunk: int = 10_000) -> LabMeasurement:
    """Draft and verify one block per context; see the module docstring.

    Args:
        rng: numpy Generator (drafting and verification draws).
        source: the target.
        draft: the drafter (:data:`DraftFn`).
        contexts: (n, L) int64 stationary contexts, one round each.
        name: label.
        chunk: rounds processed at once (memory: about chunk * gamma * V * 24 bytes).

    Returns:
        A :class:`LabMeasurement`.
    """
    parts = []
    for start in range(0, contexts.shape[0], chunk):
        ctx = contexts[start: start + chunk]
        drafts, q = draft(rng, ctx)
        p = target_along(source, ctx, drafts)
        verdict = verify_block(rng, drafts, q, p)
        alpha = np.minimum(q, p[:, :-1]).sum(axis=2)
        conf = np.take_along_axis(q, drafts[:, :, None], axis=2)[:, :, 0]
        p_tok = np.take_along_axis(p[:, :-1], drafts[:, :, None], axis=2)[:, :, 0]
        parts.append((verdict.n_accepted, alpha, conf, np.minimum(1.0, p_tok / conf)))
    n_acc, alpha, conf, beta = (np.concatenate([x[i] for x in parts]) for i in range(4))
    accepted, tested = acceptance_by_position(n_acc, alpha.shape[1])
    return LabMeasurement(name, accepted, tested, n_acc, alpha, conf, beta)


def fit_round_sigma(alpha: NDArray[np.float64]) -> float:
    """Shared per-round logit spread of a drafter: the mean off-diagonal covariance across rounds of
    ``logit(alpha)`` (clipped to [1e-4, 1 - 1e-4]) between positions, floored at 0, square-rooted.

    A diagnostic: how much of a round's acceptance is shared by its positions (the acceptance
    model's ``z`` is fully shared), reported beside the fitted ``sigma_round``.

    Raises:
        InvalidArgumentError: fewer than 2 positions or 2 rounds.
    """
    a = np.asarray(alpha, dtype=np.float64)
    if a.ndim != 2 or a.shape[0] < 2 or a.shape[1] < 2:
        raise InvalidArgumentError(f"alpha: need (rounds >= 2, positions >= 2), got {a.shape}")
    cov = np.cov(logit(np.clip(a, CLIP, 1 - CLIP)), rowvar=False)
    g = cov.shape[0]
    off = (cov.sum() - np.trace(cov)) / (g * (g - 1))
    return float(np.sqrt(max(off, 0.0)))


@dataclass(frozen=True)
class EngineFit:
    """Acceptance-model noise and confidence head that mimic a lab drafter (:func:`fit_engine_parameters`).

    Attributes:
        sigma_round: per-round logit sd of the acceptance model (``sigma_request`` is 0).
        noise_sd, overconfidence: ``ConfidenceHead`` parameters.
        lab: the lab statistics matched (``oracle_auc``: AUC of alpha; ``confidence_auc``;
            ``mean_confidence``) and diagnostics (``acceptance_rate`` of tested positions,
            ``shared_sigma``: :func:`fit_round_sigma`).
        model: the same statistics of the fitted engine model (simulated).
    """

    sigma_round: float
    noise_sd: float
    overconfidence: float
    lab: dict[str, float]
    model: dict[str, float]


def _tested_pairs(n_accepted: NDArray[np.int64], positions: int) -> tuple[NDArray[np.bool_], NDArray[np.bool_]]:
    k = np.arange(positions)[None, :]
    a = np.asarray(n_accepted)[:, None]
    return a >= k, a >= k + 1  # tested at position k + 1, accepted there


def _lab_statistics(m: LabMeasurement, positions: int) -> dict[str, float]:
    tested, ok = _tested_pairs(m.n_accepted, positions)
    y = ok[tested]
    conf = m.confidence[:, :positions][tested]
    return {"oracle_auc": auc_score(m.alpha[:, :positions][tested], y), "confidence_auc": auc_score(conf, y),
            "mean_confidence": float(conf.mean()), "acceptance_rate": float(y.mean()),
            "shared_sigma": fit_round_sigma(m.alpha[:, :positions])}


class _EngineModel:
    """The engine's acceptance model and head, simulated with common random numbers."""

    def __init__(self, conditional: NDArray[np.float64], rounds: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.c = conditional
        self.z = rng.standard_normal(rounds)[:, None]
        self.u = rng.random((rounds, conditional.size))
        self.e = rng.standard_normal((rounds, conditional.size))
        self._cache: dict[float, tuple[NDArray[np.float64], NDArray[np.bool_], NDArray[np.bool_]]] = {}

    def logits(self, sigma: float) -> tuple[NDArray[np.float64], NDArray[np.bool_], NDArray[np.bool_]]:
        """(true logits, tested, accepted), each (rounds, K), for round noise ``sigma``."""
        if sigma not in self._cache:
            lg = fit_per_position_logits(self.c, sigma)[None, :] + sigma * self.z
            ok = self.u < expit(lg)
            first = np.ones((lg.shape[0], 1), bool)
            tested = np.concatenate([first, np.cumprod(ok, axis=1)[:, :-1].astype(bool)], axis=1)
            self._cache[sigma] = (lg, tested, ok)
        return self._cache[sigma]

    def oracle_auc(self, sigma: float) -> float:
        lg, tested, ok = self.logits(sigma)
        return auc_score(expit(lg[tested]), ok[tested])

    def head_auc(self, sigma: float, noise_sd: float) -> float:
        lg, tested, ok = self.logits(sigma)
        return auc_score(expit(lg + noise_sd * self.e)[tested], ok[tested])  # AUC ignores the scale

    def head_means(self, sigma: float, noise_sd: float, overconfidence: NDArray[np.float64]) -> NDArray[np.float64]:
        lg, tested, _ = self.logits(sigma)
        w = (lg + noise_sd * self.e)[tested]
        return np.array([float(expit(o * w).mean()) for o in overconfidence])


def _solve_increasing(f, lo: float, hi: float) -> float:
    """Root of an increasing ``f`` on [lo, hi], clamped to an end when there is none."""
    flo, fhi = f(lo), f(hi)
    if flo >= 0:
        return lo
    if fhi <= 0:
        return hi
    return float(brentq(f, lo, hi, xtol=1e-3))


def fit_engine_parameters(m: LabMeasurement, positions: int, *, rounds: int = 10_000,
                          seed: int = 0) -> EngineFit:
    """Engine-side parameters that mimic a lab drafter over positions 1..``positions``.

    The engine draws ``p = sigmoid(base_k + z)`` per round (``z ~ N(0, sigma_round^2)`` shared by the
    round's positions, ``base`` fitted so the population conditional acceptance is the lab's c_k) and
    its head reports ``sigmoid(overconfidence * (logit p + e))``, ``e ~ N(0, noise_sd^2)``. Three
    statistics, each pooled over the tested (round, position) pairs (positions 1..``positions``,
    outcome: accepted), are matched in turn, each by a 1-D root (Brent) or grid search on the
    simulated model (``rounds`` rounds, common random numbers, ``seed``):

    1. ``sigma_round``: the model's AUC of its true acceptance probability p equals the lab's AUC
       of ``alpha = 1 - TV(q, p)``, the true acceptance probability of the position given the
       prefix (the quantity the engine's p stands for, and DSpark's confidence target c*),
       searched in [0, 4];
    2. ``noise_sd``: the model head's AUC equals the lab's AUC of the drafter's own probability of
       its token, searched in [0, 20] (0 when the lab's confidence discriminates better than
       alpha itself: it also sees the drafted token, which the engine's head cannot);
    3. ``overconfidence``: the model head's mean confidence equals the lab's mean confidence
       (log-spaced grid over [0.02, 10], closest value).

    A statistic out of reach clamps its parameter to the end of the range (``model`` shows what
    was reached). Limitations: the lab's variation is mostly per position (``shared_sigma`` is the
    part shared by a round's positions) while the engine's z is shared by the whole round, so the
    engine overstates within-round correlation at the matched per-position discrimination; and a
    drafter's own token probability over a spread target is under-confident (``overconfidence``
    well below 1), which STS can only partly undo within its temperature grid.

    Raises:
        InvalidArgumentError: ``positions`` outside 1..gamma, or a position never tested.
    """
    if not 1 <= positions <= m.gamma:
        raise InvalidArgumentError(f"positions: must lie in 1..{m.gamma}, got {positions}")
    c = m.conditional[:positions]
    if not np.all(np.isfinite(c)):
        raise InvalidArgumentError(f"{m.name}: some of positions 1..{positions} were never tested")
    lab = _lab_statistics(m, positions)
    model = _EngineModel(np.clip(c, 1e-3, 1 - 1e-3), rounds, seed)
    sigma = _solve_increasing(lambda s: model.oracle_auc(s) - lab["oracle_auc"], 0.0, 4.0)
    noise = _solve_increasing(lambda n: lab["confidence_auc"] - model.head_auc(sigma, n), 0.0, 20.0)
    grid = np.geomspace(0.02, 10.0, 121)
    means = model.head_means(sigma, noise, grid)
    best = int(np.argmin(np.abs(means - lab["mean_confidence"])))
    reached = {"oracle_auc": model.oracle_auc(sigma), "confidence_auc": model.head_auc(sigma, noise),
               "mean_confidence": float(means[best])}
    over = float(grid[best])
    return EngineFit(sigma, noise, over, lab, reached)

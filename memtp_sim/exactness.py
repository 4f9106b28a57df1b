"""Token-level exact speculative sampling over a small vocabulary.

This module is a test bench for the claim the whole simulator rests on: speculative
decoding with the accept/resample rule of Leviathan et al. (2023) emits tokens with
exactly the target model's distribution, whatever verify length a *lossless*
scheduler picks, while a scheduler that peeks at the sampled drafts (the
"retrospective" search of DSpark Appendix A) is not lossless.

Distributions are supplied by a **distribution source**, one of:

* a 1-D array ``(V,)``: the same distribution at every position;
* a 2-D array ``(L, V)``: row ``k`` is the distribution at round position ``k``
  (0-based), independent of the tokens before it;
* a callable ``(prefix: tuple[int, ...]) -> array (V,)``: the distribution of the
  next token after ``prefix``, the tokens already produced *in this round* (``()`` at
  the first position). The context before the round is whatever the callable closes
  over.

Rounds (0-based positions, ``gamma`` drafted tokens, verify length ``l``):

1. Draft ``x_k ~ p_draft(x_0..x_{k-1})`` for ``k = 0..gamma-1``.
2. Choose ``l``: a fixed integer, or a scheduler ``(drafts: tuple[int, ...]) -> int``
   that sees the drafted tokens (a scheduler that ignores them is lossless; one that
   reads them generally is not).
3. For ``k = 0..l-1``: accept ``x_k`` with probability
   ``min(1, p_t(x_k) / p_d(x_k))`` (both at prefix ``x_0..x_{k-1}``); on the first
   rejection emit one token from ``norm(max(0, p_t - p_d))`` and stop.
4. If all ``l`` drafts were accepted, emit a bonus token from ``p_target`` at
   position ``l``. ``l = 0`` is plain decoding: one token from ``p_target(())``.

Invalid arguments raise ``ValueError`` (``TypeError`` for a non-Generator ``rng``)
whose message starts with the argument's name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, TypeAlias

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = [
    "DistributionSource",
    "RoundBatch",
    "Scheduler",
    "StepResult",
    "analytical_acceptance",
    "early_stop_length",
    "residual_distribution",
    "residual_rows",
    "retrospective_length",
    "sample_first_tokens",
    "sample_rows",
    "simulate_rounds",
    "speculative_step",
]

#: Tolerance on ``sum(p) == 1`` when validating a distribution.
SUM_TOLERANCE: float = 1e-6

#: Residual mass at or below this is treated as zero (see :func:`residual_distribution`).
_RESIDUAL_EPS: float = 1e-12

DistributionSource: TypeAlias = ArrayLike | Callable[[tuple[int, ...]], ArrayLike]
Scheduler: TypeAlias = Callable[[tuple[int, ...]], int]


# ----------------------------------------------------------------------------------
# distributions
# ----------------------------------------------------------------------------------


def _distribution(p: ArrayLike, name: str) -> NDArray[np.float64]:
    """Validate a 1-D probability vector and return it as float64."""
    arr = np.asarray(p, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name}: a distribution must be 1-D, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name}: a distribution must not be empty")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name}: entries must be finite, found NaN or inf")
    if np.any(arr < 0):
        raise ValueError(f"{name}: entries must be >= 0, got min {float(arr.min()):g}")
    total = float(arr.sum())
    if abs(total - 1.0) > SUM_TOLERANCE:
        raise ValueError(f"{name}: entries must sum to 1 (within 1e-6), got {total:.9g}")
    return arr


def _pair(p_draft: ArrayLike, p_target: ArrayLike) -> tuple[NDArray, NDArray]:
    pd = _distribution(p_draft, "p_draft")
    pt = _distribution(p_target, "p_target")
    if pd.shape != pt.shape:
        raise ValueError(
            f"p_target: vocabulary size {pt.size} does not match p_draft size {pd.size}"
        )
    return pd, pt


def analytical_acceptance(p_draft: ArrayLike, p_target: ArrayLike) -> float:
    """Probability that one drafted token is accepted: ``sum_x min(p_d(x), p_t(x))``.

    Equal to ``1 - 0.5 * ||p_d - p_t||_1`` for normalised distributions.

    Args:
        p_draft: ``(V,)`` draft distribution.
        p_target: ``(V,)`` target distribution.

    Returns:
        Acceptance probability in [0, 1] (dimensionless).

    Raises:
        ValueError: ``p_draft`` or ``p_target`` not 1-D, empty, non-finite, negative,
            not summing to 1 within 1e-6, or of different lengths.

    Source:
        Leviathan, Kalman, Matias (2023, ICML): the acceptance probability of one draft,
        ``sum_x min(p, q) = 1 - 0.5 * ||p - q||_1``; DSpark paper (Cheng et al. 2026) section 3.2
        (the confidence head's training target ``c*_k``).
    """
    pd, pt = _pair(p_draft, p_target)
    return float(np.minimum(pd, pt).sum())


def residual_distribution(p_draft: ArrayLike, p_target: ArrayLike) -> NDArray[np.float64]:
    """Distribution a rejected position is resampled from: ``norm(max(0, p_t - p_d))``.

    When the residual mass is zero (``p_d >= p_t`` everywhere, i.e. the two are equal
    up to the validation tolerance) rejection has probability zero and any choice is
    exact; ``p_target`` is returned so the result is always a valid distribution.

    Args:
        p_draft: ``(V,)`` draft distribution.
        p_target: ``(V,)`` target distribution.

    Returns:
        ``(V,)`` float64 probability vector.

    Raises:
        ValueError: as :func:`analytical_acceptance`.

    Source:
        Leviathan, Kalman, Matias (2023, ICML), Algorithm 1 (resample from
        ``norm(max(0, p - q))`` on rejection).
    """
    pd, pt = _pair(p_draft, p_target)
    return residual_rows(pd[None, :], pt[None, :])[0]


def residual_rows(pd: NDArray, pt: NDArray) -> NDArray[np.float64]:
    """Row-wise residual distributions ``norm(max(0, pt - pd))``, unchecked (hot loops).

    Args:
        pd: drafter probabilities, shape (m, V), rows summing to 1.
        pt: target probabilities, shape (m, V), rows summing to 1.

    Returns:
        Shape (m, V); a row whose residual mass is below ``_RESIDUAL_EPS`` (drafter equal to the
        target) is the target row itself.

    Raises:
        Nothing: no validation; :func:`residual_distribution` is the checked single-row form.

    Source:
        Leviathan et al. (2023), Algorithm 1 (on rejection sample from norm(max(0, p - q))).
    """
    r = np.maximum(pt - pd, 0.0)
    mass = r.sum(axis=1, keepdims=True)
    zero = mass <= _RESIDUAL_EPS
    return np.where(zero, pt, r / np.where(zero, 1.0, mass))


# ----------------------------------------------------------------------------------
# distribution sources and sampling
# ----------------------------------------------------------------------------------


class _Source:
    """A validated distribution source: looks up ``(m, V)`` rows for ``m`` prefixes."""

    def __init__(self, source: DistributionSource, name: str) -> None:
        self.name = name
        self.fn: Callable[[tuple[int, ...]], ArrayLike] | None = None
        self.table: NDArray[np.float64] | None = None
        self.stationary = False
        if callable(source):
            self.fn = source
            return
        arr = np.asarray(source, dtype=np.float64)
        if arr.ndim == 1:
            self.table = _distribution(arr, name)[None, :]
            self.stationary = True
        elif arr.ndim == 2:
            if arr.shape[0] == 0:
                raise ValueError(f"{name}: needs at least one position, got shape {arr.shape}")
            for k in range(arr.shape[0]):
                _distribution(arr[k], f"{name}[{k}]")
            self.table = arr
        else:
            raise ValueError(
                f"{name}: must be a (V,) or (positions, V) array or a callable, "
                f"got shape {arr.shape}"
            )

    def require_positions(self, count: int) -> None:
        """Raise unless a ``(L, V)`` table has at least ``count`` positions."""
        if self.table is not None and not self.stationary and self.table.shape[0] < count:
            raise ValueError(
                f"{self.name}: has {self.table.shape[0]} positions but {count} are needed "
                f"(draft: gamma rows; target: gamma + 1 rows for the bonus position)"
            )

    def rows(self, prefixes: NDArray[np.int64]) -> NDArray[np.float64]:
        """Distributions after each prefix row; ``prefixes`` is ``(m, k)``."""
        m, k = prefixes.shape
        if self.table is not None:
            if self.stationary:
                return np.broadcast_to(self.table[0], (m, self.table.shape[1]))
            if k >= self.table.shape[0]:
                raise ValueError(
                    f"{self.name}: has {self.table.shape[0]} positions but position {k} "
                    f"is needed; give at least {k + 1} rows"
                )
            return np.broadcast_to(self.table[k], (m, self.table.shape[1]))
        assert self.fn is not None
        # one call per distinct prefix, then gather
        uniq, inverse = np.unique(prefixes, axis=0, return_inverse=True)
        dists = []
        for row in uniq:
            key = tuple(int(t) for t in row)
            dists.append(_distribution(self.fn(key), f"{self.name}{key}"))
        sizes = {d.size for d in dists}
        if len(sizes) != 1:
            raise ValueError(
                f"{self.name}: callable returned vocabularies of sizes {sorted(sizes)}"
            )
        return np.stack(dists)[inverse.reshape(-1)]


def sample_rows(rng: np.random.Generator, probs: NDArray) -> NDArray[np.int64]:
    """One categorical draw per row of ``probs`` by inverse CDF, unchecked (hot loops).

    Args:
        rng: the generator (one uniform per row).
        probs: shape (m, V), non-negative rows summing to 1 within rounding.

    Returns:
        Token indices, shape (m,), int64; a zero-mass token is never drawn.

    Raises:
        Nothing: no validation (the callers check their distributions once).

    Source:
        Inverse transform sampling of a categorical distribution (e.g. Devroye, *Non-Uniform
        Random Variate Generation*, 1986, section III.2).
    """
    m = probs.shape[0]
    if m == 0:
        return np.empty(0, dtype=np.int64)
    cdf = np.cumsum(probs, axis=1)
    total = cdf[:, -1]
    # scale to the row total (rows sum to 1 only within tolerance) and keep u < total so
    # rounding can never select a trailing zero-mass token
    u = np.minimum(rng.random(m) * total, np.nextafter(total, 0.0))
    idx = (cdf <= u[:, None]).sum(axis=1)  # first index with cdf > u; skips zero mass
    return np.minimum(idx, probs.shape[1] - 1).astype(np.int64)


def _check_vocab(pd: NDArray, pt: NDArray) -> None:
    if pd.shape[1] != pt.shape[1]:
        raise ValueError(
            f"p_target: vocabulary size {pt.shape[1]} does not match p_draft size {pd.shape[1]}"
        )


# ----------------------------------------------------------------------------------
# verification rounds
# ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RoundBatch:
    """Outcome of ``n`` independent speculative rounds.

    Attributes:
        tokens: ``(n, gamma + 1)`` int64 emitted tokens, left-aligned; entries past
            ``n_emitted`` are -1.
        n_accepted: ``(n,)`` int64 accepted draft tokens per round (0..length).
        lengths: ``(n,)`` int64 verify length ``l`` used in each round.
        drafts: ``(n, gamma)`` int64 drafted tokens (all of them, verified or not).

    Source:
        Leviathan, Kalman, Matias (2023, ICML), Algorithm 1: each round emits the accepted
        drafts plus one token (resampled or bonus).
    """

    tokens: NDArray[np.int64]
    n_accepted: NDArray[np.int64]
    lengths: NDArray[np.int64]
    drafts: NDArray[np.int64]

    @property
    def n_emitted(self) -> NDArray[np.int64]:
        """``(n,)`` int64 tokens emitted per round: accepted drafts plus one (bonus or resample).

        Source:
            Leviathan, Kalman, Matias (2023, ICML), Algorithm 1; DSpark paper (Cheng et al.
            2026) counts this bonus in tau (docs/model.md section 1, step 5).
        """
        return self.n_accepted + 1


class StepResult(NamedTuple):
    """Outcome of one speculative round.

    Attributes:
        tokens: emitted tokens, ``n_accepted + 1`` of them.
        n_accepted: number of drafted tokens accepted (0..length).
        length: verify length ``l`` used.
        drafts: all drafted tokens (``gamma`` of them).

    Source:
        Leviathan, Kalman, Matias (2023, ICML), Algorithm 1 (one round).
    """

    tokens: tuple[int, ...]
    n_accepted: int
    length: int
    drafts: tuple[int, ...]


def _check_int(value: object, name: str, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name}: must be an integer, got {value!r}")
    if value < lo:
        raise ValueError(f"{name}: must be >= {lo}, got {value}")
    return int(value)


def _lengths(
    length: int | Scheduler, gamma: int | None
) -> tuple[int, Callable[[NDArray], NDArray[np.int64]]]:
    """Resolve ``(gamma, drafts -> lengths)`` from the ``length``/``gamma`` arguments."""
    if callable(length):
        if gamma is None:
            raise ValueError("gamma: required when length is a scheduler callable")
        g = _check_int(gamma, "gamma", 0)
        scheduler = length

        def by_scheduler(drafts: NDArray) -> NDArray[np.int64]:
            if drafts.shape[0] == 0:
                return np.empty(0, dtype=np.int64)
            uniq, inverse = np.unique(drafts, axis=0, return_inverse=True)
            chosen = np.empty(uniq.shape[0], dtype=np.int64)
            for i, row in enumerate(uniq):
                key = tuple(int(t) for t in row)
                ell = scheduler(key)
                if isinstance(ell, bool) or not isinstance(ell, (int, np.integer)):
                    raise ValueError(f"length: scheduler returned {ell!r} for drafts {key}")
                if not 0 <= ell <= g:
                    raise ValueError(
                        f"length: scheduler returned {ell} for drafts {key}, outside 0..{g}"
                    )
                chosen[i] = ell
            return chosen[inverse.reshape(-1)]

        return g, by_scheduler
    ell = _check_int(length, "length", 0)
    g = ell if gamma is None else _check_int(gamma, "gamma", 0)
    if ell > g:
        raise ValueError(f"length: {ell} exceeds gamma={g}")
    return g, lambda drafts: np.full(drafts.shape[0], ell, dtype=np.int64)


def simulate_rounds(
    rng: np.random.Generator,
    n: int,
    p_draft: DistributionSource,
    p_target: DistributionSource,
    length: int | Scheduler,
    *,
    gamma: int | None = None,
    residual: bool = True,
) -> RoundBatch:
    """Run ``n`` independent speculative rounds, vectorised over rounds.

    Each position is processed for all rounds at once; callable sources are called once
    per distinct prefix, so cost grows with ``gamma`` and the number of distinct
    prefixes, not with ``n`` (``n = 2e5`` takes well under a second for small ``V``).

    Args:
        rng: numpy Generator supplying all randomness.
        n: number of rounds, >= 1.
        p_draft: draft distribution source (see module docstring); a ``(L, V)`` table
            needs ``L >= gamma`` rows.
        p_target: target distribution source; a ``(L, V)`` table needs
            ``L >= gamma + 1`` rows (the last one for the bonus token).
        length: verify length ``l`` in ``0..gamma``, or a scheduler
            ``(drafts: tuple[int, ...]) -> int`` called with the ``gamma`` drafted
            tokens. The scheduler must be a deterministic function of the drafts: it is
            called once per distinct draft tuple and the answer reused.
        gamma: number of tokens drafted per round; defaults to ``length`` when that is
            an integer, required for a scheduler.
        residual: True for exact verification. False gives the deliberately broken
            verifier that resamples a rejected position from ``p_target`` instead of the
            residual (for testing that tests catch it).

    Returns:
        A :class:`RoundBatch` with per-round tokens, acceptance counts and lengths.

    Raises:
        TypeError: ``rng`` is not a ``numpy.random.Generator``.
        ValueError: ``n`` < 1; ``gamma`` missing or negative; ``length`` outside
            ``0..gamma`` (or a scheduler returning such a value); ``p_draft`` or
            ``p_target`` not valid distributions, too few positions, or of different
            vocabulary sizes.

    Source:
        Leviathan, Kalman, Matias (2023, ICML), Algorithm 1 (per-position accept/resample);
        DSpark paper (Cheng et al. 2026) section 3.2 (verify length chosen per round) and
        Appendix A.
    """
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng: must be a numpy.random.Generator, got {type(rng).__name__}")
    n = _check_int(n, "n", 1)
    draft = _Source(p_draft, "p_draft")
    target = _Source(p_target, "p_target")
    if draft.table is not None and target.table is not None:
        _check_vocab(draft.table, target.table)
    g, lengths_of = _lengths(length, gamma)
    # check table depth up front, not only when a round happens to reach the end
    draft.require_positions(g)
    target.require_positions(g + 1)

    # 1. draft gamma tokens per round
    drafts = np.empty((n, g), dtype=np.int64)
    for k in range(g):
        drafts[:, k] = sample_rows(rng, draft.rows(drafts[:, :k]))

    # 2. verify lengths
    lengths = lengths_of(drafts)

    # 3. verify left to right
    tokens = np.full((n, g + 1), -1, dtype=np.int64)
    n_acc = np.zeros(n, dtype=np.int64)
    alive = np.ones(n, dtype=bool)  # no rejection yet
    for k in range(g):
        idx = np.flatnonzero(alive & (lengths > k))
        if idx.size == 0:
            break
        prefix = drafts[idx, :k]
        pd = draft.rows(prefix)
        pt = target.rows(prefix)
        _check_vocab(pd, pt)
        x = drafts[idx, k]
        rows = np.arange(idx.size)
        # accept w.p. min(1, pt/pd); pd(x) > 0 because x was drawn from pd
        acc = rng.random(idx.size) * pd[rows, x] < pt[rows, x]
        ok = idx[acc]
        tokens[ok, k] = x[acc]
        n_acc[ok] += 1
        bad = idx[~acc]
        if bad.size:
            fix = residual_rows(pd[~acc], pt[~acc]) if residual else pt[~acc]
            tokens[bad, k] = sample_rows(rng, fix)
            alive[bad] = False

    # 4. bonus token from the target after a fully accepted prefix
    for ell in np.unique(lengths[alive]):
        idx = np.flatnonzero(alive & (lengths == ell))
        pt = target.rows(drafts[idx, :ell])
        tokens[idx, ell] = sample_rows(rng, pt)
    return RoundBatch(tokens=tokens, n_accepted=n_acc, lengths=lengths, drafts=drafts)


def speculative_step(
    rng: np.random.Generator,
    p_draft_seq: DistributionSource,
    p_target_seq: DistributionSource,
    length: int | Scheduler,
    *,
    gamma: int | None = None,
    residual: bool = True,
) -> StepResult:
    """Run one verification round of exact speculative sampling on a chain.

    Same algorithm and arguments as :func:`simulate_rounds` with ``n = 1``.

    Args:
        rng: numpy Generator.
        p_draft_seq: draft distribution source (array or ``prefix -> (V,)`` callable).
        p_target_seq: target distribution source.
        length: verify length ``l`` (0 = plain decoding) or a scheduler callable.
        gamma: tokens drafted (default ``length`` for an integer ``length``).
        residual: False selects the broken verifier (rejections resample from the
            target instead of the residual).

    Returns:
        A :class:`StepResult`: emitted tokens (``n_accepted + 1``), accepted count,
        verify length and drafts.

    Raises:
        TypeError, ValueError: as :func:`simulate_rounds`.

    Source:
        Leviathan, Kalman, Matias (2023, ICML), Algorithm 1.
    """
    batch = simulate_rounds(
        rng, 1, p_draft_seq, p_target_seq, length, gamma=gamma, residual=residual
    )
    n_acc = int(batch.n_accepted[0])
    return StepResult(
        tokens=tuple(int(t) for t in batch.tokens[0, : n_acc + 1]),
        n_accepted=n_acc,
        length=int(batch.lengths[0]),
        drafts=tuple(int(t) for t in batch.drafts[0]),
    )


def sample_first_tokens(
    rng: np.random.Generator,
    n: int,
    p_draft: DistributionSource,
    p_target: DistributionSource,
    *,
    length: int | Scheduler,
    gamma: int | None = None,
    residual: bool = True,
) -> NDArray[np.int64]:
    """First emitted token of ``n`` independent rounds (Monte-Carlo helper).

    Under exact verification and a scheduler that ignores the drafts, these tokens are
    i.i.d. draws from ``p_target(())``.

    Args:
        rng, n, p_draft, p_target, length, gamma, residual: as :func:`simulate_rounds`.

    Returns:
        ``(n,)`` int64 token ids.

    Raises:
        TypeError, ValueError: as :func:`simulate_rounds`.

    Source:
        Leviathan, Kalman, Matias (2023, ICML): tokens from speculative sampling are
        distributed as the target's (the paper's correctness proof).
    """
    batch = simulate_rounds(rng, n, p_draft, p_target, length, gamma=gamma, residual=residual)
    return batch.tokens[:, 0].copy()


# ----------------------------------------------------------------------------------
# single-request schedulers (DSpark Appendix A arithmetic)
# ----------------------------------------------------------------------------------


def _schedule_inputs(
    cumulative_confidences: ArrayLike, sps: ArrayLike
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    a = np.asarray(cumulative_confidences, dtype=np.float64)
    if a.ndim != 1:
        raise ValueError(f"cumulative_confidences: must be 1-D, got shape {a.shape}")
    if not np.all(np.isfinite(a)) or np.any((a < 0) | (a > 1)):
        raise ValueError("cumulative_confidences: values must lie in [0, 1]")
    s = np.asarray(sps, dtype=np.float64)
    if s.ndim != 1 or s.size < a.size + 1:
        raise ValueError(
            f"sps: need a 1-D table with SPS(1)..SPS({a.size + 1}), got shape {s.shape}"
        )
    if not np.all(np.isfinite(s)) or np.any(s <= 0):
        raise ValueError("sps: values must be finite and > 0")
    return a, s


def _theta(a: NDArray, s: NDArray) -> NDArray[np.float64]:
    """``Theta_l = (1 + a_1 + ... + a_l) * SPS(1 + l)`` for ``l = 0..len(a)``."""
    tau = 1.0 + np.concatenate(([0.0], np.cumsum(a)))
    return tau * s[: a.size + 1]


def early_stop_length(cumulative_confidences: ArrayLike, sps: ArrayLike) -> int:
    """Verify length chosen by DSpark's greedy search with early stop, one request.

    Start at ``l = 0`` (``B = 1`` bonus slot, ``tau = 1``, ``Theta = SPS(1)``); admit
    position ``l + 1`` (``B += 1``, ``tau += a_{l+1}``, ``Theta = tau * SPS(B)``) while
    Theta strictly improves; stop at the first non-improvement. Because it stops before
    reading ``a_{l+2}``, the choice never depends on confidences of positions it did not
    admit, which is what keeps it lossless when those depend on sampled drafts.

    Args:
        cumulative_confidences: ``(gamma,)`` joint survival estimates ``a_1..a_gamma``
            in [0, 1].
        sps: ``(>= gamma + 1,)`` steps per second of the target, ``sps[i] = SPS(i + 1)``
            (1/s), all > 0.

    Returns:
        Verify length ``l`` in ``0..gamma``.

    Raises:
        ValueError: ``cumulative_confidences`` not 1-D or outside [0, 1]; ``sps`` too
            short, not 1-D, or not positive.

    Source:
        DSpark paper (Cheng et al. 2026), Algorithm 1 with R = 1, and the Appendix A worked
        example (docs/model.md section 1, step 3).
    """
    a, s = _schedule_inputs(cumulative_confidences, sps)
    theta = _theta(a, s)
    ell = 0
    while ell < a.size and theta[ell + 1] > theta[ell]:
        ell += 1
    return ell


def retrospective_length(cumulative_confidences: ArrayLike, sps: ArrayLike) -> int:
    """Verify length maximising ``Theta_l`` over all ``l`` (no early stop), one request.

    Looking past a non-improving position means the choice can depend on the
    confidence of a position whose value depends on the sampled drafts (DSpark
    Appendix A), which biases the output distribution. Ties go to the shortest ``l``.

    Args:
        cumulative_confidences: ``(gamma,)`` ``a_1..a_gamma`` in [0, 1].
        sps: ``(>= gamma + 1,)`` with ``sps[i] = SPS(i + 1)`` (1/s), all > 0.

    Returns:
        Verify length ``l`` in ``0..gamma``.

    Raises:
        ValueError: as :func:`early_stop_length`.

    Source:
        DSpark paper (Cheng et al. 2026), Appendix A (the non-lossless "retrospective" search).
    """
    a, s = _schedule_inputs(cumulative_confidences, sps)
    return int(np.argmax(_theta(a, s)))

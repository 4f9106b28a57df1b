"""MEMTP: the memory-elastic draft-head ensemble (docs/model.md section 2).

Each stacked draft head lets the drafter go one position deeper, so the draft length is the
ensemble depth (``gamma = depth``). Heads cost memory, so the depth "breathes" with the memory
left over after weights, KV cache in use and a reserve, and it is gated by the drafter's recent
quality, the *coherence* ``R``::

    g(R)  = 0 if R <= r_low;  1 if R >= r_high;  linear in between
    depth = clamp(floor(free_gib / head_cost_gib * g(R)), 1, max_depth)

This module is pure (no I/O, no SimPy, no engine) and holds:

* :class:`MemtpSettings` and :data:`MEMTP_DEFAULTS`: the ensemble's knobs and their defaults,
  written once here (config, CLI, engine and export read them from here).
* :func:`coherence_gate` and :func:`memtp_depth`: the formula above.
* :class:`CoherenceEWMA` (behind the :class:`CoherenceEstimator` protocol): the default estimator
  of ``R`` from accepted / verified draft-token counts.
* :class:`TowerCoherence`: the n-gram matryoshka tower's coherence ``R = prod_i R_i``, one EWMA per
  tower level (block position) of that position's acceptance; :func:`position_counts` turns a
  round's verify lengths and accepted counts into the per-position counts it needs.
* :class:`DepthController`: a pure, stateful wrapper around the formula that the engine calls once
  per round; it adds dwell-time hysteresis so the depth cannot thrash.

Units: memory is in GiB (2**30 bytes) throughout; coherence and the gate are fractions in [0, 1];
time is counted in engine rounds. The same formula fed by the machine's real free memory lives
in :mod:`memtp_sim.telemetry` (``depth --live``).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from .errors import InvalidArgumentError

__all__ = [
    "FLOOR_EPSILON",
    "MEMTP_DEFAULTS",
    "MemtpSettings",
    "CoherenceEWMA",
    "CoherenceEstimator",
    "DepthChange",
    "DepthController",
    "TowerCoherence",
    "coherence_gate",
    "memtp_depth",
    "position_counts",
]

#: Slack added before flooring the head count, in heads. Products such as ``0.1 * 3`` or
#: ``20.0 / 4.0 * g`` can land a few ulps *below* the integer they stand for; without the slack
#: ``floor`` would then drop a whole head. 1e-9 heads is about 4 bytes at 4 GiB per head, far below
#: anything a measurement can resolve, and adding a constant keeps the result monotone.
FLOOR_EPSILON = 1e-9


@dataclasses.dataclass(frozen=True)
class MemtpSettings:
    """The MEMTP ensemble's knobs (YAML section ``memtp``; :class:`memtp_sim.config.MemtpConfig`).

    Attributes:
        depth: ``"elastic"`` (a :class:`DepthController` decides each round) or a fixed number of
            heads; the draft length of every round is the current depth.
        max_depth: heads at most (the widest draft block).
        head_cost_gib: memory one head holds while alive (weights + working buffers), GiB.
        r_low, r_high: coherence gate thresholds (fractions).
        coherence_half_life_rounds: EWMA half-life of the coherence R, engine rounds.
        coherence_estimator: ``per_verified`` (accepted / verified drafts) or ``per_tested``.
        min_dwell_rounds: rounds a new depth target must persist before the depth changes.
        head_load_gb_per_s: copy rate when a new head is loaded (stalls the engine), GB/s.
        initial_depth: elastic start depth (None: the formula's at R = 1).

    Source: docs/model.md section 2; the seed's reference point (4 GiB per head, R thresholds
    0.3 / 0.9); head load rate: measured CPU<->GPU copy on gfx1151 (lhl/strix-halo-testing).
    """

    depth: str | int = "elastic"
    max_depth: int = 16
    head_cost_gib: float = 4.0
    r_low: float = 0.3
    r_high: float = 0.9
    coherence_half_life_rounds: float = 8.0
    coherence_estimator: str = "per_verified"
    coherence: str = "ewma"
    min_dwell_rounds: int = 32
    head_load_gb_per_s: float = 84.0
    initial_depth: int | None = None

    @property
    def elastic(self) -> bool:
        """Whether the depth is chosen each round by the controller (``depth: elastic``)."""
        return self.depth == "elastic"


#: The one place the MEMTP defaults are written.
MEMTP_DEFAULTS = MemtpSettings()


# --------------------------------------------------------------------------------------------
# Validation helpers
# --------------------------------------------------------------------------------------------


def _as_real(name: str, value: object) -> float:
    """Return ``value`` as a float, or raise ``InvalidArgumentError`` naming ``name``."""
    if type(value) is float:  # the engine's every round: skip the ABC check
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidArgumentError(f"{name} must be a real number; got {value!r}")
    return float(value)


def _check_unit_interval(name: str, value: object) -> float:
    """Return ``value`` as a float in [0, 1], or raise ``InvalidArgumentError`` naming ``name``."""
    x = _as_real(name, value)
    if math.isnan(x) or not 0.0 <= x <= 1.0:
        raise InvalidArgumentError(f"{name} must lie in [0, 1]; got {value!r}")
    return x


def _check_thresholds(r_low: object, r_high: object) -> tuple[float, float]:
    """Validate the gate thresholds; return them as floats."""
    lo = _as_real("r_low", r_low)
    hi = _as_real("r_high", r_high)
    if math.isnan(lo) or lo < 0.0:
        raise InvalidArgumentError(f"r_low must be >= 0; got {r_low!r}")
    if math.isnan(hi) or hi > 1.0:
        raise InvalidArgumentError(f"r_high must be <= 1; got {r_high!r}")
    if lo >= hi:
        raise InvalidArgumentError(
            f"r_low must be < r_high; got r_low={r_low!r}, r_high={r_high!r} "
            "(the gate needs a non-empty linear region)"
        )
    return lo, hi


def _check_free_gib(name: str, value: object) -> float:
    """Return a finite, non-negative memory amount in GiB, or raise naming ``name``."""
    x = _as_real(name, value)
    if math.isnan(x) or x < 0.0:
        raise InvalidArgumentError(f"{name} must be >= 0 GiB; got {value!r}")
    if math.isinf(x):
        raise InvalidArgumentError(f"{name} must be finite; got {value!r}")
    return x


def _check_head_cost(value: object) -> float:
    """Return a finite, positive per-head cost in GiB, or raise ``InvalidArgumentError``."""
    x = _as_real("head_cost_gib", value)
    if not (math.isfinite(x) and x > 0.0):
        raise InvalidArgumentError(f"head_cost_gib must be a finite number > 0 GiB; got {value!r}")
    return x


def _check_positive_int(name: str, value: object) -> int:
    """Return ``value`` as an int >= 1, or raise ``InvalidArgumentError`` naming ``name``."""
    if type(value) is int and value >= 1:  # the engine's every round: skip the ABC check
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidArgumentError(f"{name} must be an int >= 1; got {value!r}")
    n = int(value)
    if n < 1:
        raise InvalidArgumentError(f"{name} must be an int >= 1; got {value!r}")
    return n


def _check_count(name: str, value: object) -> int:
    """Return ``value`` as an int >= 0, or raise ``InvalidArgumentError`` naming ``name``."""
    if type(value) is int and value >= 0:  # the engine's every round: skip the ABC check
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidArgumentError(f"{name} must be an int >= 0; got {value!r}")
    n = int(value)
    if n < 0:
        raise InvalidArgumentError(f"{name} must be an int >= 0; got {value!r}")
    return n


#: heads "affordable" beyond float range (a head of 1e-310 GiB): more than any depth cap
_HEADS_BEYOND = 1 << 62


def _heads_affordable(free_gib: float, head_cost_gib: float, gate: float) -> int:
    """``floor(free_gib / head_cost_gib * gate + FLOOR_EPSILON)`` for validated inputs; a quotient
    beyond float range counts :data:`_HEADS_BEYOND` heads (0 under a gate of 0: inf * 0 is NaN)."""
    x = free_gib / head_cost_gib * gate + FLOOR_EPSILON
    if x != x:
        return 0
    return math.floor(x) if x < _HEADS_BEYOND else _HEADS_BEYOND


# --------------------------------------------------------------------------------------------
# The formula
# --------------------------------------------------------------------------------------------


def coherence_gate(coherence: float, r_low: float, r_high: float) -> float:
    """Gate ``g(R)`` that scales the head budget by the drafter's recent quality.

    ``g`` is 0 at or below ``r_low`` (the drafter is "searching": leave headroom), 1 at or above
    ``r_high``, and linear in between. It is non-decreasing in ``coherence``.

    Args:
        coherence: Coherence ``R``, a fraction in [0, 1] (accepted / verified draft tokens).
        r_low: Threshold at or below which the gate is 0, in [0, 1).
        r_high: Threshold at or above which the gate is 1, in (r_low, 1].

    Returns:
        The gate value, a fraction in [0, 1].

    Raises:
        InvalidArgumentError: (a ``ValueError``) if ``r_low >= r_high``, ``r_low < 0``, ``r_high > 1``,
            or ``coherence`` is NaN or outside [0, 1]. The message names the argument.

    Source:
        docs/model.md section 2 (MEMTP), definition of ``g(R)``.
    """
    lo, hi = _check_thresholds(r_low, r_high)
    r = _check_unit_interval("coherence", coherence)
    if r <= lo:
        return 0.0
    if r >= hi:
        return 1.0
    return (r - lo) / (hi - lo)


def memtp_depth(
    free_gib: float,
    coherence: float,
    *,
    max_depth: int = MEMTP_DEFAULTS.max_depth,
    head_cost_gib: float = MEMTP_DEFAULTS.head_cost_gib,
    r_low: float = MEMTP_DEFAULTS.r_low,
    r_high: float = MEMTP_DEFAULTS.r_high,
) -> int:
    """Ensemble depth (number of draft heads, equal to the draft length ``gamma``).

    ``depth = clamp(floor(free_gib / head_cost_gib * g(R)), 1, max_depth)``. The floor is taken
    after adding :data:`FLOOR_EPSILON` so that a product which stands for an integer (``20 / 4``,
    ``0.1 * 3 / 0.1``) is not floored one head low by rounding error. The lower clamp means one
    head is always kept, even when memory or coherence would fund none.

    Example: 21.49 GiB free at 4 GiB per head gives 5 heads at ``R = 1.0`` and 1 head at
    ``R = 0.3`` (gate 0, clamped up to 1).

    Args:
        free_gib: Memory available to fund heads, in GiB (after weights, KV cache in use and any
            reserve). Finite and >= 0.
        coherence: Coherence ``R``, a fraction in [0, 1].
        max_depth: Upper clamp on the depth, in heads; an int >= 1.
        head_cost_gib: Memory one head holds while alive (weights plus working buffers), in GiB;
            finite and > 0.
        r_low: Gate threshold at or below which no memory is spent on extra heads, in [0, 1).
        r_high: Gate threshold at or above which all free memory may fund heads, in (r_low, 1].

    Returns:
        The depth, an int in [1, max_depth]. Non-decreasing in ``free_gib`` and in ``coherence``.

    Raises:
        InvalidArgumentError: (a ``ValueError``) naming the offending argument if ``r_low >= r_high``,
            ``r_low < 0``, ``r_high > 1``, ``coherence`` is NaN or outside [0, 1], ``free_gib``
            is negative, NaN or infinite, ``head_cost_gib <= 0`` (or not finite), or
            ``max_depth`` is not an int >= 1.

    Source:
        docs/model.md section 2 (MEMTP), depth formula and the seed's reference point (21.49 GiB, 4 GiB per
        head: 5 heads at R = 1.0, 1 head at R = 0.3).
    """
    free = _check_free_gib("free_gib", free_gib)
    cost = _check_head_cost(head_cost_gib)
    depth_cap = _check_positive_int("max_depth", max_depth)
    gate = coherence_gate(coherence, r_low, r_high)
    return max(1, min(depth_cap, _heads_affordable(free, cost, gate)))


# --------------------------------------------------------------------------------------------
# Coherence estimation
# --------------------------------------------------------------------------------------------


@runtime_checkable
class CoherenceEstimator(Protocol):
    """Anything that turns per-round draft outcomes into a coherence ``R`` in [0, 1].

    The engine calls :meth:`update` once per round with counts summed over the batch, then reads
    :attr:`value` and hands it to :class:`DepthController`.
    """

    @property
    def value(self) -> float:
        """Current coherence estimate, a fraction in [0, 1]."""
        ...

    def update(self, accepted_draft_tokens: int, verified_draft_tokens: int) -> float:
        """Fold in one round's counts (bonus tokens excluded); return the new estimate."""
        ...


class CoherenceEWMA:
    """Coherence ``R`` as an exponentially weighted mean of the per-round acceptance ratio.

    Each round with ``verified > 0`` draft tokens sets
    ``R <- (1 - alpha) * R + alpha * accepted / verified`` with
    ``alpha = 1 - 2 ** (-1 / half_life_rounds)``, so a round's weight halves every
    ``half_life_rounds`` rounds. The ratio is of *draft* tokens across the batch, bonus tokens
    excluded. A round that verified no draft tokens carries no evidence and leaves ``R`` as is.

    Args:
        half_life_rounds: Half-life of a round's weight, in rounds; finite and > 0.
        initial: Starting value of ``R``, a fraction in [0, 1] (default 1.0: trust the drafter
            until shown otherwise).

    Raises:
        InvalidArgumentError: (a ``ValueError``) if ``half_life_rounds`` is not finite and > 0, or
            ``initial`` is outside [0, 1] or NaN.

    Source:
        docs/model.md section 2 ("an EWMA of accepted/verified draft tokens is the default estimator").
    """

    def __init__(self, half_life_rounds: float = MEMTP_DEFAULTS.coherence_half_life_rounds,
                 initial: float = 1.0) -> None:
        h = _as_real("half_life_rounds", half_life_rounds)
        if not (math.isfinite(h) and h > 0.0):
            raise InvalidArgumentError(
                f"half_life_rounds must be a finite number > 0; got {half_life_rounds!r}"
            )
        self._half_life_rounds = h
        self._alpha = 1.0 - 2.0 ** (-1.0 / h)
        self._value = _check_unit_interval("initial", initial)
        self._num_updates = 0

    @property
    def value(self) -> float:
        """Current coherence ``R``, a fraction in [0, 1]."""
        return self._value

    @property
    def alpha(self) -> float:
        """Weight of the newest round, ``1 - 2 ** (-1 / half_life_rounds)``."""
        return self._alpha

    @property
    def half_life_rounds(self) -> float:
        """Half-life of a round's weight, in rounds."""
        return self._half_life_rounds

    @property
    def num_updates(self) -> int:
        """Rounds that changed the estimate (rounds with verified draft tokens)."""
        return self._num_updates

    def update(self, accepted_draft_tokens: int, verified_draft_tokens: int) -> float:
        """Fold in one round's batch-wide counts and return the new ``R``.

        Args:
            accepted_draft_tokens: Draft tokens accepted this round, summed over the batch
                (bonus tokens excluded); an int in [0, verified_draft_tokens].
            verified_draft_tokens: Draft tokens sent to verification this round, summed over the
                batch; an int >= 0. Zero leaves ``R`` unchanged.

        Returns:
            The updated coherence ``R`` in [0, 1].

        Raises:
            InvalidArgumentError: (a ``ValueError``) if either count is negative or not an int, or
                ``accepted_draft_tokens > verified_draft_tokens``.
        """
        accepted = _check_count("accepted_draft_tokens", accepted_draft_tokens)
        verified = _check_count("verified_draft_tokens", verified_draft_tokens)
        if accepted > verified:
            raise InvalidArgumentError(
                f"accepted_draft_tokens ({accepted}) must not exceed "
                f"verified_draft_tokens ({verified})"
            )
        if verified == 0:
            return self._value
        ratio = accepted / verified
        new = (1.0 - self._alpha) * self._value + self._alpha * ratio
        self._value = min(1.0, max(0.0, new))  # guard rounding at the ends of [0, 1]
        self._num_updates += 1
        return self._value


def position_counts(lengths: Sequence[int], accepted: Sequence[int],
                    levels: int | None = None) -> tuple[list[int], list[int]]:
    """Per-position acceptance counts of one round, summed over the batch.

    Position ``i`` (1-based) of request ``r`` is *tested* when it was verified and every earlier
    position was accepted (``lengths[r] >= i`` and ``accepted[r] >= i - 1``), and *accepted* when
    ``accepted[r] >= i``. Summed over positions, tested counts are the ``per_tested`` count of the
    engine (``sum_r min(lengths[r], accepted[r] + 1)``) and accepted counts are the accepted drafts.

    Args:
        lengths: verify length per request (ints >= 0).
        accepted: leading accepted drafts per request (ints in [0, lengths[r]]).
        levels: positions to count (default: the longest verify length).

    Returns:
        (accepted per position, tested per position), two lists of ``levels`` ints.

    Raises:
        InvalidArgumentError: (a ``ValueError``) lengths and accepted of different sizes, a negative
            count, or ``accepted[r] > lengths[r]``.
    """
    ls = [_check_count("lengths", v) for v in lengths]
    acc = [_check_count("accepted", v) for v in accepted]
    if len(ls) != len(acc):
        raise InvalidArgumentError(f"accepted has {len(acc)} entries but lengths has {len(ls)}")
    for r, (ell, a) in enumerate(zip(ls, acc)):
        if a > ell:
            raise InvalidArgumentError(f"accepted[{r}] ({a}) must not exceed lengths[{r}] ({ell})")
    n = max(ls, default=0) if levels is None else _check_count("levels", levels)
    acc_by = [0] * n
    tested_by = [0] * n
    for ell, a in zip(ls, acc):
        for i in range(min(ell, a + 1, n)):  # 0-based position i is tested
            tested_by[i] += 1
            if i < a:
                acc_by[i] += 1
    return acc_by, tested_by


class TowerCoherence:
    """Coherence of the n-gram matryoshka tower: ``R = prod_{i=1..d} R_i`` over its live levels.

    Level ``i`` of the tower drafts block position ``i``; ``R_i`` is an EWMA (weight
    ``1 - 2 ** (-1 / half_life_rounds)`` per round, as :class:`CoherenceEWMA`) of that position's
    acceptance, accepted / tested at position ``i`` (tested: verified with every earlier position
    accepted). So ``R`` estimates the joint survival of a whole ``d``-position block, and one
    level that goes bad (say a corrupted head) pulls ``R`` down by its own factor, which a pooled
    accepted / verified ratio dilutes. ``d`` is the depth of the last round
    (:meth:`update_positions`' count length, or ``depth=``), so levels the ensemble dropped stop
    counting; a level not tested in a round keeps its value.

    ``R`` is a joint probability over ``d`` positions, so it is lower than the pooled EWMA of the
    same drafter (0.9 per level gives 0.9 ** 5 = 0.59 at depth 5): the gate thresholds
    ``r_low``/``r_high`` need values on that scale.

    Protocol: :meth:`update_positions` (per-position counts; :func:`position_counts` builds them
    from a round's verify lengths and accepted counts) is the update; :meth:`update` (the
    :class:`CoherenceEstimator` method, batch totals only) raises, because totals cannot say which
    level failed.

    Args:
        max_levels: tower levels tracked (the deepest draft position), an int >= 1.
        half_life_rounds: half-life of a round's weight in every level's EWMA, rounds; > 0.
        initial: starting ``R_i`` of every level, in [0, 1] (default 1.0).

    Raises:
        InvalidArgumentError: (a ``ValueError``) for an invalid argument, naming it.

    Source:
        docs/model.md section 2 (tower coherence ``R = prod R_i``) and issue 14; the per-level EWMA
        is :class:`CoherenceEWMA`'s.
    """

    def __init__(self, max_levels: int = MEMTP_DEFAULTS.max_depth,
                 half_life_rounds: float = MEMTP_DEFAULTS.coherence_half_life_rounds,
                 initial: float = 1.0) -> None:
        self._max_levels = _check_positive_int("max_levels", max_levels)
        self._levels = [CoherenceEWMA(half_life_rounds, initial) for _ in range(self._max_levels)]
        self._depth = self._max_levels

    @property
    def value(self) -> float:
        """``R = prod_{i<=depth} R_i``, a fraction in [0, 1]."""
        return self.value_at(self._depth)

    def value_at(self, depth: int) -> float:
        """``prod_{i<=depth} R_i`` for a tower of ``depth`` levels (1..max_levels).

        Raises:
            InvalidArgumentError: ``depth`` not an int in 1..max_levels.
        """
        d = _check_positive_int("depth", depth)
        if d > self._max_levels:
            raise InvalidArgumentError(f"depth must be <= max_levels ({self._max_levels}); got {depth!r}")
        return min(1.0, max(0.0, math.prod(e.value for e in self._levels[:d])))

    @property
    def depth(self) -> int:
        """Levels ``R`` multiplies (the depth of the last round)."""
        return self._depth

    @property
    def level_values(self) -> tuple[float, ...]:
        """``R_1..R_max_levels``."""
        return tuple(e.value for e in self._levels)

    @property
    def max_levels(self) -> int:
        """Tower levels tracked."""
        return self._max_levels

    @property
    def half_life_rounds(self) -> float:
        """Half-life of a round's weight in every level's EWMA, rounds."""
        return self._levels[0].half_life_rounds

    def update_positions(self, accepted: Sequence[int], tested: Sequence[int], *,
                         depth: int | None = None) -> float:
        """Fold in one round's per-position counts and return the new ``R``.

        Args:
            accepted: accepted drafts at positions 1..n, summed over the batch (ints >= 0).
            tested: tested drafts at positions 1..n (verified with every earlier position
                accepted), summed over the batch; ``accepted[i] <= tested[i]``. A position with
                ``tested == 0`` leaves its level as is.
            depth: the round's tower depth (levels ``R`` multiplies from now on); default ``n``.

        Returns:
            The updated ``R`` in [0, 1].

        Raises:
            InvalidArgumentError: (a ``ValueError``) different lengths, more than ``max_levels``
                positions, a negative or non-int count, ``accepted > tested`` at a position, or a
                ``depth`` outside 1..max_levels.
        """
        if len(accepted) != len(tested):
            raise InvalidArgumentError(f"accepted has {len(accepted)} positions but tested has {len(tested)}")
        if len(tested) > self._max_levels:
            raise InvalidArgumentError(f"tested has {len(tested)} positions; the tower tracks max_levels="
                                       f"{self._max_levels}")
        counts = [(_check_count(f"accepted[{i}]", a), _check_count(f"tested[{i}]", t))
                  for i, (a, t) in enumerate(zip(accepted, tested))]
        d = len(counts) if depth is None else _check_positive_int("depth", depth)
        if not 1 <= d <= self._max_levels:
            raise InvalidArgumentError(f"depth must lie in 1..{self._max_levels}; got {d!r}")
        for i, (a, t) in enumerate(counts):
            if a > t:
                raise InvalidArgumentError(f"accepted[{i}] ({a}) must not exceed tested[{i}] ({t})")
        for level, (a, t) in zip(self._levels, counts):
            level.update(a, t)
        self._depth = d
        return self.value

    def update(self, accepted_draft_tokens: int, verified_draft_tokens: int) -> float:
        """Not available: batch totals cannot say which level failed; use :meth:`update_positions`.

        Raises:
            InvalidArgumentError: always.
        """
        raise InvalidArgumentError("TowerCoherence needs per-position counts: call update_positions(accepted, "
                                   "tested) (memtp.position_counts builds them from a round's verify lengths "
                                   "and accepted counts)")

    def __repr__(self) -> str:
        levels = ", ".join(f"{v:.3f}" for v in self.level_values[: self._depth])
        return f"TowerCoherence(R={self.value:.4f}, depth={self._depth}, levels=[{levels}])"


# --------------------------------------------------------------------------------------------
# Depth controller
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DepthChange:
    """One change of the ensemble depth made by :class:`DepthController`.

    Attributes:
        round_index: Engine round at which the change was decided.
        old_depth: Depth before the change, in heads.
        new_depth: Depth after the change, in heads.
        reason: ``"memory"`` (immediate shrink: heads no longer fit), ``"coherence"`` (shrink
            after the target stayed below the depth for the dwell) or ``"grow"`` (one head added
            after the target stayed above the depth for the dwell).
    """

    round_index: int
    old_depth: int
    new_depth: int
    reason: str


class DepthController:
    """Round-by-round MEMTP depth with hysteresis, so the ensemble breathes without thrashing.

    The engine calls :meth:`propose` once per round (or less often) with the memory that can fund
    heads and the current coherence; the controller returns the depth to use. Each call computes
    the formula's target ``memtp_depth(free_gib, coherence, ...)`` and the memory cap
    ``clamp(floor(free_gib / head_cost_gib), 1, max_depth)`` (what memory alone could hold), then
    applies these rules in order of precedence:

    1. **KV memory pressure first: heads are released before KV would overflow.** If the current
       depth exceeds the memory cap, the depth drops to the cap at once, whatever the dwell.
       Only as many heads as memory requires are released; a further coherence-driven shrink, if
       any, goes through rule 2.
    2. **Coherence shrink, after a dwell.** If the target has been below the depth on every
       observed round for ``min_dwell_rounds`` rounds, the depth drops to the highest target
       seen during that run (the gentlest shrink the evidence supports).
    3. **Growth, after a dwell, one head at a time.** If the target has been above the depth
       on every observed round for ``min_dwell_rounds`` rounds, and the memory cap computed
       on ``free_gib - grow_margin_gib`` also allows one more head, the depth grows by exactly
       one head.

    Any change resets both runs, so between two changes made by rules 2 or 3 at least
    ``min_dwell_rounds`` rounds pass. Rule 1 only ever lowers the depth and each growth adds one
    head, so over ``n`` rounds the number of changes is at most
    ``2 * (n / min_dwell_rounds + 1) + max_depth - 1``; when free memory merely flickers around
    a head boundary (up for fewer than ``min_dwell_rounds`` rounds at a time) the depth shrinks
    once and then stays put.

    "Observed" rounds are the calls to :meth:`propose`; when calls skip rounds, a run counts from
    the first round it was observed to the current ``round_index`` (inclusive), so a dwell of
    ``k`` means the condition held at ``k`` consecutive round indices if called every round.
    With ``min_dwell_rounds = 1`` the controller follows the target at once when shrinking and
    grows one head per round.

    ``free_gib`` must be the memory that can fund heads *including the memory the live heads
    already hold*: capacity minus weights, minus KV cache in use, minus any reserve. (The
    memory held by ``depth`` heads is ``depth * head_cost_gib``; the shrink in rule 1 fires
    exactly when ``free_gib < depth * head_cost_gib``, up to :data:`FLOOR_EPSILON`.) The depth
    never goes below 1, matching the formula's clamp, so the engine must be able to fund one
    head regardless.

    Args:
        max_depth: Upper clamp on the depth, in heads; an int >= 1.
        head_cost_gib: Memory one head holds while alive, in GiB; finite and > 0.
        r_low: Coherence gate lower threshold, in [0, 1).
        r_high: Coherence gate upper threshold, in (r_low, 1].
        min_dwell_rounds: Rounds the target must stay beyond the depth before a non-memory
            change; an int >= 1.
        grow_margin_gib: Extra free memory, in GiB, growth requires beyond the next head's cost
            (hysteresis against memory noise); finite and >= 0. Default 0.
        initial_depth: Starting depth, in heads; an int in [1, max_depth]. Default 1 (start lean
            and grow as evidence arrives); pass ``memtp_depth(free0, r0, ...)`` to start at the
            formula's value.

    Raises:
        InvalidArgumentError: (a ``ValueError``) naming the argument for any invalid value (the same
            checks as :func:`memtp_depth`, plus the ones above).

    Source:
        docs/model.md section 2 (MEMTP depth formula; the ensemble "breathes" as KV fills). The dwell and
        one-head growth rules are this module's design, chosen to bound the change rate.
    """

    def __init__(
        self,
        *,
        max_depth: int = MEMTP_DEFAULTS.max_depth,
        head_cost_gib: float = MEMTP_DEFAULTS.head_cost_gib,
        r_low: float = MEMTP_DEFAULTS.r_low,
        r_high: float = MEMTP_DEFAULTS.r_high,
        min_dwell_rounds: int = MEMTP_DEFAULTS.min_dwell_rounds,
        grow_margin_gib: float = 0.0,
        initial_depth: int = 1,
    ) -> None:
        self._max_depth = _check_positive_int("max_depth", max_depth)
        self._head_cost_gib = _check_head_cost(head_cost_gib)
        self._r_low, self._r_high = _check_thresholds(r_low, r_high)
        self._min_dwell_rounds = _check_positive_int("min_dwell_rounds", min_dwell_rounds)
        self._grow_margin_gib = _check_free_gib("grow_margin_gib", grow_margin_gib)
        depth0 = _check_positive_int("initial_depth", initial_depth)
        if depth0 > self._max_depth:
            raise InvalidArgumentError(
                f"initial_depth must be <= max_depth ({self._max_depth}); got {initial_depth!r}"
            )
        self._depth = depth0
        self._last_round: int | None = None
        self._last_target: int | None = None
        self._above_since: int | None = None  # first round of the current "target > depth" run
        self._below_since: int | None = None  # first round of the current "target < depth" run
        self._below_max_target = 0  # highest target seen during the current "below" run
        self._changes: list[DepthChange] = []

    # -- read-only state ----------------------------------------------------------------------

    @property
    def depth(self) -> int:
        """Current depth, in heads (equals the draft length ``gamma``)."""
        return self._depth

    @property
    def max_depth(self) -> int:
        """Upper clamp on the depth, in heads."""
        return self._max_depth

    @property
    def head_cost_gib(self) -> float:
        """Memory one head holds, in GiB."""
        return self._head_cost_gib

    @property
    def r_low(self) -> float:
        """Coherence gate lower threshold."""
        return self._r_low

    @property
    def r_high(self) -> float:
        """Coherence gate upper threshold."""
        return self._r_high

    @property
    def min_dwell_rounds(self) -> int:
        """Rounds a target must persist before a non-memory change."""
        return self._min_dwell_rounds

    @property
    def grow_margin_gib(self) -> float:
        """Extra free memory growth requires, in GiB."""
        return self._grow_margin_gib

    @property
    def heads_gib(self) -> float:
        """Memory the current heads hold, ``depth * head_cost_gib``, in GiB."""
        return self._depth * self._head_cost_gib

    @property
    def last_target(self) -> int | None:
        """The formula's target at the last :meth:`propose` call (``None`` before the first)."""
        return self._last_target

    @property
    def last_round_index(self) -> int | None:
        """``round_index`` of the last :meth:`propose` call (``None`` before the first)."""
        return self._last_round

    @property
    def num_changes(self) -> int:
        """Depth changes made so far."""
        return len(self._changes)

    @property
    def changes(self) -> tuple[DepthChange, ...]:
        """Every depth change so far, oldest first."""
        return tuple(self._changes)

    # -- the decision -------------------------------------------------------------------------

    def _memory_cap(self, free_gib: float) -> int:
        """Heads that ``free_gib`` can hold, clamped to [1, max_depth]."""
        return max(1, min(self._max_depth, _heads_affordable(free_gib, self._head_cost_gib, 1.0)))

    def _set_depth(self, new_depth: int, round_index: int, reason: str) -> None:
        self._changes.append(DepthChange(round_index, self._depth, new_depth, reason))
        self._depth = new_depth
        self._above_since = None
        self._below_since = None
        self._below_max_target = 0

    def propose(self, free_gib: float, coherence: float, round_index: int) -> int:
        """Decide the depth for round ``round_index`` and return it.

        Args:
            free_gib: Memory that can fund heads, in GiB, *including* what the current heads
                hold (capacity - weights - KV in use - reserve); finite and >= 0.
            coherence: Coherence ``R`` in [0, 1] (e.g. :attr:`CoherenceEWMA.value`).
            round_index: Engine round number, an int >= 0, strictly greater than at the
                previous call.

        Returns:
            The depth to use from this round on, an int in [1, max_depth].

        Raises:
            InvalidArgumentError: (a ``ValueError``) if ``free_gib`` is negative, NaN or infinite,
                ``coherence`` is outside [0, 1] or NaN, or ``round_index`` is not an int >= 0
                greater than the previous one.
        """
        free = _check_free_gib("free_gib", free_gib)
        t = _check_count("round_index", round_index)
        if self._last_round is not None and t <= self._last_round:
            raise InvalidArgumentError(
                f"round_index must increase between calls; got {round_index!r} after "
                f"{self._last_round}"
            )
        target = memtp_depth(
            free,
            coherence,
            max_depth=self._max_depth,
            head_cost_gib=self._head_cost_gib,
            r_low=self._r_low,
            r_high=self._r_high,
        )
        self._last_round = t
        self._last_target = target
        dwell = self._min_dwell_rounds

        # Rule 1: memory pressure. Release heads at once, only as many as needed.
        memory_cap = self._memory_cap(free)
        if self._depth > memory_cap:
            self._set_depth(memory_cap, t, "memory")
            return self._depth

        if target < self._depth:
            # Rule 2: coherence shrink after the dwell.
            self._above_since = None
            if self._below_since is None:
                self._below_since = t
                self._below_max_target = target
            else:
                self._below_max_target = max(self._below_max_target, target)
            if t - self._below_since + 1 >= dwell:
                self._set_depth(self._below_max_target, t, "coherence")
        elif target > self._depth:
            # Rule 3: growth after the dwell, one head at a time, with the memory margin.
            self._below_since = None
            self._below_max_target = 0
            if self._above_since is None:
                self._above_since = t
            if t - self._above_since + 1 >= dwell:
                margin_cap = self._memory_cap(max(0.0, free - self._grow_margin_gib))
                if margin_cap >= self._depth + 1:
                    self._set_depth(self._depth + 1, t, "grow")
        else:
            self._above_since = None
            self._below_since = None
            self._below_max_target = 0
        return self._depth

    def __repr__(self) -> str:
        return (
            f"DepthController(depth={self._depth}, max_depth={self._max_depth}, "
            f"head_cost_gib={self._head_cost_gib}, r_low={self._r_low}, r_high={self._r_high}, "
            f"min_dwell_rounds={self._min_dwell_rounds}, num_changes={self.num_changes})"
        )

"""Candidate helpers shared by the confidence-ranked policies (DSpark sync/async, threshold, goodput).

Each request r drafted L positions with conditional confidences ``c[r, k]`` (shape (R, L)); the
joint survival ``a[r, j] = prod_{k<=j} c[r, k]`` is the expected contribution of verifying
position j (DSpark paper section 3.2). Only candidates with ``a > 0`` are ever admitted (Algorithm 1). Candidate order, shared by all: ``a`` descending, ties by
request index then position (the order of DSpark's Algorithm 1). Because ``a`` never increases
along a row, any leading part of this order is a per-request prefix.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import InvalidArgumentError
from ..hardware import SPSTable
from .base import DraftView, RoundView

__all__ = ["GAMMA_FIELD", "FALLBACK_FIELD", "PROBE_FIELD", "FallbackGate", "survival", "draft_budget", "ranked_candidates", "take_top", "expected_rate", "pass_time_s"]

#: pydantic Field arguments of the ``gamma`` (block size) parameter every drafting policy has.
GAMMA_FIELD = dict(ge=1, le=64, description="draft tokens proposed per request per round (block size)")
#: Field arguments of ``fallback`` and ``probe_every`` (see :class:`FallbackGate`).
FALLBACK_FIELD = dict(description="draft nothing (plain decoding) while drafting did not pay in the last drafted round")
PROBE_FIELD = dict(ge=1, le=100000, description="while falling back, draft again every this many rounds to re-check")


class FallbackGate:
    """Lets a confidence-ranked policy decode plainly while speculation does not pay.

    After each drafted round the policy reports its best expected rate with drafts (its own
    objective, drafting time included) and the rate of a plain decode pass without drafting. The
    gate keeps an exponential moving average (half-life ``half_life_rounds`` drafted rounds) of
    ``log(best / plain)``; while it is not positive, the next rounds draft nothing (no drafter
    time, no planner time), except every ``probe_every`` rounds, which draft again to re-check. A
    single unlucky round does not switch speculation off; at saturation, where drafting keeps not
    paying, the policy falls back to plain decoding instead of paying for drafts it will not verify.

    Source: memtp_sim's design (DSpark paper section 5.2 sizes verification from measured costs;
    vLLM's speculative_disable_by_batch_size and SGLang PR #13376 turn speculation off when it
    does not pay).
    """

    def __init__(self, enabled: bool, probe_every: int, half_life_rounds: float = 8.0) -> None:
        self.enabled = enabled
        self.probe_every = probe_every
        self._alpha = 1.0 - 0.5 ** (1.0 / half_life_rounds)
        self._gain = 0.0  # EMA of log(best / plain); > 0: drafting pays
        self._skipped = 0
        self._last_round = -1

    def _reset(self) -> None:
        self._gain, self._skipped, self._last_round = 0.0, 0, -1

    def report(self, round_index: int, best_rate: float, plain_rate: float) -> None:
        """Record a drafted round's expected rates (tok/s; a NaN or non-positive rate is skipped)."""
        if round_index < self._last_round:  # a new run
            self._reset()
        self._last_round = round_index
        # math on plain floats: numpy's scalar calls cost ~1 us each, every drafted round
        if math.isfinite(best_rate) and math.isfinite(plain_rate) and best_rate > 0 and plain_rate > 0:
            self._gain += self._alpha * (math.log(best_rate / plain_rate) - self._gain)

    def draft_lengths(self, view: "DraftView") -> int:
        """All the drafter offers, or 0 while drafting does not pay (probing every probe_every rounds)."""
        if view.round_index < self._last_round:  # a new run
            self._reset()
        if not self.enabled or self._gain > 0.0 or self._last_round < 0:
            self._skipped = 0
            return view.max_draft_len
        self._skipped += 1
        if self._skipped >= self.probe_every:
            self._skipped = 0
            return view.max_draft_len
        return 0

    def plain_rounds_ahead(self, round_index: int) -> int:
        """Rounds from ``round_index`` on that :meth:`draft_lengths` answers 0 (the rounds before
        the next probe while falling back; 0 otherwise)."""
        if round_index < self._last_round or not self.enabled or self._gain > 0.0 or self._last_round < 0:
            return 0
        return self.probe_every - 1 - self._skipped

    def skip_plain_rounds(self, round_index: int, rounds: int) -> None:
        """The state after ``rounds`` calls of :meth:`draft_lengths` that answered 0."""
        if 0 < rounds <= self.plain_rounds_ahead(round_index):
            self._skipped += rounds


class FallbackGated:
    """Mixin of the policies that own a :class:`FallbackGate` as ``self._gate``: its draft-length
    decision and the plain rounds it announces (see :meth:`~memtp_sim.policies.base.Policy.plain_rounds_ahead`)."""

    _gate: FallbackGate

    def draft_lengths(self, view: DraftView) -> int:
        """Positions to draft this round: all the drafter offers, or 0 while drafting does not pay
        (see :class:`FallbackGate`).

        Args:
            view: the round before drafting.

        Returns:
            ``view.max_draft_len`` or 0.
        """
        return self._gate.draft_lengths(view)

    def plain_rounds_ahead(self, round_index: int) -> int:
        """Rounds before the gate's next probe while it falls back (see :class:`FallbackGate`)."""
        return self._gate.plain_rounds_ahead(round_index)

    def skip_plain_rounds(self, round_index: int, rounds: int) -> None:
        """Advance the gate over ``rounds`` plain rounds run as a block."""
        self._gate.skip_plain_rounds(round_index, rounds)


def plain_rate(view: RoundView) -> float:
    """tok/s of a plain decode pass this round (no drafting time, no drafts verified)."""
    return plain_rate_of(view.num_requests, int(view.prefill_tokens), view.sps, view.no_draft_pass_s)


def plain_rate_of(num_requests: int, prefill_tokens: int, sps: SPSTable, no_draft_pass_s: float | None) -> float:
    """:func:`plain_rate` of a round given by its fields: ``num_requests`` tokens per plain pass,
    timed ``no_draft_pass_s``, or by ``sps`` at ``num_requests + prefill_tokens`` when None
    (NaN where the table has no value there, or without requests)."""
    t = no_draft_pass_s
    if t is None:
        b = num_requests + prefill_tokens
        if not sps.covers(b):
            return float("nan")
        t = float(sps.pass_time_s(b))
    return num_requests / t if num_requests else float("nan")


def survival(view: RoundView, gamma: int) -> np.ndarray:
    """Joint survival ``a[r, j] = prod_{k<=j} c[r, k]`` of the view's confidences.

    Returns:
        float64 array of shape (R, L), L = ``view.confidences.shape[1]`` <= gamma.

    Raises:
        InvalidArgumentError: confidences not 2-D, wider than ``gamma`` (the policy's draft length),
            NaN or outside [0, 1].

    Args:
        view: the round (``confidences``: ``(R, L)`` conditional confidences).
        gamma: the policy's draft length, tokens.

    Source:
        DSpark paper (Cheng et al. 2026) section 3.2 (``a_k = prod_{i<=k} c_i``).
    """
    c = np.asarray(view.confidences, dtype=np.float64)
    if c.ndim != 2:
        raise InvalidArgumentError(f"confidences: expected shape (R, draft_len), got {c.shape}")
    if c.shape[1] > gamma:
        raise InvalidArgumentError(f"confidences: {c.shape[1]} positions per request, more than gamma={gamma}")
    if c.size and (np.isnan(c).any() or c.min() < 0.0 or c.max() > 1.0):
        raise InvalidArgumentError("confidences: values must lie in [0, 1] (no NaN)")
    return np.cumprod(c, axis=1)


def draft_budget(view: RoundView) -> int:
    """Draft tokens the pass can still hold: ``max_batch_tokens - R - prefill_tokens`` (>= 0).

    Args:
        view: the round.

    Returns:
        Draft tokens.

    Source:
        docs/model.md section 1 step 4 (``B = sum_r (1 + l_r)`` plus prefill tokens).

    Raises:
        InvalidArgumentError: the anchors and prefill alone exceed ``max_batch_tokens``.
    """
    b = int(view.max_batch_tokens) - view.num_requests - int(view.prefill_tokens)
    if b < 0:
        raise InvalidArgumentError(f"max_batch_tokens: {view.max_batch_tokens} is below the "
                         f"{view.num_requests + view.prefill_tokens} anchor and prefill tokens")
    return b


def ranked_candidates(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All candidates ``(r, j)`` of ``a`` (shape (R, L)) in admission order.

    Args:
        a: ``(R, L)`` float64 joint survival.

    Returns:
        ``(rows, cols, values)``, each of shape (R*L,): ``a`` descending, ties by request then
        position (prefix-respecting, as in the prefix scheduler, DSpark Algorithm 1).

    Source:
        DSpark paper (Cheng et al. 2026) Algorithm 1: sort all (r, j) by a_{r,j} descending; the
        order respects prefixes because a_{r,j} never increases with j (section 3.2).
    """
    rows, cols = np.nonzero(np.ones(a.shape, dtype=bool))
    vals = a[rows, cols]
    order = np.lexsort((cols, rows, -vals))
    return rows[order], cols[order], vals[order]


def take_top(a: np.ndarray, n: int) -> tuple[np.ndarray, float]:
    """Admit the first ``n`` candidates of :func:`ranked_candidates` order, never one whose joint
    survival is zero (only drafts with positive probability are candidates), so fewer than ``n``
    may be admitted.

    Args:
        a: ``(R, L)`` float64 joint survival.
        n: candidates wanted (negative counts as 0).

    Returns:
        ``(lengths, sum_a)``: lengths per request, shape (R,), int64 (their sum is the number
        admitted); and the sum of the admitted ``a`` (expected accepted draft tokens, bonus excluded).

    Source:
        DSpark paper (Cheng et al. 2026) section 5.2: the current step admits its top-K
        candidates by cumulative confidence.
    """
    rows, _, vals = ranked_candidates(a)
    n = max(0, min(int(n), int(np.count_nonzero(vals > 0.0))))
    lengths = np.bincount(rows[:n], minlength=a.shape[0]).astype(np.int64)
    return lengths, float(vals[:n].sum())


def expected_rate(view: RoundView, sum_a: float, drafts: int) -> float:
    """Expected tokens per second ``(R + sum_a) / (overhead_s + pass_time(B))``,
    ``B = R + drafts + prefill_tokens``; NaN where the SPS table cannot price B.

    Args:
        view: the round.
        sum_a: expected accepted draft tokens of the admitted candidates (bonus excluded).
        drafts: draft tokens admitted.

    Returns:
        tok/s (tau includes one bonus token per request), or NaN.

    Source:
        DSpark paper (Cheng et al. 2026) Algorithm 1 objective (Theta = tau * SPS(B), with
        drafting as fixed overhead).
    """
    b = view.num_requests + int(drafts) + int(view.prefill_tokens)
    if view.num_requests == 0 or not view.sps.covers(b):
        return float("nan")
    return (view.num_requests + sum_a) / (float(view.draft_overhead_s) + pass_time_s(view, b, drafts))


def pass_time_s(view: RoundView, b: int, drafts: int) -> float:
    """The round's pass time at B tokens: the decode pass when no draft is verified.

    Args:
        view: the round.
        b: token batch B of the pass, tokens.
        drafts: draft tokens verified in it.

    Returns:
        Seconds: ``view.no_draft_pass_s`` when ``drafts == 0`` and it is set, else
        ``view.sps.pass_time_s(b)``.

    Raises:
        InvalidArgumentError: ``b`` outside what the SPS table covers (from
            :meth:`memtp_sim.hardware.SPSTable.pass_time_s`).

    Source:
        docs/model.md section 1 step 4 (a pass over B tokens takes 1 / SPS(B)).
    """
    if drafts == 0 and view.no_draft_pass_s is not None:
        return float(view.no_draft_pass_s)
    return float(view.sps.pass_time_s(b))

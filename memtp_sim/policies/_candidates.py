"""Candidate helpers shared by the confidence-ranked policies (DSpark sync/async, threshold, goodput).

Each request r drafted L positions with conditional confidences ``c[r, k]`` (shape (R, L)); the
joint survival ``a[r, j] = prod_{k<=j} c[r, k]`` is the expected contribution of verifying
position j (DSpark paper section 3.2). Only candidates with ``a > 0`` are ever admitted (Algorithm 1, line 4). Candidate order, shared by all: ``a`` descending, ties by
request index then position (the order of DSpark's Algorithm 1). Because ``a`` never increases
along a row, any leading part of this order is a per-request prefix.
"""

from __future__ import annotations

import numpy as np

from ..errors import InvalidArgumentError
from .base import RoundView

__all__ = ["GAMMA_FIELD", "survival", "draft_budget", "ranked_candidates", "take_top", "expected_rate", "pass_time_s"]

#: pydantic Field arguments of the ``gamma`` (block size) parameter every drafting policy has.
GAMMA_FIELD = dict(ge=1, le=64, description="draft tokens proposed per request per round (block size)")


def survival(view: RoundView, gamma: int) -> np.ndarray:
    """Joint survival ``a[r, j] = prod_{k<=j} c[r, k]`` of the view's confidences.

    Returns:
        float64 array of shape (R, L), L = ``view.confidences.shape[1]`` <= gamma.

    Raises:
        InvalidArgumentError: confidences not 2-D, wider than ``gamma`` (the policy's draft length),
            NaN or outside [0, 1].

    Source: DSpark paper section 3.2 (``a_k = prod_{i<=k} c_i``).
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

    Returns:
        ``(rows, cols, values)``, each of shape (R*L,): ``a`` descending, ties by request then
        position (prefix-respecting, as in the prefix scheduler, DSpark Algorithm 1).
    """
    rows, cols = np.nonzero(np.ones(a.shape, dtype=bool))
    vals = a[rows, cols]
    order = np.lexsort((cols, rows, -vals))
    return rows[order], cols[order], vals[order]


def take_top(a: np.ndarray, n: int) -> tuple[np.ndarray, float]:
    """Admit the first ``n`` candidates of :func:`ranked_candidates` order, never one whose joint
    survival is zero (DSpark Algorithm 1, line 4: only drafts with positive probability are
    candidates), so fewer than ``n`` may be admitted.

    Returns:
        ``(lengths, sum_a)``: lengths per request, shape (R,), int64 (their sum is the number
        admitted); and the sum of the admitted ``a`` (expected accepted draft tokens, bonus excluded).
    """
    rows, _, vals = ranked_candidates(a)
    n = max(0, min(int(n), int(np.count_nonzero(vals > 0.0))))
    lengths = np.bincount(rows[:n], minlength=a.shape[0]).astype(np.int64)
    return lengths, float(vals[:n].sum())


def expected_rate(view: RoundView, sum_a: float, drafts: int) -> float:
    """Expected tokens per second ``(R + sum_a) / (overhead_s + pass_time(B))``,
    ``B = R + drafts + prefill_tokens``; NaN where the SPS table cannot price B.

    Source: DSpark Algorithm 1 objective (Theta = tau * SPS(B), with drafting as fixed overhead).
    """
    b = view.num_requests + int(drafts) + int(view.prefill_tokens)
    if view.num_requests == 0 or not view.sps.covers(b):
        return float("nan")
    return (view.num_requests + sum_a) / (float(view.draft_overhead_s) + pass_time_s(view, b, drafts))


def pass_time_s(view: RoundView, b: int, drafts: int) -> float:
    """The round's pass time at B tokens: the decode pass when no draft is verified."""
    if drafts == 0 and view.no_draft_pass_s is not None:
        return float(view.no_draft_pass_s)
    return float(view.sps.pass_time_s(b))

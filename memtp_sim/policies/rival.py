"""Rival verification-length policies: DSpark's asynchronous production scheduler, a static
confidence threshold, and SmartSpec-style goodput-optimal uniform k.

All three draft ``gamma`` tokens per request and read the conditional confidences
``c[r, k]`` (shape (R, gamma)) of :class:`~memtp_sim.policies.base.RoundView`; the joint survival
``a[r, j] = prod_{k<=j} c[r, k]`` is the expected contribution of verifying position j
(DSpark paper section 3.2). Every plan satisfies ``0 <= lengths[r] <= gamma`` and
``R + sum(lengths) + prefill_tokens <= max_batch_tokens``.

Candidate order, shared by all three: ``a`` descending, ties by request index then position
(the order of :func:`~memtp_sim.scheduling.hardware_aware_prefix_scheduler`). Because ``a`` never
increases along a row, any leading part of this order is a per-request prefix.
"""

from __future__ import annotations

from collections import deque

import numpy as np
from pydantic import Field

from ..scheduling import hardware_aware_prefix_scheduler
from .base import Policy, PolicyParams, RoundPlan, RoundView
from .registry import register

__all__ = ["DSparkAsyncPolicy", "ThresholdPolicy", "GoodputPolicy"]

_GAMMA_FIELD = dict(ge=1, le=64, description="draft tokens proposed per request per round (block size)")


# ------------------------------------------------------------------------------------ helpers
def _survival(view: RoundView, gamma: int) -> np.ndarray:
    """Joint survival ``a[r, j] = prod_{k<=j} c[r, k]`` of the view's confidences.

    Returns:
        float64 array of shape (R, L), L = ``view.confidences.shape[1]`` <= gamma.

    Raises:
        ValueError: confidences not 2-D, wider than ``gamma`` (the policy's draft length),
            NaN or outside [0, 1].

    Source: DSpark paper section 3.2 (``a_k = prod_{i<=k} c_i``).
    """
    c = np.asarray(view.confidences, dtype=np.float64)
    if c.ndim != 2:
        raise ValueError(f"confidences: expected shape (R, draft_len), got {c.shape}")
    if c.shape[1] > gamma:
        raise ValueError(f"confidences: {c.shape[1]} positions per request, more than gamma={gamma}")
    if c.size and (np.isnan(c).any() or c.min() < 0.0 or c.max() > 1.0):
        raise ValueError("confidences: values must lie in [0, 1] (no NaN)")
    return np.cumprod(c, axis=1)


def _budget(view: RoundView) -> int:
    """Draft tokens the pass can still hold: ``max_batch_tokens - R - prefill_tokens`` (>= 0).

    Raises:
        ValueError: the anchors and prefill alone exceed ``max_batch_tokens``.
    """
    b = int(view.max_batch_tokens) - view.num_requests - int(view.prefill_tokens)
    if b < 0:
        raise ValueError(f"max_batch_tokens: {view.max_batch_tokens} is below the "
                         f"{view.num_requests + view.prefill_tokens} anchor and prefill tokens")
    return b


def _ranked(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All candidates ``(r, j)`` of ``a`` (shape (R, L)) in admission order.

    Returns:
        ``(rows, cols, values)``, each of shape (R*L,): ``a`` descending, ties by request then
        position (prefix-respecting, as in the prefix scheduler, DSpark Algorithm 1).
    """
    rows, cols = np.nonzero(np.ones(a.shape, dtype=bool))
    vals = a[rows, cols]
    order = np.lexsort((cols, rows, -vals))
    return rows[order], cols[order], vals[order]


def _take_top(a: np.ndarray, n: int) -> tuple[np.ndarray, float]:
    """Admit the first ``n`` candidates of :func:`_ranked` order.

    Returns:
        ``(lengths, sum_a)``: lengths per request, shape (R,), int64; and the sum of the
        admitted ``a`` (expected accepted draft tokens, bonus excluded).
    """
    rows, _, vals = _ranked(a)
    n = max(0, min(int(n), rows.size))
    lengths = np.bincount(rows[:n], minlength=a.shape[0]).astype(np.int64)
    return lengths, float(vals[:n].sum())


def _rate(view: RoundView, sum_a: float, drafts: int) -> float:
    """Expected tokens per second ``(R + sum_a) / (overhead_s + pass_time(B))``,
    ``B = R + drafts + prefill_tokens``; NaN where the SPS table cannot price B.

    Source: DSpark Algorithm 1 objective (Theta = tau * SPS(B), with drafting as fixed overhead).
    """
    b = view.num_requests + int(drafts) + int(view.prefill_tokens)
    if view.num_requests == 0 or not view.sps.covers(b):
        return float("nan")
    return (view.num_requests + sum_a) / (float(view.draft_overhead_s) + float(view.sps.pass_time_s(b)))


# ------------------------------------------------------------------------------ dspark_async
class DSparkAsyncParams(PolicyParams):
    gamma: int = Field(7, **_GAMMA_FIELD)
    lag_rounds: int = Field(2, ge=0, le=1024,
                            description="engine rounds between computing the capacity K and using it")


@register("dspark_async")
class DSparkAsyncPolicy(Policy):
    """DSpark's asynchronous production scheduler (paper section 5.2).

    Each round t:

    1. run the *global* search (Algorithm 1 without early stop) on round t's confidences, with
       this round's prefill, token cap and drafting overhead, and remember its capacity
       ``K_t`` = number of admitted candidates (draft tokens, bonus excluded);
    2. take the capacity of ``lag_rounds`` rounds earlier, ``K_{t-lag}`` (the engine must know
       the next batch size before the current step ends: zero-overhead scheduling);
    3. admit round t's top ``min(K_{t-lag}, R*gamma, budget)`` candidates ranked by the current
       ``a[r, j]`` (ties by request then position), ``budget = max_batch_tokens - R - prefill``.

    Rounds are identified by ``view.round_index``: the capacity used at round t is the latest
    one computed at a round ``<= t - lag_rounds``. A round in which the policy was not consulted
    (no decoding requests, hence no confidences) leaves no capacity, so the one before it stays
    in force. **Warm-up:** while no capacity that old exists (the first ``lag_rounds`` rounds of
    a run), the current round's own ``K_t`` is used, i.e. the plan equals the global search.
    A ``round_index`` lower than the previous call's starts a new run (history cleared).

    The policy is stateful: use one instance per run.

    ``RoundPlan.theta`` is the expected rate of the admitted set,
    ``(R + sum admitted a) / (draft_overhead_s + pass_time(B))`` (tokens/s; NaN if the table
    cannot price B); ``theta_global`` is the global search's best rate this round.
    ``extra`` holds ``capacity_now`` (K_t) and ``capacity_used`` (the lagged K, before capping).

    Raises (from :meth:`plan`):
        ValueError: confidences not (R, <=gamma) in [0, 1]; anchors plus prefill above the cap;
            an SPS table that does not cover the search (see the prefix scheduler).

    Source: Cheng et al. 2026 (DSpark), section 5.2 (production scheduler: capacity from a global
    search over confidences of two steps earlier, top-K of the current step) and Algorithm 1.
    """

    Params = DSparkAsyncParams

    def __init__(self, params: DSparkAsyncParams) -> None:
        super().__init__(params)
        self._history: deque[tuple[int, int]] = deque()  # (round_index, K), increasing index

    @property
    def draft_len(self) -> int:
        return self.params.gamma

    def reset(self) -> None:
        """Forget the capacity history (start of a new run)."""
        self._history.clear()

    def _lagged_capacity(self, t: int) -> int | None:
        """Latest remembered K from a round ``<= t - lag`` (None during warm-up); drops entries
        older than it, which later rounds can no longer need."""
        limit = t - self.params.lag_rounds
        found = None
        while self._history and self._history[0][0] <= limit:
            if len(self._history) >= 2 and self._history[1][0] <= limit:
                self._history.popleft()
                continue
            found = self._history[0][1]
            break
        return found

    def plan(self, view: RoundView) -> RoundPlan:
        gamma = self.params.gamma
        a = _survival(view, gamma)
        budget = _budget(view)
        t = int(view.round_index)
        if self._history and t < self._history[-1][0]:
            self.reset()

        res = hardware_aware_prefix_scheduler(
            np.asarray(view.confidences, dtype=np.float64),
            view.sps,
            early_stop=False,
            prefill_tokens=view.prefill_tokens,
            max_batch_tokens=view.max_batch_tokens,
            overhead_s=view.draft_overhead_s,
        )
        k_now = res.num_candidates

        k_lag = self._lagged_capacity(t) if self.params.lag_rounds > 0 else k_now
        if k_lag is None:  # warm-up: no capacity lag_rounds old yet -> this round's own
            k_lag = k_now
        if self._history and self._history[-1][0] == t:
            self._history[-1] = (t, k_now)
        else:
            self._history.append((t, k_now))

        n = min(k_lag, a.size, budget)
        lengths, sum_a = _take_top(a, n)
        return RoundPlan(lengths, theta=_rate(view, sum_a, n), theta_global=float(res.theta_global),
                         extra={"capacity_now": int(k_now), "capacity_used": int(k_lag)})


# --------------------------------------------------------------------------------- threshold
class ThresholdParams(PolicyParams):
    gamma: int = Field(7, **_GAMMA_FIELD)
    threshold: float = Field(0.5, ge=0.0, le=1.0,
                             description="verify position j while the joint survival a[r, j] >= threshold")


@register("threshold")
class ThresholdPolicy(Policy):
    """Static confidence threshold: verify request r's positions while ``a[r, j] >= threshold``.

    ``l_r = #{j : a[r, j] >= threshold}`` (a prefix, since ``a`` never increases along a row);
    threshold 0 verifies the whole block, a threshold above every ``a`` verifies nothing. If the
    selected drafts overflow ``budget = max_batch_tokens - R - prefill_tokens``, the lowest-``a``
    candidates are dropped first (ties: the later request / position goes first), which keeps
    every request's selection a prefix.

    ``RoundPlan.theta``: expected rate of the chosen set (tokens/s, see DSpark Algorithm 1's
    objective; NaN if the table cannot price B).

    Raises (from :meth:`plan`):
        ValueError: confidences not (R, <=gamma) in [0, 1]; anchors plus prefill above the cap.

    Source: DSpark paper Fig. 5 (static threshold sweep, offline) and section 3.2 (``a_k``).
    """

    Params = ThresholdParams

    @property
    def draft_len(self) -> int:
        return self.params.gamma

    def plan(self, view: RoundView) -> RoundPlan:
        a = _survival(view, self.params.gamma)
        budget = _budget(view)
        selected = int((a >= self.params.threshold).sum())
        # Candidates above the threshold are exactly the first `selected` of the ranked order
        # (everything above t sorts before everything below), so trimming = taking fewer.
        n = min(selected, budget)
        lengths, sum_a = _take_top(a, n)
        return RoundPlan(lengths, theta=_rate(view, sum_a, n),
                         extra={"selected": selected, "trimmed": selected - n})


# ----------------------------------------------------------------------------------- goodput
class GoodputParams(PolicyParams):
    gamma: int = Field(7, **_GAMMA_FIELD)


@register("goodput")
class GoodputPolicy(Policy):
    """SmartSpec-style goodput: one uniform verify length k for the whole batch each round.

    For ``k = 0..L`` (L = drafted positions, = gamma in the engine)::

        tau_k  = R + sum_r sum_{j<=k} a[r, j]          expected tokens (one bonus per request)
        B_k    = R + R*k + prefill_tokens              tokens in the verify pass
        rate_k = tau_k / (draft_overhead_s + pass_time_s(B_k))     tokens per second

    k with ``B_k > max_batch_tokens`` are skipped; the argmax of ``rate_k`` is chosen, ties (within
    a relative 1e-12, i.e. floating-point noise) going to the smaller k. ``k = 0`` is always
    feasible. ``RoundPlan.theta = rate_k``; ``extra['k']`` is the chosen k.

    Raises (from :meth:`plan`):
        ValueError: confidences not (R, <=gamma) in [0, 1]; anchors plus prefill above the cap;
            the SPS table cannot price a feasible ``B_k`` (outside its measured range).

    Source: Liu et al. 2024, *Optimizing speculative decoding for serving LLMs using goodput*
    (SmartSpec): goodput = expected accepted tokens per unit time, one proposal length per batch;
    here priced by the measured SPS(B) table (docs/model.md section 1 step 4).
    """

    Params = GoodputParams

    @property
    def draft_len(self) -> int:
        return self.params.gamma

    def plan(self, view: RoundView) -> RoundPlan:
        a = _survival(view, self.params.gamma)
        _budget(view)  # validates anchors + prefill <= cap
        num_req = view.num_requests
        if num_req == 0:
            return RoundPlan(np.zeros(0, dtype=np.int64), extra={"k": 0})
        tau = num_req + np.concatenate(([0.0], np.cumsum(a.sum(axis=0))))  # tau_k, k = 0..L
        best_k, best_rate = 0, -np.inf
        for k in range(a.shape[1] + 1):
            b = num_req * (1 + k) + int(view.prefill_tokens)
            if b > view.max_batch_tokens:
                break  # B_k grows with k
            if not view.sps.covers(b):
                raise ValueError(f"sps: no value for B={b}; measured range "
                                 f"{view.sps.min_batch_tokens}..{view.sps.max_batch_tokens}")
            rate = float(tau[k]) / (float(view.draft_overhead_s) + float(view.sps.pass_time_s(b)))
            if rate > best_rate * (1.0 + 1e-12):  # rates > 0; -inf * (1 + eps) = -inf
                best_k, best_rate = k, rate
        lengths = np.full(num_req, best_k, dtype=np.int64)
        return RoundPlan(lengths, theta=best_rate, extra={"k": best_k})

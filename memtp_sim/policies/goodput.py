"""SmartSpec-style goodput policy: one uniform verify length for the whole batch each round."""

from __future__ import annotations

import numpy as np
from pydantic import Field

from ..errors import InvalidArgumentError
from ._candidates import (FALLBACK_FIELD, GAMMA_FIELD, PROBE_FIELD, FallbackGate, FallbackGated, draft_budget,
                          pass_time_s, plain_rate, survival)
from .base import Policy, PolicyParams, RoundPlan, RoundView
from .registry import register

__all__ = ["GoodputPolicy"]


class GoodputParams(PolicyParams):
    """Parameters of ``goodput``.

    Attributes:
        gamma: draft tokens proposed per request per round (block size), 1..64.
        fallback: decode plainly while drafting does not pay (FallbackGate).
        probe_every: while falling back, draft again every this many rounds.
    """

    gamma: int = Field(7, **GAMMA_FIELD)
    fallback: bool = Field(True, **FALLBACK_FIELD)
    probe_every: int = Field(16, **PROBE_FIELD)


@register("goodput")
class GoodputPolicy(FallbackGated, Policy):
    """SmartSpec-style goodput: one uniform verify length k for the whole batch each round.

    For ``k = 0..L`` (L = drafted positions, = gamma in the engine)::

        tau_k  = R + sum_r sum_{j<=k} a[r, j]          expected tokens (one bonus per request)
        B_k    = R + R*k + prefill_tokens              tokens in the verify pass
        rate_k = tau_k / (draft_overhead_s + pass_time_s(B_k))     tokens per second

    k with ``B_k > max_batch_tokens`` are skipped; the argmax of ``rate_k`` is chosen, ties (within
    a relative 1e-12, i.e. floating-point noise) going to the smaller k. ``k = 0`` is always
    feasible. ``RoundPlan.theta = rate_k``; ``extra['k']`` is the chosen k.

    Raises (from :meth:`plan`):
        InvalidArgumentError: confidences not (R, <=gamma) in [0, 1]; anchors plus prefill above the cap;
            the SPS table cannot price a feasible ``B_k`` (outside its measured range).

    Source: Liu et al. 2024, *Optimizing speculative decoding for serving LLMs using goodput*
    (SmartSpec): goodput = expected accepted tokens per unit time, one proposal length per batch;
    here priced by the measured SPS(B) table (docs/model.md section 1 step 4).
    """

    Params = GoodputParams
    plans_in_critical_path = True

    def __init__(self, params: GoodputParams) -> None:
        super().__init__(params)
        self._gate = FallbackGate(params.fallback, params.probe_every)


    @property
    def draft_len(self) -> int:
        """``gamma``: draft tokens proposed per request per round."""
        return self.params.gamma

    def plan(self, view: RoundView) -> RoundPlan:
        """Pick the uniform k with the highest expected rate (class docstring).

        Args:
            view: the round (confidences ``(R, L)``, SPS table, prefill, token cap, drafting
                time in s).

        Returns:
            ``(R,)`` lengths all equal to k; ``theta`` = rate_k (tok/s); ``extra["k"]``.

        Raises:
            InvalidArgumentError: confidences not (R, <=gamma) in [0, 1]; anchors plus prefill
                above the cap; the SPS table cannot price a feasible ``B_k``.

        Source:
            Liu et al. 2024 (SmartSpec): goodput with one proposal length per batch.
        """
        a = survival(view, self.params.gamma)
        draft_budget(view)  # validates anchors + prefill <= cap
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
                raise InvalidArgumentError(f"sps: no value for B={b}; measured range "
                                 f"{view.sps.min_batch_tokens}..{view.sps.max_batch_tokens}")
            rate = float(tau[k]) / (float(view.draft_overhead_s) + pass_time_s(view, b, num_req * k))
            if rate > best_rate * (1.0 + 1e-12):  # rates > 0; -inf * (1 + eps) = -inf
                best_k, best_rate = k, rate
        lengths = np.full(num_req, best_k, dtype=np.int64)
        self._gate.report(int(view.round_index), best_rate, plain_rate(view))
        return RoundPlan(lengths, theta=best_rate, extra={"k": best_k})

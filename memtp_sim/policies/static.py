"""Fixed-length policies: no speculation, static k (MTP-k) and MTP-1."""

from __future__ import annotations

import numpy as np
from pydantic import Field

from .base import Policy, PolicyParams, RoundPlan, RoundView, fit_to_budget
from .registry import register

__all__ = ["NoSpecPolicy", "StaticPolicy", "Mtp1Policy"]


@register("no_spec")
class NoSpecPolicy(Policy):
    """Plain autoregressive decoding: one token per request per round, no drafter."""

    draft_len = 0

    def plan(self, view: RoundView) -> RoundPlan:
        return RoundPlan(np.zeros(view.num_requests, dtype=np.int64))


class StaticParams(PolicyParams):
    k: int = Field(5, ge=1, le=64, description="draft tokens verified per request per round")


@register("static")
class StaticPolicy(Policy):
    """Verify all k drafted tokens of every request (MTP-k / fixed-length speculation).

    If the token budget cannot hold every request's k tokens, the longest are trimmed first
    (anchors and prefill come first in the budget).
    """

    Params = StaticParams

    @property
    def draft_len(self) -> int:
        return self.params.k

    def plan(self, view: RoundView) -> RoundPlan:
        # verify k, or all that was drafted when the drafter drafted fewer (e.g. a MEMTP depth < k)
        lengths = np.full(view.num_requests, min(self.params.k, view.draft_len), dtype=np.int64)
        budget = view.max_batch_tokens - view.num_requests - view.prefill_tokens
        return RoundPlan(fit_to_budget(lengths, budget))


class Mtp1Params(PolicyParams):
    pass


@register("mtp1")
class Mtp1Policy(StaticPolicy):
    """MTP-1: static verification of one draft token (the paper's production baseline)."""

    Params = Mtp1Params

    @property
    def draft_len(self) -> int:
        return 1

    def plan(self, view: RoundView) -> RoundPlan:
        lengths = np.full(view.num_requests, min(1, view.draft_len), dtype=np.int64)
        budget = view.max_batch_tokens - view.num_requests - view.prefill_tokens
        return RoundPlan(fit_to_budget(lengths, budget))

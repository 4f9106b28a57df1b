"""Built-in policies: no speculation, static k (MTP-k), DSpark's prefix scheduler."""

from __future__ import annotations

import numpy as np
from pydantic import Field

from ..scheduling import hardware_aware_prefix_scheduler
from .base import Policy, PolicyParams, RoundPlan, RoundView, fit_to_budget
from .registry import register

__all__ = ["NoSpecPolicy", "StaticPolicy", "Mtp1Policy", "DSparkPolicy"]


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
        lengths = np.full(view.num_requests, self.params.k, dtype=np.int64)
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
        lengths = np.ones(view.num_requests, dtype=np.int64)
        budget = view.max_batch_tokens - view.num_requests - view.prefill_tokens
        return RoundPlan(fit_to_budget(lengths, budget))


class DSparkParams(PolicyParams):
    gamma: int = Field(7, ge=1, le=64, description="draft tokens proposed per request (block size)")
    early_stop: bool = Field(True, description="stop at the first non-improving candidate (lossless)")


@register("dspark")
class DSparkPolicy(Policy):
    """DSpark's hardware-aware prefix scheduler (paper Algorithm 1), synchronous.

    Drafts ``gamma`` tokens per request, then verifies the prefix set that maximises the expected
    token rate, counting this round's drafting time as fixed overhead of the step.
    """

    Params = DSparkParams

    @property
    def draft_len(self) -> int:
        return self.params.gamma

    def plan(self, view: RoundView) -> RoundPlan:
        res = hardware_aware_prefix_scheduler(
            view.confidences,
            view.sps,
            early_stop=self.params.early_stop,
            prefill_tokens=view.prefill_tokens,
            max_batch_tokens=view.max_batch_tokens,
            overhead_s=view.draft_overhead_s,
        )
        return RoundPlan(res.lengths, theta=res.theta, theta_global=res.theta_global)

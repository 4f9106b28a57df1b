"""Fixed-length policies: no speculation, static k (MTP-k) and MTP-1."""

from __future__ import annotations

import numpy as np
from pydantic import Field

from .base import Policy, PolicyParams, RoundPlan, RoundView, fit_to_budget
from .registry import register

__all__ = ["NoSpecPolicy", "StaticPolicy", "Mtp1Policy"]


@register("no_spec")
class NoSpecPolicy(Policy):
    """Plain autoregressive decoding: one token per request per round, no drafter.

    Source:
        docs/model.md section 1 step 5 with l_r = 0 (only the target's own token).
    """

    draft_len = 0

    def plan(self, view: RoundView) -> RoundPlan:
        """Verify nothing.

        Args:
            view: the round.

        Returns:
            ``(R,)`` int64 zeros.
        """
        return RoundPlan(np.zeros(view.num_requests, dtype=np.int64))


class StaticParams(PolicyParams):
    """Parameters of ``static``.

    Attributes:
        k: draft tokens verified per request per round, 1..64.
    """

    k: int = Field(5, ge=1, le=64, description="draft tokens verified per request per round")


@register("static")
class StaticPolicy(Policy):
    """Verify all k drafted tokens of every request (MTP-k / fixed-length speculation).

    If the token budget cannot hold every request's k tokens, the longest are trimmed first
    (anchors and prefill come first in the budget).

    Source:
        DESIGN.md section 3 (static-k / MTP-k baseline); with i.i.d. acceptance alpha its expected
        tokens per round are (1 - alpha^(k+1)) / (1 - alpha) (Leviathan, Kalman, Matias 2023, ICML).
    """

    Params = StaticParams

    @property
    def draft_len(self) -> int:
        """``k``: draft tokens proposed per request per round."""
        return self.params.k

    def plan(self, view: RoundView) -> RoundPlan:
        """Verify ``min(k, view.draft_len)`` per request, trimmed to the token budget.

        Args:
            view: the round.

        Returns:
            ``(R,)`` int64 lengths (see :func:`memtp_sim.policies.base.fit_to_budget`).
        """
        # verify k, or all that was drafted when the drafter drafted fewer (e.g. a MEMTP depth < k)
        return _every_request(view, min(self.params.k, view.draft_len))


class Mtp1Params(PolicyParams):
    """``mtp1`` takes no parameters."""

    pass


@register("mtp1")
class Mtp1Policy(StaticPolicy):
    """MTP-1: static verification of one draft token (the paper's production baseline).

    Source:
        DSpark paper (Cheng et al. 2026) section 5.4 (DSpark-5 against MTP-1 in production) and
        Fig. 8 (MTP-1 verifies a static 2 tokens per request, bonus included).
    """

    Params = Mtp1Params

    @property
    def draft_len(self) -> int:
        """1: one draft token per request per round."""
        return 1

    def plan(self, view: RoundView) -> RoundPlan:
        """Verify one draft token per request (0 when none was drafted), within the token budget.

        Args:
            view: the round.

        Returns:
            ``(R,)`` int64 lengths in {0, 1}.
        """
        return _every_request(view, min(1, view.draft_len))


def _every_request(view: RoundView, k: int) -> RoundPlan:
    """``k`` drafts verified per request, trimmed to the token budget (:func:`fit_to_budget`; its
    sum is known here, so a plan that fits skips it)."""
    num = view.num_requests
    lengths = np.empty(num, dtype=np.int64)
    lengths.fill(k)  # np.full's wrapper costs more than the array at a round's sizes
    budget = view.max_batch_tokens - num - view.prefill_tokens
    return RoundPlan(lengths if num * k <= budget else fit_to_budget(lengths, budget))

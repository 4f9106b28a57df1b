"""Static confidence threshold policy (DSpark paper Fig. 5): verify while the joint survival clears a bar."""

from __future__ import annotations

from pydantic import Field

from ._candidates import GAMMA_FIELD, draft_budget, expected_rate, survival, take_top
from .base import Policy, PolicyParams, RoundPlan, RoundView
from .registry import register

__all__ = ["ThresholdPolicy"]


class ThresholdParams(PolicyParams):
    """Parameters of ``threshold``.

    Attributes:
        gamma: draft tokens proposed per request per round (block size), 1..64.
        threshold: verify position j while the joint survival a[r, j] >= threshold, in [0, 1].
    """

    gamma: int = Field(7, **GAMMA_FIELD)
    threshold: float = Field(0.5, ge=0.0, le=1.0,
                             description="verify position j while the joint survival a[r, j] >= threshold")


@register("threshold")
class ThresholdPolicy(Policy):
    """Static confidence threshold: verify request r's positions while ``a[r, j] >= threshold``.

    ``l_r = #{j : a[r, j] >= threshold}`` (a prefix, since ``a`` never increases along a row);
    threshold 0 verifies every draft the head gives a positive survival (the whole block unless
    some ``a`` is exactly 0: a zero-survival draft is never a candidate), a threshold above every
    ``a`` verifies nothing. If the
    selected drafts overflow ``budget = max_batch_tokens - R - prefill_tokens``, the lowest-``a``
    candidates are dropped first (ties: the later request / position goes first), which keeps
    every request's selection a prefix.

    ``RoundPlan.theta``: expected rate of the chosen set (tokens/s, see DSpark Algorithm 1's
    objective; NaN if the table cannot price B).

    Raises (from :meth:`plan`):
        InvalidArgumentError: confidences not (R, <=gamma) in [0, 1]; anchors plus prefill above the cap.

    Source: DSpark paper Fig. 5 (static threshold sweep, offline) and section 3.2 (``a_k``).
    """

    Params = ThresholdParams
    plans_in_critical_path = True

    @property
    def draft_len(self) -> int:
        """``gamma``: draft tokens proposed per request per round."""
        return self.params.gamma

    def plan(self, view: RoundView) -> RoundPlan:
        """Verify each request's prefix with ``a[r, j] >= threshold``, trimmed to the budget.

        Args:
            view: the round.

        Returns:
            The plan: ``(R,)`` int64 lengths, ``theta`` (tok/s), ``extra`` (``selected``,
            ``trimmed`` draft tokens).

        Raises:
            InvalidArgumentError: as listed in the class docstring.

        Source:
            DSpark paper (Cheng et al. 2026) Fig. 5.
        """
        a = survival(view, self.params.gamma)
        budget = draft_budget(view)
        # a zero-survival draft is never a candidate (as in Algorithm 1), even at threshold 0
        selected = int(((a >= self.params.threshold) & (a > 0.0)).sum())
        # Candidates above the threshold are exactly the first `selected` of the ranked order
        # (everything above t sorts before everything below), so trimming = taking fewer.
        n = min(selected, budget)
        lengths, sum_a = take_top(a, n)
        return RoundPlan(lengths, theta=expected_rate(view, sum_a, n),
                         extra={"selected": selected, "trimmed": selected - n})

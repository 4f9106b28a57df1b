"""The policy interface: one decision per engine round.

A policy declares the block it would like drafted (:attr:`Policy.draft_len`); the drafter
(:class:`memtp_sim.drafting.Drafter`, the one owner of the draft length) decides what each round
really drafts, e.g. the MEMTP ensemble's current depth. The engine then calls :meth:`Policy.plan`
with a read-only :class:`RoundView` holding one confidence per drafted position
(``RoundView.draft_len`` wide) and applies the returned :class:`RoundPlan`. Policies never import
the engine.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict

from ..hardware import SPSTable

__all__ = ["RoundView", "RoundPlan", "DraftView", "RoundOutcome", "Policy", "PolicyParams", "fit_to_budget"]


class PolicyParams(BaseModel):
    """Base of every policy's parameter model: unknown keys are errors.

    Frozen, strict and finite (pydantic ``ConfigDict(extra="forbid", frozen=True, strict=True,
    allow_inf_nan=False)``): constructing one with an unknown key, a wrong type or an inf / nan
    float raises ``pydantic.ValidationError``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


@dataclass(frozen=True)
class RoundView:
    """What a policy may look at in one round.

    Attributes:
        confidences: conditional confidences c[r, k] of the drafted positions, shape
            (R, draft_len); R = decoding requests this round.
        sps: the verify-cost table.
        prefill_tokens: prefill tokens already placed in this pass (count toward B).
        max_batch_tokens: cap on B = R + sum(lengths) + prefill_tokens.
        draft_overhead_s: drafting time of this round (spent whatever the plan), seconds.
        round_index: engine round counter (0-based).
        no_draft_pass_s: time of this round's pass if no draft token is verified (a plain decode
            pass, priced by the profile's decode table), seconds; None: the ``sps`` table at
            ``R + prefill_tokens``.

    Source:
        docs/model.md section 1 steps 2-4 (confidences c_k, B = sum_r (1 + l_r) + prefill, pass
        time 1 / SPS(B)).
    """

    confidences: np.ndarray
    sps: SPSTable
    prefill_tokens: int
    max_batch_tokens: int
    draft_overhead_s: float
    round_index: int
    no_draft_pass_s: float | None = None

    @property
    def num_requests(self) -> int:
        """R: decoding requests this round (rows of ``confidences``)."""
        return int(self.confidences.shape[0])

    @property
    def draft_len(self) -> int:
        """Positions the drafter proposed per request this round (the drafter decides it; a plan's
        lengths never exceed it)."""
        return int(self.confidences.shape[1])


@dataclass(frozen=True)
class DraftView:
    """What a policy or a draft-length controller may look at before the round drafts.

    Attributes:
        num_requests: R, decoding requests this round.
        prefill_tokens: prefill tokens already placed in this pass.
        max_batch_tokens: cap on B.
        max_draft_len: positions the drafter can draft per request this round (its depth).
        context_tokens: ``(R,)`` int, tokens in each decoding request's KV cache.
        sps: the verify-cost table at this round's context.
        no_draft_pass_s: time of the pass if nothing is drafted (a plain decode pass), seconds.
        draft_time_s: ``draft_time_s(k)``: drafting time if every request drafts k positions, s.
        fixed_s: time of the round besides drafting and the pass (host overhead), seconds.
        round_index: engine round counter.
    """

    num_requests: int
    prefill_tokens: int
    max_batch_tokens: int
    max_draft_len: int
    context_tokens: np.ndarray
    sps: SPSTable
    no_draft_pass_s: float
    draft_time_s: Callable[[int], float]
    fixed_s: float = 0.0
    round_index: int = 0

    def expected_rate(self, k: int, expected_accepted: float) -> float:
        """Expected tok/s if every request drafts (and verifies) ``k`` positions and accepts
        ``expected_accepted`` of them on average (bonus token counted): Leviathan et al. 2023's
        tokens per round over the round's time (drafting + pass + fixed)."""
        r = self.num_requests
        if k <= 0:
            return r / (self.no_draft_pass_s + self.fixed_s)
        b = r * (1 + k) + self.prefill_tokens
        if b > self.max_batch_tokens or not self.sps.covers(b):
            return float("nan")
        return r * (1.0 + expected_accepted) / (self.draft_time_s(k) + float(self.sps.pass_time_s(b)) + self.fixed_s)


@dataclass(frozen=True)
class RoundOutcome:
    """What a round's verification found (fed back to stateful policies and controllers).

    Attributes:
        drafted: ``(R,)`` positions drafted per request.
        verified: ``(R,)`` draft tokens verified per request.
        accepted: ``(R,)`` draft tokens accepted per request (leading run within the verified).
        accepted_by_position: ``(L,)`` requests whose position j was verified and accepted.
        tested_by_position: ``(L,)`` requests whose position j was verified after positions
            1..j-1 were accepted (so ``accepted / tested`` is position j's conditional acceptance).
    """

    drafted: np.ndarray
    verified: np.ndarray
    accepted: np.ndarray
    accepted_by_position: np.ndarray
    tested_by_position: np.ndarray


@dataclass(frozen=True)
class RoundPlan:
    """A policy's decision: verify ``lengths[r]`` draft tokens of request r (bonus excluded).

    ``lengths`` has shape (R,), ints in [0, draft_len]; ``R + lengths.sum() + prefill_tokens``
    never exceeds ``max_batch_tokens``. ``theta``/``theta_global`` are the scheduler's expected
    token rates, tok/s (NaN for policies that do not compute them).

    Attributes:
        lengths: ``(R,)`` int verify lengths, draft tokens (bonus excluded).
        theta: expected rate of the chosen plan, tok/s.
        theta_global: best expected rate of a global search over the same candidates, tok/s.
        extra: policy-specific values for the round log.

    Source:
        The per-request verify length l_r of DSpark paper (Cheng et al. 2026) Algorithm 1
        (docs/model.md section 1 step 3); a plain decision dataclass, as vLLM v1's
        ``SchedulerOutput`` (``vllm/v1/core/sched/output.py``).
    """

    lengths: np.ndarray
    theta: float = float("nan")
    theta_global: float = float("nan")
    extra: dict[str, Any] = field(default_factory=dict)


class Policy(ABC):
    """Base class of verification-length policies.

    Subclasses set ``name`` (the YAML name), ``Params`` (a :class:`PolicyParams` model) and
    implement :meth:`plan`. ``draft_len`` is the block the policy asks the drafter for, tokens per
    request per round (0 = no speculation: no drafter cost, no confidences); the drafter may draft
    fewer (``RoundView.draft_len``), and a plan never verifies more than was drafted.

    Args:
        params: the policy's validated ``Params``.

    Source:
        vLLM v1's scheduler interface (``schedule()`` returns a decision the engine applies);
        docs/model.md section 1 step 3 (a policy picks each request's l_r in 0..gamma).
    """

    name: ClassVar[str]
    Params: ClassVar[type[PolicyParams]] = PolicyParams
    #: True for policies that rank confidences on the CPU between drafting and verifying (the
    #: profile's planner overhead is then paid each round); False for fixed lengths and for the
    #: asynchronous scheduler, whose planning overlaps the pass.
    plans_in_critical_path: ClassVar[bool] = False

    def __init__(self, params: PolicyParams) -> None:
        self.params = params

    def draft_lengths(self, view: DraftView) -> int:
        """Positions every request should draft this round, decided before drafting (0: draft
        nothing and decode plainly). Called each round; the default drafts all the drafter offers."""
        return view.max_draft_len

    def plain_rounds_ahead(self, round_index: int) -> int:
        """Rounds from ``round_index`` on for which :meth:`draft_lengths` would return 0 whatever
        the view (default: none known). The engine may then run them as one block of plain rounds
        without asking, and calls :meth:`skip_plain_rounds` instead.

        Args:
            round_index: the engine round about to start.

        Returns:
            A count of rounds, >= 0.
        """
        return 0

    def skip_plain_rounds(self, round_index: int, rounds: int) -> None:
        """Leave the policy as if :meth:`draft_lengths` had been asked for ``rounds`` rounds from
        ``round_index`` on and answered 0 each time (at most :meth:`plain_rounds_ahead` of them)."""

    def observe(self, outcome: RoundOutcome) -> None:
        """Called after each round that verified drafts (stateful policies learn from it)."""

    @property
    @abstractmethod
    def draft_len(self) -> int:
        """Draft tokens proposed per request per round (0 = no speculation)."""

    @abstractmethod
    def plan(self, view: RoundView) -> RoundPlan:
        """Choose this round's verify lengths.

        Args:
            view: the round's read-only inputs.

        Returns:
            The plan: ``(R,)`` lengths in ``0..view.draft_len`` within ``max_batch_tokens``.
        """

    def plan_round(self, confidences: np.ndarray, sps: SPSTable, prefill_tokens: int, max_batch_tokens: int,
                   draft_overhead_s: float, round_index: int,
                   no_draft_pass_s: float | None) -> tuple[np.ndarray, float, float]:
        """:meth:`plan` on the engine's own round, given as the :class:`RoundView` fields (the
        engine built them: a float64 ``(R, L)`` array and numbers of the right types).

        The default builds the view and calls :meth:`plan`; a policy whose plan is one compiled
        call may override it to skip the view, with the same result (DSpark's scan).

        Returns:
            ``(lengths, theta, theta_global)`` of the plan.
        """
        plan = self.plan(RoundView(confidences=confidences, sps=sps, prefill_tokens=prefill_tokens,
                                   max_batch_tokens=max_batch_tokens, draft_overhead_s=draft_overhead_s,
                                   round_index=round_index, no_draft_pass_s=no_draft_pass_s))
        return plan.lengths, plan.theta, plan.theta_global

    def describe(self, exclude: tuple[str, ...] = ()) -> str:
        """Short label for tables and plots, e.g. ``static(k=5)``; parameters in ``exclude`` are
        left out (e.g. ``gamma`` when another owner, the MEMTP ensemble, sets it).

        Args:
            exclude: parameter names to leave out.

        Returns:
            ``name(k=v, ...)``, or just ``name`` without parameters.
        """
        args = ", ".join(f"{k}={v}" for k, v in self.params.model_dump().items() if k not in exclude)
        return f"{self.name}({args})" if args else self.name


def fit_to_budget(lengths: np.ndarray, budget: int) -> np.ndarray:
    """Trim ``lengths`` so their sum is <= budget, taking from the longest first.

    Used by policies that pick lengths without looking at cost (static k): speculative tokens
    have the lowest priority in the token budget, after anchors and prefill.

    Args:
        lengths: ``(R,)`` int verify lengths, draft tokens.
        budget: draft tokens the pass can hold (may be <= 0).

    Returns:
        ``(R,)`` lengths (the input itself when it fits), each ``min(length, cap)`` or
        ``cap + 1``, summing to ``min(sum(lengths), max(budget, 0))``.

    Source:
        Water-filling from the top (the largest cap whose capped sum fits), the leftover tokens
        to the first requests above the cap.
    """
    total = int(lengths.sum())
    if total <= budget:
        return lengths
    if budget <= 0:
        return np.zeros_like(lengths)
    # Water-fill from the top: find the largest cap with sum(min(lengths, cap)) <= budget.
    srt = np.sort(lengths)
    n = srt.size
    csum = np.concatenate(([0], np.cumsum(srt)))
    cap = 0
    for i in range(n):
        # all requests from i on would be capped at srt[i]
        if csum[i] + srt[i] * (n - i) > budget:
            cap_i = (budget - csum[i]) // (n - i)
            cap = int(cap_i)
            break
    out = np.minimum(lengths, cap)
    rest = budget - int(out.sum())
    if rest > 0:
        idx = np.flatnonzero(lengths > cap)[:rest]
        out[idx] += 1
    return out

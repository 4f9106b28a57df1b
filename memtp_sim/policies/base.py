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
from typing import Any, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict

from ..hardware import SPSTable

__all__ = ["RoundView", "RoundPlan", "Policy", "PolicyParams", "fit_to_budget"]


class PolicyParams(BaseModel):
    """Base of every policy's parameter model: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


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
        return int(self.confidences.shape[0])

    @property
    def draft_len(self) -> int:
        """Positions the drafter proposed per request this round (the drafter decides it; a plan's
        lengths never exceed it)."""
        return int(self.confidences.shape[1])


@dataclass(frozen=True)
class RoundPlan:
    """A policy's decision: verify ``lengths[r]`` draft tokens of request r (bonus excluded).

    ``lengths`` has shape (R,), ints in [0, draft_len]; ``R + lengths.sum() + prefill_tokens``
    never exceeds ``max_batch_tokens``. ``theta``/``theta_global`` are the scheduler's expected
    token rates (NaN for policies that do not compute them).
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
    """

    name: ClassVar[str]
    Params: ClassVar[type[PolicyParams]] = PolicyParams
    #: True for policies that rank confidences on the CPU between drafting and verifying (the
    #: profile's planner overhead is then paid each round); False for fixed lengths and for the
    #: asynchronous scheduler, whose planning overlaps the pass.
    plans_in_critical_path: ClassVar[bool] = False

    def __init__(self, params: PolicyParams) -> None:
        self.params = params

    @property
    @abstractmethod
    def draft_len(self) -> int:
        """Draft tokens proposed per request per round."""

    @abstractmethod
    def plan(self, view: RoundView) -> RoundPlan:
        """Choose this round's verify lengths."""

    def describe(self, exclude: tuple[str, ...] = ()) -> str:
        """Short label for tables and plots, e.g. ``static(k=5)``; parameters in ``exclude`` are
        left out (e.g. ``gamma`` when another owner, the MEMTP ensemble, sets it)."""
        args = ", ".join(f"{k}={v}" for k, v in self.params.model_dump().items() if k not in exclude)
        return f"{self.name}({args})" if args else self.name


def fit_to_budget(lengths: np.ndarray, budget: int) -> np.ndarray:
    """Trim ``lengths`` so their sum is <= budget, taking from the longest first.

    Used by policies that pick lengths without looking at cost (static k): speculative tokens
    have the lowest priority in the token budget, after anchors and prefill.
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

"""The drafter: the one owner of "how many positions are drafted this round", of the memory the
drafter holds, and of what drafting costs.

Two parts:

* :class:`DraftSpec` is static and cheap: resolved from a policy and the MEMTP settings without
  building an engine. Config (labels), the engine, export and tuning all ask it for the draft
  block width (``max_draft_len``) and for the policy parameters as a run uses them.
* :class:`Drafter` is the runtime object the engine holds for one run: the current depth (draft
  length of this round), the memory it holds (drafter weights, or the MEMTP heads), the elastic
  depth controller, and the cost of a drafting round.

Draft length rules (docs/model.md sections 1 and 2):

* Classic drafter (``memtp.depth`` null): every round drafts the policy's block size
  (:attr:`memtp_sim.policies.Policy.draft_len`, ``gamma`` or ``k``); 0 for ``no_spec``. The drafter's
  weights (``profile.memory.drafter_weights_gib``) are resident whenever it drafts.
* MEMTP ensemble: each head lets drafting go one position deeper, so the draft length is the
  ensemble depth ``d`` (fixed, or elastic by :class:`~memtp_sim.memtp.DepthController`, at most
  ``max_depth``); a policy's ``gamma`` becomes the block width (``d`` when fixed, ``max_depth``
  when elastic). The heads (``d * head_cost_gib``) replace the classic drafter's weights.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from .errors import InvalidArgumentError
from .hardware import GIB, DrafterCost, MemorySpec
from .memtp import DepthController, MemtpSettings, memtp_depth
from .policies import make_policy, policy_class

__all__ = ["DraftSpec", "Drafter"]


@dataclass(frozen=True)
class DraftSpec:
    """What the drafter drafts, resolved once per scenario.

    Attributes:
        policy_name: the verification policy's YAML name.
        policy_params: the policy's parameters as the run uses them (under MEMTP a ``gamma``
            parameter equals the block width).
        max_draft_len: widest block any round drafts, positions per request (bonus excluded);
            0 = no speculation.
        memtp: the MEMTP ensemble settings, or None for the classic drafter.
    """

    policy_name: str
    policy_params: Mapping[str, Any] = field(default_factory=dict)
    max_draft_len: int = 0
    memtp: MemtpSettings | None = None

    @classmethod
    def resolve(cls, policy_name: str, policy_params: Mapping[str, Any] | None = None,
                memtp: MemtpSettings | None = None) -> "DraftSpec":
        """Resolve the draft block width of ``policy_name`` (with ``policy_params``) under ``memtp``.

        Raises:
            InvalidArgumentError: unknown policy, or MEMTP on with a policy that never drafts.
        """
        params = dict(policy_params or {})
        if memtp is None:
            width = int(make_policy(policy_name, params).draft_len)
            return cls(policy_name, params, width, None)
        # elastic: the block is as wide as the deepest ensemble; fixed: exactly the heads there are
        width = int(memtp.max_depth) if memtp.elastic else int(memtp.depth)
        if "gamma" in policy_class(policy_name).Params.model_fields:
            params["gamma"] = width
        if int(make_policy(policy_name, params).draft_len) <= 0:
            raise InvalidArgumentError(f"memtp.depth: policy {policy_name!r} never drafts; the ensemble needs one "
                                       "that does")
        return cls(policy_name, params, width, memtp)

    @property
    def speculative(self) -> bool:
        """Whether any round drafts."""
        return self.max_draft_len > 0

    def policy_label(self) -> str:
        """The policy's short label as runs report it, e.g. ``dspark(gamma=7, early_stop=True)``.

        Under MEMTP the ensemble owns the block size, so ``gamma`` is left out of the label
        (``dspark(early_stop=True)``): runs at different depths are the same policy, and the depth
        is its own column (``memtp.depth``, ``mean_depth``)."""
        exclude = ("gamma",) if self.memtp is not None else ()
        return make_policy(self.policy_name, self.policy_params).describe(exclude)


class Drafter:
    """The drafter of one run: current draft length, memory held, elastic depth, drafting cost.

    Args:
        spec: the resolved :class:`DraftSpec`.
        cost: the profile's drafter cost model.
        memory: the profile's memory budget (drafter weights; the free memory that funds heads).

    Attributes:
        depth: positions drafted per request this round (the MEMTP depth, or the fixed block).
        held_gib: memory the drafter holds now, GiB (weights, or ``depth * head_cost_gib``).
        controller: the elastic depth controller, or None.

    Source: docs/model.md sections 1 (T_draft) and 2 (MEMTP depth formula, head memory).
    """

    def __init__(self, spec: DraftSpec, cost: DrafterCost, memory: MemorySpec) -> None:
        self.spec = spec
        self.cost = cost
        self.memory = memory
        self.controller: DepthController | None = None
        m = spec.memtp
        if m is None:
            self.depth = spec.max_draft_len
        elif m.elastic:
            free0 = memory.gpu_allocatable_gib - memory.weights_gib - memory.reserve_gib
            depth0 = m.initial_depth or memtp_depth(max(0.0, free0), 1.0, max_depth=m.max_depth,
                                                    head_cost_gib=m.head_cost_gib, r_low=m.r_low, r_high=m.r_high)
            self.controller = DepthController(max_depth=m.max_depth, head_cost_gib=m.head_cost_gib, r_low=m.r_low,
                                              r_high=m.r_high, min_dwell_rounds=m.min_dwell_rounds,
                                              initial_depth=int(depth0))
            self.depth = self.controller.depth
        else:
            self.depth = int(m.depth)
        self.held_gib = self.memory_at(self.depth)

    @property
    def max_draft_len(self) -> int:
        """Widest block any round of this run drafts (positions per request)."""
        return self.spec.max_draft_len

    @property
    def elastic(self) -> bool:
        return self.controller is not None

    @property
    def num_depth_changes(self) -> int:
        return self.controller.num_changes if self.controller is not None else 0

    def memory_at(self, depth: int) -> float:
        """Memory the drafter holds at ``depth`` drafted positions, GiB."""
        if self.spec.memtp is not None:
            return depth * self.spec.memtp.head_cost_gib
        return self.memory.drafter_weights_gib if depth > 0 else 0.0

    @property
    def min_held_gib(self) -> float:
        """Memory held at the smallest depth this run can shrink to (elastic: one head), GiB."""
        return self.memory_at(1) if self.elastic else self.held_gib

    def round_time_s(self, num_requests: int) -> float:
        """Drafting time of one round for ``num_requests`` requests at the current depth, seconds."""
        return self.cost.round_time_s(num_requests, self.depth)

    def resize(self, free_gib: float, coherence: float, round_index: int) -> float:
        """Elastic MEMTP: let the controller choose this round's depth.

        Args:
            free_gib: memory that can fund heads, including what the current heads hold, GiB.
            coherence: coherence R in [0, 1].
            round_index: engine round number (strictly increasing).

        Returns:
            The stall, seconds, of loading new heads (0 when the depth did not grow):
            ``added heads * head_cost_gib * 2**30 / (head_load_gb_per_s * 1e9)``.
        """
        if self.controller is None:
            return 0.0
        old = self.depth
        new = self.controller.propose(free_gib, coherence, round_index)
        if new == old:
            return 0.0
        self.depth = new
        self.held_gib = self.memory_at(new)
        if new < old:
            return 0.0
        m = self.spec.memtp  # an elastic drafter always has MEMTP settings
        return (new - old) * m.head_cost_gib * GIB / (m.head_load_gb_per_s * 1e9)

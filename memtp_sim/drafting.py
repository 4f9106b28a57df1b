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

from dataclasses import dataclass, field, replace
from typing import Any, Mapping

import numpy as np

from .errors import InvalidArgumentError
from .hardware import GIB, DrafterCost, HardwareProfile, MemorySpec
from .memtp import DepthController, MemtpSettings, memtp_depth
from .policies import make_policy, policy_class

__all__ = ["DEFAULT_DRAFTER_KIND", "DraftSpec", "Drafter", "kv_memory_at_start"]

#: The drafter a scenario without ``drafter.kind`` runs: DSpark's block drafter.
DEFAULT_DRAFTER_KIND = "dspark_block"


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
    kind: str | None = None
    p_min: float = 0.0
    cpu_ms_per_request: float = 0.01

    @classmethod
    def resolve(cls, policy_name: str, policy_params: Mapping[str, Any] | None = None,
                memtp: MemtpSettings | None = None, **drafter: Any) -> "DraftSpec":
        """Resolve the draft block width of ``policy_name`` (with ``policy_params``) under ``memtp``.

        Raises:
            InvalidArgumentError: unknown policy, MEMTP on with a policy that never drafts, or a
                depth (``memtp.max_depth`` when elastic, ``memtp.depth`` when fixed) wider than the
                policy's ``gamma`` allows (the message names the memtp field).
        """
        params = dict(policy_params or {})
        if memtp is None:
            width = int(make_policy(policy_name, params).draft_len)
            return cls(policy_name, params, width, None, **drafter)
        # elastic: the block is as wide as the deepest ensemble; fixed: exactly the heads there are
        width = int(memtp.max_depth) if memtp.elastic else int(memtp.depth)
        where = "memtp.max_depth" if memtp.elastic else "memtp.depth"
        if width > MAX_DRAFT_LEN:  # a policy without a gamma (static, mtp1) takes any width
            raise InvalidArgumentError(f"{where}: {width} is wider than a run's round log holds (the draft length "
                                       f"is kept in 8 bits); allowed: <= {MAX_DRAFT_LEN}")
        gamma = policy_class(policy_name).Params.model_fields.get("gamma")
        if gamma is not None:
            # the user wrote the depth, not this gamma: a width the policy cannot draft is named
            # by the memtp field that set it (pydantic would name the derived policy.gamma)
            widest = _upper_bound(gamma)
            if widest is not None and width > widest:
                raise InvalidArgumentError(
                    f"{where}: {width} is wider than policy {policy_name!r} drafts (the ensemble sets its gamma, "
                    f"at most {widest}); allowed: <= {widest}")
            params["gamma"] = width
        if int(make_policy(policy_name, params).draft_len) <= 0:
            raise InvalidArgumentError(f"memtp.depth: policy {policy_name!r} never drafts; the ensemble needs one "
                                       "that does")
        return cls(policy_name, params, width, memtp, **drafter)

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
        label = make_policy(self.policy_name, self.policy_params).describe(exclude)
        if self.kind is not None and self.speculative:
            label += f" @{self.kind}" + (f" p_min={self.p_min:g}" if self.p_min else "")
        return label


#: the widest draft block a run may have: the round log keeps the draft length (its ``gamma`` and
#: ``depth`` columns, engine.ROUND_DTYPES) in 8 bits
MAX_DRAFT_LEN = 127


def _upper_bound(field_info: Any) -> int | None:
    """The largest integer a pydantic field accepts (its ``le`` / ``lt`` constraint), or None."""
    for m in field_info.metadata:
        if getattr(m, "le", None) is not None:
            return int(m.le)
        if getattr(m, "lt", None) is not None:
            return int(m.lt) - 1
    return None


class Drafter:
    """The drafter of one run: current draft length, memory held, elastic depth, drafting cost.

    Args:
        spec: the resolved :class:`DraftSpec` (its ``kind`` picks the cost and memory model).
        profile: the hardware profile (measured drafter kernels in ``profile.drafters``, the
            default drafter, memory).

    Attributes:
        depth: positions the drafter can draft per request this round (the MEMTP depth, or the
            fixed block); a round may draft fewer (a controller, p_min).
        held_gib: memory the drafter holds now, GiB (weights, or ``depth * head_cost_gib``).
        kv_bytes_per_token: extra KV bytes per token the drafter keeps (a draft model's own cache).
        controller: the elastic depth controller, or None.

    Drafting time of one round, for ``R`` requests drafting ``k`` positions (per-request counts
    ``k_r`` when p_min stops some early):

    * ``dspark_block``: one parallel pass over ``R * k`` tokens + ``max k_r`` sequential head steps;
    * ``mtp``, ``eagle``, ``draft_model``: ``sum over steps j of t_step(requests with k_r >= j)``;
    * ``per_sequence``: ``sum_r t_pass(k_r tokens)`` (no batching: concurrency multiplies it);
    * ``ngram``: ``cpu_ms_per_request * R`` on the CPU, no GPU pass.

    Source: docs/model.md sections 1 (T_draft per drafter kind) and 2 (MEMTP depth, head memory).
    """

    def __init__(self, spec: DraftSpec, profile: HardwareProfile) -> None:
        self.spec = spec
        self.memory = profile.memory
        self.kind = spec.kind or DEFAULT_DRAFTER_KIND
        self._cost, self.weights_gib, self.kv_bytes_per_token, self.cost_source = _cost_model(self.kind, profile, spec)
        self.controller: DepthController | None = None
        self._uniform: dict[tuple[int, int], float] = {}
        m = spec.memtp
        if m is None:
            self.depth = spec.max_draft_len
        elif m.elastic:
            memory = profile.memory
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
        """Whether a MEMTP depth controller resizes the ensemble each round."""
        return self.controller is not None

    @property
    def num_depth_changes(self) -> int:
        """Depth changes the elastic controller made so far (0 for a fixed drafter)."""
        return self.controller.num_changes if self.controller is not None else 0

    def memory_at(self, depth: int) -> float:
        """Memory the drafter holds at ``depth`` drafted positions, GiB."""
        if self.spec.memtp is not None:
            return depth * self.spec.memtp.head_cost_gib
        return self.weights_gib if depth > 0 else 0.0

    @property
    def min_held_gib(self) -> float:
        """Memory held at the smallest depth this run can shrink to (elastic: one head), GiB."""
        return self.memory_at(1) if self.elastic else self.held_gib

    def prefill_time_s(self, tokens: int) -> float:
        """A draft model's own prefill of ``tokens`` prompt tokens (one batched step over them),
        seconds; 0 for drafters without their own cache."""
        if self.kind != "draft_model" or tokens <= 0:
            return 0.0
        return self._cost(np.ones(int(tokens), dtype=np.int64), 1)

    def round_time_s(self, num_requests: int, k: int | None = None) -> float:
        """Drafting time of one round, every one of ``num_requests`` requests drafting ``k``
        positions (default: the current depth), seconds."""
        k = self.depth if k is None else k
        if k <= 0 or num_requests <= 0:
            return 0.0
        t = self._uniform.get((num_requests, k))
        if t is None:  # a pure function of (R, k): priced once per run, not every round
            uniform = getattr(self._cost, "uniform", None)  # the same float without building the lengths
            t = self._uniform[num_requests, k] = uniform(num_requests, k) if uniform is not None else \
                self._cost(np.full(num_requests, k, dtype=np.int64), k)
        return t

    def ragged_time_s(self, lengths: np.ndarray, k: int) -> float:
        """Drafting time when request r drafted ``lengths[r]`` positions of a ``k``-wide block, seconds."""
        if k <= 0 or lengths.size == 0:
            return 0.0
        return self._cost(lengths, k)

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


def _pass_ms(cost: Any, tokens: float) -> float:
    """One batched drafter pass over ``tokens`` tokens, ms (measured table, or the roofline)."""
    if isinstance(cost, DrafterCost):
        return 1000.0 * cost.time_scale * max(cost.t_small_s, tokens * cost.t_large_s / cost.large_b)
    return cost.time_scale * cost._t_ms(tokens)


def _cost_model(kind: str, profile: HardwareProfile, spec: DraftSpec):  # noqa: ANN202 - (fn, gib, bytes, src)
    """(time function (lengths, k) -> s, weights GiB, extra KV bytes per token, source) of a kind."""
    measured = profile.drafters.get(kind)
    block = profile.drafters.get("dspark_block", profile.drafter)
    t_seq = getattr(block, "t_seq_s", 0.0)
    if kind == "dspark_block":
        def block_time(lengths: np.ndarray, k: int) -> float:
            return _pass_ms(block, lengths.size * k) / 1000.0 + int(lengths.max()) * t_seq

        def uniform_time(num_requests: int, k: int) -> float:  # block_time of num_requests lengths k, no arrays
            return _pass_ms(block, num_requests * k) / 1000.0 + k * t_seq
        block_time.uniform = uniform_time
        return block_time, getattr(block, "weights_gib", profile.memory.drafter_weights_gib), 0, block.source
    if kind == "draft_model" and measured is None:  # stated: the profile's measured small model, one step per token
        small = profile.drafter
        if not isinstance(small, DrafterCost):
            raise InvalidArgumentError(f"drafter.kind draft_model: profile {profile.name} has no measured draft "
                                       "model (drafters.draft_model)")
        def small_time(lengths: np.ndarray, k: int) -> float:
            counts = np.bincount(np.minimum(lengths, k), minlength=k + 1)
            active = lengths.size - np.cumsum(counts)[:-1]
            return float(sum(_pass_ms(small, int(n)) for n in active if n > 0)) / 1000.0
        return small_time, small.weights_gib, int(small.kv_bytes_per_token), \
            f"the profile's measured small model as the draft model, one step per drafted token: {small.source}"
    if kind == "ngram":
        return (lambda lengths, k: spec.cpu_ms_per_request * lengths.size / 1000.0), 0.0, 0, \
            "ngram: CPU suffix lookup, drafter.cpu_ms_per_request per request (stated)"
    if kind == "per_sequence":
        base = measured or block
        def seq_time(lengths: np.ndarray, k: int) -> float:
            return float(sum(_pass_ms(base, int(n)) for n in lengths if n > 0)) / 1000.0
        return seq_time, getattr(base, "weights_gib", profile.memory.drafter_weights_gib), 0, \
            f"one pass per request (no batching): {base.source}"
    # chained drafters: k sequential batched steps over the requests still drafting
    step = measured if measured is not None else profile.drafters.get("mtp")
    if step is not None and getattr(step, "kind", "") in ("mtp", "model"):
        def step_ms(n: int) -> float:
            return step.time_scale * step._t_ms(n)
        weights, src = step.weights_gib, step.source
    else:  # stated: one chained step costs one drafter pass over the requests drafting (1 token each)
        def step_ms(n: int) -> float:
            return _pass_ms(block, n)
        weights, src = getattr(block, "weights_gib", profile.memory.drafter_weights_gib), \
            f"no measured {kind} step in this profile: one block-drafter pass over R tokens per step (stated)"

    def chain_time(lengths: np.ndarray, k: int) -> float:
        counts = np.bincount(np.minimum(lengths, k), minlength=k + 1)  # requests drafting exactly j
        active = lengths.size - np.cumsum(counts)[:-1]  # requests still drafting at step j = 1..k
        return float(sum(step_ms(int(n)) for n in active if n > 0)) / 1000.0
    extra_kv = int(getattr(step, "kv_bytes_per_token", 0) or 0) if kind == "draft_model" else 0
    return chain_time, weights, extra_kv, src


def kv_memory_at_start(profile: HardwareProfile, drafter: Drafter) -> tuple[MemorySpec, int]:
    """The KV memory a run starts with: the profile's memory (a draft model's own KV added to
    every token's bytes: each token is cached by both models) and the paged-KV blocks left beside
    the weights, the reserve and what the drafter holds at its first depth (the elastic MEMTP
    ensemble's first depth funds its heads from all the free memory at R = 1, or
    ``memtp.initial_depth``). The engine starts from it, and scenario validation refuses a run it
    leaves no block (0).

    Returns:
        ``(memory, blocks)``: the :class:`~memtp_sim.hardware.MemorySpec` the KV cache is sized
        by, and its blocks (>= 0).

    Source:
        docs/model.md section 2 (memory after weights, reserve and heads funds the KV cache).
    """
    mem = profile.memory
    if drafter.kv_bytes_per_token:
        mem = replace(mem, kv_bytes_per_token=mem.kv_bytes_per_token + drafter.kv_bytes_per_token)
    return mem, mem.kv_capacity_blocks(speculative=False, other_gib=drafter.held_gib)

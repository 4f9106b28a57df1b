"""Validated configs: a Scenario (one simulated run) and a Study (a sweep of scenarios).

Validation only: nothing here writes files. Every error becomes one line naming the file, the
field and what is allowed (:func:`load_study` raises :class:`ConfigError`).

YAML shape of a study::

    name: load
    base:                      # a Scenario
      hardware: {profile: gfx1151-llama31-8b-q4km-vulkan}
      acceptance: {profile: dspark-qwen3, domain_mix: {chat: 1.0}}
      workload: {trace: ../data/traces/azure2023_conv.csv, mode: closed_loop, concurrency: 8,
                 num_requests: 300}
      engine: {max_batch_tokens: 512, prefill_chunk_tokens: 256}
      policy: {name: dspark, gamma: 7}   # or, instead, a policies list below
    sweep: {workload.concurrency: [1, 2, 4, 8]}   # cartesian product of dotted paths
    # policies: [{name: no_spec}, {name: dspark}]  # optional: one run per policy (then no base.policy)
    seeds: [0, 1]
"""

from __future__ import annotations

import copy
import itertools
import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveFloat,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveInt,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from ._io import not_a_file, read_yaml
from .acceptance import (
    AcceptanceModel,
    alpha_from_accepted_ratio,
    alpha_from_mean_acceptance_length,
    conditional_from_per_position,
    load_acceptance,
    parse_conditional_acceptance,
    parse_rates,
)
from .drafting import Drafter, DraftSpec, kv_memory_at_start
from .errors import CalibrationError, ConfigError, InvalidArgumentError
from .hardware import DrafterCost, MemorySpec, load_profile
from .memtp import MEMTP_DEFAULTS, MemtpSettings
from .policies import available_policies, make_policy, policy_class
from .policies.control import control_class, make_control
from .workload import load_trace, trace_replay_start

__all__ = [
    "StrictModel",
    "HardwareConfig",
    "AcceptanceConfig",
    "ConfidenceConfig",
    "WorkloadConfig",
    "MemtpConfig",
    "EngineConfig",
    "PolicySpec",
    "Scenario",
    "Study",
    "load_study",
    "load_scenario",
    "read_config_yaml",
    "yaml_kind",
    "yaml_flow",
    "format_validation_error",
    "check_no_ignored_fields",
    "set_paths",
]


#: Requests one run may hold (per-request arrays and result tables live in memory).
MAX_REQUESTS_PER_RUN = 10_000_000


class StrictModel(BaseModel):
    """Base of every YAML-facing model (scenarios, studies, tune specs): unknown keys are errors,
    models are frozen, types are strict (YAML ``true`` is not the integer 1, ``"1.5"`` is not a
    number), and every float is finite (YAML ``.inf``, ``-.inf`` and ``.nan`` are refused, naming
    the field)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class HardwareConfig(StrictModel):
    """YAML ``hardware``: a shipped profile name or a profile YAML path (relative to the study file),
    or an inline table of measured pass times with the memory figures.

    The inline form ``{table: {B: pass ms}, memory: {...}, name: ...}`` is imported as
    ``calibrate import --format table`` imports a file (:func:`memtp_sim.hardware.importers.inline_table_profile`),
    into the disk cache; ``profile`` then holds that profile's path.
    """

    profile: str = Field("gfx1151-llama31-8b-q4km-vulkan", description="shipped profile name or YAML path")
    table: dict[int, float] | None = Field(None, description="inline {batch_tokens: pass_ms} (instead of profile)")
    memory: dict[str, float | int | list[int]] | None = Field(
        None, description="with table: gpu_allocatable_gib, weights_bytes, kv_bytes_per_token (or kv_shape), max_model_len")
    name: str = Field("inline-table", description="with table: the profile's name in reports")

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, v: Any) -> Any:
        if isinstance(v, str):
            return {"profile": v}  # `hardware: <name or path>`
        if isinstance(v, dict) and v.get("table") is not None:
            from .hardware.importers import INLINE_DIR, inline_table_profile  # lazy: pandas, only for tables

            prof = v.get("profile")
            if prof is not None and INLINE_DIR not in Path(str(prof)).parts:
                raise ValueError(f"give either profile ({prof!r}) or table, not both")
            try:
                path = inline_table_profile(v["table"], v.get("memory") or {}, v.get("name", "inline-table"))
            except CalibrationError as e:
                raise ValueError(str(e).removeprefix("hardware.")) from None
            return {**v, "profile": str(path)}
        return v  # memory and name without table: refused per study (Scenario.ignored_fields)

    @field_validator("profile")
    @classmethod
    def _exists(cls, v: str, info: ValidationInfo) -> str:
        _no_folder(v, info, "hardware profile file")
        v = _resolve_path(v, info) if v.endswith((".yaml", ".yml")) else v
        try:
            load_profile(v)
        except CalibrationError as e:
            raise ValueError(str(e)) from None
        return v


class DriftPhase(StrictModel):
    """From ``start_s`` on (simulated seconds), every position's logit is shifted by ``shift``."""

    start_s: NonNegativeFloat
    shift: float


class DriftConfig(StrictModel):
    """Acceptance that changes over a run: logit shifts by time (workload phases), by how far a
    request is into its output, and by its context (a shift of +x makes every position's odds
    e^x times higher)."""

    time_phases: list[DriftPhase] = Field(
        default_factory=list, description="[{start_s, shift}, ...]: from start_s on, the logit shift applies")
    per_1k_output_tokens: float = Field(0.0, description="logit shift per 1,000 tokens already generated")
    per_1k_context_tokens: float = Field(0.0, description="logit shift per 1,000 tokens of context")

    @field_validator("time_phases")
    @classmethod
    def _sorted(cls, v: list[DriftPhase]) -> list[DriftPhase]:
        if any(b.start_s <= a.start_s for a, b in zip(v, v[1:])):
            raise ValueError("time_phases: start times must increase")
        return v

    @property
    def active(self) -> bool:
        """Whether any drift is set (otherwise the engine skips it)."""
        return bool(self.time_phases) or self.per_1k_output_tokens != 0.0 or self.per_1k_context_tokens != 0.0


#: The ways an acceptance model can be given; exactly one (default: the shipped Table-1 profile).
ACCEPTANCE_SOURCES = ("profile", "alpha", "conditional", "per_position", "mean_acceptance_length", "accepted_ratio")


#: Acceptance sources given per draft length (``draft_len`` says which).
_NEEDS_DRAFT_LEN = ("mean_acceptance_length", "accepted_ratio")


class AcceptanceConfig(StrictModel):
    """YAML ``acceptance``: how likely each draft position is to be accepted (one source), the mix
    of request domains, and drift.

    Sources (exactly one; default ``profile: dspark-qwen3``, fitted to DSpark Table 1):
    ``profile`` (a shipped name or a YAML path; the drafter lab writes per-position ones),
    ``alpha`` (i.i.d., Leviathan et al. 2023), ``conditional`` (c_1..c_K, P(k accepted | 1..k-1
    accepted), e.g. ``0.84/0.60/0.39``), ``per_position`` (vLLM's per-position acceptance rates,
    joint: c_j = a_j / a_(j-1)), ``mean_acceptance_length`` (vLLM's tokens per step, bonus
    included) or ``accepted_ratio`` (llama.cpp's accepted / drafted), the last two with
    ``draft_len`` and converted to an i.i.d. alpha (memtp_sim.acceptance). Vector and converted
    inputs take ``sigma_request`` / ``sigma_round`` (default: the shipped profile's).
    """

    profile: str | None = Field(None, description="acceptance profile, fitted to DSpark Table 1 (default: dspark-qwen3)")
    alpha: float | None = Field(None, gt=0.0, lt=1.0, description="fixed i.i.d. per-position acceptance")
    conditional: str | list[float] | None = Field(None, description="conditional acceptance by position, c_1..c_K")
    per_position: str | list[float] | None = Field(None, description="vLLM per-position acceptance rates (joint)")
    mean_acceptance_length: float | None = Field(None, gt=1.0, description="vLLM mean acceptance length "
                                                 "(tokens per step, bonus included)")
    accepted_ratio: float | None = Field(None, gt=0.0, lt=1.0, description="llama.cpp accepted / drafted")
    draft_len: PositiveInt | None = Field(None, description="draft tokens per step behind mean_acceptance_length "
                                          "or accepted_ratio")
    sigma_request: float | None = Field(None, ge=0.0, description="per-request difficulty spread, logits")
    sigma_round: float | None = Field(None, ge=0.0, description="per-round context spread, logits")
    domain_mix: dict[str, float] | None = Field(None, description="probability of each domain (must sum to 1; "
                                                "default: chat, or the profile's only domain)")
    drift: DriftConfig = Field(default_factory=DriftConfig)

    @field_validator("profile")
    @classmethod
    def _profile_path(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is not None:
            _no_folder(v, info, "acceptance profile file")
        return _resolve_path(v, info) if v is not None and v.endswith((".yaml", ".yml")) else v

    @property
    def source(self) -> str:
        """Which of :data:`ACCEPTANCE_SOURCES` gives the model."""
        given = [k for k in ACCEPTANCE_SOURCES if getattr(self, k) is not None]
        return given[0] if given else "profile"

    @model_validator(mode="after")
    def _check(self) -> "AcceptanceConfig":
        given = [k for k in ACCEPTANCE_SOURCES if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"give one acceptance source, not {' and '.join(given)}")
        # fields this source does not read are refused per study, not here (Scenario.ignored_fields)
        if self.source in _NEEDS_DRAFT_LEN and self.draft_len is None:
            raise ValueError(f"draft_len: needed with {self.source} (draft tokens per step behind it)")
        try:
            model = self.build()
        except (CalibrationError, ValueError) as e:
            msg = str(e).removeprefix("Value error, ")
            # a profile file's fault at the field that names it (acceptance.profile: FILE: ...), as
            # hardware.profile's
            raise ValueError(f"profile: {msg}" if self.profile is not None else msg) from None
        mix = self.resolved_mix(model.domains)
        unknown = sorted(set(mix) - set(model.domains))
        if unknown:
            raise ValueError(f"domain_mix: unknown domain(s) {unknown}; allowed: {', '.join(model.domains)}")
        if any(w < 0 for w in mix.values()):
            raise ValueError("domain_mix: weights must be >= 0")
        total = sum(mix.values())
        if abs(total - 1.0) > 1e-9:
            raise ValueError(f"domain_mix: probabilities must sum to 1 (they sum to {total:g}); "
                             "e.g. {chat: 0.5, code: 0.5}")
        return self

    def resolved_mix(self, domains: tuple[str, ...]) -> dict[str, float]:
        """The domain mix a run uses: the one given, else chat (or the model's first domain)."""
        if self.domain_mix is not None:
            return dict(self.domain_mix)
        return {"chat" if "chat" in domains else domains[0]: 1.0}

    def build(self) -> AcceptanceModel:
        """The acceptance model this section describes.

        Raises:
            CalibrationError: an unknown or malformed profile.
            ValueError: a malformed vector or a value no i.i.d. alpha reaches.
        """
        src = self.source
        if src == "alpha":
            return AcceptanceModel.fixed(self.alpha)
        if src == "profile":
            return load_acceptance(self.profile)
        default = load_acceptance(None)
        sig = {"sigma_request": default.sigma_request if self.sigma_request is None else self.sigma_request,
               "sigma_round": default.sigma_round if self.sigma_round is None else self.sigma_round}
        if src == "conditional":
            vec = self.conditional if isinstance(self.conditional, list) else parse_conditional_acceptance(self.conditional)
            return AcceptanceModel.per_position(vec, source="acceptance.conditional", **sig)
        if src == "per_position":
            rates = self.per_position if isinstance(self.per_position, list) else \
                parse_rates(self.per_position, "per_position")
            return AcceptanceModel.per_position(conditional_from_per_position(rates),
                                                source="acceptance.per_position (vLLM rates, joint)", **sig)
        if src == "mean_acceptance_length":
            a = alpha_from_mean_acceptance_length(self.mean_acceptance_length, self.draft_len)
            what = f"mean acceptance length {self.mean_acceptance_length:g} at {self.draft_len} drafted"
        else:
            a = alpha_from_accepted_ratio(self.accepted_ratio, self.draft_len)
            what = f"accepted/drafted {self.accepted_ratio:g} at {self.draft_len} drafted"
        return AcceptanceModel.per_position([a] * self.draft_len, source=f"{what} -> i.i.d. alpha {a:.4f}", **sig)


class ConfidenceConfig(StrictModel):
    """The confidence head and how the engine calibrates it (DSpark section 3.2, Fig. 6)."""

    head: Literal["model", "oracle", "profile"] = Field(
        "model", description="model: noisy, over-confident head (noise_sd, overconfidence); oracle: reports the "
        "true acceptance; profile: the head the acceptance profile measured (the drafter lab's profiles)")
    noise_sd: float = Field(0.4, ge=0.0, description="logit noise of the head (lower AUC)")
    overconfidence: float = Field(1.35, gt=0.0, description="raw logit scale; > 1 is over-confident")
    temperature: float = Field(1.0, gt=0.0, description="global temperature on top of STS")
    sts: Literal["fit", "none"] | list[PositiveFloat] = Field(
        "fit", description="per-position temperatures: fit on a held-out stream, none, or a list")

    @field_validator("sts", mode="before")
    @classmethod
    def _sts_form(cls, v: Any) -> Any:
        if v in ("fit", "none"):
            return v
        if isinstance(v, list) and v and all(isinstance(t, (int, float)) and not isinstance(t, bool)
                                             and math.isfinite(t) and t > 0 for t in v):
            return [float(t) for t in v]
        raise ValueError(f"allowed: 'fit', 'none', or a non-empty list of finite positive temperatures, one per "
                         f"position (got {_show(v)})")
    sts_rounds: PositiveInt = Field(20000, description="held-out rounds for the STS fit")


class MemtpConfig(StrictModel):
    """MEMTP: the draft-head ensemble whose depth (= draft length) follows free memory (docs/model.md section 2)."""

    depth: Literal["elastic"] | PositiveInt | None = Field(
        None, description="elastic (controller), a fixed number of heads, or null (classic drafter, policy gamma)")
    max_depth: PositiveInt = Field(MEMTP_DEFAULTS.max_depth, description="heads at most")
    head_cost_gib: PositiveFloat = Field(MEMTP_DEFAULTS.head_cost_gib,
                                         description="memory one head holds while alive (weights + buffers)")
    r_low: float = Field(MEMTP_DEFAULTS.r_low, ge=0.0, le=1.0, description="coherence at or below which the gate is 0 (the depth falls to its floor of 1)")
    r_high: float = Field(MEMTP_DEFAULTS.r_high, ge=0.0, le=1.0,
                          description="coherence at or above which free memory is fully used")
    coherence_half_life_rounds: PositiveFloat = Field(
        MEMTP_DEFAULTS.coherence_half_life_rounds,
        description="EWMA half-life of coherence R (the elastic controller reads R; with a fixed depth R is only "
        "reported: mean_coherence and the round log's coherence column)")
    coherence: Literal["ewma", "tower"] = Field(
        "ewma", description="ewma: one EWMA of the acceptance ratio (coherence_estimator says which); tower: the "
        "n-gram matryoshka tower's R = product over levels (block positions) of each level's acceptance EWMA; a "
        "joint probability over the block, so set r_low / r_high for it. With a fixed depth R is only reported "
        "(mean_coherence, the round log)")
    coherence_estimator: Literal["per_verified", "per_tested"] = Field(
        "per_verified", description="per_verified: accepted / verified draft tokens (the default, docs/model.md section 2); "
        "per_tested: accepted / positions actually compared (up to the first rejection), which does not "
        "fall when the scheduler verifies deeper")
    min_dwell_rounds: PositiveInt = Field(MEMTP_DEFAULTS.min_dwell_rounds,
                                          description="rounds a depth target must persist before a change")
    head_load_gb_per_s: PositiveFloat = Field(
        MEMTP_DEFAULTS.head_load_gb_per_s,
        description="copy rate for loading a new head; default: measured CPU<->GPU rate on gfx1151 (lhl)")
    initial_depth: PositiveInt | None = Field(None, description="elastic: starting depth (default: the formula's)")

    @field_validator("depth", mode="before")
    @classmethod
    def _depth_form(cls, v: Any) -> Any:
        if v is None or v == "elastic" or (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
            return v
        raise ValueError(f"allowed: 'elastic', a number of heads >= 1, or null (got {_show(v)})")

    @model_validator(mode="after")
    def _check(self) -> "MemtpConfig":
        if self.r_low >= self.r_high:
            raise ValueError(f"r_low: {self.r_low} must be below r_high ({self.r_high})")
        # a fixed depth is not checked against max_depth: only the elastic controller reads
        # max_depth (a fixed depth drafts its own number of heads, and max_depth set beside it is
        # refused as having no effect), so depth 20 was refused as "exceeds max_depth 16" with no
        # way to raise the bound
        if self.initial_depth is not None and self.initial_depth > self.max_depth:
            raise ValueError(f"initial_depth: {self.initial_depth} exceeds max_depth {self.max_depth}")
        return self


class RateSegment(StrictModel):
    """One piece of a piecewise-constant Poisson rate: ``rate_per_s`` requests/s for ``duration_s`` s."""

    duration_s: PositiveFloat
    rate_per_s: float = Field(..., ge=0.0)


class WorkloadConfig(StrictModel):
    """YAML ``workload``: a request trace and how requests arrive (trace replay, Poisson, closed loop)."""

    trace: str = Field(..., description="trace CSV path, relative to the YAML file")
    mode: Literal["trace", "poisson", "closed_loop"] = "closed_loop"
    num_requests: PositiveInt = Field(
        300, le=MAX_REQUESTS_PER_RUN,
        description=f"requests in the run (at most {MAX_REQUESTS_PER_RUN:,}: per-request state is held in memory)")
    rate_scale: PositiveFloat = Field(1.0, description="trace mode: arrival-rate multiplier")
    rate_per_s: PositiveFloat | None = Field(None, description="poisson mode: requests per second")
    rate_schedule: list[RateSegment] | None = Field(
        None, description="poisson mode: piecewise-constant rate (a load ramp), instead of rate_per_s")
    concurrency: PositiveInt | None = Field(None, description="closed_loop mode: concurrent users")
    think_time_s: float = Field(0.0, ge=0.0)
    start_offset_s: float = Field(0.0, ge=0.0)

    @field_validator("trace")
    @classmethod
    def _trace_exists(cls, v: str, info: ValidationInfo) -> str:
        p = _resolve_path(v, info)
        why = not_a_file(p, "trace file")
        if why is not None:
            raise ValueError(why)
        try:
            load_trace(p)  # cached; checks the columns now rather than when a run starts
        except ConfigError as e:
            raise ValueError(str(e)) from None
        return p

    @model_validator(mode="after")
    def _mode_fields(self) -> "WorkloadConfig":
        if self.mode == "poisson" and self.rate_per_s is None and not self.rate_schedule:
            raise ValueError("rate_per_s: mode poisson needs it (> 0), or a rate_schedule")
        if self.mode == "poisson" and self.rate_per_s is not None and self.rate_schedule:
            raise ValueError("give rate_per_s or rate_schedule, not both")
        if self.rate_schedule and not any(seg.rate_per_s > 0 for seg in self.rate_schedule):
            raise ValueError("rate_schedule: at least one segment needs rate_per_s > 0")
        if self.mode == "closed_loop" and self.concurrency is None:
            raise ValueError("concurrency: mode closed_loop needs it (an integer >= 1)")
        if self.mode == "trace":  # at load, not in every run: the trace must hold the replay
            try:
                trace_replay_start(load_trace(self.trace), self.num_requests, self.start_offset_s)
            except ConfigError as e:
                raise ValueError(str(e)) from None
        return self


#: Workload fields that one arrival mode alone reads, with that mode (:meth:`Scenario.ignored_fields`).
_MODE_ONLY = {"concurrency": "closed_loop", "think_time_s": "closed_loop", "rate_per_s": "poisson",
              "rate_schedule": "poisson", "rate_scale": "trace", "start_offset_s": "trace"}

#: Policies the MEMTP ensemble cannot set the draft length of, and why (:meth:`Scenario.ignored_fields`).
_NO_MEMTP = {"no_spec": "drafts nothing", "mtp1": "drafts one token with its own head"}


class EngineConfig(StrictModel):
    """YAML ``engine``: the serving engine's knobs (token budget per pass, chunked prefill, admission)."""

    max_batch_tokens: PositiveInt = Field(512, description="token budget of one forward pass (B cap)")
    prefill_chunk_tokens: PositiveInt = Field(256, description="prefill tokens per pass at most (chunked prefill)")
    max_num_seqs: PositiveInt | None = Field(
        None, description="running requests at most (default: min(256, max_batch_tokens); every running request "
        "needs one token of each pass)")
    kv_watermark_frac: float = Field(0.01, ge=0.0, lt=1.0, description="KV blocks kept free at admission")
    prefill: Literal["colocated", "disaggregated"] = Field(
        "colocated",
        description="colocated: chunked prefill shares this GPU's passes; disaggregated: a separate "
        "prefill GPU of the same profile computes prompts (the DSpark paper's production setting)",
    )
    prefill_gpus: PositiveInt = Field(1, description="disaggregated: prefill GPUs feeding this decode GPU")

    @model_validator(mode="after")
    def _seqs_fit_the_pass(self) -> "EngineConfig":
        if self.max_num_seqs is not None and self.max_num_seqs > self.max_batch_tokens:
            raise ValueError(f"max_num_seqs: {self.max_num_seqs} running requests cannot each put one token in a pass "
                             f"of max_batch_tokens {self.max_batch_tokens}; allowed: <= {self.max_batch_tokens}")
        return self

    @property
    def num_seqs_limit(self) -> int:
        """Running requests at most, as the engine applies it."""
        return self.max_num_seqs if self.max_num_seqs is not None else min(256, self.max_batch_tokens)


#: Drafter kinds a scenario may choose (docs/model.md section 1 step 1).
DRAFTER_KINDS = ("dspark_block", "mtp", "eagle", "draft_model", "ngram", "per_sequence")


class DrafterConfig(StrictModel):
    """Which drafter proposes the draft tokens, and how (docs/model.md section 1 step 1)."""

    kind: Literal["dspark_block", "mtp", "eagle", "draft_model", "ngram", "per_sequence"] | None = Field(
        None, description="dspark_block (one semi-autoregressive pass), mtp / eagle (k chained batched steps), "
        "draft_model (a separate small model with its own KV and prefill), ngram (CPU lookup), per_sequence "
        "(a drafter that runs each request on its own); default: the profile's default drafter")
    p_min: float = Field(0.0, ge=0.0, lt=1.0, description="stop drafting a request at the first position whose "
                         "confidence is below p_min (llama.cpp --draft-p-min); 0: draft the whole block")
    cpu_ms_per_request: float = Field(0.01, ge=0.0, description="ngram: CPU lookup time per request per round, ms "
                                      "(stated assumption: a suffix lookup takes microseconds)")


def _check_params(cls: Any, params: dict[str, Any], section: str, what: str) -> None:
    """Validate a policy's or controller's parameters with its own ``Params`` model.

    Raises:
        ValueError: one line, ``<section>.<field>: ...`` (an unknown parameter lists the allowed
            ones; a bad value gives the model's message and the value).
    """
    _check_finite(params, section)
    try:
        cls.Params(**params)
    except ValidationError as e:
        err = e.errors()[0]
        field = ".".join(str(x) for x in err["loc"])
        if err["type"] == "extra_forbidden":
            allowed = ", ".join(cls.Params.model_fields) or "no parameters"
            raise ValueError(f"{section}.{field}: unknown parameter of {what}; allowed: {allowed}") from None
        msg = err["msg"].removeprefix("Value error, ")
        if not field:  # the model's own check: its message names the fields ("draft_control: rows[0]: ...")
            raise ValueError(f"{section}: {msg}") from None
        raise ValueError(f"{section}.{field}: {msg} (got {_show(err.get('input'))})") from None


def _check_finite(value: Any, where: str) -> None:
    """Refuse ``inf``, ``-inf`` and ``nan`` anywhere in a parameter value (lists and mappings too).

    Raises:
        ValueError: one line, ``<where>.<field>: must be a finite number (got inf)``.
    """
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{where}: must be a finite number (got {value})")
    if isinstance(value, dict):
        for k, v in value.items():
            _check_finite(v, f"{where}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_finite(v, f"{where}.{i}")


class ControlSpec(BaseModel):
    """``{name: <draft-length controller>, **params}``; params validated by the controller's model."""

    model_config = ConfigDict(extra="allow", frozen=True)
    name: str = "always"

    @model_validator(mode="after")
    def _params(self) -> "ControlSpec":
        try:
            cls = control_class(self.name)
        except InvalidArgumentError as e:
            raise ValueError(str(e)) from None  # pydantic turns ValueError into a field error
        _check_params(cls, self.params, "draft_control", repr(self.name))
        return self

    @property
    def params(self) -> dict[str, Any]:
        """The controller's parameters (every key but ``name``)."""
        return dict(self.model_extra or {})

    @property
    def param_paths(self) -> set[str]:
        """``draft_control.<param>`` for every parameter given: the paths the no-effect rule checks."""
        return {f"draft_control.{k}" for k in self.model_extra or {}}

    def resolved_params(self) -> dict[str, Any]:
        """Every parameter of the controller as a run uses it: those given and the defaults of the rest."""
        return control_class(self.name).Params(**self.params).model_dump(mode="json")


class PolicySpec(BaseModel):
    """``{name: <policy>, **params}``; params are validated by the policy's own model."""

    model_config = ConfigDict(extra="allow", frozen=True)
    name: str

    @model_validator(mode="after")
    def _params(self) -> "PolicySpec":
        try:
            cls = policy_class(self.name)
        except InvalidArgumentError as e:
            raise ValueError(str(e)) from None  # pydantic turns ValueError into a field error
        _check_params(cls, self.params, "policy", f"policy {self.name!r}")
        return self

    @property
    def params(self) -> dict[str, Any]:
        """The policy's parameters (every key but ``name``)."""
        return dict(self.model_extra or {})

    @property
    def param_paths(self) -> set[str]:
        """``policy.<param>`` for every parameter given: the paths the no-effect rule checks
        (:func:`set_paths` counts a policy as one field)."""
        return {f"policy.{k}" for k in self.model_extra or {}}

    def resolved_params(self) -> dict[str, Any]:
        """Every parameter of the policy as a run uses it: those given and the defaults of the rest
        (``{name: dspark}`` and ``{name: dspark, gamma: 7}`` resolve alike)."""
        return policy_class(self.name).Params(**self.params).model_dump(mode="json")

    def flow(self) -> str:
        """The entry as it could be written in YAML: ``dspark``, or ``{name: dspark, gamma: 5}``."""
        return yaml_flow({"name": self.name, **self.params})


def _no_kv_block(m: MemtpSettings | None, drafter: Drafter, mem: MemorySpec) -> str:
    """The error of a scenario whose drafter leaves no KV block at the run's start, naming the
    field to change: the elastic ensemble's ``max_depth`` (its first depth, unset, is what all the
    free memory funds at R = 1) or ``initial_depth``, and the deepest start that leaves a block;
    ``head_cost_gib`` where even one head leaves none (or at a fixed depth); ``drafter.kind`` for a
    draft model (its weights, and its own KV in every token's bytes); else the profile's memory."""
    held = f"drafter/heads {drafter.held_gib:.1f} GiB"
    what, advice = "hardware.profile", ""
    if drafter.elastic:
        fits = [d for d in range(1, drafter.depth)
                if mem.kv_capacity_blocks(speculative=False, other_gib=drafter.memory_at(d)) > 0]
        heads = "1 head" if drafter.depth == 1 else f"{drafter.depth} heads"
        if m.initial_depth is None:
            held += f" ({heads}: the elastic ensemble's first depth, funded by all the free memory at R = 1)"
            what = "memtp.max_depth" if fits else "memtp.head_cost_gib"
            advice = f"; allowed: max_depth (or initial_depth) <= {fits[-1]}" if fits else ""
        else:
            held += f" ({heads}: memtp.initial_depth)"
            what = "memtp.initial_depth" if fits else "memtp.head_cost_gib"
            advice = f"; allowed: initial_depth <= {fits[-1]}" if fits else ""
    elif m is not None:
        what = "memtp.head_cost_gib"
    elif drafter.kind == "draft_model":
        what = "drafter.kind"
        held += f" (the draft model's weights; its KV adds {drafter.kv_bytes_per_token} bytes to every token's)"
    return (f"{what}: no KV block fits: {mem.gpu_allocatable_gib:.1f} GiB allocatable - weights "
            f"{mem.weights_gib:.1f} - reserve {mem.reserve_gib:.1f} - {held} leaves nothing for the KV cache{advice}")


class Scenario(StrictModel):
    """One simulated run (without its seed)."""

    hardware: HardwareConfig = Field(default_factory=HardwareConfig)
    acceptance: AcceptanceConfig = Field(default_factory=AcceptanceConfig)
    confidence: ConfidenceConfig = Field(default_factory=ConfidenceConfig)
    workload: WorkloadConfig
    engine: EngineConfig = Field(default_factory=EngineConfig)
    memtp: MemtpConfig = Field(default_factory=MemtpConfig)
    drafter: DrafterConfig = Field(default_factory=DrafterConfig)
    draft_control: ControlSpec = Field(default_factory=ControlSpec)
    policy: PolicySpec = Field(default_factory=lambda: PolicySpec(name="dspark"))

    @model_validator(mode="after")
    def _fits_profile(self) -> "Scenario":
        prof = load_profile(self.hardware.profile)
        if self.engine.max_batch_tokens > prof.sps.max_batch_tokens and prof.sps.beyond_max == "error":
            raise ValueError(
                f"engine.max_batch_tokens: {self.engine.max_batch_tokens} exceeds the largest measured B "
                f"({prof.sps.max_batch_tokens}) of profile {prof.name}; allowed: <= {prof.sps.max_batch_tokens}"
            )
        tables = [("decode", prof.decode_table)] + ([("prefill", prof.prefill_table)]
                                                   if self.engine.prefill == "disaggregated" else [])
        for curve, table in tables:  # one request decoding (or a prompt's last chunk) is a pass of B = 1
            if not table.covers(1):
                raise ValueError(
                    f"hardware.profile: {prof.path or prof.name}: its {curve} curve starts at B = "
                    f"{table.min_batch_tokens} with below_min: error, so a pass of one token (one request "
                    "decoding) cannot be priced; allowed: a curve measured from B = 1, or below_min: flat")
        if self.confidence.head == "profile" and not self.acceptance.build().confidence:
            raise ValueError("confidence.head: profile needs an acceptance profile that measured its head "
                             "(the drafter lab's lab-*.yaml do); this one has none")
        if self.drafter.kind == "draft_model" and "draft_model" not in prof.drafters \
                and not isinstance(prof.drafter, DrafterCost):
            raise ValueError(f"drafter.kind: profile {prof.name} has no measured draft model; allowed here: "
                             f"{', '.join(k for k in DRAFTER_KINDS if k != 'draft_model')}")
        if self.engine.prefill_chunk_tokens >= self.engine.max_batch_tokens:
            raise ValueError("engine.prefill_chunk_tokens: must be below max_batch_tokens (decode anchors need room)")
        spec = self.draft_spec()
        drafter = Drafter(spec, prof)
        mem, blocks = kv_memory_at_start(prof, drafter)  # as the engine sizes its KV cache
        if blocks <= 0:
            raise ValueError(_no_kv_block(spec.memtp, drafter, mem))
        return self

    def capped_settings(self) -> list[str]:
        """The draft-length controller's settings above the draft length (``draft_spec().max_draft_len``),
        which a run caps at it, each as a note: ``"draft_control.table['1-8'] (batch_table) is 9,
        above the draft length 7: capped at 7"``; with the elastic MEMTP ensemble, those above its
        ``max_depth`` (a k at or below it is capped at the depth the ensemble runs at, which is what
        the ensemble is for); and a static ``policy.k`` above a MEMTP ensemble's depth. Not
        refused: one table (or k) may serve drafters of several depths (a sweep), where only some
        runs cap it."""
        spec = self.draft_spec()
        if not spec.speculative:
            return []
        width, name = spec.max_draft_len, self.draft_control.name
        params = control_class(name).Params(**self.draft_control.params)
        cap = (f"the elastic ensemble's max_depth {width}: capped at its depth (at most {width})"
               if self.memtp.depth == "elastic" else f"the draft length {width}: capped at {width}")
        out = [f"draft_control.{where} ({name}) is {k}, above {cap}" for where, k in params.k_settings() if k > width]
        k = self.policy.params.get("k")  # static k under a MEMTP ensemble (without one, k is the draft length)
        if self.memtp.depth is not None and k is not None and int(k) > width:
            out.append(f"policy.k ({self.policy.name}) is {k}, above {cap}")
        return out

    def ignored_fields(self) -> dict[str, str]:
        """Dotted paths whose value cannot change this scenario's run, each with the reason.

        A field listed here that the user set is refused at load (by :func:`load_scenario`, or by
        :meth:`Study.expand` when it takes effect in no run of the study): every field a user can
        set either changes the resolved scenario or is refused.
        """
        out: dict[str, str] = {}
        for f, mode in _MODE_ONLY.items():
            if self.workload.mode != mode:
                out[f"workload.{f}"] = f"only used with workload.mode: {mode}"
        if self.engine.prefill == "colocated":
            out["engine.prefill_gpus"] = "only used with engine.prefill: disaggregated"
        memtp_only = [f for f in MemtpConfig.model_fields if f != "depth"]
        if self.memtp.depth is None:
            for f in memtp_only:
                out[f"memtp.{f}"] = "only used with memtp.depth (elastic or a number of heads)"
        elif self.policy.name in _NO_MEMTP:  # a per-run fact: a study may mix it with policies that draft
            for f in MemtpConfig.model_fields:
                out[f"memtp.{f}"] = (f"policy {self.policy.name!r} {_NO_MEMTP[self.policy.name]}; the ensemble needs "
                                     f"one of {', '.join(p for p in available_policies() if p not in _NO_MEMTP)}")
        else:
            # the ensemble owns the draft length: DraftSpec.resolve overwrites a policy's gamma with
            # it, so a gamma the user set would be silently replaced (a fresh user's report: a sweep
            # of policy.gamma under MEMTP gave identical runs labelled 3 and 7)
            width = "memtp.max_depth" if self.memtp.depth == "elastic" else "memtp.depth"
            if "gamma" in policy_class(self.policy.name).Params.model_fields:
                out["policy.gamma"] = f"with memtp.depth set the ensemble's draft length ({width}) replaces it"
            k = self.policy.params.get("k")
            if self.memtp.depth != "elastic" and k is not None and int(k) >= int(self.memtp.depth):
                out["policy.k"] = (f"memtp.depth {self.memtp.depth} drafts {self.memtp.depth} tokens and k >= "
                                   "that verifies all of them")
            if self.memtp.coherence == "tower":
                out["memtp.coherence_estimator"] = "only used with memtp.coherence: ewma"
            if self.memtp.depth != "elastic":
                for f in ("max_depth", "r_low", "r_high", "min_dwell_rounds", "initial_depth", "head_load_gb_per_s"):
                    out[f"memtp.{f}"] = "only used with memtp.depth: elastic (a fixed depth drafts its own number of heads)"
        params = policy_class(self.policy.name).Params.model_fields
        if "probe_every" in params and "fallback" in params \
                and not self.policy.params.get("fallback", params["fallback"].default):
            out["policy.probe_every"] = "only used with policy.fallback: true, where it spaces the probes"
        if not self.draft_spec().speculative:
            for f in ConfidenceConfig.model_fields:
                out[f"confidence.{f}"] = f"policy {self.policy.name!r} drafts nothing, so it reads no confidences"
        elif self.confidence.head == "oracle":
            for f in ("noise_sd", "overconfidence", "sts", "sts_rounds"):
                out[f"confidence.{f}"] = "only used with confidence.head: model (the oracle reports the truth)"
        elif self.confidence.head == "profile":
            for f in ("noise_sd", "overconfidence"):
                out[f"confidence.{f}"] = "not used with confidence.head: profile (the profile gives the head)"
        elif self.confidence.sts != "fit":
            out["confidence.sts_rounds"] = "only used with confidence.sts: fit"
        if self.acceptance.source != "profile":
            out["acceptance.domain_mix"] = "only used with an acceptance profile (the other sources give one model for every domain)"
        if self.acceptance.source in ("profile", "alpha"):
            for f in ("sigma_request", "sigma_round"):
                out[f"acceptance.{f}"] = ("only used with acceptance conditional, per_position, mean_acceptance_length "
                                          "or accepted_ratio; a profile states its own, alpha has none")
        if self.acceptance.source not in _NEEDS_DRAFT_LEN:
            out["acceptance.draft_len"] = "only used with acceptance mean_acceptance_length or accepted_ratio"
        if self.hardware.table is None:
            for f in ("memory", "name"):
                out[f"hardware.{f}"] = "only used with hardware.table (a profile has its own)"
        if not self.draft_spec().speculative:
            for f in DrafterConfig.model_fields:
                out[f"drafter.{f}"] = f"policy {self.policy.name!r} drafts nothing"
            out["draft_control"] = f"policy {self.policy.name!r} drafts nothing"
        elif not control_class(self.draft_control.name).dynamic:
            for f in ("tax", "switch_s"):  # (the params every controller takes; only the dynamic ones pay them)
                out[f"draft_control.{f}"] = (f"draft_control {self.draft_control.name!r} is not dynamic: it never "
                                             "taxes a pass or switches speculation off")
        elif self.drafter.kind != "ngram":
            out["drafter.cpu_ms_per_request"] = "only used with drafter.kind: ngram"
        return out

    def run_identity(self) -> str:
        """The scenario as a run resolves it, as canonical JSON: scenarios with the same identity
        simulate the same thing. Unlike ``model_dump`` it fills in the defaults of the policy's and
        the draft controller's parameters, which the dump leaves as written."""
        doc = self.model_dump(mode="json")
        doc["policy"] = {"name": self.policy.name, **self.policy.resolved_params()}
        doc["draft_control"] = {"name": self.draft_control.name, **self.draft_control.resolved_params()}
        return json.dumps(doc, sort_keys=True)

    def memtp_settings(self) -> MemtpSettings | None:
        """The MEMTP ensemble's settings, or None when the classic drafter runs (no ``memtp.depth``,
        or a policy the ensemble cannot drive: :meth:`ignored_fields` names those settings)."""
        if self.memtp.depth is None or self.policy.name in _NO_MEMTP:
            return None
        return MemtpSettings(**self.memtp.model_dump())

    def draft_spec(self) -> DraftSpec:
        """What the drafter drafts in this scenario (the one owner of the draft length): the block
        width and the policy's parameters as the run uses them (see :mod:`memtp_sim.drafting`)."""
        d = self.drafter
        return DraftSpec.resolve(self.policy.name, self.policy.params, self.memtp_settings(), kind=d.kind,
                                 p_min=d.p_min, cpu_ms_per_request=d.cpu_ms_per_request)

    def policy_label(self) -> str:
        """The run's drafting setup as runs report it: the policy, e.g. ``dspark(gamma=7, ...)``, then
        `` @<drafter kind>`` when one is chosen and `` +<controller>`` when it is not ``always``."""
        label = self.draft_spec().policy_label()
        if self.draft_control.name != "always" and self.draft_spec().speculative:
            label += " +" + make_control(self.draft_control.name, self.draft_control.params).describe()
        return label


class Study(StrictModel):
    """A sweep of scenarios: base x sweep (cartesian) x policies x seeds."""

    _base_dir: str | None = PrivateAttr(default=None)

    name: str = Field(..., pattern=r"^[A-Za-z0-9_.-]+$")
    description: str = ""
    base: Scenario
    sweep: dict[str, list[Any]] = Field(default_factory=dict)
    variants: dict[str, dict[str, Any]] | None = Field(
        None, description="named sets of dotted-path overrides, e.g. {raw: {confidence.sts: none}}; "
        "a sweep dimension labelled 'variant'")
    policies: list[PolicySpec] | None = Field(None, min_length=1)
    seeds: list[NonNegativeInt] = Field(default_factory=lambda: [0], min_length=1)
    report_x: str | None = Field(None, description="sweep key for the report's x axis (default: the load axis)")
    report_series: Literal["policy", "variant"] = Field(
        "policy", description="what the report draws as one line: the policy (default), or the variant (when "
        "variants set the drafter, controller or acceptance and each is one setup to compare)")

    @model_validator(mode="before")
    @classmethod
    def _base_runs_a_listed_policy(cls, v: Any) -> Any:
        # a policies list replaces base.policy in every run: a base without one is checked with the
        # list's first policy, not the default dspark, whose block width or drafter weights could
        # refuse settings (memtp.max_depth 100) that no run of the study gives dspark
        if not (isinstance(v, dict) and isinstance(v.get("base"), dict) and "policy" not in v["base"]
                and isinstance(v.get("policies"), list) and v["policies"] and isinstance(v["policies"][0], dict)):
            return v
        name = v["policies"][0].get("name")
        try:
            policy_class(name)
        except InvalidArgumentError:
            return v  # the entry's own check names it
        return {**v, "base": {**v["base"], "policy": {"name": name}}}

    @field_validator("seeds")
    @classmethod
    def _unique_seeds(cls, v: list[int]) -> list[int]:
        dup = sorted({x for x in v if v.count(x) > 1})
        if dup:
            raise ValueError(f"duplicate seed(s) {dup}: each seed is one replicate")
        return v

    @model_validator(mode="after")
    def _series_known(self) -> "Study":
        if self.report_series == "variant" and not self.variants:
            raise ValueError("report_series: variant needs variants")
        return self

    @model_validator(mode="after")
    def _report_x_known(self) -> "Study":
        if self.report_x is not None and not self.label_keys:
            raise ValueError(f"report_x: {self.report_x!r} is not a sweep key: this study has no sweep or variants, "
                             "and report_x picks the x axis among their keys; sweep that field (or drop report_x)")
        if self.report_x is not None and self.report_x not in self.label_keys:
            raise ValueError(f"report_x: {self.report_x!r} is not a sweep key; allowed: {', '.join(self.label_keys)}")
        return self

    @field_validator("policies")
    @classmethod
    def _distinct_policies(cls, v: list[PolicySpec] | None) -> list[PolicySpec] | None:
        # compared with the defaults filled in: {name: dspark} is {name: dspark, gamma: 7}, and
        # both entries would run (and be reported) as the same policy
        seen: dict[str, PolicySpec] = {}
        for p in v or []:
            key = json.dumps([p.name, p.resolved_params()], sort_keys=True)
            if key in seen:
                label = make_policy(p.name, p.params).describe()
                raise ValueError(f"{seen[key].flow()} and {p.flow()} are the same policy ({label}, defaults filled "
                                 "in); list each policy once")
            seen[key] = p
        return v

    @field_validator("sweep")
    @classmethod
    def _sweep_lists(cls, v: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for k, vals in v.items():
            if not vals:
                raise ValueError(f"{k}: sweep values must be a non-empty list")
        return v

    @model_validator(mode="after")
    def _remember_base_dir(self, info: ValidationInfo) -> "Study":
        # relative paths in variants and sweep values resolve against the study file, like base's
        self._base_dir = (info.context or {}).get("base_dir")
        return self

    @model_validator(mode="after")
    def _policy_overrides(self) -> "Study":
        for vname, over in (self.variants or {}).items():
            for k in over:
                clash = [s for s in self.sweep if s == k or s.startswith(k + ".") or k.startswith(s + ".")]
                if clash:
                    raise ValueError(f"variants.{vname}.{k}: the sweep also sets {clash[0]}; one value per run, "
                                     "so set it in one place")
        if self.policies is None:
            return self
        if self.base.policy.params:  # the list replaces base.policy whole: these would never run
            given = ", ".join(f"{k}: {v}" for k, v in self.base.policy.params.items())
            raise ValueError(f"base.policy: the study's policies list chooses every run's policy, so {given} "
                             "never runs; put it in the list's entries (or drop the list)")
        keys = [("sweep", k) for k in self.sweep] + [
            (f"variants.{v}", k) for v, over in (self.variants or {}).items() for k in over]
        for where, k in keys:
            if k in ("policy", "policy.name"):
                raise ValueError(f"{where}.{k}: the study's policies list already chooses the policy; put the "
                                 "policy in the list (or drop the list and sweep policy.name)")
            param = k.removeprefix("policy.")
            entry = next((p for p in self.policies if k.startswith("policy.") and param in p.params), None)
            if entry is not None:  # the sweep's value would replace the entry's: that one never runs
                raise ValueError(f"{where}.{k}: the policies entry {entry.flow()} also sets {param}; one value "
                                 f"per run, so set it in one place (drop {param} from the entry)")
        return self

    def expand(self, *, source: str = "<study>", name_field: Callable[[str], str] | None = None,
               ) -> list[tuple[dict[str, Any], Scenario, int]]:
        """All runs: (labels, scenario, seed), in a stable order.

        Each run starts from ``base``, takes its policy from ``policies`` (when given), then the
        variant's overrides, then the sweep values, so a sweep or variant of ``policy.<param>``
        changes the policy that runs. Relative paths resolve against the study file.

        A ``policy.<param>`` set by a sweep or a variant (or by ``base.policy`` when a sweep or
        variant of ``policy.name`` changes the policy) applies to the runs whose policy has that
        parameter; a run whose policy lacks it runs without it, and its label for that sweep key
        is None (for its variant too, when every override of the variant was such a parameter).
        Such runs that come out the same (no_spec at each value of a ``policy.gamma`` sweep) run
        once; a label on which the merged runs differ is None.

        Args:
            source: the file named in errors.
            name_field: how errors name a scenario field (``workload.concurrency``); by default
                where this study sets it (``base.workload.concurrency``, ``sweep.<path>``,
                ``variants.<name>.<path>``, ``policies.<i>.<param>``).

        Raises:
            ConfigError: a sweep value or variant makes an invalid scenario (the message names the
                point), a ``policy.<param>`` applies to no run of the study (no policy it runs has
                that parameter), or a field the study sets has no effect in any of its runs.
        """
        base = self.base.model_dump(mode="python")
        base["policy"] = self._policy_dict(self.base.policy)
        keys = list(self.sweep)
        policies = self.policies or [None]
        variants = list((self.variants or {"": {}}).items())
        context = {"base_dir": self._base_dir} if getattr(self, "_base_dir", None) else None
        user_paths = set_paths(self.base) | set(keys)
        ignored: dict[str, list[str]] = {}  # path -> reasons, one per run where it was ignored
        applicable: dict[str, int] = {}
        took: set[tuple[str, str]] = set()  # (where, policy.<param>) that some run's policy has
        lacked: dict[tuple[str, str], list[str]] = {}  # ... -> the policies that lack it
        points: list[tuple[dict[str, Any], Scenario, bool]] = []  # labels, scenario, whether a param was dropped
        for vname, overrides in variants:
            for values in itertools.product(*(self.sweep[k] for k in keys)):
                for pol in policies:
                    doc = copy.deepcopy(base)
                    if pol is not None:
                        doc["policy"] = self._policy_dict(pol)
                    for k, v in overrides.items():
                        _set_dotted(doc, k, v, f"{source}: variants.{vname}")
                    for k, v in zip(keys, values):
                        _set_dotted(doc, k, v, source)
                    spread = [("sweep", k) for k in keys if _is_policy_param(k)] + [
                        (f"variants.{vname}", k) for k in overrides if _is_policy_param(k)]
                    if pol is None and "policy.name" in set(keys) | set(overrides):
                        given = {k for _, k in spread}  # base's value is replaced wherever these apply
                        spread += [("base", p) for p in sorted(self.base.policy.param_paths) if p not in given]
                    dropped = _drop_foreign_params(doc["policy"], spread, took, lacked)
                    try:
                        scen = Scenario.model_validate(doc, context=context)
                    except ValidationError as e:
                        # name the run that failed; a point with no sweep, variant or policy list is the base
                        where = ", ".join([f"variant={vname}"] * bool(vname) + [f"{k}={_show(v)}" for k, v in zip(keys, values)]
                                          + ([f"policy={pol.name}"] if pol is not None and len(policies) > 1 else []))
                        raise ConfigError(format_validation_error(e, f"{source} ({where})" if where else source)) from None
                    reasons = scen.ignored_fields()
                    run_policy = pol if pol is not None else self.base.policy
                    for path in (user_paths | set(overrides) | run_policy.param_paths
                                 | scen.draft_control.param_paths) - dropped:
                        applicable[path] = applicable.get(path, 0) + 1
                        if path in reasons:
                            ignored.setdefault(path, []).append(reasons[path])
                    labels = ({"variant": vname} if vname else {}) | dict(zip(keys, values))
                    labels.update({k: None for k in keys if k in dropped})
                    if vname and overrides and set(overrides) <= dropped:
                        labels["variant"] = None  # the variant changes nothing in this run
                    labels["policy"] = scen.policy_label()
                    points.append((labels, scen, bool(dropped)))
        for (where, path), names in lacked.items():
            if (where, path) not in took:
                allowed = list(dict.fromkeys(f for n in names for f in policy_class(n).Params.model_fields))
                what = (f"policy {names[0]!r}" if len(names) == 1
                        else f"every policy this study runs ({', '.join(names)})")
                raise ConfigError(f"{source}: {where}.{path}: unknown parameter of {what}; allowed: "
                                  f"{', '.join(allowed) or 'no parameters'}")
        for path, n in applicable.items():
            if len(ignored.get(path, [])) == n:
                raise ConfigError(f"{source}: {(name_field or self._where_set)(path)}: has no effect in any run of this study "
                                  f"({ignored[path][0]}); remove it or change the setting it depends on")
        return [(labels, scen, int(seed)) for labels, scen in _merge_unchanged(points) for seed in self.seeds]

    def _where_set(self, path: str) -> str:
        """Where this study file sets scenario field ``path``, as its other errors name places:
        ``sweep.<path>``, ``variants.<name>.<path>``, ``policies.<i>.<param>`` (a list's items numbered
        as validation errors number them) or ``base.<path>``
        (the first that sets it, in the order their values take effect)."""
        if path in self.sweep:
            return f"sweep.{path}"
        for name, overrides in (self.variants or {}).items():
            if path in overrides:
                return f"variants.{name}.{path}"
        for i, pol in enumerate(self.policies or []):
            if path in pol.param_paths:
                return f"policies.{i}.{path.removeprefix('policy.')}"
        return f"base.{path}"

    @property
    def label_keys(self) -> list[str]:
        """Sweep dimensions as they appear in run labels (``variant`` first when present)."""
        return (["variant"] if self.variants else []) + list(self.sweep)

    @staticmethod
    def _policy_dict(p: PolicySpec) -> dict[str, Any]:
        return {"name": p.name, **p.params}


def _is_policy_param(key: str) -> bool:
    """Whether a sweep or variant key sets one parameter of whatever policy the run has."""
    return key.startswith("policy.") and key != "policy.name"


def _drop_foreign_params(policy: dict[str, Any], spread: list[tuple[str, str]], took: set[tuple[str, str]],
                         lacked: dict[tuple[str, str], list[str]]) -> set[str]:
    """Remove from one run's ``policy`` mapping the spread parameters its policy does not have.

    Args:
        policy: the run's ``{name: ..., **params}``, edited in place.
        spread: ``(where, "policy.<param>")`` set across policies (by ``sweep``, ``variants.<v>``
            or ``base``), not by the policy's own entry.
        took: updated with those the policy has.
        lacked: updated with the policy's name for those it lacks.

    Returns:
        The ``policy.<param>`` paths removed (none when the name is not a policy: validation
        names that).
    """
    try:
        fields = policy_class(policy.get("name")).Params.model_fields if isinstance(policy, dict) else None
    except InvalidArgumentError:
        fields = None
    if fields is None:
        return set()
    dropped = set()
    for where, path in spread:
        param = path.split(".")[1]
        if param in fields:
            took.add((where, path))
        else:
            policy.pop(param, None)
            dropped.add(path)
            names = lacked.setdefault((where, path), [])
            if policy["name"] not in names:
                names.append(policy["name"])
    return dropped


def _merge_unchanged(points: list[tuple[dict[str, Any], Scenario, bool]]) -> list[tuple[dict[str, Any], Scenario]]:
    """Run once the points that a dropped policy parameter made the same run.

    Points with the same :meth:`Scenario.run_identity` merge when at most one of them kept every
    value it was given: that one is kept (its labels as they are); else the first is, with None
    for each label on which they differ. Two that kept every value are left for
    :func:`memtp_sim.study.plan_runs` to refuse (a value listed twice).
    """
    groups: dict[str, list[int]] = {}
    for i, (_, scen, _) in enumerate(points):
        groups.setdefault(scen.run_identity(), []).append(i)
    gone: set[int] = set()
    for idx in groups.values():
        exact = [i for i in idx if not points[i][2]]
        if len(idx) == 1 or len(exact) > 1:
            continue
        keep = exact[0] if exact else idx[0]
        if not exact:
            labels = points[keep][0]
            for k in labels:
                if any(points[i][0].get(k) != labels[k] for i in idx):
                    labels[k] = None
        gone |= set(idx) - {keep}
    return [(labels, scen) for i, (labels, scen, _) in enumerate(points) if i not in gone]


def set_paths(model: BaseModel, prefix: str = "") -> set[str]:
    """Dotted paths of the fields a user set explicitly (pydantic's ``model_fields_set``), recursing
    into sections; a policy counts as one field (its parameters are the policy's own).

    Args:
        model: a validated config model (a :class:`Scenario` or one of its sections).
        prefix: prepended to every path (``"engine."`` for the engine section).

    Returns:
        The set of dotted paths, e.g. ``{"engine.prefill_gpus", "policy"}``.
    """
    out: set[str] = set()
    for name in model.model_fields_set:
        value = getattr(model, name)
        path = f"{prefix}{name}"
        if isinstance(value, BaseModel) and not isinstance(value, (PolicySpec, ControlSpec)):
            out |= set_paths(value, path + ".")
        else:
            out.add(path)
    return out


def _show(v: Any) -> str:
    """A value as a user wrote it (numpy scalars as plain numbers)."""
    if hasattr(v, "item") and callable(v.item):
        try:
            v = v.item()
        except (TypeError, ValueError):
            pass
    return "a mapping" if isinstance(v, dict) else repr(v)


def _set_dotted(doc: dict[str, Any], key: str, value: Any, source: str) -> None:
    parts = key.split(".")
    node = doc
    for p in parts[:-1]:
        if not isinstance(node.get(p), dict):
            raise ConfigError(f"{source}: sweep.{key}: {p!r} is not a section of the scenario")
        node = node[p]
    # a policy's or a controller's parameter may be new here: their own models check the names
    if parts[-1] not in node and parts[0] not in ("policy", "draft_control"):
        raise ConfigError(f"{source}: sweep.{key}: unknown field; allowed in {'.'.join(parts[:-1]) or 'scenario'}: "
                          f"{', '.join(sorted(node))}")
    node[parts[-1]] = value


def yaml_flow(doc: dict[str, Any]) -> str:
    """A ``{name: ..., **params}`` mapping as it could be written in YAML (a policies entry, a
    ``--policies`` item): the bare name without parameters, else a one-line flow mapping."""
    if set(doc) == {"name"}:
        return str(doc["name"])
    return yaml.safe_dump(doc, default_flow_style=True, sort_keys=False, width=1 << 30).strip()


def _resolve_path(v: str, info: ValidationInfo) -> str:
    base_dir = (info.context or {}).get("base_dir") if info is not None else None
    p = Path(v).expanduser()
    if not p.is_absolute() and base_dir is not None:
        p = Path(base_dir) / p
    return str(p.resolve()) if p.exists() else str(p)


def _no_folder(v: str, info: ValidationInfo, what: str) -> None:
    """Refuse a path (not a bare profile name) that names a folder: the loaders would call it "not found"."""
    p = Path(_resolve_path(v, info))
    if p.is_dir() and (Path(v).name != v or v in (".", "..") or v.endswith((".yaml", ".yml"))):
        raise ValueError(not_a_file(p, what))


def _allowed_keys(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str] | None:
    cur: Any = model
    for part in loc:
        if isinstance(part, int) or cur is None:
            continue
        field = getattr(cur, "model_fields", {}).get(part)
        if field is None:
            return None
        ann = field.annotation
        cur = next((a for a in (getattr(ann, "__args__", None) or (ann,))
                    if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if cur is None and part == loc[-1]:
            return None
    return sorted(getattr(cur, "model_fields", {})) if cur is not None else None


#: What one item of a list or mapping field is called in "give at least one ..." messages.
_ITEM_NAMES = {"seeds": "seed", "policies": "policy", "search_space": "entry", "objectives": "objective",
               "choices": "choice", "sweep": "value"}


def _too_short(loc: tuple[Any, ...], min_length: int) -> str:
    """``give at least one seed`` for an empty ``seeds`` (the item named after the field)."""
    name = next((str(p) for p in reversed(loc) if isinstance(p, str)), "")
    item = _ITEM_NAMES.get(name, "item")
    return f"give at least one {item}" if min_length == 1 else f"give at least {min_length} {item}s"


def format_validation_error(e: ValidationError, source: str, model: type[BaseModel] | None = None) -> str:
    """One line: ``<source>: <field>: <what is wrong> (got <value>)``, plus a count of other errors."""
    errs = e.errors()
    err = errs[0]
    loc = tuple(err["loc"])
    field = ".".join(str(x) for x in loc) or "(top level)"
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        allowed = _allowed_keys(model, loc[:-1]) if model is not None else None
        msg = "unknown key" + (f"; allowed: {', '.join(allowed)}" if allowed else "")
        line = f"{source}: {field}: {msg}"
    elif err["type"] == "missing":
        line = f"{source}: {field}: required field is missing"
    elif err["type"] == "too_short":
        line = f"{source}: {field}: {_too_short(loc, (err.get('ctx') or {}).get('min_length', 1))}"
    elif err["type"] == "value_error" or "input" not in err:
        # a model-level check names its own field(s) in the message
        named = not loc or msg.startswith((f"{field}.", f"{field}:"))  # e.g. "policy.gamma: ..." under policy
        head, sep, rest = msg.partition(": ")
        if (not named and sep and model is not None and re.fullmatch(r"\w+(\.\w+)*", head)
                and head.split(".")[0] in (_allowed_keys(model, loc) or ())):
            # a section's check about one of its fields ("concurrency: ..." under workload): the
            # field's dotted path, as a field's own error has it (the dashboard shows it there)
            line = f"{source}: {field}.{head}: {rest}"
        elif not named and sep and loc and re.fullmatch(r"\w+(\.\w+)+", head) and head.split(".")[0] == str(loc[-1]):
            # a section's check naming its own path ("policy.gamam: ..." under base.policy): the
            # path once, not the section twice (base.policy: policy.gamam)
            line = f"{source}: {'.'.join(map(str, loc[:-1]))}{'.' if len(loc) > 1 else ''}{head}: {rest}"
        else:
            line = f"{source}: {msg}" if named else f"{source}: {field}: {msg}"
    else:
        line = f"{source}: {field}: {msg} (got {_show(err['input'])})"
    if len(errs) > 1:
        line += f" [+{len(errs) - 1} more error(s)]"
    return line


#: The kinds of YAML file the commands read: what the top level holds, an example, and how to use one.
_KINDS: dict[str, tuple[str, str, str]] = {
    "scenario": ("hardware, acceptance, workload, engine, policy...", "scenarios/h200-colocated.yaml",
                 "a scenario is one run: search its SLA capacity with `python -m memtp_sim capacity {path} --slo "
                 "'ttft_s_p90 <= 2'`, or run it as the `base:` of a study (name, base, sweep)"),
    "study": ("name, base, sweep, policies, seeds", "studies/load.yaml",
              "run it with `python -m memtp_sim run {path}`"),
    "tune spec": ("name, base, search_space, objectives, constraints, seeds", "studies/tune.yaml",
                  "run it with `python -m memtp_sim tune {path}`"),
    "drafter-lab spec": ("name, seed, gamma, source, training, evaluation, drafters", "studies/drafter_lab.yaml",
                         "run it with `python -m memtp_sim drafter-lab {path}`"),
    "hardware profile": ("name, chip, model, verify, memory...", "calibration/h200/llama31-8b-bf16.yaml",
                         "name it in a scenario's `hardware: {{profile: {path}}}`, or check it with "
                         "`python -m memtp_sim calibrate check {path}`"),
    "acceptance profile": ("name, source, domains...", "calibration/acceptance/dspark-qwen3.yaml",
                           "name it in a scenario's `acceptance: {{profile: {path}}}`"),
}


def yaml_kind(doc: Any) -> str | None:
    """Which kind of file a parsed YAML is, told by its top-level keys.

    Args:
        doc: the parsed top level.

    Returns:
        ``"tune spec"`` (``search_space``, ``objectives``, ``n_trials``, ``sampler`` or
        ``pair_constraints``), ``"study"`` (``base``), ``"drafter-lab spec"`` (``training``,
        ``evaluation`` or a top-level ``gamma``), ``"hardware profile"`` (``chip``,
        ``measurements``, ``verify`` or ``caveats``), ``"acceptance profile"`` (``domains``,
        ``fit_gamma`` or ``sigma_note``), ``"scenario"`` (only scenario sections), or None when
        the keys say nothing (then the expected model's own error names the problem).
    """
    if not isinstance(doc, dict):
        return None
    keys = {str(k) for k in doc}
    if keys & {"search_space", "objectives", "n_trials", "sampler", "pair_constraints"}:
        return "tune spec"
    if "base" in keys:
        return "study"
    if keys & {"training", "evaluation", "gamma"}:
        return "drafter-lab spec"
    if keys & {"chip", "measurements", "verify", "caveats"}:
        return "hardware profile"
    if keys & {"domains", "fit_gamma", "sigma_note"}:
        return "acceptance profile"
    if keys and keys <= set(Scenario.model_fields):
        return "scenario"
    return None


def _a(noun: str) -> str:
    """The indefinite article of ``noun``."""
    return "an" if noun[:1] in "aeiou" else "a"


def read_config_yaml(path: str | Path, expected: str) -> dict[str, Any]:
    """Read a YAML a command takes, refusing a folder or a file of another kind in one line.

    Args:
        path: the file.
        expected: the kind the command takes, a key of the kinds :func:`yaml_kind` tells apart
            (``"scenario"``, ``"study"``, ``"tune spec"``, ``"drafter-lab spec"``).

    Returns:
        The top-level mapping.

    Raises:
        ConfigError: ``path`` is a folder, unreadable or not a YAML mapping
            (:func:`memtp_sim._io.read_yaml`), or its top-level keys show another kind of file
            (the message says which, and the command that takes it).
    """
    keys, example, _ = _KINDS[expected]
    if Path(path).is_dir():
        raise ConfigError(f"{path}: is a directory, not a {expected} file; give the YAML file, e.g. {example}")
    doc = read_yaml(path, what=f"a mapping at the top level ({keys})")
    why = other_kind(path, doc, expected)
    if why is not None:
        raise ConfigError(why)
    return doc


def other_kind(path: str | Path, doc: Any, expected: str) -> str | None:
    """Why the parsed YAML ``doc`` of ``path`` is not the kind ``expected`` (a key of the kinds
    :func:`yaml_kind` tells apart), or None where its keys say it is, or say nothing: ``"<path>:
    this is a study, not a hardware profile (whose top level has ...); run it with ..."``."""
    kind = yaml_kind(doc)
    if kind is None or kind == expected:
        return None
    keys, example, _ = _KINDS[expected]
    return (f"{path}: this is {_a(kind)} {kind}, not {_a(expected)} {expected} (whose top level has {keys}, e.g. "
            f"{example}); {_KINDS[kind][2].format(path=path)}")


def load_study(path: str | Path) -> Study:
    """Read and validate a study YAML; relative paths resolve against the YAML's folder.

    Raises:
        ConfigError: unreadable file, unknown key, wrong type, bad value, missing file.
    """
    doc = read_config_yaml(path, "study")
    p = Path(path)
    try:
        study = Study.model_validate(doc, context={"base_dir": str(p.parent)})
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, str(path), Study)) from None
    study.expand(source=str(path))  # surface sweep errors now, before anything runs
    return study


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a single-scenario YAML (the ``base`` section shape).

    Raises:
        ConfigError: unreadable file, unknown key, wrong type, bad value, a setting with no effect."""
    doc = read_config_yaml(path, "scenario")
    p = Path(path)
    try:
        scen = Scenario.model_validate(doc, context={"base_dir": str(p.parent)})
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, str(path), Scenario)) from None
    check_no_ignored_fields(scen, str(path))
    return scen


def check_no_ignored_fields(scenario: Scenario, source: str) -> None:
    """Refuse a scenario in which a field the user set cannot take effect.

    Raises:
        ConfigError: one line naming ``source``, the field and why it has no effect.
    """
    reasons = scenario.ignored_fields()
    for path in sorted(set_paths(scenario) | scenario.policy.param_paths | scenario.draft_control.param_paths):
        if path in reasons:
            raise ConfigError(f"{source}: {path}: has no effect in this scenario ({reasons[path]}); "
                              "remove it or change the setting it depends on")

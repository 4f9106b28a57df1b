"""Optuna tuning of a scenario: generic search space, noise-aware trials, resumable storage.

``python -m memtp_sim tune studies/tune.yaml`` reads a *tune spec* (YAML)::

    name: tune                       # Optuna study name; results go to results/<name>/
    base: {...}                      # a Scenario, the same shape as a study's ``base``
    search_space:                    # dotted scenario path -> distribution
      confidence.temperature: {type: float, low: 0.5, high: 3.0, log: true}
      policy.gamma: {type: int, low: 1, high: 10, step: 1}
      policy.name: {type: categorical, choices: [dspark, threshold]}
      policy.threshold: {type: float, low: 0.05, high: 0.9, when: {policy.name: threshold}}
    pair_constraints:                # ordered pairs, "lower < upper" (see below)
      - memtp.r_low < memtp.r_high
    objectives:                      # default: maximise throughput and p50 tok/s/user
      - {metric: throughput_tok_per_s, direction: maximize}
      - {metric: tok_per_s_user_p50, direction: maximize}
    constraints: [tok_per_s_user_p10 >= 10, num_rejected <= 0]
    seeds: [0, 1]                    # common random numbers: every trial runs every seed (>= 0, unique)
    n_trials: 100
    sampler: {name: tpe, seed: 0, n_startup_trials: 10}
    validation: {top_k: 3, num_seeds: 5}   # fresh-seed re-runs of the top trials
    export: {best_by: throughput_tok_per_s, vllm_method: mtp, sglang_algorithm: NEXTN}

**Search space.** Each key is a dotted path into the scenario (``section.field``; for the policy,
``policy.name`` or ``policy.<param>`` of the policy); the Optuna parameter has the same name, so
``trial.params`` are scenario values. ``type`` is ``float`` (``low``, ``high``, ``log``), ``int``
(``low``, ``high``, ``step``, ``log``) or ``categorical`` (``choices``). ``when: {path: value or
[values]}`` makes an entry conditional on a categorical entry (sampled only when it matches). If
``policy.name`` is sampled, base policy parameters the chosen policy does not know are dropped;
with the MEMTP ensemble on (``memtp.depth`` set) an untuned base ``policy.gamma`` that differs from
``memtp.max_depth`` is dropped too (the ensemble depth is the draft length).

**Ordered pairs** (``"lower < upper"``, optionally ``{rule: ..., name: ..., min_gap: g}``): every
sampled pair satisfies ``upper > lower`` and ``upper - lower >= min_gap``. Both ends must be numeric
search-space entries. At load the rules' bounds are propagated through the (acyclic) rule graph:
``lower`` is clipped to values that leave room below ``upper``'s maximum, ``upper`` to values above
``lower``'s minimum; an empty range means the space is impossible (e.g. ``r_low``'s range lies
entirely at or above ``r_high``'s) and loading fails. When sampling, ``lower`` is drawn from its
clipped (fixed) range first and ``upper`` *conditionally*, from ``[max(upper.low, lower + gap),
upper.high]`` (the next grid value above ``lower`` for ints; the next float above it when
``min_gap`` is 0). So ``trial.params`` stay plain scenario values (readable in optuna-dashboard and
by the exporter); the price is that ``upper``'s distribution varies between trials, which Optuna
allows and which TPE models per trial. Two known scenario orderings are added automatically when
both ends are tuned and no rule names them: ``memtp.r_low < memtp.r_high`` and
``engine.prefill_chunk_tokens < engine.max_batch_tokens``.

**Objectives and constraints.** An objective is a scalar metric of
:func:`memtp_sim.metrics.compute_metrics` (a name in :data:`memtp_sim.metrics.METRIC_NAMES`,
checked when the YAML is loaded), averaged over the seeds (``nanmean``). A constraint
``metric >= v`` / ``metric <= v`` gives the violation ``v - m`` / ``m - v`` (feasible when <= 0;
a NaN metric counts as violated). Violations go to the sampler: with Optuna >= 5 through
``Trial.set_constraint`` (Optuna 5 deprecated the samplers' ``constraints_func`` in its favour;
constraint-aware samplers, ``study.best_trials`` and ``plot_pareto_front`` read the same stored
values), with Optuna 4 through the sampler's ``constraints_func``. Infeasible trials stay in the
study but never enter the Pareto front or the export.

**Noise.** Every trial runs the same ``seeds`` (common random numbers: all trials see the same
requests and acceptance draws). The trial value is the mean over seeds; per-seed values are the
trial's user attribute ``replicates``. After tuning, the top ``validation.top_k`` trials (feasible
Pareto trials, best ``export.best_by`` first) are re-run on *fresh* seeds (never in ``seeds``) and
reported with a t-distribution 95% confidence interval over those replicates
(:func:`t_confidence_interval`); the result is stored in the study's user attribute
``validation`` and in ``results/<name>/validation.json``.

**Best trial** (multi-objective): among complete, feasible trials on the Pareto front, the one with
the best ``export.best_by`` objective (default: the first objective, throughput), ties to the lower
trial number. This is the same trial as the feasible trial with the best ``best_by`` value, up to
ties. Single objective: the feasible trial with the best value.

**Storage.** Default ``sqlite:///results/<name>/optuna.db``; ``postgresql+psycopg2://...`` (or
another SQLAlchemy URL) for many workers on many hosts, with a heartbeat: a trial whose worker
stops beating for ``grace_period_s`` is failed and re-queued with the same parameters
(``RetryHeartbeatStaleTrialCallback``); ``journal:///path/file.log`` for Optuna's journal file.
A rerun resumes: it counts COMPLETE trials and runs the rest up to ``n_trials``. RUNNING trials
left by a killed worker on this host (its pid is gone) are marked FAIL first; each trial records
its worker's host, pid and process start time in the user attribute ``worker``. ``workers > 1``
starts that many local processes (``spawn``), each calling ``optuna.load_study(...).optimize``.
The storage is standard Optuna storage: optuna-dashboard opens it as it is.

**Ctrl-C.** The first Ctrl-C asks the running trials to stop between two seed runs (that trial
FAILs; finished trials are kept); a second one interrupts at once. Worker processes ignore SIGINT
(the terminal sends it to the whole process group) and stop when the parent tells them to; a worker
that has not stopped 60 s later is terminated, and its RUNNING trial is marked FAIL on resume.

**Report** (``results/<name>/report.html``): the Pareto front, and per objective the optimisation
history and the parameter importances *for a good value* of it. Optuna 5's default importance
evaluator (PED-ANOVA) ranks parameters for reaching *low* target values, so a maximised objective is
passed negated (:func:`importance_target`).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import json
import math
import multiprocessing
import os
import re
import signal
import socket
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Callable, Literal, Sequence

import numpy as np
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    PositiveInt,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from ._version import __version__
from ._io import read_yaml
from .config import Scenario, format_validation_error
from .errors import ConfigError, MemtpSimError
from .metrics import METRIC_NAMES

if TYPE_CHECKING:  # pragma: no cover
    import optuna

__all__ = [
    "FloatDist",
    "IntDist",
    "CategoricalDist",
    "PairConstraint",
    "Objective",
    "MetricConstraint",
    "SamplerSpec",
    "ValidationSpec",
    "ExportSpec",
    "TuneSpec",
    "TuneOutcome",
    "HEADLINE_METRICS",
    "load_tune_spec",
    "parse_tune_spec",
    "static_ranges",
    "sample_params",
    "scenario_for",
    "evaluate",
    "default_storage_url",
    "open_storage",
    "mask_url",
    "open_study",
    "fail_dead_worker_trials",
    "run_tune",
    "feasible_trials",
    "pareto_trials",
    "top_trials",
    "select_trial",
    "constraint_failures",
    "importance_target",
    "param_importances",
    "importance_figure",
    "t_confidence_interval",
    "validate_trials",
    "write_tune_report",
]

#: Study user attribute holding memtp_sim's record (tune spec, names, version).
STUDY_ATTR = "memtp_sim"
#: Metrics stored per trial besides the objectives and constraints (when the run reports them).
HEADLINE_METRICS = (
    "throughput_tok_per_s", "tok_per_s_user_p50", "tok_per_s_user_p10", "ttft_s_p90", "tpot_ms_p50",
    "mean_verify_len", "tau", "acceptance_rate", "ece_mean", "num_rejected", "num_preemptions",
)
#: Violation recorded for a constraint whose metric is NaN (Optuna refuses NaN constraints).
_NAN_VIOLATION = 1.0e18
#: Orderings the scenario itself requires; added as pair rules when both ends are tuned.
_IMPLIED_PAIRS = (("memtp.r_low", "memtp.r_high"), ("engine.prefill_chunk_tokens", "engine.max_batch_tokens"))
_PAIR_RE = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*<\s*([A-Za-z_][\w.]*)\s*$")
_CONSTRAINT_RE = re.compile(r"^\s*([A-Za-z_]\w*)\s*(>=|<=)\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*$")
_PATH_RE = r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$"


# ------------------------------------------------------------------------------------ the spec
def _num(x: Any) -> str:
    """A number for a message: plain ``1.5`` / ``3`` (never ``np.float64(1.5)``), 6 significant digits."""
    if isinstance(x, (bool, np.bool_)):
        return str(bool(x))
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    try:
        return f"{float(x):.6g}"
    except (TypeError, ValueError):
        return str(x)


def _known_metric(v: str) -> str:
    """``v`` if it is one of :data:`memtp_sim.metrics.METRIC_NAMES`; else a ValueError naming the closest."""
    if v in METRIC_NAMES:
        return v
    close = difflib.get_close_matches(v, METRIC_NAMES, n=4, cutoff=0.5)
    close += [m for m in METRIC_NAMES if v.lower() in m and m not in close][: max(0, 4 - len(close))]
    hint = (f"closest allowed: {', '.join(close)}" if close
            else "no close match; e.g. throughput_tok_per_s, tok_per_s_user_p50, ttft_s_p90, num_rejected")
    raise ValueError(f"unknown metric {v!r}; {hint} (all {len(METRIC_NAMES)}: memtp_sim.metrics.METRIC_NAMES)")


def _at(values: dict[str, Any]) -> str:
    """``path=value, ...`` with numbers written plainly."""
    return ", ".join(f"{k}={_num(v) if isinstance(v, (int, float, np.number)) else repr(v)}"
                     for k, v in values.items())


def _seed_ok(v: int) -> int:
    if v < 0:
        raise ValueError(f"must be >= 0 (got {v}); numpy seeds its random generators with non-negative integers")
    return v


def _unique_seeds(v: list[int] | None) -> list[int] | None:
    if v is None:
        return v
    dups = sorted({x for x in v if v.count(x) > 1})
    if dups:
        listed = ", ".join(f"{d} is listed {v.count(d)} times" for d in dups)
        raise ValueError(f"each seed at most once ({listed}; got {v})")
    return v


#: A run seed (>= 0).
Seed = Annotated[int, AfterValidator(_seed_ok)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Scalar = str | int | float | bool | None


class _Dist(_Strict):
    when: dict[str, Scalar | list[Scalar]] | None = Field(
        None, description="sample only when these categorical entries take these value(s)")


class FloatDist(_Dist):
    """A float parameter, uniform or log-uniform on ``[low, high]``."""

    type: Literal["float"]
    low: float
    high: float
    log: bool = False

    @model_validator(mode="after")
    def _bounds(self) -> "FloatDist":
        if not (math.isfinite(self.low) and math.isfinite(self.high)):
            raise ValueError(f"low and high must be finite numbers (got low={self.low}, high={self.high})")
        if self.low >= self.high:
            raise ValueError(f"low must be < high (got low={self.low}, high={self.high}); "
                             "a constant belongs in base, not in search_space")
        if self.log and self.low <= 0:
            raise ValueError(f"log: true needs low > 0 (got low={self.low})")
        return self


class IntDist(_Dist):
    """An int parameter on the grid ``low, low + step, ..., high``."""

    type: Literal["int"]
    low: int
    high: int
    step: PositiveInt = 1
    log: bool = False

    @model_validator(mode="after")
    def _bounds(self) -> "IntDist":
        if self.low >= self.high:
            raise ValueError(f"low must be < high (got low={self.low}, high={self.high}); "
                             "a constant belongs in base, not in search_space")
        if (self.high - self.low) % self.step:
            raise ValueError(f"high - low must be a multiple of step (got low={self.low}, high={self.high}, "
                             f"step={self.step})")
        if self.log and (self.low < 1 or self.step != 1):
            raise ValueError(f"log: true needs low >= 1 and step 1 (got low={self.low}, step={self.step})")
        return self


class CategoricalDist(_Dist):
    """One of a list of choices."""

    type: Literal["categorical"]
    choices: list[Scalar] = Field(..., min_length=1)

    @field_validator("choices")
    @classmethod
    def _unique(cls, v: list[Scalar]) -> list[Scalar]:
        if len({json.dumps(c) for c in v}) != len(v):
            raise ValueError(f"choices must be unique (got {v!r})")
        return v


Distribution = Annotated[FloatDist | IntDist | CategoricalDist, Field(discriminator="type")]


class PairConstraint(_Strict):
    """Ordered pair ``lower < upper`` (and ``upper - lower >= min_gap``), e.g. ``memtp.r_low < memtp.r_high``."""

    rule: str
    name: str | None = None
    min_gap: NonNegativeFloat = 0.0

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, v: Any) -> Any:
        return {"rule": v} if isinstance(v, str) else v

    @field_validator("rule")
    @classmethod
    def _parse(cls, v: str) -> str:
        m = _PAIR_RE.match(v)
        if m is None:
            raise ValueError(f"expected 'lower.path < upper.path' (got {v!r})")
        if m.group(1) == m.group(2):
            raise ValueError(f"the two sides must differ (got {v!r})")
        return f"{m.group(1)} < {m.group(2)}"

    @property
    def lower(self) -> str:
        return self.rule.split(" < ")[0]

    @property
    def upper(self) -> str:
        return self.rule.split(" < ")[1]

    @property
    def label(self) -> str:
        return self.name or self.rule


class Objective(_Strict):
    """A scalar metric to maximise or minimise (mean over the seeds)."""

    metric: str = Field(..., pattern=r"^[A-Za-z_]\w*$")
    direction: Literal["maximize", "minimize"]

    _known = field_validator("metric")(_known_metric)


class MetricConstraint(_Strict):
    """``metric >= value`` or ``metric <= value`` on the seed-mean of a metric."""

    metric: str = Field(..., pattern=r"^[A-Za-z_]\w*$")
    op: Literal[">=", "<="]
    value: float

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, v: Any) -> Any:
        if isinstance(v, str):
            m = _CONSTRAINT_RE.match(v)
            if m is None:
                raise ValueError(f"expected 'metric >= number' or 'metric <= number' (got {v!r})")
            return {"metric": m.group(1), "op": m.group(2), "value": float(m.group(3))}
        return v

    _known = field_validator("metric")(_known_metric)

    @property
    def label(self) -> str:
        return f"{self.metric} {self.op} {self.value:g}"

    def violation(self, value: float) -> float:
        """Constraint value for Optuna: <= 0 when satisfied.

        Args:
            value: the metric (seed mean).

        Returns:
            ``self.value - value`` for ``>=``, ``value - self.value`` for ``<=``; a large positive
            number when ``value`` is NaN.
        """
        if value is None or not math.isfinite(float(value)):
            return _NAN_VIOLATION
        return self.value - float(value) if self.op == ">=" else float(value) - self.value


class SamplerSpec(_Strict):
    """Optuna sampler: ``tpe`` (default; multi-objective and constraint aware), ``nsga2`` or ``random``."""

    name: Literal["tpe", "nsga2", "random"] = "tpe"
    seed: int = 0
    n_startup_trials: PositiveInt = Field(10, description="tpe: random trials before modelling")
    population_size: PositiveInt = Field(20, ge=2, description="nsga2: population size")


class ValidationSpec(_Strict):
    """Fresh-seed re-runs of the top trials before anything is exported."""

    top_k: int = Field(3, ge=0, description="trials re-run after tuning (0: only on export)")
    num_seeds: int = Field(5, ge=2, description="fresh seeds per trial (>= 2 for a confidence interval)")
    seeds: list[Seed] | None = Field(None, description="explicit fresh seeds (default: after the tuning seeds)")
    confidence: float = Field(0.95, gt=0.0, lt=1.0)

    _unique = field_validator("seeds")(_unique_seeds)


class ExportSpec(_Strict):
    """How ``export`` picks and labels a trial."""

    best_by: str | None = Field(None, description="objective metric that breaks Pareto ties (default: first)")
    vllm_method: str = Field("mtp", description="vLLM speculative_config.method")
    sglang_algorithm: str = Field("NEXTN", description="SGLang --speculative-algorithm")


def _default_objectives() -> list[Objective]:
    return [Objective(metric="throughput_tok_per_s", direction="maximize"),
            Objective(metric="tok_per_s_user_p50", direction="maximize")]


class TuneSpec(_Strict):
    """A tuning job: base scenario, search space, objectives, constraints, seeds (see module docstring)."""

    name: str = Field(..., pattern=r"^[A-Za-z0-9_.-]+$")
    description: str = ""
    base: Scenario
    search_space: dict[Annotated[str, Field(pattern=_PATH_RE)], Distribution] = Field(..., min_length=1)
    pair_constraints: list[PairConstraint] = Field(default_factory=list)
    objectives: list[Objective] = Field(default_factory=_default_objectives, min_length=1)
    constraints: list[MetricConstraint] = Field(default_factory=lambda: [MetricConstraint(
        metric="num_rejected", op="<=", value=0.0)])
    seeds: list[Seed] = Field(default_factory=lambda: [0, 1], min_length=1)
    n_trials: PositiveInt = 100
    sampler: SamplerSpec = Field(default_factory=SamplerSpec)
    validation: ValidationSpec = Field(default_factory=ValidationSpec)
    export: ExportSpec = Field(default_factory=ExportSpec)

    #: Where the spec came from (the YAML path): every error about the spec starts with it.
    _source: str = PrivateAttr("<tune>")

    _unique = field_validator("seeds")(_unique_seeds)

    @model_validator(mode="after")
    def _cross_checks(self) -> "TuneSpec":
        names = [o.metric for o in self.objectives]
        if len(set(names)) != len(names):
            raise ValueError(f"objectives: each metric at most once (got {names})")
        if self.export.best_by is not None and self.export.best_by not in names:
            raise ValueError(f"export.best_by: {self.export.best_by!r} is not an objective; "
                             f"allowed: {', '.join(names)}")
        fresh = self.validation.seeds
        if fresh is not None:
            if len(fresh) < 2:
                raise ValueError(f"validation.seeds: need >= 2 seeds for a confidence interval (got {fresh})")
            clash = sorted(set(fresh) & set(self.seeds))
            if clash:
                raise ValueError(f"validation.seeds: must be fresh, not tuning seeds (both have {clash})")
        return self

    # -- derived -------------------------------------------------------------------------------
    @property
    def source(self) -> str:
        """The YAML file (or other source) the spec was read from; errors about the spec start with it."""
        return self._source

    @property
    def directions(self) -> list[str]:
        return [o.direction for o in self.objectives]

    @property
    def objective_names(self) -> list[str]:
        return [o.metric for o in self.objectives]

    @property
    def best_by(self) -> str:
        return self.export.best_by or self.objectives[0].metric

    @property
    def fresh_seeds(self) -> list[int]:
        """Validation seeds: explicit, or ``num_seeds`` integers right after the largest tuning seed."""
        if self.validation.seeds is not None:
            return list(self.validation.seeds)
        start = max(self.seeds) + 1
        return list(range(start, start + self.validation.num_seeds))

    @property
    def tracked_metrics(self) -> list[str]:
        """Objectives, constraint metrics, then headline metrics (no duplicates)."""
        out: list[str] = []
        for m in [*self.objective_names, *(c.metric for c in self.constraints), *HEADLINE_METRICS]:
            if m not in out:
                out.append(m)
        return out

    def all_pairs(self) -> list[PairConstraint]:
        """Declared pair rules plus the implied scenario orderings whose ends are both tuned."""
        pairs = list(self.pair_constraints)
        named = {(p.lower, p.upper) for p in pairs}
        for lo, up in _IMPLIED_PAIRS:
            if lo in self.search_space and up in self.search_space and (lo, up) not in named:
                pairs.append(PairConstraint(rule=f"{lo} < {up}", name=f"implied: {lo} < {up}"))
        return pairs

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dump that :func:`parse_tune_spec` reads back (policy flattened)."""
        doc = self.model_dump(mode="json", exclude_none=False)
        doc["base"]["policy"] = {"name": self.base.policy.name, **self.base.policy.params}
        return doc


# ------------------------------------------------------------------------------------ loading
_DIST_MODELS: dict[str, type[BaseModel]] = {"float": FloatDist, "int": IntDist, "categorical": CategoricalDist}


def _format(e: ValidationError, source: str) -> str:
    """One line naming the field; drops the discriminator tag from search-space locations."""
    err = e.errors()[0]
    loc = tuple(str(x) for x in err["loc"])
    if err["type"] == "extra_forbidden" and len(loc) == 4 and loc[0] == "search_space" and loc[2] in _DIST_MODELS:
        allowed = ", ".join(sorted(set(_DIST_MODELS[loc[2]].model_fields) - {"type"}))
        return f"{source}: search_space.{loc[1]}.{loc[3]}: unknown key; allowed for type {loc[2]}: {allowed}"
    line = format_validation_error(e, source, TuneSpec)
    line = re.sub(r"(search_space\.[\w.]+?)\.(float|int|categorical)(?=[.:])", r"\1", line)
    return line.replace(": (top level): ", ": ")


def parse_tune_spec(doc: dict[str, Any], *, source: str = "<tune>", base_dir: str | Path | None = None) -> TuneSpec:
    """Validate a tune spec mapping (see the module docstring for the shape).

    Args:
        doc: the parsed YAML mapping.
        source: file name used in error messages.
        base_dir: folder that relative paths (trace, profile) resolve against.

    Returns:
        The validated :class:`TuneSpec`.

    Raises:
        ConfigError: one line naming the source and the field: unknown key, bad distribution
            bounds, unknown scenario path, impossible pair rule, a search-space corner that makes
            an invalid scenario.
    """
    if not isinstance(doc, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level (name, base, search_space, ...)")
    space = doc.get("search_space")
    if isinstance(space, dict):  # a clearer message than pydantic's for a missing / unknown `type`
        for key, entry in space.items():
            if isinstance(entry, dict) and entry.get("type") not in ("float", "int", "categorical"):
                raise ConfigError(f"{source}: search_space.{key}.type: expected float, int or categorical "
                                  f"(got {entry.get('type')!r})")
    try:
        spec = TuneSpec.model_validate(doc, context={"base_dir": str(base_dir) if base_dir is not None else None})
    except ValidationError as e:
        raise ConfigError(_format(e, source)) from None
    spec._source = source
    _check_space(spec, source)
    return spec


def load_tune_spec(path: str | Path) -> TuneSpec:
    """Read and validate a tune YAML; relative paths resolve against the YAML's folder.

    Args:
        path: the YAML file.

    Returns:
        The validated :class:`TuneSpec`.

    Raises:
        ConfigError: unreadable file or any error :func:`parse_tune_spec` raises.
    """
    doc = read_yaml(path)
    return parse_tune_spec(doc, source=str(path), base_dir=Path(path).parent)


def _base_doc(spec: TuneSpec) -> dict[str, Any]:
    doc = spec.base.model_dump(mode="python")
    doc["policy"] = {"name": spec.base.policy.name, **spec.base.policy.params}
    return doc


def _policy_fields(name: str) -> set[str]:
    from .policies import policy_class

    return set(policy_class(name).Params.model_fields)


def _check_space(spec: TuneSpec, source: str) -> None:
    """Pair rules, conditions and paths; then validate the scenario at the space's corners."""
    space = spec.search_space
    pairs = spec.all_pairs()
    # 1) pair rules: both ends numeric entries, no conditions, acyclic, feasible
    for i, pc in enumerate(spec.pair_constraints):
        for side in (pc.lower, pc.upper):
            where = f"{source}: pair_constraints.{i} ({pc.rule})"
            if side not in space:
                raise ConfigError(f"{where}: {side} is not in search_space; both sides must be tuned")
            if isinstance(space[side], CategoricalDist):
                raise ConfigError(f"{where}: {side} is categorical; ordered pairs need float or int entries")
    for pc in pairs:
        for side in (pc.lower, pc.upper):
            if space[side].when is not None:
                raise ConfigError(f"{source}: search_space.{side}: an entry with `when` cannot be in a pair rule "
                                  f"({pc.rule})")
    _sampling_order(spec, source)  # raises on cycles
    static_ranges(spec, source=source)  # raises on an impossible rule
    # 2) conditions name earlier categorical entries and their choices
    for key, d in space.items():
        for target, want in (d.when or {}).items():
            if target not in space or not isinstance(space[target], CategoricalDist):
                raise ConfigError(f"{source}: search_space.{key}.when: {target} must be a categorical "
                                  f"entry of search_space")
            wants = want if isinstance(want, list) else [want]
            bad = [w for w in wants if w not in space[target].choices]
            if bad:
                raise ConfigError(f"{source}: search_space.{key}.when: {bad!r} not among the choices of {target} "
                                  f"({space[target].choices!r})")
    # 3) paths exist in the scenario
    base = _base_doc(spec)
    policy_names = [spec.base.policy.name]
    if "policy.name" in space:
        d = space["policy.name"]
        if not isinstance(d, CategoricalDist):
            raise ConfigError(f"{source}: search_space.policy.name: must be categorical")
        policy_names = [str(c) for c in d.choices]
        try:
            for n in policy_names:
                _policy_fields(n)
        except ValueError as e:
            raise ConfigError(f"{source}: search_space.policy.name: {e}") from None
    for key in space:
        parts = key.split(".")
        if parts[0] == "policy":
            allowed = {"name"}.union(*(_policy_fields(n) for n in policy_names))
            if len(parts) != 2 or parts[1] not in allowed:
                raise ConfigError(f"{source}: search_space.{key}: unknown policy parameter; allowed: "
                                  f"{', '.join(sorted(allowed))}")
            continue
        node: Any = base
        for j, part in enumerate(parts):
            if not isinstance(node, dict) or part not in node:
                where = ".".join(parts[:j]) or "scenario"
                allowed = ", ".join(sorted(node)) if isinstance(node, dict) else "(not a section)"
                raise ConfigError(f"{source}: search_space.{key}: unknown field; allowed in {where}: {allowed}")
            node = node[part]
    mem = base.get("memtp")
    if isinstance(mem, dict) and mem.get("depth") is not None and "policy.gamma" in space:
        raise ConfigError(f"{source}: search_space.policy.gamma: has no effect while base memtp.depth is set "
                          "(the ensemble's max_depth is the draft length); tune memtp.max_depth instead")
    # 4) every corner of the space makes a valid scenario
    for values in _corners(spec):
        try:
            Scenario.model_validate(_scenario_doc(spec, values))
        except ValidationError as e:
            raise ConfigError(format_validation_error(
                e, f"{source}: search_space: invalid scenario at ({_at(values)})", Scenario)) from None


def _corners(spec: TuneSpec) -> list[dict[str, Any]]:
    """All-low and all-high assignments (pair-consistent), and every categorical choice."""
    rng = static_ranges(spec, source=spec.source)
    space = spec.search_space
    cats = [k for k, d in space.items() if isinstance(d, CategoricalDist)]

    def assign(numeric_end: str, cat_values: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key in _sampling_order(spec, spec.source):
            d = space[key]
            if not _when_ok(d.when, out):
                continue
            if isinstance(d, CategoricalDist):
                out[key] = cat_values.get(key, d.choices[0])
                continue
            lo, hi = rng[key]
            if numeric_end == "low":
                for pc in spec.all_pairs():
                    if pc.upper == key:
                        lo = max(lo, _ceil_in(d, out[pc.lower] + pc.min_gap, pc.min_gap == 0))
                out[key] = lo
            else:
                out[key] = hi
        return out

    corners = [assign("low", {}), assign("high", {})]
    for key in cats:
        for choice in space[key].choices:
            corners.append(assign("low", {key: choice}))
    unique: list[dict[str, Any]] = []
    for c in corners:
        if c not in unique:
            unique.append(c)
    return unique


# ------------------------------------------------------------------------------------ sampling
def _ceil_in(d: FloatDist | IntDist, x: float, strict: bool) -> float | int:
    """Smallest value of ``d``'s domain (ignoring ``high``) that is >= x (> x if ``strict``)."""
    if isinstance(d, FloatDist):
        return math.nextafter(x, math.inf) if strict else float(x)
    k = math.ceil((x - d.low) / d.step)
    v = d.low + k * d.step
    if strict and v <= x:
        v += d.step
    return int(v)


def _floor_in(d: FloatDist | IntDist, x: float, strict: bool) -> float | int:
    """Largest value of ``d``'s domain (ignoring ``low``) that is <= x (< x if ``strict``)."""
    if isinstance(d, FloatDist):
        return math.nextafter(x, -math.inf) if strict else float(x)
    k = math.floor((x - d.low) / d.step)
    v = d.low + k * d.step
    if strict and v >= x:
        v -= d.step
    return int(v)


def static_ranges(spec: TuneSpec, *, source: str = "<tune>") -> dict[str, tuple[float | int, float | int]]:
    """Numeric ranges after propagating the pair rules (fixed for the whole study).

    For each rule ``lower < upper`` (gap g): ``lower <= max(upper) - g`` and ``upper >= min(lower) + g``
    (strict when g = 0), repeated until nothing changes.

    Args:
        spec: the tune spec.
        source: file name for error messages.

    Returns:
        ``{path: (low, high)}`` for every float / int entry.

    Raises:
        ConfigError: a rule empties a range (the space cannot satisfy it).
    """
    space = spec.search_space
    rng = {k: (d.low, d.high) for k, d in space.items() if not isinstance(d, CategoricalDist)}
    pairs = spec.all_pairs()
    for _ in range(len(pairs) * max(1, len(rng)) + 1):
        changed = False
        for pc in pairs:
            ld, ud = space[pc.lower], space[pc.upper]
            strict = pc.min_gap == 0
            (llo, lhi), (ulo, uhi) = rng[pc.lower], rng[pc.upper]
            new_lhi = min(lhi, _floor_in(ld, uhi - pc.min_gap, strict))
            new_ulo = max(ulo, _ceil_in(ud, llo + pc.min_gap, strict))
            if new_lhi < llo or new_ulo > uhi:
                gap = f" - {pc.min_gap:g}" if pc.min_gap else ""
                raise ConfigError(
                    f"{source}: pair_constraints ({pc.label}): impossible: {pc.lower} ranges over [{llo}, {lhi}] "
                    f"but {pc.upper}{gap} is at most {uhi - pc.min_gap:g}; the lower side's range must start "
                    f"below the upper side's end")
            if (new_lhi, new_ulo) != (lhi, ulo):
                rng[pc.lower], rng[pc.upper] = (llo, new_lhi), (new_ulo, uhi)
                changed = True
        if not changed:
            break
    return rng


def _sampling_order(spec: TuneSpec, source: str = "<tune>") -> list[str]:
    """Entries in declaration order, moved after what they depend on (`when` targets, pair lowers)."""
    keys = list(spec.search_space)
    deps: dict[str, set[str]] = {k: set() for k in keys}
    for k, d in spec.search_space.items():
        deps[k].update(t for t in (d.when or {}) if t in deps)
    for pc in spec.all_pairs():
        deps[pc.upper].add(pc.lower)
    order: list[str] = []
    done: set[str] = set()
    while len(order) < len(keys):
        ready = [k for k in keys if k not in done and deps[k] <= done]
        if not ready:
            left = [k for k in keys if k not in done]
            raise ConfigError(f"{source}: pair_constraints / when: the rules form a cycle among {', '.join(left)}")
        order.append(ready[0])
        done.add(ready[0])
    return order


def _when_ok(when: dict[str, Any] | None, values: dict[str, Any]) -> bool:
    if not when:
        return True
    for target, want in when.items():
        wants = want if isinstance(want, list) else [want]
        if target not in values or values[target] not in wants:
            return False
    return True


def sample_params(trial: "optuna.trial.Trial", spec: TuneSpec) -> dict[str, Any]:
    """Draw one point of the search space through ``trial.suggest_*``.

    Pair rules hold for every draw: the lower side comes from its propagated (fixed) range, the
    upper side from ``[max(static low, lower + gap), static high]`` (see the module docstring).

    Args:
        trial: a live Optuna trial.
        spec: the tune spec.

    Returns:
        ``{dotted path: value}`` for every entry whose ``when`` condition holds.
    """
    rng = static_ranges(spec, source=spec.source)
    pairs = spec.all_pairs()
    values: dict[str, Any] = {}
    for key in _sampling_order(spec, spec.source):
        d = spec.search_space[key]
        if not _when_ok(d.when, values):
            continue
        if isinstance(d, CategoricalDist):
            values[key] = trial.suggest_categorical(key, d.choices)
            continue
        lo, hi = rng[key]
        for pc in pairs:
            if pc.upper == key:
                lo = max(lo, _ceil_in(d, values[pc.lower] + pc.min_gap, pc.min_gap == 0))
        if lo > hi:  # cannot happen after static_ranges; keep the invariant loud
            raise AssertionError(f"{key}: empty conditional range [{lo}, {hi}]")
        if isinstance(d, FloatDist):
            values[key] = trial.suggest_float(key, float(lo), float(hi), log=d.log)
        else:
            values[key] = trial.suggest_int(key, int(lo), int(hi), step=d.step, log=d.log)
    return values


def _scenario_doc(spec: TuneSpec, values: dict[str, Any]) -> dict[str, Any]:
    doc = copy.deepcopy(_base_doc(spec))
    name = values.get("policy.name")
    if name is not None and name != doc["policy"]["name"]:
        keep = _policy_fields(str(name))
        doc["policy"] = {"name": name, **{k: v for k, v in doc["policy"].items() if k in keep}}
    for key, value in values.items():
        parts = key.split(".")
        node = doc
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    mem = doc.get("memtp")
    if (isinstance(mem, dict) and mem.get("depth") is not None and "policy.gamma" not in values
            and "gamma" in doc["policy"] and doc["policy"]["gamma"] != mem.get("max_depth")):
        del doc["policy"]["gamma"]  # with the ensemble on, the draft length is memtp.max_depth
    return doc


def scenario_for(spec: TuneSpec, values: dict[str, Any]) -> Scenario:
    """The base scenario with ``values`` (dotted path -> value) set.

    When ``policy.name`` changes the policy, base policy parameters the new policy does not
    define are dropped; with ``memtp.depth`` set, an untuned ``policy.gamma`` that differs from
    ``memtp.max_depth`` is dropped (the ensemble depth is the draft length).

    Args:
        spec: the tune spec.
        values: search-space values, e.g. ``trial.params``.

    Returns:
        The validated scenario.

    Raises:
        ConfigError: the values make an invalid scenario.
    """
    try:
        return Scenario.model_validate(_scenario_doc(spec, values))
    except ValidationError as e:
        raise ConfigError(format_validation_error(
            e, f"{spec.source}: search_space: invalid scenario at ({_at(values)})", Scenario)) from None


# ------------------------------------------------------------------------------------ evaluation
class _Stopped(Exception):
    """A stop was requested (Ctrl-C): raised between two seed runs of a trial, which then FAILs."""


def evaluate(scenario: Scenario, seeds: Sequence[int], metrics: Sequence[str], *,
             should_stop: Callable[[], bool] | None = None) -> dict[str, Any]:
    """Run ``scenario`` once per seed and collect scalar metrics.

    Args:
        scenario: the scenario.
        seeds: run seeds (one replicate each).
        metrics: metric names to keep (missing or non-scalar ones are skipped).
        should_stop: checked before each seed run; when it returns True the evaluation is
            abandoned (an internal exception the tuner turns into a FAIL trial and a clean stop).

    Returns:
        ``{"replicates": {metric: [value per seed]}, "means": {metric: nanmean},
        "applied_temperatures": [per-position temperatures of the first seed]}``.
    """
    from .api import run

    reps: dict[str, list[float]] = {m: [] for m in metrics}
    temps: list[float] = []
    for i, seed in enumerate(seeds):
        if should_stop is not None and should_stop():
            raise _Stopped(f"interrupted before seed {seed}")
        res = run(scenario, seed=int(seed))
        if i == 0:
            temps = [float(t) for t in res.provenance.get("confidence", {}).get("applied_temperatures", [])]
        for m in metrics:
            v = res.metrics.get(m)
            if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool):
                reps[m].append(float(v))
    reps = {m: v for m, v in reps.items() if len(v) == len(seeds)}
    means = {}
    for m, v in reps.items():
        arr = np.asarray(v, dtype=np.float64)
        means[m] = float(np.nanmean(arr)) if np.isfinite(arr).any() else float("nan")
    return {"replicates": reps, "means": means, "applied_temperatures": temps}


def _has_set_constraint() -> bool:
    import optuna

    return hasattr(optuna.trial.Trial, "set_constraint")


def _constraints_from_attrs(trial: "optuna.trial.FrozenTrial") -> list[float]:
    return [float(v) for v in trial.user_attrs.get("constraint_values", [])]


def _make_objective(spec: TuneSpec, should_stop: Callable[[], bool] | None = None,
                    ) -> Callable[["optuna.trial.Trial"], float | tuple[float, ...]]:
    use_set_constraint = _has_set_constraint()
    tracked = spec.tracked_metrics

    def objective(trial: "optuna.trial.Trial") -> float | tuple[float, ...]:
        trial.set_user_attr("worker", _worker_identity())
        values = sample_params(trial, spec)
        scen = scenario_for(spec, values)
        try:
            ev = evaluate(scen, spec.seeds, tracked, should_stop=should_stop)
        except _Stopped as e:
            trial.set_user_attr("failed_reason", f"{e} (Ctrl-C); run the same command again to resume")
            raise
        cons = [c.violation(ev["means"].get(c.metric, float("nan"))) for c in spec.constraints]
        trial.set_user_attr("seeds", [int(s) for s in spec.seeds])
        trial.set_user_attr("replicates", ev["replicates"])
        trial.set_user_attr("metrics", ev["means"])
        trial.set_user_attr("applied_temperatures", ev["applied_temperatures"])
        trial.set_user_attr("constraint_values", cons)
        trial.set_user_attr("feasible", bool(all(v <= 0 for v in cons)))
        if use_set_constraint:
            for c, v in zip(spec.constraints, cons):
                trial.set_constraint(c.label, v)
        out = tuple(ev["means"].get(m, float("nan")) for m in spec.objective_names)
        return out[0] if len(out) == 1 else out

    return objective


def _stop_callback(should_stop: Callable[[], bool]) -> Callable[["optuna.Study", Any], None]:
    """An ``optimize`` callback that ends the loop after a trial once a stop was requested."""
    def callback(study: "optuna.Study", trial: Any) -> None:
        if should_stop():
            study.stop()

    return callback


class _SigintSetsEvent:
    """In the main thread: the first Ctrl-C only sets ``event`` (the tuner stops between seed runs,
    so Optuna is never interrupted halfway through recording a trial); a second one interrupts at once."""

    def __init__(self, event: threading.Event) -> None:
        self.event = event
        self.previous: Any = None
        self.active = threading.current_thread() is threading.main_thread()

    def _handler(self, signum: int, frame: Any) -> None:
        self.event.set()
        signal.signal(signal.SIGINT, self.previous)

    def __enter__(self) -> "_SigintSetsEvent":
        if self.active:
            self.previous = signal.getsignal(signal.SIGINT)
            if self.previous is None:  # installed outside Python
                self.previous = signal.default_int_handler
            signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.active:
            signal.signal(signal.SIGINT, self.previous)


def _make_sampler(spec: TuneSpec, seed: int) -> "optuna.samplers.BaseSampler":
    import optuna

    kw: dict[str, Any] = {}
    if spec.constraints and not _has_set_constraint():
        kw["constraints_func"] = _constraints_from_attrs
    s = spec.sampler
    if s.name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=s.n_startup_trials, constant_liar=True, **kw)
    if s.name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=s.population_size, **kw)
    return optuna.samplers.RandomSampler(seed=seed)


def _sampler_seed(spec: TuneSpec, num_existing: int, worker_index: int) -> int:
    """Distinct per worker and per resume, reproducible for a fresh study."""
    ss = np.random.SeedSequence([spec.sampler.seed & 0xFFFFFFFF, num_existing, worker_index])
    return int(ss.generate_state(1)[0])


# ------------------------------------------------------------------------------------ storage
def default_storage_url(name: str, out_dir: str | Path = "results") -> str:
    """``sqlite:///<out_dir>/<name>/optuna.db`` (absolute path).

    Args:
        name: study name.
        out_dir: results folder.

    Returns:
        The SQLAlchemy URL.
    """
    return f"sqlite:///{(Path(out_dir) / name / 'optuna.db').resolve()}"


def mask_url(url: str) -> str:
    """The URL with any password replaced by ``***`` (safe to print and record).

    Args:
        url: a storage URL.

    Returns:
        The masked URL.
    """
    return re.sub(r"(://[^:/@]*):[^@]*@", r"\1:***@", url)


def _storage_kind(url: str) -> str:
    if url.startswith("journal://"):
        return "journal"
    if url.startswith("sqlite://"):
        return "sqlite"
    if re.match(r"^[a-z][a-z0-9]*(\+[a-z0-9_]+)?://", url):
        return "rdb"
    raise ConfigError(f"--storage: unsupported URL {mask_url(url)!r}; allowed: sqlite:///path.db, "
                      "postgresql+psycopg2://user:pass@host:port/db (or another SQLAlchemy URL), journal:///path.log")


def open_storage(url: str, *, heartbeat_interval_s: int = 10,
                 grace_period_s: int = 30) -> "optuna.storages.BaseStorage":
    """Open an Optuna storage from a URL.

    ``sqlite:///`` gives an RDBStorage with a 60 s lock timeout (several local processes);
    other SQLAlchemy URLs an RDBStorage with a heartbeat (a silent worker's trial is failed after
    ``grace_period_s`` and re-queued with the same parameters); ``journal:///path`` a
    JournalStorage on that file (no heartbeat).

    Args:
        url: storage URL.
        heartbeat_interval_s: RDB (non-SQLite) heartbeat period, seconds.
        grace_period_s: RDB (non-SQLite) silence after which a RUNNING trial is stale, seconds.

    Returns:
        The storage.

    Raises:
        ConfigError: unsupported URL, missing database driver, or the storage cannot be opened.
    """
    import optuna

    kind = _storage_kind(url)
    shown = mask_url(url)
    try:
        if kind == "journal":
            from optuna.storages.journal import JournalFileBackend

            path = Path(url[len("journal://"):])
            if not path.name:
                raise ConfigError(f"--storage: {shown}: name a file, e.g. journal:///tmp/study.log")
            path.parent.mkdir(parents=True, exist_ok=True)
            return optuna.storages.JournalStorage(JournalFileBackend(str(path)))
        if kind == "sqlite":
            db = url[len("sqlite:///"):]
            if db and db != ":memory:":
                Path(db).parent.mkdir(parents=True, exist_ok=True)
            return optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 60}})
        if url.startswith("postgresql://"):
            try:
                import psycopg  # noqa: F401  (SQLAlchemy 2 maps postgresql:// to psycopg 3)
            except ImportError:
                raise ConfigError(f"--storage: {shown}: name the driver, e.g. postgresql+psycopg2://... "
                                  "(plain postgresql:// needs psycopg 3)") from None
        retry = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None) or \
            optuna.storages.RetryFailedTrialCallback
        import inspect

        cb_kw = ("heartbeat_stale_trial_callback"
                 if "heartbeat_stale_trial_callback" in inspect.signature(optuna.storages.RDBStorage).parameters
                 else "failed_trial_callback")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.storages.RDBStorage(
                url, heartbeat_interval=heartbeat_interval_s, grace_period=grace_period_s,
                engine_kwargs={"pool_pre_ping": True}, **{cb_kw: retry(max_retry=3)})
    except MemtpSimError:
        raise
    except Exception as e:  # driver import errors, connection refused, bad credentials ...
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ConfigError(f"--storage: cannot open {shown}: {first}") from None


def _worker_identity() -> dict[str, Any]:
    pid = os.getpid()
    return {"host": socket.gethostname(), "pid": pid, "start_ticks": _process_start_ticks(pid)}


def _process_start_ticks(pid: int) -> int | None:
    """Process start time in clock ticks since boot (Linux), to tell a reused pid apart."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def _process_alive(pid: int, start_ticks: int | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        fields = stat[stat.rfind(")") + 2:].split()
        if fields[0] in ("Z", "X"):  # zombie: killed, not yet reaped
            return False
        if start_ticks is not None and int(fields[19]) != int(start_ticks):
            return False  # the pid now belongs to another process
    except (OSError, IndexError, ValueError):
        pass
    return True


def fail_dead_worker_trials(study: "optuna.Study") -> list[int]:
    """Mark FAIL every RUNNING trial whose worker ran on this host and is gone.

    Trials of workers on other hosts are left alone (an RDB heartbeat handles those).

    Args:
        study: the study.

    Returns:
        Numbers of the trials marked FAIL.
    """
    import optuna
    from optuna.trial import TrialState

    host = socket.gethostname()
    failed = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        w = t.user_attrs.get("worker")
        if not isinstance(w, dict) or w.get("host") != host or _process_alive(int(w["pid"]), w.get("start_ticks")):
            continue
        try:
            study._storage.set_trial_user_attr(t._trial_id, "failed_reason",
                                               f"worker pid {w['pid']} on {host} died; marked FAIL on resume")
            study._storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
            failed.append(t.number)
        except optuna.exceptions.UpdateFinishedTrialError:
            pass  # it finished after all
    return failed


def open_study(spec: TuneSpec, storage: "optuna.storages.BaseStorage", *, create: bool = True) -> "optuna.Study":
    """Create (or load) the spec's study and record the spec in its user attributes.

    Args:
        spec: the tune spec.
        storage: the storage.
        create: create the study if it does not exist.

    Returns:
        The study.

    Raises:
        ConfigError: a study of that name exists with a different spec (base, search space,
            pair rules, objectives, constraints or seeds).
    """
    import optuna

    if create:
        study = optuna.create_study(study_name=spec.name, storage=storage, directions=spec.directions,
                                    load_if_exists=True)
    else:
        study = optuna.load_study(study_name=spec.name, storage=storage)
    rec = study.user_attrs.get(STUDY_ATTR)
    mine = spec.to_json()
    if rec is None:
        study.set_user_attr(STUDY_ATTR, {
            "tune_spec": mine,
            "objective_names": spec.objective_names,
            "constraint_names": [c.label for c in spec.constraints],
            "memtp_sim_version": __version__,
        })
    else:
        theirs = rec.get("tune_spec", {})
        keys = ("base", "search_space", "pair_constraints", "objectives", "constraints", "seeds")
        diff = [k for k in keys if json.dumps(theirs.get(k), sort_keys=True) != json.dumps(mine.get(k), sort_keys=True)]
        if diff:
            raise ConfigError(f"{spec.source}: {diff[0]}: does not match study {spec.name!r} in storage (tuned with a "
                              f"different {', '.join(diff)}); resume with the same spec or give the tune spec a "
                              "new name")
    theirs_dirs = [d.name.lower() for d in study.directions]
    if theirs_dirs != spec.directions:
        raise ConfigError(f"{spec.source}: objectives: study {spec.name!r} in storage has directions "
                          f"{theirs_dirs}, the spec {spec.directions}; give the tune spec a new name")
    return study


def _count(study: "optuna.Study", state: Any) -> int:
    return len(study.get_trials(deepcopy=False, states=(state,)))


# ------------------------------------------------------------------------------------ running
@dataclasses.dataclass
class TuneOutcome:
    """What :func:`run_tune` did.

    Attributes:
        study_name: Optuna study name.
        storage_url: the storage URL, password masked.
        requested: requested number of COMPLETE trials.
        complete: COMPLETE trials now in the study.
        ran: trials started by this call.
        stale_failed: RUNNING trials of dead workers marked FAIL on resume.
        worker_exit_codes: exit code of each worker process (empty when run in-process).
        validation: fresh-seed validation, ``{trial number: record}`` (see :func:`validate_trials`).
        report: path of report.html, or None.
        elapsed_s: wall-clock seconds of the optimisation.
    """

    study_name: str
    storage_url: str
    requested: int
    complete: int
    ran: int
    stale_failed: list[int]
    worker_exit_codes: list[int]
    validation: dict[int, dict[str, Any]]
    report: Path | None
    elapsed_s: float

    @property
    def short(self) -> bool:
        """Fewer COMPLETE trials than requested (a worker died or trials failed)."""
        return self.complete < self.requested


def _worker_main(spec: TuneSpec, url: str, n_trials: int, seed: int, heartbeat: tuple[int, int],
                 stop: Any = None) -> None:
    """Entry point of one worker process: load the shared study and run ``n_trials`` trials.

    Ctrl-C is the parent's business: the worker ignores SIGINT (the terminal sends it to the whole
    process group) and stops when the parent sets ``stop`` (a multiprocessing Event): between two
    seed runs (that trial FAILs) or after a trial. The parent terminates a worker that takes too long.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    should_stop = stop.is_set if stop is not None else None
    try:
        storage = open_storage(url, heartbeat_interval_s=heartbeat[0], grace_period_s=heartbeat[1])
        study = optuna.load_study(study_name=spec.name, storage=storage, sampler=_make_sampler(spec, seed))
        callbacks = [_stop_callback(should_stop)] if should_stop is not None else []
        study.optimize(_make_objective(spec, should_stop), n_trials=n_trials, callbacks=callbacks,
                       gc_after_trial=False)
    except (_Stopped, KeyboardInterrupt):
        sys.exit(130)
    except MemtpSimError as e:
        print(f"error: {e} (worker pid {os.getpid()})", file=sys.stderr)
        sys.exit(2)
    if should_stop is not None and should_stop():
        sys.exit(130)


def run_tune(
    spec: TuneSpec,
    *,
    storage_url: str | None = None,
    n_trials: int | None = None,
    workers: int = 1,
    out_dir: str | Path = "results",
    validate: bool = True,
    report: bool = True,
    heartbeat_interval_s: int = 10,
    grace_period_s: int = 30,
    on_progress: Callable[[int, int], None] | None = None,
) -> TuneOutcome:
    """Run (or resume) a tuning study until it has ``n_trials`` COMPLETE trials.

    Args:
        spec: the tune spec.
        storage_url: Optuna storage URL (default: :func:`default_storage_url`).
        n_trials: COMPLETE trials wanted in total (default: ``spec.n_trials``).
        workers: 1 runs in this process; N > 1 starts N worker processes sharing the storage.
        out_dir: results folder (``<out_dir>/<name>/`` gets validation.json and report.html).
        validate: re-run the top trials on fresh seeds afterwards.
        report: write report.html afterwards.
        heartbeat_interval_s: RDB heartbeat period (non-SQLite RDB URLs).
        grace_period_s: RDB heartbeat grace period.
        on_progress: ``on_progress(complete, requested)`` now and then.

    Returns:
        A :class:`TuneOutcome`. Validation and the report are skipped when the study is short.

    Raises:
        ConfigError: bad storage, a study of that name with another spec (the message starts with
            ``spec.source``, the YAML file).
        KeyboardInterrupt: Ctrl-C (see the module docstring); finished trials are kept, the trials
            that were running FAIL (run again to resume).
    """
    import optuna
    from optuna.trial import TrialState

    if workers < 1:
        raise ConfigError(f"--workers: must be >= 1 (got {workers})")
    url = storage_url or default_storage_url(spec.name, out_dir)
    n_trials = int(n_trials or spec.n_trials)
    if n_trials < 1:
        raise ConfigError(f"--n-trials: must be >= 1 (got {n_trials})")
    storage = open_storage(url, heartbeat_interval_s=heartbeat_interval_s, grace_period_s=grace_period_s)
    study = open_study(spec, storage)
    stale = fail_dead_worker_trials(study)
    if _storage_kind(url) == "rdb":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)
    complete = _count(study, TrialState.COMPLETE)
    remaining = max(0, n_trials - complete)
    existing = len(study.get_trials(deepcopy=False))
    codes: list[int] = []
    t0 = time.perf_counter()
    if on_progress is not None:
        on_progress(complete, n_trials)
    if remaining and workers == 1:
        study.sampler = _make_sampler(spec, _sampler_seed(spec, existing, 0))
        stop = threading.Event()
        callbacks = []
        if on_progress is not None:
            callbacks.append(lambda st, tr: on_progress(_count(st, TrialState.COMPLETE), n_trials))
        callbacks.append(_stop_callback(stop.is_set))
        with _SigintSetsEvent(stop):
            try:
                study.optimize(_make_objective(spec, stop.is_set), n_trials=remaining, callbacks=callbacks,
                               gc_after_trial=False)
            except _Stopped:
                pass
        if stop.is_set():
            raise KeyboardInterrupt
    elif remaining:
        codes = _run_workers(spec, url, study, remaining, workers, existing, (heartbeat_interval_s, grace_period_s),
                             n_trials, on_progress)
    elapsed = time.perf_counter() - t0
    complete = _count(study, TrialState.COMPLETE)
    outcome = TuneOutcome(spec.name, mask_url(url), n_trials, complete, remaining, stale, codes, {}, None, elapsed)
    if outcome.short:
        return outcome
    if validate and spec.validation.top_k > 0:
        chosen = [t.number for t in top_trials(study, spec, spec.validation.top_k)]
        stored = study.user_attrs.get("validation", {})
        todo = [n for n in chosen if stored.get(str(n), {}).get("seeds") != spec.fresh_seeds]
        if todo:
            validate_trials(study, spec, todo, out_dir=out_dir)  # a resumed study keeps earlier records
            stored = study.user_attrs.get("validation", {})
        outcome.validation = {n: stored[str(n)] for n in chosen}
    if report:
        outcome.report = write_tune_report(study, spec, Path(out_dir) / spec.name / "report.html")
    return outcome


def _run_workers(spec: TuneSpec, url: str, study: "optuna.Study", remaining: int, workers: int, existing: int,
                 heartbeat: tuple[int, int], n_trials: int,
                 on_progress: Callable[[int, int], None] | None) -> list[int]:
    """Start ``workers`` processes with quotas summing to ``remaining``; wait; return exit codes."""
    from optuna.trial import TrialState

    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    quotas = [remaining // workers + (1 if i < remaining % workers else 0) for i in range(workers)]
    procs = []
    # Workers start with SIGINT ignored (inherited through exec; Python keeps an ignored SIGINT), so a
    # Ctrl-C, which the terminal sends to every process of the group, reaches only this process.
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main_thread else None
    try:
        for i, q in enumerate(quotas):
            if q == 0:
                continue
            p = ctx.Process(target=_worker_main, name=f"memtp-tune-{i}",
                            args=(spec, url, q, _sampler_seed(spec, existing, i), heartbeat, stop))
            p.start()
            procs.append(p)
    finally:
        if main_thread:
            signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)
    last = -1
    try:
        while any(p.is_alive() for p in procs):
            for p in procs:
                p.join(timeout=0.5)
            if on_progress is not None:
                done = _count(study, TrialState.COMPLETE)
                if done != last:
                    on_progress(done, n_trials)
                    last = done
    except BaseException:
        # Ctrl-C (or any error here): ask the workers to stop between seed runs; the trial each one
        # is in FAILs, finished trials are kept. A second Ctrl-C, or 60 s, and they are terminated
        # (their RUNNING trials are marked FAIL when the study is resumed).
        stop.set()
        try:
            deadline = time.monotonic() + 60.0
            for p in procs:
                p.join(timeout=max(0.0, deadline - time.monotonic()))
        except KeyboardInterrupt:
            pass
        finally:
            for p in procs:
                if p.is_alive():
                    p.terminate()
            for p in procs:
                p.join(timeout=5)
        raise
    return [int(p.exitcode if p.exitcode is not None else -1) for p in procs]


# ------------------------------------------------------------------------------------ selection
def _is_feasible(t: "optuna.trial.FrozenTrial") -> bool:
    if "feasible" in t.user_attrs:
        return bool(t.user_attrs["feasible"])
    return all(float(v) <= 0 for v in t.user_attrs.get("constraint_values", []))


def feasible_trials(study: "optuna.Study") -> list["optuna.trial.FrozenTrial"]:
    """COMPLETE trials whose constraint values are all <= 0 (trial-number order).

    Args:
        study: the study.

    Returns:
        The feasible trials.
    """
    from optuna.trial import TrialState

    out = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if t.values is not None and all(math.isfinite(v) for v in t.values) and _is_feasible(t):
            out.append(t)
    return out


def pareto_trials(trials: Sequence["optuna.trial.FrozenTrial"],
                  directions: Sequence[str]) -> list["optuna.trial.FrozenTrial"]:
    """Trials not dominated by any other in ``trials``.

    ``a`` dominates ``b`` when ``a`` is at least as good in every objective and strictly better in
    one (better = larger for ``maximize``).

    Args:
        trials: candidate trials (COMPLETE, finite values).
        directions: ``"maximize"`` / ``"minimize"`` per objective.

    Returns:
        The non-dominated trials, in input order.
    """
    sign = np.array([1.0 if d == "maximize" else -1.0 for d in directions])
    vals = np.array([np.asarray(t.values, dtype=np.float64) * sign for t in trials]).reshape(len(trials), len(sign))
    keep = []
    for i in range(len(trials)):
        dominated = np.any(np.all(vals >= vals[i], axis=1) & np.any(vals > vals[i], axis=1))
        if not dominated:
            keep.append(trials[i])
    return keep


def top_trials(study: "optuna.Study", spec: TuneSpec, k: int) -> list["optuna.trial.FrozenTrial"]:
    """The ``k`` best feasible trials: the feasible Pareto front first, each group ordered by
    ``spec.best_by`` (best first, ties to the lower trial number).

    Args:
        study: the study.
        spec: the tune spec.
        k: how many.

    Returns:
        Up to ``k`` trials; empty when no trial is feasible.
    """
    feas = feasible_trials(study)
    idx = spec.objective_names.index(spec.best_by)
    sign = -1.0 if spec.objectives[idx].direction == "maximize" else 1.0
    front = pareto_trials(feas, spec.directions)
    front_ids = {t.number for t in front}
    rest = [t for t in feas if t.number not in front_ids]

    def key(t: "optuna.trial.FrozenTrial") -> tuple[float, int]:
        return (sign * t.values[idx], t.number)

    return (sorted(front, key=key) + sorted(rest, key=key))[:k]


def select_trial(study: "optuna.Study", spec: TuneSpec, which: str | int = "best") -> "optuna.trial.FrozenTrial":
    """The trial to export: ``"best"`` (see the module docstring) or a trial number.

    Args:
        study: the study.
        spec: the tune spec.
        which: ``"best"`` or a trial number.

    Returns:
        The trial.

    Raises:
        ConfigError: empty study, no feasible trial, unknown or unfinished trial number.
    """
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    n_complete = sum(t.state == TrialState.COMPLETE for t in trials)
    if n_complete == 0:
        raise ConfigError(f"study {study.study_name!r} has no complete trials ({len(trials)} in all); "
                          "run `python -m memtp_sim tune` first")
    if which == "best":
        best = top_trials(study, spec, 1)
        if not best:
            raise ConfigError(f"study {study.study_name!r}: none of its {n_complete} complete trials meets the "
                              f"constraints ({'; '.join(c.label for c in spec.constraints)}); relax them or pass "
                              "--trial N")
        return best[0]
    num = int(which)
    match = [t for t in trials if t.number == num]
    if not match:
        raise ConfigError(f"study {study.study_name!r}: no trial {num}; trials are numbered 0..{len(trials) - 1}")
    if match[0].state != TrialState.COMPLETE:
        raise ConfigError(f"study {study.study_name!r}: trial {num} is {match[0].state.name}; "
                          "only COMPLETE trials can be exported")
    return match[0]


def constraint_failures(spec: TuneSpec, constraint_values: Sequence[float],
                        means: dict[str, Any]) -> list[str]:
    """What a trial's failed constraints are, and by how much, one phrase each.

    Args:
        spec: the tune spec.
        constraint_values: the trial's violations (``user_attrs["constraint_values"]``, or a
            validation record's), in ``spec.constraints`` order; <= 0 is satisfied.
        means: metric -> seed-mean value (``user_attrs["metrics"]``).

    Returns:
        e.g. ``["tok_per_s_user_p10 >= 16: tok_per_s_user_p10 = 12.3, short by 3.7"]`` (numbers
        written plainly); empty when all are met.
    """
    out = []
    for c, v in zip(spec.constraints, constraint_values):
        if float(v) <= 0:
            continue
        m = means.get(c.metric)
        if m is None or not math.isfinite(float(m)):
            out.append(f"{c.label}: {c.metric} is NaN")
        else:
            out.append(f"{c.label}: {c.metric} = {_num(m)}, {'short' if c.op == '>=' else 'over'} by {_num(v)}")
    return out


# ------------------------------------------------------------------------------------ importances
#: Optuna 5's PED-ANOVA evaluator warns that a user ``target`` is read as "lower is better". That is
#: exactly how :func:`importance_target` builds it (negated for a maximised objective), so this one
#: warning is expected and filtered; any other warning is kept.
_LOW_TARGET_WARNING = r".*computes the importances of params to achieve low `target` values"


def importance_target(index: int, direction: str) -> Callable[["optuna.trial.FrozenTrial"], float]:
    """The importance target for objective ``index``: lower must mean better.

    Optuna's default evaluator (PED-ANOVA in Optuna 5) ranks parameters by how much they matter for
    reaching *low* target values, whatever the study's directions; a maximised objective is
    therefore negated. (fANOVA, Optuna 4's default, explains variance and ignores the sign.)

    Args:
        index: objective index.
        direction: ``"maximize"`` or ``"minimize"``.

    Returns:
        ``trial -> value`` (negated when maximised).
    """
    if direction not in ("maximize", "minimize"):
        raise ValueError(f"direction must be 'maximize' or 'minimize' (got {direction!r})")
    sign = -1.0 if direction == "maximize" else 1.0

    def target(t: "optuna.trial.FrozenTrial") -> float:
        return sign * float(t.values[index])

    return target


def _study_direction(study: "optuna.Study", index: int) -> str:
    return study.directions[index].name.lower()


def param_importances(study: "optuna.Study", index: int = 0, direction: str | None = None) -> dict[str, float]:
    """Parameter importances for a *good* value of objective ``index`` (high when maximised).

    Args:
        study: the study (COMPLETE trials count, feasible or not).
        index: objective index.
        direction: ``"maximize"`` / ``"minimize"`` (default: the study's direction for ``index``).

    Returns:
        ``{param: importance}``, most important first (normalised to sum 1).
    """
    import optuna

    direction = direction or _study_direction(study, index)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_LOW_TARGET_WARNING, category=UserWarning)
        return optuna.importance.get_param_importances(study, target=importance_target(index, direction))


def importance_figure(study: "optuna.Study", index: int, name: str,
                      direction: str | None = None) -> tuple[Any, list[str]]:
    """Optuna's importance plot for a good value of objective ``index`` (see :func:`param_importances`).

    Args:
        study: the study.
        index: objective index.
        name: the objective's metric name (for the labels).
        direction: ``"maximize"`` / ``"minimize"`` (default: the study's).

    Returns:
        ``(plotly figure, notes)``: notes are the text of any warning Optuna raised (e.g. too few
        trials), for the report to show next to the plot.
    """
    import optuna.visualization as vis

    direction = direction or _study_direction(study, index)
    label = f"importance for {'high' if direction == 'maximize' else 'low'} {name}"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", message=_LOW_TARGET_WARNING, category=UserWarning)
        fig = vis.plot_param_importances(study, target=importance_target(index, direction), target_name=label)
    fig.update_layout(title=f"Hyperparameter importances: {label}")
    return fig, _warning_notes(caught)


def _warning_notes(caught: Sequence[warnings.WarningMessage]) -> list[str]:
    notes: list[str] = []
    for w in caught:
        text = f"{w.category.__name__}: {w.message}"
        if text not in notes:
            notes.append(text)
    return notes


# ------------------------------------------------------------------------------------ validation
def t_confidence_interval(values: Sequence[float], level: float = 0.95) -> dict[str, Any]:
    """Mean and two-sided t-distribution confidence interval over replicates.

    ``mean ± t_{(1+level)/2, n-1} · s / sqrt(n)``, ``s`` the sample standard deviation (ddof 1).

    Args:
        values: replicate values (NaN ones are dropped).
        level: confidence level in (0, 1).

    Returns:
        ``{"mean", "sd", "n", "half_width", "low", "high", "level", "values"}``; the interval is
        NaN when fewer than two finite values remain.
    """
    from scipy import stats

    arr = np.asarray([float(v) for v in values], dtype=np.float64)
    finite = arr[np.isfinite(arr)]
    n = int(finite.size)
    mean = float(finite.mean()) if n else float("nan")
    if n >= 2:
        sd = float(finite.std(ddof=1))
        half = float(stats.t.ppf(0.5 + level / 2.0, n - 1)) * sd / math.sqrt(n)
    else:
        sd, half = float("nan"), float("nan")
    return {"mean": mean, "sd": sd, "n": n, "half_width": half, "low": mean - half, "high": mean + half,
            "level": level, "values": arr.tolist()}


def validate_trials(study: "optuna.Study", spec: TuneSpec, numbers: Sequence[int], *,
                    out_dir: str | Path | None = "results") -> dict[int, dict[str, Any]]:
    """Re-run trials on fresh seeds and record confidence intervals.

    For each trial the scenario is rebuilt from ``trial.params`` and run on ``spec.fresh_seeds``
    (disjoint from the tuning seeds); every tracked metric gets :func:`t_confidence_interval`, and
    the constraints are re-checked on the fresh means. The records are merged into the study's
    user attribute ``validation`` and written to ``<out_dir>/<name>/validation.json``.

    Args:
        study: the study.
        spec: its tune spec.
        numbers: trial numbers (COMPLETE trials).
        out_dir: results folder, or None for no JSON file.

    Returns:
        ``{trial number: {"trial", "params", "seeds", "metrics": {metric: CI dict}, "feasible",
        "constraint_values"}}`` for the given trials.
    """
    from ._io import atomic_write_text

    fresh = spec.fresh_seeds
    by_num = {t.number: t for t in study.get_trials(deepcopy=False)}
    out: dict[int, dict[str, Any]] = {}
    for num in numbers:
        t = by_num[num]
        ev = evaluate(scenario_for(spec, t.params), fresh, spec.tracked_metrics)
        cis = {m: t_confidence_interval(v, spec.validation.confidence) for m, v in ev["replicates"].items()}
        cons = [c.violation(ev["means"].get(c.metric, float("nan"))) for c in spec.constraints]
        out[num] = {"trial": num, "params": dict(t.params), "seeds": fresh, "metrics": cis,
                    "constraint_values": cons, "feasible": bool(all(v <= 0 for v in cons)),
                    "method": f"t-distribution {spec.validation.confidence:.0%} CI over {len(fresh)} "
                              "fresh-seed replicates"}
    stored = dict(study.user_attrs.get("validation", {}))
    stored.update({str(k): v for k, v in out.items()})
    study.set_user_attr("validation", stored)
    if out_dir is not None:
        doc = {"study": spec.name, "tuning_seeds": list(spec.seeds), "fresh_seeds": fresh,
               "objectives": [o.model_dump() for o in spec.objectives],
               "constraints": [c.label for c in spec.constraints], "trials": stored}
        atomic_write_text(Path(out_dir) / spec.name / "validation.json", json.dumps(doc, indent=2, allow_nan=True))
    return out


# ------------------------------------------------------------------------------------ report
def write_tune_report(study: "optuna.Study", spec: TuneSpec, path: str | Path) -> Path:
    """Write a self-contained HTML report with Optuna's own plots.

    Pareto front (feasible trials; infeasible ones grey, never on the front; 2 or 3 objectives),
    optimisation history and parameter importances per objective (importances for a *good* value:
    see :func:`param_importances`), the fresh-seed validation table, and the feasible Pareto
    trials. Warnings Optuna raises while plotting (e.g. too few trials for the importances) are
    shown as notes under the plot they concern.

    Args:
        study: the study.
        spec: its tune spec.
        path: output HTML file (written atomically).

    Returns:
        ``path``.
    """
    import html

    import optuna.visualization as vis

    from ._io import atomic_write_text

    path = Path(path)
    parts: list[str] = []
    first = True

    def fig_html(fig: Any) -> str:
        nonlocal first
        out = fig.to_html(full_html=False, include_plotlyjs=first, config={"displaylogo": False})
        first = False
        return out

    def section(title: str, body: str) -> None:
        parts.append(f"<h2>{html.escape(title)}</h2>\n{body}")

    def notes_html(notes: list[str]) -> str:
        return "".join(f"<p class='note'>note from Optuna: {html.escape(n)}</p>" for n in notes)

    names = spec.objective_names
    feas = feasible_trials(study)
    n_complete = len([t for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"])
    if len(names) in (2, 3) and n_complete:
        kw: dict[str, Any] = {}
        if spec.constraints and not _has_set_constraint():
            kw["constraints_func"] = _constraints_from_attrs  # Optuna 4; deprecated (FutureWarning) in 5
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fig = vis.plot_pareto_front(study, target_names=names, **kw)
        section("Pareto front (feasible trials; infeasible shown grey, excluded from the front)",
                fig_html(fig) + notes_html(_warning_notes(caught)))
    for i, (name, direction) in enumerate(zip(names, spec.directions)):
        def target(t: Any, i: int = i) -> float:
            return float(t.values[i])
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                fig = vis.plot_optimization_history(study, target=target, target_name=name)
            section(f"Optimisation history: {name} ({direction})", fig_html(fig) + notes_html(_warning_notes(caught)))
        except (ValueError, RuntimeError) as e:
            section(f"Optimisation history: {name}", f"<p>not available: {html.escape(str(e))}</p>")
        good = "high" if direction == "maximize" else "low"
        title = (f"Parameter importances for {good} {name} (Optuna's default evaluator over all {n_complete} "
                 "complete trials, feasible or not)")
        try:
            fig, notes = importance_figure(study, i, name, direction)
            section(title, fig_html(fig) + notes_html(notes))
        except (ValueError, RuntimeError, ZeroDivisionError) as e:
            section(title, f"<p>not available: {html.escape(str(e))}</p>")
    validation = study.user_attrs.get("validation", {})
    rows = []
    for num, rec in sorted(validation.items(), key=lambda kv: int(kv[0])):
        cells = [f"<td>{num}</td>", f"<td>{html.escape(json.dumps(rec['params']))}</td>"]
        for m in names + [c.metric for c in spec.constraints if c.metric not in names]:
            ci = rec["metrics"].get(m)
            cells.append("<td>-</td>" if ci is None else f"<td>{ci['mean']:.4g} ± {ci['half_width']:.2g}</td>")
        cells.append(f"<td>{'yes' if rec['feasible'] else 'no'}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    if rows:
        extra = [c.metric for c in spec.constraints if c.metric not in names]
        heads = ["trial", "params", *names, *extra, "feasible"]
        section(f"Fresh-seed validation (seeds {spec.fresh_seeds}; mean ± 95% t half-width)",
                "<table class='tbl'><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in heads) + "</tr>"
                + "".join(rows) + "</table>")
    front = sorted(pareto_trials(feas, spec.directions), key=lambda t: t.number) if feas else []
    body = "".join(
        f"<tr><td>{t.number}</td><td>{html.escape(json.dumps(t.params))}</td>"
        + "".join(f"<td>{v:.4g}</td>" for v in t.values) + "</tr>" for t in front)
    section(f"Feasible Pareto trials ({len(front)} of {len(feas)} feasible, {n_complete} complete)",
            "<table class='tbl'><tr><th>trial</th><th>params</th>"
            + "".join(f"<th>{html.escape(n)}</th>" for n in names) + "</tr>" + body + "</table>")
    doc = (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>memtp_sim tune: {html.escape(spec.name)}</title>"
        "<style>body{font-family:sans-serif;margin:2em;max-width:1200px} .tbl{border-collapse:collapse}"
        " .tbl td,.tbl th{border:1px solid #ccc;padding:2px 6px;font-size:90%} .note{color:#666;font-size:90%}"
        "</style></head><body>"
        f"<h1>Tuning study {html.escape(spec.name)}</h1>"
        f"<p>{html.escape(spec.description)}</p>"
        f"<p>Objectives: {html.escape(', '.join(f'{o.direction} {o.metric}' for o in spec.objectives))}; "
        f"constraints: {html.escape('; '.join(c.label for c in spec.constraints) or 'none')}; "
        f"tuning seeds {spec.seeds} (common random numbers, mean per trial).</p>"
        + "\n".join(parts) + "</body></html>"
    )
    atomic_write_text(path, doc)
    return path

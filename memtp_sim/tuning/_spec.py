"""The tune spec: pydantic models of a tune YAML (see :mod:`memtp_sim.tuning` for the whole shape).

Every model derives from :class:`memtp_sim.config.StrictModel`, the base of scenario and study
configs: unknown keys are errors, models are frozen and types are strict (YAML ``true`` is not the
integer 1 and ``"7"`` is not a number; an integer is still accepted where a float is expected).

**Objectives and constraints.** An objective is a scalar metric of
:func:`memtp_sim.metrics.compute_metrics` (a name in :data:`memtp_sim.metrics.METRIC_NAMES`,
checked when the YAML is loaded), averaged over the seeds (``nanmean``). A constraint
``metric >= v`` / ``metric <= v`` gives the violation ``v - m`` / ``m - v`` (feasible when <= 0;
a NaN metric counts as violated).

This module also holds the two helpers that write numbers and search-space points into messages
(:func:`format_number`, :func:`format_values`), which every other tuning module uses.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import (
    AfterValidator,
    Field,
    NonNegativeFloat,
    PositiveInt,
    PrivateAttr,
    field_validator,
    model_validator,
)

from ..capacity import SLO
from ..config import Scenario, StrictModel
from ..errors import InvalidArgumentError
from ..metrics import METRIC_NAMES, bound_never_holds

__all__ = [
    "CAPACITY_METRIC",
    "HEADLINE_METRICS",
    "STUDY_ATTR",
    "CapacitySpec",
    "CategoricalDist",
    "Distribution",
    "ExportSpec",
    "FloatDist",
    "IntDist",
    "MetricConstraint",
    "Objective",
    "PairConstraint",
    "SamplerSpec",
    "Scalar",
    "Seed",
    "TuneSpec",
    "ValidationSpec",
    "format_number",
    "format_values",
]

#: Study user attribute holding memtp_sim's record (tune spec, names, version).
STUDY_ATTR = "memtp_sim"

#: The SLA-capacity objective (req/s): the highest Poisson rate meeting the spec's ``capacity.slo``,
#: found by :func:`memtp_sim.capacity.sla_capacity` once per seed. Not a run metric: a search.
CAPACITY_METRIC = "sla_capacity_per_s"
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


# ------------------------------------------------------------------------------------ messages
def format_number(x: Any) -> str:
    """A number for a message: plain ``1.5`` / ``3`` (never ``np.float64(1.5)``), 6 significant digits.

    Args:
        x: a Python or numpy scalar (anything else is written with ``str``).

    Returns:
        The text (``%.6g`` for floats, as :func:`format`'s general format).
    """
    if isinstance(x, (bool, np.bool_)):
        return str(bool(x))
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    try:
        return f"{float(x):.6g}"
    except (TypeError, ValueError):
        return str(x)


def format_values(values: dict[str, Any]) -> str:
    """``path=value, ...`` for a search-space point, numbers written plainly.

    Args:
        values: dotted path -> value (e.g. ``trial.params``).

    Returns:
        The text, e.g. ``confidence.temperature=1.5, policy.name='dspark'``.
    """
    return ", ".join(f"{k}={format_number(v) if isinstance(v, (int, float, np.number)) else repr(v)}"
                     for k, v in values.items())


# ------------------------------------------------------------------------------------ field checks
def _known_metric(v: str) -> str:
    """``v`` if it is one of :data:`memtp_sim.metrics.METRIC_NAMES` or :data:`CAPACITY_METRIC`;
    else a ValueError naming the closest."""
    if v in METRIC_NAMES or v == CAPACITY_METRIC:
        return v
    close = difflib.get_close_matches(v, METRIC_NAMES, n=4, cutoff=0.5)
    close += [m for m in METRIC_NAMES if v.lower() in m and m not in close][: max(0, 4 - len(close))]
    hint = (f"closest allowed: {', '.join(close)}" if close
            else "no close match; e.g. throughput_tok_per_s, tok_per_s_user_p50, ttft_s_p90, num_rejected")
    raise ValueError(f"unknown metric {v!r}; {hint} (all {len(METRIC_NAMES)}: memtp_sim.metrics.METRIC_NAMES)")


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


#: A run seed (an integer >= 0; strict: YAML ``true`` or ``"3"`` is refused).
Seed = Annotated[int, AfterValidator(_seed_ok)]

#: A categorical choice or a ``when`` value.
Scalar = str | int | float | bool | None


# ------------------------------------------------------------------------------------ distributions
class _Dist(StrictModel):
    when: dict[str, Scalar | list[Scalar]] | None = Field(
        None, description="sample only when these categorical entries take these value(s)")


class FloatDist(_Dist):
    """A float parameter, uniform or log-uniform on ``[low, high]``.

    Attributes:
        type: ``"float"``.
        low, high: the range, in the scenario field's own units (finite, ``low < high``).
        log: sample ``log(x)`` uniformly (needs ``low > 0``).
        when: sample only when these categorical entries take these value(s).

    Raises:
        pydantic.ValidationError: on construction: non-finite bounds, ``low >= high``, or ``log``
            with ``low <= 0`` (loaders turn it into ``ConfigError``).

    Source:
        Optuna's ``FloatDistribution(low, high, log=...)`` and ``Trial.suggest_float`` (Optuna
        documentation).
    """

    type: Literal["float"]
    low: float
    high: float
    log: bool = False

    @model_validator(mode="after")
    def _bounds(self) -> FloatDist:
        if not (math.isfinite(self.low) and math.isfinite(self.high)):
            raise ValueError(f"low and high must be finite numbers (got low={self.low}, high={self.high})")
        if self.low >= self.high:
            raise ValueError(f"low must be < high (got low={self.low}, high={self.high}); "
                             "a constant belongs in base, not in search_space")
        if self.log and self.low <= 0:
            raise ValueError(f"log: true needs low > 0 (got low={self.low})")
        return self


class IntDist(_Dist):
    """An int parameter on the grid ``low, low + step, ..., high``.

    Attributes:
        type: ``"int"``.
        low, high: the range (``low < high``, ``high - low`` a multiple of ``step``).
        step: grid spacing (>= 1).
        log: sample ``log(x)`` uniformly (needs ``low >= 1`` and ``step`` 1).
        when: sample only when these categorical entries take these value(s).

    Raises:
        pydantic.ValidationError: on construction: ``low >= high``, ``high - low`` not a multiple
            of ``step``, or ``log`` with ``low < 1`` or ``step != 1``.

    Source:
        Optuna's ``IntDistribution(low, high, step=..., log=...)`` (Optuna documentation: ``log``
        and ``step != 1`` cannot be combined).
    """

    type: Literal["int"]
    low: int
    high: int
    step: PositiveInt = 1
    log: bool = False

    @model_validator(mode="after")
    def _bounds(self) -> IntDist:
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
    """One of a list of choices.

    Attributes:
        type: ``"categorical"``.
        choices: the values (unique, at least one).
        when: sample only when these categorical entries take these value(s).

    Raises:
        pydantic.ValidationError: on construction: no choices, or a repeated one.

    Source:
        Optuna's ``CategoricalDistribution(choices)`` (choices are None, bool, int, float or str).
    """

    type: Literal["categorical"]
    choices: list[Scalar] = Field(..., min_length=1)

    @field_validator("choices")
    @classmethod
    def _unique(cls, v: list[Scalar]) -> list[Scalar]:
        if len({json.dumps(c) for c in v}) != len(v):
            raise ValueError(f"choices must be unique (got {v!r})")
        return v


#: One search-space entry, told apart by its ``type``.
Distribution = Annotated[FloatDist | IntDist | CategoricalDist, Field(discriminator="type")]


# ------------------------------------------------------------------------------------ rules
class PairConstraint(StrictModel):
    """Ordered pair ``lower < upper`` (and ``upper - lower >= min_gap``), e.g. ``memtp.r_low < memtp.r_high``.

    Written as the string ``"lower.path < upper.path"`` or as a mapping with ``rule`` (that
    string), an optional ``name`` and ``min_gap``.

    Attributes:
        rule: ``"lower.path < upper.path"`` (normalised spacing).
        name: label in messages (default: the rule).
        min_gap: the least ``upper - lower``, in the fields' units (>= 0; 0 means strictly above).

    Raises:
        pydantic.ValidationError: on construction: a rule not of the form ``a.b < c.d``, or the
            same path on both sides.
    """

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
        """The dotted path on the left of ``<``."""
        return self.rule.split(" < ")[0]

    @property
    def upper(self) -> str:
        """The dotted path on the right of ``<``."""
        return self.rule.split(" < ")[1]

    @property
    def label(self) -> str:
        """``name`` if given, else the rule."""
        return self.name or self.rule


class Objective(StrictModel):
    """A scalar metric to maximise or minimise (mean over the seeds).

    Attributes:
        metric: a name in :data:`memtp_sim.metrics.METRIC_NAMES`.
        direction: ``"maximize"`` or ``"minimize"``.

    Raises:
        pydantic.ValidationError: on construction: an unknown metric (the message names the
            closest ones) or direction.

    Source:
        Optuna's study directions (``optuna.create_study(directions=[...])``).
    """

    metric: str = Field(..., pattern=r"^[A-Za-z_]\w*$")
    direction: Literal["maximize", "minimize"]

    _known = field_validator("metric")(_known_metric)


class MetricConstraint(StrictModel):
    """``metric >= value`` or ``metric <= value`` on the seed-mean of a metric.

    Written as the string ``"metric >= number"`` or as a mapping ``{metric, op, value}``.

    Attributes:
        metric: a name in :data:`memtp_sim.metrics.METRIC_NAMES`.
        op: ``">="`` or ``"<="``.
        value: the bound, in the metric's units.

    Raises:
        pydantic.ValidationError: on construction: a string not of the form ``metric >= number`` /
            ``metric <= number``, or an unknown metric.

    Source:
        Optuna's constraint convention (a trial is feasible when every constraint value is <= 0).
    """

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

    @model_validator(mode="after")
    def _can_hold(self) -> "MetricConstraint":
        # a bound no run can meet (capacity refuses the same SLO terms): every trial would be
        # infeasible, and "run more trials" could not help
        why = bound_never_holds(self.metric, self.op, self.value)
        if why is not None:
            raise ValueError(why)
        return self

    @property
    def label(self) -> str:
        """``"metric op value"``, e.g. ``"num_rejected <= 0"``."""
        return f"{self.metric} {self.op} {self.value:g}"

    def violation(self, value: float) -> float:
        """Constraint value for Optuna: <= 0 when satisfied.

        Args:
            value: the metric (seed mean), in the metric's units.

        Returns:
            ``self.value - value`` for ``>=``, ``value - self.value`` for ``<=``; a large positive
            number (1e18) when ``value`` is NaN or None (Optuna refuses NaN constraint values).

        Source:
            Optuna's constraint convention (``Trial.set_constraint`` / ``constraints_func``: a
            trial is feasible when every value is <= 0).
        """
        if value is None or not math.isfinite(float(value)):
            return _NAN_VIOLATION
        return self.value - float(value) if self.op == ">=" else float(value) - self.value


# ------------------------------------------------------------------------------------ settings
class SamplerSpec(StrictModel):
    """Optuna sampler: ``tpe`` (default; multi-objective and constraint aware), ``nsga2`` or ``random``.

    Attributes:
        name: ``"tpe"``, ``"nsga2"`` or ``"random"``.
        seed: base seed; each worker and each resume derives its own from it.
        n_startup_trials: tpe: random trials before modelling (>= 1).
        population_size: nsga2: population size (>= 2).

    Source:
        Optuna documentation: ``TPESampler(n_startup_trials=...)``,
        ``NSGAIISampler(population_size=...)``, ``RandomSampler``.
    """

    name: Literal["tpe", "nsga2", "random"] = "tpe"
    seed: int = 0
    n_startup_trials: PositiveInt = Field(10, description="tpe: random trials before modelling")
    population_size: PositiveInt = Field(20, ge=2, description="nsga2: population size")


class ValidationSpec(StrictModel):
    """Fresh-seed re-runs of the top trials before anything is exported.

    Attributes:
        top_k: trials re-run after tuning (0: only on export).
        num_seeds: fresh seeds per trial (>= 2 for a confidence interval).
        seeds: explicit fresh seeds (unique, >= 0, none a tuning seed); default: the ``num_seeds``
            integers after the largest tuning seed.
        confidence: confidence level of the interval, in (0, 1).

    Source:
        Student's t intervals (:func:`memtp_sim.tuning.t_confidence_interval`).
    """

    top_k: int = Field(3, ge=0, description="trials re-run after tuning (0: only on export)")
    num_seeds: int = Field(5, ge=2, description="fresh seeds per trial (>= 2 for a confidence interval)")
    seeds: list[Seed] | None = Field(None, description="explicit fresh seeds (default: after the tuning seeds)")
    confidence: float = Field(0.95, gt=0.0, lt=1.0)

    _unique = field_validator("seeds")(_unique_seeds)


class ExportSpec(StrictModel):
    """How ``export`` picks and labels a trial.

    Attributes:
        best_by: objective metric that picks the best feasible Pareto trial (default: the first).
        vllm_method: vLLM ``speculative_config.method``.
        sglang_algorithm: SGLang ``--speculative-algorithm``.

    Source:
        vLLM's ``--speculative-config`` and SGLang's ``--speculative-algorithm`` server
        arguments (their documentation); the selection rule of :mod:`memtp_sim.tuning._selection`.
    """

    best_by: str | None = Field(None, description="objective metric that breaks Pareto ties (default: first)")
    vllm_method: str = Field("dspark", description="vLLM speculative_config.method (dspark: vLLM's DSpark drafter "
                             "with adaptive verification for DSpark policies)")
    sglang_algorithm: str = Field("NEXTN", description="SGLang --speculative-algorithm")


class CapacitySpec(StrictModel):
    """How the ``sla_capacity_per_s`` objective searches (:func:`memtp_sim.capacity.sla_capacity`).

    Attributes:
        slo: the SLO text, e.g. ``"ttft_s_p90 <= 2 AND tpot_ms_p90 <= 50"`` (:meth:`memtp_sim.capacity.SLO.parse`).
        rel_tol: stop when first failing / last passing rate <= 1 + rel_tol.
        max_runs: simulation runs per search at most (one search per trial seed).
        min_requests: requests per run at least.

    Raises:
        pydantic.ValidationError: on construction: an SLO that does not parse (the message is the
            parser's), ``rel_tol <= 0``, ``max_runs < 3`` or ``min_requests < 1``.

    Source:
        Issue 11.5: SLA capacity as a ``tune`` objective; the search is bracketing and bisection on
        log rate (:mod:`memtp_sim.capacity`).
    """

    slo: str
    rel_tol: float = Field(0.05, gt=0.0)
    max_runs: int = Field(40, ge=3)
    min_requests: int = Field(400, ge=1)

    @field_validator("slo")
    @classmethod
    def _parses(cls, v: str) -> str:
        try:
            SLO.parse(v)
        except InvalidArgumentError as e:
            raise ValueError(str(e)) from None
        return v


def _default_objectives() -> list[Objective]:
    return [Objective(metric="throughput_tok_per_s", direction="maximize"),
            Objective(metric="tok_per_s_user_p50", direction="maximize")]


class TuneSpec(StrictModel):
    """A tuning job: base scenario, search space, objectives, constraints, seeds.

    The YAML shape, the search-space rules and the selection rules are described in
    :mod:`memtp_sim.tuning`; :func:`memtp_sim.tuning.parse_tune_spec` builds one and checks the
    search space against the scenario.

    Attributes:
        name: Optuna study name; results go to ``<out_dir>/<name>/``.
        description: free text, shown in the report.
        base: the scenario every trial starts from.
        search_space: dotted scenario path -> distribution (at least one entry).
        pair_constraints: ordered pairs ``lower < upper``.
        objectives: metrics to optimise (each at most once).
        constraints: ``metric >= v`` / ``metric <= v`` on seed means.
        seeds: run seeds of every trial (common random numbers; unique, >= 0).
        n_trials: COMPLETE trials wanted (>= 1).
        sampler: the Optuna sampler.
        validation: fresh-seed re-runs of the top trials.
        export: how ``export`` picks and labels a trial.
        capacity: the SLA-capacity search, needed when :data:`CAPACITY_METRIC` is an objective or
            a constraint.

    Raises:
        pydantic.ValidationError: on construction: any field invalid, an objective metric listed
            twice, ``export.best_by`` not an objective, fewer than 2 or non-fresh
            ``validation.seeds``, ``sla_capacity_per_s`` used without a ``capacity`` section (:func:`memtp_sim.tuning.parse_tune_spec` turns these into
            ``ConfigError``).

    Source:
        Optuna documentation: one study per ``name`` (``optuna.create_study``), objectives as
        study ``directions``, constraints as ``Trial.set_constraint`` values; common random
        numbers over ``seeds``.
    """

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
    capacity: CapacitySpec | None = None

    #: Where the spec came from (the YAML path): every error about the spec starts with it.
    _source: str = PrivateAttr("<tune>")

    _unique = field_validator("seeds")(_unique_seeds)

    @model_validator(mode="after")
    def _cross_checks(self) -> TuneSpec:
        names = [o.metric for o in self.objectives]
        if len(set(names)) != len(names):
            raise ValueError(f"objectives: each metric at most once (got {names})")
        if self.export.best_by is not None and self.export.best_by not in names:
            raise ValueError(f"export.best_by: {self.export.best_by!r} is not an objective; "
                             f"allowed: {', '.join(names)}")
        used = names + [c.metric for c in self.constraints]
        if CAPACITY_METRIC in used and self.capacity is None:
            raise ValueError(f"capacity: {CAPACITY_METRIC} needs a `capacity:` section with its slo, "
                             "e.g. capacity: {slo: 'ttft_s_p90 <= 2 AND tpot_ms_p90 <= 50'}")
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
        """``"maximize"`` / ``"minimize"`` per objective, in order."""
        return [o.direction for o in self.objectives]

    @property
    def objective_names(self) -> list[str]:
        """The objectives' metric names, in order."""
        return [o.metric for o in self.objectives]

    @property
    def best_by(self) -> str:
        """The objective that picks the best trial: ``export.best_by``, else the first objective."""
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
        """Declared pair rules plus the implied scenario orderings whose ends are both tuned.

        Returns:
            The rules; implied ones are named ``"implied: lower < upper"``.

        Source:
            The scenario's own orderings (``memtp.r_low < memtp.r_high``: docs/model.md section 2;
            ``engine.prefill_chunk_tokens < engine.max_batch_tokens``: :mod:`memtp_sim.config`).
        """
        pairs = list(self.pair_constraints)
        named = {(p.lower, p.upper) for p in pairs}
        for lo, up in _IMPLIED_PAIRS:
            if lo in self.search_space and up in self.search_space and (lo, up) not in named:
                pairs.append(PairConstraint(rule=f"{lo} < {up}", name=f"implied: {lo} < {up}"))
        return pairs

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dump that :func:`memtp_sim.tuning.parse_tune_spec` reads back (policy flattened).

        Returns:
            The mapping (what the study records in its user attribute :data:`STUDY_ATTR`).
        """
        doc = self.model_dump(mode="json", exclude_none=False)
        doc["base"]["policy"] = {"name": self.base.policy.name, **self.base.policy.params}
        return doc

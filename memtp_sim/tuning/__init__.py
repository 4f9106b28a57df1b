"""Optuna tuning of a scenario: generic search space, noise-aware trials, resumable storage.

``python -m memtp_sim tune studies/tune.yaml`` reads a *tune spec* (YAML)::

    name: tune                       # Optuna study name; results go to results/<name>/
    base: {...}                      # a Scenario, the same shape as a study's ``base``
    search_space:                    # dotted scenario path -> distribution
      confidence.temperature: {type: float, low: 0.5, high: 3.0, log: true}
      policy.gamma: {type: int, low: 1, high: 10, step: 1}
      policy.name: {type: categorical, choices: [dspark, threshold]}
      policy.threshold: {type: float, low: 0.05, high: 0.9, when: {policy.name: threshold}}
    pair_constraints:                # ordered pairs, "lower < upper"
      - memtp.r_low < memtp.r_high
    objectives:                      # default: maximise throughput and p50 tok/s/user
      - {metric: throughput_tok_per_s, direction: maximize}
      - {metric: tok_per_s_user_p50, direction: maximize}
    constraints: [tok_per_s_user_p10 >= 10, num_rejected <= 0]
    seeds: [0, 1]                    # common random numbers: every trial runs every seed (>= 0, unique)
    n_trials: 100
    sampler: {name: tpe, seed: 0, n_startup_trials: 10}
    validation: {top_k: 3, num_seeds: 5}   # fresh-seed re-runs of the top trials
    export: {best_by: throughput_tok_per_s, vllm_method: dspark, sglang_algorithm: NEXTN}
    capacity: {slo: "ttft_s_p90 <= 2 AND tpot_ms_p90 <= 50"}   # needed for sla_capacity_per_s

``sla_capacity_per_s`` (objective or constraint) is the highest Poisson rate meeting
``capacity.slo``, one :func:`memtp_sim.capacity.sla_capacity` search per seed (10-20 runs each:
use it with few seeds and trials).

Types are strict, as in scenario and study YAML (:class:`memtp_sim.config.StrictModel`):
``seeds: [true, 2]`` or ``n_trials: "7"`` is a one-line error naming the file and the field.

The implementation lives in private modules, one concern each; this package re-exports the public
names:

* ``_spec``: the spec models; objectives and constraints.
* ``_loading``: YAML -> :class:`TuneSpec`, one-line errors, search-space checks.
* ``_space``: search space and ordered pairs: ranges, sampling, the scenario of a point.
* ``_evaluation``: seed runs (common random numbers), the objective, constraint values, Ctrl-C.
* ``_storage``: storage URLs, resume, dead workers, the study record.
* ``_runner``: :func:`run_tune`, in process or with worker processes.
* ``_selection``: feasible trials, Pareto front, the best trial.
* ``_importances``: parameter importances for a *good* value of an objective.
* ``_validation``: fresh-seed re-runs with t-distribution confidence intervals.
* ``_report``: ``results/<name>/report.html``.

:mod:`memtp_sim.tuning.export` (public) writes vLLM / SGLang / MEMTP configs from a tuned study.
Each module's docstring describes its part of the behaviour (e.g. the ordered-pair rules in
``_space``, storage and resume in ``_storage``, Ctrl-C in ``_runner``).
"""

from ._evaluation import evaluate
from ._importances import importance_figure, importance_target, param_importances
from ._loading import load_tune_spec, parse_tune_spec
from ._report import write_tune_report
from ._runner import TuneOutcome, run_tune
from ._selection import (
    constraint_failures,
    feasible_trials,
    pareto_trials,
    select_trial,
    top_trials,
)
from ._space import sample_params, scenario_for, static_ranges
from ._spec import (
    CAPACITY_METRIC,
    HEADLINE_METRICS,
    STUDY_ATTR,
    CapacitySpec,
    CategoricalDist,
    ExportSpec,
    FloatDist,
    IntDist,
    MetricConstraint,
    Objective,
    PairConstraint,
    SamplerSpec,
    TuneSpec,
    ValidationSpec,
)
from ._storage import (
    check_study_inputs,
    default_storage_url,
    fail_dead_worker_trials,
    mask_url,
    open_storage,
    open_study,
    study_inputs,
)
from ._validation import t_confidence_interval, validate_trials

__all__ = [
    # the spec (_spec)
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
    "HEADLINE_METRICS",
    "STUDY_ATTR",
    "CAPACITY_METRIC",
    "CapacitySpec",
    # loading (_loading)
    "load_tune_spec",
    "parse_tune_spec",
    # the search space (_space)
    "static_ranges",
    "sample_params",
    "scenario_for",
    # evaluation (_evaluation)
    "evaluate",
    # storage (_storage)
    "default_storage_url",
    "open_storage",
    "mask_url",
    "open_study",
    "fail_dead_worker_trials",
    "study_inputs",
    "check_study_inputs",
    # running (_runner)
    "TuneOutcome",
    "run_tune",
    # selection (_selection)
    "feasible_trials",
    "pareto_trials",
    "top_trials",
    "select_trial",
    "constraint_failures",
    # importances (_importances)
    "importance_target",
    "param_importances",
    "importance_figure",
    # validation (_validation)
    "t_confidence_interval",
    "validate_trials",
    # report (_report)
    "write_tune_report",
]

"""Scoring a point: seed runs, the Optuna objective, constraint values, and stopping on Ctrl-C.

**Noise.** Every trial runs the same ``seeds`` (common random numbers: all trials see the same
requests and acceptance draws). The trial value is the mean over seeds; per-seed values are the
trial's user attribute ``replicates``.

**Constraints.** Violations (:meth:`MetricConstraint.violation`) go to the sampler: with Optuna >= 5
through ``Trial.set_constraint`` (Optuna 5 deprecated the samplers' ``constraints_func`` in its
favour; constraint-aware samplers, ``study.best_trials`` and ``plot_pareto_front`` read the same
stored values), with Optuna 4 through the sampler's ``constraints_func``
(:func:`constraints_from_attrs`). Infeasible trials stay in the study but never enter the Pareto
front or the export.

**Ctrl-C.** The first Ctrl-C asks the running trials to stop between two seed runs (that trial
FAILs; finished trials are kept; :class:`SigintSetsEvent`, :class:`Stopped`); a second one
interrupts at once.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..api import run
from ..capacity import sla_capacity
from ..config import Scenario
from ._space import sample_params, scenario_for
from ._spec import CAPACITY_METRIC, CapacitySpec, TuneSpec
from ._storage import worker_identity

if TYPE_CHECKING:  # pragma: no cover
    import optuna

__all__ = [
    "SigintSetsEvent",
    "Stopped",
    "constraints_from_attrs",
    "evaluate",
    "has_set_constraint",
    "make_objective",
    "stop_callback",
    "zero_capacity_warning",
]


class Stopped(Exception):
    """A stop was requested (Ctrl-C): raised between two seed runs of a trial, which then FAILs.

    Source:
        Optuna documentation, ``Study.optimize``: an exception raised by the objective (not in
        ``catch``) marks the trial FAIL and propagates.
    """


def evaluate(scenario: Scenario, seeds: Sequence[int], metrics: Sequence[str], *,
             should_stop: Callable[[], bool] | None = None,
             capacity: CapacitySpec | None = None) -> dict[str, Any]:
    """Run ``scenario`` once per seed and collect scalar metrics.

    Args:
        scenario: the scenario.
        seeds: run seeds (one replicate each).
        metrics: metric names to keep (missing or non-scalar ones are skipped).
        should_stop: checked before each seed run; when it returns True the evaluation is
            abandoned (an internal exception the tuner turns into a FAIL trial and a clean stop).
        capacity: when given and ``metrics`` names :data:`CAPACITY_METRIC`, each seed also runs
            one SLA-capacity search (:func:`memtp_sim.capacity.sla_capacity` with that seed
            alone), and its ``capacity_per_s`` (req/s; the highest rate seen to pass, 0.0 when
            none did) is that seed's replicate.

            A search whose SLO fails on its unloaded run already (a latency bound that one
            request at a time misses) stops after that run and scores 0.0 at once.

    Returns:
        ``{"replicates": {metric: [value per seed]}, "means": {metric: nanmean},
        "applied_temperatures": [per-position temperatures of the first seed],
        "capacity_unreachable": [why the SLO fails even unloaded, one line per distinct reason]}``;
        a metric is kept only when every seed reported it as a number.

    Raises:
        Stopped: ``should_stop()`` returned True before a seed run.

    Source:
        Common random numbers (the same seeds for every trial), a standard variance-reduction
        technique of simulation studies (e.g. Law, *Simulation Modeling and Analysis*).
    """
    reps: dict[str, list[float]] = {m: [] for m in metrics}
    temps: list[float] = []
    unreachable: list[str] = []
    for i, seed in enumerate(seeds):
        if should_stop is not None and should_stop():
            raise Stopped(f"interrupted before seed {seed}")
        res = run(scenario, seed=int(seed))
        if i == 0:
            temps = [float(t) for t in res.provenance.get("confidence", {}).get("applied_temperatures", [])]
        for m in metrics:
            v = res.metrics.get(m)
            if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool):
                reps[m].append(float(v))
        if capacity is not None and CAPACITY_METRIC in reps:
            # One search per seed, so the objective has replicates like any run metric (the
            # validation's t interval needs them); the seed's own runs share its random streams.
            found = sla_capacity(scenario, capacity.slo, seeds=(int(seed),), rel_tol=capacity.rel_tol,
                                 max_runs=capacity.max_runs, min_requests=capacity.min_requests)
            reps[CAPACITY_METRIC].append(float(found.capacity_per_s))
            if found.unreachable and found.note not in unreachable:  # one unloaded run, no rate tried
                unreachable.append(found.note)
    reps = {m: v for m, v in reps.items() if len(v) == len(seeds)}
    means = {}
    for m, v in reps.items():
        arr = np.asarray(v, dtype=np.float64)
        means[m] = float(np.nanmean(arr)) if np.isfinite(arr).any() else float("nan")
    return {"replicates": reps, "means": means, "applied_temperatures": temps, "capacity_unreachable": unreachable}


def has_set_constraint() -> bool:
    """Whether this Optuna has ``Trial.set_constraint`` (Optuna >= 5).

    Returns:
        True on Optuna 5 and later.

    Source:
        Optuna API reference, ``optuna.trial.Trial``.
    """
    import optuna  # lazy: importing memtp_sim.tuning must not import optuna (~0.1 s)

    return hasattr(optuna.trial.Trial, "set_constraint")


def constraints_from_attrs(trial: optuna.trial.FrozenTrial) -> list[float]:
    """A ``constraints_func`` (Optuna 4) reading the violations the objective stored.

    Args:
        trial: a finished trial.

    Returns:
        Its ``user_attrs["constraint_values"]`` (empty when absent), <= 0 meaning satisfied.

    Source:
        Optuna documentation, the samplers' ``constraints_func`` (a value <= 0 is feasible).
    """
    return [float(v) for v in trial.user_attrs.get("constraint_values", [])]


def make_objective(spec: TuneSpec, should_stop: Callable[[], bool] | None = None, call: str | None = None,
                   ) -> Callable[[optuna.trial.Trial], float | tuple[float, ...]]:
    """The Optuna objective: sample a point, run every tuning seed, record the trial.

    The trial records the user attributes ``worker``, ``seeds``, ``replicates``, ``metrics`` (seed
    means), ``applied_temperatures``, ``constraint_values``, ``feasible`` and, when the capacity
    SLO fails even unloaded, ``capacity_unreachable`` (the reasons); with Optuna >= 5 the
    constraint values also go through ``Trial.set_constraint``.

    Args:
        spec: the tune spec.
        should_stop: checked before each seed run (see :func:`evaluate`).
        call: the id of the ``tune`` call running the objective, recorded in ``worker``
            (:func:`memtp_sim.tuning._storage.worker_identity`).

    Returns:
        ``objective(trial) -> value`` (one objective) or a tuple of values (several), seed means.
        The objective raises :class:`Stopped` when a stop is requested between seed runs.

    Source:
        Optuna documentation, ``Study.optimize`` (objective returning one value or a tuple for a
        multi-objective study); common random numbers as in :func:`evaluate`.
    """
    use_set_constraint = has_set_constraint()
    tracked = spec.tracked_metrics

    def objective(trial: optuna.trial.Trial) -> float | tuple[float, ...]:
        trial.set_user_attr("worker", worker_identity(call))
        values = sample_params(trial, spec)
        scen = scenario_for(spec, values)
        try:
            ev = evaluate(scen, spec.seeds, tracked, should_stop=should_stop, capacity=spec.capacity)
        except Stopped as e:
            trial.set_user_attr("failed_reason", f"{e} (Ctrl-C); run the same command again to resume")
            raise
        cons = [c.violation(ev["means"].get(c.metric, float("nan"))) for c in spec.constraints]
        trial.set_user_attr("seeds", [int(s) for s in spec.seeds])
        trial.set_user_attr("replicates", ev["replicates"])
        trial.set_user_attr("metrics", ev["means"])
        trial.set_user_attr("applied_temperatures", ev["applied_temperatures"])
        trial.set_user_attr("constraint_values", cons)
        if ev["capacity_unreachable"]:
            trial.set_user_attr("capacity_unreachable", ev["capacity_unreachable"])
        trial.set_user_attr("feasible", bool(all(v <= 0 for v in cons)))
        if use_set_constraint:
            for c, v in zip(spec.constraints, cons):
                trial.set_constraint(c.label, v)
        out = tuple(ev["means"].get(m, float("nan")) for m in spec.objective_names)
        return out[0] if len(out) == 1 else out

    return objective


def zero_capacity_warning(spec: TuneSpec, trials: Sequence[Any]) -> str | None:
    """One line when every complete trial scored :data:`CAPACITY_METRIC` 0, saying why.

    Args:
        spec: the tune spec.
        trials: the study's trials (FrozenTrials; only COMPLETE ones count).

    Returns:
        None when the spec does not use the capacity metric, no trial completed, or some trial
        found a passing rate; else the warning, quoting the reason the trials recorded when the
        SLO failed even unloaded (``capacity_unreachable``).
    """
    if spec.capacity is None or CAPACITY_METRIC not in spec.tracked_metrics:
        return None
    done = [t for t in trials if getattr(t.state, "name", "") == "COMPLETE"]
    values = [t.user_attrs.get("metrics", {}).get(CAPACITY_METRIC) for t in done]
    if not done or any(v is None or not v == 0.0 for v in values):
        return None
    reasons = list(dict.fromkeys(r for t in done for r in t.user_attrs.get("capacity_unreachable", [])))
    where = f"capacity.slo in {spec.source}"
    if reasons and all(t.user_attrs.get("capacity_unreachable") for t in done):
        return (f"every trial scored {CAPACITY_METRIC} 0: the SLO {spec.capacity.slo!r} cannot be met with no load "
                f"at all: {reasons[0]}{' (and others)' if len(reasons) > 1 else ''}; loosen {where} or change the "
                "base scenario (e.g. engine.prefill, hardware)")
    return (f"every trial scored {CAPACITY_METRIC} 0: no Poisson rate met the SLO {spec.capacity.slo!r} in any trial; "
            f"loosen {where} or change the search space")


def stop_callback(should_stop: Callable[[], bool]) -> Callable[[optuna.Study, Any], None]:
    """An ``optimize`` callback that ends the loop after a trial once a stop was requested.

    Args:
        should_stop: returns True once a stop was requested.

    Returns:
        ``callback(study, trial)``, which calls ``study.stop()`` then.

    Source:
        Optuna documentation, ``Study.optimize(callbacks=...)`` and ``Study.stop``.
    """
    def callback(study: optuna.Study, trial: Any) -> None:
        if should_stop():
            study.stop()

    return callback


class SigintSetsEvent:
    """In the main thread: the first Ctrl-C only sets ``event`` (the tuner stops between seed runs,
    so Optuna is never interrupted halfway through recording a trial); a second one interrupts at once.

    A context manager; outside the main thread it does nothing (signals go to the main thread).

    Args:
        event: set on the first SIGINT.

    Source:
        Python :mod:`signal` documentation (handlers run in the main thread only); the previous
        handler is restored on the first SIGINT and on exit.
    """

    def __init__(self, event: threading.Event) -> None:
        self.event = event
        self.previous: Any = None
        self.active = threading.current_thread() is threading.main_thread()

    def _handler(self, signum: int, frame: Any) -> None:
        self.event.set()
        signal.signal(signal.SIGINT, self.previous)

    def __enter__(self) -> SigintSetsEvent:
        if self.active:
            self.previous = signal.getsignal(signal.SIGINT)
            if self.previous is None:  # installed outside Python
                self.previous = signal.default_int_handler
            signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.active:
            signal.signal(signal.SIGINT, self.previous)

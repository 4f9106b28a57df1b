"""Picking trials: feasible trials, the Pareto front, the top trials, the one to export.

**Best trial** (multi-objective): among complete, feasible trials on the Pareto front, the one with
the best ``export.best_by`` objective (default: the first objective, throughput), ties to the lower
trial number. This is the same trial as the feasible trial with the best ``best_by`` value, up to
ties. Single objective: the feasible trial with the best value.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ConfigError
from ._spec import TuneSpec, format_number

if TYPE_CHECKING:  # pragma: no cover
    import optuna

__all__ = [
    "constraint_failures",
    "feasible_trials",
    "pareto_trials",
    "select_trial",
    "top_trials",
]


def _is_feasible(t: optuna.trial.FrozenTrial) -> bool:
    if "feasible" in t.user_attrs:
        return bool(t.user_attrs["feasible"])
    return all(float(v) <= 0 for v in t.user_attrs.get("constraint_values", []))


def feasible_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """COMPLETE trials with finite values whose constraint values are all <= 0 (trial-number order).

    Args:
        study: the study.

    Returns:
        The feasible trials.

    Source:
        Optuna's constraint convention (documentation of ``constraints_func`` and
        ``Trial.set_constraint``): a value <= 0 is satisfied.
    """
    from optuna.trial import (
        TrialState,  # lazy: importing memtp_sim.tuning must not import optuna (~0.1 s)
    )

    out = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if t.values is not None and all(math.isfinite(v) for v in t.values) and _is_feasible(t):
            out.append(t)
    return out


def pareto_trials(trials: Sequence[optuna.trial.FrozenTrial],
                  directions: Sequence[str]) -> list[optuna.trial.FrozenTrial]:
    """Trials not dominated by any other in ``trials``.

    ``a`` dominates ``b`` when ``a`` is at least as good in every objective and strictly better in
    one (better = larger for ``maximize``).

    Args:
        trials: candidate trials (COMPLETE, finite values), ``n`` of them with ``m`` values each.
        directions: ``"maximize"`` / ``"minimize"`` per objective (length ``m``).

    Returns:
        The non-dominated trials, in input order.

    Source: Pareto dominance as Optuna defines it for ``Study.best_trials``
    (``optuna/study/_multi_objective.py``).
    """
    sign = np.array([1.0 if d == "maximize" else -1.0 for d in directions])
    vals = np.array([np.asarray(t.values, dtype=np.float64) * sign for t in trials]).reshape(len(trials), len(sign))
    keep = []
    for i in range(len(trials)):
        dominated = np.any(np.all(vals >= vals[i], axis=1) & np.any(vals > vals[i], axis=1))
        if not dominated:
            keep.append(trials[i])
    return keep


def top_trials(study: optuna.Study, spec: TuneSpec, k: int) -> list[optuna.trial.FrozenTrial]:
    """The ``k`` best feasible trials: the feasible Pareto front first, each group ordered by
    ``spec.best_by`` (best first, ties to the lower trial number).

    Args:
        study: the study.
        spec: the tune spec.
        k: how many.

    Returns:
        Up to ``k`` trials; empty when no trial is feasible.

    Source:
        Pareto dominance of :func:`pareto_trials` (as Optuna's ``Study.best_trials``), then
        the ``export.best_by`` objective.
    """
    feas = feasible_trials(study)
    idx = spec.objective_names.index(spec.best_by)
    sign = -1.0 if spec.objectives[idx].direction == "maximize" else 1.0
    front = pareto_trials(feas, spec.directions)
    front_ids = {t.number for t in front}
    rest = [t for t in feas if t.number not in front_ids]

    def key(t: optuna.trial.FrozenTrial) -> tuple[float, int]:
        return (sign * t.values[idx], t.number)

    return (sorted(front, key=key) + sorted(rest, key=key))[:k]


def select_trial(study: optuna.Study, spec: TuneSpec, which: str | int = "best") -> optuna.trial.FrozenTrial:
    """The trial to export: ``"best"`` (see the module docstring) or a trial number.

    Args:
        study: the study.
        spec: the tune spec.
        which: ``"best"`` or a trial number.

    Returns:
        The trial.

    Raises:
        ConfigError: empty study, no feasible trial, unknown or unfinished trial number.

    Source:
        The best-trial rule of this module's docstring (feasible Pareto front, then
        ``export.best_by``), on Optuna's trial states.
    """
    from optuna.trial import (
        TrialState,  # lazy: importing memtp_sim.tuning must not import optuna (~0.1 s)
    )

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
        written plainly, in the metric's units); empty when all are met.

    Source:
        Violations as :meth:`memtp_sim.tuning.MetricConstraint.violation` computes them (Optuna's
        convention: <= 0 satisfied).
    """
    out = []
    for c, v in zip(spec.constraints, constraint_values):
        if float(v) <= 0:
            continue
        m = means.get(c.metric)
        if m is None or not math.isfinite(float(m)):
            out.append(f"{c.label}: {c.metric} is NaN")
        else:
            out.append(f"{c.label}: {c.metric} = {format_number(m)}, "
                       f"{'short' if c.op == '>=' else 'over'} by {format_number(v)}")
    return out

"""Parameter importances *for a good value* of an objective, and Optuna's plot of them.

Optuna 5's default importance evaluator (PED-ANOVA) ranks parameters for reaching *low* target
values, so a maximised objective is passed negated (:func:`importance_target`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import optuna

__all__ = ["importance_figure", "importance_target", "param_importances", "warning_notes"]

#: Optuna 5's PED-ANOVA evaluator warns that a user ``target`` is read as "lower is better". That is
#: exactly how :func:`importance_target` builds it (negated for a maximised objective), so this one
#: warning is expected and filtered; any other warning is kept.
_LOW_TARGET_WARNING = r".*computes the importances of params to achieve low `target` values"


def importance_target(index: int, direction: str) -> Callable[[optuna.trial.FrozenTrial], float]:
    """The importance target for objective ``index``: lower must mean better.

    Optuna's default evaluator (PED-ANOVA in Optuna 5) ranks parameters by how much they matter for
    reaching *low* target values, whatever the study's directions; a maximised objective is
    therefore negated. (fANOVA, Optuna 4's default, explains variance and ignores the sign.)

    Args:
        index: objective index.
        direction: ``"maximize"`` or ``"minimize"``.

    Returns:
        ``trial -> value`` (negated when maximised).

    Raises:
        ValueError: ``direction`` is neither.

    Source:
        Optuna's ``optuna.importance.PedAnovaImportanceEvaluator`` documentation (the
        importances of parameters for achieving low target values).
    """
    if direction not in ("maximize", "minimize"):
        raise ValueError(f"direction must be 'maximize' or 'minimize' (got {direction!r})")
    sign = -1.0 if direction == "maximize" else 1.0

    def target(t: optuna.trial.FrozenTrial) -> float:
        return sign * float(t.values[index])

    return target


def _study_direction(study: optuna.Study, index: int) -> str:
    return study.directions[index].name.lower()


def param_importances(study: optuna.Study, index: int = 0, direction: str | None = None) -> dict[str, float]:
    """Parameter importances for a *good* value of objective ``index`` (high when maximised).

    Args:
        study: the study (COMPLETE trials count, feasible or not).
        index: objective index.
        direction: ``"maximize"`` / ``"minimize"`` (default: the study's direction for ``index``).

    Returns:
        ``{param: importance}``, most important first (normalised to sum 1).

    Raises:
        ValueError, RuntimeError: Optuna cannot compute importances (e.g. no complete trials).

    Source:
        Optuna documentation, ``optuna.importance.get_param_importances(study, target=...)``
        with the default evaluator; target from :func:`importance_target`.
    """
    import optuna  # lazy: importing memtp_sim.tuning must not import optuna (~0.1 s)

    direction = direction or _study_direction(study, index)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_LOW_TARGET_WARNING, category=UserWarning)
        return optuna.importance.get_param_importances(study, target=importance_target(index, direction))


def importance_figure(study: optuna.Study, index: int, name: str,
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

    Raises:
        ValueError, RuntimeError, ZeroDivisionError: Optuna cannot compute importances.

    Source:
        Optuna documentation, ``optuna.visualization.plot_param_importances(study, target=...,
        target_name=...)``.
    """
    import optuna.visualization as vis  # lazy: optuna and plotly are only needed to draw (~0.2 s)

    direction = direction or _study_direction(study, index)
    label = f"importance for {'high' if direction == 'maximize' else 'low'} {name}"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", message=_LOW_TARGET_WARNING, category=UserWarning)
        fig = vis.plot_param_importances(study, target=importance_target(index, direction), target_name=label)
    fig.update_layout(title=f"Hyperparameter importances: {label}")
    return fig, warning_notes(caught)


def warning_notes(caught: Sequence[warnings.WarningMessage]) -> list[str]:
    """Recorded warnings as notes for a report, duplicates dropped.

    Args:
        caught: what ``warnings.catch_warnings(record=True)`` recorded.

    Returns:
        ``"Category: message"`` per distinct warning, in order.

    Source:
        Python :mod:`warnings` documentation (``catch_warnings(record=True)`` yields
        ``WarningMessage`` objects).
    """
    notes: list[str] = []
    for w in caught:
        text = f"{w.category.__name__}: {w.message}"
        if text not in notes:
            notes.append(text)
    return notes

"""The tuning report (``results/<name>/report.html``) on the shared page shell.

The Pareto front, and per objective the optimisation history and the parameter importances *for a
good value* of it (:mod:`memtp_sim.tuning._importances`), the fresh-seed validation table and the
feasible Pareto trials, drawn with Optuna's own plots on :class:`memtp_sim._html.HtmlPage`.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._html import HtmlPage, escape
from .._io import atomic_write_text
from ._evaluation import constraints_from_attrs, has_set_constraint
from ._importances import importance_figure, warning_notes
from ._selection import feasible_trials, pareto_trials
from ._spec import TuneSpec

if TYPE_CHECKING:  # pragma: no cover
    import optuna

__all__ = ["write_tune_report"]


def write_tune_report(study: optuna.Study, spec: TuneSpec, path: str | Path, *, storage: str | None = None) -> Path:
    """Write a self-contained HTML report with Optuna's own plots.

    Pareto front (feasible trials; infeasible ones grey, never on the front; 2 or 3 objectives),
    optimisation history and parameter importances per objective (importances for a *good* value:
    see :func:`memtp_sim.tuning.param_importances`), the fresh-seed validation table, and the
    feasible Pareto trials. Warnings Optuna raises while plotting (e.g. too few trials for the
    importances) are shown as notes under the plot they concern.

    Args:
        study: the study.
        spec: its tune spec.
        path: output HTML file (written atomically).
        storage: the study's storage URL (password masked), named on the page: studies of one
            name in two storages write their reports to the same folder.

    Returns:
        ``path``.

    Raises:
        OSError: the report cannot be written (from :func:`memtp_sim._io.atomic_write_text`).

    Source:
        Optuna documentation, ``optuna.visualization`` (``plot_pareto_front``,
        ``plot_optimization_history``, ``plot_param_importances``); the fresh-seed intervals of
        :func:`memtp_sim.tuning.t_confidence_interval` (Student's t).
    """
    path = Path(path)
    page = HtmlPage(f"Tuning study {spec.name}")
    page.add_paragraph(spec.description)
    page.add_paragraph(
        f"Objectives: {', '.join(f'{o.direction} {o.metric}' for o in spec.objectives)}; "
        f"constraints: {'; '.join(c.label for c in spec.constraints) or 'none'}; "
        f"tuning seeds {spec.seeds} (common random numbers, mean per trial)."
        + (f" Study storage: {storage}." if storage else ""))
    feas = feasible_trials(study)
    n_complete = len([t for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"])
    if len(spec.objective_names) in (2, 3) and n_complete:
        _add_pareto_front(page, study, spec)
    for i in range(len(spec.objectives)):
        _add_objective(page, study, spec, i, n_complete)
    _add_validation_table(page, study, spec)
    _add_front_table(page, spec, feas, n_complete)
    atomic_write_text(path, page.render())
    return path


def _add_notes(page: HtmlPage, notes: list[str]) -> None:
    page.add_html("".join(f"<p class='note'>note from Optuna: {escape(n)}</p>" for n in notes))


def _add_pareto_front(page: HtmlPage, study: optuna.Study, spec: TuneSpec) -> None:
    import optuna.visualization as vis  # lazy: optuna and plotly are only needed to draw (~0.2 s)

    kw: dict[str, Any] = {}
    if spec.constraints and not has_set_constraint():
        kw["constraints_func"] = constraints_from_attrs  # Optuna 4; deprecated (FutureWarning) in 5
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fig = vis.plot_pareto_front(study, target_names=spec.objective_names, **kw)
    page.add_heading("Pareto front (feasible trials; infeasible shown grey, excluded from the front)")
    page.add_figure(fig)
    _add_notes(page, warning_notes(caught))


def _add_objective(page: HtmlPage, study: optuna.Study, spec: TuneSpec, i: int, n_complete: int) -> None:
    """Optimisation history and parameter importances of objective ``i``."""
    import optuna.visualization as vis  # lazy: optuna and plotly are only needed to draw (~0.2 s)

    name, direction = spec.objective_names[i], spec.directions[i]

    def target(t: Any) -> float:
        return float(t.values[i])

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fig = vis.plot_optimization_history(study, target=target, target_name=name)
    except (ValueError, RuntimeError) as e:
        page.add_heading(f"Optimisation history: {name}")
        page.add_paragraph(f"not available: {e}")
    else:
        page.add_heading(f"Optimisation history: {name} ({direction})")
        page.add_figure(fig)
        _add_notes(page, warning_notes(caught))
    good = "high" if direction == "maximize" else "low"
    title = (f"Parameter importances for {good} {name} (Optuna's default evaluator over all {n_complete} "
             "complete trials, feasible or not)")
    try:
        fig, notes = importance_figure(study, i, name, direction)
    except (ValueError, RuntimeError, ZeroDivisionError) as e:
        page.add_heading(title)
        page.add_paragraph(f"not available: {e}")
    else:
        page.add_heading(title)
        page.add_figure(fig)
        _add_notes(page, notes)


def _add_validation_table(page: HtmlPage, study: optuna.Study, spec: TuneSpec) -> None:
    """Fresh-seed validation records (mean ± 95% t half-width), when there are any."""
    names = spec.objective_names
    extra = [c.metric for c in spec.constraints if c.metric not in names]
    rows = []
    for num, rec in sorted(study.user_attrs.get("validation", {}).items(), key=lambda kv: int(kv[0])):
        cells = [f"<td>{num}</td>", f"<td>{escape(json.dumps(rec['params']))}</td>"]
        for m in names + extra:
            ci = rec["metrics"].get(m)
            cells.append("<td>-</td>" if ci is None else f"<td>{ci['mean']:.4g} ± {ci['half_width']:.2g}</td>")
        cells.append(f"<td>{'yes' if rec['feasible'] else 'no'}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    if not rows:
        return
    heads = ["trial", "params", *names, *extra, "feasible"]
    page.add_heading(f"Fresh-seed validation (seeds {spec.fresh_seeds}; mean ± 95% t half-width)")
    page.add_html("<table class='tbl'><tr>" + "".join(f"<th>{escape(h)}</th>" for h in heads) + "</tr>"
                  + "".join(rows) + "</table>")


def _add_front_table(page: HtmlPage, spec: TuneSpec, feas: list[Any], n_complete: int) -> None:
    """The feasible Pareto trials with their parameters and values."""
    names = spec.objective_names
    front = sorted(pareto_trials(feas, spec.directions), key=lambda t: t.number) if feas else []
    body = "".join(
        f"<tr><td>{t.number}</td><td>{escape(json.dumps(t.params))}</td>"
        + "".join(f"<td>{v:.4g}</td>" for v in t.values) + "</tr>" for t in front)
    page.add_heading(f"Feasible Pareto trials ({len(front)} of {len(feas)} feasible, {n_complete} complete)")
    page.add_html("<table class='tbl'><tr><th>trial</th><th>params</th>"
                  + "".join(f"<th>{escape(n)}</th>" for n in names) + "</tr>" + body + "</table>")

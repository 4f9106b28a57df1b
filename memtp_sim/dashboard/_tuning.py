"""The tuning page: open an Optuna study made by ``python -m memtp_sim tune``, browse it, export.

The study comes from a folder (``results/tune``: its ``optuna.db``) or any storage URL
(``sqlite:///...``, ``postgresql+psycopg2://...``, ``journal:///...``), opened with
:func:`memtp_sim.tuning.open_storage`. The page shows the feasible Pareto front (infeasible trials
grey, never on the front: :func:`memtp_sim.tuning.feasible_trials`,
:func:`~memtp_sim.tuning.pareto_trials`), Optuna's optimisation history per objective, the
parameter importances for a good value of each (:func:`memtp_sim.tuning.importance_figure`) and
the trials; a trial (a point of the front or a row's link) opens in the what-if page with its
scenario (:func:`memtp_sim.tuning.scenario_for`) and seeds. The export button downloads the files
:func:`memtp_sim.tuning.export.export_config` writes (for SGLang a zip of the flags file and its
SPS table), provenance included.
"""

from __future__ import annotations

import io
import json
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import plotly.graph_objects as go
from dash import Dash, Input, Output, State, dcc, html, no_update
from dash.exceptions import PreventUpdate

from ..errors import ConfigError, MemtpSimError
from ..tuning import (
    STUDY_ATTR,
    TuneSpec,
    feasible_trials,
    importance_figure,
    open_storage,
    pareto_trials,
    parse_tune_spec,
    scenario_for,
)
from ..tuning.export import FORMATS, export_config
from ._context import AppContext
from ._settings import settings_from_scenario, settings_to_query

if TYPE_CHECKING:  # pragma: no cover
    import optuna

__all__ = ["open_tune_study", "register_tuning", "storage_url_of", "trial_query", "tuning_page"]


def storage_url_of(source: str) -> str:
    """The storage URL of ``source``: a URL as given, a folder's ``optuna.db``, or a ``.db`` file.

    Args:
        source: ``results/tune``, ``results/tune/optuna.db`` or a storage URL.

    Returns:
        The URL.

    Raises:
        ConfigError: a folder without ``optuna.db`` (the message says how to make one).
    """
    if "://" in source:
        return source
    p = Path(source).expanduser()
    db = p if p.suffix == ".db" else p / "optuna.db"
    if not db.is_file():
        raise ConfigError(f"{source}: no Optuna study here ({db} does not exist); make one with "
                          "`python -m memtp_sim tune studies/tune.yaml` or give a storage URL")
    return f"sqlite:///{db.resolve()}"


def _results_of(source: str, default: Path) -> Path:
    """The results folder a study folder (or its ``optuna.db``) sits in; ``default`` for a URL."""
    if "://" in source:
        return default
    p = Path(source).expanduser()
    return (p.parent if p.suffix == ".db" else p).parent


def open_tune_study(url: str, name: str | None) -> tuple[optuna.Study, TuneSpec, list[str]]:
    """Open a study made by ``memtp_sim tune`` and its stored tune spec.

    Args:
        url: storage URL.
        name: study name (default: the only study, or the first by name).

    Returns:
        ``(study, spec, names of all studies in the storage)``.

    Raises:
        ConfigError: no study, an unknown name, or a study without a stored tune spec.
    """
    import optuna

    storage = open_storage(url, flag="study", must_exist=True)  # looking must not create files on the server
    names = sorted(s.study_name for s in storage.get_all_studies())
    if not names:
        raise ConfigError(f"{url}: the storage holds no study yet")
    pick = name if name in names else names[0]
    study = optuna.load_study(study_name=pick, storage=storage)
    rec = study.user_attrs.get(STUDY_ATTR)
    if not isinstance(rec, dict) or "tune_spec" not in rec:
        raise ConfigError(f"study {pick!r} was not made by `python -m memtp_sim tune` (no tune spec stored)")
    return study, parse_tune_spec(rec["tune_spec"], source=f"study {pick} (stored tune spec)", check_effects=False), names


def trial_query(spec: TuneSpec, trial: optuna.trial.FrozenTrial) -> str:
    """The what-if link (query) of a trial: its scenario and the tuning seeds.

    Args:
        spec: the study's tune spec.
        trial: a complete trial.

    Returns:
        The URL query (with ``?``).
    """
    settings, extras = settings_from_scenario(scenario_for(spec, trial.params), list(spec.seeds))
    return settings_to_query(settings, extras) or "?"


def _pareto_figure(study: optuna.Study, spec: TuneSpec) -> go.Figure:
    """Trials in the plane of the first two objectives: front red, feasible blue, infeasible grey."""
    complete = [t for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE" and t.values]
    feas = feasible_trials(study)
    front = {t.number for t in pareto_trials(feas, spec.directions)} if feas else set()
    feas_ids = {t.number for t in feas}
    names = spec.objective_names
    two = len(names) >= 2
    fig = go.Figure()
    groups = (("infeasible", "#bbbbbb", lambda t: t.number not in feas_ids),
              ("feasible", "#636efa", lambda t: t.number in feas_ids and t.number not in front),
              ("feasible Pareto front", "#ef553b", lambda t: t.number in front))
    for label, color, keep in groups:
        ts = sorted((t for t in complete if keep(t)), key=lambda t: t.values[0])
        fig.add_trace(go.Scatter(
            x=[t.values[0] for t in ts], y=[t.values[1] if two else t.number for t in ts],
            mode="lines+markers" if label.endswith("front") and two else "markers", name=label,
            marker={"color": color, "size": 10}, customdata=[t.number for t in ts],
            text=[f"trial {t.number}: {json.dumps(t.params)}" for t in ts],
            hovertemplate="%{text}<br>%{x:.4g}, %{y:.4g}<extra>" + label + "</extra>"))
    fig.update_layout(title=f"Pareto front of {study.study_name} (click a trial to open it in the what-if page)",
                      xaxis_title=names[0], yaxis_title=names[1] if two else "trial", height=460)
    return fig


def _history_figures(study: optuna.Study, spec: TuneSpec) -> list[Any]:
    """Optuna's optimisation history and the importances for a good value, per objective."""
    import optuna.visualization as vis

    out: list[Any] = []
    for i, (name, direction) in enumerate(zip(spec.objective_names, spec.directions)):
        try:
            fig = vis.plot_optimization_history(study, target=lambda t, i=i: float(t.values[i]), target_name=name)
            fig.update_layout(title=f"Optimisation history: {name} ({direction})")
            out.append(dcc.Graph(figure=fig, id=f"tune-history-{i}"))
        except (ValueError, RuntimeError) as e:
            out.append(html.P(f"history of {name}: not available ({e})", className="help"))
        try:
            fig, notes = importance_figure(study, i, name, direction)
            out.append(dcc.Graph(figure=fig, id=f"tune-importance-{i}"))
            out += [html.P(f"note from Optuna: {n}", className="help") for n in notes]
        except (ValueError, RuntimeError, ZeroDivisionError) as e:
            out.append(html.P(f"importances for {name}: not available ({e})", className="help"))
    return out


def _trials_table(study: optuna.Study, spec: TuneSpec) -> html.Table:
    """Complete trials with values, feasibility and a link into the what-if page."""
    feas = {t.number for t in feasible_trials(study)}
    front = {t.number for t in pareto_trials([t for t in feasible_trials(study)], spec.directions)} if feas else set()
    head = ["trial", "params", *spec.objective_names, "feasible", ""]
    rows = []
    for t in study.get_trials(deepcopy=False):
        if t.state.name != "COMPLETE" or not t.values:
            continue
        link = dcc.Link("open in what-if", href="/" + trial_query(spec, t), id=f"trial-link-{t.number}")
        mark = "front" if t.number in front else ("yes" if t.number in feas else "no")
        rows.append(html.Tr([html.Td(t.number), html.Td(json.dumps(t.params)),
                             *[html.Td(f"{v:.4g}", **{"data-value": repr(float(v))}) for v in t.values],
                             html.Td(mark), html.Td(link)]))
    return html.Table(className="kpis", children=[html.Thead(html.Tr([html.Th(h) for h in head])), html.Tbody(rows)])


def tuning_body(url: str, name: str | None) -> tuple[list[Any], list[dict[str, Any]], str]:
    """The page's body for a study: front, history, importances, trials.

    Args:
        url: storage URL.
        name: study name.

    Returns:
        ``(children, export trial options, the study's name)``.

    Raises:
        ConfigError: see :func:`open_tune_study`.
    """
    study, spec, _ = open_tune_study(url, name)
    n_complete = sum(t.state.name == "COMPLETE" for t in study.get_trials(deepcopy=False))
    if not n_complete:
        return [html.P(f"study {study.study_name}: no complete trial yet")], [], study.study_name
    feas = feasible_trials(study)
    head = html.P(f"{study.study_name}: {n_complete} complete trials, {len(feas)} feasible; objectives "
                  f"{', '.join(f'{d} {m}' for m, d in zip(spec.objective_names, spec.directions))}; constraints "
                  f"{'; '.join(c.label for c in spec.constraints) or 'none'}; seeds {list(spec.seeds)}.")
    children = [head, dcc.Graph(id="tune-pareto", figure=_pareto_figure(study, spec)),
                _trials_table(study, spec), *_history_figures(study, spec)]
    options = [{"label": "best (feasible Pareto trial with the best " + spec.best_by + ")", "value": "best"}]
    options += [{"label": f"trial {t.number}", "value": str(t.number)} for t in study.get_trials(deepcopy=False)
                if t.state.name == "COMPLETE"]
    return children, options, study.study_name


def tuning_page(app_ctx: AppContext) -> html.Div:
    """The tuning page (its body loads from the source box).

    Args:
        app_ctx: the app (``study`` is the first source).

    Returns:
        The page.
    """
    return html.Div(className="page", children=[
        html.H2("Tuning study (Optuna)"),
        html.Div(className="field", children=[
            html.Label("study folder or storage URL", htmlFor="tune-source"),
            dcc.Input(id="tune-source", type="text", value=app_ctx.study, debounce=True, className="path"),
            dcc.Dropdown(id="tune-name", placeholder="study", clearable=False)]),
        html.Div(id="tune-error", className="error"),
        html.Div(id="tune-status", className="status"),
        html.Div(className="export", children=[
            html.Label("export", htmlFor="export-format"),
            dcc.Dropdown(id="export-format", options=list(FORMATS), value="vllm", clearable=False),
            dcc.Dropdown(id="export-trial", options=[{"label": "best", "value": "best"}], value="best",
                         clearable=False),
            html.Button("Download export", id="export-run"), html.Span(id="export-status", className="status"),
            dcc.Download(id="export-download")]),
        html.Div(id="tune-body"),
    ])


def export_file(url: str, name: str, fmt: str, trial: str, out_dir: Path,
                warn: Callable[[str], None]) -> dict[str, Any]:
    """The export files of a trial, as a Dash download: what ``python -m memtp_sim export`` writes.

    Args:
        url: storage URL.
        name: study name.
        fmt: ``vllm``, ``sglang`` or ``memtp``.
        trial: ``best`` or a trial number.
        out_dir: results folder for the validation record (fresh-seed re-runs, when the trial
            has none yet).
        warn: receives the library's warning lines (a trial that fails a constraint).

    Returns:
        ``dcc.send_bytes``-style dict: the one file, or a zip of the SGLang flags and SPS table.
    """
    with tempfile.TemporaryDirectory(prefix="memtp-export-") as tmp:
        suffix = {"vllm": ".vllm.json", "sglang": ".sglang.args", "memtp": ".memtp.yaml"}[fmt]
        target = Path(tmp) / f"{name}-{'best' if trial == 'best' else 'trial' + trial}{suffix}"
        written = export_config(study_name=name, fmt=fmt, storage_url=url, trial=trial, output=target,
                                out_dir=out_dir, warn=warn)
        if len(written) == 1:
            return dcc.send_bytes(written[0].read_bytes(), written[0].name)
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as z:
            for p in written:
                z.write(p, p.name)
        return dcc.send_bytes(buf.getvalue(), target.name + ".zip")


def register_tuning(app: Dash, app_ctx: AppContext) -> None:
    """Register the tuning page's callbacks.

    Args:
        app: the Dash app.
        app_ctx: the app's shared state.
    """

    @app.callback(Output("tune-name", "options"), Output("tune-name", "value"), Output("tune-error", "children"),
                  Input("tune-source", "value"))
    def list_studies(source: str) -> tuple:
        """The studies in the source's storage; the folder's own name first choice."""
        try:
            url = storage_url_of(str(source or ""))
            _, _, names = open_tune_study(url, None)
        except MemtpSimError as e:
            return [], None, str(e)
        folder = Path(str(source)).name
        return names, folder if folder in names else names[0], ""

    @app.callback(Output("tune-body", "children"), Output("export-trial", "options"),
                  Output("tune-error", "children", allow_duplicate=True), Input("tune-name", "value"),
                  State("tune-source", "value"), background=True, manager=app_ctx.manager, interval=300,
                  running=[(Output("tune-status", "children"), "loading the study ...", "")],
                  prevent_initial_call=True)
    def show_study(name: str | None, source: str) -> tuple:
        """Front, history, importances and trials of the picked study (a background job)."""
        if not name:
            raise PreventUpdate
        app_ctx.job_started()
        try:
            children, options, _ = tuning_body(storage_url_of(source), name)
        except MemtpSimError as e:
            return [], [{"label": "best", "value": "best"}], str(e)
        return children, options, ""

    @app.callback(Output("url", "pathname", allow_duplicate=True), Output("url", "search", allow_duplicate=True),
                  Input("tune-pareto", "clickData"), State("tune-source", "value"), State("tune-name", "value"),
                  prevent_initial_call=True)
    def open_trial(click: dict | None, source: str, name: str) -> tuple:
        """A click on the Pareto front opens that trial in the what-if page."""
        if not click or not click.get("points"):
            raise PreventUpdate
        number = int(click["points"][0]["customdata"])
        study, spec, _ = open_tune_study(storage_url_of(source), name)
        trial = next(t for t in study.get_trials(deepcopy=False) if t.number == number)
        return "/", trial_query(spec, trial)

    @app.callback(Output("export-download", "data"), Output("export-status", "children"),
                  Input("export-run", "n_clicks"), State("tune-source", "value"), State("tune-name", "value"),
                  State("export-format", "value"), State("export-trial", "value"), background=True,
                  manager=app_ctx.manager, interval=300, prevent_initial_call=True,
                  running=[(Output("export-run", "disabled"), True, False)])
    def export(_n: Any, source: str, name: str | None, fmt: str, trial: str) -> tuple:
        """The export files of the picked trial, as a download (a background job)."""
        app_ctx.job_started()
        if not name:
            return no_update, "open a study first"
        notes: list[str] = []
        try:
            url = storage_url_of(source)
            out = _results_of(source, app_ctx.results)
            data = export_file(url, name, fmt, trial, out, notes.append)
        except MemtpSimError as e:
            return no_update, str(e)
        return data, f"exported {data['filename']}" + (f"; warning: {'; '.join(notes)}" if notes else "")

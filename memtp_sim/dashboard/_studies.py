"""The study page: a finished study folder (``results/<study>``) with its report's figures, live.

Read with :func:`memtp_sim.report.load_results`; every section is the report's own aggregation
(:mod:`memtp_sim.report.numbers`) drawn by its own drawer (:mod:`memtp_sim.report.figures`), as
interactive Plotly graphs: per facet the frontier, load curves and latency distributions; the
reliability of the confidence; the MEMTP timeline and load phases; the hardware profile's SPS(B);
the headline table. Loading a large study takes a few seconds, so it runs as a background job.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
from dash import Dash, Input, Output, dcc, html

from ..errors import MemtpSimError
from ..report import StudyResults, load_results, numbers
from ..report import figures as rfig
from ._context import AppContext

__all__ = ["find_studies", "register_studies", "study_body", "study_page"]


def find_studies(results: Path) -> list[str]:
    """Study folders under ``results`` (those holding a ``study.json``), sorted.

    Args:
        results: the results folder.

    Returns:
        Folder paths as text.
    """
    if not results.is_dir():
        return []
    return sorted(str(p.parent) for p in results.glob("*/study.json"))


def _table(df: pd.DataFrame, table_id: str) -> html.Table:
    """A plain HTML table of a frame (numbers with four significant digits)."""
    def cell(v: Any) -> str:
        """A table cell's text."""
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    return html.Table(id=table_id, className="kpis", children=[
        html.Thead(html.Tr([html.Th(str(c)) for c in df.columns])),
        html.Tbody([html.Tr([html.Td(cell(v)) for v in row]) for row in df.itertuples(index=False)])])


def _facet_graphs(res: StudyResults, colors: dict[str, str]) -> list[Any]:
    out: list[Any] = []
    x = res.x_key
    for i, (title, sub) in enumerate(numbers.facets(res)):
        suffix = f" ({title})" if title else ""
        if title:
            out.append(html.H3(title))
        out.append(dcc.Graph(id=f"study-frontier-{i}",
                             figure=rfig.frontier_figure(numbers.frontier_points(sub, x), x, colors, suffix)))
        if x:
            out.append(dcc.Graph(figure=rfig.load_figure(numbers.load_curves(sub, x), x, colors, suffix)))
        out.append(dcc.Graph(figure=rfig.latency_figure(numbers.latency_samples(res, sub, x), x, colors, suffix)))
    return out


def _extra_sections(res: StudyResults) -> list[Any]:
    """Calibration, MEMTP timeline and phases, the profile's SPS(B)."""
    out: list[Any] = []
    rel = numbers.reliability_curves(res)
    if rel is not None:
        out += [html.H3("Confidence calibration"), dcc.Graph(figure=rfig.reliability_figure(rel))]
    cal = numbers.calibration_table(res)
    if cal is not None:
        out.append(_table(cal, "study-calibration"))
    if res.uses_memtp:
        tl = numbers.timeline(res)
        if tl is not None:
            out += [html.H3("MEMTP: depth, memory and coherence over time"),
                    dcc.Graph(figure=rfig.timeline_figure(tl))]
        ph = numbers.phase_table(res)
        if ph is not None:
            out += [html.Ul([html.Li(n) for n in numbers.phase_notes(ph, res.x_key)]), _table(ph, "study-phases")]
    sps = numbers.sps_curve(res)
    if sps is not None:
        out += [html.H3("Hardware profile"), dcc.Graph(figure=rfig.sps_figure(sps))]
    return out


def study_body(root: str | Path) -> list[Any]:
    """The page's body for one finished study.

    Args:
        root: the study folder.

    Returns:
        Dash components: overview, missing runs, which policy wins where, DSpark's losses, figures,
        the headline table.

    Raises:
        ConfigError: not a study folder, or no run has a result.
    """
    res = load_results(root)
    colors = rfig.color_map(res.policies)
    head = [html.H2(f"Study {res.meta.get('name', Path(root).name)}"),
            html.P(f"{len(res.table)} runs; sweep {', '.join(res.sweep_keys) or '(none)'}; policies "
                   f"{', '.join(res.policies)}; seeds {sorted(set(res.table['seed']))}.")]
    if res.meta.get("description"):
        head.append(html.P(res.meta["description"], className="help"))
    if res.missing:
        head.append(html.P(f"{len(res.missing)} of the study's {res.num_planned} runs have no verified result "
                           "(failed, not run yet, or damaged): run the study again to retry them.", className="error"))
    notes = [html.H3("Which policy wins where"), html.Ul([html.Li(n) for n in numbers.winners_notes(res)])]
    losses = numbers.dspark_losses(res)
    if losses:
        notes += [html.H3("Where DSpark loses to a static policy"), html.Ul([html.Li(n) for n in losses])]
    return [*head, *notes, *_facet_graphs(res, colors), *_extra_sections(res), html.H3("Headline results"),
            _table(numbers.headline_table(res), "study-headline")]


def study_page(app_ctx: AppContext) -> html.Div:
    """The study page: pick a study under ``--results`` or type a folder.

    Args:
        app_ctx: the app.

    Returns:
        The page.
    """
    found = find_studies(app_ctx.results)
    return html.Div(className="page", children=[
        html.H2("Finished study"),
        html.Div(className="field", children=[
            html.Label(f"studies under {app_ctx.results}", htmlFor="study-pick"),
            dcc.Dropdown(id="study-pick", options=found, value=found[0] if found else None,
                         placeholder="no study found: run `python -m memtp_sim run studies/load.yaml`"),
            dcc.Input(id="study-path", type="text", debounce=True, placeholder="or a study folder path",
                      className="path")]),
        html.Div(id="study-status", className="status"),
        html.Div(id="study-error", className="error"),
        html.Div(id="study-body"),
    ])


def register_studies(app: Dash, app_ctx: AppContext) -> None:
    """Register the study page's callbacks (loading runs as a background job).

    Args:
        app: the Dash app.
        app_ctx: the app's shared state.
    """

    @app.callback(Output("study-body", "children"), Output("study-error", "children"),
                  Input("study-pick", "value"), Input("study-path", "value"), background=True,
                  manager=app_ctx.manager, interval=300,
                  running=[(Output("study-status", "children"), "loading the study ...", "")])
    def show(pick: str | None, path: str | None) -> tuple:
        """Load the picked (or typed) study folder and draw it (a background job)."""
        app_ctx.job_started()
        root = path or pick
        if not root:
            return [], ""
        try:
            return study_body(root), ""
        except (MemtpSimError, OSError, KeyError, ValueError) as e:
            return [], f"{root}: {e}" if str(root) not in str(e) else str(e)

"""The what-if page's figures: the report's numbers and drawers over the page's runs.

Every figure comes from :mod:`memtp_sim.report.numbers` (the aggregation) and
:mod:`memtp_sim.report.figures` (the drawer), over a :class:`~memtp_sim.report.StudyResults` whose
``policy`` column holds the side (``current``, ``baseline``); this module only picks the runs,
adds the batch sizes the policy chose to the SPS(B) figure, and labels.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import plotly.graph_objects as go

from ..report import StudyResults, numbers
from ..report import figures as rfig

__all__ = ["SIDE_COLORS", "empty_figure", "latency", "sps_with_batches", "sweep_figures", "timeline"]

#: Current first, baseline second (the report's palette).
SIDE_COLORS = {"current": rfig.COLORS[0], "baseline": rfig.COLORS[1]}


def empty_figure(text: str) -> go.Figure:
    """A blank figure that says why it is blank.

    Args:
        text: the message.

    Returns:
        The figure.
    """
    fig = go.Figure()
    fig.add_annotation(text=text, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
    fig.update_layout(xaxis={"visible": False}, yaxis={"visible": False}, height=220)
    return fig


def _side(res: StudyResults, label: str) -> StudyResults:
    """The runs of one side as a study of their own."""
    table = res.table[res.table["policy"] == label]
    keep = set(table["run_id"])
    return StudyResults(res.root, res.meta, table.reset_index(drop=True),
                        {k: v for k, v in res.summaries.items() if k in keep})


def _colors(res: StudyResults) -> dict[str, str]:
    return {p: SIDE_COLORS.get(p, rfig.COLORS[2]) for p in res.policies}


def latency(res: StudyResults) -> go.Figure:
    """TTFT, TPOT and end-to-end latency per side (the report's latency figure, lowest seed).

    Args:
        res: the sides' runs (:meth:`~memtp_sim.dashboard._runs.RunStore.results`).

    Returns:
        The figure.
    """
    return rfig.latency_figure(numbers.latency_samples(res, res.table, None), None, _colors(res))


def _chosen_batches(res: StudyResults) -> pd.Series:
    """Share of rounds at each verify-pass size B over a side's runs (all seeds)."""
    counts: pd.Series | None = None
    for rid in res.table["run_id"]:
        f = res.run_file(rid, "rounds.parquet")
        if not f.is_file():
            continue
        c = pd.read_parquet(f, columns=["batch_tokens"])["batch_tokens"].value_counts()
        counts = c if counts is None else counts.add(c, fill_value=0)
    if counts is None or counts.sum() <= 0:
        return pd.Series(dtype=float)
    return (counts / counts.sum()).sort_index()


def sps_with_batches(res: StudyResults) -> go.Figure:
    """The profile's measured SPS(B) (the report's figure) with the pass sizes each side's
    policy actually chose marked on the lookup rule, marker area by share of rounds.

    Args:
        res: the sides' runs.

    Returns:
        The figure (pass time and B x SPS(B) panels).
    """
    first = _side(res, res.policies[0])
    curve = numbers.sps_curve(first)
    if curve is None:
        return empty_figure("no run yet")
    fig = rfig.sps_figure(curve)
    for label in res.policies:
        side = _side(res, label)
        own = numbers.sps_curve(side)
        if own is None:
            continue
        if own.name != curve.name:  # another profile: draw its measured points too
            fig.add_trace(go.Scatter(x=own.measured["batch_tokens"], y=own.measured["pass_ms"], mode="markers",
                                     name=f"{label} profile {own.name}", marker={"symbol": "x", "size": 8}),
                          row=1, col=1)
        share = _chosen_batches(side)
        if share.empty:
            continue
        at = own.rule.set_index("batch_tokens").reindex(share.index.astype(int))
        text = [f"B={b}: {s:.1%} of rounds" for b, s in share.items()]
        marker = {"color": SIDE_COLORS.get(label, rfig.COLORS[2]), "size": (6 + 40 * share.to_numpy() ** 0.5),
                  "opacity": 0.6, "line": {"width": 1, "color": "#333"}}
        for col, y in ((1, "pass_ms"), (2, "verify_tok_per_s")):
            fig.add_trace(go.Scatter(x=share.index.astype(int), y=at[y], mode="markers", marker=marker, text=text,
                                     hovertemplate="%{text}<extra>" + label + "</extra>",
                                     name=f"{label}: B chosen (area = share of rounds)", legendgroup=f"B-{label}",
                                     showlegend=col == 1), row=1, col=col)
    fig.update_layout(title=f"Hardware profile {curve.name}: measured SPS(B) and the pass sizes the policy chose")
    return fig


def timeline(res: StudyResults) -> go.Figure | None:
    """The MEMTP timeline (depth, free memory, KV in use, coherence R, queue) of each side that
    runs the ensemble (lowest seed), in bins of about 1/60 of the run.

    Args:
        res: the sides' runs.

    Returns:
        The report's timeline figure, or None when no side runs MEMTP.
    """
    frames, phases, shown = [], None, None
    for label in res.policies:
        side = _side(res, label)
        if not side.uses_memtp or side.table.empty:
            continue
        span = max(float(s["metrics"].get("makespan_s", 60.0)) for s in side.summaries.values())
        tl = numbers.timeline(side, bin_s=_nice_bin(span / 60.0))
        if tl is None or tl.bins.empty:
            continue
        frames.append(tl.bins.assign(label=label))
        phases = tl.phases if phases is None else phases
        shown = tl
    if shown is None:
        return None
    merged = numbers.Timeline(pd.concat(frames, ignore_index=True), phases, ", ".join(res.policies), shown.seed,
                              shown.bin_s)
    return rfig.timeline_figure(merged)


def _nice_bin(seconds: float) -> float:
    """A round bin width (1, 2 or 5 times a power of ten) at least ``seconds``."""
    for step in (0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600):
        if step >= seconds:
            return float(step)
    return 600.0


def sweep_figures(res: StudyResults, x: str) -> dict[str, Any]:
    """The frontier (paper Fig. 7) and the load curves with the verify budget (Fig. 8) of the sides'
    load sweeps.

    Args:
        res: the sweeps' runs (``x`` holds each run's load level).
        x: the load axis.

    Returns:
        ``{"frontier": figure, "load": figure}``.
    """
    if res.table.empty:
        blank = empty_figure("run a load sweep to see the frontier")
        return {"frontier": blank, "load": blank}
    colors = _colors(res)
    table = res.table.sort_values([x, "seed"], kind="stable")
    return {"frontier": rfig.frontier_figure(numbers.frontier_points(table, x), x, colors, " (what-if load sweep)"),
            "load": rfig.load_figure(numbers.load_curves(table, x), x, colors, " (what-if)")}

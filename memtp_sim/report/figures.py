"""The study report's drawers: one Plotly figure per frame of :mod:`memtp_sim.report.numbers`.

Each function takes numbers already computed (no file reading, no aggregation) and returns a
``plotly.graph_objects.Figure``; the report page and a dashboard draw the same figures.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ._results import LOAD_AXES
from .numbers import TIMELINE_COLUMNS, LatencySamples, Reliability, SpsCurve, Timeline, is_numeric

__all__ = [
    "COLORS",
    "color_map",
    "frontier_figure",
    "latency_figure",
    "load_figure",
    "reliability_figure",
    "sps_figure",
    "timeline_figure",
]

COLORS = ["#636efa", "#ef553b", "#00cc96", "#ab63fa", "#ffa15a", "#19d3f3", "#ff6692", "#b6e880"]


def color_map(policies: list[str]) -> dict[str, str]:
    """One colour per policy label, in order (the palette repeats after eight).

    Args:
        policies: policy labels in the order they should be coloured.

    Returns:
        ``{label: "#rrggbb"}``.

    Source:
        :data:`COLORS` is the first eight colours of Plotly's default qualitative palette
        (``plotly.colors.qualitative.Plotly``).
    """
    return {p: COLORS[i % len(COLORS)] for i, p in enumerate(policies)}


def frontier_figure(points: pd.DataFrame, x: str | None, colors: dict[str, str], title: str = "") -> go.Figure:
    """Throughput vs per-user speed, one line per policy through the sweep (paper Fig. 7).

    Args:
        points: :func:`~memtp_sim.report.numbers.frontier_points`.
        x: the sweep-axis column of ``points`` (hover text), or None.
        colors: policy -> colour (every policy of ``points``).
        title: appended to the figure title (e.g. ``" (engine.prefill = colocated)"``).

    Returns:
        The figure; error bars are the standard deviation over seeds.

    Raises:
        KeyError: a policy has no colour.

    Source:
        DSpark paper (Cheng et al. 2026) section 5.4 (throughput against tok/s/user).
    """
    fig = go.Figure()
    for pol, d in points.groupby("policy", sort=False):
        fig.add_trace(go.Scatter(
            x=d["tok_per_s_user_p50_mean"], y=d["throughput_tok_per_s_mean"], mode="lines+markers", name=pol,
            line={"color": colors[pol]},
            error_x={"type": "data", "array": d["tok_per_s_user_p50_sd"], "visible": True},
            error_y={"type": "data", "array": d["throughput_tok_per_s_sd"], "visible": True},
            text=[f"{x}={v}" for v in d[x]] if x else None,
            hovertemplate="%{text}<br>tok/s/user p50 %{x:.1f}<br>throughput %{y:.1f} tok/s<extra>" + pol + "</extra>",
        ))
    fig.update_layout(title=f"Throughput vs per-user speed (paper Fig. 7 frontier){title}",
                      xaxis_title="tok/s/user (p50)", yaxis_title="throughput (tok/s)", height=460)
    return fig


def load_figure(curves: pd.DataFrame, x: str, colors: dict[str, str], title: str = "") -> go.Figure:
    """Throughput, verify budget (incl. bonus token) and per-user speed against the sweep axis
    (paper Fig. 8); a numeric axis is drawn log-scaled with a tick at every setting.

    Args:
        curves: :func:`~memtp_sim.report.numbers.load_curves`.
        x: the sweep-axis column.
        colors: policy -> colour.
        title: appended to the figure title.

    Returns:
        The figure (three panels side by side); error bars are the standard deviation over seeds.

    Raises:
        KeyError: a policy has no colour.

    Source:
        DSpark paper (Cheng et al. 2026) Fig. 8 (verify budget per request against concurrency).
    """
    fig = make_subplots(rows=1, cols=3, subplot_titles=(
        "throughput (tok/s)", "mean verify budget per request (tokens, incl. bonus)", "tok/s/user (p50)"))
    numeric = is_numeric(curves[x])
    for pol, d in curves.groupby("policy", sort=False):
        for col, m in enumerate(("throughput_tok_per_s", "verify_budget", "tok_per_s_user_p50"), start=1):
            fig.add_trace(go.Scatter(
                x=d[x], y=d[f"{m}_mean"], mode="lines+markers", name=pol, legendgroup=pol,
                showlegend=col == 1, line={"color": colors[pol]},
                error_y={"type": "data", "array": d[f"{m}_sd"], "visible": True}), row=1, col=col)
    for col in (1, 2, 3):
        if numeric:
            ticks = sorted(pd.to_numeric(curves[x]).unique())
            fig.update_xaxes(title_text=x, type="log", tickvals=ticks, ticktext=[f"{t:g}" for t in ticks],
                             row=1, col=col)
        else:
            fig.update_xaxes(title_text=x, type="category", row=1, col=col)
    name = "Load sweep (paper Fig. 8)" if x in LOAD_AXES else f"Sweep over {x}"
    fig.update_layout(title=f"{name}{title}", height=430)
    return fig


def latency_figure(lat: LatencySamples, x: str | None, colors: dict[str, str], title: str = "") -> go.Figure:
    """Box plots of TTFT, TPOT and end-to-end latency per policy, grouped by sweep setting (log axes).

    Args:
        lat: :func:`~memtp_sim.report.numbers.latency_samples`.
        x: the sweep-axis name (axis title; categories are ``lat.samples["x_value"]``), or None.
        colors: policy -> colour; policies are drawn in this order, those without samples skipped.
        title: appended to the figure title.

    Returns:
        The figure (three panels side by side): TTFT (s), TPOT (ms), end-to-end (s).

    Source:
        Metric definitions in :mod:`memtp_sim.metrics`; Plotly ``go.Box`` (quartiles, whiskers).
    """
    s = lat.samples
    fig = make_subplots(rows=1, cols=3, subplot_titles=("TTFT (s)", "TPOT (ms)", "end-to-end latency (s)"))
    for pol, color in colors.items():
        d = s[s["policy"] == pol]
        if d.empty:
            continue
        for col, c in enumerate(("ttft_s", "tpot_ms", "e2e_s"), start=1):
            fig.add_trace(go.Box(x=d["x_value"].to_numpy(), y=d[c].to_numpy(), name=pol, legendgroup=pol,
                                 showlegend=col == 1, marker_color=color, boxpoints=False), row=1, col=col)
    fig.update_layout(boxmode="group", title=f"Latency distributions, seed {lat.seed}{title}", height=430)
    for col in (1, 2, 3):
        fig.update_yaxes(type="log", row=1, col=col)
        if x:
            fig.update_xaxes(title_text=x, type="category", row=1, col=col)
    return fig


def reliability_figure(rel: Reliability) -> go.Figure:
    """Reliability diagrams of the cumulative confidence a_k, one panel per position with data:
    the raw head dotted (grey), each variant's confidence as the policy used it solid.

    Args:
        rel: :func:`~memtp_sim.report.numbers.reliability_curves`.

    Returns:
        The figure; the diagonal marks perfect calibration.

    Source:
        Reliability diagram (DeGroot and Fienberg 1983), per position as in DSpark paper
        (Cheng et al. 2026) Fig. 6.
    """
    positions = rel.positions
    labels = list(dict.fromkeys(rel.picks["label"]))
    fig = make_subplots(rows=1, cols=len(positions), subplot_titles=[f"position {k}" for k in positions])
    for col, k in enumerate(positions, start=1):
        at_k = rel.curves[rel.curves["position"] == k]
        for (label, kind), c in at_k.groupby(["label", "kind"], sort=False):
            name = "raw head" if kind == "raw" else f"{label} (as used)"
            color = "#444" if kind == "raw" else COLORS[labels.index(label) % len(COLORS)]
            fig.add_trace(go.Scatter(
                x=c["mean_prob"].tolist(), y=c["frac_positive"].tolist(), mode="lines+markers", name=name,
                legendgroup=name, showlegend=col == 1,
                line={"dash": "dot" if kind == "raw" else "solid", "color": color}), row=1, col=col)
        fig.add_trace(go.Scatter(x=[0, 1], y=[0, 1], mode="lines", line={"color": "#bbb", "width": 1},
                                 showlegend=False, hoverinfo="skip"), row=1, col=col)
        fig.update_xaxes(title_text="confidence a_k", range=[0, 1], row=1, col=col)
        fig.update_yaxes(range=[0, 1], row=1, col=col)
    fig.update_yaxes(title_text="fraction accepted", row=1, col=1)
    fig.update_layout(title="Reliability of the cumulative confidence (diagonal = calibrated)", height=380)
    return fig


def timeline_figure(tl: Timeline) -> go.Figure:
    """Depth, free memory, KV in use, coherence R and queue over simulated time (five stacked
    panels sharing the time axis), with the load ramp's phases shaded.

    Args:
        tl: :func:`~memtp_sim.report.numbers.timeline`.

    Returns:
        The figure; one colour per line label (sweep setting).

    Source:
        docs/model.md section 2 (depth, memory and coherence R of the MEMTP ensemble).
    """
    fig = make_subplots(rows=5, cols=1, shared_xaxes=True, vertical_spacing=0.03, subplot_titles=(
        "ensemble depth (heads = draft length)", "memory free for heads / KV (GiB)", "KV cache in use (GiB)",
        "coherence R (EWMA of accepted / verified draft tokens)", "requests waiting for admission"))
    for i, (label, d) in enumerate(tl.bins.groupby("label", sort=False)):
        for k, c in enumerate(TIMELINE_COLUMNS, start=1):
            fig.add_trace(go.Scatter(x=d["bin_start_s"], y=d[c], mode="lines", name=label, legendgroup=label,
                                     showlegend=k == 1, line={"color": COLORS[i % len(COLORS)]}), row=k, col=1)
    for _, p in tl.phases.iterrows():
        rate = p["rate_per_s"]
        fig.add_vrect(x0=p["start_s"], x1=p["end_s"], fillcolor="#888" if rate > 0 else "#fff",
                      opacity=min(0.25, 0.05 + rate), line_width=0, annotation_text=f"{rate:g} req/s",
                      annotation_position="top left", row=1, col=1)
    fig.update_xaxes(title_text="simulated time (s)", row=5, col=1)
    fig.update_layout(title=f"Timeline ({tl.policy}, seed {tl.seed}; {tl.bin_s:g} s bins, time-weighted)",
                      height=1100)
    return fig


def sps_figure(sps: SpsCurve) -> go.Figure:
    """The profile's measured pass time and verify tokens per second B x SPS(B) against B (log
    axes), with the simulator's lookup rule between measured points.

    Args:
        sps: :func:`~memtp_sim.report.numbers.sps_curve`.

    Returns:
        The figure (two panels side by side): pass time (ms) and B x SPS(B) (tok/s) against B
        (tokens).

    Source:
        docs/model.md section 1 step 4 (SPS(B) is measured and jagged); the ``linear_pass_time``
        lookup rule of :mod:`memtp_sim.hardware.cost`.
    """
    m, r = sps.measured, sps.rule
    fig = make_subplots(rows=1, cols=2, subplot_titles=("pass time (ms) vs B", "SPS(B) x B: verify tokens per second"))
    fig.add_trace(go.Scatter(x=r["batch_tokens"], y=r["pass_ms"], mode="lines", name="lookup rule (linear in pass time)",
                             line={"color": "#999"}), row=1, col=1)
    fig.add_trace(go.Scatter(x=m["batch_tokens"], y=m["pass_ms"], mode="markers", name="measured",
                             marker={"size": 9, "color": "#ef553b"}), row=1, col=1)
    fig.add_trace(go.Scatter(x=r["batch_tokens"], y=r["verify_tok_per_s"], mode="lines", name="B x SPS(B), rule",
                             line={"color": "#999"}, showlegend=False), row=1, col=2)
    fig.add_trace(go.Scatter(x=m["batch_tokens"], y=m["verify_tok_per_s"], mode="markers",
                             name="B x SPS(B), measured", marker={"size": 9, "color": "#ef553b"}, showlegend=False),
                  row=1, col=2)
    for col in (1, 2):
        fig.update_xaxes(type="log", title_text="tokens in the pass (B)", row=1, col=col)
    fig.update_yaxes(type="log", row=1, col=1)
    fig.update_layout(title=f"Hardware profile {sps.name}: measured SPS(B)", height=400)
    return fig

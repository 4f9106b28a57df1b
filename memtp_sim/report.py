"""Study report: numbers first (pandas), then Plotly figures and one self-contained HTML page.

Figures (one set per combination of the sweep keys other than the load axis):

1. Throughput vs tok/s/user per policy across the load sweep (the DSpark paper's Fig. 7 frontier).
2. Throughput and mean verify budget vs load (Fig. 8; budget counts the bonus token, so MTP-1 is 2).
3. Latency distributions (TTFT, TPOT, end-to-end) per policy and load.
4. The hardware profile's measured SPS(B) with its lookup rule, and where early stop halted.

The page also lists, in words, every load point where DSpark loses to a static policy and why.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ._io import atomic_write_text

__all__ = ["StudyResults", "load_results", "aggregate", "write_report", "headline_table", "dspark_losses",
           "phase_table", "winners_notes"]

LOAD_AXES = ("workload.concurrency", "workload.rate_per_s", "workload.rate_scale")
HEADLINE = [
    ("throughput_tok_per_s", "throughput tok/s"),
    ("tok_per_s_user_p50", "tok/s/user p50"),
    ("tok_per_s_user_p10", "tok/s/user p10"),
    ("ttft_s_p50", "TTFT p50 s"),
    ("tpot_ms_p50", "TPOT p50 ms"),
    ("mean_verify_len", "verify len"),
    ("tau", "tau"),
    ("acceptance_rate", "accept rate"),
    ("num_rejected", "rejected"),
]
_COLORS = ["#636efa", "#ef553b", "#00cc96", "#ab63fa", "#ffa15a", "#19d3f3", "#ff6692", "#b6e880"]


@dataclass(frozen=True)
class StudyResults:
    """A finished study read back from disk."""

    root: Path
    meta: dict[str, Any]
    table: pd.DataFrame
    summaries: dict[str, dict[str, Any]]

    @property
    def sweep_keys(self) -> list[str]:
        return list(self.meta.get("sweep_keys", []))

    @property
    def x_key(self) -> str | None:
        if self.meta.get("report_x"):
            return str(self.meta["report_x"])
        for k in LOAD_AXES:
            if k in self.sweep_keys:
                return k
        return self.sweep_keys[0] if self.sweep_keys else None

    @property
    def facet_keys(self) -> list[str]:
        return [k for k in self.sweep_keys if k != self.x_key]


def load_results(root: str | Path) -> StudyResults:
    """Read runs.csv, study.json and every run's summary.json under a study folder."""
    root = Path(root)
    table = pd.read_csv(root / "runs.csv")
    meta = json.loads((root / "study.json").read_text())
    summaries = {}
    for rid in table["run_id"]:
        f = root / "runs" / rid / "summary.json"
        if f.is_file():
            summaries[rid] = json.loads(f.read_text())
    return StudyResults(root, meta, table, summaries)


def aggregate(table: pd.DataFrame, keys: list[str], metrics: list[str]) -> pd.DataFrame:
    """Mean, standard deviation and count over seeds for each combination of ``keys``, in the
    order the study lists them (its YAML order), not sorted."""
    g = table.groupby(keys, dropna=False, sort=False)[metrics]
    mean = g.mean().add_suffix("_mean")
    sd = g.std(ddof=1).fillna(0.0).add_suffix("_sd")
    out = pd.concat([mean, sd], axis=1)
    out["num_seeds"] = g.size()
    return out.reset_index()


def _facets(res: StudyResults) -> list[tuple[str, pd.DataFrame]]:
    keys = res.facet_keys
    if not keys:
        return [("", res.table)]
    out = []
    for vals, sub in res.table.groupby(keys, dropna=False, sort=False):
        vals = vals if isinstance(vals, tuple) else (vals,)
        out.append((", ".join(f"{k} = {v}" for k, v in zip(keys, vals)), sub))
    return out


MEMORY_HEADLINE = [
    ("queue_s_p90", "queue p90 s"),
    ("mean_depth", "mean depth"),
    ("mean_heads_gib", "heads GiB"),
    ("mean_kv_gib", "KV GiB mean"),
    ("peak_kv_gib", "KV GiB peak"),
]


def headline_table(res: StudyResults) -> pd.DataFrame:
    """Headline metrics, mean over seeds, per facet / load point / policy (plus queueing and
    memory use when the study runs the MEMTP ensemble)."""
    keys = res.facet_keys + ([res.x_key] if res.x_key else []) + ["policy"]
    cols_spec = HEADLINE + (MEMORY_HEADLINE if _uses_memtp(res) else [])
    agg = aggregate(res.table, keys, [m for m, _ in cols_spec])
    cols = keys + [f"{m}_mean" for m, _ in cols_spec]
    return agg[cols].rename(columns={f"{m}_mean": label for m, label in cols_spec})


def dspark_losses(res: StudyResults, *, margin: float = 0.02) -> list[str]:
    """Plain-words notes for every load point where a DSpark policy's throughput trails the best
    static policy (static/mtp1) by more than ``margin`` and more than the seed spread, with the
    measured reasons: how often early stop halted below a better batch (``early_stop_gap_frac``) and
    how much of the time went to drafting (``draft_time_frac``)."""
    x = res.x_key
    if x is None:
        return []
    keys = res.facet_keys + [x, "policy"]
    agg = aggregate(res.table, keys, ["throughput_tok_per_s", "early_stop_gap_frac", "mean_verify_len",
                                      "draft_time_frac"])
    groups = agg.groupby(res.facet_keys, dropna=False) if res.facet_keys else [((), agg)]
    notes = []
    for facet, sub in groups:
        facet = facet if isinstance(facet, tuple) else (facet,)
        where = "".join(f"{k} = {v}, " for k, v in zip(res.facet_keys, facet))
        for xv, pt in sub.groupby(x):
            ds = pt[pt["policy"].str.startswith("dspark")]
            st = pt[pt["policy"].str.startswith(("static", "mtp1"))]
            if ds.empty or st.empty:
                continue
            best = st.loc[st["throughput_tok_per_s_mean"].idxmax()]
            for _, d in ds.iterrows():
                gap = 1 - d["throughput_tok_per_s_mean"] / best["throughput_tok_per_s_mean"]
                noise = (d["throughput_tok_per_s_sd"] + best["throughput_tok_per_s_sd"]) / best["throughput_tok_per_s_mean"]
                if gap <= max(margin, noise):
                    continue
                reasons = []
                trapped = d["early_stop_gap_frac_mean"]
                if np.isfinite(trapped) and trapped > 0.05:
                    reasons.append(
                        f"in {trapped:.0%} of its rounds early stop halted although a global search over the "
                        "same candidates expected a higher token rate further on: the next candidate would "
                        "cross a jump in the measured SPS(B) (see the SPS figure), and Algorithm 1's lossless "
                        "rule stops at the first non-improvement (the paper's section 5.2 caveat; the "
                        "production variant's global search does not stop there)")
                extra_draft = d["draft_time_frac_mean"] - best["draft_time_frac_mean"]
                if extra_draft > 0.05:
                    reasons.append(
                        f"drafting takes {d['draft_time_frac_mean']:.0%} of its time against "
                        f"{best['draft_time_frac_mean']:.0%} for {best['policy']}: it drafts gamma tokens for "
                        "every request every round, and on this chip a drafter pass over R x gamma tokens is "
                        "a sizeable fraction of a verify pass")
                if not reasons:
                    reasons.append("its objective looks one round ahead only; neither early stop nor drafting "
                                   "time explains the gap here")
                notes.append(
                    f"{where}{x} = {xv}: {d['policy']} gives {d['throughput_tok_per_s_mean']:.1f} tok/s vs "
                    f"{best['policy']} {best['throughput_tok_per_s_mean']:.1f} tok/s ({gap:.1%} lower; mean "
                    f"verify length {d['mean_verify_len_mean']:.2f} vs {best['mean_verify_len_mean']:.2f}). "
                    + " ".join(("Also, " + r if i else r[0].upper() + r[1:]) + "." for i, r in enumerate(reasons))
                )
    return notes


def winners_notes(res: StudyResults, *, tie: float = 0.01) -> list[str]:
    """In plain words, per facet: which policy gives the highest throughput and which the highest
    median per-user speed along the sweep axis (mean over seeds). Neighbouring points with the same
    winner are merged; a lead under ``tie`` (1%) is called a near tie."""
    x = res.x_key
    keys = res.facet_keys + ([x] if x else []) + ["policy"]
    agg = aggregate(res.table, keys, ["throughput_tok_per_s", "tok_per_s_user_p50"])
    groups = agg.groupby(res.facet_keys, dropna=False, sort=False) if res.facet_keys else [((), agg)]
    notes = []
    for facet, sub in groups:
        facet = facet if isinstance(facet, tuple) else (facet,)
        where = ", ".join(f"{k} = {v}" for k, v in zip(res.facet_keys, facet))
        points = list(sub.groupby(x, sort=False)) if x else [("all", sub)]
        for metric, what in (("throughput_tok_per_s", "highest throughput"),
                             ("tok_per_s_user_p50", "fastest per user (p50)")):
            runs: list[dict[str, Any]] = []
            for xv, pt in points:
                ranked = pt.sort_values(f"{metric}_mean", ascending=False)
                best = ranked.iloc[0]
                second = ranked.iloc[1] if len(ranked) > 1 else None
                lead = best[f"{metric}_mean"] / second[f"{metric}_mean"] - 1 if second is not None else np.inf
                if runs and runs[-1]["policy"] == best["policy"]:
                    runs[-1]["xs"].append(xv)
                    if lead > runs[-1]["lead"]:
                        runs[-1].update(lead=lead, second=second["policy"] if second is not None else "")
                else:
                    runs.append({"xs": [xv], "policy": best["policy"], "lead": lead,
                                 "second": second["policy"] if second is not None else ""})
            parts = []
            for r in runs:
                span = (f"{x} {r['xs'][0]}" if len(r["xs"]) == 1 else f"{x} {r['xs'][0]}-{r['xs'][-1]}") if x else ""
                if r["lead"] < tie:
                    verdict = f"near tie, {r['policy']} and {r['second']} within {tie:.0%}"
                else:
                    verdict = f"{r['policy']}, up to {r['lead']:.0%} ahead of {r['second']}"
                parts.append(f"{span}: {verdict}" if span else verdict)
            notes.append(f"{where + ': ' if where else ''}{what}: " + "; ".join(parts) + ".")
    return notes


def _reliability_fig(res: StudyResults, positions: tuple[int, ...] = (1, 3, 5, 7)) -> go.Figure | None:
    """Reliability diagrams of the cumulative confidence a_k at a few positions: the raw head and
    what the policy saw after temperatures, one curve per variant (first DSpark-like run, seed 0)."""
    t = res.table
    cand = t[(t["seed"] == t["seed"].min()) & t["policy"].str.startswith(("dspark", "threshold", "goodput"))]
    if cand.empty:
        return None
    facet = "variant" if "variant" in t else None
    picks = cand.groupby(facet, sort=False).head(1) if facet else cand.head(1)
    fig = make_subplots(rows=1, cols=len(positions), subplot_titles=[f"position {k}" for k in positions])
    any_curve = False
    for i, (_, row) in enumerate(picks.iterrows()):
        cal = res.summaries.get(row["run_id"], {}).get("metrics", {}).get("calibration_by_position")
        if not cal:
            continue
        label = str(row[facet]) if facet else row["policy"]
        for col, k in enumerate(positions, start=1):
            for kind, dash in (("raw", "dot"), ("used", "solid")):
                c = cal["reliability"].get(f"{kind}_{k}")
                if c is None or (kind == "raw" and i > 0):
                    continue  # the raw head is the same in every variant: draw it once
                any_curve = True
                name = "raw head" if kind == "raw" else f"{label} (as used)"
                fig.add_trace(go.Scatter(
                    x=c["mean_prob"], y=c["frac_positive"], mode="lines+markers", name=name, legendgroup=name,
                    showlegend=col == 1, line={"dash": dash, "color": "#444" if kind == "raw" else _COLORS[i % 8]}),
                    row=1, col=col)
            fig.add_trace(go.Scatter(x=[0, 1], y=[0, 1], mode="lines", line={"color": "#bbb", "width": 1},
                                     showlegend=False, hoverinfo="skip"), row=1, col=col)
            fig.update_xaxes(title_text="confidence a_k", range=[0, 1], row=1, col=col)
            fig.update_yaxes(range=[0, 1], row=1, col=col)
    if not any_curve:
        return None
    fig.update_yaxes(title_text="fraction accepted", row=1, col=1)
    fig.update_layout(title="Reliability of the cumulative confidence (diagonal = calibrated)", height=380)
    return fig


def _calibration_table(res: StudyResults) -> pd.DataFrame | None:
    if "ece_mean" not in res.table:
        return None
    keys = res.facet_keys + ["policy"]
    agg = aggregate(res.table, keys, ["ece_raw_mean", "ece_mean", "auc_mean"])
    if agg["ece_mean_mean"].isna().all():
        return None
    return agg[keys + ["ece_raw_mean_mean", "ece_mean_mean", "auc_mean_mean"]].rename(columns={
        "ece_raw_mean_mean": "raw head ECE", "ece_mean_mean": "ECE as used", "auc_mean_mean": "AUC"})


def _color_map(policies: list[str]) -> dict[str, str]:
    return {p: _COLORS[i % len(_COLORS)] for i, p in enumerate(policies)}


def _frontier_fig(sub: pd.DataFrame, x: str | None, colors: dict[str, str], title: str) -> go.Figure:
    keys = ([x] if x else []) + ["policy"]
    agg = aggregate(sub, keys, ["throughput_tok_per_s", "tok_per_s_user_p50"])
    fig = go.Figure()
    for pol, d in agg.groupby("policy", sort=False):
        d = d.sort_values(x) if x and _numeric(d[x]) else d
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


def _load_fig(sub: pd.DataFrame, x: str, colors: dict[str, str], title: str) -> go.Figure:
    agg = aggregate(sub, [x, "policy"], ["throughput_tok_per_s", "mean_verify_len", "tok_per_s_user_p50"])
    fig = make_subplots(rows=1, cols=3, subplot_titles=(
        "throughput (tok/s)", "mean verify budget per request (tokens, incl. bonus)", "tok/s/user (p50)"))
    for pol, d in agg.groupby("policy", sort=False):
        d = d.sort_values(x) if _numeric(d[x]) else d
        for col, (m, add) in enumerate([("throughput_tok_per_s", 0.0), ("mean_verify_len", 1.0),
                                        ("tok_per_s_user_p50", 0.0)], start=1):
            fig.add_trace(go.Scatter(
                x=d[x], y=d[f"{m}_mean"] + add, mode="lines+markers", name=pol, legendgroup=pol,
                showlegend=col == 1, line={"color": colors[pol]},
                error_y={"type": "data", "array": d[f"{m}_sd"], "visible": True}), row=1, col=col)
            if _numeric(sub[x]):
                ticks = sorted(pd.to_numeric(sub[x]).unique())
                fig.update_xaxes(title_text=x, type="log", tickvals=ticks, ticktext=[f"{t:g}" for t in ticks],
                                 row=1, col=col)
            else:
                fig.update_xaxes(title_text=x, type="category", row=1, col=col)
    name = "Load sweep (paper Fig. 8)" if x in LOAD_AXES else f"Sweep over {x}"
    fig.update_layout(title=f"{name}{title}", height=430)
    return fig


def _numeric(col: pd.Series) -> bool:
    return bool(pd.to_numeric(col, errors="coerce").notna().all())


def _phases(summary: dict[str, Any]) -> list[tuple[float, float, float]]:
    """(start_s, end_s, rate_per_s) of a run's load-ramp segments, or [] without a ramp."""
    sched = (summary.get("scenario", {}).get("workload", {}) or {}).get("rate_schedule") or []
    out, t = [], 0.0
    for seg in sched:
        out.append((t, t + float(seg["duration_s"]), float(seg["rate_per_s"])))
        t += float(seg["duration_s"])
    return out


def _uses_memtp(res: StudyResults) -> bool:
    return any((s.get("scenario", {}).get("memtp", {}) or {}).get("depth") is not None for s in res.summaries.values())


def _timeline_fig(res: StudyResults, x: str | None, bin_s: float = 60.0) -> go.Figure | None:
    """Depth, free memory, KV in use, coherence R and queue over simulated time (seed 0, first policy)."""
    t = res.table
    first = t[(t["seed"] == t["seed"].min()) & (t["policy"] == t["policy"].iloc[0])]
    if first.empty:
        return None
    fig = make_subplots(rows=5, cols=1, shared_xaxes=True, vertical_spacing=0.03, subplot_titles=(
        "ensemble depth (heads = draft length)", "memory free for heads / KV (GiB)", "KV cache in use (GiB)",
        "coherence R (EWMA of accepted / verified draft tokens)", "requests waiting for admission"))
    for i, (_, row) in enumerate(first.iterrows()):
        f = res.root / "runs" / row["run_id"] / "rounds.parquet"
        if not f.is_file():
            continue
        r = pd.read_parquet(f, columns=["start_s", "duration_s", "depth", "free_gib", "kv_gib", "coherence",
                                        "num_waiting"])
        r["bin"] = (r["start_s"] // bin_s) * bin_s
        w = r["duration_s"]
        cols = ["depth", "free_gib", "kv_gib", "coherence", "num_waiting"]
        binned = (r[cols].mul(w, axis=0).groupby(r["bin"]).sum().div(w.groupby(r["bin"]).sum(), axis=0))
        label = f"{x} = {row[x]}" if x else row["policy"]
        color = _COLORS[i % len(_COLORS)]
        for k, c in enumerate(cols, start=1):
            fig.add_trace(go.Scatter(x=binned.index, y=binned[c], mode="lines", name=label, legendgroup=label,
                                     showlegend=k == 1, line={"color": color}), row=k, col=1)
    summ = res.summaries.get(first["run_id"].iloc[0], {})
    for start, end, rate in _phases(summ):
        fig.add_vrect(x0=start, x1=end, fillcolor="#888" if rate > 0 else "#fff", opacity=min(0.25, 0.05 + rate),
                      line_width=0, annotation_text=f"{rate:g} req/s", annotation_position="top left", row=1, col=1)
    fig.update_xaxes(title_text="simulated time (s)", row=5, col=1)
    fig.update_layout(title=f"Timeline ({t['policy'].iloc[0]}, seed {int(t['seed'].min())}; {bin_s:g} s bins, "
                      "time-weighted)", height=1100)
    return fig


def phase_notes(ph: pd.DataFrame, x: str | None) -> list[str]:
    """One sentence per (policy, phase): which setting of ``x`` gives the best median per-user speed,
    where the elastic setting stands, and who rejected requests."""
    if x is None or x not in ph:
        return []
    notes = []
    for (pol, phase), g in ph.groupby(["policy", "phase"], sort=True):
        best = g.loc[g["tok/s/user p50"].idxmax()]
        msg = f"{pol}, phase {phase}: fastest per user with {x} = {best[x]} ({best['tok/s/user p50']:.1f} tok/s/user p50)"
        el = g[g[x].astype(str) == "elastic"]
        if not el.empty and str(best[x]) != "elastic":
            e = el.iloc[0]
            msg += f"; elastic {e['tok/s/user p50']:.1f} at mean depth {e['mean depth']:.1f}"
        rej = g[g["rejected"] > 0]
        if not rej.empty:
            msg += "; rejected (KV cannot fit next to the heads): " + ", ".join(
                f"{x} = {r[x]}: {r['rejected']:g}" for _, r in rej.iterrows())
        notes.append(msg)
    return notes


def phase_table(res: StudyResults) -> pd.DataFrame | None:
    """Per load phase (by arrival time): requests, tok/s/user p50, TTFT p50, queue p90, rejected,
    time-weighted mean depth; mean over seeds, one row per run group and phase."""
    rows = []
    for _, run in res.table.iterrows():
        summ = res.summaries.get(run["run_id"])
        phases = _phases(summ or {})
        if not phases:
            return None
        d = res.root / "runs" / run["run_id"]
        rq = pd.read_csv(d / "requests.csv", usecols=["status", "arrival_at_s", "queue_s", "ttft_s",
                                                      "tok_per_s_user"])
        rd = pd.read_parquet(d / "rounds.parquet", columns=["start_s", "duration_s", "depth", "kv_gib"])
        for k, (start, end, rate) in enumerate(phases):
            sel = rq[(rq["arrival_at_s"] >= start) & (rq["arrival_at_s"] < end)]
            done = sel[sel["status"] == "finished"]
            rr = rd[(rd["start_s"] >= start) & (rd["start_s"] < end)]
            w = rr["duration_s"].sum()
            rows.append({
                **{key: run[key] for key in res.sweep_keys}, "policy": run["policy"], "seed": run["seed"],
                "phase": f"{k + 1}: {rate:g} req/s",
                "requests": len(sel), "rejected": int((sel["status"] == "rejected").sum()),
                "tok/s/user p50": done["tok_per_s_user"].median(),
                "TTFT p50 s": done["ttft_s"].median(),
                "queue p90 s": done["queue_s"].quantile(0.9),
                "mean depth": (rr["depth"] * rr["duration_s"]).sum() / w if w > 0 else np.nan,
                "peak KV GiB": rr["kv_gib"].max() if len(rr) else np.nan,
            })
    if not rows:
        return None
    df = pd.DataFrame(rows)
    keys = res.sweep_keys + ["policy", "phase"]
    return df.drop(columns="seed").groupby(keys, sort=False).mean(numeric_only=True).reset_index()


def _latency_fig(res: StudyResults, sub: pd.DataFrame, x: str | None, colors: dict[str, str], title: str) -> go.Figure:
    first_seed = sub[sub["seed"] == sub["seed"].min()]
    fig = make_subplots(rows=1, cols=3, subplot_titles=("TTFT (s)", "TPOT (ms)", "end-to-end latency (s)"))
    for pol in colors:
        rows = first_seed[first_seed["policy"] == pol]
        xs, ttft, tpot, e2e = [], [], [], []
        for _, row in rows.iterrows():
            f = res.root / "runs" / row["run_id"] / "requests.csv"
            if not f.is_file():
                continue
            rq = pd.read_csv(f, usecols=["status", "ttft_s", "e2e_s", "tok_per_s_user"])
            rq = rq[rq["status"] == "finished"]
            xv = str(row[x]) if x else pol
            xs += [xv] * len(rq)
            ttft += rq["ttft_s"].tolist()
            tpot += (1000.0 / rq["tok_per_s_user"]).tolist()
            e2e += rq["e2e_s"].tolist()
        if not xs:
            continue
        for col, ys in enumerate((ttft, tpot, e2e), start=1):
            fig.add_trace(go.Box(x=xs, y=ys, name=pol, legendgroup=pol, showlegend=col == 1,
                                 marker_color=colors[pol], boxpoints=False), row=1, col=col)
    fig.update_layout(boxmode="group", title=f"Latency distributions, seed {int(sub['seed'].min())}{title}", height=430)
    for col in (1, 2, 3):
        fig.update_yaxes(type="log", row=1, col=col)
        if x:
            fig.update_xaxes(title_text=x, type="category", row=1, col=col)
    return fig


def _sps_fig(res: StudyResults) -> go.Figure | None:
    summ = next(iter(res.summaries.values()), None)
    if summ is None:
        return None
    sps = summ["provenance"]["hardware"]["sps"]
    b = np.array(sps["batch_tokens"])
    t = np.array(sps["pass_ms"])
    dense = np.arange(b[0], b[-1] + 1)
    t_dense = np.interp(dense, b, t)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("pass time (ms) vs B", "SPS(B) x B: verify tokens per second"))
    fig.add_trace(go.Scatter(x=dense, y=t_dense, mode="lines", name="lookup rule (linear in pass time)",
                             line={"color": "#999"}), row=1, col=1)
    fig.add_trace(go.Scatter(x=b, y=t, mode="markers", name="measured", marker={"size": 9, "color": "#ef553b"}),
                  row=1, col=1)
    fig.add_trace(go.Scatter(x=dense, y=dense / t_dense * 1000, mode="lines", name="B x SPS(B), rule",
                             line={"color": "#999"}, showlegend=False), row=1, col=2)
    fig.add_trace(go.Scatter(x=b, y=b / t * 1000, mode="markers", name="B x SPS(B), measured",
                             marker={"size": 9, "color": "#ef553b"}, showlegend=False), row=1, col=2)
    for col in (1, 2):
        fig.update_xaxes(type="log", title_text="tokens in the pass (B)", row=1, col=col)
    fig.update_yaxes(type="log", row=1, col=1)
    fig.update_layout(title=f"Hardware profile {summ['provenance']['hardware']['name']}: measured SPS(B)", height=400)
    return fig


def _cliffs(res: StudyResults) -> list[str]:
    summ = next(iter(res.summaries.values()), None)
    if summ is None:
        return []
    sps = summ["provenance"]["hardware"]["sps"]
    b, t = np.array(sps["batch_tokens"]), np.array(sps["pass_ms"])
    out = []
    for i in range(1, b.size):
        # a cliff: tokens per second falls from one measured point to the next
        if b[i] / t[i] < b[i - 1] / t[i - 1] * 0.95:
            out.append(f"B={b[i-1]} to {b[i]}: pass time {t[i-1]:.1f} to {t[i]:.1f} ms "
                       f"({b[i-1] / t[i-1] * 1000:.0f} to {b[i] / t[i] * 1000:.0f} verify tok/s)")
        elif t[i] / t[i - 1] > 1.6:
            out.append(f"B={b[i-1]} to {b[i]}: pass time jumps {t[i-1]:.1f} to {t[i]:.1f} ms "
                       f"(x{t[i] / t[i-1]:.2f})")
    return out


def _table_html(df: pd.DataFrame) -> str:
    return df.to_html(index=False, float_format=lambda v: f"{v:,.2f}", border=0, classes="tbl", na_rep="-")


def write_report(root: str | Path) -> Path:
    """Build ``report.html`` for the study in ``root`` (atomically) and return its path."""
    res = load_results(root)
    x = res.x_key
    policies = list(dict.fromkeys(res.table["policy"]))
    colors = _color_map(policies)
    parts: list[str] = []
    first_plot = True

    def fig_html(fig: go.Figure) -> str:
        nonlocal first_plot
        out = fig.to_html(full_html=False, include_plotlyjs=first_plot, config={"displaylogo": False})
        first_plot = False
        return out

    meta = res.meta
    summ = next(iter(res.summaries.values()), {})
    hw = summ.get("provenance", {}).get("hardware", {})
    acc = summ.get("provenance", {}).get("acceptance", {})
    parts.append(f"<h1>memtp_sim study: {html.escape(meta['name'])}</h1>")
    if meta.get("description"):
        parts.append(f"<p>{html.escape(meta['description'])}</p>")
    parts.append(
        f"<p><b>{len(res.table)} runs</b>: sweep {html.escape(', '.join(res.sweep_keys) or '(none)')}; "
        f"policies {html.escape(', '.join(policies))}; seeds {sorted(set(res.table['seed']))}. "
        f"memtp_sim {html.escape(str(summ.get('memtp_sim_version', '?')))}.</p>"
    )
    parts.append("<h2>How to read this report</h2><ul>"
                 "<li><b>throughput</b>: output tokens per second of the GPU while load is offered; "
                 "<b>tok/s/user</b>: decode speed one user sees, (output tokens - 1) / (finish - first token).</li>"
                 "<li>Up and to the right is better on the frontier plot; each point is one load level "
                 "(mean over seeds, bars = standard deviation).</li>"
                 "<li><b>verify budget</b> = draft tokens verified per request per round + 1 bonus token "
                 "(MTP-1 is always 2; no speculation is 1).</li>"
                 "<li>TTFT includes queueing and prefill; TPOT = 1000 / tok/s/user.</li></ul>")

    parts.append("<h2>Which policy wins where</h2><ul>" +
                 "".join(f"<li>{html.escape(n)}</li>" for n in winners_notes(res)) + "</ul>")
    losses = dspark_losses(res)
    cliffs = _cliffs(res)
    parts.append("<h2>Where DSpark loses to a static policy, and why</h2><p>Listed where a DSpark policy's "
                 "throughput trails the best static policy (static k or MTP-1) by more than 2% and by more than "
                 "the spread between seeds; smaller gaps are within noise and not listed.</p>")
    if losses:
        parts.append("<ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in losses) + "</ul>")
    else:
        parts.append("<p>Nowhere in this study: at every load point a DSpark policy's throughput is within "
                     "2% (or the seed spread) of the best static policy, or ahead of it.</p>")
    if cliffs:
        parts.append("<p>Measured cliffs in this profile's SPS(B): " + html.escape("; ".join(cliffs)) + ".</p>")

    for title, sub in _facets(res):
        suffix = f" ({title})" if title else ""
        if title:
            parts.append(f"<h2>{html.escape(title)}</h2>")
        parts.append(fig_html(_frontier_fig(sub, x, colors, suffix)))
        if x:
            parts.append(fig_html(_load_fig(sub, x, colors, suffix)))
        parts.append(fig_html(_latency_fig(res, sub, x, colors, suffix)))

    rel = _reliability_fig(res)
    cal = _calibration_table(res)
    if rel is not None or cal is not None:
        parts.append("<h2>Confidence calibration</h2><p>ECE and AUC of the cumulative confidence a_k = "
                     "c_1...c_k against 'positions 1..k all accepted', averaged over positions (first "
                     "20,000 request-rounds of each run). Raw head: before temperatures; as used: after "
                     "STS and the global temperature, what the policy ranked.</p>")
        if rel is not None:
            parts.append(fig_html(rel))
        if cal is not None:
            parts.append(_table_html(cal))

    if _uses_memtp(res):
        parts.append("<h2>MEMTP: depth, memory and coherence over time</h2>")
        tl = _timeline_fig(res, x)
        if tl is not None:
            parts.append(fig_html(tl))
        ph = phase_table(res)
        if ph is not None:
            parts.append("<p>Per load phase (requests grouped by arrival time; mean over seeds). This is where "
                         "an elastic ensemble and a fixed depth differ: per-user speed and queueing while load is "
                         "low and while memory binds, and requests rejected because their KV cannot fit next to "
                         "the heads.</p>")
            parts.append("<ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in phase_notes(ph, x)) + "</ul>")
            parts.append(_table_html(ph))

    sps_fig = _sps_fig(res)
    if sps_fig is not None:
        parts.append("<h2>Calibration</h2>")
        parts.append(fig_html(sps_fig))
        parts.append(f"<p>Profile <code>{html.escape(hw.get('name', ''))}</code> ({html.escape(hw.get('chip', ''))}). "
                     f"Sources: {html.escape('; '.join(f'{k}: {v}' for k, v in hw.get('sources', {}).items()))}</p>")
        if hw.get("caveats"):
            parts.append("<p>Caveats: " + html.escape(" ".join(hw["caveats"])) + "</p>")
        if acc:
            targets = ", ".join(f"{d} {t:.2f}" for d, t in (acc.get("targets_tau") or {}).items())
        cond = "; ".join(f"{d} {v[0]:.2f} at position 1, {v[6]:.2f} at 7, {v[-1]:.2f} at {len(v)}"
                         for d, v in (acc.get("conditional_acceptance") or {}).items() if len(v) >= 7)
        parts.append(f"<p>Acceptance model <code>{html.escape(str(acc.get('name')))}</code>: "
                     f"{html.escape(str(acc.get('source')))}. Static gamma={acc.get('fit_gamma')} reproduces "
                     f"tau {html.escape(targets or 'n/a')}; population conditional acceptance "
                     f"{html.escape(cond or 'n/a')}.</p>")

    parts.append("<h2>All results (mean over seeds)</h2>")
    parts.append(_table_html(headline_table(res)))
    style = ("body{font-family:system-ui,sans-serif;max-width:1400px;margin:1em auto;padding:0 1em;color:#222}"
             ".tbl{border-collapse:collapse;font-size:13px}.tbl td,.tbl th{padding:2px 8px;border-bottom:1px solid #ddd;"
             "text-align:right}code{background:#f4f4f4;padding:0 3px}")
    page = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>memtp_sim: {html.escape(meta['name'])}</title>"
            f"<style>{style}</style></head><body>{''.join(parts)}</body></html>")
    out = Path(root) / "report.html"
    atomic_write_text(out, page)
    return out

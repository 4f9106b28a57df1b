"""``calibrate check``: the fidelity report of one hardware profile (numbers, figures, page, CLI).

The leave-one-out, cliff and context-pair numbers come from :mod:`memtp_sim.hardware.fidelity`.
This module adds what needs the engine, which the hardware floor may not import: a
**sensitivity run**. One scenario (default: a small closed-loop scenario on the profile at a few
concurrency levels, with no speculation, MTP-1, static 5 and DSpark) runs under the profile as
measured, under a flat table (every pass at the smallest measured pass time, see
:func:`memtp_sim.hardware.fidelity.flat_pass_ms`) and with every pass curve scaled by 0.75, 0.9,
1.1 and 1.25. The variants are ordinary profile files (:func:`memtp_sim.hardware.fidelity.write_variant`)
run through :func:`memtp_sim.api.run`, so nothing here simulates. The report says which policy
decisions move (mean verify length per policy) and whether the winner (highest throughput,
highest p50 tok/s/user) flips at each load level.

Numbers first (pure functions returning frames and NamedTuples), then drawers, then the page and
:func:`cli_check`.

Source: issue 10 item 7; public measurements show a flat or biased cost table swinging results by
6-24% (issue 10), which is what the sensitivity run measures for this profile and scenario.
"""

from __future__ import annotations

import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots
from pydantic import ValidationError

from .._html import HtmlPage, escape
from .._io import atomic_write_bytes, atomic_write_text, check_writable_dir, read_yaml
from ..api import run
from ..config import Scenario, format_validation_error, load_scenario, other_kind
from ..errors import CalibrationError, ConfigError, MemtpSimError
from ..hardware import HardwareProfile, calibration_dir, load_profile
from ..hardware import fidelity as hf
from .figures import COLORS

__all__ = [
    "DEFAULT_POLICIES",
    "SCALE_FACTORS",
    "TIE",
    "VARIANTS",
    "SensitivityPlan",
    "Sensitivity",
    "default_plan",
    "plan_from_scenario",
    "run_sensitivity",
    "sensitivity_numbers",
    "loo_figure",
    "pairs_figure",
    "sensitivity_figure",
    "fidelity_page",
    "cli_check",
]

#: Pass-curve multipliers of the biased tables.
SCALE_FACTORS = (0.75, 0.9, 1.1, 1.25)
#: Variant labels in report order: the profile as measured, flat, then the scaled tables.
VARIANTS = ("measured", "flat") + tuple(hf.variant_tag(f) for f in SCALE_FACTORS)
#: The policies compared by default (the study's own baselines, studies/load.yaml).
DEFAULT_POLICIES: tuple[dict[str, Any], ...] = (
    {"name": "no_spec"}, {"name": "mtp1"}, {"name": "static", "k": 5}, {"name": "dspark"})
#: A different winner counts as a flip only when it leads the measured winner by more than this
#: fraction under the variant (smaller gaps are within run-to-run noise of one or two seeds).
TIE = 0.01
_METRICS = ("throughput_tok_per_s", "tok_per_s_user_p50", "mean_verify_len", "tau", "extrapolated_cost_frac")
_WIN_METRICS = {"throughput_tok_per_s": "throughput", "tok_per_s_user_p50": "p50 tok/s/user"}


class SensitivityPlan(NamedTuple):
    """What the sensitivity run runs.

    Attributes:
        base: the scenario (its hardware is replaced by each variant of the checked profile).
        levels: closed-loop concurrency per load level, or ``(None,)`` for the scenario's own load.
        num_requests: requests per run at each level.
        seeds: run seeds (each a replicate; results are averaged).
        policies: ``{name, **params}`` of each policy compared.
        source: ``built-in`` or the scenario file.
    """

    base: Scenario
    levels: tuple[int | None, ...]
    num_requests: tuple[int, ...]
    seeds: tuple[int, ...]
    policies: tuple[dict[str, Any], ...]
    source: str


class Sensitivity(NamedTuple):
    """The sensitivity run's numbers (see :func:`sensitivity_numbers`).

    Attributes:
        runs: one row per run (variant, load, policy, seed, metrics, error).
        by_policy: seed means per (variant, load, policy), with changes against ``measured``.
        winners: per (load, variant, metric): the winner, the measured winner, flipped or not.
        swing: per variant: the largest changes and the number of flips.
        notes: plain-words findings.
    """

    runs: pd.DataFrame
    by_policy: pd.DataFrame
    winners: pd.DataFrame
    swing: pd.DataFrame
    notes: list[str]


# ------------------------------------------------------------------------------ plan

def _builtin_trace() -> Path:
    """The Azure 2023 conversation trace shipped next to ``calibration/`` (``data/traces``)."""
    p = calibration_dir().parent / "data" / "traces" / "azure2023_conv.csv"
    if not p.is_file():
        raise ConfigError(f"{p}: the built-in sensitivity scenario's trace is missing; give --scenario FILE")
    return p


def _engine_for(profile: HardwareProfile) -> dict[str, int]:
    """Pass budget the profile can price: 512 tokens, or its largest measured B when it refuses beyond."""
    top = 512 if profile.sps.beyond_max != "error" else min(512, profile.sps.max_batch_tokens)
    if top < 2:
        raise ConfigError(f"{profile.name}: the verify curve ends at B={top} and refuses beyond it; a sensitivity "
                          "run needs passes of at least 2 tokens (give --scenario FILE)")
    return {"max_batch_tokens": top, "prefill_chunk_tokens": min(256, top // 2)}


def default_plan(profile: HardwareProfile, *, quick: bool = False) -> SensitivityPlan:
    """The built-in scenario: Azure conversations, closed loop, DSpark-fitted acceptance (chat).

    Concurrency 1, 8 and 32 with ``max(4 x concurrency, 24)`` requests and seeds 0 and 1; with
    ``quick``: concurrency 1 and 8, ``max(2 x concurrency, 4)`` requests, seed 0.

    Args:
        profile: the checked profile (sets the pass budget, see ``_engine_for``).
        quick: the small plan (for tests and a first look).

    Returns:
        :class:`SensitivityPlan` with :data:`DEFAULT_POLICIES`.

    Raises:
        ConfigError: the trace is missing or the profile cannot price a 2-token pass.
    """
    levels = (1, 8) if quick else (1, 8, 32)
    nreq = tuple(max(2 * c, 4) if quick else max(4 * c, 24) for c in levels)
    base = Scenario.model_validate({
        "hardware": {"profile": profile.path},
        "acceptance": {"profile": "dspark-qwen3", "domain_mix": {"chat": 1.0}},
        "workload": {"trace": str(_builtin_trace()), "mode": "closed_loop", "concurrency": levels[0],
                     "num_requests": nreq[0]},
        "engine": _engine_for(profile)})
    return SensitivityPlan(base, levels, nreq, (0,) if quick else (0, 1), DEFAULT_POLICIES, "built-in")


def plan_from_scenario(path: str | Path, profile: HardwareProfile, *, quick: bool = False) -> SensitivityPlan:
    """A user's scenario at its own load, with the default policies plus its own.

    Args:
        path: scenario YAML (the ``base`` shape of a study).
        profile: the checked profile (replaces the scenario's hardware in every run).
        quick: one seed instead of two.

    Returns:
        :class:`SensitivityPlan` at one load level.

    Raises:
        ConfigError: the scenario does not load.
    """
    scen = load_scenario(path)
    own = {"name": scen.policy.name, **scen.policy.params}
    labels = {_label(scen, p) for p in DEFAULT_POLICIES}
    policies = DEFAULT_POLICIES + ((own,) if _label(scen, own) not in labels else ())
    return SensitivityPlan(scen, (None,), (scen.workload.num_requests,), (0,) if quick else (0, 1), policies,
                           str(path))


def _label(scen: Scenario, policy: dict[str, Any]) -> str:
    try:
        return scen.model_copy(update={"policy": scen.policy.model_validate(policy)}).policy_label()
    except (ValidationError, MemtpSimError):
        return str(policy)


def _load_name(level: int | None) -> str:
    return "as given" if level is None else f"concurrency {level}"


def _scenario(plan: SensitivityPlan, profile_path: str, i: int, policy: dict[str, Any]) -> Scenario:
    """The plan's scenario at load level ``i`` with ``policy`` on the profile at ``profile_path``.

    Raises:
        ConfigError: the combination is not a valid scenario (one line).
    """
    doc = plan.base.model_dump(mode="json")
    doc["hardware"] = {"profile": profile_path}
    doc["policy"] = dict(policy)
    if plan.levels[i] is not None:
        doc["workload"]["concurrency"] = plan.levels[i]
        doc["workload"]["num_requests"] = plan.num_requests[i]
    try:
        return Scenario.model_validate(doc)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, f"{_load_name(plan.levels[i])}, {policy}")) from None


# ------------------------------------------------------------------------------ run

def run_sensitivity(profile: HardwareProfile, plan: SensitivityPlan, workdir: str | Path, *,
                    progress: Callable[[int, int], None] | None = None) -> pd.DataFrame:
    """Run the plan under the profile as measured, flat and scaled by :data:`SCALE_FACTORS`.

    Args:
        profile: the checked profile.
        plan: :func:`default_plan` or :func:`plan_from_scenario`.
        workdir: an empty folder for the variant profiles (each run reads its profile from there).
        progress: optional ``progress(done, total)``.

    Returns:
        One row per run: ``variant``, ``load``, ``concurrency``, ``policy`` (the run's label),
        ``seed``, the metrics ``throughput_tok_per_s``, ``tok_per_s_user_p50``,
        ``mean_verify_len``, ``tau``, ``extrapolated_cost_frac``, ``wall_s``, and ``error`` (empty,
        or why the run could not run, e.g. a pass the variant's rules refuse).
    """
    paths = {"measured": profile.path}
    paths["flat"] = str(hf.write_variant(profile, workdir, factor=None))
    for f in SCALE_FACTORS:
        paths[hf.variant_tag(f)] = str(hf.write_variant(profile, workdir, factor=f))
    jobs = [(v, i, pol, seed) for v in VARIANTS for i in range(len(plan.levels)) for pol in plan.policies
            for seed in plan.seeds]
    rows = []
    for n, (variant, i, pol, seed) in enumerate(jobs):
        row: dict[str, Any] = {"variant": variant, "load": _load_name(plan.levels[i]),
                               "concurrency": plan.levels[i], "policy": str(pol), "seed": seed, "error": ""}
        try:
            scen = _scenario(plan, paths[variant], i, pol)
            row["policy"] = scen.policy_label()
            res = run(scen, seed=seed)
            row.update({m: float(res.metrics[m]) for m in _METRICS}, wall_s=res.wall_s)
        except MemtpSimError as e:  # a run the variant cannot price is a finding, not a crash
            row["error"] = str(e)
        rows.append(row)
        if progress is not None:
            progress(n + 1, len(jobs))
    out = pd.DataFrame(rows)
    for m in _METRICS + ("wall_s",):
        if m not in out:
            out[m] = np.nan
    return out


# ------------------------------------------------------------------------------ numbers

def _by_policy(runs: pd.DataFrame) -> pd.DataFrame:
    """Seed means per (variant, load, policy) and changes against the measured table."""
    keys = ["variant", "load", "policy"]
    ok = runs[runs["error"] == ""]
    agg = ok.groupby(keys, sort=False)[list(_METRICS)].mean().reset_index()
    errs = runs[runs["error"] != ""].groupby(keys, sort=False)["error"].first().reset_index()
    agg = agg.merge(errs, on=keys, how="outer") if not errs.empty else agg.assign(error="")
    agg["error"] = agg["error"].fillna("")
    base = agg[agg["variant"] == "measured"].set_index(["load", "policy"])
    idx = pd.MultiIndex.from_frame(agg[["load", "policy"]])
    for m, col in (("throughput_tok_per_s", "throughput_change"), ("tok_per_s_user_p50", "p50_change")):
        ref = base[m].reindex(idx).to_numpy()
        agg[col] = agg[m].to_numpy() / ref - 1.0
    agg["verify_len_change"] = agg["mean_verify_len"].to_numpy() - base["mean_verify_len"].reindex(idx).to_numpy()
    order = {v: k for k, v in enumerate(VARIANTS)}
    return agg.sort_values(["variant"], key=lambda s: s.map(order), kind="stable").reset_index(drop=True)


def _winners(by_policy: pd.DataFrame) -> pd.DataFrame:
    """Per (load, variant, metric): the best policy, against the measured table's best."""
    rows = []
    ok = by_policy[by_policy["error"] == ""]
    for load, d in ok.groupby("load", sort=False):
        for metric, what in _WIN_METRICS.items():
            base = d[d["variant"] == "measured"]
            if base.empty or base[metric].isna().all():
                continue
            ref = base.loc[base[metric].idxmax(), "policy"]
            for variant, dv in d.groupby("variant", sort=False):
                if dv[metric].isna().all():
                    continue
                top = dv.loc[dv[metric].idxmax()]
                ref_val = dv.loc[dv["policy"] == ref, metric]
                margin = float(top[metric] / ref_val.iloc[0] - 1.0) if len(ref_val) else float("nan")
                status = ("same" if top["policy"] == ref else "flipped" if not margin <= TIE else "tie")
                rows.append({"load": load, "variant": variant, "metric": what, "winner": top["policy"],
                             "winner_value": float(top[metric]), "measured_winner": ref, "margin": margin,
                             "status": status})
    return pd.DataFrame(rows, columns=["load", "variant", "metric", "winner", "winner_value", "measured_winner",
                                       "margin", "status"])


def _swing(by_policy: pd.DataFrame, winners: pd.DataFrame) -> pd.DataFrame:
    """Per variant: the largest |change| of throughput, p50 and verify length, and the flips."""
    rows = []
    for variant in VARIANTS[1:]:
        d = by_policy[by_policy["variant"] == variant]
        w = winners[winners["variant"] == variant]
        if d.empty:
            continue
        rows.append({"variant": variant,
                     "max_abs_throughput_change": float(d["throughput_change"].abs().max()),
                     "median_throughput_change": float(d["throughput_change"].median()),
                     "max_abs_p50_change": float(d["p50_change"].abs().max()),
                     "max_abs_verify_len_change": float(d["verify_len_change"].abs().max()),
                     "num_flips": int((w["status"] == "flipped").sum()), "num_decisions": len(w),
                     "num_failed": int((d["error"] != "").sum())})
    return pd.DataFrame(rows, columns=["variant", "max_abs_throughput_change", "median_throughput_change",
                                       "max_abs_p50_change", "max_abs_verify_len_change", "num_flips",
                                       "num_decisions", "num_failed"])


def _pct(x: float) -> str:
    return "-" if not np.isfinite(x) else f"{x * 100:+.1f}%"


def _abs_pct(x: float, width: int = 0) -> str:
    return f"{'-' if not np.isfinite(x) else f'{x * 100:.1f}%':>{width}}"


def _notes(by_policy: pd.DataFrame, winners: pd.DataFrame, swing: pd.DataFrame) -> list[str]:
    """Plain-words findings: swings, flips, moving verify lengths, failed runs."""
    notes = []
    for s in swing.itertuples():
        if not np.isfinite(s.max_abs_throughput_change):
            notes.append(f"{s.variant}: no run could be compared with the measured table ({s.num_failed} failed).")
            continue
        flips = winners[(winners["variant"] == s.variant) & (winners["status"] == "flipped")]
        what = "no winner flips" if flips.empty else "; ".join(
            f"at {f.load} the {f.metric} winner becomes {f.winner} instead of {f.measured_winner} "
            f"({_pct(f.margin)} ahead)" for f in flips.itertuples())
        notes.append(f"{s.variant}: throughput moves by up to {_abs_pct(s.max_abs_throughput_change)} "
                     f"(median {_pct(s.median_throughput_change)}), p50 tok/s/user by up to "
                     f"{_abs_pct(s.max_abs_p50_change)}; {s.num_flips} of {s.num_decisions} winner decisions "
                     f"flip: {what}.")
    ok = by_policy[by_policy["error"] == ""]
    for (load, pol), d in ok.groupby(["load", "policy"], sort=False):
        lens = d.set_index("variant")["mean_verify_len"]
        if lens.max() - lens.min() > 0.05:
            parts = ", ".join(f"{v} {lens[v]:.2f}" for v in VARIANTS if v in lens.index)
            notes.append(f"{pol} at {load} verifies a different number of draft tokens per request per round "
                         f"under each table: {parts}.")
    failed = by_policy[by_policy["error"] != ""]
    for r in failed.head(5).itertuples():
        notes.append(f"{r.variant}, {r.load}, {r.policy}: did not run ({r.error}).")
    return notes


def sensitivity_numbers(runs: pd.DataFrame) -> Sensitivity:
    """Aggregate :func:`run_sensitivity` rows into tables and findings.

    ``by_policy``: seed means per (variant, load, policy) plus ``throughput_change`` and
    ``p50_change`` (fractions against the measured table) and ``verify_len_change`` (tokens).
    ``winners``: per load, variant and metric (throughput, p50 tok/s/user): ``status`` is
    ``same``, ``flipped`` (another policy leads the measured winner by more than :data:`TIE`) or
    ``tie`` (another policy leads by less). ``swing``: per variant, the largest changes and flips.

    Args:
        runs: :func:`run_sensitivity`.

    Returns:
        :class:`Sensitivity`.
    """
    by = _by_policy(runs)
    win = _winners(by)
    sw = _swing(by, win)
    return Sensitivity(runs, by, win, sw, _notes(by, win, sw))


# ------------------------------------------------------------------------------ figures

def loo_figure(fid: hf.Fidelity) -> go.Figure:
    """Measured points, their leave-one-out predictions, and the relative error, per curve.

    Args:
        fid: :func:`memtp_sim.hardware.fidelity.check_profile`.

    Returns:
        One column per curve: top, pass time (ms) of each measured point and its LOO prediction
        (log B axis); bottom, the LOO error (%), measured cliffs shaded.
    """
    curves = list(dict.fromkeys(fid.loo["curve"]))
    fig = make_subplots(rows=2, cols=len(curves), shared_xaxes=True, row_heights=[0.6, 0.4],
                        subplot_titles=[f"{c}: pass time (ms)" for c in curves] + [f"{c}: LOO error (%)" for c in curves])
    for j, c in enumerate(curves, start=1):
        d = fid.loo[fid.loo["curve"] == c]
        first = j == 1
        fig.add_trace(go.Scatter(x=d["batch_tokens"], y=d["measured_ms"], mode="lines+markers", name="measured",
                                 legendgroup="m", showlegend=first, line={"color": COLORS[0]}), row=1, col=j)
        fig.add_trace(go.Scatter(x=d["batch_tokens"], y=d["predicted_ms"], mode="markers", name="left out, predicted",
                                 legendgroup="p", showlegend=first, marker={"symbol": "x", "size": 9,
                                                                            "color": COLORS[1]}), row=1, col=j)
        fig.add_trace(go.Scatter(x=d["batch_tokens"], y=d["rel_error"] * 100, mode="markers", name="LOO error",
                                 legendgroup="e", showlegend=first, marker={"color": COLORS[1], "size": 8},
                                 customdata=d["how"], hovertemplate="B=%{x}: %{y:.1f}% (%{customdata})<extra></extra>"),
                      row=2, col=j)
        fig.add_hline(y=0, line_width=1, line_color="#888", row=2, col=j)
        for cl in fid.cliffs[fid.cliffs["curve"] == c].itertuples():  # shapes on a log axis take data values
            fig.add_vrect(x0=cl.b_from, x1=cl.b_to, fillcolor="#f0a020", opacity=0.15, line_width=0, row="all", col=j)
        fig.update_xaxes(type="log", title_text="B (tokens in the pass)", row=2, col=j)
        fig.update_xaxes(type="log", row=1, col=j)
    fig.update_layout(title=f"Leave-one-out error of the cost lookup: {fid.name} (shaded: measured cliffs)",
                      height=620)
    return fig


def pairs_figure(pairs: pd.DataFrame) -> go.Figure:
    """Measured vs modelled pass-time growth between two contexts, per shape (R x v).

    Args:
        pairs: :func:`memtp_sim.hardware.fidelity.context_pairs` (non-empty).

    Returns:
        Grouped bars: measured and modelled delta (ms) per ``curve R x v`` shape.
    """
    x = [f"{r.curve} R={r.num_requests} x v={r.tokens_per_request} ({r.context_from}->{r.context_to})"
         for r in pairs.itertuples()]
    fig = go.Figure([go.Bar(x=x, y=pairs["measured_delta_ms"], name="measured", marker={"color": COLORS[0]}),
                     go.Bar(x=x, y=pairs["modelled_delta_ms"], name="attention roofline", marker={"color": COLORS[1]})])
    fig.update_layout(title="Context term: pass-time growth between two measured contexts (ms)", barmode="group",
                      height=420, yaxis_title="delta (ms)")
    return fig


def sensitivity_figure(by_policy: pd.DataFrame) -> go.Figure:
    """Throughput, p50 tok/s/user and mean verify length per policy under each cost table.

    Args:
        by_policy: :attr:`Sensitivity.by_policy`.

    Returns:
        One row per load level, three panels each; x = the cost-table variant.
    """
    loads = list(dict.fromkeys(by_policy["load"]))
    cols = (("throughput_tok_per_s", "throughput (tok/s)"), ("tok_per_s_user_p50", "p50 tok/s/user"),
            ("mean_verify_len", "mean verify length (tokens)"))
    fig = make_subplots(rows=len(loads), cols=3, subplot_titles=[f"{ld}: {t}" for ld in loads for _, t in cols])
    pols = list(dict.fromkeys(by_policy["policy"]))
    for i, load in enumerate(loads, start=1):
        d = by_policy[by_policy["load"] == load]
        for k, pol in enumerate(pols):
            p = d[d["policy"] == pol]
            for j, (m, _) in enumerate(cols, start=1):
                fig.add_trace(go.Scatter(x=p["variant"], y=p[m], mode="lines+markers", name=pol, legendgroup=pol,
                                         showlegend=i == 1 and j == 1, line={"color": COLORS[k % len(COLORS)]}),
                              row=i, col=j)
    fig.update_xaxes(type="category", categoryorder="array", categoryarray=list(VARIANTS))
    fig.update_layout(title="Sensitivity: the same scenario under biased and flat cost tables",
                      height=330 * len(loads) + 80)
    return fig


# ------------------------------------------------------------------------------ page

def _pct_frame(df: pd.DataFrame, cols: list[str]) -> pd.DataFrame:
    """``cols`` as percentages: signed for changes and errors, unsigned for magnitudes."""
    out = df.copy()
    for c in cols:
        signed = c in ("margin", "rel_error") or c.startswith("loo_error") or \
            (c.endswith("change") and not c.startswith("max_abs"))
        out[c] = [_pct(v) if signed else _abs_pct(v) for v in out[c]]
    return out


def _loo_section(page: HtmlPage, fid: hf.Fidelity) -> None:
    page.add_heading("Leave-one-out error of the cost lookup")
    page.add_paragraph(
        "Each measured point is left out in turn, the curve is rebuilt from the others with the profile's own "
        "rules (linear in pass time between neighbours; below_min / beyond_max at the ends) and asked for the "
        "left-out B. Error = (predicted - measured) / measured. An end point the rules refuse to price without it "
        "is counted as refused. Points are as the table stores them (format-2 curves: brought to context 0), "
        "without graph padding. A small error says a B the profile did not measure is priced about right; a large "
        "one says the curve needs that point (and its neighbours) measured.")
    for n in fid.notes:
        page.add_paragraph(n, css_class="note")
    page.add_table(_pct_frame(fid.summary, ["mean_abs_error", "interior_mean_abs_error", "max_abs_error"]))
    page.add_figure(loo_figure(fid))
    page.add_heading("Error next to measured cliffs", level=3)
    if fid.cliffs.empty:
        page.add_paragraph("No cliff: verify tokens per second never falls by more than 5% and the pass time never "
                           "jumps more than 1.6x between neighbouring measured points.")
    else:
        page.add_paragraph("A cliff is where B / pass time falls by more than 5% (rate_drop) or the pass time jumps "
                           "more than 1.6x (pass_jump) between neighbouring measured points; the LOO error of the "
                           "points on each side shows what a curve without them would get wrong there.")
        page.add_table(_pct_frame(fid.cliffs, ["loo_error_from", "loo_error_to", "worst_abs_error"]))
    page.add_heading("All points", level=3)
    page.add_table(_pct_frame(fid.loo, ["rel_error"]))


def _pairs_section(page: HtmlPage, fid: hf.Fidelity) -> None:
    page.add_heading("Context term: measured vs modelled")
    if fid.pairs.empty:
        page.add_paragraph("This profile has no shape measured at two contexts, so pass time does not depend on the "
                           "context in it (format-1 llama-bench curves are measured at KV depth 0).")
        return
    page.add_paragraph("Each shape (R requests x v tokens) measured at two contexts: how much the pass grew, and how "
                       "much the attention roofline fitted on these pairs says it grows. Each roofline limit is read off "
                       "one of the pairs (those match exactly); the others check the fit.")
    page.add_table(_pct_frame(fid.pairs, ["rel_error"]), float_format="{:,.3f}")
    page.add_figure(pairs_figure(fid.pairs))


def _plan_text(plan: SensitivityPlan, profile: HardwareProfile) -> str:
    loads = ", ".join(_load_name(lv) for lv in plan.levels)
    wl = plan.base.workload
    return (f"Scenario: {plan.source} ({wl.mode} on {Path(wl.trace).name}, acceptance "
            f"{plan.base.acceptance.profile or 'alpha=' + str(plan.base.acceptance.alpha)}, engine max_batch_tokens "
            f"{plan.base.engine.max_batch_tokens}); loads: {loads}; requests per run: "
            f"{', '.join(str(n) for n in plan.num_requests)}; seeds {list(plan.seeds)} (averaged). Tables: measured "
            f"(the profile as shipped); flat (every pass at {hf.flat_pass_ms(profile):.4g} ms, the smallest measured "
            f"pass: the back-of-envelope assumption that verifying k draft tokens costs one decode step; it keeps "
            f"single-stream decode right, so what changes is only how cost grows with B, while a median-priced "
            f"table would also slow every decode step several fold; it prices prefill chunks at one decode step too, "
            f"which is most of its change under load); and every pass curve (verify, decode, prefill) "
            f"x0.75, x0.9, x1.1, x1.25. Drafter costs, host and planner overheads stay as measured, which is why a "
            f"uniform scale can change which policy wins.")


def _winners_grid(winners: pd.DataFrame) -> pd.DataFrame:
    """One row per (load, metric), one column per table: the winner, marked when it flipped or tied."""
    if winners.empty:
        return winners
    mark = {"same": "", "flipped": " (FLIPPED {})", "tie": " (tie {})"}
    cells = winners.assign(cell=[w.winner + mark[w.status].format(_pct(w.margin)) for w in winners.itertuples()])
    grid = cells.pivot_table(index=["load", "metric"], columns="variant", values="cell", aggfunc="first", sort=False)
    grid = grid.reindex(columns=[v for v in VARIANTS if v in grid.columns]).reset_index()
    grid.columns.name = None
    return grid


def _sensitivity_section(page: HtmlPage, sens: Sensitivity, plan: SensitivityPlan, profile: HardwareProfile,
                         elapsed_s: float) -> None:
    page.add_heading("Sensitivity: what a flat or biased cost table changes")
    page.add_paragraph(_plan_text(plan, profile) + f" {len(sens.runs)} runs in {elapsed_s:.0f} s.")
    page.add_list(sens.notes)
    page.add_heading("Winners per load level", level=3)
    page.add_paragraph(f"'flipped': another policy leads the measured table's winner by more than {TIE:.0%} under "
                       "that table; 'tie': it leads by less (within run-to-run noise).")
    page.add_table(_winners_grid(sens.winners))
    page.add_heading("Largest changes per table", level=3)
    sw = _pct_frame(sens.swing, ["max_abs_throughput_change", "median_throughput_change", "max_abs_p50_change"])
    page.add_table(sw)
    page.add_figure(sensitivity_figure(sens.by_policy))
    page.add_heading("Per policy", level=3)
    cols = ["variant", "load", "policy", "throughput_tok_per_s", "throughput_change", "tok_per_s_user_p50",
            "p50_change", "mean_verify_len", "verify_len_change", "tau", "error"]
    page.add_table(_pct_frame(sens.by_policy[cols], ["throughput_change", "p50_change"]))


def fidelity_page(profile: HardwareProfile, fid: hf.Fidelity, sens: Sensitivity | None, plan: SensitivityPlan | None,
                  *, elapsed_s: float = 0.0, skipped: str = "") -> str:
    """The ``calibrate check`` HTML page.

    Args:
        profile: the checked profile.
        fid: its LOO, cliffs and context pairs.
        sens: the sensitivity run's numbers, or None when it was skipped.
        plan: the plan it ran.
        elapsed_s: wall time of the sensitivity run.
        skipped: why the sensitivity run did not run (shown when ``sens`` is None).

    Returns:
        A self-contained HTML document (:class:`memtp_sim._html.HtmlPage`).
    """
    page = HtmlPage(f"calibrate check: {profile.name}")
    page.add_html(f"<p><code>{escape(profile.path)}</code><br>{escape(profile.description)}</p>")
    for w in profile.warnings:
        page.add_paragraph(w, css_class="warn")
    _loo_section(page, fid)
    _pairs_section(page, fid)
    if sens is not None and plan is not None:
        _sensitivity_section(page, sens, plan, profile, elapsed_s)
    else:
        page.add_heading("Sensitivity")
        page.add_paragraph(f"Not run: {skipped}", css_class="warn")
    return page.render()


# ------------------------------------------------------------------------------ CLI

def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name) or "profile"


def _summary_lines(fid: hf.Fidelity, sens: Sensitivity | None) -> list[str]:
    """The short table ``calibrate check`` prints."""
    out = [f"{fid.name}  ({fid.path})", "leave-one-out error of the cost lookup (each measured point left out):",
           f"  {'curve':8} {'points':>6} {'refused':>7} {'mean|err|':>9} {'interior':>8} {'max|err|':>8}  at B"]
    for s in fid.summary.itertuples():
        if s.num_points < 3:  # each point left out is then extrapolated from the others: no error to state
            out.append(f"  {s.curve:8} {s.num_points:>6} {s.num_refused:>7} {'-':>9} {'-':>8} {'-':>8}  -")
            continue
        b = "-" if not np.isfinite(s.b_at_max) else str(int(s.b_at_max))
        out.append(f"  {s.curve:8} {s.num_points:>6} {s.num_refused:>7} {_abs_pct(s.mean_abs_error, 9)} "
                   f"{_abs_pct(s.interior_mean_abs_error, 8)} {_abs_pct(s.max_abs_error, 8)}  {b}")
    out += [f"  note: {n}" for n in fid.notes]
    for c in fid.cliffs.itertuples():
        out.append(f"  cliff {c.cliff} ({c.kind}, pass x{c.jump:.2f}): LOO {_pct(c.loo_error_from)} / "
                   f"{_pct(c.loo_error_to)}")
    if not fid.pairs.empty:
        worst = fid.pairs.loc[fid.pairs["error_ms"].abs().idxmax()]
        out.append(f"context pairs: {len(fid.pairs)} shapes; worst modelled - measured {worst['error_ms']:+.3f} ms "
                   f"({_pct(worst['rel_error'])}, {worst['curve']} R={worst['num_requests']} "
                   f"v={worst['tokens_per_request']})")
    if sens is not None:
        out.append(f"sensitivity ({len(sens.runs)} runs): {'variant':9} {'max|dthroughput|':>16} {'max|dp50|':>9} "
                   f"{'flips':>7}")
        for s in sens.swing.itertuples():
            out.append(f"  {'':20}{s.variant:9} {_abs_pct(s.max_abs_throughput_change, 16)} "
                       f"{_abs_pct(s.max_abs_p50_change, 9)} {s.num_flips:>3}/{s.num_decisions}")
    return out


def _refuse_other_kinds(arg: str) -> None:
    """A file ``calibrate check`` was given that is not a hardware profile, refused in one line
    that says what it is and where it goes: a measurements table (imported first) or another
    kind of YAML (:func:`memtp_sim.config.other_kind`'s words). A profile's name, or a
    file that is no kind the keys tell, is left to :func:`load_profile`.

    Raises:
        CalibrationError: a table of measurements, or a YAML of another kind.
    """
    p = Path(arg)
    if not p.is_file():
        return
    if p.suffix.lower() not in (".yaml", ".yml"):
        raise CalibrationError(f"{p}: not a hardware profile (a YAML file); a table of measurements is imported into "
                               f"one first: python -m memtp_sim calibrate import {p} --format FORMAT -o "
                               "calibration/<chip>/<name>.yaml")
    try:
        doc = read_yaml(p)
    except ConfigError:
        return  # (not readable as YAML: load_profile's own line says why)
    why = other_kind(p, doc, "hardware profile")
    if why is not None:
        raise CalibrationError(why)


def cli_check(args: Any) -> int:
    """``python -m memtp_sim calibrate check PROFILE [--out DIR] [--scenario FILE] [--quick]``.

    Writes ``DIR/<profile>/report.html`` plus ``loo.csv``, ``cliffs.csv``, ``context_pairs.csv``,
    ``sensitivity_runs.csv``, ``sensitivity.csv`` and the variant profiles (``variants/``), and
    prints a short table.

    Args:
        args: ``profile``, ``out``, ``scenario`` (or None), ``quick``.

    Returns:
        0.

    Raises:
        CalibrationError: the profile does not load (the CLI prints one line and exits 2).
        ConfigError: the scenario does not load, or ``--out`` cannot be written.
    """
    _refuse_other_kinds(args.profile)
    profile = load_profile(args.profile)
    fid = hf.check_profile(profile)
    plan = (plan_from_scenario(args.scenario, profile, quick=args.quick) if args.scenario
            else default_plan(profile, quick=args.quick))
    out = Path(args.out) / _safe(profile.name)
    check_writable_dir(out)  # before the sensitivity runs, not after them
    n = len(VARIANTS) * len(plan.levels) * len(plan.policies) * len(plan.seeds)
    print(f"sensitivity: {n} runs ...", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    sens, skipped = None, ""
    tables = [("loo", fid.loo), ("cliffs", fid.cliffs), ("context_pairs", fid.pairs)]
    with tempfile.TemporaryDirectory(prefix="memtp-fidelity-") as tmp:
        try:
            runs = run_sensitivity(profile, plan, tmp)
        except CalibrationError as e:  # a profile layout write_variant cannot copy: report the rest
            skipped = str(e)
        for f in sorted(Path(tmp).iterdir()):  # keep the variant profiles next to the report, for re-runs
            atomic_write_bytes(out / "variants" / f.name, f.read_bytes())
    elapsed = time.perf_counter() - t0
    if not skipped:
        sens = sensitivity_numbers(runs)
        tables += [("sensitivity_runs", runs), ("sensitivity", sens.by_policy), ("winners", sens.winners)]
    for name, df in tables:
        atomic_write_text(out / f"{name}.csv", df.to_csv(index=False))
    atomic_write_text(out / "report.html", fidelity_page(profile, fid, sens, plan, elapsed_s=elapsed, skipped=skipped))
    print("\n".join(_summary_lines(fid, sens)))
    if skipped:
        print(f"sensitivity not run: {skipped}")
    print(f"report: {out / 'report.html'}")
    return 0

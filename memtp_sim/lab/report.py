"""The drafter lab's outputs: profiles, ``report.html`` (one figure, three tables) and ``lab.json``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from .._html import HtmlPage, escape
from .._io import atomic_write_text
from .profiles import DRAFTERS, MIN_TESTED, profile_document, write_json, write_profile

if TYPE_CHECKING:
    from .run import LabBuild, LabResult

__all__ = ["flattening_table", "summary_lines", "write_outputs"]


def flattening_table(result: "LabResult") -> pd.DataFrame:
    """Per drafter: c_k at positions 1, 2, 8, 16, the decay ratios c_8/c_1 and c_16/c_1 (NaN where
    a position was tested in fewer than :data:`MIN_TESTED` rounds), and tau at each ``costs.gammas``."""
    rows = []
    gammas = [int(x) for x in result.config["costs"]["gammas"]]
    for name, m in result.measurements.items():
        c = np.where(m.tested >= MIN_TESTED, m.conditional, np.nan)
        at = {k: (float(c[k - 1]) if k <= c.size else np.nan) for k in (1, 2, 8, 16)}
        row = {"drafter": name, "what": DRAFTERS[name], "c1": at[1], "c2": at[2], "c8": at[8], "c16": at[16],
               "c8/c1": at[8] / at[1], "c16/c1": at[16] / at[1]}
        row.update({f"tau_gamma{g}": m.tau(g) for g in gammas})
        rows.append(row)
    return pd.DataFrame(rows)


def _figure(result: "LabResult") -> go.Figure:
    fig = go.Figure()
    for name, m in result.measurements.items():
        k = np.arange(1, m.gamma + 1)
        ok = m.tested >= MIN_TESTED
        fig.add_trace(go.Scatter(x=k[ok], y=m.conditional[ok], mode="lines+markers", name=name,
                                 error_y={"type": "data", "array": 2 * m.stderr[ok], "visible": True}))
    fig.update_layout(title="Conditional acceptance by block position (error bars: 2 standard errors; "
                            "positions tested in >= 200 rounds)",
                      xaxis_title="block position k", yaxis_title="P(k accepted | 1..k-1 accepted)",
                      height=520, legend_title="drafter")
    return fig


def _fit_table(result: "LabResult") -> pd.DataFrame:
    rows = []
    for name, f in result.fits.items():
        rows.append({"drafter": name, "sigma_round": f.sigma_round, "noise_sd": f.noise_sd,
                     "overconfidence": f.overconfidence, "lab oracle AUC": f.lab["oracle_auc"],
                     "model oracle AUC": f.model["oracle_auc"], "lab confidence AUC": f.lab["confidence_auc"],
                     "model confidence AUC": f.model["confidence_auc"], "lab mean conf.": f.lab["mean_confidence"],
                     "model mean conf.": f.model["mean_confidence"], "acceptance rate": f.lab["acceptance_rate"],
                     "shared sigma (lab)": f.lab["shared_sigma"]})
    return pd.DataFrame(rows)


def _write_html(result: "LabResult", build: "LabBuild", path: Path, command: str) -> None:
    cfg = result.config
    src = build.source
    page = HtmlPage("Drafter lab: acceptance by block position")
    page.add_paragraph(
        f"Target: synthetic order-{src.order} Markov source over {src.vocab_size} tokens "
        f"({src.entropy_rate_bits():.2f} bits/token; {src.params}). Drafters fitted on "
        f"{cfg['training']['sequences']} x {cfg['training']['length']} tokens; "
        f"{cfg['evaluation']['rounds']} rounds of gamma = {cfg['gamma']} per drafter, every block verified "
        f"with the exact rule (accept min(1, p/q), resample the residual). Command: {command} (seed {cfg['seed']}).")
    page.add_figure(_figure(result))
    page.add_heading("How much each head flattens the decay")
    page.add_paragraph("c_k: conditional acceptance at block position k; c8/c1 = 1 is flat, below 1 decays, above "
                       "1 rises. tau: mean tokens per round with gamma positions verified, bonus included.")
    page.add_table(flattening_table(result), float_format="{:,.3f}")
    page.add_heading("Engine parameters fitted per profile")
    page.add_paragraph("sigma_round, noise_sd and overconfidence make the engine's acceptance model and "
                       "ConfidenceHead match the lab's per-position AUCs and mean confidence "
                       "(memtp_sim.lab.measure.fit_engine_parameters). 'shared sigma' is the part of the lab's "
                       "logit variation shared by a round's positions: the engine shares all of it.")
    page.add_table(_fit_table(result), float_format="{:,.3f}")
    page.add_heading("Cost per head")
    hw = ", ".join(f"{n}: {s['memory_bandwidth_gb_s']:g} GB/s, {s['flops_per_s'] / 1e12:g} TFLOP/s ({s['source']})"
                   for n, s in cfg["costs"]["hardware"].items())
    page.add_paragraph(f"Deployment sizes: vocabulary {cfg['costs']['vocab']:,}, {cfg['costs']['bytes_per_param']:g} "
                       f"bytes per parameter; roofline time max(bytes / bandwidth, FLOPs / rate) "
                       f"(memtp_sim.lab.costs). Hardware: {hw}. Times in microseconds.")
    page.add_table(pd.DataFrame(result.costs), float_format="{:,.1f}")
    page.add_html(f"<p class='note'>memtp_sim drafter lab; profiles: "
                  f"{escape(', '.join(str(p.name) for k, p in result.files.items() if k != 'report'))}</p>")
    atomic_write_text(path, page.render())  # a 5 MB page: never half-written over the last run's


def write_outputs(result: "LabResult", build: "LabBuild", out: Path, command: str) -> None:
    """Write every profile, ``report.html`` and ``lab.json`` into ``out``; fill ``result.files`` and
    ``result.summary``."""
    out.mkdir(parents=True, exist_ok=True)
    prefix = result.config["profiles"]["prefix"]
    summary: dict[str, Any] = {"command": command, "seed": result.config["seed"], "drafters": {}}
    for name, m in result.measurements.items():
        header, doc = profile_document(name, m, result.fits[name], result.config, build, command)
        path = out / f"{prefix}-{name}.yaml"
        write_profile(path, header, doc)
        result.files[name] = path
        summary["drafters"][name] = {"profile": str(path), "conditional_acceptance": m.conditional,
                                     "stderr": m.stderr, "tested": m.tested, **doc["confidence"],
                                     "sigma_round": doc["sigma_round"], "provenance": doc["provenance"]}
    summary["flattening"] = flattening_table(result).to_dict(orient="records")
    summary["costs"] = result.costs
    summary["config"] = result.config.settings
    result.summary = summary
    result.files["report"] = out / "report.html"
    _write_html(result, build, result.files["report"], command)
    result.files["json"] = out / "lab.json"
    write_json(result.files["json"], summary)


def summary_lines(result: "LabResult") -> list[str]:
    """The run's numbers as plain-text lines (the CLI prints them): acceptance by position, the
    flattening table, the fitted engine parameters, the cost per head, and the files written."""
    out = [f"Acceptance by block position (c_k = accepted / tested; exact verification; "
           f"{result.config['evaluation']['rounds']} rounds per drafter; '-': tested in < {MIN_TESTED} rounds):"]
    g = result.config["gamma"]
    out.append("drafter   " + " ".join(f"{k:>5d}" for k in range(1, g + 1)))
    for name, m in result.measurements.items():
        c = np.where(m.tested >= MIN_TESTED, m.conditional, np.nan)
        out.append(f"{name:9s} " + " ".join("    -" if np.isnan(x) else f"{x:5.3f}" for x in c))
    out.append("")
    out.append("How much each head flattens the decay:")
    flat = flattening_table(result).drop(columns="what")
    out.extend(flat.to_string(index=False, float_format=lambda v: f"{v:.3f}", na_rep="-").splitlines())
    out.append("")
    out.append("Engine parameters per profile (acceptance sigma_round; ConfidenceHead noise_sd, overconfidence):")
    for name, f in result.fits.items():
        out.append(f"  {name:9s} sigma_round {f.sigma_round:.3f}  noise_sd {f.noise_sd:.3f}  overconfidence "
                   f"{f.overconfidence:.3f}  (lab AUC of alpha {f.lab['oracle_auc']:.3f}, of its confidence "
                   f"{f.lab['confidence_auc']:.3f}; mean confidence {f.lab['mean_confidence']:.3f} vs acceptance "
                   f"{f.lab['acceptance_rate']:.3f})")
    out.append("")
    c = result.config["costs"]
    out.append(f"Cost per head (vocabulary {c['vocab']:,}, {c['bytes_per_param']:g} bytes/param, roofline; "
               f"microseconds):")
    costs = pd.DataFrame(result.costs)
    costs["mflops_per_step"] = costs.pop("flops_per_step") / 1e6
    out.extend(costs.to_string(index=False, float_format=lambda v: f"{v:,.1f}").splitlines())
    out.append("")
    out.extend(f"wrote {p}" for p in result.files.values())
    return out

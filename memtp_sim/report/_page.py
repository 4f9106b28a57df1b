"""The study report page: sections in order, each from :mod:`.numbers` and :mod:`.figures`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .._html import HtmlPage, escape
from .._io import atomic_write_text
from . import figures, numbers
from ._results import StudyResults, load_results

__all__ = ["write_report"]


def _overview(page: HtmlPage, res: StudyResults) -> None:
    meta, summ = res.meta, res.first_summary
    if meta.get("description"):
        page.add_paragraph(meta["description"])
    page.add_html(
        f"<p><b>{len(res.table)} runs</b>: sweep {escape(', '.join(res.sweep_keys) or '(none)')}; "
        f"policies {escape(', '.join(res.policies))}; seeds {sorted(set(res.table['seed']))}. "
        f"memtp_sim {escape(str(summ.get('memtp_sim_version', '?')))}.</p>")
    page.add_heading("How to read this report")
    page.add_html(
        "<ul><li><b>throughput</b>: output tokens per second of the GPU while load is offered; "
        "<b>tok/s/user</b>: decode speed one user sees, (output tokens - 1) / (finish - first token).</li>"
        "<li>Up and to the right is better on the frontier plot; each point is one load level "
        "(mean over seeds, bars = standard deviation).</li>"
        "<li><b>verify budget</b> = draft tokens verified per request per round + 1 bonus token "
        "(MTP-1 is always 2; no speculation is 1).</li>"
        "<li>TTFT = first token - arrival: the wait for prefill and the prefill itself. With disaggregated "
        "prefill the first token comes from a prefill box, so the wait for a decode slot on this box "
        "(queue_s) comes after it and lands in TPOT and tok/s/user, not in TTFT. "
        "TPOT = 1000 / tok/s/user.</li></ul>")


def _winners_and_losses(page: HtmlPage, res: StudyResults) -> None:
    page.add_heading("Which policy wins where")
    page.add_list(numbers.winners_notes(res))
    page.add_heading("Where DSpark loses to a static policy, and why")
    gaps = numbers.dspark_gaps(res)
    if not gaps.dspark_policies or not gaps.static_policies:
        missing = "DSpark policy" if not gaps.dspark_policies else "static baseline (static k or MTP-1)"
        page.add_paragraph(f"No {missing} was run in this study (policies: {', '.join(res.policies)}), so "
                           "there is nothing to compare here.")
    else:
        page.add_paragraph("Listed where a DSpark policy's throughput trails the best static policy (static k "
                           "or MTP-1) by more than 2% and by more than the spread between seeds; smaller gaps "
                           "are within noise and not listed.")
        losses = numbers.dspark_losses(res)
        if losses:
            page.add_list(losses)
        else:
            page.add_paragraph("Nowhere in this study: at every load point a DSpark policy's throughput is "
                               f"within 2% (or the seed spread) of the best static policy "
                               f"({', '.join(gaps.static_policies)}), or ahead of it.")
    cliffs = numbers.cliff_notes(numbers.cliffs(res))
    if cliffs:
        page.add_paragraph("Measured cliffs in this profile's SPS(B): " + "; ".join(cliffs) + ".")


def _facet_figures(page: HtmlPage, res: StudyResults, colors: dict[str, str]) -> None:
    x = res.x_key
    for title, sub in numbers.facets(res):
        suffix = f" ({title})" if title else ""
        if title:
            page.add_heading(title)
        page.add_figure(figures.frontier_figure(numbers.frontier_points(sub, x), x, colors, suffix))
        if x:
            page.add_figure(figures.load_figure(numbers.load_curves(sub, x), x, colors, suffix))
        page.add_figure(figures.latency_figure(numbers.latency_samples(res, sub, x), x, colors, suffix))


def _reliability_note(rel: numbers.Reliability) -> str:
    """Which run each curve comes from, and why any requested position has no panel."""
    src = "; ".join(f"{p.label}: {p.run}" for p in rel.picks.itertuples() if p.num_positions > 0)
    note = f"Curves from one run each ({src})."
    if rel.missing:
        ks = ", ".join(str(k) for k in rel.missing)
        note += (f" No panel for position {ks}: the runs' summaries keep a position's curve only where it was "
                 f"drafted often enough, and the deepest stored here is position {rel.max_position}.")
    return note


def _calibration_section(page: HtmlPage, res: StudyResults) -> None:
    rel = numbers.reliability_curves(res)
    cal = numbers.calibration_table(res)
    if rel is None and cal is None:
        return
    page.add_heading("Confidence calibration")
    page.add_paragraph("ECE and AUC of the cumulative confidence a_k = c_1...c_k against 'positions 1..k all "
                       "accepted', averaged over positions (first 20,000 request-rounds of each run). Raw head: "
                       "before temperatures; as used: after STS and the global temperature, what the policy "
                       "ranked.")
    if rel is not None:
        page.add_figure(figures.reliability_figure(rel))
        page.add_paragraph(_reliability_note(rel), css_class="note")
    if cal is not None:
        page.add_table(cal)


def _memtp_section(page: HtmlPage, res: StudyResults) -> None:
    if not res.uses_memtp:
        return
    page.add_heading("MEMTP: depth, memory and coherence over time")
    tl = numbers.timeline(res)
    if tl is not None:
        page.add_figure(figures.timeline_figure(tl))
    ph = numbers.phase_table(res)
    if ph is not None:
        page.add_paragraph("Per load phase (requests grouped by arrival time; mean over seeds). This is where an "
                           "elastic ensemble and a fixed depth differ: per-user speed and queueing while load is "
                           "low and while memory binds, and requests rejected because their KV cannot fit next "
                           "to the heads.")
        page.add_list(numbers.phase_notes(ph, res.x_key))
        page.add_table(ph)


def _acceptance_text(acc: dict[str, Any]) -> str:
    """The acceptance model's provenance in one paragraph (HTML, escaped)."""
    if not acc:
        return "<p>Acceptance model: not recorded in the run summaries.</p>"
    targets = ", ".join(f"{d} {t:.2f}" for d, t in (acc.get("targets_tau") or {}).items())
    cond = "; ".join(f"{d} {v[0]:.2f} at position 1, {v[6]:.2f} at 7, {v[-1]:.2f} at {len(v)}"
                     for d, v in (acc.get("conditional_acceptance") or {}).items() if len(v) >= 7)
    return (f"<p>Acceptance model <code>{escape(str(acc.get('name')))}</code>: "
            f"{escape(str(acc.get('source')))}. Static gamma={acc.get('fit_gamma')} reproduces "
            f"tau {escape(targets or 'n/a')}; population conditional acceptance {escape(cond or 'n/a')}.</p>")


def _profile_section(page: HtmlPage, res: StudyResults) -> None:
    sps = numbers.sps_curve(res)
    if sps is None:
        return
    prov = res.first_summary.get("provenance", {})
    hw = prov.get("hardware", {})
    page.add_heading("Calibration")
    page.add_figure(figures.sps_figure(sps))
    page.add_html(f"<p>Profile <code>{escape(hw.get('name', ''))}</code> ({escape(hw.get('chip', ''))}). "
                  f"Sources: {escape('; '.join(f'{k}: {v}' for k, v in hw.get('sources', {}).items()))}</p>")
    if hw.get("caveats"):
        page.add_paragraph("Caveats: " + " ".join(hw["caveats"]))
    page.add_html(_acceptance_text(prov.get("acceptance") or {}))


def _missing_runs(page: HtmlPage, res: StudyResults) -> None:
    """A warning at the top when the report covers fewer runs than the study has."""
    if not res.missing:
        return
    from ..study import failure_kind  # lazy: the report module does not need the study runner otherwise

    items = [(f"{rid}: {why}", failure_kind(why)) for rid, why in list(res.missing.items())[:20]]
    more = f" (and {len(res.missing) - 20} more)" if len(res.missing) > 20 else ""
    mark = {"input": "<i>input</i> ", "same": "<i>same</i> ", "transient": ""}
    page.add_html(f"<div class='warn'><b>This report covers {len(res.table)} of the study's {res.num_planned} "
                  f"runs.</b> Runs without a verified result (failed, not run yet, or damaged files){more}. "
                  "Runs marked <i>input</i> failed on their input and fail the same way until it is fixed; runs "
                  "marked <i>same</i> raised inside the simulation and fail the same way for their seed (the "
                  "traceback is in their failed.json); run the study again to retry the others:<ul>"
                  + "".join(f"<li>{mark[kind]}{escape(i)}</li>" for i, kind in items)
                  + "</ul></div>")


def _nothing_measured(page: HtmlPage, res: StudyResults) -> None:
    """A warning at the top for runs that completed no request (every request rejected, or none
    arrived): their throughput is 0 and their latencies empty, and no policy is ranked on them."""
    loud = [n for n in numbers.rejection_notes(res) if n.startswith(("every request rejected", "no request completed"))]
    if loud:
        page.add_html("<div class='warn'><b>Runs that measured nothing</b>:<ul>"
                      + "".join(f"<li>{escape(n)}</li>" for n in loud) + "</ul>Their rows in the tables below read "
                      "0 tok/s and - (nothing measured); the reasons per run are under Rejected requests.</div>")


def _rejections_section(page: HtmlPage, res: StudyResults) -> None:
    """Every run that rejected requests or completed none, with the reasons."""
    rj = numbers.rejections(res)
    if rj.empty:
        return
    page.add_heading("Rejected requests")
    page.add_paragraph("Requests turned away at arrival, per run, with the reason: exceeds_max_model_len (prompt "
                       "plus output longer than the model's context), exceeds_kv_capacity (the KV of its prompt "
                       "plus output needs more blocks than the KV cache can hold next to the weights and "
                       "heads). " + " ".join(n[0].upper() + n[1:] + "." for n in
                                                             numbers.rejection_notes(res)))
    page.add_table(rj)


def _overload(page: HtmlPage, res: StudyResults) -> None:
    """A warning at the top for load points whose offered load exceeds capacity."""
    notes = numbers.overload_notes(res)
    if notes:
        page.add_html("<div class='warn'><b>Offered load above capacity</b> at these points (the queue grows "
                      "without bound):<ul>" + "".join(f"<li>{escape(n)}</li>" for n in notes) + "</ul></div>")


def _extrapolation(page: HtmlPage, res: StudyResults) -> None:
    """A warning at the top for load points whose passes were often priced beyond the measured table."""
    notes = numbers.extrapolation_notes(res)
    if notes:
        page.add_html("<div class='warn'><b>Pass times extrapolated</b> beyond the profile's measurements at these "
                      "points:<ul>" + "".join(f"<li>{escape(n)}</li>" for n in notes) + "</ul></div>")


def write_report(root: str | Path) -> Path:
    """Build ``report.html`` for the study in ``root`` (written atomically) and return its path.

    Sections: warnings (runs missing, runs that completed no request, overload, pass times
    extrapolated beyond the profile's table); overview and how
    to read it; rejected requests with their reasons (when any run rejected some or completed none);
    which policy wins where; where DSpark loses to a static policy and why; per facet the frontier,
    load-sweep and latency figures; confidence calibration; the MEMTP timeline and load phases (when
    the study runs the ensemble); the hardware profile and acceptance model; all headline results.

    Args:
        root: the study folder (``results/<study>/``: runs.csv, study.json, runs/<id>/...).

    Returns:
        ``root / "report.html"``.

    Raises:
        ConfigError: from :func:`~memtp_sim.report.load_results`: study.json is missing or
            unreadable, or no run of the study has a verified result.
        FileNotFoundError: a run file a section needs (requests.csv, rounds.parquet) is missing.
        KeyError: the runs table or a summary lacks a column or field the report reads.
        OSError: ``report.html`` cannot be written (from :func:`memtp_sim._io.atomic_write_text`).

    Source:
        Numbers first, then drawers (Optuna's ``optuna/visualization`` pattern, STYLE.md
        section 7); the page shell of :class:`memtp_sim._html.HtmlPage`.
    """
    res = load_results(root)
    page = HtmlPage(f"memtp_sim study: {res.meta['name']}")
    _missing_runs(page, res)
    _nothing_measured(page, res)
    _overload(page, res)
    _extrapolation(page, res)
    _overview(page, res)
    _rejections_section(page, res)
    _winners_and_losses(page, res)
    _facet_figures(page, res, figures.color_map(res.policies))
    _calibration_section(page, res)
    _memtp_section(page, res)
    _profile_section(page, res)
    page.add_heading("All results (mean over seeds)")
    page.add_table(numbers.headline_table(res))
    out = Path(root) / "report.html"
    atomic_write_text(out, page.render())
    return out

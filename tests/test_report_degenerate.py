"""The report on degenerate studies: every request rejected, a single run, a single policy, NaN or
zero metrics.

The kind of fault: a ratio or a "winner" computed from a run that measured nothing (``nan% ahead``,
a winner among runs that completed no request, a numpy ``RuntimeWarning`` from 0 / 0 on the
terminal). Every test here runs the report code with warnings turned into errors, and the property
test feeds it arbitrary mixes of NaN, zero and ordinary values.
"""

from __future__ import annotations

import io
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memtp_sim.cli import _print_table, main
from memtp_sim.report import StudyResults, figures, load_results, numbers, rejection_notes, write_report

pytestmark = pytest.mark.filterwarnings("error")

PROFILE = "gfx1151-llama31-8b-q4km-vulkan"
DSPARK_LONG = "dspark(gamma=7, early_stop=False, fallback=True, probe_every=16)"
HARDWARE = {"name": "toy", "chip": "toy chip", "sources": {"verify": "by hand"}, "caveats": [],
            "sps": {"batch_tokens": [1, 2, 4, 8], "pass_ms": [10.0, 10.0, 20.0, 60.0]}}
RATIO_WORDS = ("ahead of", "near tie", "fastest per user with", "% lower")


def _text(path: Path) -> str:
    html = re.sub(r"<script.*?</script>", "", path.read_text(), flags=re.DOTALL)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)).replace("&#x27;", "'")


def _study(tmp_path: Path, trace_rows: list[tuple[int, int, int]], *, sweep: dict | None = None,
           policies: list[dict] | None = None, name: str = "degenerate") -> Path:
    trace = tmp_path / "trace.csv"
    trace.write_text("timestamp,input_length,output_length\n" + "".join(f"{t},{i},{o}\n" for t, i, o in trace_rows))
    doc: dict[str, Any] = {
        "name": name,
        "base": {"hardware": {"profile": PROFILE},
                 "workload": {"trace": str(trace), "mode": "closed_loop", "concurrency": 1, "num_requests": 10},
                 "policy": {"name": "no_spec"}},
    }
    if sweep:
        doc["sweep"] = sweep
    if policies:
        doc["policies"] = policies
    f = tmp_path / f"{name}.yaml"
    f.write_text(yaml.safe_dump(doc, sort_keys=False))
    return f


# ---------------------------------------------------------------------------------------------
# through the command line: the fresh-user repro


def test_a_study_that_rejects_every_request_says_so_and_names_no_winner(tmp_path, capsys):
    # fault: exit 0 with a numpy RuntimeWarning on the terminal, "no_spec, up to nan% ahead of
    # dspark(...)", and the reason (exceeds_max_model_len) only in summary.json
    f = _study(tmp_path, [(0, 100_000_000, 10)], sweep={"workload.concurrency": [1, 2]},
               policies=[{"name": "no_spec"}, {"name": "dspark"}])
    out = tmp_path / "out"
    assert main(["run", str(f), "--out", str(out), "--quiet", "--jobs", "1"]) == 0  # not a tool failure
    root = out / "degenerate"
    res = load_results(root)
    notes = rejection_notes(res)
    assert notes[0] == ("every request rejected in 4 of 4 run(s): exceeds_max_model_len (40); those runs measured "
                        "nothing (throughput 0, no latencies), so no policy is ranked on them")
    text = _text(root / "report.html")
    top = text.split("How to read this report", 1)[0]
    assert "Runs that measured nothing" in top and "every request rejected in 4 of 4 run(s)" in top
    assert not re.search(r"\bnan\b", text, flags=re.IGNORECASE)  # the page writes "-" for what was not measured
    rj = numbers.rejections(res)
    assert rj["reasons"].tolist() == ["exceeds_max_model_len: 10"] * 4
    assert "Rejected requests" in text and "exceeds_max_model_len: 10" in text
    for bad in ("nan%", "inf%", "ahead of", "near tie"):
        assert bad not in text, bad
    assert numbers.winners_notes(res) == [(
        "No policy is ranked: none of the study's 4 runs completed a request (see the rejected requests above), "
        "so there is no throughput or per-user speed to compare.")]
    cap = capsys.readouterr()
    err = cap.err
    assert "RuntimeWarning" not in err
    assert "warning: every request rejected in 4 of 4 run(s): exceeds_max_model_len (40)" in err  # the terminal says so
    # the terminal table marks what was not measured as the report does ("-"), never "nan"
    body = [ln for ln in cap.out.splitlines() if ln.startswith("│")]
    assert len(body) == 4 and not re.search(r"\bnan\b", cap.out, flags=re.IGNORECASE), cap.out
    assert all(" - " in ln for ln in body), cap.out  # e.g. user tok/s p50: no request finished


def test_partly_rejected_runs_list_their_reasons(tmp_path):
    # one prompt too long for the model, one that fits: every run rejects 1 and completes the rest
    f = _study(tmp_path, [(0, 100_000_000, 10), (1, 50, 20)], policies=[{"name": "no_spec"}, {"name": "mtp1"}])
    out = tmp_path / "out"
    assert main(["run", str(f), "--out", str(out), "--quiet", "--jobs", "1"]) == 0
    res = load_results(out / "degenerate")
    rj = numbers.rejections(res)
    assert len(rj) == 2 and (rj["completed"] > 0).all()
    assert set(rj["reasons"]) == {f"exceeds_max_model_len: {int(rj['rejected'].iloc[0])}"}
    notes = rejection_notes(res)
    assert len(notes) == 1 and notes[0].startswith(f"{int(rj['rejected'].sum())} request(s) rejected in 2 of 2 run(s) "
                                                   "that completed others: exceeds_max_model_len (")
    text = _text(write_report(out / "degenerate"))
    assert "Runs that measured nothing" not in text and "Rejected requests" in text


def test_a_single_run_study_renders(tmp_path):
    f = _study(tmp_path, [(0, 50, 20), (1, 60, 30)])
    out = tmp_path / "out"
    assert main(["run", str(f), "--out", str(out), "--quiet", "--jobs", "1"]) == 0
    res = load_results(out / "degenerate")
    assert len(res.table) == 1 and rejection_notes(res) == []
    assert numbers.winners_notes(res)[0].startswith("Only no_spec was run in this study")
    tt = numbers.terminal_table(res)
    assert tt.table["policy"].tolist() == ["no_spec"] and tt.legend == []


# ---------------------------------------------------------------------------------------------
# the terminal summary


def test_the_terminal_summary_fits_110_columns_with_one_line_per_row(tmp_path):
    # fault: a ~260-column table whose dspark label wrapped over 4 lines per row
    keys = {"engine.prefill": ["colocated", "disaggregated"], "workload.concurrency": [1, 2, 4, 8, 16, 32, 64]}
    policies = ["no_spec", "mtp1", "static(k=5)", DSPARK_LONG, "dspark(gamma=4, early_stop=True)"]
    rows = [{"run_id": f"r{i}", "engine.prefill": p, "workload.concurrency": c, "policy": pol, "seed": 0,
             "throughput_tok_per_s": 1234.5678, "tok_per_s_user_p50": 45.6, "tok_per_s_user_p10": 12.3,
             "ttft_s_p50": 1234.5, "tpot_ms_p50": 12.34, "mean_verify_len": 3.2, "tau": 2.7, "acceptance_rate": 0.7,
             "num_rejected": 0, "num_completed": 200}
            for i, (p, c, pol) in enumerate((p, c, pol) for p in keys["engine.prefill"]
                                             for c in keys["workload.concurrency"] for pol in policies)]
    res = StudyResults(tmp_path, {"name": "t", "sweep_keys": list(keys)}, pd.DataFrame(rows),
                       {r["run_id"]: {} for r in rows})
    tt = numbers.terminal_table(res)
    assert tt.legend == [f"dspark#1 = {DSPARK_LONG}", "dspark#2 = dspark(gamma=4, early_stop=True)",
                         "prefill = engine.prefill", "concurrency = workload.concurrency"]
    assert list(dict.fromkeys(tt.table["policy"])) == ["no_spec", "mtp1", "static(k=5)", "dspark#1", "dspark#2"]
    assert list(tt.table.columns[:3]) == ["prefill", "concurrency", "policy"]
    from rich.console import Console

    for width in (100, 110, 120):
        buf = io.StringIO()
        _print_table(tt.table, console=Console(width=width, file=buf, color_system=None))
        lines = buf.getvalue().splitlines()
        assert max(map(len, lines)) <= width
        tables = sum(ln.startswith("┏") for ln in lines)
        body = [ln for ln in lines if ln.startswith("│")]
        assert len(body) == len(tt.table) * tables, width  # one line per row: no label wraps
        assert tables == (1 if width >= 110 else tables), width  # one table from 110 columns on
        assert tables <= 2, width


@given(st.lists(st.text(alphabet="ab(=,)_#1", min_size=1, max_size=24), min_size=1, max_size=8, unique=True))
def test_short_policy_labels_are_unique(policies):
    short = numbers.short_policy_labels(policies)
    assert set(short) == set(policies)
    assert len(set(short.values())) == len(policies)
    assert all(v == p or len(v) < len(p) for p, v in short.items())


# ---------------------------------------------------------------------------------------------
# property: arbitrary NaN / zero / ordinary values never make a ratio, a winner or a warning

VALUES = st.sampled_from([float("nan"), 0.0, 1.0, 2.0, 50.0, 1e-12])
POLICIES = ["no_spec", "mtp1", DSPARK_LONG, "dspark_async(lag_rounds=2)", "static(k=5)"]


@st.composite
def _degenerate_study(draw) -> StudyResults:
    pols = draw(st.lists(st.sampled_from(POLICIES), min_size=1, max_size=3, unique=True))
    xs = draw(st.sampled_from([[], [1], [1, 2, 4], ["ewma", "tower"]]))
    seeds = draw(st.sampled_from([[0], [0, 1]]))
    rows, summaries = [], {}
    for x in xs or [None]:
        for pol in pols:
            for seed in seeds:
                rid = f"r{len(rows)}"
                completed = draw(st.sampled_from([0, 0, 3]))
                rejected = draw(st.sampled_from([0, 2, 5]))
                row = {"run_id": rid, "policy": pol, "seed": seed, "num_completed": completed,
                       "num_rejected": rejected, "num_requests": completed + rejected, "num_not_arrived": 0}
                if xs:
                    row["x"] = x
                for m in ("throughput_tok_per_s", "tok_per_s_user_p50", "tok_per_s_user_p10", "ttft_s_p50",
                          "tpot_ms_p50", "mean_verify_len", "tau", "acceptance_rate", "early_stop_gap_frac",
                          "draft_time_frac", "offered_load_ratio", "ece_raw_mean", "ece_mean", "auc_mean"):
                    row[m] = draw(VALUES)
                rows.append(row)
                by = {"exceeds_max_model_len": rejected} if rejected and draw(st.booleans()) else {}
                summaries[rid] = {"provenance": {"hardware": HARDWARE}, "scenario": {"memtp": {"depth": None}},
                                  "metrics": {"rejected_by_reason": by}}
    meta = {"name": "fuzz", "sweep_keys": ["x"] if xs else []}
    return StudyResults(Path("/nonexistent-study"), meta, pd.DataFrame(rows), summaries)


def _ranked_ok(res: StudyResults, w: pd.DataFrame) -> None:
    """Every named leader and runner-up has a finite mean and completed requests at each point."""
    x = res.x_key
    agg = numbers.aggregate(res.table, ([x] if x else []) + ["policy"],
                            ["throughput_tok_per_s", "tok_per_s_user_p50", "num_completed"])
    for _, span in w.iterrows():
        for who in (span["policy"], span["runner_up"]):
            if not who:
                continue
            pts = agg[agg["policy"] == who]
            if x:
                pts = pts[pts[x].isin(span["xs"])]
            assert np.isfinite(pts[f"{span['metric']}_mean"]).all() and (pts["num_completed_mean"] > 0).all()
        assert not np.isinf(span["lead"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_degenerate_study())
def test_report_numbers_never_state_a_ratio_from_nan_or_zero(res):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        w = numbers.winners(res)
        notes = (numbers.winners_notes(res) + numbers.dspark_losses(res) + numbers.overload_notes(res)
                 + numbers.rejection_notes(res) + numbers.cliff_notes(numbers.cliffs(res)))
        numbers.dspark_gaps(res)
        numbers.headline_table(res)
        numbers.terminal_table(res)
        numbers.rejections(res)
        numbers.calibration_table(res)
        numbers.sps_curve(res)
        numbers.latency_samples(res, res.table, res.x_key)
        pts = numbers.frontier_points(res.table, res.x_key)
        figures.frontier_figure(pts, res.x_key, figures.color_map(res.policies))
        if res.x_key:
            figures.load_figure(numbers.load_curves(res.table, res.x_key), res.x_key, figures.color_map(res.policies))
    text = " ".join(notes)
    assert not re.search(r"\b(nan|inf)\b", text, flags=re.IGNORECASE), text  # no number printed from NaN / 0
    _ranked_ok(res, w)
    if not (res.table["num_completed"] > 0).any():
        assert not any(word in text for word in RATIO_WORDS), text
        assert any(n.startswith(("every request rejected", "no request completed")) for n in notes)


def test_phase_notes_skip_phases_where_nothing_finished():
    ph = pd.DataFrame({"variant": ["a", "b", "a", "b"], "memtp.depth": ["16", "elastic", "16", "elastic"],
                       "policy": ["p"] * 4, "phase": ["1: 0.1 req/s"] * 2 + ["2: 1 req/s"] * 2,
                       "requests": [3, 3, 5, 5], "rejected": [0, 0, 5, 5],
                       "tok/s/user p50": [10.0, 9.94, np.nan, np.nan], "TTFT p50 s": [1.0] * 4,
                       "queue p90 s": [1.0] * 4, "mean depth": [16.0, 6.0, 16.0, np.nan], "peak KV GiB": [1.0] * 4})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        notes = numbers.phase_notes(ph, "variant")
    # the labels name both keys that differ (variant and depth), and a 0.5% lead is a near tie
    assert notes[0] == ("p, phase 1: 0.1 req/s: fastest per user: near tie, variant = a, memtp.depth = 16 and "
                        "variant = b, memtp.depth = elastic within 1% (10.0 tok/s/user p50); elastic 9.9 at mean depth 6.0")
    assert notes[1] == ("p, phase 2: 1 req/s: no request that arrived in this phase finished; elastic no request "
                        "finished; rejected: variant = a, memtp.depth = 16: 5, variant = b, memtp.depth = elastic: 5")

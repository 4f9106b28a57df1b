"""``calibrate check``: leave-one-out error of the cost lookup, cliffs, cost-table variants, the
sensitivity numbers and the CLI (memtp_sim.hardware.fidelity, memtp_sim.report.fidelity).

Every shipped profile is checked (LOO, variants) with whatever ``list_profiles()`` returns, so a
profile added later is covered; the sensitivity run itself runs once, on the default profile, at
``--quick`` size.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from _sim_helpers import TRACE
from memtp_sim.cli import main
from memtp_sim.hardware import DEFAULT_PROFILE, SPSTable, list_profiles, load_profile
from memtp_sim.hardware import fidelity as hf
from memtp_sim.report import fidelity as rf
from memtp_sim.report import numbers

PROFILES = sorted(list_profiles())
FIX = Path(__file__).resolve().parent / "fixtures" / "calibration"


def _table(b, ms, *, below_min="error", beyond_max="roofline") -> SPSTable:
    return SPSTable(np.array(b), np.array(ms, dtype=float), below_min=below_min, beyond_max=beyond_max)


# ------------------------------------------------------------------------------ leave-one-out

def test_loo_on_a_linear_curve_is_exact():
    # t = 5 + 0.5 B ms: linear interpolation between any two points of a line, and the roofline
    # (the line through the last two remaining points) at the top, give the line back exactly.
    b = [1, 2, 4, 8, 16, 32]
    loo = hf.leave_one_out(_table(b, [5 + 0.5 * x for x in b]))
    assert loo["how"].iloc[0] == "refused (below_min: error)" and np.isnan(loo["rel_error"].iloc[0])
    assert list(loo["how"].iloc[1:-1]) == ["interpolated"] * 4 and loo["how"].iloc[-1] == "beyond_max roofline"
    assert np.allclose(loo["rel_error"].iloc[1:], 0.0, atol=1e-12)
    # below_min flat prices B=1 at the next measured point: (6.0 - 5.5) / 5.5
    flat = hf.leave_one_out(_table(b, [5 + 0.5 * x for x in b], below_min="flat"))
    assert flat["rel_error"].iloc[0] == pytest.approx(0.5 / 5.5)


def test_loo_next_to_a_cliff_is_the_hand_computed_error():
    # B:  1   2   4   8   16    pass time jumps 2x between B=4 and B=8 (a pass_jump cliff)
    # ms: 10  10  10  20  20
    # leave out B=2:  between (1, 10) and (4, 10)             -> 10            error 0
    # leave out B=4:  between (2, 10) and (8, 20) at 4         -> 10 + 2/6 x 10 = 13.333  error +1/3
    # leave out B=8:  between (4, 10) and (16, 20) at 8        -> 10 + 4/12 x 10 = 13.333 error -1/3
    # leave out B=16: roofline through (4, 10), (8, 20) at 16  -> 20 + 8 x 10/4 = 40      error +1
    # leave out B=1:  below_min error                           -> refused
    t = _table([1, 2, 4, 8, 16], [10, 10, 10, 20, 20])
    loo = hf.leave_one_out(t).set_index("batch_tokens")
    assert np.isnan(loo.loc[1, "rel_error"])
    assert loo.loc[2, "rel_error"] == pytest.approx(0.0, abs=1e-12)
    assert loo.loc[4, "rel_error"] == pytest.approx(1 / 3)
    assert loo.loc[8, "rel_error"] == pytest.approx(-1 / 3)
    assert loo.loc[16, "rel_error"] == pytest.approx(1.0)
    assert loo.loc[4, "predicted_ms"] == pytest.approx(40 / 3)
    summ = hf.loo_summary(hf.leave_one_out(t))
    assert summ.loc[0, "num_refused"] == 1 and summ.loc[0, "b_at_max"] == 16
    assert summ.loc[0, "interior_mean_abs_error"] == pytest.approx((0 + 1 / 3 + 1 / 3) / 3)
    cl = hf.cliff_errors({"verify": t}, hf.leave_one_out(t))
    assert list(cl["cliff"]) == ["verify B=4->8"] and cl.loc[0, "kind"] == "pass_jump"
    assert cl.loc[0, "loo_error_from"] == pytest.approx(1 / 3) and cl.loc[0, "loo_error_to"] == pytest.approx(-1 / 3)
    # beyond_max error refuses the last point instead of extrapolating it
    last = hf.leave_one_out(_table([1, 2, 4, 8, 16], [10, 10, 10, 20, 20], beyond_max="error"))
    assert last["how"].iloc[-1] == "refused (beyond_max: error)"


def test_cliffs_on_a_hand_made_curve_and_the_study_report_lists_the_same():
    # B:    1    2    4    8   16   32
    # ms:  10   10   10   20   25   60   -> 4->8: x2.0 jump (rate 0.4 -> 0.4: not a drop);
    # 16->32: rate 0.64 -> 0.533 (-17%): a drop; 8->16: x1.25, rate up: nothing
    b, ms = [1, 2, 4, 8, 16, 32], [10.0, 10.0, 10.0, 20.0, 25.0, 60.0]
    ours = hf.find_cliffs(b, ms)
    assert ours[["b_from", "b_to", "kind"]].values.tolist() == [[4, 8, "pass_jump"], [16, 32, "rate_drop"]]
    res = SimpleNamespace(first_summary={"provenance": {"hardware": {"sps": {"batch_tokens": b, "pass_ms": ms}}}})
    theirs = numbers.cliffs(res)
    assert theirs[["b_from", "b_to", "kind"]].values.tolist() == ours[["b_from", "b_to", "kind"]].values.tolist()
    assert theirs["verify_tok_per_s_from"].tolist() == [400.0, 640.0]  # 1000 x B / pass_ms
    assert theirs["verify_tok_per_s_to"].tolist() == [400.0, 1000.0 * 32 / 60.0]
    # a pass time that is not above 0 (a broken summary) makes no cliff and no warning
    assert hf.find_cliffs([1, 2, 4], [10.0, 0.0, 30.0]).empty


@pytest.mark.parametrize("name", PROFILES)
def test_every_shipped_profile_has_a_loo_report(name):
    prof = load_profile(name)
    fid = hf.check_profile(prof)
    curves = hf.profile_curves(prof)
    assert list(fid.summary["curve"]) == list(curves)
    for c, t in curves.items():
        d = fid.loo[fid.loo["curve"] == c]
        assert d["batch_tokens"].tolist() == t.batch_tokens.tolist()
        assert np.allclose(d["measured_ms"], t.pass_ms)
        inner = d[d["how"] == "interpolated"]
        assert inner["rel_error"].notna().all()
    for cl in fid.cliffs.itertuples():
        assert cl.b_from in curves[cl.curve].batch_tokens and cl.b_to in curves[cl.curve].batch_tokens
    if not fid.pairs.empty:  # format 2 with context pairs: modelled deltas are the fit's
        assert fid.pairs["modelled_delta_ms"].ge(0).all()


# ------------------------------------------------------------------------------ variants

def _tables(p):
    return [p.sps, p.decode_table, p.prefill_table]


def _same_drafters(a, b) -> bool:
    grid = [(r, g) for r in (1, 4, 32) for g in (1, 3, 7)]
    return all(da.round_time_s(r, g) == db.round_time_s(r, g) for da, db in
               [(a.drafter, b.drafter)] + [(a.drafters[k], b.drafters[k]) for k in a.drafters] for r, g in grid)


@pytest.mark.parametrize("name", PROFILES)
def test_scaled_variant_changes_every_pass_by_exactly_the_factor(name, tmp_path):
    prof = load_profile(name)
    for factor in (0.75, 1.25):
        var = load_profile(hf.write_variant(prof, tmp_path, factor=factor))
        assert var.name == f"{prof.name}~x{factor:.2f}"
        for t0, t1 in zip(_tables(prof), _tables(var)):
            b = np.arange(t0.min_batch_tokens, t0.max_batch_tokens + 1)
            assert np.allclose(t1.pass_time_s(b), factor * t0.pass_time_s(b), rtol=1e-9, atol=0)
            at0, at1 = t0.at_context(8, 4096, 20000), t1.at_context(8, 4096, 20000)
            assert np.allclose(at1.pass_time_s(b), factor * at0.pass_time_s(b), rtol=1e-9, atol=0)
        # only the pass curves move
        assert _same_drafters(prof, var) and var.overheads.host_s == prof.overheads.host_s
        assert var.memory == prof.memory


@pytest.mark.parametrize("name", PROFILES)
def test_flat_variant_is_flat(name, tmp_path):
    prof = load_profile(name)
    var = load_profile(hf.write_variant(prof, tmp_path, factor=None))
    want = hf.flat_pass_ms(prof) / 1000.0
    for t in _tables(var):
        top = max(t.graph_sizes) if t.graph_sizes else t.max_batch_tokens  # above it: the eager factor
        b = np.arange(t.min_batch_tokens, min(top, t.max_batch_tokens) + 1)
        assert np.allclose(t.pass_time_s(b), want, rtol=1e-12)
        assert np.allclose(t.at_context(16, 8192, 100000).pass_time_s(b), want, rtol=1e-12)
    assert _same_drafters(prof, var)


def _imported_profile(tmp_path):
    """A profile as `calibrate import` writes it from llama-bench output: no drafter passes were
    measured, so its assumed drafter is priced from the target's verify rows."""
    import argparse

    from memtp_sim.hardware.importers import cli_import

    out = tmp_path / "imported" / "qwen25-7b.yaml"
    args = argparse.Namespace(file=str(FIX / "llama_bench.json"), fmt="llama-bench", select=[], output=str(out),
                              name=None, memory=["gpu_allocatable_gib=20", "weights_bytes=4677120000",
                                                 "kv_shape=28,4,128", "max_model_len=32768"])
    assert cli_import(args) == 0
    prof = load_profile(out)
    assert prof.drafters["assumed_block"].source  # the fault's precondition: a drafter on verify rows
    return prof


def _format1_drafter_on_verify_rows(tmp_path):
    """The default format-1 profile with its drafter measured on the very rows its verify curve uses."""
    import shutil

    import yaml

    src = load_profile("gfx1151-llama31-8b-q4km-vulkan")
    doc = yaml.safe_load(open(src.path))
    doc["drafter"]["parallel_select"] = dict(doc["verify"]["select"])
    doc["drafter"]["parallel_tests"] = {"small": "pp1", "large": "pp512"}
    doc["name"] = "overlap"
    folder = tmp_path / "overlap"
    folder.mkdir()
    shutil.copy(Path(src.path).parent / doc["measurements"], folder / doc["measurements"])
    (folder / "overlap.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return load_profile(folder / "overlap.yaml")


@pytest.mark.parametrize("build", [_imported_profile, _format1_drafter_on_verify_rows])
def test_variants_freeze_a_drafter_priced_from_the_verify_rows(build, tmp_path):
    prof = build(tmp_path)
    for factor in (0.75, 1.25, None):
        var = load_profile(hf.write_variant(prof, tmp_path / "variants", factor=factor))
        assert _same_drafters(prof, var), factor
        b = np.arange(prof.sps.min_batch_tokens, prof.sps.max_batch_tokens + 1)
        want = (factor * prof.sps.pass_time_s(b) if factor is not None
                else np.full(b.shape, hf.flat_pass_ms(prof) / 1000.0))
        top = max(var.sps.graph_sizes) if var.sps.graph_sizes else var.sps.max_batch_tokens
        keep = b <= top
        assert np.allclose(var.sps.pass_time_s(b[keep]), want[keep], rtol=1e-9)
        # and a variant of the variant keeps it still
        again = load_profile(hf.write_variant(var, tmp_path / "again", factor=1.1))
        assert _same_drafters(prof, again)


def test_variant_of_an_unknown_profile_layout_is_refused(tmp_path):
    y = tmp_path / "odd.yaml"
    y.write_text("name: odd\nverify: {table: {1: 10.0}}\n")
    odd = SimpleNamespace(path=str(y), name="odd", decode_table=_table([1, 2], [10.0, 11.0]))
    with pytest.raises(ValueError, match="neither 'costs'"):
        hf.write_variant(odd, tmp_path / "out", factor=1.1)


def test_variant_factor_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="factor"):
        hf.write_variant(load_profile(DEFAULT_PROFILE), tmp_path, factor=0.0)


# ------------------------------------------------------------------------------ sensitivity numbers

def _runs(rows):
    cols = ["variant", "load", "policy", "seed", "throughput_tok_per_s", "tok_per_s_user_p50", "mean_verify_len"]
    df = pd.DataFrame(rows, columns=cols)
    df["concurrency"], df["tau"], df["extrapolated_cost_frac"], df["wall_s"], df["error"] = 1, 1.0, 0.0, 0.0, ""
    return df


def test_winner_flips_ties_and_changes_by_hand():
    rows = [
        # measured: B wins throughput (110 > 100), A wins p50 (50 > 40)
        ("measured", "L", "A", 0, 100.0, 50.0, 2.0), ("measured", "L", "B", 0, 110.0, 40.0, 5.0),
        # flat: A leads B by 120 / 100 - 1 = 20% -> flipped; p50 A still wins -> same
        ("flat", "L", "A", 0, 120.0, 60.0, 6.0), ("flat", "L", "B", 0, 100.0, 40.0, 5.0),
        # x1.10: A leads B by 100.5 / 100 - 1 = 0.5% -> tie (within TIE = 1%)
        ("x1.10", "L", "A", 0, 100.5, 45.0, 2.0), ("x1.10", "L", "B", 0, 100.0, 36.0, 5.0),
    ]
    s = rf.sensitivity_numbers(_runs(rows))
    w = s.winners.set_index(["variant", "metric"])
    assert w.loc[("measured", "throughput"), "status"] == "same"
    assert w.loc[("flat", "throughput"), "status"] == "flipped"
    assert w.loc[("flat", "throughput"), "margin"] == pytest.approx(0.2)
    assert w.loc[("flat", "p50 tok/s/user"), "status"] == "same"
    assert w.loc[("x1.10", "throughput"), "status"] == "tie"
    by = s.by_policy.set_index(["variant", "policy"])
    assert by.loc[("flat", "A"), "throughput_change"] == pytest.approx(0.2)
    assert by.loc[("flat", "A"), "verify_len_change"] == pytest.approx(4.0)
    sw = s.swing.set_index("variant")
    assert sw.loc["flat", "num_flips"] == 1 and sw.loc["x1.10", "num_flips"] == 0
    assert sw.loc["flat", "max_abs_throughput_change"] == pytest.approx(0.2)
    assert any("A at L" in n and "flat 6.00" in n for n in s.notes)


def test_a_users_scenario_runs_at_its_own_load_with_its_own_policy(tmp_path):
    y = tmp_path / "scen.yaml"
    y.write_text(f"workload: {{trace: {TRACE}, mode: closed_loop, concurrency: 2, num_requests: 4}}\n"
                 "policy: {name: static, k: 3}\n")
    prof = load_profile(DEFAULT_PROFILE)
    plan = rf.plan_from_scenario(y, prof, quick=True)
    assert plan.levels == (None,) and plan.seeds == (0,) and plan.policies[-1] == {"name": "static", "k": 3}
    runs = rf.run_sensitivity(prof, plan, tmp_path / "variants")
    assert (runs["error"] == "").all() and set(runs["load"]) == {"as given"}
    assert len(runs) == len(rf.VARIANTS) * len(plan.policies)
    s = rf.sensitivity_numbers(runs)
    static3 = s.by_policy[(s.by_policy["policy"] == "static(k=3)") & (s.by_policy["variant"] == "measured")]
    assert static3["mean_verify_len"].iloc[0] == pytest.approx(3.0)


# ------------------------------------------------------------------------------ CLI

def test_calibrate_check_writes_the_report(tmp_path, capsys):
    code = main(["calibrate", "check", DEFAULT_PROFILE, "--quick", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0
    folder = tmp_path / DEFAULT_PROFILE
    html = (folder / "report.html").read_text()
    assert "Leave-one-out" in html and "Sensitivity" in html and "plotly" in html.lower()
    assert "leave-one-out" in out and "report:" in out
    runs = pd.read_csv(folder / "sensitivity_runs.csv")
    assert set(runs["variant"]) == set(rf.VARIANTS) and runs["error"].isna().all()
    assert (folder / "variants").is_dir() and any((folder / "variants").glob("*.yaml"))


def test_calibrate_check_on_a_bad_profile_is_one_error_line(tmp_path, capsys):
    code = main(["calibrate", "check", "no-such-profile", "--quick", "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error:") and "no-such-profile" in err[0]


def test_calibrate_check_refuses_an_unwritable_out_before_running(tmp_path, capsys, monkeypatch):
    """The check runs dozens of simulations: an --out it cannot write must fail first, not last."""
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    ran = []
    monkeypatch.setattr(rf, "run_sensitivity", lambda *a, **k: ran.append(1))
    code = main(["calibrate", "check", DEFAULT_PROFILE, "--quick", "--out", str(blocker)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and not ran
    assert err[-1].startswith("error:") and "cannot write results here" in err[-1] and "--out" in err[-1]


def test_the_printed_loo_table_states_no_error_for_a_curve_of_fewer_than_three_points():
    # fresh user: a 2-point imported profile printed a mean LOO error of 3313.6% beside the note
    # that leave-one-out needs at least 3 points (each point left out is extrapolated from one)
    from memtp_sim.report.fidelity import _summary_lines

    t = _table([1, 512], [20.0, 600.0], below_min="flat")
    loo = hf.leave_one_out(t, "verify")
    summary = hf.loo_summary(loo)
    assert summary["num_points"].iloc[0] == 2 and summary["mean_abs_error"].iloc[0] > 1  # the meaningless number
    fid = hf.Fidelity("two", "two.yaml", loo, summary, hf.cliff_errors({"verify": t}, loo), pd.DataFrame(),
                      ["verify: 2 measured point(s); leave-one-out needs at least 3"])
    row = next(line for line in _summary_lines(fid, None) if line.strip().startswith("verify"))
    assert row.split() == ["verify", "2", str(summary["num_refused"].iloc[0]), "-", "-", "-", "-"]
    assert "%" not in row

"""The study report's numbers, checked against hand-computed values on hand-written studies.

Two tiny study folders are written by hand (runs.csv, study.json, runs/<id>/summary.json,
requests.csv, rounds.parquet), so every mean, spread, bin and verdict below can be worked out on
paper:

* ``load``: mtp1 vs dspark over workload.concurrency 1..32, two seeds, no acceptance block in the
  summaries (the page must still render) and no calibration;
* ``memtp``: one DSpark policy over memtp.depth 1 / elastic with a two-phase load ramp; only the
  elastic run drafts (and stores calibration for) positions beyond 1.
"""

from __future__ import annotations

import io
import hashlib
import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from memtp_sim.report import (
    StudyResults,
    aggregate,
    dspark_losses,
    figures,
    headline_table,
    load_results,
    numbers,
    phase_table,
    winners_notes,
    write_report,
)

MTP1, DSPARK = "mtp1", "dspark(gamma=7)"
X = "workload.concurrency"
# (concurrency, policy) -> per seed (throughput tok/s, tok/s/user p50)
LOAD_POINTS = {
    (1, MTP1): [(100.0, 50.0), (110.0, 54.0)],
    (1, DSPARK): [(120.0, 60.0), (130.0, 64.0)],
    (4, MTP1): [(200.0, 30.0), (210.0, 30.0)],
    (4, DSPARK): [(230.0, 35.0), (240.0, 37.0)],
    (8, MTP1): [(290.0, 20.0), (310.0, 20.0)],   # DSpark 3% behind, but the seeds spread 9%
    (8, DSPARK): [(281.0, 21.0), (301.0, 21.0)],
    (16, MTP1): [(400.0, 10.0), (400.0, 10.0)],  # DSpark 23.75% behind: listed
    (16, DSPARK): [(300.0, 9.0), (310.0, 9.0)],
    (32, MTP1): [(500.0, 5.0), (500.0, 5.0)],    # DSpark 1.6% behind, no spread: within the 2% margin
    (32, DSPARK): [(492.0, 5.02), (492.0, 5.02)],
}
HARDWARE = {"name": "toy", "chip": "toy chip", "sources": {"verify": "by hand"}, "caveats": [],
            "sps": {"batch_tokens": [1, 2, 4, 8], "pass_ms": [10.0, 10.0, 20.0, 60.0]}}


def _summary(*, depth: Any = None, schedule: list | None = None, calibration: dict | None = None,
             acceptance: dict | None = None) -> dict[str, Any]:
    prov: dict[str, Any] = {"hardware": HARDWARE}
    if acceptance is not None:
        prov["acceptance"] = acceptance
    return {"memtp_sim_version": "0.0-test", "provenance": prov,
            "scenario": {"memtp": {"depth": depth}, "workload": {"rate_schedule": schedule}},
            "metrics": {"calibration_by_position": calibration} if calibration else {}}


def _write_study(root: Path, meta: dict, runs: list[dict], files: dict[str, dict[str, Any]]) -> Path:
    """runs: runs.csv rows; files: run_id -> {"summary": dict, "requests": DataFrame, "rounds": DataFrame}.

    Written the way the study runner writes them: each summary carries its run's labels, seed and
    metrics and the size and digest of its files, and study.json lists the study's runs (the report
    rebuilds its table from these, not from runs.csv)."""
    root.mkdir(parents=True)
    label_keys = list(meta.get("sweep_keys", [])) + ["policy"]
    planned = []
    for row in runs:
        rid = str(row["run_id"])
        labels = {k: row[k] for k in label_keys if k in row}
        metrics = {k: v for k, v in row.items() if k not in labels and k not in ("run_id", "seed")}
        f = files.setdefault(rid, {"summary": {}})
        d = root / "runs" / rid
        d.mkdir(parents=True)
        blobs = {"requests.csv": f["requests"].to_csv(index=False).encode() if "requests" in f else b"status\n"}
        pbuf = io.BytesIO()
        (f["rounds"] if "rounds" in f else pd.DataFrame({"start_s": []})).to_parquet(pbuf)
        blobs["rounds.parquet"] = pbuf.getvalue()
        for name, data in blobs.items():
            (d / name).write_bytes(data)
        summary = dict(f["summary"])
        summary.update(run_id=rid, labels=labels, seed=row["seed"], status="ok",
                       metrics={**summary.get("metrics", {}), **metrics},
                       files={n: {"bytes": len(b), "sha256": hashlib.sha256(b).hexdigest()} for n, b in blobs.items()})
        (d / "summary.json").write_text(json.dumps(summary))
        planned.append({"run_id": rid, "labels": labels, "seed": row["seed"]})
    (root / "study.json").write_text(json.dumps({**meta, "runs": planned}))
    pd.DataFrame(runs).to_csv(root / "runs.csv", index=False)
    return root


def _requests(tok_per_s_user: list[float], status: list[str] | None = None,
              arrival: list[float] | None = None) -> pd.DataFrame:
    n = len(tok_per_s_user)
    t = np.asarray(tok_per_s_user, dtype=float)
    return pd.DataFrame({
        "status": status or ["finished"] * n, "arrival_at_s": arrival or [float(i) for i in range(n)],
        "queue_s": [0.1 * (i + 1) for i in range(n)], "ttft_s": [1.0 + i for i in range(n)],
        "e2e_s": [10.0 + i for i in range(n)], "tok_per_s_user": t})


@pytest.fixture
def load_study(tmp_path) -> Path:
    runs, files = [], {}
    for (c, pol), seeds in LOAD_POINTS.items():
        for seed, (thr, user) in enumerate(seeds):
            rid = f"{len(runs):04d}-toy"
            ds = pol == DSPARK
            runs.append({
                "run_id": rid, X: c, "policy": pol, "seed": seed, "throughput_tok_per_s": thr,
                "tok_per_s_user_p50": user, "tok_per_s_user_p10": user / 2, "ttft_s_p50": 1.0, "tpot_ms_p50": 1000 / user,
                "mean_verify_len": 3.0 if ds else 1.0, "tau": 2.5 if ds else 1.7, "acceptance_rate": 0.7,
                "num_rejected": 0, "early_stop_gap_frac": (0.25 if c == 16 else 0.0) if ds else float("nan"),
                "draft_time_frac": (0.30 if c == 16 else 0.12) if ds else 0.10,
                "ece_raw_mean": float("nan"), "ece_mean": float("nan"), "auc_mean": float("nan")})
            files[rid] = {"summary": _summary(), "requests": _requests([50.0, 25.0, 1.0], ["finished", "finished", "rejected"])}
    meta = {"name": "toyload", "description": "hand-made", "sweep_keys": [X]}
    return _write_study(tmp_path / "toyload", meta, runs, files)


# ---- memtp study: rounds of the elastic run, seed 0 (start_s, duration_s, depth, free, kv, coherence, waiting)
ELASTIC_ROUNDS = [
    (0.0, 10.0, 2, 10.0, 1.0, 0.5, 0),
    (10.0, 30.0, 4, 8.0, 2.0, 1.0, 1),
    (50.0, 20.0, 6, 6.0, 3.0, 0.8, 2),    # starts in bin [0, 60) although it ends at 70 s
    (70.0, 40.0, 3, 9.0, 4.0, 0.6, 0),
    (130.0, 10.0, 5, 7.0, 5.0, 0.9, 3),
    (150.0, 30.0, 1, 11.0, 1.0, 0.4, 0),
]
RAMP = [{"duration_s": 100.0, "rate_per_s": 0.5}, {"duration_s": 100.0, "rate_per_s": 0.1}]
POLICY16 = "dspark(gamma=16)"


def _rounds(rows: list[tuple], depth_shift: float = 0.0) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=["start_s", "duration_s", "depth", "free_gib", "kv_gib", "coherence", "num_waiting"])
    df["depth"] = df["depth"].astype(float) + depth_shift
    return df


def _curve(p: float) -> dict:
    return {"mean_prob": [p, p + 0.5], "frac_positive": [p - 0.1, p + 0.3], "counts": [10, 20]}


def _calibration(n_positions: int) -> dict:
    rel = {f"{kind}_{k}": _curve(0.1 * k) for k in range(1, n_positions + 1) for kind in ("raw", "used")}
    return {"num_request_rounds": [100] * n_positions, "reliability": rel}


@pytest.fixture
def memtp_study(tmp_path) -> Path:
    runs, files = [], {}
    acc = {"name": "toy-acc", "source": "by hand", "fit_gamma": 7, "targets_tau": {"chat": 3.5},
           "conditional_acceptance": {"chat": [0.9] * 8}}
    arrivals = [5.0, 50.0, 90.0, 120.0, 150.0]
    for depth in ("1", "elastic"):
        for seed in (0, 1):
            rid = f"{len(runs):04d}-toy"
            runs.append({"run_id": rid, "memtp.depth": depth, "policy": POLICY16, "seed": seed,
                         "throughput_tok_per_s": 30.0, "tok_per_s_user_p50": 5.0, "tok_per_s_user_p10": 2.0,
                         "ttft_s_p50": 1.0, "tpot_ms_p50": 200.0, "mean_verify_len": 1.0, "tau": 1.5,
                         "acceptance_rate": 0.7, "num_rejected": 1, "early_stop_gap_frac": 0.0,
                         "draft_time_frac": 0.1, "queue_s_p90": 1.0, "mean_depth": 1.0, "mean_heads_gib": 4.0,
                         "mean_kv_gib": 2.0, "peak_kv_gib": 5.0,
                         "ece_raw_mean": 0.1, "ece_mean": 0.05, "auc_mean": 0.7})
            if depth == "elastic":  # rejects the request arriving at 120 s; 10..40 tok/s/user
                rq = _requests([10.0, 20.0, 30.0, float("nan"), 40.0],
                               ["finished", "finished", "finished", "rejected", "finished"], arrivals)
                rd, cal = _rounds(ELASTIC_ROUNDS, depth_shift=2.0 * seed), _calibration(5)
            else:  # depth 1: twice as fast per user, nothing rejected, one draft position only
                rq = _requests([20.0, 40.0, 60.0, 70.0, 80.0], None, arrivals)
                rd, cal = _rounds([(r[0], r[1], 1, *r[3:]) for r in ELASTIC_ROUNDS]), _calibration(1)
            files[rid] = {"summary": _summary(depth=1 if depth == "1" else "elastic", schedule=RAMP,
                                              calibration=cal, acceptance=acc),
                          "requests": rq, "rounds": rd}
    meta = {"name": "toymemtp", "sweep_keys": ["memtp.depth"]}
    return _write_study(tmp_path / "toymemtp", meta, runs, files)


# ---------------------------------------------------------------------------------------------
# aggregation, headline, frontier, load curves


def test_aggregate_means_sds_and_seed_counts_in_study_order(load_study):
    res = load_results(load_study)
    agg = aggregate(res.table, [X, "policy"], ["throughput_tok_per_s", "tok_per_s_user_p50"])
    assert list(zip(agg[X], agg["policy"])) == list(LOAD_POINTS)  # YAML order, not sorted
    row = agg[(agg[X] == 1) & (agg["policy"] == MTP1)].iloc[0]
    assert row["throughput_tok_per_s_mean"] == pytest.approx(105.0)
    assert row["throughput_tok_per_s_sd"] == pytest.approx(math.sqrt(50.0))  # ddof=1: (25 + 25) / 1
    assert row["tok_per_s_user_p50_sd"] == pytest.approx(math.sqrt(8.0))
    assert row["num_seeds"] == 2
    one_seed = aggregate(res.table[res.table["seed"] == 0], [X, "policy"], ["throughput_tok_per_s"])
    assert (one_seed["throughput_tok_per_s_sd"] == 0.0).all() and (one_seed["num_seeds"] == 1).all()


def test_headline_table_columns_and_means(load_study):
    res = load_results(load_study)
    h = headline_table(res)
    assert list(h.columns[:3]) == [X, "policy", "throughput tok/s"]
    assert "mean depth" not in h  # no MEMTP ensemble in this study
    assert h.loc[(h[X] == 16) & (h["policy"] == DSPARK), "throughput tok/s"].item() == pytest.approx(305.0)


def test_headline_table_adds_memory_columns_with_memtp(memtp_study):
    h = headline_table(load_results(memtp_study))
    assert list(h.columns[-5:]) == ["queue p90 s", "mean depth", "heads GiB", "KV GiB mean", "KV GiB peak"]


def test_frontier_points_sort_each_policy_by_load(load_study):
    res = load_results(load_study)
    shuffled = res.table.iloc[::-1]  # policies now appear dspark first, loads descending
    pts = numbers.frontier_points(shuffled, X)
    assert list(dict.fromkeys(pts["policy"])) == [DSPARK, MTP1]
    assert pts[pts["policy"] == MTP1][X].tolist() == [1, 4, 8, 16, 32]
    d16 = pts[(pts["policy"] == DSPARK) & (pts[X] == 16)].iloc[0]
    assert d16["throughput_tok_per_s_mean"] == pytest.approx(305.0)
    assert d16["throughput_tok_per_s_sd"] == pytest.approx(math.sqrt(50.0))
    assert d16["tok_per_s_user_p50_mean"] == pytest.approx(9.0) and d16["tok_per_s_user_p50_sd"] == 0.0
    fig = figures.frontier_figure(pts, X, figures.color_map([MTP1, DSPARK]))
    assert [t.name for t in fig.data] == [DSPARK, MTP1]
    assert list(fig.data[1].y) == pytest.approx([105.0, 205.0, 300.0, 400.0, 500.0])


def test_load_curves_verify_budget_counts_the_bonus_token(load_study):
    curves = numbers.load_curves(load_results(load_study).table, X)
    assert set(curves.loc[curves["policy"] == MTP1, "verify_budget_mean"]) == {2.0}
    assert set(curves.loc[curves["policy"] == DSPARK, "verify_budget_mean"]) == {4.0}
    fig = figures.load_figure(curves, X, figures.color_map([MTP1, DSPARK]))
    assert fig.layout.title.text == "Load sweep (paper Fig. 8)" and len(fig.data) == 6


def test_latency_samples_finished_requests_of_the_first_seed(load_study):
    res = load_results(load_study)
    lat = numbers.latency_samples(res, res.table, X)
    assert lat.seed == 0
    s = lat.samples
    assert len(s) == 2 * len(LOAD_POINTS)  # 2 finished requests per run (the rejected one is left out)
    first = s.iloc[:2]
    assert first["policy"].tolist() == [MTP1, MTP1] and first["x_value"].tolist() == ["1", "1"]
    assert first["tpot_ms"].tolist() == pytest.approx([20.0, 40.0])  # 1000 / (50, 25) tok/s/user
    assert first["ttft_s"].tolist() == [1.0, 2.0] and first["e2e_s"].tolist() == [10.0, 11.0]


# ---------------------------------------------------------------------------------------------
# winners and losses


def test_winners_notes_pick_the_leader_and_merge_neighbouring_points(load_study):
    notes = winners_notes(load_results(load_study))
    assert notes == [
        # throughput leads: 125/105 - 1 = 19%, 235/205 - 1 = 15%; then mtp1 300/291 = 3%, 400/305 = 31%, 500/492 = 2%
        (f"highest throughput: {X} 1-4: {DSPARK}, up to 19% ahead of {MTP1}; "
         f"{X} 8-32: {MTP1}, up to 31% ahead of {DSPARK}."),
        # per user: 62/52 = 19%, 36/30 = 20%, 21/20 = 5%; 10/9 = 11%; 5.02/5 = 0.4% is a near tie
        (f"fastest per user (p50): {X} 1-8: {DSPARK}, up to 20% ahead of {MTP1}; "
         f"{X} 16: {MTP1}, up to 11% ahead of {DSPARK}; {X} 32: near tie, {DSPARK} and {MTP1} within 1%."),
    ]
    w = numbers.winners(load_results(load_study))
    first = w.iloc[0]
    assert first["xs"] == [1, 4] and first["policy"] == DSPARK and first["lead"] == pytest.approx(125 / 105 - 1)


def test_single_policy_study_says_there_is_no_rival(load_study):
    # fault: "dspark(...), up to inf% ahead of ." when only one policy ran
    res = load_results(load_study)
    one = StudyResults(res.root, res.meta, res.table[res.table["policy"] == DSPARK].reset_index(drop=True),
                       res.summaries)
    notes = winners_notes(one)
    assert notes == [(f"Only {DSPARK} was run in this study, so there is no rival policy to rank it against; "
                      "the figures below compare the sweep settings instead.")]
    assert not any("inf" in n for n in notes)
    w = numbers.winners(one)
    assert (w["runner_up"] == "").all() and w["lead"].isna().all()


def test_dspark_losses_only_beyond_margin_and_seed_spread(load_study):
    res = load_results(load_study)
    gaps = numbers.dspark_gaps(res)
    assert gaps.dspark_policies == [DSPARK] and gaps.static_policies == [MTP1]
    # concurrency 8: gap 3% < spread (14.14 + 14.14) / 300 = 9.4%; 32: gap 1.6% < 2%; 16: 23.75% > both
    assert gaps.points["x"].tolist() == [16]
    p = gaps.points.iloc[0]
    assert p["gap_frac"] == pytest.approx(1 - 305 / 400)
    assert p["noise_frac"] == pytest.approx(math.sqrt(50.0) / 400)
    notes = dspark_losses(res)
    assert len(notes) == 1
    assert notes[0].startswith(f"{X} = 16: {DSPARK} gives 305.0 tok/s vs {MTP1} 400.0 tok/s (23.8% lower; "
                               "mean verify length 3.00 vs 1.00). In 25% of its rounds early stop halted")
    assert "Also, drafting takes 30% of its time against 10% for mtp1" in notes[0]
    # a 1.6% gap becomes a loss when the margin is 1%
    assert numbers.dspark_gaps(res, margin=0.01).points["x"].tolist() == [16, 32]


def test_dspark_losses_name_the_facet(load_study):
    res = load_results(load_study)
    t = res.table.assign(**{"engine.prefill": "colocated"})
    faceted = StudyResults(res.root, {**res.meta, "sweep_keys": ["engine.prefill", X]}, t, res.summaries)
    assert dspark_losses(faceted)[0].startswith(f"engine.prefill = colocated, {X} = 16: {DSPARK} gives")
    assert numbers.facets(faceted)[0][0] == "engine.prefill = colocated"


def test_no_static_baseline_is_said_plainly(memtp_study):
    # fault: a study without static/mtp1 claimed DSpark is "within 2% of the best static policy"
    res = load_results(memtp_study)
    gaps = numbers.dspark_gaps(res)
    assert gaps.static_policies == [] and gaps.points.empty and dspark_losses(res) == []
    text = _text(write_report(memtp_study))
    section = text.split("Where DSpark loses to a static policy, and why", 1)[1].split("Measured cliffs", 1)[0]
    assert "No static baseline (static k or MTP-1) was run in this study" in section
    assert "within 2%" not in section


# ---------------------------------------------------------------------------------------------
# hardware profile


def test_sps_curve_and_cliffs(load_study):
    res = load_results(load_study)
    sps = numbers.sps_curve(res)
    assert sps.name == "toy"
    assert sps.measured["verify_tok_per_s"].tolist() == pytest.approx([100.0, 200.0, 200.0, 1000 * 8 / 60])
    assert sps.rule["batch_tokens"].tolist() == list(range(1, 9))
    assert sps.rule["pass_ms"].tolist() == pytest.approx([10, 10, 15, 20, 30, 40, 50, 60])
    cl = numbers.cliffs(res)
    assert cl["kind"].tolist() == ["pass_jump", "rate_drop"]  # 2 -> 4: x2.00 pass time; 4 -> 8: 200 -> 133 tok/s
    assert numbers.cliff_notes(cl) == ["B=2 to 4: pass time jumps 10.0 to 20.0 ms (x2.00)",
                                       "B=4 to 8: pass time 20.0 to 60.0 ms (200 to 133 verify tok/s)"]


# ---------------------------------------------------------------------------------------------
# MEMTP: timeline, phases, reliability


def test_time_weighted_bins_by_hand():
    b = numbers.time_weighted_bins(_rounds(ELASTIC_ROUNDS), numbers.TIMELINE_COLUMNS, 60.0)
    assert b.index.tolist() == [0.0, 60.0, 120.0]
    # bin 0: weights 10, 30, 20 s
    assert b.loc[0.0, "depth"] == pytest.approx((2 * 10 + 4 * 30 + 6 * 20) / 60)
    assert b.loc[0.0, "free_gib"] == pytest.approx((10 * 10 + 8 * 30 + 6 * 20) / 60)
    assert b.loc[0.0, "coherence"] == pytest.approx((0.5 * 10 + 1.0 * 30 + 0.8 * 20) / 60)
    assert b.loc[0.0, "num_waiting"] == pytest.approx((0 + 30 + 40) / 60)
    assert b.loc[60.0].tolist() == pytest.approx([3, 9.0, 4.0, 0.6, 0])  # one round
    # bin 120: weights 10, 30 s
    assert b.loc[120.0, "depth"] == pytest.approx((5 * 10 + 1 * 30) / 40)
    assert b.loc[120.0, "kv_gib"] == pytest.approx((5 * 10 + 1 * 30) / 40)
    assert b.loc[120.0, "coherence"] == pytest.approx((0.9 * 10 + 0.4 * 30) / 40)


def test_timeline_first_policy_lowest_seed(memtp_study):
    tl = numbers.timeline(load_results(memtp_study))
    assert (tl.policy, tl.seed, tl.bin_s) == (POLICY16, 0, 60.0)
    assert list(dict.fromkeys(tl.bins["label"])) == ["memtp.depth = 1", "memtp.depth = elastic"]
    el = tl.bins[tl.bins["label"] == "memtp.depth = elastic"]
    assert el["depth"].tolist() == pytest.approx([260 / 60, 3.0, 80 / 40])  # seed 0: no depth shift
    assert tl.phases.values.tolist() == [[0.0, 100.0, 0.5], [100.0, 200.0, 0.1]]
    fig = figures.timeline_figure(tl)
    assert len(fig.data) == 2 * 5 and fig.layout.title.text.startswith(f"Timeline ({POLICY16}, seed 0; 60 s bins")


def test_phase_table_by_hand(memtp_study):
    ph = phase_table(load_results(memtp_study))
    assert ph["phase"].tolist() == ["1: 0.5 req/s", "2: 0.1 req/s"] * 2
    el = ph[ph["memtp.depth"] == "elastic"].set_index("phase")
    p1, p2 = el.loc["1: 0.5 req/s"], el.loc["2: 0.1 req/s"]
    assert (p1["requests"], p1["rejected"]) == (3, 0) and (p2["requests"], p2["rejected"]) == (2, 1)
    assert p1["tok/s/user p50"] == 20.0 and p1["TTFT p50 s"] == 2.0
    assert p1["queue p90 s"] == pytest.approx(0.2 + 0.8 * (0.3 - 0.2))  # linear quantile of 0.1, 0.2, 0.3
    # rounds starting in [0, 100): depth-weighted (20 + 120 + 120 + 120) / 100 = 3.8; seed 1 is 2 deeper
    assert p1["mean depth"] == pytest.approx((3.8 + 5.8) / 2)
    assert p2["mean depth"] == pytest.approx((2.0 + 4.0) / 2)
    assert p1["peak KV GiB"] == 4.0 and p2["peak KV GiB"] == 5.0
    notes = numbers.phase_notes(ph, "memtp.depth")
    assert notes[0] == (f"{POLICY16}, phase 1: 0.5 req/s: fastest per user with memtp.depth = 1 (40.0 tok/s/user "
                        "p50); elastic 20.0 at mean depth 4.8")
    # the cause is not assumed here (it was "KV cannot fit next to the heads" whatever the reason):
    # each run's reasons are listed by numbers.rejections and the report's Rejected requests section
    assert notes[1].endswith("; rejected: memtp.depth = elastic: 1")


def test_phase_table_none_without_a_ramp(load_study):
    assert phase_table(load_results(load_study)) is None


def test_reliability_uses_the_run_that_drafted_deepest(memtp_study):
    # fault: the first DSpark run (MEMTP depth 1) was picked, which stores position 1 only, so the
    # panels for positions 3, 5 and 7 were empty
    rel = numbers.reliability_curves(load_results(memtp_study))
    assert rel.picks["run_id"].tolist() == ["0002-toy"]  # memtp.depth = elastic, seed 0
    assert rel.picks["run"].tolist() == ["memtp.depth = elastic, seed 0"]
    assert rel.positions == (1, 3, 5) and rel.missing == (7,) and rel.max_position == 5
    at3 = rel.curves[(rel.curves["position"] == 3) & (rel.curves["kind"] == "used")]
    assert at3["mean_prob"].tolist() == pytest.approx([0.3, 0.8]) and at3["count"].tolist() == [10, 20]
    fig = figures.reliability_figure(rel)
    assert [a.text for a in fig.layout.annotations] == ["position 1", "position 3", "position 5"]
    used = {t.xaxis for t in fig.data if t.name == f"{POLICY16} (as used)"}
    assert used == {"x", "x2", "x3"}  # a curve in every panel


def test_calibration_table(memtp_study):
    cal = numbers.calibration_table(load_results(memtp_study))
    assert cal.columns.tolist() == ["policy", "raw head ECE", "ECE as used", "AUC"]
    assert cal.iloc[0].tolist()[1:] == pytest.approx([0.1, 0.05, 0.7])


# ---------------------------------------------------------------------------------------------
# the page


def _text(path: Path) -> str:
    html = path.read_text()
    html = re.sub(r"<script.*?</script>", "", html, flags=re.DOTALL)
    return re.sub(r"<[^>]+>", " ", html).replace("&#x27;", "'")


def _headings(path: Path) -> list[str]:
    return re.findall(r"<h\d>(.*?)</h\d>", path.read_text())


def test_page_renders_without_an_acceptance_block(load_study):
    # fault: `targets` was bound only when the summaries had an acceptance block (NameError otherwise)
    out = write_report(load_study)
    assert out == load_study / "report.html"
    assert _headings(out) == ["memtp_sim study: toyload", "How to read this report", "Which policy wins where",
                              "Where DSpark loses to a static policy, and why", "Calibration",
                              "All results (mean over seeds)"]
    text = _text(out)
    assert "Acceptance model: not recorded in the run summaries." in text
    assert out.read_text().count('class="plotly-graph-div"') == 4  # frontier, load, latency; SPS
    assert not list(load_study.glob("*.tmp")) and not list(load_study.glob(".*.tmp"))


def test_the_same_results_give_the_same_page(load_study):
    # fresh user: the page changed on every rebuild (Plotly's random div ids), so a diff of two
    # reports of the same results showed every figure
    first = write_report(load_study).read_bytes()
    assert write_report(load_study).read_bytes() == first
    assert re.findall(r'<div id="([^"]+)" class="plotly-graph-div"', first.decode()) == [
        f"figure-{k}" for k in range(1, 5)]


def test_page_sections_of_a_memtp_study(memtp_study):
    out = write_report(memtp_study)
    # every run of this study rejects one request: the reasons get their own section
    assert _headings(out) == ["memtp_sim study: toymemtp", "How to read this report", "Rejected requests",
                              "Which policy wins where",
                              "Where DSpark loses to a static policy, and why", "Confidence calibration",
                              "MEMTP: depth, memory and coherence over time", "Calibration",
                              "All results (mean over seeds)"]
    text = _text(out)
    assert "No panel for position 7" in text and "deepest stored here is position 5" in text
    assert "tau chat 3.50; population conditional acceptance chat 0.90 at position 1, 0.90 at 7, 0.90 at 8" in text
    assert out.read_text().count('class="plotly-graph-div"') == 3 + 1 + 1 + 1  # sweep, reliability, timeline, SPS


# ---------------------------------------------------------------------------------------------
# the terminal table


def test_terminal_table_never_cuts_a_number(memtp_study, load_study):
    from rich.console import Console

    from memtp_sim.cli import _print_table

    for study in (memtp_study, load_study):
        h = headline_table(load_results(study))
        h.loc[0, "throughput tok/s"] = 1234567.891  # a wide number
        buf = io.StringIO()
        _print_table(h, console=Console(width=100, file=buf, color_system=None))
        out = buf.getvalue()
        assert max(map(len, out.splitlines())) <= 100
        cells = re.findall(r"(?<=\s)[-\d.,]+\d(?=\s)|(?<=\s)nan(?=\s)", out)
        for col in h.columns[h.columns.get_loc("policy") + 1:]:
            for v in h[col]:
                assert f"{v:,.2f}" in cells, (col, v)
        assert "1,234,567.89" in cells

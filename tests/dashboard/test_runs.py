"""The what-if page's runs without a browser: cached by run key, equal to memtp_sim.run, KPIs with
intervals and paired deltas, the report's numbers over them; the app and the CLI entry."""

from __future__ import annotations

import json

import _boom  # noqa: F401 - registers the test_boom policy (forked workers inherit it)
import numpy as np
import pytest

from memtp_sim.cli import _parser
from memtp_sim.dashboard import create_app
from memtp_sim.dashboard._runs import KPIS, RunStore, Side, kpi_rows, point_keys
from memtp_sim.report import numbers
from memtp_sim.study import run_key
from memtp_sim.tuning import t_confidence_interval

from ._expect import run_metrics, tiny_scenario


@pytest.fixture
def store(tmp_path) -> RunStore:
    return RunStore(tmp_path)


def test_a_run_is_computed_once_and_equals_the_library(store):
    scen = tiny_scenario(policy={"gamma": 3})
    first = store.ensure(scen, 0)
    assert first["run_id"] == run_key(scen, 0) == point_keys(scen, [0])[0]
    assert first["metrics"]["throughput_tok_per_s"] == run_metrics(scen)["throughput_tok_per_s"]
    mtime = (store.run_dir(first["run_id"]) / "summary.json").stat().st_mtime_ns
    assert store.cached(scen, 0) == first
    assert RunStore(store.root).ensure(scen, 0)["metrics"] == first["metrics"]  # a new process reads it back
    assert (store.run_dir(first["run_id"]) / "summary.json").stat().st_mtime_ns == mtime


def test_a_run_is_recomputed_when_its_inputs_changed(store):
    scen = tiny_scenario()
    s = store.ensure(scen, 1)
    f = store.run_dir(s["run_id"]) / "summary.json"
    doc = json.loads(f.read_text())
    doc["inputs"]["trace"] = "0" * 16  # as if the trace file had been edited since
    f.write_text(json.dumps(doc))
    assert RunStore(store.root).cached(scen, 1) is None


def test_parallel_runs_equal_sequential_ones(store, tmp_path):
    runs = [(tiny_scenario(policy={"gamma": g}), s) for g in (2, 5) for s in (0, 1)]
    done = []
    par = store.ensure_all(runs, workers=2, on_done=lambda i, s: done.append(i))
    assert sorted(done) == [0, 1, 2, 3]
    seq = RunStore(tmp_path / "other").ensure_all(runs, workers=1)
    assert [p["metrics"]["throughput_tok_per_s"] for p in par] == [q["metrics"]["throughput_tok_per_s"] for q in seq]
    assert [p["run_id"] for p in par] == [run_key(sc, s) for sc, s in runs]


def test_a_worker_killed_mid_run_costs_no_run(store, tmp_path):
    """One pool worker killed with SIGKILL (as the out-of-memory killer does) while it computes: its
    run is computed again on a fresh worker and every run comes back, with the numbers of an
    undisturbed computation. Before the fix the pool broke and ensure_all raised BrokenProcessPool.
    The first run to reach its 20th round kills its own worker: a kill from outside after a guessed
    0.5 s came after the runs had ended once the engine got faster (CI, stop 21)."""
    marker = tmp_path / "died"
    scen = tiny_scenario(workload={"num_requests": 100},
                         policy={"name": "test_boom", "k": 3, "die_once": str(marker)})
    runs = [(scen, s) for s in (0, 1, 2, 3)]
    par = store.ensure_all(runs, workers=2)
    assert marker.exists(), "no worker died"
    seq = RunStore(tmp_path / "other").ensure_all(runs, workers=1)
    assert [p["run_id"] for p in par] == [q["run_id"] for q in seq]
    same = [json.dumps(p["metrics"], sort_keys=True) for p in par]  # as text: NaN equals NaN
    assert same == [json.dumps(q["metrics"], sort_keys=True) for q in seq]
    assert all(p["metrics"]["num_completed"] == 100 for p in par)


def test_kpis_are_seed_means_with_t_intervals_and_paired_deltas(store):
    cur = [store.ensure(tiny_scenario(policy={"gamma": 2}), s) for s in (0, 1, 2)]
    base = [store.ensure(tiny_scenario(), s) for s in (0, 1, 2)]
    rows = {r["metric"]: r for r in kpi_rows(cur, base)}
    assert set(rows) == {m for m, *_ in KPIS}
    m = "throughput_tok_per_s"
    c = [s["metrics"][m] for s in cur]
    b = [s["metrics"][m] for s in base]
    assert rows[m]["current"]["mean"] == pytest.approx(np.mean(c))
    assert rows[m]["current"]["half_width"] == pytest.approx(t_confidence_interval(c)["half_width"])
    d = rows[m]["delta"]
    assert d["paired"] and d["mean"] == pytest.approx(np.mean(np.subtract(c, b)))
    assert d["beyond_noise"] == (d["low"] > 0 or d["high"] < 0)
    # the same point against itself: a zero difference, never beyond the noise
    same = {r["metric"]: r for r in kpi_rows(base, base)}
    assert same[m]["delta"]["mean"] == 0 and not same[m]["delta"]["beyond_noise"]


def test_the_reports_numbers_read_the_pages_runs(store):
    scens = {c: tiny_scenario(workload={"concurrency": c}) for c in (2, 4)}
    keys = [store.ensure(scens[c], 0)["run_id"] for c in (2, 4)]
    res = store.results([Side("current", tuple(keys), (2, 4))], "workload.concurrency")
    pts = numbers.frontier_points(res.table, "workload.concurrency")
    assert pts["throughput_tok_per_s_mean"].tolist() == [run_metrics(scens[c])["throughput_tok_per_s"] for c in (2, 4)]
    lat = numbers.latency_samples(res, res.table, None)
    assert len(lat.samples) == sum(run_metrics(scens[c])["num_completed"] for c in (2, 4))  # every run of seed 0
    assert numbers.sps_curve(res).name == "gfx1151-llama31-8b-q4km-vulkan"


def test_the_app_builds_and_serves_its_page(tmp_path):
    app = create_app(cache_dir=tmp_path / "cache", results=tmp_path, study=str(tmp_path / "none"))
    client = app.server.test_client()
    assert client.get("/").status_code == 200
    assert client.get("/_dash-layout").status_code == 200
    deps = client.get("/_dash-dependencies").get_json()
    background = [d for d in deps if "ready.data" in d["output"] and d.get("background")]
    assert background, "the what-if point runs as a background callback"


def test_the_cli_has_a_dashboard_command():
    args = _parser().parse_args(["dashboard"])
    assert (args.host, args.port, args.study, args.results) == ("127.0.0.1", 8050, "results/tune", "results")
    args = _parser().parse_args(["dashboard", "--host", "0.0.0.0", "--port", "0"])
    assert (args.host, args.port) == ("0.0.0.0", 0)

"""The study runner through the real command line: outputs, resume, partial recompute, summary.json."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pandas as pd
import pytest
import yaml

import memtp_sim
from _sim_helpers import REPO, TRACE, tiny_study_doc

UNIT_TOKENS = ("_s", "_ms", "_per_s", "_gib")
TIMED_WORDS = ("ttft", "tpot", "e2e", "latency", "makespan", "throughput", "queue", "wall", "window", "duration")


def _study_doc() -> dict:
    return tiny_study_doc()


def _cli(*args) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "memtp_sim", *map(str, args)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def _mtimes(root):
    return {p.relative_to(root / "runs"): p.stat().st_mtime_ns for p in (root / "runs").glob("*/*") if p.is_file()}


@pytest.mark.slow
def test_study_writes_resumes_and_recomputes_only_missing(tmp_path):
    study = tmp_path / "tiny.yaml"
    study.write_text(yaml.safe_dump(_study_doc(), sort_keys=False))
    out = tmp_path / "results"

    first = _cli("run", study, "--out", out, "--jobs", "2", "--quiet")
    assert first.returncode == 0, first.stderr
    root = out / "tiny"
    assert (root / "runs.csv").is_file()
    assert (root / "report.html").is_file() and (root / "report.html").stat().st_size > 0
    run_dirs = sorted(d for d in (root / "runs").iterdir() if d.is_dir())
    assert len(run_dirs) == 4  # 2 concurrencies x 2 policies x 1 seed
    for d in run_dirs:
        for f in ("summary.json", "requests.csv", "rounds.parquet"):
            assert (d / f).is_file(), (d, f)
        assert len(pd.read_csv(d / "requests.csv")) == 30
        assert len(pd.read_parquet(d / "rounds.parquet")) > 0
    runs = pd.read_csv(root / "runs.csv")
    assert len(runs) == 4
    assert set(runs["workload.concurrency"]) == {1, 4}
    assert runs["num_completed"].tolist() == [30] * 4
    # no stray temporary files from the atomic writes
    assert not [p for p in root.rglob("*.tmp")]

    # summary.json: seed, version, calibration sources, metrics with units in their names
    s = json.loads((run_dirs[0] / "summary.json").read_text())
    assert s["seed"] == 0
    assert s["memtp_sim_version"] == memtp_sim.__version__
    hw = s["provenance"]["hardware"]
    assert hw["sources"]["verify"]
    assert "measurements" in hw["sources"]["verify"] or "csv" in hw["sources"]["verify"]
    assert "Table 1" in s["provenance"]["acceptance"]["source"]
    metrics = s["metrics"]
    for key in ("throughput_tok_per_s", "tok_per_s_user_p50", "ttft_s_p50", "tpot_ms_p50", "e2e_s_p90",
                "makespan_s", "mean_e2e_s"):
        assert key in metrics, key
    for key in metrics:
        if any(w in key for w in TIMED_WORDS):
            assert any(u in key for u in UNIT_TOKENS), f"metric {key!r} has no unit in its name"

    # resume: nothing is recomputed
    before = _mtimes(root)
    second = _cli("run", study, "--out", out, "--jobs", "2", "--quiet")
    assert second.returncode == 0, second.stderr
    assert _mtimes(root) == before
    pd.testing.assert_frame_equal(pd.read_csv(root / "runs.csv"), runs)

    # delete one run's summary.json: only that run is recomputed
    victim = run_dirs[2]
    (victim / "summary.json").unlink()
    third = _cli("run", study, "--out", out, "--jobs", "2", "--quiet")
    assert third.returncode == 0, third.stderr
    after = _mtimes(root)
    assert (victim / "summary.json").is_file()
    changed = {p for p in after if after[p] != before.get(p)}
    assert changed and all(p.parts[0] == victim.name for p in changed), changed
    assert (victim.relative_to(root / "runs") / "requests.csv") in changed
    # same scenario + seed: recomputed numbers are identical
    pd.testing.assert_frame_equal(pd.read_csv(root / "runs.csv"), runs)


def test_a_recomputed_run_says_why(tmp_path):
    # fault: a re-run after a results file was damaged said only "ran 1", never why
    from memtp_sim.config import load_study
    from memtp_sim.study import run_study

    trace = tmp_path / "trace.csv"
    trace.write_bytes(TRACE.read_bytes())
    doc = _study_doc()
    doc["base"]["workload"].update(trace=str(trace), num_requests=4)
    doc["sweep"] = {"workload.concurrency": [1, 2, 3, 4, 5, 6]}
    doc["policies"] = [{"name": "mtp1"}]
    f = tmp_path / "tiny.yaml"
    f.write_text(yaml.safe_dump(doc, sort_keys=False))
    study = load_study(f)
    out = tmp_path / "results"
    first = run_study(study, out_dir=out, jobs=1, source=str(f))
    assert first.num_ran == 6 and first.recomputed == {} and first.ran_note() == "ran 6"
    runs = [out / "tiny" / "runs" / rid for rid in first.table["run_id"]]
    good = (runs[0] / "requests.csv").read_bytes()
    (runs[0] / "requests.csv").write_bytes(good[: len(good) // 2])
    (runs[1] / "rounds.parquet").unlink()
    (runs[2] / "summary.json").write_text("{not json")
    (runs[3] / "summary.json").unlink()
    (runs[4] / "summary.json").unlink()
    (runs[4] / "failed.json").write_text(json.dumps({"status": "failed", "error": "MemoryError: boom"}))
    again = run_study(study, out_dir=out, jobs=1, source=str(f))
    assert again.num_ran == 5 and again.num_reused == 1
    assert again.recomputed == {
        runs[0].name: "damaged: requests.csv is damaged (size or digest differs from summary.json)",
        runs[1].name: "damaged: rounds.parquet is missing",
        runs[2].name: "damaged: summary.json unreadable",
        runs[3].name: "interrupted: summary.json missing",
        runs[4].name: "failed before: MemoryError: boom",
    }
    note = again.ran_note()
    assert note.startswith("reused 1 finished run(s) with the same scenario, seed and inputs; ran 5: recomputed 5 (")
    assert "damaged: requests.csv is damaged" in note and "failed before: MemoryError: boom" in note
    # changed input files, and --force, say so too; reasons shared by several runs are counted once
    lines = trace.read_text().splitlines()
    trace.write_text("\n".join(lines + lines[-1:]) + "\n")
    changed = run_study(study, out_dir=out, jobs=1, source=str(f))
    assert set(changed.recomputed.values()) == {"input changed: trace"}
    assert changed.ran_note() == "ran 6: recomputed 6 (6 x input changed: trace)"
    forced = run_study(study, out_dir=out, jobs=1, source=str(f), force=True)
    assert forced.ran_note() == "ran 6: recomputed 6 (6 x forced (--force))"


def test_a_worker_that_differs_computes_nothing_and_is_not_told_to_retry(tmp_path):
    # a Dask worker with another memtp_sim version or other input files fails every run the same
    # way until its setup is fixed: recorded as an input error (not "run again to retry")
    from _sim_helpers import tiny_study_doc

    from memtp_sim._version import __version__
    from memtp_sim.config import load_study
    from memtp_sim.study import _compute, fails_again, input_fingerprint, plan_runs

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(tiny_study_doc()))
    spec = plan_runs(load_study(path))[0]
    good = {"version": __version__, "inputs": input_fingerprint(spec.scenario)}
    for expect, says in (({**good, "version": "0.0.0-other"}, "this worker runs memtp_sim"),
                         ({**good, "inputs": {k: "0" * 16 for k in good["inputs"]}}, "input files differ")):
        record, blobs = _compute(spec, expect=expect)
        assert record["status"] == "failed" and blobs == {}, record
        assert says in record["error"] and fails_again(record["error"]), record["error"]
    record, blobs = _compute(spec, expect=good)
    assert record["status"] == "ok" and set(blobs) == {"requests.csv", "rounds.parquet"}


def test_run_ids_follow_input_contents_not_paths(tmp_path, capsys):
    """The same study and trace in two folders share their runs; changed contents never reuse a
    result. Before the fix the id hashed the trace's absolute path: running mv2/s.yaml after
    mv1/s.yaml into the same --out recomputed every run and left both sets of folders."""
    import hashlib

    from memtp_sim.cli import main
    from memtp_sim.config import load_study
    from memtp_sim.study import _compute, fails_again, plan_runs, run_study

    lines = TRACE.read_text().splitlines()[:200]
    doc = _study_doc()
    doc["base"]["workload"].update(trace="t.csv", num_requests=6)
    doc["policies"] = [{"name": "mtp1"}]
    studies = {}
    for name in ("mv1", "mv2"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "t.csv").write_text("\n".join(lines) + "\n")
        (tmp_path / name / "s.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        studies[name] = load_study(tmp_path / name / "s.yaml")
    out = tmp_path / "X"
    runs = out / "tiny" / "runs"
    first = run_study(studies["mv1"], out_dir=out, jobs=1)
    assert first.num_ran == 2
    moved = run_study(studies["mv2"], out_dir=out, jobs=1)
    assert (moved.num_reused, moved.num_ran, moved.num_stale) == (2, 0, 0)
    assert sorted(d.name for d in runs.iterdir()) == sorted(first.table["run_id"])

    # other contents at the other place: new runs, saying why (the folders reused from mv1's
    # files hold the same runs' results from the old contents); the summary records the new digest
    trace2 = tmp_path / "mv2" / "t.csv"
    trace2.write_text("\n".join(lines + lines[-1:]) + "\n")
    edited = run_study(load_study(tmp_path / "mv2" / "s.yaml"), out_dir=out, jobs=1)
    assert (edited.num_reused, edited.num_ran) == (0, 2)
    assert edited.recomputed == {rid: "input changed: trace" for rid in edited.table["run_id"]}
    assert not set(edited.table["run_id"]) & set(first.table["run_id"])
    digest = hashlib.sha256(trace2.read_bytes()).hexdigest()[:16]
    for rid in edited.table["run_id"]:
        assert json.loads((runs / rid / "summary.json").read_text())["inputs"]["trace"] == digest
    # mv1 is unchanged: still its own results
    assert run_study(studies["mv1"], out_dir=out, jobs=1).num_reused == 2

    # edited in place: recomputed, saying why, the old folders left and counted
    (tmp_path / "mv1" / "t.csv").write_text("\n".join(lines[:150]) + "\n")
    rc = main(["run", str(tmp_path / "mv1" / "s.yaml"), "--out", str(out), "--jobs", "1"])
    err = capsys.readouterr().err
    assert rc == 0
    assert "resume: ran 2: recomputed 2 (2 x input changed: trace)" in err
    assert "4 folder(s) under" in err and "among them earlier results of 2 run(s) computed now" in err

    # a file edited while the study runs: the run is not computed under the id of the old contents
    spec = plan_runs(load_study(tmp_path / "mv1" / "s.yaml"))[0]
    (tmp_path / "mv1" / "t.csv").write_text("\n".join(lines[:160]) + "\n")
    record, blobs = _compute(spec)
    assert record["status"] == "failed" and blobs == {}
    assert record["error"].startswith("input changed while the study ran: trace") and not fails_again(record["error"])


def test_results_under_an_earlier_run_id_are_recomputed_once_saying_why(tmp_path):
    """Results written before run ids hashed contents instead of paths sit under other ids: each
    such run is computed once more under its new id, and says why; its old folder is left alone."""
    from memtp_sim.config import load_study
    from memtp_sim.study import run_study

    f = tmp_path / "tiny.yaml"
    f.write_text(yaml.safe_dump(_study_doc(), sort_keys=False))
    out = tmp_path / "results"
    first = run_study(load_study(f), out_dir=out, jobs=1)
    runs = out / "tiny" / "runs"
    old = runs / first.table["run_id"][0]
    legacy = old.rename(runs / "r0123456789ab")  # as if named by the former (path) id
    again = run_study(load_study(f), out_dir=out, jobs=1)
    assert again.num_reused == 3 and again.num_ran == 1
    assert again.recomputed == {old.name: "earlier run id (run ids now hash input file contents, not paths)"}
    assert (again.num_stale, again.num_superseded) == (1, 1) and legacy.is_dir()


def test_run_and_report_give_the_same_reason_for_each_unfinished_run(tmp_path):
    """A damaged, interrupted, failed or missing run: `report` (collect_runs) says what `run`
    says when it recomputes it (review: report called an unreadable summary.json "not run")."""
    from memtp_sim.config import load_study
    from memtp_sim.study import collect_runs, run_study

    study = tmp_path / "tiny.yaml"
    study.write_text(yaml.safe_dump(_study_doc(), sort_keys=False))
    out = tmp_path / "results"
    run_study(load_study(study), out_dir=out, jobs=1, source=str(study))
    root = out / "tiny"
    runs = sorted(d for d in (root / "runs").iterdir() if d.is_dir())
    (runs[0] / "summary.json").write_text('{"garbage')                       # damaged
    (runs[1] / "summary.json").unlink()                                        # interrupted (files left)
    (runs[2] / "summary.json").unlink()                                        # failed before
    (runs[2] / "failed.json").write_text(json.dumps({"status": "failed", "error": "ConfigError: x.csv: bad"}))
    for f in (runs[3] / "rounds.parquet",):                                    # a result file damaged
        f.write_bytes(f.read_bytes()[:-7])
    _, _, missing = collect_runs(root)
    assert missing == {runs[0].name: "damaged: summary.json unreadable",
                       runs[1].name: "interrupted: summary.json missing",
                       runs[2].name: "failed before: ConfigError: x.csv: bad",
                       runs[3].name: "damaged: rounds.parquet is damaged (size or digest differs from summary.json)"}
    again = run_study(load_study(study), out_dir=out, jobs=1, source=str(study))
    assert {rid: why for rid, why in again.recomputed.items()} == missing


@pytest.mark.parametrize("policy", [{"name": "no_spec"}, {"name": "dspark", "gamma": 4}])
def test_a_runs_files_read_back_as_its_frames(policy):
    """requests.csv and rounds.parquet (RunResult.files, the bytes both run folders hold) read
    back as pandas' own frames of the run: the parquet is written from the round log's arrays,
    not through rounds_frame, so every column, dtype and value is checked against it."""
    import io

    from _sim_helpers import scenario

    res = memtp_sim.run(scenario(workload={"num_requests": 30, "concurrency": 4}, policy=policy), seed=3)
    files = res.files()
    assert list(files) == ["requests.csv", "rounds.parquet"]
    rounds = pd.read_parquet(io.BytesIO(files["rounds.parquet"]))
    pd.testing.assert_frame_equal(rounds, res.rounds_frame(), check_exact=True)
    # and as pandas' own to_parquet writes it, read without pandas (missing values as nulls, not NaN)
    import pyarrow.parquet as pq

    ours = pq.read_table(io.BytesIO(files["rounds.parquet"]))
    buf = io.BytesIO()
    res.rounds_frame().to_parquet(buf, index=False)
    theirs = pq.read_table(buf)
    assert ours.schema.remove_metadata() == theirs.schema.remove_metadata()
    assert [c.null_count for c in ours.columns] == [c.null_count for c in theirs.columns]
    assert ours.equals(theirs.replace_schema_metadata(None))
    if policy["name"] == "no_spec":  # nothing planned: theta is missing in every round
        assert ours["theta"].null_count == ours.num_rows > 0
    expected = pd.read_csv(io.StringIO(res.requests_frame().to_csv(index=False)))
    pd.testing.assert_frame_equal(pd.read_csv(io.BytesIO(files["requests.csv"])), expected, check_exact=True)

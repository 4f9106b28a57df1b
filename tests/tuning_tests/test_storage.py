"""Storage (memtp_sim.tuning._storage): resume refuses a changed spec, and the storage contract (two
worker processes; resume after SIGKILL) over SQLite, journal and PostgreSQL.

PostgreSQL tests read ``PG_URL`` (e.g. postgresql+psycopg2://memtp:memtp@127.0.0.1:5432/memtp_optuna)
and skip without it; with ``MEMTP_REQUIRE_POSTGRES=1`` (set by .ci/run) they fail instead, so CI
cannot skip them silently.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid

import optuna
import pytest
from optuna.trial import TrialState

from memtp_sim.cli import main
from memtp_sim.errors import ConfigError
from memtp_sim.tuning import STUDY_ATTR, open_storage, open_study, parse_tune_spec, run_tune

import _boom

from ._helpers import (
    REPO,
    TRACE,
    _assert_one_line_error,
    _sha16,
    _trials,
    _write,
    cli_env,
    held_doc,
    imported_profile,
    profiled_doc,
    tiny_doc,
)

optuna.logging.set_verbosity(optuna.logging.WARNING)


def test_resume_refuses_a_changed_spec(tmp_path):
    url = f"sqlite:///{tmp_path / 'c.db'}"
    spec = parse_tune_spec(tiny_doc("changed"))
    open_study(spec, open_storage(url))
    doc = tiny_doc("changed")
    doc["search_space"]["policy.gamma"]["high"] = 5
    with pytest.raises(ConfigError, match=r"\(its search_space differs\)"):
        open_study(parse_tune_spec(doc), open_storage(url))


def test_resume_from_a_copied_tree_says_the_input_paths_moved(tmp_path):
    # fresh check: a copied tuning tree (identical files) was refused as "tuned with a different
    # base", though only the files' paths differ: the message now says which paths moved
    url = f"sqlite:///{tmp_path / 'c.db'}"
    a, b = tmp_path / "a" / "t.csv", tmp_path / "b" / "t.csv"
    for t in (a, b):
        t.parent.mkdir()
        shutil.copy(TRACE, t)
    doc = tiny_doc("moved")
    doc["base"]["workload"]["trace"] = str(a)
    open_study(parse_tune_spec(doc), open_storage(url))
    doc["base"]["workload"]["trace"] = str(b)
    with pytest.raises(ConfigError, match=rf": base: study 'moved' in storage was tuned on input files at other paths "
                                          rf"\(workload\.trace: {re.escape(str(a))} -> {re.escape(str(b))}\); .* give the "
                                          "tune spec a new name$"):
        open_study(parse_tune_spec(doc), open_storage(url))
    doc["base"]["workload"]["num_requests"] = 7  # another base, not only a path: the general message
    with pytest.raises(ConfigError, match=r"\(its base differs\)"):
        open_study(parse_tune_spec(doc), open_storage(url))

def test_resume_refuses_changed_input_files(tmp_path, capsys):
    # review: after the profile's cost table was edited (B=16: 58.7391 -> 99.0 ms), `tune --n-trials 6`
    # ran 3 more trials in the same study without a word: trials priced on two different tables
    costs = tmp_path / "prof" / "p.costs.csv"
    path = _write(tmp_path, profiled_doc("tprof", imported_profile(tmp_path)))
    url = f"sqlite:///{tmp_path / 'results' / 'tprof' / 'optuna.db'}"
    args = ["tune", str(path), "--out", str(tmp_path / "results"), "--no-validate", "--quiet"]
    assert main([*args, "--n-trials", "2"]) == 0
    rec = optuna.load_study(study_name="tprof", storage=url).user_attrs[STUDY_ATTR]["inputs"]
    assert rec["measurements"] == _sha16(costs) and rec["hardware"] == _sha16(tmp_path / "prof" / "p.yaml")
    assert rec["trace"] == _sha16(TRACE)
    original = costs.read_bytes()
    assert original.count(b"58.7391") == 1
    costs.write_bytes(original.replace(b"58.7391", b"99.0"))
    capsys.readouterr()
    rc = main([*args, "--n-trials", "4"])
    _assert_one_line_error(rc, capsys.readouterr().err,
                           f"error: {path}: input changed since study 'tprof' was tuned: measurements ({costs}); "
                           "its trials were priced on the old contents; restore the old file(s), or give the tune "
                           "spec a new name")
    assert len(_trials(url, "tprof")) == 2  # nothing ran
    # under a new name the new table is tuned; with the old contents back the study resumes
    path2 = _write(tmp_path, profiled_doc("tprof2", str(tmp_path / "prof" / "p.yaml")), "tune2.yaml")
    assert main(["tune", str(path2), "--out", str(tmp_path / "results"), "--no-validate", "--quiet",
                 "--n-trials", "1"]) == 0
    costs.write_bytes(original)
    assert main([*args, "--n-trials", "4"]) == 0
    assert sum(t.state == TrialState.COMPLETE for t in _trials(url, "tprof")) == 4


def test_every_file_a_categorical_choice_reads_is_checked(tmp_path):
    """A tuned workload.trace reads one file per choice: changing the second choice's file (which the
    base scenario never reads) is caught too."""
    from memtp_sim.tuning import check_study_inputs

    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    shutil.copy(TRACE, a)
    shutil.copy(TRACE, b)
    doc = tiny_doc("cat")
    doc["base"]["workload"]["trace"] = str(a)
    doc["search_space"]["workload.trace"] = {"type": "categorical", "choices": [str(a), str(b)]}
    spec = parse_tune_spec(doc)
    study = open_study(spec, open_storage(f"sqlite:///{tmp_path / 'c.db'}"))
    rec = study.user_attrs[STUDY_ATTR]["inputs"]
    assert rec["trace"] == _sha16(a) and rec[f"trace {b}"] == _sha16(b)
    assert check_study_inputs(study, spec, where="w", todo="t")[1] is None
    lines = b.read_text().splitlines(keepends=True)
    b.write_text("".join(lines[:-1]))  # one request fewer
    with pytest.raises(ConfigError, match=rf"^w: input changed since study 'cat' was tuned: trace {re.escape(str(b))}; "
                                          r"its trials were priced on the old contents; t$"):
        check_study_inputs(study, spec, where="w", todo="t")


def _pg_url() -> str:
    url = os.environ.get("PG_URL")
    if not url:
        if os.environ.get("MEMTP_REQUIRE_POSTGRES") == "1":
            pytest.fail("MEMTP_REQUIRE_POSTGRES=1 but PG_URL is not set: .ci/run must start PostgreSQL and "
                        "export PG_URL=postgresql+psycopg2://...")
        pytest.skip("PG_URL is not set: start PostgreSQL and export PG_URL=postgresql+psycopg2://user:pass@host/db "
                    "to run the PostgreSQL tests (CI does)")
    return url


BACKENDS = ["sqlite", "journal", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture
def storage_url(request, tmp_path):
    """A storage URL per backend, and a study name unique to this test (PostgreSQL is shared)."""
    kind = request.param
    name = f"w_{uuid.uuid4().hex[:10]}"
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path / 'optuna.db'}"
    elif kind == "journal":
        url = f"journal://{tmp_path / 'optuna.log'}"
    else:
        url = _pg_url()
    yield url, name
    if kind == "postgres":
        try:
            optuna.delete_study(study_name=name, storage=url)
        except KeyError:
            pass


@pytest.mark.slow
@pytest.mark.parametrize("storage_url", BACKENDS, indirect=True)
def test_two_worker_processes_share_one_study(storage_url, tmp_path):
    url, name = storage_url
    spec = parse_tune_spec(tiny_doc(name))
    out = run_tune(spec, storage_url=url, n_trials=8, workers=2, out_dir=tmp_path, validate=False, report=False)
    assert out.worker_exit_codes == [0, 0] and out.complete == 8 and not out.short
    trials = _trials(url, name)
    assert sorted(t.number for t in trials) == list(range(8))  # none lost, none duplicated
    assert all(t.state == TrialState.COMPLETE for t in trials)
    pids = {t.user_attrs["worker"]["pid"] for t in trials}
    assert len(pids) == 2 and os.getpid() not in pids  # two separate processes did the work
    # a rerun with the same total does nothing more
    again = run_tune(spec, storage_url=url, n_trials=8, workers=2, out_dir=tmp_path, validate=False, report=False)
    assert again.ran == 0 and len(_trials(url, name)) == 8


def _cli(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "memtp_sim", *args], cwd=REPO, env=cli_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
@pytest.mark.parametrize("storage_url", BACKENDS, indirect=True)
def test_two_tune_processes_started_together_stop_at_n_trials_in_all(storage_url, tmp_path):
    # review: two `tune` commands on one storage each counted their quota at start and ran the full
    # --n-trials (40 COMPLETE for 20); the README says --n-trials counts trials across all of them
    url, name = storage_url
    hold = tmp_path / "hold"
    hold.mkdir()
    path = _write(tmp_path, held_doc(name, hold))  # each trial's runs wait until released
    args = ["tune", str(path), "--storage", url, "--n-trials", "6", "--no-validate", "--quiet",
            "--out", str(tmp_path / "results")]
    procs = [_cli(args), _cli(args)]
    # both commands are inside a trial before any trial can finish (trials once took ~1 s, and the
    # second command started in time; a faster engine let the first run all six alone)
    _boom.wait_started(hold, 2, alive=lambda: all(p.poll() is None for p in procs))
    (hold / "release").touch()
    said = {}
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        said[p.pid] = _started_now(out)
    trials = _trials(url, name)
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    # Optuna stops each process once 6 are COMPLETE; a trial in flight then still finishes
    assert 6 <= len(complete) <= 7, len(complete)
    assert len({t.user_attrs["worker"]["pid"] for t in complete}) == 2  # both processes took part
    # review: each process printed "N started now" with N its quota at start (40 and 30 for a study of 41
    # trials): each now counts the trials it ran, by the pid its trials recorded
    for pid, (started, states) in said.items():
        mine = [t for t in trials if t.user_attrs["worker"]["pid"] == pid]
        assert started == len(mine) and states == {"complete": len(mine)}, (pid, said, len(mine))
    assert sum(n for n, _ in said.values()) == len(trials)


def _started_now(stdout: str) -> tuple[int, dict[str, int]]:
    """``(N, {state: count})`` from the summary line's "(N started now: 2 complete, 1 failed; 3.1 s)"."""
    m = re.search(r"\((\d+) started now(?:: ([^;]*))?[;,] [\d.]+ s\) in ", stdout)
    assert m is not None, stdout
    words = {"complete": "complete", "failed": "fail", "left RUNNING by a dead worker (marked FAIL on resume)": "running"}
    parts = dict(reversed(part.split(" ", 1)) for part in (m.group(2) or "").split(", ") if part)
    return int(m.group(1)), {words[w]: int(n) for w, n in parts.items()}


@pytest.mark.slow
@pytest.mark.parametrize("storage_url", BACKENDS, indirect=True)
def test_resume_after_a_worker_is_killed_mid_trial(storage_url, tmp_path):
    url, name = storage_url
    hold = tmp_path / "hold"
    hold.mkdir()
    path = _write(tmp_path, held_doc(name, hold))  # each trial's runs wait until released
    args = ["tune", str(path), "--storage", url, "--n-trials", "4", "--workers", "2", "--no-validate", "--quiet",
            "--out", str(tmp_path / "results")]
    proc = _cli(args)
    # a worker held inside its first trial's first run: the kill lands mid-trial by construction
    pid = next(iter(_boom.wait_started(hold, 1, alive=lambda: proc.poll() is None)))
    victim = None
    deadline = time.monotonic() + 120
    while victim is None and time.monotonic() < deadline:
        running = [t for t in _trials(url, name) if t.state == TrialState.RUNNING
                   and t.user_attrs.get("worker", {}).get("pid") == pid]
        victim = running[0] if running else time.sleep(0.02)
    assert victim is not None, f"no RUNNING trial of worker {pid}"
    os.kill(pid, signal.SIGKILL)
    (hold / "release").touch()
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 1, err  # the study is short; the command says so and how to resume
    assert "run the same command again to resume" in err
    state = {t.number: t.state for t in _trials(url, name)}
    assert state[victim.number] == TrialState.RUNNING  # the killed worker's trial is stuck until resumed
    assert sum(s == TrialState.COMPLETE for s in state.values()) < 4
    # review: "24/40 complete trials (40 started now ...)" after a worker was killed: the count was the
    # quota; now it is the trials this call's workers started, the killed one's still RUNNING
    counted = {"complete": sum(s == TrialState.COMPLETE for s in state.values()), "running": 1}
    counted["fail"] = len(state) - counted["complete"] - 1
    assert _started_now(out) == (len(state), {k: v for k, v in counted.items() if v})

    proc = _cli(args)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    trials = _trials(url, name)
    assert _started_now(out)[0] == len(trials) - len(state)  # the first call's trials are not counted again
    assert sum(t.state == TrialState.COMPLETE for t in trials) == 4
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    assert sorted(t.number for t in trials) == list(range(len(trials)))  # contiguous, unique
    dead = [t for t in trials if t.number == victim.number][0]
    assert dead.state == TrialState.FAIL and "died" in dead.user_attrs["failed_reason"]


def test_postgres_url_without_driver_is_a_clear_error(capsys, tmp_path):
    doc = tiny_doc()
    path = _write(tmp_path, doc)
    try:
        import psycopg  # noqa: F401

        pytest.skip("psycopg 3 is installed: plain postgresql:// is valid here")
    except ImportError:
        pass
    rc = main(["tune", str(path), "--storage", "postgresql://u:secret@127.0.0.1:1/db", "--quiet"])
    err = capsys.readouterr().err
    _assert_one_line_error(rc, err, "postgresql+psycopg2://")
    assert "secret" not in err


def test_workers_started_together_on_a_fresh_storage_all_open_it(tmp_path):
    """Six processes opening one new SQLite storage at the same moment (workers on several
    terminals, or hosts on one PostgreSQL): Optuna creates the tables without a lock, so before
    the fix all but one failed with "table ... already exists" / "UNIQUE constraint failed:
    alembic_version" (Optuna issues #1092, #4621); now each retries until the schema is there."""
    code = ("import sys; from memtp_sim.tuning import open_storage; import optuna; "
            "s = open_storage(sys.argv[1]); optuna.create_study(study_name='race', storage=s, load_if_exists=True); "
            "print('ok')")
    for rep in range(2):
        url = f"sqlite:///{tmp_path / f'race{rep}.db'}"
        procs = [subprocess.Popen([sys.executable, "-c", code, url], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for _ in range(6)]
        outs = [p.communicate(timeout=120) for p in procs]
        bad = [err.strip().splitlines()[-1:] for p, (out, err) in zip(procs, outs) if p.returncode != 0]
        assert not bad, bad


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_readers_never_create_a_storage(tmp_path, kind):
    # fault (fresh user): typing sqlite:////nonexistent/x.db in the dashboard's study box created
    # the folder and an empty database on the server; `export --storage` did the same
    from memtp_sim.cli import main
    from memtp_sim.dashboard._tuning import open_tune_study
    from memtp_sim.errors import ConfigError

    target = tmp_path / "nowhere" / ("x.db" if kind == "sqlite" else "x.log")
    url = f"sqlite:///{target}" if kind == "sqlite" else f"journal://{target}"
    with pytest.raises(ConfigError, match=r"^study: .*no such .* file \(nothing was created\)"):
        open_tune_study(url, None)
    assert main(["export", "--study", "t", "--storage", url, "--format", "vllm"]) == 2
    assert not (tmp_path / "nowhere").exists()
    # the writer (tune) still creates it
    open_storage(url)
    assert target.is_file()


def test_a_study_in_another_storage_says_it_replaces_the_reports_of_the_default_one(tmp_path, capsys):
    # fresh user: `tune --storage journal:...` rewrote results/<name>/report.html and validation.json
    # of the study in results/<name>/optuna.db, and nothing showed which storage the report was of
    spec, out = _write(tmp_path, tiny_doc("same")), tmp_path / "results"
    assert main(["tune", str(spec), "--out", str(out), "--n-trials", "2", "--quiet"]) == 0
    first = capsys.readouterr().err
    assert "also holds a study" not in first  # the default storage's own report: nothing to say
    page = (out / "same" / "report.html").read_text()
    assert f"Study storage: sqlite:///{out / 'same' / 'optuna.db'}." in page
    journal = f"journal://{tmp_path / 'other.log'}"
    assert main(["tune", str(spec), "--out", str(out), "--n-trials", "2", "--quiet", "--storage", journal]) == 0
    said = capsys.readouterr()
    note = [ln for ln in (said.out + said.err).splitlines() if "also holds a study 'same'" in ln]
    assert len(note) == 1 and f"now describe the study in {journal}" in note[0], said
    assert f"Study storage: {journal}." in (out / "same" / "report.html").read_text()


def test_a_study_holding_more_trials_than_asked_says_so(tmp_path, capsys):
    # fresh user: resuming with fewer trials than the study holds printed "[101/60] trials complete"
    spec, out = _write(tmp_path, tiny_doc("more")), tmp_path / "results"
    assert main(["tune", str(spec), "--out", str(out), "--n-trials", "3", "--no-validate"]) == 0
    capsys.readouterr()
    assert main(["tune", str(spec), "--out", str(out), "--n-trials", "2", "--no-validate"]) == 0
    said = capsys.readouterr()
    assert "  3 trials complete, 2 asked: none to run" in said.err and "[3/2]" not in said.err
    assert "more: 3 complete trials (2 asked) (none started now; " in said.out


def test_the_trial_export_takes_is_marked_best_on_the_tuning_seeds(tmp_path, capsys):
    # fresh user: "(best)" sat on a trial whose fresh-seed mean was below another's, with no word
    # that best means best on the tuning seeds (what export picks by default)
    spec, out = _write(tmp_path, tiny_doc("marked")), tmp_path / "results"
    assert main(["tune", str(spec), "--out", str(out), "--n-trials", "3"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("  trial ")]
    marked = [ln for ln in lines if "(best on the tuning seeds: export's default)" in ln]
    assert lines and len(marked) == 1 and "(fresh seeds, 95% CI)" in marked[0]

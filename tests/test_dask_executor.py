"""``run --executor dask`` on a real Dask cluster: one ``dask scheduler`` and two ``dask worker``
processes on localhost (random ports, stopped at the end).

The Dask path must give the local executor's numbers (same seeds, same runs.csv), resume the same
way (finished runs are reused, a damaged one is recomputed, whichever executor wrote them), record
a failing run as the local executor does, and say in one line what is wrong when Dask is missing,
the scheduler cannot be reached, or the flags do not fit together.

Marked ``dask``. Without Dask installed they skip, unless ``MEMTP_REQUIRE_DASK=1`` (set by .ci/run)
makes them fail, so CI cannot pass them by skipping.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import _boom  # noqa: F401 - registers the test_boom policy in this process (workers preload it)
import pandas as pd
import pytest
import yaml
from _sim_helpers import REPO, TRACE, tiny_study_doc

from memtp_sim.cli import main

pytestmark = pytest.mark.dask

HERE = Path(__file__).resolve().parent


def _dask_cli() -> str:
    exe = Path(sys.executable).parent / "dask"
    if exe.is_file():
        return str(exe)
    if os.environ.get("MEMTP_REQUIRE_DASK") == "1":
        pytest.fail("MEMTP_REQUIRE_DASK=1 but the `dask` command is missing: install the test extra (dask)")
    pytest.skip("Dask distributed is not installed (pip install -e '.[dask]')")


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)


@contextlib.contextmanager
def _cluster(tmp: Path, *, nanny: bool = False, config: dict[str, str] | None = None) -> Iterator[str]:
    """A Dask scheduler and two single-thread workers that preload the boom policy, on localhost;
    yields the scheduler's address. ``nanny``: each worker runs under a nanny, which starts a new
    one when it dies; ``config``: ``DASK_*`` environment settings of the scheduler."""
    dask = _dask_cli()
    sched_file = tmp / "scheduler.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(HERE), os.environ.get("PYTHONPATH", "")])}
    procs: list[subprocess.Popen] = []
    logs = []
    try:
        log = open(tmp / "scheduler.log", "w")
        logs.append(log)
        procs.append(subprocess.Popen(
            [dask, "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
             "--scheduler-file", str(sched_file)], cwd=tmp, env={**env, **(config or {})}, stdout=log,
            stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 30
        while not sched_file.is_file() or not sched_file.read_text().strip():
            assert procs[0].poll() is None, (tmp / "scheduler.log").read_text()
            assert time.monotonic() < deadline, "the Dask scheduler did not start in 30 s"
            time.sleep(0.1)
        address = json.loads(sched_file.read_text())["address"]
        for i in range(2):
            log = open(tmp / f"worker{i}.log", "w")
            logs.append(log)
            procs.append(subprocess.Popen(
                [dask, "worker", address, "--nthreads", "1", "--nanny" if nanny else "--no-nanny", "--no-dashboard",
                 "--name", f"w{i}", "--preload", "_boom", "--local-directory", str(tmp / f"w{i}"),
                 "--death-timeout", "60"],
                cwd=tmp, env=env, stdout=log, stderr=subprocess.STDOUT))
        from distributed import Client

        with Client(address, timeout=30) as client:
            client.wait_for_workers(2, timeout=60)
        yield address
    finally:
        _stop(procs[1:])
        _stop(procs[:1])
        for log in logs:
            log.close()


@pytest.fixture(scope="module")
def scheduler(tmp_path_factory):
    """Address of a Dask scheduler with two single-thread workers that preload the boom policy."""
    with _cluster(tmp_path_factory.mktemp("dask")) as address:
        yield address


def _study(tmp_path: Path, doc: dict) -> Path:
    f = tmp_path / f"{doc['name']}.yaml"
    f.write_text(yaml.safe_dump(doc, sort_keys=False))
    return f


def _tiny(tmp_path: Path) -> Path:
    return _study(tmp_path, tiny_study_doc(seeds=(0, 1)))


def _mtimes(root: Path) -> dict[Path, int]:
    return {p.relative_to(root): p.stat().st_mtime_ns for p in (root / "runs").glob("*/*") if p.is_file()}


def test_dask_gives_the_local_numbers_and_resumes(tmp_path, scheduler, capsys):
    study = _tiny(tmp_path)
    local, remote = tmp_path / "local", tmp_path / "dask"
    assert main(["run", str(study), "--out", str(local), "--jobs", "1", "--quiet"]) == 0
    assert main(["run", str(study), "--out", str(remote), "--executor", "dask", "--scheduler", scheduler,
                 "--quiet"]) == 0
    capsys.readouterr()
    want = pd.read_csv(local / "tiny" / "runs.csv")
    got = pd.read_csv(remote / "tiny" / "runs.csv")
    assert len(got) == 8 and got["num_completed"].tolist() == [30] * 8
    pd.testing.assert_frame_equal(got, want)  # same seeds -> the same numbers, wherever they ran
    root = remote / "tiny"
    for d in (root / "runs").iterdir():  # the submitting process wrote every file, atomically
        assert sorted(p.name for p in d.iterdir()) == ["requests.csv", "rounds.parquet", "summary.json"]
        assert (d / "requests.csv").read_bytes() == (local / "tiny" / "runs" / d.name / "requests.csv").read_bytes()
    assert not list(root.rglob("*.tmp"))

    # resume: nothing recomputed, whichever executor wrote the runs
    before = _mtimes(root)
    assert main(["run", str(study), "--out", str(remote), "--executor", "dask", "--scheduler", scheduler]) == 0
    assert "reused 8 finished run(s)" in capsys.readouterr().err
    assert _mtimes(root) == before
    assert main(["run", str(study), "--out", str(local), "--executor", "dask", "--scheduler", scheduler]) == 0
    assert "reused 8 finished run(s)" in capsys.readouterr().err

    # a damaged run (its requests.csv no longer matches summary.json) is recomputed, on the cluster
    victim = sorted((root / "runs").iterdir())[3]
    (victim / "requests.csv").write_text("damaged\n")
    assert main(["run", str(study), "--out", str(remote), "--executor", "dask", "--scheduler", scheduler]) == 0
    assert "reused 7 finished run(s) with the same scenario, seed and inputs; ran 1" in capsys.readouterr().err
    after = _mtimes(root)
    changed = {p for p in after if after[p] != before[p]}
    assert changed and {p.parts[1] for p in changed} == {victim.name}
    pd.testing.assert_frame_equal(pd.read_csv(root / "runs.csv"), want)


def test_a_failing_run_is_recorded_as_with_the_local_executor(tmp_path, scheduler, capsys):
    doc = {"name": "f", "base": {
        "hardware": {"profile": "gfx1151-llama31-8b-q4km-vulkan"},
        "acceptance": {"profile": "dspark-qwen3", "domain_mix": {"chat": 1.0}},
        "workload": {"trace": str(TRACE), "mode": "closed_loop", "concurrency": 2, "num_requests": 8},
        "policy": {"name": "test_boom"}}, "sweep": {"policy.fail": [False, True]}, "seeds": [0, 1]}
    study = _study(tmp_path, doc)
    outs = {}
    for executor in ("local", "dask"):
        extra = ["--jobs", "2"] if executor == "local" else ["--executor", "dask", "--scheduler", scheduler]
        rc = main(["run", str(study), "--out", str(tmp_path / executor), "--quiet", *extra])
        err = capsys.readouterr().err
        assert rc == 1
        assert "2 of 4 run(s) failed" in err and "RuntimeError: boom: this run fails on purpose" in err
        root = tmp_path / executor / "f"
        failed = {p.parent.name: json.loads(p.read_text()) for p in (root / "runs").glob("*/failed.json")}
        assert len(failed) == 2 and all(not (root / "runs" / rid / "summary.json").exists() for rid in failed)
        outs[executor] = ({rid: (r["status"], r["error"], r["labels"], r["seed"]) for rid, r in failed.items()},
                          pd.read_csv(root / "runs.csv"))
        report = (root / "report.html").read_text()
        assert "covers 2 of the study&#x27;s 4 runs" in report or "covers 2 of the study's 4 runs" in report
    assert outs["dask"][0] == outs["local"][0]
    pd.testing.assert_frame_equal(outs["dask"][1], outs["local"][1])


def test_a_dead_worker_costs_no_other_run(tmp_path, capsys):
    """Dask's answer to a worker that dies (here a run kills its own worker with SIGKILL, as the
    out-of-memory killer would): the scheduler runs that worker's task elsewhere and touches no
    other; a task whose workers died under it more often than the scheduler's allowed-failures
    (1 here, 3 by default) fails with KilledWorker, which `run` records as a lost worker. The
    local executor's fault (one death failed every pending run) has no Dask counterpart."""
    doc = {"name": "d", "base": {
        "hardware": {"profile": "gfx1151-llama31-8b-q4km-vulkan"},
        "acceptance": {"profile": "dspark-qwen3", "domain_mix": {"chat": 1.0}},
        "workload": {"trace": str(TRACE), "mode": "closed_loop", "concurrency": 2, "num_requests": 8},
        "policy": {"name": "test_boom"}},
        "sweep": {"policy.die": [False, True], "workload.concurrency": [1, 2]}, "seeds": [0]}
    study = _study(tmp_path, doc)
    # one task on a worker at a time (saturation 1.0; the default 1.1 queues a second task on a
    # one-thread worker): a queued run on the worker that dies would count that death too, and
    # with allowed-failures 1 could fail beside the dying ones (seen under CPU load)
    config = {"DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": "1",
              "DASK_DISTRIBUTED__SCHEDULER__WORKER_SATURATION": "1.0"}
    (tmp_path / "cluster").mkdir()
    with _cluster(tmp_path / "cluster", nanny=True, config=config) as address:
        rc = main(["run", str(study), "--out", str(tmp_path / "out"), "--quiet", "--executor", "dask",
                   "--scheduler", address])
    err = capsys.readouterr().err
    assert rc == 1 and "2 of 4 run(s) failed" in err, err
    root = tmp_path / "out" / "d"
    failed = [json.loads(p.read_text()) for p in (root / "runs").glob("*/failed.json")]
    assert sorted(r["labels"]["workload.concurrency"] for r in failed) == [1, 2]
    assert all(r["labels"]["policy.die"] and r["error"].startswith("worker lost (KilledWorker:") for r in failed)
    done = pd.read_csv(root / "runs.csv")
    assert len(done) == 2 and not done["policy.die"].any() and done["num_completed"].tolist() == [8, 8]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_clear_one_line_errors(tmp_path, capsys, monkeypatch):
    study = _tiny(tmp_path)
    base = ["run", str(study), "--out", str(tmp_path / "out"), "--quiet"]
    assert main([*base, "--scheduler", "tcp://127.0.0.1:8786"]) == 2
    assert "--scheduler is only for --executor dask" in _one_error_line(capsys)
    assert main([*base, "--executor", "dask"]) == 2
    assert "--executor dask needs --scheduler ADDRESS" in _one_error_line(capsys)
    assert main([*base, "--executor", "dask", "--scheduler", "tcp://127.0.0.1:1", "--jobs", "2"]) == 2
    assert "--jobs sets local worker processes" in _one_error_line(capsys)

    # nobody listens on this port: refused within the timeout, before any run
    t0 = time.monotonic()
    rc = main([*base, "--executor", "dask", "--scheduler", f"tcp://127.0.0.1:{_free_port()}",
               "--scheduler-timeout", "2"])
    assert rc == 2 and time.monotonic() - t0 < 20
    assert "unreachable within 2 s" in _one_error_line(capsys)
    assert not list((tmp_path / "out" / "tiny" / "runs").glob("*/*"))

    # Dask not installed: said before anything runs
    monkeypatch.setitem(sys.modules, "distributed", None)
    assert main([*base, "--executor", "dask", "--scheduler", "tcp://127.0.0.1:8786"]) == 2
    line = _one_error_line(capsys)
    assert "needs Dask distributed" in line and 'pip install -e ".[dask]"' in line


def test_importing_the_package_does_not_import_dask():
    code = "import sys, memtp_sim, memtp_sim.study, memtp_sim.cli; print(sorted({'dask', 'distributed'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO,
                         check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"

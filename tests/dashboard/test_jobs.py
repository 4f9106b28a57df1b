"""The dashboard's background-job manager against Dash's polling contract.

On every poll Dash calls ``get_result(key, job)`` and then ``job_running(job)``; UNDEFINED
and "not running" together mean "cancelled" and the browser stops polling
(``dash._callback._handle_rest_background_callback``). These tests put a job in each state
that contract can meet and check the answer, with Dash's own DiskcacheManager as the
counter-example where it answers wrongly.
"""

from __future__ import annotations

import os
import signal
import time

import diskcache
import psutil
import pytest
from dash import DiskcacheManager

from memtp_sim.dashboard._app import _stop_jobs
from memtp_sim.dashboard._jobs import JobManager


def _ended(pid: int, timeout_s: float = 30.0) -> None:
    """Wait until ``pid`` has exited (a zombie counts: it runs no more code)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.02)
    raise AssertionError(f"job {pid} still runs after {timeout_s} s")


@pytest.fixture
def cache(tmp_path):
    c = diskcache.Cache(str(tmp_path / "jobs"))
    yield c
    c.close()


def _job(cache, value, *, sleep_s: float = 0.0, ignore_term: bool = False):
    """A Dash job function: ``job(result_key, progress_key, args, context)`` writing ``value``."""
    def job(result_key, progress_key, args, context):
        if ignore_term:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        cache.set(progress_key, ["started", os.getppid()])
        time.sleep(sleep_s)
        cache.set(result_key, value)
    return job


def test_a_job_that_ended_with_an_unread_result_is_still_running(cache):
    mgr = JobManager(cache)
    pid = mgr.call_job_fn("k", _job(cache, 42), [], {})
    _ended(pid)
    assert mgr.result_ready("k")
    # the moment of the race: the poll read UNDEFINED just before the job wrote 42 and exited
    assert DiskcacheManager(cache).job_running(pid) is False  # Dash would call this a cancel
    assert mgr.job_running(pid) is True                       # so the browser polls once more
    assert mgr.get_result("k", pid) == 42
    assert mgr.job_running(pid) is False                      # read: now it is over


def test_a_cancelled_job_is_not_running(cache):
    mgr = JobManager(cache)
    pid = mgr.call_job_fn("k", _job(cache, 1, sleep_s=60), [], {})
    mgr.terminate_job(pid)
    _ended(pid)
    assert not mgr.job_running(pid) and mgr.get_result("k", pid) is mgr.UNDEFINED


def test_a_new_job_never_sees_a_superseded_jobs_result(cache):
    mgr = JobManager(cache)
    cache.set("k", "left over by a superseded job")
    pid = mgr.call_job_fn("k", _job(cache, "fresh", sleep_s=0.5), [], {})
    assert mgr.get_result("k", pid) is mgr.UNDEFINED  # Dash's manager would hand over the leftover
    _ended(pid)
    assert mgr.get_result("k", pid) == "fresh"


def test_jobs_are_forked_from_the_fork_server_not_from_this_process(cache):
    mgr = JobManager(cache)
    pid = mgr.call_job_fn("k", _job(cache, 0, sleep_s=2), [], {})
    deadline = time.monotonic() + 30
    while cache.get(mgr._make_progress_key("k")) is None and time.monotonic() < deadline:
        time.sleep(0.02)
    _, parent = cache.get(mgr._make_progress_key("k"))
    assert parent != os.getpid()  # not this (multi-threaded) process: a fork of it may inherit held locks
    assert "from multiprocess.forkserver import main" in " ".join(psutil.Process(parent).cmdline())
    mgr.terminate_job(pid)


def test_stopping_the_server_kills_a_job_that_ignores_sigterm(cache):
    mgr = JobManager(cache)
    pid = mgr.call_job_fn("k", _job(cache, 0, sleep_s=600, ignore_term=True), [], {})
    while cache.get(mgr._make_progress_key("k")) is None:
        time.sleep(0.02)
    t0 = time.monotonic()
    _stop_jobs(grace_s=0.5)
    _ended(pid, timeout_s=3)
    assert time.monotonic() - t0 < 3


_SERVER = """
import sys, time
import diskcache
from memtp_sim.dashboard._context import AppContext
from memtp_sim.dashboard._jobs import JobManager


def job(result_key, progress_key, args, context):
    app_ctx = args[0]
    app_ctx.job_started(poll_s=0.1)
    time.sleep(120)
    app_ctx.manager.handle.set(result_key, "finished")


if __name__ == "__main__":  # the fork server's jobs import this file again, as __mp_main__
    mgr = JobManager(diskcache.Cache(sys.argv[1] + "/jobs"))
    app_ctx = AppContext.create(sys.argv[1], sys.argv[1], "none", mgr)
    print(mgr.call_job_fn("k", job, [app_ctx], {}), flush=True)
    time.sleep(120)
"""


def test_a_job_ends_soon_after_its_server_is_killed(tmp_path):
    # fault (review): after kill -9 of the server a job ran to its end, because every job holds the
    # fork server's keep-alive pipe (so the fork server lives on) and watched its parent, the fork server
    import subprocess
    import sys

    script = tmp_path / "server.py"
    script.write_text(_SERVER)
    server = subprocess.Popen([sys.executable, str(script), str(tmp_path)], stdout=subprocess.PIPE, text=True)
    job = fork_server = None
    try:
        job = int(server.stdout.readline())
        time.sleep(1.0)  # the job runs, and watches
        fork_server = psutil.Process(job).ppid()
        assert fork_server != server.pid and psutil.Process(job).is_running()
        server.kill()
        server.wait()
        _ended(job, timeout_s=5)
        _ended(fork_server, timeout_s=5)  # no job holds it open any more: it sees the server gone
    finally:
        if server.poll() is None:
            server.kill()
        for pid in (job, fork_server):  # a failing run leaves nothing behind either
            try:
                if pid:
                    psutil.Process(pid).kill()
            except psutil.NoSuchProcess:
                pass


def test_a_job_that_vanishes_between_dashs_pid_check_and_its_psutil_call_is_ended(cache, monkeypatch):
    # CI: "psutil.NoSuchProcess: process PID not found" from Dash's terminate_job -> HTTP 500 on a poll,
    # because the fork server reaps a finished job at once. Reproduce the gap: pid_exists says yes,
    # the process is gone.
    mgr = JobManager(cache)
    pid = mgr.call_job_fn("k", _job(cache, 7), [], {})
    _ended(pid)
    while psutil.pid_exists(pid):  # reaped by the fork server
        time.sleep(0.02)
    monkeypatch.setattr(psutil, "pid_exists", lambda p: True)
    mgr.terminate_job(pid)                 # no NoSuchProcess
    assert mgr.job_running(pid) is True    # ended with its result unread
    assert mgr.get_result("k", pid) == 7   # get_result terminates the job too: no NoSuchProcess
    assert mgr.job_running(pid) is False
    with pytest.raises(psutil.NoSuchProcess):  # what Dash's own manager does in that gap
        DiskcacheManager(cache).terminate_job(pid)

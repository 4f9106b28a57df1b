"""The worker pool behind `run --jobs N` and the dashboard (memtp_sim._procs.run_in_workers): a
worker killed with SIGKILL (as the out-of-memory killer does) costs only the item it was running,
which runs again on a fresh worker; an item that kills its worker on every try is given up after
LOST_WORKER_TRIES tries with the reason; an error raised by the function is raised in the caller;
no worker outlives the call. Every kill here is a real SIGKILL of a real worker process."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path

import pytest

from memtp_sim._procs import LOST_WORKER_TRIES, run_in_workers

FORK = multiprocessing.get_context("fork")  # the test module's functions exist in the workers as they are


def _square_or_die(item: tuple[int, str, str]) -> int:
    """``x * x``; logs each try to ``log``, and kills its own process when ``how`` says so:
    ``"once"`` on the first try only (a marker file remembers), ``"always"`` on every try."""
    x, how, log = item
    with open(log, "a") as f:
        f.write(f"{x} {os.getpid()}\n")
    if how == "always" or (how == "once" and not Path(f"{log}.{x}.died").exists()):
        Path(f"{log}.{x}.died").touch()
        os.kill(os.getpid(), signal.SIGKILL)
    return x * x


def _raise_on_one(x: int) -> int:
    if x == 1:
        raise ValueError("one is not welcome")
    return x


def _run(items, jobs=2):
    results, lost = {}, {}
    run_in_workers(_square_or_die, items, jobs, results.__setitem__, lost.__setitem__, context=FORK)
    return results, lost


def _tries(log: Path) -> dict[int, int]:
    out: dict[int, int] = {}
    for line in log.read_text().splitlines():
        x = int(line.split()[0])
        out[x] = out.get(x, 0) + 1
    return out


def test_a_killed_worker_costs_only_its_item_and_that_runs_again(tmp_path):
    log = tmp_path / "log"
    items = [(x, "once" if x == 3 else "", str(log)) for x in range(8)]
    results, lost = _run(items)
    assert lost == {}
    assert results == {i: i * i for i in range(8)}  # every item done, the killed one on its second try
    assert _tries(log) == {**{i: 1 for i in range(8)}, 3: 2}


def test_an_item_that_kills_every_worker_is_given_up_after_its_tries(tmp_path):
    log = tmp_path / "log"
    items = [(x, "always" if x == 2 else "", str(log)) for x in range(6)]
    results, lost = _run(items)
    assert LOST_WORKER_TRIES == 2
    assert results == {i: i * i for i in range(6) if i != 2}
    assert list(lost) == [2]
    assert lost[2] == ("its worker process died under it 2 time(s) "
                       "(last: killed by SIGKILL, as the out-of-memory killer does)")
    assert _tries(log) == {**{i: 1 for i in range(6)}, 2: 2}
    assert not multiprocessing.active_children()


def test_an_error_in_the_function_is_raised_here_and_no_worker_is_left(tmp_path):
    got = {}
    with pytest.raises(ValueError, match="one is not welcome") as e:
        run_in_workers(_raise_on_one, list(range(6)), 2, got.__setitem__, lambda i, why: None, context=FORK)
    assert any("_raise_on_one" in note for note in getattr(e.value, "__notes__", []))  # the worker's traceback
    assert not multiprocessing.active_children()


def test_more_jobs_than_items_start_one_worker_per_item(tmp_path):
    log = tmp_path / "log"
    results, lost = _run([(x, "", str(log)) for x in range(3)], jobs=16)
    assert results == {0: 0, 1: 1, 2: 4} and lost == {}
    assert len({line.split()[1] for line in log.read_text().splitlines()}) <= 3  # worker pids


def _kill_every_worker_once(item: tuple[int, str]) -> int:
    """Item 1, on its first try, waits until the other worker is idle, then kills every worker of
    the pool with SIGKILL (the other one first, its own process last)."""
    import psutil
    x, marker = item
    if x == 1 and not Path(marker).exists():
        Path(marker).touch()
        time.sleep(0.5)  # item 0 is done: its worker is idle
        me = os.getpid()
        for sibling in psutil.Process(os.getppid()).children():
            if sibling.pid != me and sibling.name() == psutil.Process(me).name():
                os.kill(sibling.pid, signal.SIGKILL)
        os.kill(me, signal.SIGKILL)
    return x


def test_all_workers_killed_while_one_is_idle_costs_no_item(tmp_path):
    # kill -9 of both workers near a study's end (one busy, one idle) crashed `run` with
    # "RuntimeError: Unexpected error within the Pool": Pebble gives up a pool in which a worker
    # died while no task ran, so the retried item needs a fresh pool
    for attempt in range(3):  # the pool may notice the idle worker's death before or after the busy one's
        marker = tmp_path / f"died{attempt}"
        results, lost = {}, {}
        run_in_workers(_kill_every_worker_once, [(0, str(marker)), (1, str(marker))], 2, results.__setitem__,
                       lost.__setitem__, context=FORK)
        assert results == {0: 0, 1: 1} and lost == {}
        assert marker.exists()
    assert not multiprocessing.active_children()

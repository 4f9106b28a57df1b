"""Worker processes that die with their parent, a worker pool that survives a lost worker, and
one-writer locks on result folders.

* :func:`die_with_parent` runs in each worker process (the initializer of :func:`run_in_workers`'
  workers in ``run``, or the first thing a tuning worker does): on Linux the kernel sends the worker SIGKILL when its parent
  dies (``prctl(PR_SET_PDEATHSIG)``), and on every platform a daemon thread exits the worker once
  its parent is gone. A ``kill -9`` of ``run`` or ``tune`` therefore leaves no idle or unsupervised
  workers behind.
* :func:`run_in_workers` maps a function over items in worker processes. Unlike
  :class:`concurrent.futures.ProcessPoolExecutor`, whose whole pool breaks when one worker dies (it
  fails every pending future with ``BrokenProcessPool`` and terminates the other workers), a worker
  killed here (for memory, say) costs only the item it was running: a fresh worker takes its place,
  the item is tried again, and it is given up after :data:`LOST_WORKER_TRIES` tries.
* :class:`FolderLock` is an exclusive, non-blocking ``flock`` on ``<folder>/.lock`` holding the
  owner's pid: a second ``run`` on a busy results folder says so and exits instead of redoing
  everything. The kernel releases the lock when the owner dies, however it dies.
"""

from __future__ import annotations

import collections
import ctypes
import ctypes.util
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from .errors import MemtpSimError

__all__ = ["die_with_parent", "exit_when", "run_in_workers", "LOST_WORKER_TRIES", "FolderLock", "FolderBusyError"]

_PR_SET_PDEATHSIG = 1


class FolderBusyError(MemtpSimError, RuntimeError):
    """Another process holds the results folder's lock (raised by :class:`FolderLock` on enter).

    A :class:`~memtp_sim.errors.MemtpSimError` and a :class:`RuntimeError`, like the package's
    other run-time errors (``memtp_sim/errors.py``).
    """


def die_with_parent(parent_pid: int | None = None, poll_s: float = 1.0) -> None:
    """Make this (worker) process exit when ``parent_pid`` dies.

    The default parent is the multiprocessing parent (known from the moment the worker started, so a
    parent that died while the worker was still importing is noticed), else ``os.getppid()``.

    Args:
        parent_pid: the process to outlive not; ``None`` picks the default above.
        poll_s: seconds between two checks of the watchdog thread.

    Source:
        Linux ``prctl(2)`` with ``PR_SET_PDEATHSIG`` (SIGKILL on parent death); elsewhere a
        daemon thread polls :func:`os.getppid` and leaves with :func:`os._exit`.
    """
    if parent_pid is None:
        mp_parent = multiprocessing.parent_process()
        parent_pid = mp_parent.pid if mp_parent is not None and mp_parent.pid else os.getppid()
    parent = parent_pid
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):  # no prctl: the watchdog below still works
            pass

    exit_when(lambda: os.getppid() != parent, poll_s, name="die-with-parent")
    if os.getppid() != parent:  # the parent died before the prctl took effect
        os._exit(1)


def exit_when(gone: Callable[[], bool], poll_s: float, *, name: str) -> None:
    """Start a daemon thread that ends this process (``os._exit(1)``) once ``gone()`` is true.

    For processes whose results nobody will read once their owner is gone (a pool worker, a
    dashboard job).

    Args:
        gone: the check, called every ``poll_s`` seconds from the thread.
        poll_s: seconds between two checks.
        name: the thread's name.
    """
    def watch() -> None:
        while not gone():
            time.sleep(poll_s)
        os._exit(1)  # the owner is gone: nobody will read our results

    threading.Thread(target=watch, name=name, daemon=True).start()


#: Tries an item gets when the worker process running it dies under it (killed for memory, a
#: crash): it runs again on a fresh worker, and after this many tries in all it is given up. The
#: model is Dask's ``distributed.scheduler.allowed-failures`` (a task whose workers died under it
#: more often than that fails with ``KilledWorker``); Dask allows 3 deaths, this one retry: an item
#: that exhausted memory twice will mostly do so again, and each try can take minutes.
LOST_WORKER_TRIES = 2

def _how_it_ended(exitcode: int | None) -> str:
    """How a worker process ended, in words: ``killed by SIGKILL (...)``, ``exited with code 1``."""
    if exitcode is None:
        return "ended without an exit code"
    if exitcode >= 0:
        return f"exited with code {exitcode}"
    try:
        name = signal.Signals(-exitcode).name
    except ValueError:
        name = f"signal {-exitcode}"
    return f"killed by {name}" + (", as the out-of-memory killer does" if -exitcode == signal.SIGKILL else "")


def run_in_workers(fn: Callable[[Any], Any], items: Sequence[Any], jobs: int,
                   on_result: Callable[[int, Any], None], on_lost: Callable[[int, str], None], *,
                   initializer: Callable[..., None] | None = None, initargs: tuple[Any, ...] = (),
                   context: Any = None, tries: int = LOST_WORKER_TRIES) -> None:
    """Run ``fn(item)`` for every item in worker processes, handing each result to this process as
    it comes (in the order they finish).

    A worker that dies while it runs an item (killed for memory, a crash) costs that item alone: a
    fresh worker takes its place and the item is queued again; after ``tries`` tries in all it is
    given up (``on_lost``). The other workers and the items queued behind them go on untouched.
    The pool is Pebble's :class:`pebble.ProcessPool`, which, unlike
    :class:`concurrent.futures.ProcessPoolExecutor`, fails only the dead worker's task
    (``ProcessExpired``) and starts another worker; the retries are this function's, and so is a
    fresh pool when Pebble gives one up (a worker dead while no task ran: every worker killed at
    once near the end), its queued items moved over without counting a try.

    Args:
        fn: the function, module-level (``spawn`` and ``forkserver`` pickle it).
        items: its arguments; each is pickled to the worker that runs it.
        jobs: worker processes at most (never more than there are items).
        on_result: ``on_result(index, fn(items[index]))``, called here.
        on_lost: ``on_lost(index, why)`` for an item given up, called here; ``why`` says how many
            tries and how the last worker ended, e.g. ``"its worker process died under it 2 time(s)
            (last: killed by SIGKILL, as the out-of-memory killer does)"``.
        initializer: called as ``initializer(*initargs)`` in each worker before its first item.
        context: a :mod:`multiprocessing` context (default: the platform's start method).
        tries: tries per item, at least 1.

    Raises:
        Exception: what ``fn`` raised (re-raised here, the worker's traceback in its notes), or what
            a callback raised; the workers are stopped first.
        KeyboardInterrupt: Ctrl-C; the workers are stopped before it propagates.
    """
    import pebble  # lazy: only `run --jobs N` and the dashboard's pool need it

    def new_pool() -> Any:
        return pebble.ProcessPool(max_workers=max(1, min(jobs, len(items))), initializer=initializer,
                                  initargs=initargs, context=context or multiprocessing.get_context())

    pools = [new_pool()]
    tried: collections.Counter[int] = collections.Counter()
    pending: dict[Any, int] = {}

    def submit(i: int) -> None:
        tried[i] += 1
        for attempt in range(2):
            try:
                pending[pools[-1].schedule(fn, args=(items[i],))] = i
                return
            except RuntimeError:  # the pool broke (below): this item and the rest go to a fresh one
                if attempt:
                    raise
                pools.append(new_pool())

    done = False
    try:
        for i in range(len(items)):
            submit(i)
        while pending:
            finished, _ = wait(list(pending), return_when=FIRST_COMPLETED)
            for fut in finished:
                i = pending.pop(fut)
                try:
                    value = fut.result()
                except pebble.ProcessExpired as e:  # the worker died under item i
                    if tried[i] < tries:
                        submit(i)
                    else:
                        on_lost(i, f"its worker process died under it {tried[i]} time(s) "
                                   f"(last: {_how_it_ended(e.exitcode)})")
                    continue
                except BrokenProcessPool:
                    # Pebble gives up a pool in which a worker died while no task ran ("All workers
                    # expired": both workers killed at once, the busy one's task already failed) and
                    # fails its queued tasks so: not the item's fault, not a try of its own
                    tried[i] -= 1
                    if not pools[-1].active:
                        pools.append(new_pool())
                    submit(i)
                    continue
                except Exception as e:
                    tb = getattr(e, "traceback", "")  # pebble keeps the worker's formatted traceback
                    if tb:
                        e.add_note(f"raised in a worker process:\n{tb}")
                    raise
                on_result(i, value)
        done = True
    finally:
        for pool in pools:
            if done:
                pool.close()  # every item is done: the workers exit
            else:  # Ctrl-C or an error: stop the workers now (they ignore SIGINT), not after their items
                pool.stop()
        for pool in pools:
            pool.join()


class FolderLock:
    """Exclusive lock on ``folder/.lock`` (see module docstring); a context manager.

    Args:
        folder: the results folder (created on enter if missing).
        what: a label written into the lock file with the pid, so a second owner can be told who
            holds it.

    Raises:
        FolderBusyError: on enter, when another live process holds the lock (message names it).

    Source:
        The advisory ``flock(2)`` lock of BSD and Linux with ``LOCK_EX | LOCK_NB``
        (:func:`fcntl.flock`); the kernel drops it when the descriptor is closed or its process dies.
    """

    def __init__(self, folder: str | os.PathLike[str], what: str = "a run") -> None:
        self.path = Path(folder) / ".lock"
        self.what = what
        self._fd: int | None = None

    def __enter__(self) -> "FolderLock":
        import fcntl  # POSIX only; imported here so that the module imports everywhere

        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            try:
                owner = os.pread(fd, 200, 0).decode(errors="replace").strip() or "unknown"
            finally:
                os.close(fd)
            raise FolderBusyError(f"{self.path.parent}: busy: {owner} is writing results here; wait for it to "
                                  "finish, or give another --out") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{self.what} (pid {os.getpid()}, since {time.strftime('%Y-%m-%d %H:%M:%S')})".encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None

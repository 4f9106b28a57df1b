"""Worker processes that die with their parent, and one-writer locks on result folders.

* :func:`die_with_parent` runs in each worker process (a ``ProcessPoolExecutor`` initializer, or the
  first thing a tuning worker does): on Linux the kernel sends the worker SIGKILL when its parent
  dies (``prctl(PR_SET_PDEATHSIG)``), and on every platform a daemon thread exits the worker once
  its parent is gone. A ``kill -9`` of ``run`` or ``tune`` therefore leaves no idle or unsupervised
  workers behind.
* :class:`FolderLock` is an exclusive, non-blocking ``flock`` on ``<folder>/.lock`` holding the
  owner's pid: a second ``run`` on a busy results folder says so and exits instead of redoing
  everything. The kernel releases the lock when the owner dies, however it dies.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from .errors import MemtpSimError

__all__ = ["die_with_parent", "exit_when", "FolderLock", "FolderBusyError"]

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

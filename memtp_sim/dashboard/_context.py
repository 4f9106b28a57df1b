"""What every page of the app shares: where runs and uploads live, and where studies are."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._procs import exit_when
from ._runs import RunStore
from ._settings import Workdir

__all__ = ["AppContext", "default_cache_dir"]


def _start_time(pid: int) -> float:
    import psutil

    return psutil.Process(pid).create_time()


def _alive(pid: int, started: float) -> bool:
    """Whether process ``pid``, started at ``started`` (psutil's create_time), still runs."""
    import psutil

    try:
        proc = psutil.Process(pid)
        return proc.create_time() == started and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def default_cache_dir() -> Path:
    """``<temp>/memtp_sim-dashboard-<uid>``: runs, uploads and the background-job cache.

    Returns:
        The folder (not created here).
    """
    uid = os.getuid() if hasattr(os, "getuid") else "user"
    return Path(tempfile.gettempdir()) / f"memtp_sim-dashboard-{uid}"


@dataclass
class AppContext:
    """The app's shared state (everything else lives in the browser or on disk).

    Attributes:
        workdir: uploads and derived profiles.
        store: cached runs.
        results: the folder holding finished studies (``--results``).
        study: the tuning study to open first (``--study``: a folder or a storage URL).
        manager: the Dash background-callback manager (:class:`._jobs.JobManager`).
        server_pid: the server's process id (the process that built the context).
        server_started: its start time (psutil ``create_time``), so a reused pid is not the server.
    """

    workdir: Workdir
    store: RunStore
    results: Path
    study: str
    manager: Any
    server_pid: int = field(default_factory=os.getpid)
    server_started: float = field(default_factory=lambda: _start_time(os.getpid()))

    def job_started(self, poll_s: float = 0.5) -> None:
        """Call first thing in a background-job process: the job exits when the server is gone.

        A watchdog thread checks that the server process (pid and start time, so a reused pid
        does not count) is alive. The job's parent is no guide: jobs are forked from the fork
        server (:mod:`._jobs`), and every job holds the fork server's keep-alive pipe open, so the
        fork server outlives a killed server for as long as any job runs. (Nor
        ``prctl(PR_SET_PDEATHSIG)`` as :func:`memtp_sim._procs.die_with_parent` uses: it follows the
        parent too, and the kernel sends it when the *thread* that forked the process ends.)

        Args:
            poll_s: seconds between two checks.
        """
        server, born = self.server_pid, self.server_started
        exit_when(lambda: not _alive(server, born), poll_s, name="exit-with-server")

    @classmethod
    def create(cls, cache_dir: str | Path, results: str | Path, study: str, manager: Any) -> AppContext:
        """Open (or create) the cache folder and bundle the app's settings.

        Args:
            cache_dir: the dashboard's work folder.
            results: the finished-studies folder.
            study: the tuning study folder or storage URL.
            manager: the background-callback manager.

        Returns:
            The context.
        """
        root = Path(cache_dir)
        root.mkdir(parents=True, exist_ok=True)
        return cls(Workdir(root), RunStore(root), Path(results), str(study), manager)

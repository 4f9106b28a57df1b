"""What every page of the app shares: where runs and uploads live, and where studies are."""

from __future__ import annotations

import os
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._runs import RunStore
from ._settings import Workdir

__all__ = ["AppContext", "default_cache_dir"]


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
    """

    workdir: Workdir
    store: RunStore
    results: Path
    study: str
    manager: Any

    def job_started(self, poll_s: float = 0.5) -> None:
        """Call first thing in a background-job process: the job exits when the server is gone.

        Jobs are forked from the fork server (:mod:`._jobs`), which exits when the server does;
        a watchdog thread sees the job's parent change and ends the job. (Not
        ``prctl(PR_SET_PDEATHSIG)`` as :func:`memtp_sim._procs.die_with_parent` uses: the kernel sends
        that signal when the *thread* that forked the process ends, and a job forked from a
        request thread would die as soon as that request was answered.)

        Args:
            poll_s: seconds between two checks.
        """
        parent = os.getppid()

        def watch() -> None:
            while os.getppid() == parent:
                time.sleep(poll_s)
            os._exit(1)  # the server is gone: nobody will read the result

        threading.Thread(target=watch, name="exit-with-server", daemon=True).start()

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

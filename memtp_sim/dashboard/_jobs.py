"""Background jobs: Dash's DiskcacheManager, started from a fork server and with three races closed.

Dash's :class:`~dash.DiskcacheManager` forks each background job from the web server. Four
things go wrong with that here, and :class:`JobManager` changes exactly those:

* **Forking a threaded server.** The server answers requests on threads (every progress poll
  reads the diskcache, i.e. SQLite). A fork copies whatever lock another thread held at that
  instant, and the job can hang on it for ever. Jobs start from a ``forkserver`` instead: a
  single-threaded process, started once with the dashboard's modules imported, that forks each
  job (CPython's own advice for threaded programs, and its default start method from 3.14).
  Forked jobs also inherited the server's SIGTERM handler, so stopping the server waited on them.
* **A result read as a cancellation.** On each poll Dash reads the job's result and then asks
  whether the job is still running; a job that writes its result and exits between the two
  looks cancelled, and the browser stops polling with the result unread (the page keeps the
  old numbers). :meth:`JobManager.job_running` answers "running" while an unread result waits.
* **A job that has just ended.** Dash checks that the job's pid exists and then asks psutil about
  it; the fork server reaps a finished job at once, so it can vanish in between, and psutil's
  NoSuchProcess became an HTTP 500 on the poll. Both calls treat a vanished job as ended.
* **A leftover result.** Results are keyed by the callback's arguments; a superseded job that
  finished before it was killed leaves its result behind, and a later job with the same
  arguments is handed that leftover and killed. :meth:`JobManager.call_job_fn` clears the key
  before it starts a job.
"""

from __future__ import annotations

from typing import Any

from dash import DiskcacheManager

__all__ = ["JobManager", "start_job_server"]

#: Modules the fork server imports once, so that a job starts in milliseconds.
PRELOAD = ["memtp_sim.dashboard"]


def _context() -> Any:
    import multiprocess  # Dash's own process library (dill pickles the job's closure)

    ctx = multiprocess.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def start_job_server() -> None:
    """Start the fork server now (about a second of imports), not on the first job.

    Call before the web server starts its threads; later calls do nothing.
    """
    from multiprocess import forkserver

    _context()
    forkserver.ensure_running()


class JobManager(DiskcacheManager):
    """A :class:`dash.DiskcacheManager` whose jobs start from a fork server, whose finished jobs
    are not mistaken for cancelled ones, and whose results are never a previous job's.

    Args:
        cache: the diskcache ``Cache`` that holds results and progress.
        **kwargs: ``cache_by`` and ``expire`` as for DiskcacheManager.
    """

    def __init__(self, cache: Any, **kwargs: Any) -> None:
        super().__init__(cache, **kwargs)
        self._keys: dict[int, str] = {}  # job pid -> its result key, until the result is read

    def call_job_fn(self, key: str, job_fn: Any, args: Any, context: Any) -> int:
        """Start ``job_fn`` in a process forked from the fork server; returns its pid."""
        for k in (key, self._make_progress_key(key), self._make_set_props_key(key)):
            self.handle.delete(k)  # a superseded job's leftovers are not this job's result
        proc = _context().Process(target=job_fn, args=(key, self._make_progress_key(key), args, context))
        proc.start()
        if len(self._keys) > 1000:  # results never read (closed tabs): forget the oldest
            for pid in list(self._keys)[:500]:
                del self._keys[pid]
        self._keys[proc.pid] = key
        return proc.pid

    def job_running(self, job: Any) -> bool:
        """Whether the job runs, or has ended leaving a result nobody has read yet."""
        import psutil

        try:
            if super().job_running(job):
                return True
        except psutil.NoSuchProcess:  # it ended between Dash's pid check and its look at the process
            pass
        key = self._keys.get(int(job)) if job else None
        return key is not None and self.result_ready(key)

    def terminate_job(self, job: Any) -> None:
        """Kill the job and its workers; a job that has already ended is left alone.

        (Dash checks the pid, then lists the process's children; the fork server reaps a finished
        job at once, so the process can vanish in between, and Dash's NoSuchProcess became an HTTP
        500 on the poll.)
        """
        import psutil

        try:
            super().terminate_job(job)
        except psutil.NoSuchProcess:
            pass

    def get_result(self, key: str, job: Any) -> Any:
        """The job's result (Dash's UNDEFINED while there is none); reading it forgets the job."""
        out = super().get_result(key, job)
        if out is not self.UNDEFINED and job:
            self._keys.pop(int(job), None)
        return out

"""The Dash what-if dashboard: move a knob, see the serving queue answer.

``python -m memtp_sim dashboard [--host 127.0.0.1] [--port 8050] [--study results/tune]
[--results results]`` serves three pages (see ``docs/dashboard.md``):

* ``/`` what-if: hardware, workload, deployment, policy and its parameters, confidence
  temperature and STS, max depth, MEMTP (fixed or elastic, r_low, r_high, head cost) and free
  memory; headline KPIs with a seed-replicate interval beside a pinned baseline and the
  difference, latency distributions, SPS(B) with the batch sizes the policy chose, the MEMTP
  timeline, and a load sweep (frontier, verify length vs load) that streams its points. The
  settings live in the URL.
* ``/study``: a finished study folder with its report's figures, interactive.
* ``/tune``: an Optuna study (feasible Pareto front, history, importances); a trial opens in the
  what-if page; the export button downloads what ``python -m memtp_sim export`` writes.

The app is a thin caller of the library: :func:`memtp_sim.run` (cached by
:func:`memtp_sim.study.run_key`), :class:`memtp_sim.config.Scenario` (its one-line errors),
:mod:`memtp_sim.report.numbers` and :mod:`memtp_sim.report.figures`, :mod:`memtp_sim.tuning`. Work
longer than about a second runs as a Dash background callback (:class:`._jobs.JobManager`, forked from a fork server)
with a progress bar and a cancel button; job processes die with the server.

Nothing in the library imports this package (floor 11 of ``docs/architecture.md``).
"""

from ._app import create_app, serve
from ._context import default_cache_dir
from ._settings import DEFAULTS

__all__ = ["DEFAULTS", "create_app", "default_cache_dir", "serve"]

"""The what-if page's runs: each computed once by :func:`memtp_sim.run`, kept on disk by run key.

A run lives in ``<workdir>/runs/<run key>/`` with the files a study writes for it
(``summary.json``, ``requests.csv``, ``rounds.parquet``), its key being
:func:`memtp_sim.study.run_key` (a hash of the resolved scenario, the seed and the contents of the
input files). A run is reused when its summary records the same input files
(:func:`memtp_sim.study.input_fingerprint`); going back to a setting is therefore instant, also
after a restart. Because the layout is a study's, the
report's aggregations (:mod:`memtp_sim.report.numbers`) read these runs unchanged, through a
:class:`~memtp_sim.report.StudyResults` built by :meth:`RunStore.results`.

KPIs are means over the replicate seeds with a t-distribution 95% interval
(:func:`memtp_sim.tuning.t_confidence_interval`); the delta against a baseline pairs the runs by
seed when both use the same seeds (common random numbers: the same requests and acceptance
draws), which is what makes a small change distinguishable from the noise.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._io import atomic_write_bytes, atomic_write_text, json_default
from .._procs import exit_when, run_in_workers
from ..api import run
from ..config import Scenario
from ..report import StudyResults
from ..study import input_fingerprint, run_key, runs_table
from ..tuning import t_confidence_interval

__all__ = ["KPIS", "RunStore", "Side", "kpi_rows", "point_keys", "usable_cpus"]

#: Headline KPIs of the what-if page: (metric, label, unit, higher is better).
KPIS: tuple[tuple[str, str, str, bool], ...] = (
    ("throughput_tok_per_s", "throughput", "tok/s", True),
    ("tok_per_s_user_p50", "tok/s/user p50", "tok/s", True),
    ("tok_per_s_user_p10", "tok/s/user p10", "tok/s", True),
    ("ttft_s_p50", "TTFT p50", "s", False),
    ("ttft_s_p99", "TTFT p99", "s", False),
    ("tpot_ms_p50", "TPOT p50", "ms", False),
    ("tpot_ms_p99", "TPOT p99", "ms", False),
    ("acceptance_rate", "acceptance rate", "", True),
    ("mean_verify_len", "mean verify length", "draft tokens", True),
    ("num_rejected", "rejected requests", "", False),
)

_MEMO_SIZE = 512


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity where the OS tells, else the CPU count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def _exit_with(parent: int, poll_s: float = 0.5) -> None:
    """Pool-worker initializer: exit when ``parent`` (the job that started the pool) is gone."""
    exit_when(lambda: os.getppid() != parent, poll_s, name="exit-with-job")


def _compute(task: tuple[str, dict[str, Any], int]) -> dict[str, Any]:
    """One run in a pool worker: ``(work folder, the scenario as its JSON dump, seed)``."""
    root, scenario, seed = task
    return RunStore(root).ensure(Scenario.model_validate(scenario), seed)


def point_keys(scenario: Scenario, seeds: Sequence[int]) -> list[str]:
    """The run keys of one what-if point (one per seed).

    Args:
        scenario: the point's scenario.
        seeds: its replicate seeds.

    Returns:
        :func:`memtp_sim.study.run_key` of each (scenario, seed), in seed order.
    """
    return [run_key(scenario, int(s)) for s in seeds]


@dataclass(frozen=True)
class Side:
    """One labelled set of runs to show (``current`` or ``baseline``, at one or many load levels).

    Attributes:
        label: the name in tables and legends.
        keys: run keys.
        x: the load level of each run (same length as ``keys``), or None for a single point.
    """

    label: str
    keys: tuple[str, ...]
    x: tuple[Any, ...] | None = None


class RunStore:
    """Runs on disk by run key (see the module docstring).

    Args:
        root: the dashboard's work folder; runs go to ``root/runs``.
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        (self.root / "runs").mkdir(parents=True, exist_ok=True)
        self._memo: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def run_dir(self, key: str) -> Path:
        """The folder of run ``key``."""
        return self.root / "runs" / key

    def load(self, key: str) -> dict[str, Any] | None:
        """The stored summary of run ``key`` (memoised), or None when it has none.

        Args:
            key: run key.

        Returns:
            The summary (``metrics``, ``scenario``, ``provenance``, ``inputs``, ...) or None.
        """
        if key in self._memo:
            self._memo.move_to_end(key)
            return self._memo[key]
        try:
            summary = json.loads((self.run_dir(key) / "summary.json").read_text())
        except (OSError, ValueError):
            return None
        self._remember(key, summary)
        return summary

    def _remember(self, key: str, summary: dict[str, Any]) -> None:
        self._memo[key] = summary
        while len(self._memo) > _MEMO_SIZE:
            self._memo.popitem(last=False)

    def cached(self, scenario: Scenario, seed: int) -> dict[str, Any] | None:
        """The stored result of (scenario, seed) if it was computed from the same input files.

        Args:
            scenario: the scenario.
            seed: the seed.

        Returns:
            Its summary, or None when it must be computed.
        """
        inputs = input_fingerprint(scenario)
        summary = self.load(run_key(scenario, int(seed), inputs))
        if summary is None or summary.get("inputs") != inputs:
            return None
        return summary

    def ensure(self, scenario: Scenario, seed: int,
               progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
        """The result of (scenario, seed): stored, or computed now by :func:`memtp_sim.run` and stored.

        Files are written atomically, ``summary.json`` last (it marks a complete run).

        Args:
            scenario: the scenario.
            seed: the seed.
            progress: ``progress(done_requests, total_requests)`` while a run computes.

        Returns:
            The run's summary.
        """
        done = self.cached(scenario, seed)
        if done is not None:
            return done
        key = run_key(scenario, int(seed))
        res = run(scenario, seed=int(seed), progress=progress)
        folder = self.run_dir(key)
        for name, data in res.files().items():
            atomic_write_bytes(folder / name, data)
        summary = {**res.summary(), "run_id": key, "labels": {}, "status": "ok",
                   "inputs": input_fingerprint(scenario), "computed_at": time.time()}
        atomic_write_text(folder / "summary.json", json.dumps(summary, default=json_default, allow_nan=True))
        summary = json.loads(json.dumps(summary, default=json_default, allow_nan=True))
        self._remember(key, summary)
        return summary

    def ensure_all(self, runs: Sequence[tuple[Scenario, int]], *, workers: int = 1,
                   on_done: Callable[[int, dict[str, Any]], None] | None = None,
                   progress: Callable[[int, int, int], None] | None = None) -> list[dict[str, Any]]:
        """The results of many (scenario, seed) runs; those not stored are computed, in parallel.

        With ``workers`` > 1 the runs to compute go to a pool of that many worker processes
        (forked from this one; each exits when this process is gone), in the order given; runs
        finish in any order. A worker that dies (killed for memory, say) costs only its run, which
        is tried again on a fresh worker (:func:`memtp_sim._procs.run_in_workers`).

        Args:
            runs: ``(scenario, seed)`` pairs.
            workers: processes that compute at once (1: in this process).
            on_done: ``on_done(index, summary)`` as each run is available (stored ones first).
            progress: ``progress(index, done_requests, total_requests)`` within a run computed in
                this process (``workers`` 1).

        Returns:
            The summaries, in the order of ``runs``.

        Raises:
            RuntimeError: a run whose worker died under it on every try (the others are stopped).
            Exception: what a run raised (e.g. :class:`~memtp_sim.errors.ConfigError`).
        """
        out: dict[int, dict[str, Any]] = {}
        todo = []
        for i, (scen, seed) in enumerate(runs):
            done = self.cached(scen, seed)
            if done is None:
                todo.append(i)
            else:
                out[i] = done
                if on_done is not None:
                    on_done(i, done)
        if workers <= 1 or len(todo) <= 1:
            for i in todo:
                scen, seed = runs[i]
                report = None if progress is None else (lambda d, n, i=i: progress(i, d, n))
                out[i] = self.ensure(scen, seed, progress=report)
                if on_done is not None:
                    on_done(i, out[i])
            return [out[i] for i in range(len(runs))]

        def done(j: int, summary: dict[str, Any]) -> None:
            i = todo[j]
            out[i] = summary
            self._remember(summary["run_id"], summary)
            if on_done is not None:
                on_done(i, summary)

        def lost(j: int, why: str) -> None:
            scen, seed = runs[todo[j]]
            raise RuntimeError(f"run {run_key(scen, int(seed))} (seed {seed}): worker lost: {why}")

        tasks = [(str(self.root), runs[i][0].model_dump(mode="json"), int(runs[i][1])) for i in todo]
        run_in_workers(_compute, tasks, workers, done, lost, initializer=_exit_with, initargs=(os.getpid(),),
                       context=multiprocessing.get_context("fork"))
        return [out[i] for i in range(len(runs))]

    def have(self, keys: Sequence[str]) -> bool:
        """Whether every run of ``keys`` has a stored summary."""
        return all(self.load(k) is not None for k in keys)

    def results(self, sides: Sequence[Side], x_key: str | None = None) -> StudyResults:
        """The runs of ``sides`` as a study, for :mod:`memtp_sim.report.numbers`.

        The study's ``policy`` column holds each side's label (``current``, ``baseline``) and, with
        ``x_key``, that column holds each run's load level; runs without a summary are left out.

        Args:
            sides: the labelled runs.
            x_key: the load axis (e.g. ``workload.concurrency``) when the sides are sweeps.

        Returns:
            A :class:`~memtp_sim.report.StudyResults` rooted at this store.
        """
        rows, summaries = [], {}
        for side in sides:
            for i, key in enumerate(side.keys):
                s = self.load(key)
                if s is None:
                    continue
                labels = {"policy": side.label}
                if x_key is not None and side.x is not None:
                    labels[x_key] = side.x[i]
                rows.append({**s, "labels": labels})
                summaries[key] = s
        meta = {"name": "what-if", "sweep_keys": [x_key] if x_key else [],
                "runs": [{"run_id": r["run_id"], "labels": r["labels"], "seed": r["seed"]} for r in rows]}
        return StudyResults(self.root, meta, runs_table(rows), summaries)


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))


def kpi_rows(current: Sequence[dict[str, Any]], baseline: Sequence[dict[str, Any]] | None = None,
             level: float = 0.95) -> list[dict[str, Any]]:
    """Headline KPIs of the current runs, and of the baseline with the difference, as table rows.

    Args:
        current: the current point's run summaries (one per seed).
        baseline: the baseline's run summaries, or None.
        level: confidence level of the intervals.

    Returns:
        One row per :data:`KPIS` entry: ``metric``, ``label``, ``unit``, ``higher_is_better``,
        ``current`` (:func:`~memtp_sim.tuning.t_confidence_interval` over seeds) and, with a
        baseline, ``baseline`` (the same) and ``delta``: the interval of current minus baseline,
        ``paired`` True when both used the same seeds (per-seed differences), otherwise the
        difference of the means with the two half-widths combined in quadrature; ``delta["beyond_noise"]``
        is True when the interval excludes 0.
    """
    rows = []
    cur_seeds = [s["seed"] for s in current]
    base_seeds = [s["seed"] for s in baseline] if baseline else []
    paired = bool(baseline) and sorted(cur_seeds) == sorted(base_seeds) and len(cur_seeds) >= 2
    for metric, label, unit, up in KPIS:
        cv = [s["metrics"].get(metric, float("nan")) for s in current]
        row: dict[str, Any] = {"metric": metric, "label": label, "unit": unit, "higher_is_better": up,
                               "current": t_confidence_interval(cv, level)}
        if baseline:
            bv = [s["metrics"].get(metric, float("nan")) for s in baseline]
            row["baseline"] = t_confidence_interval(bv, level)
            if paired:
                by_seed = {s["seed"]: s["metrics"].get(metric, float("nan")) for s in baseline}
                delta = t_confidence_interval([s["metrics"].get(metric, float("nan")) - by_seed[s["seed"]]
                                               for s in current], level)
            else:
                c, b = row["current"], row["baseline"]
                half = math.hypot(c["half_width"], b["half_width"])
                mean = c["mean"] - b["mean"]
                delta = {"mean": mean, "half_width": half, "low": mean - half, "high": mean + half, "n": None}
            delta["paired"] = paired
            delta["beyond_noise"] = bool(_finite(delta["low"]) and _finite(delta["high"])
                                         and (delta["low"] > 0 or delta["high"] < 0))
            row["delta"] = delta
        rows.append(row)
    return rows

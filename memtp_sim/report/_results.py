"""A finished study read back from disk: runs.csv, study.json, each run's summary and files.

Nothing here aggregates or draws; :mod:`memtp_sim.report.numbers` does the arithmetic.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..errors import ConfigError
from ..study import collect_runs

__all__ = ["LOAD_AXES", "StudyResults", "load_phases", "load_results"]

# sweep keys that are a load axis: the report puts the first one present on the x axis
LOAD_AXES = ("workload.concurrency", "workload.rate_per_s", "workload.rate_scale")


@dataclass(frozen=True)
class StudyResults:
    """A finished study read back from disk.

    Attributes:
        root: the study folder (``results/<study>/``).
        meta: ``study.json`` (name, description, ``sweep_keys``, optional ``report_x``, ...).
        table: one row per finished run (``run_id``, sweep keys, ``policy``, ``seed``, metrics),
            rebuilt from the run folders (``runs.csv`` is only a copy). A sweep key's cell is
            empty where the key does not apply to the run (``policy.gamma`` for no_spec).
        summaries: each finished run's ``summary.json`` by run id.
        missing: ``run_id -> reason`` for every run of the study without a verified result (failed,
            not run yet, or damaged files); the report says so at the top.

    Source:
        The study layout written by :mod:`memtp_sim.study` (``study.json``, ``runs/<id>/``),
        read back by :func:`memtp_sim.study.collect_runs`.
    """

    root: Path
    meta: dict[str, Any]
    table: pd.DataFrame
    summaries: dict[str, dict[str, Any]]
    missing: dict[str, str] = field(default_factory=dict)

    @property
    def num_planned(self) -> int:
        """Runs the study has (finished or not)."""
        return len(self.meta.get("runs", [])) or len(self.table)

    @property
    def sweep_keys(self) -> list[str]:
        """The study's sweep dimensions in YAML order (``variant`` first when present)."""
        return list(self.meta.get("sweep_keys", []))

    @property
    def x_key(self) -> str | None:
        """The sweep key on the figures' x axis: ``report_x``, else the first load axis, else the
        first sweep key; None without a sweep."""
        if self.meta.get("report_x"):
            return str(self.meta["report_x"])
        for k in LOAD_AXES:
            if k in self.sweep_keys:
                return k
        return self.sweep_keys[0] if self.sweep_keys else None

    @property
    def facet_keys(self) -> list[str]:
        """The sweep keys other than :attr:`x_key`: one set of figures per combination."""
        return [k for k in self.sweep_keys if k != self.x_key]

    @property
    def grouped_table(self) -> pd.DataFrame:
        """:attr:`table` for splitting by the sweep keys (facets, the x axis): a run whose label for
        a key is empty, because the key does not apply to it (``policy.gamma`` for no_spec, which
        runs once in a sweep of it: :meth:`memtp_sim.config.Study.expand`), is repeated under every
        value the key takes, so it sits beside each of them. Per-run listings use :attr:`table`."""
        t = self.table
        for k in self.sweep_keys:
            if k not in t:
                continue
            unset = t[k].isna().to_numpy()
            values = list(dict.fromkeys(t.loc[~unset, k]))
            if not unset.any() or not values:
                continue
            # each unset row becomes len(values) consecutive rows, in table order
            t = t.loc[t.index.repeat(np.where(unset, len(values), 1))].reset_index(drop=True)
            t.loc[t[k].isna().to_numpy(), k] = values * int(unset.sum())
        return t

    @property
    def policies(self) -> list[str]:
        """Policy labels in the order runs.csv first lists them."""
        return list(dict.fromkeys(self.table["policy"]))

    @property
    def first_summary(self) -> dict[str, Any]:
        """The first run's summary (hardware and acceptance provenance are the same in every run),
        or ``{}`` when no run has one."""
        return next(iter(self.summaries.values()), {})

    @property
    def uses_memtp(self) -> bool:
        """True when any run drives the MEMTP ensemble (``scenario.memtp.depth`` set)."""
        return any((s.get("scenario", {}).get("memtp", {}) or {}).get("depth") is not None
                   for s in self.summaries.values())

    def run_file(self, run_id: str, name: str) -> Path:
        """Path of one of a run's files (``requests.csv``, ``rounds.parquet``, ...); may not exist.

        Args:
            run_id: the run's id (its folder under ``runs/``).
            name: the file name inside the run folder.

        Returns:
            ``root / "runs" / run_id / name``.
        """
        return self.root / "runs" / run_id / name


def load_results(root: str | Path) -> StudyResults:
    """Read a study folder: study.json (the study's runs) and every run folder whose files verify.

    The table is rebuilt from the run folders, never trusted from ``runs.csv``, so a truncated or
    stale ``runs.csv`` cannot make a report silently cover fewer runs; runs without a verified
    result are listed in :attr:`StudyResults.missing`.

    Args:
        root: the study folder, e.g. ``results/load``.

    Returns:
        The study (its table typed as a CSV round trip would type it, e.g. a sweep column holding
        ``1, 5, elastic`` reads as text).

    Raises:
        ConfigError: study.json is missing or unreadable (from
            :func:`memtp_sim.study.collect_runs`), or no run of the study has a verified result.

    Source:
        :func:`memtp_sim.study.collect_runs` (results rebuilt from the run folders).
    """
    root = Path(root)
    table, summaries, missing = collect_runs(root)
    meta = json.loads((root / "study.json").read_text())
    if table.empty:
        raise ConfigError(f"{root}: none of the study's {len(missing)} runs has a verified result "
                          f"(e.g. {next(iter(missing.items()), ('', 'no runs'))[1]}); run the study again")
    table = pd.read_csv(io.StringIO(table.to_csv(index=False)), dtype={"run_id": str})
    for k in meta.get("sweep_keys", []):
        col = table.get(k)
        if col is not None and col.dtype.kind == "f" and col.isna().any() and (col.dropna() % 1 == 0).all():
            table[k] = col.astype("Int64")  # whole numbers with empty cells (a key some runs lack) stay 3, not 3.0
    if meta.get("report_series") == "variant" and "variant" in table:
        # each variant is one setup (drafter, controller, acceptance): draw it as one line; a run
        # that no variant changes (its variant label empty) is drawn as its policy
        table["policy"] = [str(v) if pd.notna(v) else p for v, p in zip(table["variant"], table["policy"])]
        meta = {**meta, "sweep_keys": [k for k in meta.get("sweep_keys", []) if k != "variant"]}
    return StudyResults(root, meta, table, summaries, missing)


def load_phases(summary: dict[str, Any]) -> list[tuple[float, float, float]]:
    """(start_s, end_s, rate_per_s) of a run's load-ramp segments, or [] without a ramp.

    Args:
        summary: a run's ``summary.json`` (``scenario.workload.rate_schedule``: a list of
            ``{duration_s, rate_per_s}``).

    Returns:
        One ``(start_s, end_s, rate_per_s)`` per segment: seconds from the run's start, and
        requests per second; segments are back to back from 0.

    Source:
        The piecewise-constant Poisson ramp of :func:`memtp_sim.workload.build_workload`.
    """
    sched = (summary.get("scenario", {}).get("workload", {}) or {}).get("rate_schedule") or []
    out, t = [], 0.0
    for seg in sched:
        out.append((t, t + float(seg["duration_s"]), float(seg["rate_per_s"])))
        t += float(seg["duration_s"])
    return out

"""Run a study: every (sweep point, policy, seed) through :func:`memtp_sim.api.run`.

Results go under ``<out>/<study name>/``::

    runs/<run_id>/summary.json   config, seed, version, provenance (profiles, sources), metrics
    runs/<run_id>/requests.csv   one row per request
    runs/<run_id>/rounds.parquet one row per engine round
    runs.csv                     one row per run: sweep labels + headline metrics
    report.html                  Plotly report (see :mod:`memtp_sim.report`)

Every file is written atomically (temporary file + rename), so an interrupted study leaves only
complete runs behind; running the study again skips every run whose ``summary.json`` matches its
scenario and seed (resume). ``force=True`` recomputes everything.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pandas as pd
import yaml

from ._io import atomic_write_bytes, atomic_write_text, file_digest, json_default
from .acceptance import DEFAULT_ACCEPTANCE, acceptance_dir
from .api import run
from .config import Scenario, Study
from .hardware import list_profiles
from .errors import ConfigError

__all__ = ["RunSpec", "plan_runs", "run_study", "input_fingerprint", "check_writable", "runs_table"]


@dataclass(frozen=True)
class RunSpec:
    """One run of a study."""

    run_id: str
    labels: dict[str, Any]
    scenario: Scenario
    seed: int


def input_fingerprint(scenario: Scenario) -> dict[str, str]:
    """Content digests of the files a run reads (trace, hardware profile and its measurements,
    acceptance profile), so that resuming never reuses results computed from different inputs."""
    out = {"trace": file_digest(Path(scenario.workload.trace))}
    hw = Path(scenario.hardware.profile)
    hw = hw if hw.suffix in (".yaml", ".yml") else list_profiles()[scenario.hardware.profile]
    out["hardware"] = file_digest(hw)
    csv_name = (yaml.safe_load(hw.read_text()) or {}).get("measurements")
    if csv_name and (hw.parent / csv_name).is_file():
        out["measurements"] = file_digest(hw.parent / csv_name)
    if scenario.acceptance.alpha is None:
        acc = Path(scenario.acceptance.profile or DEFAULT_ACCEPTANCE)
        acc = acc if acc.suffix in (".yaml", ".yml") else acceptance_dir() / f"{acc}.yaml"
        out["acceptance"] = file_digest(acc)
    return out


def _key(scenario: Scenario, seed: int) -> str:
    blob = json.dumps({"scenario": scenario.model_dump(mode="json"), "seed": seed}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:10]


def plan_runs(study: Study, *, source: str = "<study>") -> list[RunSpec]:
    """Expand a study into run specs with stable, content-derived ids."""
    out = []
    for idx, (labels, scen, seed) in enumerate(study.expand(source=source)):
        out.append(RunSpec(f"{idx:04d}-{_key(scen, seed)}", labels, scen, seed))
    return out


def _execute(spec: RunSpec, run_dir: str, progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Run one spec and write its files (summary.json last, so it marks completion)."""
    res = run(spec.scenario, seed=spec.seed, progress=progress)
    d = Path(run_dir)
    buf = io.StringIO()
    res.requests_frame().to_csv(buf, index=False)
    atomic_write_text(d / "requests.csv", buf.getvalue())
    pbuf = io.BytesIO()
    res.rounds_frame().to_parquet(pbuf, index=False)
    atomic_write_bytes(d / "rounds.parquet", pbuf.getvalue())
    summary = res.summary()
    summary["run_id"] = spec.run_id
    summary["labels"] = spec.labels
    summary["inputs"] = input_fingerprint(spec.scenario)
    atomic_write_text(d / "summary.json", json.dumps(summary, indent=2, default=json_default, allow_nan=True))
    return summary


def _load_done(run_dir: Path, spec: RunSpec) -> dict[str, Any] | None:
    f = run_dir / "summary.json"
    if not f.is_file():
        return None
    try:
        s = json.loads(f.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    same = (s.get("seed") == spec.seed and s.get("scenario") == spec.scenario.model_dump(mode="json")
            and s.get("inputs") == input_fingerprint(spec.scenario))
    files = all((run_dir / f).is_file() for f in ("requests.csv", "rounds.parquet"))
    return s if same and files else None


def check_writable(root: Path) -> None:
    """Raise ConfigError now if results cannot be written under ``root`` (before any run)."""
    try:
        (root / "runs").mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(root / ".write-check", b"")
        (root / ".write-check").unlink()
    except OSError as e:
        raise ConfigError(f"{root}: cannot write results here ({e.strerror}); choose another --out") from None


def runs_table(summaries: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per run: labels, seed and every scalar metric."""
    rows = []
    for s in summaries:
        row = {"run_id": s["run_id"], **s["labels"], "seed": s["seed"]}
        row.update({k: v for k, v in s["metrics"].items() if not isinstance(v, dict)})
        rows.append(row)
    return pd.DataFrame(rows)


def run_study(
    study: Study,
    *,
    out_dir: str | Path = "results",
    jobs: int | None = None,
    force: bool = False,
    source: str = "<study>",
    on_progress: Callable[[int, int, str], None] | None = None,
    on_run_progress: Callable[[int, int], None] | None = None,
) -> tuple[Path, pd.DataFrame]:
    """Run (or resume) every run of ``study`` and write runs.csv.

    Args:
        out_dir: parent folder; the study writes into ``out_dir/<study.name>``.
        jobs: worker processes (default: CPU count); 1 runs in this process.
        force: recompute runs that already have results.
        on_progress: ``on_progress(done, total, run_id)`` after each run.
        on_run_progress: ``on_run_progress(done_requests, total_requests)`` within each run, when
            runs execute in this process (``jobs == 1`` or a single run left).

    Returns:
        (study folder, runs table).

    Raises:
        ConfigError: the results folder cannot be written (checked before anything runs).
    """
    root = Path(out_dir) / study.name
    check_writable(root)
    specs = plan_runs(study, source=source)
    summaries: dict[str, dict[str, Any]] = {}
    todo: list[RunSpec] = []
    for spec in specs:
        done = None if force else _load_done(root / "runs" / spec.run_id, spec)
        if done is not None:
            summaries[spec.run_id] = done
        else:
            todo.append(spec)
    total = len(specs)
    if on_progress is not None:
        on_progress(len(summaries), total, "")
    jobs = max(1, jobs or os.cpu_count() or 1)
    if jobs == 1 or len(todo) <= 1:
        for spec in todo:
            summaries[spec.run_id] = _execute(spec, str(root / "runs" / spec.run_id), on_run_progress)
            if on_progress is not None:
                on_progress(len(summaries), total, spec.run_id)
    else:
        with ProcessPoolExecutor(max_workers=min(jobs, len(todo))) as pool:
            futs = {pool.submit(_execute, spec, str(root / "runs" / spec.run_id)): spec for spec in todo}
            try:
                for fut in as_completed(futs):
                    spec = futs[fut]
                    summaries[spec.run_id] = fut.result()
                    if on_progress is not None:
                        on_progress(len(summaries), total, spec.run_id)
            except BaseException:
                for f in futs:
                    f.cancel()
                raise
    ordered = [summaries[s.run_id] for s in specs]
    table = runs_table(ordered)
    atomic_write_text(root / "runs.csv", table.to_csv(index=False))
    atomic_write_text(root / "study.json", json.dumps({
        "name": study.name,
        "description": study.description,
        "source": source,
        "study": study.model_dump(mode="json"),
        "sweep_keys": study.label_keys,
        "report_x": study.report_x,
    }, indent=2))
    return root, table

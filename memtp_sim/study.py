"""Run a study: every (sweep point, policy, seed) through :func:`memtp_sim.api.run`.

Results go under ``<out>/<study name>/``::

    runs/<run_id>/summary.json   config, seed, version, provenance (profiles, sources), metrics
    runs/<run_id>/requests.csv   one row per request
    runs/<run_id>/rounds.parquet one row per engine round
    runs.csv                     one row per run: sweep labels + headline metrics
    report.html                  Plotly report (see :mod:`memtp_sim.report`)

Every file is written atomically (temporary file + rename), and ``summary.json`` (written last)
records the size and digest of the run's other files, so an interrupted or damaged run is never
taken for a finished one. Runs are keyed by content (scenario + seed): running the study again
reuses every run whose scenario, seed, input files and result files verify (resume), and says how
many. A run that fails is recorded (``runs/<id>/failed.json``) and the study finishes the rest.
``force=True`` recomputes everything. ``runs.csv`` is a copy; :func:`collect_runs` rebuilds the
results from the run folders.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pandas as pd
import yaml

from ._io import atomic_write_bytes, atomic_write_text, file_digest, json_default
from ._procs import FolderLock, die_with_parent
from .acceptance import DEFAULT_ACCEPTANCE, acceptance_dir
from .api import run
from .config import Scenario, Study
from .hardware import list_profiles
from .errors import ConfigError

__all__ = ["RunSpec", "StudyOutcome", "plan_runs", "run_key", "run_study", "input_fingerprint", "check_writable",
           "runs_table", "collect_runs", "verify_run_files"]


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


def run_key(scenario: Scenario, seed: int) -> str:
    """The run's id: a hash of its resolved scenario and seed only (not its place in the sweep), so
    adding a seed or a sweep value keeps every other run's results."""
    blob = json.dumps({"scenario": scenario.model_dump(mode="json"), "seed": seed}, sort_keys=True)
    return "r" + hashlib.sha256(blob.encode()).hexdigest()[:12]


def plan_runs(study: Study, *, source: str = "<study>") -> list[RunSpec]:
    """Expand a study into run specs with content-derived ids.

    Raises:
        ConfigError: two points of the study resolve to the same scenario and seed (a value listed
            twice, or variants that change nothing), which would run the same thing twice.
    """
    out: list[RunSpec] = []
    seen: dict[str, dict[str, Any]] = {}
    for labels, scen, seed in study.expand(source=source):
        rid = run_key(scen, seed)
        if rid in seen:
            raise ConfigError(f"{source}: the points {seen[rid]} and {labels} (seed {seed}) are the same scenario; "
                              "list each value once and make each variant change something")
        seen[rid] = labels
        out.append(RunSpec(rid, labels, scen, seed))
    return out


#: Files of a finished run; summary.json (written last) records their sizes and digests.
RUN_FILES = ("requests.csv", "rounds.parquet")


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _execute(spec: RunSpec, run_dir: str, progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Run one spec and write its files (summary.json last, with the size and digest of the
    others, so it marks a complete run). A run that fails writes ``failed.json`` instead and
    returns a record with ``status: failed`` and the reason; the study goes on."""
    d = Path(run_dir)
    try:
        res = run(spec.scenario, seed=spec.seed, progress=progress)
    except Exception as e:  # noqa: BLE001 - any failure of one run is recorded; Ctrl-C still stops the study
        # a run that cannot complete is recorded with its reason (the study finishes the rest)
        record = {"run_id": spec.run_id, "labels": spec.labels, "seed": spec.seed, "status": "failed",
                  "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(limit=8)}
        atomic_write_text(d / "failed.json", json.dumps(record, indent=2, default=json_default))
        return record
    buf = io.StringIO()
    res.requests_frame().to_csv(buf, index=False)
    blobs = {"requests.csv": buf.getvalue().encode()}
    pbuf = io.BytesIO()
    res.rounds_frame().to_parquet(pbuf, index=False)
    blobs["rounds.parquet"] = pbuf.getvalue()
    for name, data in blobs.items():
        atomic_write_bytes(d / name, data)
    summary = res.summary()
    summary["run_id"] = spec.run_id
    summary["labels"] = spec.labels
    summary["status"] = "ok"
    summary["inputs"] = input_fingerprint(spec.scenario)
    summary["files"] = {name: {"bytes": len(data), "sha256": _digest(data)} for name, data in blobs.items()}
    atomic_write_text(d / "summary.json", json.dumps(summary, indent=2, default=json_default, allow_nan=True))
    (d / "failed.json").unlink(missing_ok=True)
    return summary


def verify_run_files(run_dir: Path, summary: dict[str, Any]) -> str | None:
    """Why a run folder's result files do not match what its summary recorded (None if they do)."""
    files = summary.get("files")
    if not isinstance(files, dict) or set(files) != set(RUN_FILES):
        return "summary.json does not record its result files"
    for name, rec in files.items():
        f = run_dir / name
        try:
            data = f.read_bytes()
        except OSError:
            return f"{name} is missing"
        if len(data) != rec.get("bytes") or _digest(data) != rec.get("sha256"):
            return f"{name} is damaged (size or digest differs from summary.json)"
    return None


def _load_done(run_dir: Path, spec: RunSpec) -> dict[str, Any] | None:
    """The run's summary if the run finished with these inputs and its files verify, else None."""
    f = run_dir / "summary.json"
    if not f.is_file():
        return None
    try:
        s = json.loads(f.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    same = (isinstance(s, dict) and s.get("seed") == spec.seed
            and s.get("scenario") == spec.scenario.model_dump(mode="json")
            and s.get("inputs") == input_fingerprint(spec.scenario))
    return s if same and verify_run_files(run_dir, s) is None else None


def check_writable(root: Path) -> None:
    """Check now, before any run, that results can be written under ``root``.

    Raises:
        ConfigError: the folder cannot be created or written (one line naming it).
    """
    try:
        (root / "runs").mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(root / ".write-check", b"")
        (root / ".write-check").unlink()
    except OSError as e:
        raise ConfigError(f"{root}: cannot write results here ({e.strerror}); choose another --out") from None


def runs_table(summaries: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per finished run: labels, seed and every scalar metric (failed runs are left out;
    :class:`StudyOutcome` lists them)."""
    rows = []
    for s in summaries:
        if s.get("status", "ok") != "ok":
            continue
        row = {"run_id": s["run_id"], **s["labels"], "seed": s["seed"]}
        row.update({k: v for k, v in s["metrics"].items() if not isinstance(v, dict)})
        rows.append(row)
    return pd.DataFrame(rows)


@dataclass
class StudyOutcome:
    """What :func:`run_study` did.

    Attributes:
        root: the study's results folder.
        table: one row per finished run (also written to ``runs.csv``).
        num_runs: runs the study has.
        num_reused: finished runs found on disk with the same scenario, seed, inputs and intact files.
        num_ran: runs computed now.
        failed: ``run_id -> reason`` for runs that could not complete (retried by the next ``run``).
        num_stale: run folders under ``runs/`` that belong to no run of this study (left untouched).
    """

    root: Path
    table: pd.DataFrame
    num_runs: int
    num_reused: int
    num_ran: int
    failed: dict[str, str]
    num_stale: int


def _worker_init() -> None:
    die_with_parent()  # a kill -9 of `run` must not leave workers behind


def _run_todo(todo: list[RunSpec], root: Path, jobs: int, on_done: Callable[[dict[str, Any]], None],
              on_run_progress: Callable[[int, int], None] | None) -> None:
    """Execute ``todo`` in this process (jobs 1) or in worker processes that die with this one."""
    if jobs == 1 or len(todo) <= 1:
        for spec in todo:
            on_done(_execute(spec, str(root / "runs" / spec.run_id), on_run_progress))
        return
    with ProcessPoolExecutor(max_workers=min(jobs, len(todo)), initializer=_worker_init) as pool:
        futs = {pool.submit(_execute, spec, str(root / "runs" / spec.run_id)): spec for spec in todo}
        try:
            for fut in as_completed(futs):
                spec = futs[fut]
                try:
                    rec = fut.result()
                except BrokenProcessPool as e:  # a worker died (e.g. killed for memory)
                    rec = {"run_id": spec.run_id, "labels": spec.labels, "seed": spec.seed, "status": "failed",
                           "error": f"worker process died ({e.__class__.__name__})"}
                on_done(rec)
        except BaseException:
            for f in futs:
                f.cancel()
            raise


def run_study(
    study: Study,
    *,
    out_dir: str | Path = "results",
    jobs: int | None = None,
    force: bool = False,
    source: str = "<study>",
    on_progress: Callable[[int, int, str], None] | None = None,
    on_run_progress: Callable[[int, int], None] | None = None,
) -> StudyOutcome:
    """Run (or resume) every run of ``study``; write runs.csv and study.json.

    Runs are keyed by content (:func:`run_key`): a finished run is reused when its scenario, seed,
    input files and result files all match. A run that fails is recorded with its reason and the
    others go on. Only one ``run`` may write a results folder at a time.

    Args:
        out_dir: parent folder; the study writes into ``out_dir/<study.name>``.
        jobs: worker processes (default: CPU count); 1 runs in this process.
        force: recompute runs that already have results.
        on_progress: ``on_progress(done, total, run_id)`` after each run.
        on_run_progress: ``on_run_progress(done_requests, total_requests)`` within each run, when
            runs execute in this process (``jobs == 1`` or a single run left).

    Returns:
        A :class:`StudyOutcome`.

    Raises:
        ConfigError: the results folder cannot be written (checked before anything runs).
        FolderBusyError: another process is writing this study's results.
    """
    root = Path(out_dir) / study.name
    check_writable(root)
    specs = plan_runs(study, source=source)
    with FolderLock(root, what=f"memtp_sim run {source}"):
        records: dict[str, dict[str, Any]] = {}
        todo: list[RunSpec] = []
        for spec in specs:
            done = None if force else _load_done(root / "runs" / spec.run_id, spec)
            if done is not None:
                records[spec.run_id] = done
            else:
                todo.append(spec)
        num_reused = len(records)
        if on_progress is not None:
            on_progress(len(records), len(specs), "")

        def on_done(rec: dict[str, Any]) -> None:
            records[rec["run_id"]] = rec
            if on_progress is not None:
                on_progress(len(records), len(specs), rec["run_id"])

        _run_todo(todo, root, max(1, jobs or os.cpu_count() or 1), on_done, on_run_progress)
        ordered = [records[s.run_id] for s in specs]
        table = runs_table(ordered)
        atomic_write_text(root / "runs.csv", table.to_csv(index=False))
        atomic_write_text(root / "study.json", json.dumps(_study_meta(study, specs, source), indent=2))
    known = {s.run_id for s in specs}
    stale = sum(1 for d in (root / "runs").iterdir() if d.is_dir() and d.name not in known)
    failed = {r["run_id"]: r["error"] for r in ordered if r.get("status") == "failed"}
    return StudyOutcome(root, table, len(specs), num_reused, len(todo), failed, stale)


def _study_meta(study: Study, specs: list[RunSpec], source: str) -> dict[str, Any]:
    return {
        "name": study.name,
        "description": study.description,
        "source": source,
        "study": study.model_dump(mode="json"),
        "sweep_keys": study.label_keys,
        "report_x": study.report_x,
        "report_series": study.report_series,
        "runs": [{"run_id": s.run_id, "labels": s.labels, "seed": s.seed} for s in specs],
    }


def collect_runs(root: str | Path) -> tuple[pd.DataFrame, dict[str, dict[str, Any]], dict[str, str]]:
    """Rebuild a study's results from its run folders (never from ``runs.csv``, which is a copy).

    Args:
        root: the study's results folder (with ``study.json``).

    Returns:
        ``(table, summaries, missing)``: one row per finished run whose files verify, in the
        study's order; their summaries by run id; and ``run_id -> reason`` for every run of the
        study that has no verified result (failed, not run yet, or damaged).

    Raises:
        ConfigError: ``study.json`` is missing or unreadable.
    """
    root = Path(root)
    try:
        meta = json.loads((root / "study.json").read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{root}: study.json is missing or unreadable ({e.__class__.__name__}); "
                          "run the study again to rebuild it") from None
    summaries: dict[str, dict[str, Any]] = {}
    missing: dict[str, str] = {}
    for r in meta.get("runs", []):
        rid = r["run_id"]
        d = root / "runs" / rid
        try:
            s = json.loads((d / "summary.json").read_text())
        except (OSError, json.JSONDecodeError, UnicodeDecodeError):
            failed = d / "failed.json"
            missing[rid] = json.loads(failed.read_text()).get("error", "failed") if failed.is_file() else "not run"
            continue
        why = verify_run_files(d, s)
        if why is not None:
            missing[rid] = why
            continue
        summaries[rid] = s
    return runs_table(list(summaries.values())), summaries, missing

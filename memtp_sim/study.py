"""Run a study: every (sweep point, policy, seed) through :func:`memtp_sim.api.run`.

Results go under ``<out>/<study name>/``::

    runs/<run_id>/summary.json   config, seed, version, provenance (profiles, sources), metrics
    runs/<run_id>/requests.csv   one row per request
    runs/<run_id>/rounds.parquet one row per engine round
    runs.csv                     one row per run: sweep labels + headline metrics
    report.html                  Plotly report (see :mod:`memtp_sim.report`)

Runs execute in this process, in local worker processes that die with it, or on a Dask
distributed cluster (``executor="dask"``, ``run --executor dask --scheduler ADDRESS``); workers
only compute and hand back the run's files, and the submitting process writes them. Every file is
written atomically (temporary file + rename), and ``summary.json`` (written last)
records the size and digest of the run's other files, so an interrupted or damaged run is never
taken for a finished one. Runs are keyed by content (scenario, seed and the contents of the input
files, not their paths): running the study again, from this folder or from a moved or copied one,
reuses every run whose scenario, seed, input files and result files verify (resume), and says how
many. A run that fails is recorded (``runs/<id>/failed.json``) and the study finishes the rest; a
local worker that dies (killed for memory, say) costs only the run it was running, which is tried
again on a fresh worker (:func:`memtp_sim._procs.run_in_workers`).
``force=True`` recomputes everything. ``runs.csv`` is a copy; :func:`collect_runs` rebuilds the
results from the run folders.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import signal
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from ._io import atomic_write_bytes, atomic_write_text, check_writable_dir, file_digest, json_default
from ._procs import FolderLock, die_with_parent, run_in_workers
from ._version import __version__
from .acceptance import DEFAULT_ACCEPTANCE, acceptance_dir
from .api import run
from .config import Scenario, Study
from .hardware import profile_files
from .errors import ConfigError, ExecutorUnavailableError, InvalidArgumentError

__all__ = ["RunSpec", "StudyOutcome", "plan_runs", "run_key", "run_study", "input_files", "input_fingerprint",
           "changed_inputs", "without_input_paths",
           "check_writable", "runs_table", "collect_runs", "verify_run_files", "EXECUTORS", "check_executor",
           "INPUT_ERRORS", "TRANSIENT_ERRORS", "failure_kind", "fails_again"]


@dataclass(frozen=True)
class RunSpec:
    """One run of a study.

    Attributes:
        run_id: :func:`run_key` of the scenario, seed and inputs.
        labels: the run's sweep point (``{"workload.concurrency": 8, "policy": "dspark", ...}``).
        scenario: the resolved scenario.
        seed: the random seed.
        inputs: :func:`input_fingerprint` of the scenario when the study was planned; a worker that
            reads other contents computes nothing (see ``_input_mismatch``).
    """

    run_id: str
    labels: dict[str, Any]
    scenario: Scenario
    seed: int
    inputs: dict[str, str]


def input_files(scenario: Scenario) -> dict[str, Path]:
    """The files a run of ``scenario`` reads, by role: ``trace``, ``hardware`` (the profile YAML),
    ``measurements`` (its cost table or measurements CSV) and, unless ``acceptance.alpha`` is set,
    ``acceptance`` (the acceptance profile YAML).

    Raises:
        CalibrationError: the hardware profile cannot be found or names a data file that is not
            there (from :func:`memtp_sim.hardware.profile_files`).
    """
    hw, data = profile_files(scenario.hardware.profile)  # the loader's own list: format 1 and 2 alike
    out = {"trace": Path(scenario.workload.trace), "hardware": hw, "measurements": data}
    if scenario.acceptance.alpha is None:
        acc = Path(scenario.acceptance.profile or DEFAULT_ACCEPTANCE)
        out["acceptance"] = acc if acc.suffix in (".yaml", ".yml") else acceptance_dir() / f"{acc}.yaml"
    return out


def input_fingerprint(scenario: Scenario) -> dict[str, str]:
    """Content digests of the files a run reads (:func:`input_files`: trace, hardware profile and
    its measurements, acceptance profile), so that resuming never reuses results computed from
    different inputs.

    Returns:
        ``{role: digest}`` (:func:`memtp_sim._io.file_digest`, 16 hex digits of SHA-256).

    Raises:
        OSError: a file cannot be read; CalibrationError: as :func:`input_files`.
    """
    return {role: file_digest(path) for role, path in input_files(scenario).items()}


def changed_inputs(a: dict[str, str], b: dict[str, str]) -> list[str]:
    """The roles whose digests differ between two :func:`input_fingerprint` records (a role only
    one of them has counts as changed), sorted.

    Args:
        a, b: ``{role: digest}``.

    Returns:
        The roles, e.g. ``["trace"]``; empty when the inputs are the same.
    """
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


#: Scenario fields (section, field) that name an input file. A run's id leaves them out and
#: takes the contents of the files they name instead (:func:`input_fingerprint`), so that the id
#: does not depend on where the files are.
INPUT_FIELDS = (("workload", "trace"), ("hardware", "profile"), ("acceptance", "profile"))


def without_input_paths(scenario: dict[str, Any]) -> dict[str, Any]:
    """A scenario's JSON dump (or a tune spec's ``base``) without the fields of :data:`INPUT_FIELDS`.

    Args:
        scenario: ``Scenario.model_dump(mode="json")`` or the same sections as a mapping.

    Returns:
        A shallow copy with each input path field left out of its section.
    """
    out = dict(scenario)
    for section, name in INPUT_FIELDS:
        if isinstance(out.get(section), dict):
            out[section] = {k: v for k, v in out[section].items() if k != name}
    return out


def _key(scenario: dict[str, Any], inputs: dict[str, str], seed: int) -> str:
    blob = json.dumps({"scenario": without_input_paths(scenario), "inputs": inputs, "seed": seed}, sort_keys=True)
    return "r" + hashlib.sha256(blob.encode()).hexdigest()[:12]


def run_key(scenario: Scenario, seed: int, inputs: dict[str, str] | None = None) -> str:
    """The run's id: a hash of its resolved scenario, its seed and the contents of the files it
    reads, not of their paths, nor of its place in the sweep.

    So adding a seed or a sweep value keeps every other run's results, a moved or copied checkout
    (or a colleague's, with the same files) finds its results again, and a file whose contents
    changed makes another id: results are never reused across different inputs.

    Args:
        scenario: the resolved scenario.
        seed: the run's seed.
        inputs: :func:`input_fingerprint` of ``scenario``, when the caller has it already.

    Returns:
        ``"r"`` and 12 hex digits of a SHA-256 over the scenario's JSON dump without the paths of
        :data:`INPUT_FIELDS`, the input digests and the seed.

    Raises:
        CalibrationError: a hardware profile file is missing (``inputs`` not given).
        OSError: an input file cannot be read (``inputs`` not given).
    """
    if inputs is None:
        inputs = input_fingerprint(scenario)
    return _key(scenario.model_dump(mode="json"), inputs, seed)


def plan_runs(study: Study, *, source: str = "<study>") -> list[RunSpec]:
    """Expand a study into run specs with content-derived ids.

    Raises:
        ConfigError: two points of the study resolve to the same scenario and seed (a value listed
            twice, variants that change nothing, or one policy written two ways, e.g.
            ``{name: dspark}`` and ``{name: dspark, gamma: 7}``), which would run the same thing twice.
    """
    out: list[RunSpec] = []
    seen: dict[str, dict[str, Any]] = {}
    for labels, scen, seed in study.expand(source=source):
        inputs = input_fingerprint(scen)
        # the run id hashes the scenario as written (kept so results stay reusable); the identity
        # fills in the policy's defaults, so a policy written two ways is one run, and, like the
        # id, takes input files by their contents
        same = _key(json.loads(scen.run_identity()), inputs, seed)
        if same in seen:
            raise ConfigError(f"{source}: the points {seen[same]} and {labels} (seed {seed}) are the same scenario; "
                              "list each value once, make each variant change something, and give each input "
                              "file once (two files with the same contents are the same input)")
        seen[same] = labels
        out.append(RunSpec(run_key(scen, seed, inputs), labels, scen, seed, inputs))
    return out


#: Files of a finished run; summary.json (written last) records their sizes and digests.
RUN_FILES = ("requests.csv", "rounds.parquet")


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


#: Errors that bad input raises: a run that failed with one fails the same way when run again
#: (an input file gone or unreadable since the study was loaded among them: a rerun refuses it)
INPUT_ERRORS = ("ConfigError", "CalibrationError", "InvalidArgumentError", "FileNotFoundError", "PermissionError",
                "IsADirectoryError", "NotADirectoryError")

#: Errors of the machine, not of the run (memory, a full disk, the network, a Dask worker): a retry
#: may get past them, as past the other recorded reasons that are not errors a run raised (a lost
#: worker, result files damaged in transit, an input file changed while the study ran, an
#: interrupted or missing run)
TRANSIENT_ERRORS = ("MemoryError", "OSError", "IOError", "TimeoutError", "ConnectionError", "BrokenPipeError",
                    "ConnectionResetError", "KilledWorker", "CommClosedError")


def failure_kind(error: str) -> str:
    """What a failed run's recorded error (``failed.json``'s ``error``, ``"<class>: <message>"``)
    says about running it again.

    Args:
        error: the recorded reason, e.g. ``"ConfigError: trace.csv: ..."`` (or as ``run`` and
            ``report`` say it, ``"failed before: ConfigError: ..."``).

    Returns:
        ``"input"`` for :data:`INPUT_ERRORS` (it fails the same way until the input is fixed);
        ``"same"`` for any other error the run raised (``"<Class>: ..."``) but
        :data:`TRANSIENT_ERRORS`: it raised inside the simulation, which is deterministic for its
        scenario and seed, so a rerun raises the same (an engine invariant the scenario breaks, or
        a bug: its ``failed.json`` holds the traceback); else ``"transient"`` (a lost worker,
        damaged files, a run interrupted or not run yet, an error of the machine): a retry may get
        past it.
    """
    error = error.removeprefix("failed before: ")
    if error.startswith(tuple(f"{name}: " for name in INPUT_ERRORS)):
        return "input"
    raised = re.match(r"[A-Z]\w*: ", error) is not None  # "<Class>: <message>", as _compute records an error
    return "same" if raised and not error.startswith(tuple(f"{name}: " for name in TRANSIENT_ERRORS)) else "transient"


def fails_again(error: str) -> bool:
    """Whether a failed run's recorded error comes from its input (:func:`failure_kind` ``"input"``),
    so running it again fails the same way until the input is fixed."""
    return failure_kind(error) == "input"


def _failed_record(spec: RunSpec, error: str, trace: str | None = None) -> dict[str, Any]:
    """The record of a run that could not complete (written as ``failed.json``)."""
    record = {"run_id": spec.run_id, "labels": spec.labels, "seed": spec.seed, "status": "failed", "error": error}
    if trace:
        record["traceback"] = trace
    return record


def _input_mismatch(spec: RunSpec, inputs: dict[str, str], expect: dict[str, Any] | None) -> str | None:
    """Why this process must not compute ``spec`` (None if it may), as a recorded error: on a Dask
    worker (``expect`` given), the package version and input-file digests the submitting process
    saw; everywhere, the input files read now against those the run's id was made from, and the
    spec's content id."""
    if expect is not None and expect.get("version") != __version__:
        return (f"ConfigError: this worker runs memtp_sim {__version__}, the submitting process "
                f"{expect.get('version')}; install the same version on every worker")
    want = spec.inputs if expect is None else expect.get("inputs", {})
    differ = changed_inputs(inputs, want)
    if differ and expect is not None:  # a setup to fix: a retry alone fails the same way
        return (f"ConfigError: this worker's input files differ from the submitting process's ({', '.join(differ)}); "
                "every worker must see the same trace and profile files at the same paths")
    if differ:  # edited while the study ran: the next `run` plans the run for the new contents
        return f"input changed while the study ran: {', '.join(differ)}; run again to compute it from the new contents"
    key = run_key(spec.scenario, spec.seed, inputs)
    if key != spec.run_id:
        return (f"ConfigError: the scenario arrived changed (its content id is {key}, not {spec.run_id}); "
                "install the same memtp_sim and pydantic where the run executes")
    return None


def _compute(spec: RunSpec, progress: Callable[[int, int], None] | None = None,
             expect: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, bytes]]:
    """Simulate one spec and return ``(record, blobs)`` without writing anything, so that it can
    run in a local worker process or on a Dask worker on another host.

    ``record`` is the run's summary (``status: ok``, with the size and digest of each blob) or,
    for a run that could not complete, a ``status: failed`` record with the reason and no blobs.
    ``expect`` (Dask) carries the version and input digests of the submitting process; a worker
    that differs computes nothing and says why (see :func:`_input_mismatch`).
    """
    try:
        inputs = input_fingerprint(spec.scenario)
        why = _input_mismatch(spec, inputs, expect)
        if why is not None:
            return _failed_record(spec, why), {}
        res = run(spec.scenario, seed=spec.seed, progress=progress)
        blobs = res.files()
    except Exception as e:  # noqa: BLE001 - any failure of one run is recorded; Ctrl-C still stops the study
        # a run that cannot complete is recorded with its reason (the study finishes the rest)
        return _failed_record(spec, f"{type(e).__name__}: {e}", traceback.format_exc(limit=8)), {}
    summary = res.summary()
    summary["run_id"] = spec.run_id
    summary["labels"] = spec.labels
    summary["status"] = "ok"
    summary["inputs"] = inputs
    summary["files"] = {name: {"bytes": len(data), "sha256": _digest(data)} for name, data in blobs.items()}
    return summary, blobs


def _write_outcome(run_dir: Path, record: dict[str, Any], blobs: dict[str, bytes]) -> dict[str, Any]:
    """Write what :func:`_compute` returned into ``run_dir`` (atomically; ``summary.json`` last, so
    it marks a complete run) and return the record. Blobs whose size or digest differs from what
    the worker recorded (damaged in transit) make the run a failed one instead."""
    if record.get("status") == "ok":
        files = record.get("files", {})
        bad = sorted(n for n, data in blobs.items()
                     if files.get(n, {}).get("bytes") != len(data) or files.get(n, {}).get("sha256") != _digest(data))
        if bad or set(blobs) != set(RUN_FILES):
            record = {k: record[k] for k in ("run_id", "labels", "seed")}
            record.update(status="failed", error=f"result files damaged in transit: {', '.join(bad) or 'missing'}")
    if record.get("status") != "ok":
        atomic_write_text(run_dir / "failed.json", json.dumps(record, indent=2, default=json_default))
        return record
    for name, data in blobs.items():
        atomic_write_bytes(run_dir / name, data)
    atomic_write_text(run_dir / "summary.json", json.dumps(record, indent=2, default=json_default, allow_nan=True))
    (run_dir / "failed.json").unlink(missing_ok=True)
    return record


def _execute(spec: RunSpec, run_dir: str, progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Run one spec in this process and write its files; returns the summary or failed record."""
    return _write_outcome(Path(run_dir), *_compute(spec, progress))


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


def _read_summary(run_dir: Path) -> tuple[dict[str, Any] | None, str | None]:
    """A run folder's ``summary.json``, or None and why there is none, in the words both ``run``
    and ``report`` print: ``"failed before: <error>"``, ``"interrupted: summary.json missing"``,
    ``"damaged: summary.json unreadable"``, or None for a run never tried."""
    f = run_dir / "summary.json"
    if not f.is_file():
        failed = run_dir / "failed.json"
        if not failed.is_file():
            left = run_dir.is_dir() and any(run_dir.iterdir())
            return None, ("interrupted: summary.json missing" if left else None)
        try:
            error = json.loads(failed.read_text()).get("error", "reason not recorded")
        except (OSError, json.JSONDecodeError, UnicodeDecodeError, AttributeError):
            error = "failed.json unreadable"
        return None, f"failed before: {error}"
    try:
        s = json.loads(f.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None, "damaged: summary.json unreadable"
    if not isinstance(s, dict):
        return None, "damaged: summary.json unreadable"
    return s, None


def _load_done(run_dir: Path, spec: RunSpec) -> tuple[dict[str, Any] | None, str | None]:
    """``(summary, None)`` if the run finished with these inputs and its files verify, else
    ``(None, why)``: why it must be computed (again), in words, or None for a run never tried."""
    s, why = _read_summary(run_dir)
    if s is None:
        return None, why
    scen = s.get("scenario")  # its input files may have been at other paths: they count by content below
    if (s.get("seed") != spec.seed or not isinstance(scen, dict)
            or without_input_paths(scen) != without_input_paths(spec.scenario.model_dump(mode="json"))):
        return None, "damaged: summary.json records another scenario or seed"
    inputs = spec.inputs
    if s.get("inputs") != inputs:
        recorded = s.get("inputs") if isinstance(s.get("inputs"), dict) else {}
        changed = changed_inputs(inputs, recorded)
        return None, f"input changed: {', '.join(changed)}"
    why = verify_run_files(run_dir, s)
    return (s, None) if why is None else (None, f"damaged: {why}")


def _earlier_key(scenario: dict[str, Any], seed: Any) -> str:
    """What an earlier folder and a run of this study must share to be the same run from other
    inputs: the scenario without its input paths (a moved copy of the files is the same input)
    and the seed."""
    return json.dumps([without_input_paths(scenario), seed], sort_keys=True)


def _earlier_results(runs_dir: Path, known: set[str]) -> dict[str, dict[str, Any]]:
    """Summaries of the folders under ``runs_dir`` that belong to no run id in ``known``, by
    :func:`_earlier_key`: with a run of this study's scenario (its input paths aside) and seed, such
    a folder is that run's earlier result, from inputs whose contents changed since (wherever the
    files were) or under an earlier run id (before ids hashed contents instead of paths)."""
    out: dict[str, dict[str, Any]] = {}
    for d in runs_dir.iterdir():
        if d.is_dir() and d.name not in known:
            s, _ = _read_summary(d)
            if s is not None:
                scen = s.get("scenario")
                out[_earlier_key(scen if isinstance(scen, dict) else {}, s.get("seed"))] = s
    return out


def _superseded_why(spec: RunSpec, earlier: dict[str, Any]) -> str:
    """Why ``spec`` is computed although ``earlier`` (from :func:`_earlier_results`) ran it."""
    recorded = earlier.get("inputs") if isinstance(earlier.get("inputs"), dict) else {}
    changed = changed_inputs(spec.inputs, recorded)
    if changed:
        return f"input changed: {', '.join(changed)}"
    return "earlier run id (run ids now hash input file contents, not paths)"


def check_writable(root: Path) -> None:
    """Check now, before any run, that results can be written under ``root``.

    Raises:
        ConfigError: the folder cannot be created or written (one line naming it).
    """
    check_writable_dir(root)
    (root / "runs").mkdir(exist_ok=True)  # root is writable now: this cannot fail for want of rights


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
        failed: ``run_id -> reason`` for runs that could not complete (retried by the next ``run``;
            :func:`failure_kind` tells those that will fail the same way).
        num_stale: run folders under ``runs/`` that belong to no run of this study (left untouched).
        recomputed: ``run_id -> why`` for runs computed now although their folder, or an earlier
            folder of theirs, held something: ``"forced (--force)"``, ``"failed before: <error>"``,
            ``"interrupted: summary.json missing"``, ``"damaged: <what>"`` (e.g. ``"damaged:
            requests.csv is damaged (size or digest differs from summary.json)"``), ``"input
            changed: trace, ..."`` (a folder under the run's former id holds its result from other
            contents of these files) or ``"earlier run id (...)"`` (a folder written before run ids
            hashed file contents instead of paths holds its result). Runs never tried before are
            not listed.
        num_superseded: runs computed now whose earlier result (``"input changed"``, ``"earlier
            run id"``) sits in one of the ``num_stale`` folders.
    """

    root: Path
    table: pd.DataFrame
    num_runs: int
    num_reused: int
    num_ran: int
    failed: dict[str, str]
    num_stale: int
    recomputed: dict[str, str] = field(default_factory=dict)
    num_superseded: int = 0

    def ran_note(self) -> str:
        """What the study computed now and why, in one line, e.g. ``"reused 3 finished run(s) with
        the same scenario, seed and inputs; ran 1: recomputed 1 (damaged: requests.csv is damaged
        (size or digest differs from summary.json))"``.

        Returns:
            The line (no trailing newline). Reasons shared by several runs are counted once
            (``"recomputed 4 (2 x failed before: ...; 2 x damaged: ...)"``).
        """
        parts = [f"ran {self.num_ran}"]
        new = self.num_ran - len(self.recomputed)
        details = []
        if self.recomputed:
            counts: dict[str, int] = {}
            for why in self.recomputed.values():
                counts[why] = counts.get(why, 0) + 1
            why = "; ".join(w if n == 1 else f"{n} x {w}" for w, n in counts.items())
            details.append(f"recomputed {len(self.recomputed)} ({why})")
        if new and self.recomputed:
            details.append(f"{new} new")
        if details:
            parts[0] += ": " + ", ".join(details)
        head = (f"reused {self.num_reused} finished run(s) with the same scenario, seed and inputs; "
                if self.num_reused else "")
        return head + parts[0]


def _worker_init() -> None:
    die_with_parent()  # a kill -9 of `run` must not leave workers behind
    # Ctrl-C reaches the whole process group: the parent alone handles it and stops the workers
    # (run_in_workers), so none dies of it mid-message (under ProcessPoolExecutor that hung the
    # parent's shutdown 3 times in 5 in review)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


#: Executors a study can run on (``run_study(executor=...)``, ``run --executor``).
EXECUTORS = ("local", "dask")


def _drain(futs: dict[Any, RunSpec], completed: Any, root: Path, on_done: Callable[[dict[str, Any]], None]) -> None:
    """Write each finished Dask future's run as it completes (this process writes every result
    file) and report it; a run whose task raised (Dask's ``KilledWorker`` once workers died under
    it more often than the scheduler's ``allowed-failures``) is recorded as failed. A written run's
    future is dropped at once, so neither side keeps finished results in memory."""
    try:
        for fut in completed:
            spec = futs.pop(fut)
            try:
                record, blobs = fut.result()
            except Exception as e:  # noqa: BLE001 - workers died under it, or it could not run there
                record, blobs = _failed_record(spec, f"worker lost ({type(e).__name__}: {e})"), {}
            on_done(_write_outcome(root / "runs" / spec.run_id, record, blobs))
    except BaseException:
        for f in list(futs):
            f.cancel()
        raise


def _run_local(todo: list[RunSpec], root: Path, jobs: int, on_done: Callable[[dict[str, Any]], None],
               on_run_progress: Callable[[int, int], None] | None) -> None:
    """Execute ``todo`` in this process (jobs 1) or in worker processes that die with this one.

    A worker that dies (killed for memory, say) costs only the run it was running: the run is tried
    again on a fresh worker and recorded as failed only if its worker dies under it again
    (:func:`memtp_sim._procs.run_in_workers`). Ctrl-C terminates the workers (they ignore SIGINT);
    finished runs are written already."""
    if jobs == 1 or len(todo) <= 1:
        for spec in todo:
            on_done(_execute(spec, str(root / "runs" / spec.run_id), on_run_progress))
        return

    def write(i: int, outcome: tuple[dict[str, Any], dict[str, bytes]]) -> None:
        on_done(_write_outcome(root / "runs" / todo[i].run_id, *outcome))

    def lost(i: int, why: str) -> None:
        record = _failed_record(todo[i], f"worker lost: {why}; if it ran out of memory, run fewer at once (--jobs)")
        on_done(_write_outcome(root / "runs" / todo[i].run_id, record, {}))

    run_in_workers(_compute, todo, jobs, write, lost, initializer=_worker_init)


def _import_distributed() -> Any:
    """The ``distributed`` module, or :class:`ExecutorUnavailableError` saying how to install it."""
    try:
        import distributed  # optional extra: imported only for --executor dask
    except ImportError as e:
        raise ExecutorUnavailableError(f"--executor dask needs Dask distributed ({e}); install it with "
                                       "pip install -e \".[dask]\"") from None
    return distributed


def _dask_client(scheduler: str, timeout_s: float) -> Any:
    """A client of the Dask scheduler at ``scheduler`` that has at least one worker."""
    distributed = _import_distributed()
    try:
        client = distributed.Client(scheduler, timeout=timeout_s, set_as_default=False)
    except (OSError, TimeoutError, ValueError) as e:
        raise ExecutorUnavailableError(f"Dask scheduler {scheduler} unreachable within {timeout_s:g} s "
                                       f"({type(e).__name__}); start it with `dask scheduler` or check the "
                                       "address") from None
    try:
        client.wait_for_workers(1, timeout=timeout_s)
    except (OSError, TimeoutError):
        client.close()
        raise ExecutorUnavailableError(f"Dask scheduler {scheduler} has no workers (waited {timeout_s:g} s); "
                                       f"start some with `dask worker {scheduler} --nthreads 1`") from None
    return client


def _run_dask(todo: list[RunSpec], root: Path, on_done: Callable[[dict[str, Any]], None], scheduler: str,
              timeout_s: float) -> None:
    """Execute ``todo`` on the Dask cluster at ``scheduler``; this process writes every result.

    Each task carries the version and input digests this process sees, so a worker with other
    files or another version computes nothing and says so. Closing the client (normally, on
    Ctrl-C, or because this process died) releases the runs still queued on the cluster.
    """
    distributed = _import_distributed()
    client = _dask_client(scheduler, timeout_s)
    try:
        token = secrets.token_hex(4)
        futs = {}
        for spec in todo:
            expect = {"version": __version__, "inputs": spec.inputs}
            # retries=0: a run that raised fails the same way again. A worker that dies is another
            # matter: the scheduler runs its tasks elsewhere and fails one (KilledWorker) only after
            # `distributed.scheduler.allowed-failures` deaths under it; the rest are not touched
            futs[client.submit(_compute, spec, None, expect, key=f"memtp_sim-{spec.run_id}-{token}",
                               retries=0)] = spec
        with client.as_current():  # as_completed finds the client through the current one
            _drain(futs, distributed.as_completed(futs), root, on_done)
    finally:
        client.close()


def run_study(
    study: Study,
    *,
    out_dir: str | Path = "results",
    jobs: int | None = None,
    force: bool = False,
    source: str = "<study>",
    on_progress: Callable[[int, int, str], None] | None = None,
    on_run_progress: Callable[[int, int], None] | None = None,
    executor: str = "local",
    scheduler: str | None = None,
    connect_timeout_s: float = 10.0,
) -> StudyOutcome:
    """Run (or resume) every run of ``study``; write runs.csv and study.json.

    Runs are keyed by content (:func:`run_key`): a finished run is reused when its scenario, seed,
    input files and result files all match. A run that fails is recorded with its reason and the
    others go on. Only one ``run`` may write a results folder at a time.

    Args:
        out_dir: parent folder; the study writes into ``out_dir/<study.name>``.
        jobs: local worker processes (default: CPU count); 1 runs in this process. Only with
            ``executor="local"``: on Dask the cluster's workers decide.
        force: recompute runs that already have results.
        on_progress: ``on_progress(done, total, run_id)`` after each run.
        on_run_progress: ``on_run_progress(done_requests, total_requests)`` within each run, when
            runs execute in this process (``jobs == 1`` or a single run left).
        executor: ``"local"`` (processes on this machine) or ``"dask"`` (the Dask distributed
            cluster at ``scheduler``; needs the ``dask`` extra). Either way this process writes
            every result file, so workers need no access to ``out_dir``; they need the same input
            files at the same paths and the same memtp_sim version, or their runs fail saying so.
        scheduler: the Dask scheduler's address, e.g. ``tcp://10.0.0.5:8786`` (dask only).
        connect_timeout_s: seconds to wait for the scheduler to answer and to have a worker.

    Returns:
        A :class:`StudyOutcome`.

    Raises:
        ConfigError: the results folder cannot be written (checked before anything runs).
        FolderBusyError: another process is writing this study's results.
        InvalidArgumentError: an unknown executor, or a scheduler without ``executor="dask"`` (or
            the reverse), or ``jobs`` with ``executor="dask"``.
        ExecutorUnavailableError: Dask is not installed, or (when some run is left to compute) the
            scheduler does not answer, or has no worker, within ``connect_timeout_s``.
    """
    check_executor(executor, scheduler, jobs)
    root = Path(out_dir) / study.name
    check_writable(root)
    specs = plan_runs(study, source=source)
    with FolderLock(root, what=f"memtp_sim run {source}"):
        records: dict[str, dict[str, Any]] = {}
        todo: list[RunSpec] = []
        recomputed: dict[str, str] = {}
        for spec in specs:
            run_dir = root / "runs" / spec.run_id
            if force:
                done, why = None, ("forced (--force)" if run_dir.is_dir() and any(run_dir.iterdir()) else None)
            else:
                done, why = _load_done(run_dir, spec)
            if done is not None:
                records[spec.run_id] = done
            else:
                todo.append(spec)
                if why is not None:
                    recomputed[spec.run_id] = why
        new = [spec for spec in todo if spec.run_id not in recomputed]
        earlier = _earlier_results(root / "runs", {s.run_id for s in specs}) if new and not force else {}
        superseded = 0
        for spec in new:
            before = earlier.get(_earlier_key(spec.scenario.model_dump(mode="json"), spec.seed))
            if before is not None:
                recomputed[spec.run_id] = _superseded_why(spec, before)
                superseded += 1
        num_reused = len(records)
        if on_progress is not None:
            on_progress(len(records), len(specs), "")

        def on_done(rec: dict[str, Any]) -> None:
            records[rec["run_id"]] = rec
            if on_progress is not None:
                on_progress(len(records), len(specs), rec["run_id"])

        if executor == "dask" and todo:
            _run_dask(todo, root, on_done, str(scheduler), connect_timeout_s)
        else:
            _run_local(todo, root, max(1, jobs or os.cpu_count() or 1), on_done, on_run_progress)
        ordered = [records[s.run_id] for s in specs]
        table = runs_table(ordered)
        atomic_write_text(root / "runs.csv", table.to_csv(index=False))
        atomic_write_text(root / "study.json", json.dumps(_study_meta(study, specs, source), indent=2))
    known = {s.run_id for s in specs}
    stale = sum(1 for d in (root / "runs").iterdir() if d.is_dir() and d.name not in known)
    failed = {r["run_id"]: r["error"] for r in ordered if r.get("status") == "failed"}
    return StudyOutcome(root, table, len(specs), num_reused, len(todo), failed, stale, recomputed, superseded)


def check_executor(executor: str, scheduler: str | None, jobs: int | None) -> None:
    """Refuse executor settings that cannot work together, before anything runs.

    Args:
        executor: one of :data:`EXECUTORS`.
        scheduler: the Dask scheduler address, or None.
        jobs: local worker processes, or None.

    Raises:
        InvalidArgumentError: an unknown executor; a scheduler without executor ``dask``; executor
            ``dask`` without a scheduler, or with ``jobs``.
        ExecutorUnavailableError: executor ``dask`` and Dask distributed is not installed.
    """
    if executor not in EXECUTORS:
        raise InvalidArgumentError(f"executor must be one of {', '.join(EXECUTORS)}, got {executor!r}")
    if executor == "local" and scheduler is not None:
        raise InvalidArgumentError("--scheduler is only for --executor dask (the local executor needs no scheduler)")
    if executor == "dask":
        if not scheduler:
            raise InvalidArgumentError("--executor dask needs --scheduler ADDRESS (the address `dask scheduler` "
                                       "prints, e.g. tcp://127.0.0.1:8786)")
        if jobs is not None:
            raise InvalidArgumentError("--jobs sets local worker processes; with --executor dask the cluster's "
                                       "workers decide (leave out --jobs)")
        _import_distributed()


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


def not_a_study_folder(root: str | Path) -> str | None:
    """Why ``root`` is not a study's results folder, in words that say where to look instead, or
    None where it holds a ``study.json`` (``report`` and the dashboard's Study page ask).

    Returns:
        ``"<root>: no such folder; ..."``, ``"<root>: a file; ..."``, a tuning study's folder
        (``optuna.db``: its own page and commands), the parent of study folders (``results/``:
        names them), or ``"<root>: no study.json here; ..."``.
    """
    root = Path(root)
    if (root / "study.json").is_file():
        return None
    where = "report takes the folder a study's results went to (run writes them under --out, by default results/<study name>/)"
    if not root.exists():
        return f"{root}: no such folder; {where}"
    if not root.is_dir():
        what = "a study file" if root.suffix.lower() in (".yaml", ".yml") else "a file"  # (the study, not its results)
        return f"{root}: {what}; {where}"
    if (root / "optuna.db").is_file() or (root / "validation.json").is_file():
        return (f"{root}: a tuning study's folder, not a study's: its report is {root / 'report.html'} (the dashboard's "
                "Tuning page shows it; python -m memtp_sim export writes its configs)")
    above = next((p for p in root.resolve().parents if (p / "study.json").is_file()), None)
    if above is not None:  # (runs/, or a run's folder)
        return f"{root}: inside the study folder {above}; report that"
    inside = sorted(d for d in root.iterdir() if (d / "study.json").is_file())
    if len(inside) == 1:
        return f"{root}: not a study folder, but it holds one: {inside[0]}; report that"
    if inside:
        shown = ", ".join(str(d) for d in inside[:4]) + (f" (+{len(inside) - 4} more)" if len(inside) > 4 else "")
        return f"{root}: not a study folder, but it holds {len(inside)}: {shown}; report one of them"
    return f"{root}: no study.json here; this is not a study folder (run one first: python -m memtp_sim run STUDY.yaml)"


def collect_runs(root: str | Path) -> tuple[pd.DataFrame, dict[str, dict[str, Any]], dict[str, str]]:
    """Rebuild a study's results from its run folders (never from ``runs.csv``, which is a copy).

    Args:
        root: the study's results folder (with ``study.json``).

    Returns:
        ``(table, summaries, missing)``: one row per finished run whose files verify, in the
        study's order; their summaries by run id; and ``run_id -> reason`` for every run of the
        study that has no verified result (failed, not run yet, or damaged).

    Raises:
        ConfigError: not a study folder (:func:`not_a_study_folder` says why), or ``study.json``
            is unreadable.
    """
    root = Path(root)
    why = not_a_study_folder(root)
    if why is not None:
        raise ConfigError(why)
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
        s, why = _read_summary(d)
        if s is None:
            missing[rid] = why or "not run"
            continue
        why = verify_run_files(d, s)
        if why is not None:
            missing[rid] = f"damaged: {why}"
            continue
        summaries[rid] = s
    return runs_table(list(summaries.values())), summaries, missing

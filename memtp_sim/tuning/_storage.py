"""Where studies live: storage URLs, opening storage, the study record, dead-worker detection.

**Storage.** Default ``sqlite:///results/<name>/optuna.db``; ``postgresql+psycopg2://...`` (or
another SQLAlchemy URL) for many workers on many hosts, with a heartbeat: a trial whose worker
stops beating for ``grace_period_s`` is failed and re-queued with the same parameters
(``RetryHeartbeatStaleTrialCallback``); ``journal:///path/file.log`` for Optuna's journal file.
A rerun resumes: it counts COMPLETE trials and runs the rest up to ``n_trials``. RUNNING trials
left by a killed worker on this host (its pid is gone) are marked FAIL first
(:func:`fail_dead_worker_trials`); each trial records its worker's host, pid and process start time
in the user attribute ``worker`` (:func:`worker_identity`), with the id of the ``tune`` call that
started it, so a call can count the trials it ran itself among those of concurrent processes.
The storage is standard Optuna storage: optuna-dashboard opens it as it is.

**Input files.** A new study records the content digests of every file its trials read
(:func:`study_inputs`: trace, hardware profile and its cost table or measurements CSV, acceptance
profile, for every categorical choice of the search space) in its record (user attribute
:data:`~memtp_sim.tuning.STUDY_ATTR`, key ``inputs``). Resuming (and ``export``) refuses a study
whose files changed since (:func:`check_study_inputs`): its trials were priced on the old contents,
and new trials would be priced on the new ones. A study made before the digests were recorded
resumes with a one-line note that its inputs cannot be checked.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import socket
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._version import __version__
from ..errors import ConfigError, MemtpSimError
from ._loading import _corners
from ._space import scenario_for
from ._spec import STUDY_ATTR, TuneSpec

if TYPE_CHECKING:  # pragma: no cover
    import optuna

__all__ = [
    "check_study_inputs",
    "count_trials",
    "default_storage_url",
    "fail_dead_worker_trials",
    "mask_url",
    "open_storage",
    "open_study",
    "storage_kind",
    "study_inputs",
    "worker_identity",
]


# ------------------------------------------------------------------------------------ URLs
def default_storage_url(name: str, out_dir: str | Path = "results") -> str:
    """``sqlite:///<out_dir>/<name>/optuna.db`` (absolute path).

    Args:
        name: study name.
        out_dir: results folder.

    Returns:
        The SQLAlchemy URL.

    Source:
        SQLAlchemy's SQLite URL form ``sqlite:///<absolute path>`` (four slashes in all for an
        absolute path), as Optuna's ``RDBStorage`` takes it.
    """
    return f"sqlite:///{(Path(out_dir) / name / 'optuna.db').resolve()}"


def mask_url(url: str) -> str:
    """The URL with any password replaced by ``***`` (safe to print and record).

    Args:
        url: a storage URL.

    Returns:
        The masked URL.

    Source:
        The ``user:password@`` userinfo of a URL authority (RFC 3986, section 3.2.1).
    """
    return re.sub(r"(://[^:/@]*):[^@]*@", r"\1:***@", url)


def storage_kind(url: str) -> str:
    """``"journal"``, ``"sqlite"`` or ``"rdb"`` (another SQLAlchemy URL).

    Args:
        url: a storage URL.

    Returns:
        The kind.

    Raises:
        ConfigError: not a URL any of the three understands.

    Source:
        SQLAlchemy's ``dialect+driver://`` URL scheme; ``journal://`` is this package's name for
        Optuna's ``JournalStorage``.
    """
    if url.startswith("journal://"):
        return "journal"
    if url.startswith("sqlite://"):
        return "sqlite"
    if re.match(r"^[a-z][a-z0-9]*(\+[a-z0-9_]+)?://", url):
        return "rdb"
    raise ConfigError(f"--storage: unsupported URL {mask_url(url)!r}; allowed: sqlite:///path.db, "
                      "postgresql+psycopg2://user:pass@host:port/db (or another SQLAlchemy URL), journal:///path.log")


# what a process sees when another one is creating the same fresh database's tables at that moment
_SCHEMA_RACE = re.compile(r"already exists|UNIQUE constraint failed|duplicate key|database is locked", re.IGNORECASE)


def _first_open(make: Any, attempts: int = 8) -> Any:
    """``make()`` (an RDBStorage), again after a short wait while its failure is another process
    creating the same fresh database's tables (several workers started at once on a new
    storage): Optuna creates the schema without a lock, so all but one of them fail once.

    Raises:
        Exception: ``make``'s own error when it is not that race, or after ``attempts`` tries.

    Source:
        Optuna issues #1092 and #4621 (concurrent first use of one RDB: "table ... already exists",
        "UNIQUE constraint failed: alembic_version", "duplicate key value").
    """
    import time

    for attempt in range(attempts):
        try:
            return make()
        except Exception as e:  # sqlalchemy errors; the others are raised at once
            if attempt == attempts - 1 or not _SCHEMA_RACE.search(str(e)):
                raise
            time.sleep(min(0.05 * 2**attempt, 1.0))
    raise AssertionError("unreachable")


def open_storage(url: str, *, heartbeat_interval_s: int = 10, grace_period_s: int = 30,
                 flag: str = "--storage", must_exist: bool = False) -> optuna.storages.BaseStorage:
    """Open an Optuna storage from a URL.

    ``sqlite:///`` gives an RDBStorage with a 60 s lock timeout (several local processes);
    other SQLAlchemy URLs an RDBStorage with a heartbeat (a silent worker's trial is failed after
    ``grace_period_s`` and re-queued with the same parameters); ``journal:///path`` a
    JournalStorage on that file (no heartbeat).

    Args:
        url: storage URL.
        heartbeat_interval_s: RDB (non-SQLite) heartbeat period, seconds.
        grace_period_s: RDB (non-SQLite) silence after which a RUNNING trial is stale, seconds.
        flag: where the URL came from, named in errors: ``--storage`` (given), ``--out`` (the
            default storage under the results folder, :func:`default_storage_url`), or another
            name (the dashboard's study box).
        must_exist: for readers (export, the dashboard): a SQLite or journal file that is not
            there is refused instead of created (opening a storage creates its file and tables).

    Returns:
        The storage.

    Raises:
        ConfigError: unsupported URL, a journal URL without a file name, missing database driver,
            or the storage cannot be opened (first line of the underlying error); with
            ``must_exist``, a SQLite or journal file that does not exist.

    Source:
        Optuna documentation: ``optuna.storages.RDBStorage`` (``heartbeat_interval``,
        ``grace_period``, ``RetryFailedTrialCallback``), ``JournalStorage`` with
        ``JournalFileBackend``; SQLite's busy ``timeout`` (Python :mod:`sqlite3`).
    """
    import optuna  # lazy: importing memtp_sim.tuning must not import optuna (~0.1 s)

    kind = storage_kind(url)
    shown = mask_url(url)
    if flag == "--out":
        shown += f" (the default storage under {flag})"
    try:
        if kind == "journal":
            from optuna.storages.journal import JournalFileBackend

            path = Path(url[len("journal://"):])
            if not path.name:
                raise ConfigError(f"{flag}: {shown}: name a file, e.g. journal:///tmp/study.log")
            if must_exist and not path.is_file():
                raise ConfigError(f"{flag}: {shown}: no such journal file (nothing was created)")
            path.parent.mkdir(parents=True, exist_ok=True)
            return optuna.storages.JournalStorage(JournalFileBackend(str(path)))
        if kind == "sqlite":
            db = url[len("sqlite:///"):]
            if must_exist and (not db or db == ":memory:" or not Path(db).is_file()):
                raise ConfigError(f"{flag}: {shown}: no such SQLite file (nothing was created)")
            if db and db != ":memory:":
                Path(db).parent.mkdir(parents=True, exist_ok=True)
            return _first_open(lambda: optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 60}}))
        if url.startswith("postgresql://"):
            try:
                import psycopg  # noqa: F401  (SQLAlchemy 2 maps postgresql:// to psycopg 3)
            except ImportError:
                raise ConfigError(f"{flag}: {shown}: name the driver, e.g. postgresql+psycopg2://... "
                                  "(plain postgresql:// needs psycopg 3)") from None
        retry = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None) or \
            optuna.storages.RetryFailedTrialCallback
        cb_kw = ("heartbeat_stale_trial_callback"
                 if "heartbeat_stale_trial_callback" in inspect.signature(optuna.storages.RDBStorage).parameters
                 else "failed_trial_callback")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return _first_open(lambda: optuna.storages.RDBStorage(
                url, heartbeat_interval=heartbeat_interval_s, grace_period=grace_period_s,
                engine_kwargs={"pool_pre_ping": True}, **{cb_kw: retry(max_retry=3)}))
    except MemtpSimError:
        raise
    except Exception as e:  # driver import errors, connection refused, bad credentials ...
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ConfigError(f"{flag}: cannot open {shown}: {first}") from None


# ------------------------------------------------------------------------------------ workers
def worker_identity(call: str | None = None) -> dict[str, Any]:
    """This process as a trial records it (user attribute ``worker``).

    Args:
        call: the id of the ``tune`` call that started the trial (:func:`memtp_sim.tuning.run_tune`
            makes one per call and counts its trials by it), or None.

    Returns:
        ``{"host", "pid", "start_ticks", "call"}``; ``start_ticks`` (Linux clock ticks since boot,
        or None) tells a reused pid apart.

    Source:
        proc(5), ``/proc/<pid>/stat`` field 22 (``starttime``).
    """
    pid = os.getpid()
    return {"host": socket.gethostname(), "pid": pid, "start_ticks": _process_start_ticks(pid), "call": call}


def _process_start_ticks(pid: int) -> int | None:
    """Process start time in clock ticks since boot (Linux), to tell a reused pid apart.

    Source: proc(5), ``/proc/<pid>/stat`` field 22 (``starttime``).
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def _process_alive(pid: int, start_ticks: int | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        fields = stat[stat.rfind(")") + 2:].split()
        if fields[0] in ("Z", "X"):  # zombie: killed, not yet reaped
            return False
        if start_ticks is not None and int(fields[19]) != int(start_ticks):
            return False  # the pid now belongs to another process
    except (OSError, IndexError, ValueError):
        pass
    return True


def fail_dead_worker_trials(study: optuna.Study) -> list[int]:
    """Mark FAIL every RUNNING trial whose worker ran on this host and is gone.

    Trials of workers on other hosts are left alone (an RDB heartbeat handles those).

    Args:
        study: the study.

    Returns:
        Numbers of the trials marked FAIL.

    Source:
        ``kill(2)`` with signal 0 to test a pid, and proc(5) (state ``Z``/``X``, ``starttime``)
        to tell a dead or reused pid; Optuna's ``TrialState.FAIL``.
    """
    import optuna  # lazy: importing memtp_sim.tuning must not import optuna (~0.1 s)
    from optuna.trial import TrialState

    host = socket.gethostname()
    failed = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        w = t.user_attrs.get("worker")
        if not isinstance(w, dict) or w.get("host") != host or _process_alive(int(w["pid"]), w.get("start_ticks")):
            continue
        try:
            study._storage.set_trial_user_attr(t._trial_id, "failed_reason",
                                               f"worker pid {w['pid']} on {host} died; marked FAIL on resume")
            study._storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
            failed.append(t.number)
        except optuna.exceptions.UpdateFinishedTrialError:
            pass  # it finished after all
    return failed


# ------------------------------------------------------------------------------------ studies
def open_study(spec: TuneSpec, storage: optuna.storages.BaseStorage, *, create: bool = True) -> optuna.Study:
    """Create (or load) the spec's study and record the spec in its user attributes.

    Args:
        spec: the tune spec.
        storage: the storage.
        create: create the study if it does not exist.

    Returns:
        The study.

    Raises:
        ConfigError: a study of that name exists with a different spec (base, search space,
            pair rules, objectives, constraints or seeds), or with other objective directions.
        KeyError: ``create=False`` and no study of that name exists (Optuna's error).

    Source:
        Optuna documentation: ``optuna.create_study(..., load_if_exists=True)``,
        ``optuna.load_study``, ``Study.set_user_attr``.
    """
    import optuna  # lazy: importing memtp_sim.tuning must not import optuna (~0.1 s)

    if create:
        study = optuna.create_study(study_name=spec.name, storage=storage, directions=spec.directions,
                                    load_if_exists=True)
    else:
        study = optuna.load_study(study_name=spec.name, storage=storage)
    rec = study.user_attrs.get(STUDY_ATTR)
    mine = spec.to_json()
    if rec is None:
        study.set_user_attr(STUDY_ATTR, {
            "tune_spec": mine,
            "objective_names": spec.objective_names,
            "constraint_names": [c.label for c in spec.constraints],
            "memtp_sim_version": __version__,
            "inputs": {label: digest for label, (_, digest) in study_inputs(spec).items()},
        })
    else:
        theirs = rec.get("tune_spec", {})
        keys = ("base", "search_space", "pair_constraints", "objectives", "constraints", "seeds")
        diff = [k for k in keys if json.dumps(theirs.get(k), sort_keys=True) != json.dumps(mine.get(k), sort_keys=True)]
        moved = _moved_inputs(theirs.get("base"), mine.get("base")) if diff == ["base"] else ""
        if moved:
            raise ConfigError(f"{spec.source}: base: study {spec.name!r} in storage was tuned on input files at other "
                              f"paths ({moved}); its trials and export "
                              "read the files where they were: tune from there, or give the tune spec a new name")
        if diff:
            raise ConfigError(f"{spec.source}: {diff[0]}: does not match study {spec.name!r} in storage (its "
                              f"{', '.join(diff)} differ{'s' if len(diff) == 1 else ''}); resume with the same spec "
                              "or give the tune spec a new name")
    theirs_dirs = [d.name.lower() for d in study.directions]
    if theirs_dirs != spec.directions:
        raise ConfigError(f"{spec.source}: objectives: study {spec.name!r} in storage has directions "
                          f"{theirs_dirs}, the spec {spec.directions}; give the tune spec a new name")
    return study


def _moved_inputs(theirs: Any, mine: Any) -> str:
    """``"workload.trace: A -> B, ..."`` when two tune bases differ in their input file paths alone
    (a copied or moved tree), else ``""``."""
    from ..study import INPUT_FIELDS, without_input_paths  # lazy: memtp_sim.study imports pandas

    if not (isinstance(theirs, dict) and isinstance(mine, dict)):
        return ""
    if json.dumps(without_input_paths(theirs), sort_keys=True) != json.dumps(without_input_paths(mine), sort_keys=True):
        return ""
    moved = [f"{sec}.{name}: {(theirs.get(sec) or {}).get(name)} -> {(mine.get(sec) or {}).get(name)}"
             for sec, name in INPUT_FIELDS
             if (theirs.get(sec) or {}).get(name) != (mine.get(sec) or {}).get(name)]
    return ", ".join(moved)


def study_inputs(spec: TuneSpec) -> dict[str, tuple[Path, str]]:
    """Every file a trial of ``spec`` reads, with its content digest.

    The files of each scenario come from :func:`memtp_sim.study.input_files` and their digests
    from :func:`memtp_sim.study.input_fingerprint` (as ``run`` checks a study's runs), over the
    corners of the search space, which hold every categorical choice (a tuned
    ``hardware.profile`` or ``workload.trace`` reads one file per choice).

    Args:
        spec: the tune spec.

    Returns:
        ``{label: (path, digest)}``: ``label`` is the role (``trace``, ``hardware``,
        ``measurements``, ``acceptance``) for the files of the first corner, ``"<role> <path>"``
        for another file in that role.

    Raises:
        ConfigError: a file cannot be read (one line naming it), or a corner makes an invalid
            scenario (as at load).
        CalibrationError: a hardware profile or its data file is missing
            (:func:`memtp_sim.hardware.profile_files`).

    Source:
        :func:`memtp_sim.study.input_fingerprint` (16 hex digits of SHA-256 per file).
    """
    from ..study import input_files, input_fingerprint  # lazy: memtp_sim.study imports pandas

    out: dict[str, tuple[Path, str]] = {}
    for values in _corners(spec):
        scen = scenario_for(spec, values)
        try:
            digests = input_fingerprint(scen)
        except OSError as e:
            raise ConfigError(f"{spec.source}: input file {e.filename}: {e.strerror}") from None
        for role, path in input_files(scen).items():
            label = role if role not in out or out[role][0] == path else f"{role} {path}"
            out.setdefault(label, (path, digests[role]))
    return out


def check_study_inputs(study: optuna.Study, spec: TuneSpec, *, where: str, todo: str,
                       ) -> tuple[dict[str, tuple[Path, str]], str | None]:
    """Check that the files the study's trials read still hold what they held when it was made.

    Args:
        study: the study (its record, user attribute :data:`~memtp_sim.tuning.STUDY_ATTR`).
        spec: its tune spec.
        where: the start of the error line (the tune YAML, or ``export: study NAME``).
        todo: what the user can do, ending the error line.

    Returns:
        ``(inputs, note)``: the files now (:func:`study_inputs`); ``note`` is None when every digest
        matches, a one-line note when the study records no digests (made before ``tune`` recorded
        them), so its inputs cannot be checked.

    Raises:
        ConfigError: a file changed, appeared or is gone since (one line naming the first, its
            path, and ``todo``); or as :func:`study_inputs`.

    Source:
        Digests of :func:`study_inputs`, compared with those :func:`open_study` recorded.
    """
    now = study_inputs(spec)
    stored = (study.user_attrs.get(STUDY_ATTR) or {}).get("inputs")
    if not isinstance(stored, dict):
        return now, (f"study {study.study_name!r} records no digests of its input files (made before tune recorded "
                     "them), so it cannot be checked that the trace and profiles are still the files its trials read")
    from ..study import changed_inputs  # lazy: memtp_sim.study imports pandas

    changed = changed_inputs(stored, {label: digest for label, (_, digest) in now.items()})
    if not changed:
        return now, None
    shown = [k if k in now and str(now[k][0]) in k else f"{k} ({now[k][0]})" if k in now else f"{k} (no longer read)"
             for k in changed]
    raise ConfigError(f"{where}: input changed since study {study.study_name!r} was tuned: {', '.join(shown)}; "
                      f"its trials were priced on the old contents; {todo}")


def count_trials(study: optuna.Study, state: Any) -> int:
    """How many trials of the study are in ``state``.

    Args:
        study: the study.
        state: an ``optuna.trial.TrialState``.

    Returns:
        The count.

    Source:
        Optuna ``Study.get_trials(deepcopy=False, states=...)``.
    """
    return len(study.get_trials(deepcopy=False, states=(state,)))

"""Running a study: samplers, the in-process loop, worker processes, then validation and report.

``workers > 1`` starts that many local processes (``spawn``), each calling
``optuna.load_study(...).optimize`` on the shared storage (:mod:`memtp_sim.tuning._storage`).

**Ctrl-C.** The first Ctrl-C asks the running trials to stop between two seed runs (that trial
FAILs; finished trials are kept); a second one interrupts at once. Worker processes ignore SIGINT
(the terminal sends it to the whole process group) and stop when the parent tells them to; a worker
that has not stopped 60 s later is terminated, and its RUNNING trial is marked FAIL on resume.
"""

from __future__ import annotations

import collections
import dataclasses
import multiprocessing
import os
import signal
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .._procs import die_with_parent
from ..errors import ConfigError, MemtpSimError
from ._evaluation import (
    SigintSetsEvent,
    Stopped,
    constraints_from_attrs,
    has_set_constraint,
    make_objective,
    stop_callback,
    zero_capacity_warning,
)
from ._report import write_tune_report
from ._selection import top_trials
from ._spec import TuneSpec
from ._storage import (
    check_study_inputs,
    count_trials,
    default_storage_url,
    fail_dead_worker_trials,
    mask_url,
    open_storage,
    open_study,
    storage_kind,
)
from ._validation import validate_trials

if TYPE_CHECKING:  # pragma: no cover
    import optuna

__all__ = ["TuneOutcome", "run_tune"]


@dataclasses.dataclass
class TuneOutcome:
    """What :func:`run_tune` did.

    Attributes:
        study_name: Optuna study name.
        storage_url: the storage URL, password masked.
        requested: requested number of COMPLETE trials.
        complete: COMPLETE trials now in the study.
        ran: trials this call started (in this process or its workers; not those of other ``tune``
            processes on the same storage).
        ran_states: those trials by state (``"complete"``, ``"fail"``, ``"running"`` for a trial
            whose worker died mid-trial, ...), counted from the storage at the end.
        stale_failed: RUNNING trials of dead workers marked FAIL on resume.
        worker_exit_codes: exit code of each worker process (empty when run in-process).
        validation: fresh-seed validation, ``{trial number: record}`` (see
            :func:`memtp_sim.tuning.validate_trials`).
        report: path of report.html, or None.
        elapsed_s: wall-clock seconds of the optimisation.
        warnings: one line each about the study as a whole (e.g. every trial scored the capacity
            objective 0 because the SLO fails even unloaded).
        notes: one line each about the resume (a study made before input-file digests were
            recorded, whose inputs cannot be checked).

    Source:
        Optuna trial states (``TrialState.COMPLETE``, ``RUNNING``, ``FAIL``) as in the Optuna
        documentation.
    """

    study_name: str
    storage_url: str
    requested: int
    complete: int
    ran: int
    stale_failed: list[int]
    worker_exit_codes: list[int]
    validation: dict[int, dict[str, Any]]
    report: Path | None
    elapsed_s: float
    warnings: list[str] = dataclasses.field(default_factory=list)
    ran_states: dict[str, int] = dataclasses.field(default_factory=dict)
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def short(self) -> bool:
        """Fewer COMPLETE trials than requested (a worker died or trials failed)."""
        return self.complete < self.requested

    def started_note(self) -> str:
        """What this call ran, for the summary line: ``"3 started now: 2 complete, 1 failed"``,
        or ``"none started now"``. A trial still RUNNING at the end lost its worker mid-trial."""
        if not self.ran:
            return "none started now"
        order = {"complete": 0, "fail": 1, "running": 2}
        words = {"fail": "failed", "running": "left RUNNING by a dead worker (marked FAIL on resume)"}
        parts = [f"{n} {words.get(state, state)}"
                 for state, n in sorted(self.ran_states.items(), key=lambda kv: (order.get(kv[0], 3), kv[0]))]
        return f"{self.ran} started now: {', '.join(parts)}"


# ------------------------------------------------------------------------------------ samplers
def _make_sampler(spec: TuneSpec, seed: int) -> optuna.samplers.BaseSampler:
    import optuna  # lazy: importing memtp_sim.tuning must not import optuna (~0.1 s)

    kw: dict[str, Any] = {}
    if spec.constraints and not has_set_constraint():
        kw["constraints_func"] = constraints_from_attrs
    s = spec.sampler
    if s.name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=s.n_startup_trials, constant_liar=True, **kw)
    if s.name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=s.population_size, **kw)
    return optuna.samplers.RandomSampler(seed=seed)


def _sampler_seed(spec: TuneSpec, num_existing: int, worker_index: int) -> int:
    """Distinct per worker and per resume, reproducible for a fresh study."""
    ss = np.random.SeedSequence([spec.sampler.seed & 0xFFFFFFFF, num_existing, worker_index])
    return int(ss.generate_state(1)[0])


# ------------------------------------------------------------------------------------ running
def run_tune(
    spec: TuneSpec,
    *,
    storage_url: str | None = None,
    n_trials: int | None = None,
    workers: int = 1,
    out_dir: str | Path = "results",
    validate: bool = True,
    report: bool = True,
    heartbeat_interval_s: int = 10,
    grace_period_s: int = 30,
    on_progress: Callable[[int, int], None] | None = None,
) -> TuneOutcome:
    """Run (or resume) a tuning study until it has ``n_trials`` COMPLETE trials.

    Args:
        spec: the tune spec.
        storage_url: Optuna storage URL (default: :func:`memtp_sim.tuning.default_storage_url`).
        n_trials: COMPLETE trials wanted in total (default: ``spec.n_trials``).
        workers: 1 runs in this process; N > 1 starts N worker processes sharing the storage.
        out_dir: results folder (``<out_dir>/<name>/`` gets validation.json and report.html).
        validate: re-run the top trials on fresh seeds afterwards.
        report: write report.html afterwards.
        heartbeat_interval_s: RDB heartbeat period, seconds (non-SQLite RDB URLs).
        grace_period_s: RDB heartbeat grace period, seconds.
        on_progress: ``on_progress(complete, requested)`` now and then.

    Returns:
        A :class:`TuneOutcome`. Validation and the report are skipped when the study is short.

    Raises:
        ConfigError: ``workers`` < 1 or ``n_trials`` < 1 (named as the CLI flags ``--workers``,
            ``--n-trials``); bad storage, a study of that name with another spec, or one whose
            input files (trace, profiles) changed since it was made (the message starts with
            ``spec.source``, the YAML file; see :func:`memtp_sim.tuning.check_study_inputs`).
        KeyboardInterrupt: Ctrl-C (see the module docstring); finished trials are kept, the trials
            that were running FAIL (run again to resume).

    Source:
        Optuna documentation: parallel optimisation by several processes sharing one storage
        (``optuna.load_study`` + ``Study.optimize``), ``TPESampler(constant_liar=True)`` for
        parallel TPE, ``NSGAIISampler``, ``RandomSampler``, RDB heartbeats and
        ``optuna.storages.fail_stale_trials``.
    """
    import optuna  # lazy: importing memtp_sim.tuning must not import optuna (~0.1 s)
    from optuna.trial import TrialState

    if workers < 1:
        raise ConfigError(f"--workers: must be >= 1 (got {workers})")
    url = storage_url or default_storage_url(spec.name, out_dir)
    n_trials = spec.n_trials if n_trials is None else int(n_trials)
    if n_trials < 1:
        raise ConfigError(f"--n-trials: must be >= 1 (got {n_trials})")
    storage = open_storage(url, heartbeat_interval_s=heartbeat_interval_s, grace_period_s=grace_period_s,
                           flag="--storage" if storage_url else "--out")
    study = open_study(spec, storage)
    _, note = check_study_inputs(study, spec, where=spec.source,
                                 todo="restore the old file(s), or give the tune spec a new name to tune on the "
                                      "new contents")
    stale = fail_dead_worker_trials(study)
    if storage_kind(url) == "rdb":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)
    complete = count_trials(study, TrialState.COMPLETE)
    remaining = max(0, n_trials - complete)
    existing = len(study.get_trials(deepcopy=False))
    call = uuid.uuid4().hex  # tags the trials this call starts (worker.call): other processes may share the study
    codes: list[int] = []
    t0 = time.perf_counter()
    if on_progress is not None:
        on_progress(complete, n_trials)
    if remaining and workers == 1:
        _run_in_process(spec, study, remaining, existing, n_trials, on_progress, call)
    elif remaining:
        codes = _run_workers(spec, url, study, remaining, workers, existing, (heartbeat_interval_s, grace_period_s),
                             n_trials, on_progress, call)
    elapsed = time.perf_counter() - t0
    complete = count_trials(study, TrialState.COMPLETE)
    trials = study.get_trials(deepcopy=False)  # one query on an RDB storage
    mine = [t for t in trials if isinstance(t.user_attrs.get("worker"), dict) and t.user_attrs["worker"].get("call") == call]
    states = dict(collections.Counter(t.state.name.lower() for t in mine))
    outcome = TuneOutcome(spec.name, mask_url(url), n_trials, complete, len(mine), stale, codes, {}, None, elapsed,
                          ran_states=states, notes=[note] if note is not None else [])
    shared = _shared_results_note(spec.name, out_dir, storage_url)
    if shared is not None and report and not outcome.short:
        outcome.notes.append(shared)
    zero = zero_capacity_warning(spec, trials)
    if zero is not None:
        outcome.warnings.append(zero)
    if outcome.short:
        return outcome
    if validate and spec.validation.top_k > 0:
        outcome.validation = _validate_top(study, spec, out_dir)
    if report:
        outcome.report = write_tune_report(study, spec, Path(out_dir) / spec.name / "report.html",
                                           storage=mask_url(url))
    return outcome


def _shared_results_note(name: str, out_dir: str | Path, storage_url: str | None) -> str | None:
    """What a tune with ``--storage`` writes over: ``<out_dir>/<name>/`` may also hold a study of
    the same name in its default storage (``optuna.db`` there), whose report.html and
    validation.json this run's now replace (the study itself stays in its storage)."""
    default = default_storage_url(name, out_dir)
    folder = Path(out_dir) / name
    if storage_url is None or mask_url(storage_url) == mask_url(default) or not (folder / "optuna.db").exists():
        return None
    return (f"{folder}/ also holds a study {name!r} in its default storage ({mask_url(default)}): its report.html "
            f"and validation.json now describe the study in {mask_url(storage_url)} (the report names its storage; "
            "give --out another folder to keep both)")


def _run_in_process(spec: TuneSpec, study: optuna.Study, remaining: int, existing: int, n_trials: int,
                    on_progress: Callable[[int, int], None] | None, call: str) -> None:
    """Run ``remaining`` trials here; the first Ctrl-C stops between seed runs, then re-raises."""
    from optuna.trial import (
        TrialState,  # lazy: importing memtp_sim.tuning must not import optuna (~0.1 s)
    )

    study.sampler = _make_sampler(spec, _sampler_seed(spec, existing, 0))
    stop = threading.Event()
    callbacks = []
    if on_progress is not None:
        callbacks.append(lambda st, tr: on_progress(count_trials(st, TrialState.COMPLETE), n_trials))
    callbacks.append(stop_callback(stop.is_set))
    callbacks.append(_enough_complete(n_trials))
    with SigintSetsEvent(stop):
        try:
            study.optimize(make_objective(spec, stop.is_set, call), n_trials=remaining, callbacks=callbacks,
                           gc_after_trial=False)
        except Stopped:
            pass
    if stop.is_set():
        raise KeyboardInterrupt


def _validate_top(study: optuna.Study, spec: TuneSpec, out_dir: str | Path) -> dict[int, dict[str, Any]]:
    """Validate the top ``validation.top_k`` trials not yet validated on these fresh seeds."""
    chosen = [t.number for t in top_trials(study, spec, spec.validation.top_k)]
    stored = study.user_attrs.get("validation", {})
    todo = [n for n in chosen if stored.get(str(n), {}).get("seeds") != spec.fresh_seeds]
    if todo:
        validate_trials(study, spec, todo, out_dir=out_dir)  # a resumed study keeps earlier records
        stored = study.user_attrs.get("validation", {})
    return {n: stored[str(n)] for n in chosen}


# ------------------------------------------------------------------------------------ workers
def _enough_complete(n_trials: int) -> Any:
    """Optuna's own stop rule for a shared study: stop once it holds ``n_trials`` COMPLETE trials,
    whoever ran them (every ``tune`` process on the storage counts its quota at start; without this,
    two processes started together each ran the full ``n_trials``). Trials in flight when it is
    reached still finish, so concurrent processes may end up to one trial each over."""
    from optuna.study import MaxTrialsCallback  # lazy: importing memtp_sim.tuning must not import optuna
    from optuna.trial import TrialState

    return MaxTrialsCallback(n_trials, states=(TrialState.COMPLETE,))


def _worker_main(spec: TuneSpec, url: str, n_trials: int, seed: int, heartbeat: tuple[int, int],
                 stop: Any = None, total_trials: int | None = None, call: str | None = None) -> None:
    """Entry point of one worker process: load the shared study and run ``n_trials`` trials (fewer
    once the study holds ``total_trials`` COMPLETE ones), tagged with the parent's ``call`` id.

    Ctrl-C is the parent's business: the worker ignores SIGINT (the terminal sends it to the whole
    process group) and stops when the parent sets ``stop`` (a multiprocessing Event): between two
    seed runs (that trial FAILs) or after a trial. The parent terminates a worker that takes too long.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent()  # a kill -9 of `tune` must not leave workers running unsupervised
    import optuna  # lazy: importing memtp_sim.tuning must not import optuna (~0.1 s)

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    should_stop = stop.is_set if stop is not None else None
    try:
        storage = open_storage(url, heartbeat_interval_s=heartbeat[0], grace_period_s=heartbeat[1])
        study = optuna.load_study(study_name=spec.name, storage=storage, sampler=_make_sampler(spec, seed))
        callbacks = [stop_callback(should_stop)] if should_stop is not None else []
        if total_trials is not None:
            callbacks.append(_enough_complete(total_trials))
        study.optimize(make_objective(spec, should_stop, call), n_trials=n_trials, callbacks=callbacks,
                       gc_after_trial=False)
    except (Stopped, KeyboardInterrupt):
        sys.exit(130)
    except MemtpSimError as e:
        print(f"error: {e} (worker pid {os.getpid()})", file=sys.stderr)
        sys.exit(2)
    if should_stop is not None and should_stop():
        sys.exit(130)


def _run_workers(spec: TuneSpec, url: str, study: optuna.Study, remaining: int, workers: int, existing: int,
                 heartbeat: tuple[int, int], n_trials: int,
                 on_progress: Callable[[int, int], None] | None, call: str) -> list[int]:
    """Start ``workers`` processes with quotas summing to ``remaining``; wait; return exit codes."""
    from optuna.trial import (
        TrialState,  # lazy: importing memtp_sim.tuning must not import optuna (~0.1 s)
    )

    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    quotas = [remaining // workers + (1 if i < remaining % workers else 0) for i in range(workers)]
    procs = []
    # Workers start with SIGINT ignored (inherited through exec; Python keeps an ignored SIGINT), so a
    # Ctrl-C, which the terminal sends to every process of the group, reaches only this process.
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main_thread else None
    try:
        for i, q in enumerate(quotas):
            if q == 0:
                continue
            p = ctx.Process(target=_worker_main, name=f"memtp-tune-{i}",
                            args=(spec, url, q, _sampler_seed(spec, existing, i), heartbeat, stop, n_trials, call))
            p.start()
            procs.append(p)
    finally:
        if main_thread:
            signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)
    last = -1
    try:
        while any(p.is_alive() for p in procs):
            for p in procs:
                p.join(timeout=0.5)
            if on_progress is not None:
                done = count_trials(study, TrialState.COMPLETE)
                if done != last:
                    on_progress(done, n_trials)
                    last = done
    except BaseException:
        # Ctrl-C (or any error here): ask the workers to stop between seed runs; the trial each one
        # is in FAILs, finished trials are kept. A second Ctrl-C, or 60 s, and they are terminated
        # (their RUNNING trials are marked FAIL when the study is resumed).
        stop.set()
        _stop_workers(procs)
        raise
    return [int(p.exitcode if p.exitcode is not None else -1) for p in procs]


def _stop_workers(procs: list[Any]) -> None:
    """Wait up to 60 s for workers that were asked to stop (a Ctrl-C cuts it short), then terminate."""
    try:
        deadline = time.monotonic() + 60.0
        for p in procs:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
    except KeyboardInterrupt:
        pass
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=5)

"""One library call runs one scenario: :func:`run` (the CLI, the tuner and the dashboard call it)."""

from __future__ import annotations

import os
import time
from functools import lru_cache
from typing import Any, Callable

import numpy as np

from ._io import disk_cached
from ._version import __version__
from .acceptance import AcceptanceModel
from .confidence import ConfidenceHead, calibration_stream, sequential_temperature_scaling
from .config import DriftConfig, Scenario
from .drafting import Drafter
from .errors import InvalidArgumentError
from .engine import Engine, EngineSettings
from .hardware import HardwareProfile, load_profile, profile_files
from .metrics import RunResult, compute_metrics
from .policies import make_policy
from .policies.control import make_control
from .workload import build_workload, load_trace

__all__ = ["run", "build_acceptance", "confidence_setup"]


_PROFILE_FILES: dict[tuple[str, str], tuple[str, ...]] = {}


def _profile(key: str) -> HardwareProfile:
    """The hardware profile ``key`` names, as :func:`load_profile` reads it: its files looked up
    once per key (a relative path: from this folder), the profile once per version of them, so an
    edited file is read again (a dashboard runs for hours) for two ``stat`` calls a run."""
    where = (key, "" if os.path.isabs(key) else os.getcwd())
    files = _PROFILE_FILES.get(where)
    try:
        stats = tuple((st.st_mtime_ns, st.st_size) for st in map(os.stat, files or ()))
    except OSError:  # moved or deleted: looked up again (load_profile names what is missing)
        files = None
    if not files:
        files = _PROFILE_FILES[where] = tuple(map(str, profile_files(key)))
        stats = tuple((st.st_mtime_ns, st.st_size) for st in map(os.stat, files))
    return _profile_at(key, where[1], stats)


@lru_cache(maxsize=16)
def _profile_at(key: str, cwd: str, stats: tuple) -> HardwareProfile:  # the files' stat in the key: edits reload
    return load_profile(key)


def build_acceptance(scenario: Scenario) -> AcceptanceModel:
    """The scenario's acceptance model (see :class:`memtp_sim.config.AcceptanceConfig` for its sources)."""
    return scenario.acceptance.build()


_STS_CACHE: dict[tuple, tuple[float, ...]] = {}


def _fit_sts(acc: AcceptanceModel, mix: np.ndarray, head: ConfidenceHead, gamma: int, rounds: int,
             seed: int) -> np.ndarray:
    # Cached per process: every policy of a sweep point shares the same held-out fit.
    # On disk too, keyed by the inputs and numpy's version (its random streams): a cold process
    # would otherwise pay the fit (about half a second) on its first run.
    key = (acc.fingerprint, tuple(mix), head, gamma, rounds, seed)
    if key not in _STS_CACHE:
        def fit() -> list[float]:
            conf, accepted = calibration_stream(acc, head, np.random.default_rng([seed, 2]), rounds, gamma, mix)
            # a head far from calibrated (e.g. the drafter lab's under-confident ones) needs a wider grid
            grid = None if head.overconfidence >= 0.5 else np.geomspace(0.01, 8.0, 241)
            return [float(t) for t in sequential_temperature_scaling(conf, accepted, grid=grid)]
        disk_key = (repr(acc.fingerprint), [float(x) for x in mix], repr(head), gamma, rounds, seed, np.__version__)
        _STS_CACHE[key] = tuple(float(t) for t in disk_cached("sts", disk_key, fit))
    return np.array(_STS_CACHE[key])


def confidence_setup(scenario: Scenario, acc: AcceptanceModel, domain_probs: np.ndarray, gamma: int,
                     seed: int) -> tuple[ConfidenceHead, np.ndarray]:
    """The scenario's confidence head and the per-position temperatures the engine applies.

    STS (``sts: fit``) is fitted on a held-out calibration stream drawn from random stream
    ``[seed, 2]``, never on the evaluated run. Returns (head, temperatures of shape (gamma,)) where
    each temperature already includes the global ``temperature`` knob.
    """
    cfg = scenario.confidence
    if cfg.head == "profile":  # the head the acceptance profile measured (drafter lab)
        head = ConfidenceHead(**acc.confidence)
    else:
        head = ConfidenceHead(cfg.noise_sd, cfg.overconfidence, oracle=cfg.head == "oracle")
    sts = np.ones(gamma)
    if gamma > 0 and cfg.head != "oracle":
        if cfg.sts == "fit":
            sts = _fit_sts(acc, domain_probs, head, gamma, cfg.sts_rounds, seed)
        elif isinstance(cfg.sts, list):
            given = np.array(cfg.sts, dtype=np.float64)
            sts = np.concatenate([given, np.full(max(0, gamma - given.size), given[-1])])[:gamma]
    return head, sts * cfg.temperature


def logit_shift(drift: DriftConfig) -> Callable[[float, np.ndarray, np.ndarray], np.ndarray]:
    """The engine's acceptance-drift function for a scenario's ``acceptance.drift`` section:
    ``shift(now_s, generated, context)`` = the time phase's shift + ``per_1k_output_tokens`` x
    generated / 1000 + ``per_1k_context_tokens`` x context / 1000 (logits, one per request)."""
    starts = np.array([p.start_s for p in drift.time_phases], dtype=np.float64)
    shifts = np.array([p.shift for p in drift.time_phases], dtype=np.float64)
    a, b = drift.per_1k_output_tokens / 1000.0, drift.per_1k_context_tokens / 1000.0

    def shift(now_s: float, generated: np.ndarray, context: np.ndarray) -> np.ndarray:
        i = int(np.searchsorted(starts, now_s, side="right")) - 1
        phase = shifts[i] if i >= 0 else 0.0
        return phase + a * generated + b * context

    return shift


def run(scenario: Scenario, *, seed: int = 0,
        progress: Callable[[int, int], None] | None = None) -> RunResult:
    """Simulate one scenario and return its result.

    Randomness: the workload (lengths, domains, Poisson gaps) draws from stream ``[seed, 0]`` and
    the engine (difficulty, per-round acceptance) from ``[seed, 1]``, so runs that differ only in
    policy see the same requests (common random numbers), and the same seed reproduces a run
    exactly.

    Args:
        scenario: a validated :class:`~memtp_sim.config.Scenario`.
        seed: run seed.
        progress: optional ``progress(done, total)`` callback.

    Raises:
        InvalidArgumentError: ``scenario`` is not a Scenario, or ``seed`` is not an integer >= 0.
        ConfigError: the workload cannot be built from the trace (e.g. too few rows).
    """
    if not isinstance(scenario, Scenario):
        raise InvalidArgumentError(f"scenario: expected a memtp_sim.config.Scenario (Scenario.model_validate(a dict) "
                                   f"or load_scenario(a YAML path)), got {type(scenario).__name__}")
    # the same seeds a study YAML takes: True or "0" would run as seeds 1 and 0 without a word
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InvalidArgumentError(f"seed: expected an integer >= 0 (numpy seeds its generators with non-negative "
                                   f"integers), got {seed.item() if isinstance(seed, np.generic) else seed!r}")
    t_start = time.perf_counter()
    profile = _profile(scenario.hardware.profile)
    acc = build_acceptance(scenario)
    mix = scenario.acceptance.resolved_mix(acc.domains)
    probs = np.array([float(mix.get(d, 0.0)) for d in acc.domains])
    if scenario.acceptance.source != "profile" or probs.sum() <= 0:
        probs = np.zeros(len(acc.domains))
        probs[0] = 1.0
    probs = probs / probs.sum()
    wl_cfg = scenario.workload
    wl = build_workload(
        load_trace(wl_cfg.trace), mode=wl_cfg.mode, num_requests=wl_cfg.num_requests,
        rng=np.random.default_rng([seed, 0]), domain_probs=probs, rate_scale=wl_cfg.rate_scale,
        rate_per_s=wl_cfg.rate_per_s,
        rate_schedule=[(seg.duration_s, seg.rate_per_s) for seg in wl_cfg.rate_schedule] if wl_cfg.rate_schedule else None,
        concurrency=wl_cfg.concurrency, think_time_s=wl_cfg.think_time_s,
        start_offset_s=wl_cfg.start_offset_s,
    )
    # The drafter owns the draft length (with MEMTP: the ensemble depth, gamma -> max_depth).
    spec = scenario.draft_spec()
    drafter = Drafter(spec, profile)
    policy = make_policy(spec.policy_name, spec.policy_params)
    head, temps = confidence_setup(scenario, acc, probs, spec.max_draft_len, seed)
    settings = EngineSettings(**(scenario.engine.model_dump() | {"max_num_seqs": scenario.engine.num_seqs_limit}))
    control = make_control(scenario.draft_control.name, scenario.draft_control.params)
    drift = scenario.acceptance.drift
    engine = Engine(profile, acc, wl, policy, settings, np.random.default_rng([seed, 1]), progress=progress,
                    head=head, temperatures=temps, head_rng=np.random.default_rng([seed, 3]), drafter=drafter,
                    control=control, logit_shift=logit_shift(drift) if drift.active else None)
    state = engine.run()
    metrics = compute_metrics(state)
    notes: list[str] = []
    if wl.num_not_arrived:
        notes.append(f"{wl.num_not_arrived} of the {wl.num_requests + wl.num_not_arrived} requests asked for never "
                     "arrived: the rate schedule ended first")
    if metrics["num_rejected"]:
        notes.append(f"{metrics['num_rejected']} request(s) rejected: {metrics['rejected_by_reason']}")
    if metrics["num_preemptions"]:
        notes.append(f"{metrics['num_preemptions']} preemption(s) (KV cache full; recomputed)")
    provenance: dict[str, Any] = {
        "hardware": profile.summary(),
        "acceptance": acc.summary(),
        "confidence": {**scenario.confidence.model_dump(mode="json"), "applied_temperatures": temps.tolist()},
    }
    return RunResult(
        scenario=scenario.model_dump(mode="json"),
        seed=int(seed),
        metrics=metrics,
        state=state,
        provenance=provenance,
        policy_label=policy.describe(),
        version=__version__,
        wall_s=time.perf_counter() - t_start,
        notes=notes,
    )

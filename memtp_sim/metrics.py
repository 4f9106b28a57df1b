"""From raw engine counts to a frozen :class:`RunResult`.

Every metric is defined once, here (rates are computed from raw counts only when reporting, as in
vLLM's spec-decode metrics):

* ``ttft_s``: first token time minus arrival (the first token comes out of the prefill pass).
* ``tpot_ms``: (finish - first token) / (output tokens - 1), requests with >= 2 output tokens.
* ``tok_per_s_user``: (output tokens - 1) / (finish - first token) = 1000 / tpot_ms: the decode
  speed one user sees (the DSpark paper's per-user speed).
* ``e2e_s``: finish minus arrival; ``queue_s``: first admission minus the time the request
  joined this GPU's admission queue (its arrival, or the end of its remote prefill when prefill
  is disaggregated): waiting for a sequence slot or KV memory.
* ``throughput_tok_per_s``: output tokens emitted in the steady window divided by its length.
  The window runs from the first arrival to the last arrival (while load is offered); when that
  is shorter than half the run (e.g. a closed loop with more users than requests) the whole run
  is used. ``makespan_throughput_tok_per_s`` always uses the whole run.
* ``mean_verify_len``: draft tokens verified per decoding request per round (bonus excluded).
* ``tau``: tokens accepted per decoding request per round, bonus included (uncapped by the
  request's remaining output, so it is comparable to the paper's Table 1).
* ``acceptance_rate``: accepted draft tokens / verified draft tokens.
* ``wasted_verify_tokens``: verified draft tokens that were rejected.
* ``early_stop_gap_frac``: for DSpark with early stop, the fraction of rounds where a global
  search over the same candidates would have found a higher expected rate (the paper's
  section 5.2 caveat about jagged SPS cliffs).
* ``offered_load_ratio``: arrivals / completions from the first to the last arrival (open loop);
  above ``OVERLOAD_RATIO`` (1.2), on at least ``OVERLOAD_MIN_ARRIVALS`` (20) arrivals, the offered
  load exceeds capacity and the queue grows without bound (:func:`is_overloaded`, the reports'
  flag). The window starts empty, so a stable run's ratio sits about ``L / n`` above 1 and the
  flag misses overloads below about 20%.
* ``offered_load_ratio_late``: arrivals / departures (completions and rejections) over the late
  half of that window, from halfway between the first and last arrival to the last (open loop):
  ``1 + (growth of the number in system) / departures``, about 1 for a stable queue at any run
  length, ``lambda / mu`` for an overloaded one. The SLA capacity search's overload test
  (:mod:`memtp_sim.capacity`).
* ``extrapolated_cost_frac``: fraction of rounds whose pass was priced outside the profile's
  measured B range (by its below_min / beyond_max rule; reports warn above
  ``EXTRAPOLATED_WARN_FRAC``); ``mean_kv_read_tokens``: time-weighted
  KV tokens a pass read; ``overhead_time_frac``: host and planner time / busy time.
* ``num_not_arrived``: requests asked for that never arrived because a rate schedule ended first.
* Little's law, ``L = lambda W``, holds over the whole run, ``T = makespan_s`` (first arrival to
  last departure), with
  ``L = mean_in_system`` (time average over ``T`` of requests in the system, integrated from the
  engine's own arrival/departure events),
  ``lambda = request_throughput_per_s`` (completed requests / ``T``) and
  ``W = mean_e2e_s`` (mean over completed requests; a rejected request leaves at its arrival and
  adds nothing to ``L``). So ``mean_in_system = request_throughput_per_s x mean_e2e_s`` exactly on
  every run, and from ``runs.csv``'s columns. ``mean_in_system_sampled`` is ``L`` sampled at round
  starts (waiting + running + in a remote prefill GPU; idle periods count as 0; it misses part of
  each arrival's first round, so it is slightly lower). ``arrival_rate_per_s`` is not the law's
  ``lambda``: requests / (last arrival - first arrival), the rate while load is offered, it leaves
  out the drain after the last arrival, so ``arrival_rate_per_s x mean_e2e_s`` overstates ``L``
  (``scenarios/h200-colocated.yaml`` as a closed loop of 64 users, seed 0: 70.9 against 57.8).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

from .confidence import _auc_rows, _ece_rows, reliability_curve, survival_calibration
from .engine import FINISHED, REJECTED, EngineState

__all__ = ["RunResult", "compute_metrics", "METRIC_NAMES", "bound_never_holds"]

#: Every scalar metric a run reports (what tuning objectives and constraints may name).
METRIC_NAMES: tuple[str, ...] = (
    "num_requests", "num_completed", "num_rejected", "output_tokens_total", "makespan_s", "steady_window_s",
    "throughput_tok_per_s", "makespan_throughput_tok_per_s", "request_throughput_per_s",
    "tok_per_s_user_p10", "tok_per_s_user_p50", "tok_per_s_user_p90", "tok_per_s_user_mean",
    "ttft_s_p50", "ttft_s_p90", "ttft_s_p99", "tpot_ms_p50", "tpot_ms_p90", "tpot_ms_p99",
    "e2e_s_p50", "e2e_s_p90", "e2e_s_p99", "mean_e2e_s", "queue_s_p50", "queue_s_p90", "num_rounds",
    "mean_decode_batch", "mean_batch_tokens", "mean_verify_len", "tau", "acceptance_rate",
    "verified_draft_tokens", "accepted_draft_tokens", "wasted_verify_tokens", "wasted_verify_frac",
    "draft_time_frac", "busy_frac", "kv_capacity_blocks", "kv_peak_frac", "num_preemptions", "mean_depth",
    "num_depth_changes", "mean_heads_gib", "mean_kv_gib", "peak_kv_gib", "mean_free_gib", "mean_coherence",
    "head_load_s_total", "mean_waiting", "num_draft_trims", "early_stop_gap_frac", "mean_in_system",
    "mean_in_system_sampled", "arrival_rate_per_s", "num_not_arrived", "offered_load_ratio",
    "offered_load_ratio_late", "extrapolated_cost_frac", "mean_kv_read_tokens", "overhead_time_frac",
    "ece_raw_mean", "ece_mean", "auc_mean",
)


def bound_never_holds(metric: str, op: str, bound: float) -> str | None:
    """Why ``metric op bound`` can hold for no run, or None: every metric here is a count, a
    time, a rate or a size, never negative, and ``*_frac``, ``acceptance_rate`` and ``auc_mean``
    are fractions in [0, 1] (the SLO terms of ``capacity`` and the constraints of ``tune``).

    Args:
        metric: a name of :data:`METRIC_NAMES` (or the capacity metric, a rate); op: ``"<="`` or
            ``">="``; bound: the bound, in the metric's units.
    """
    if op == "<=" and bound < 0:
        return f"{metric} <= {bound:g} can never hold ({metric} is never negative); give a bound >= 0"
    if op == ">=" and bound > 1 and (metric.endswith("_frac") or metric in ("acceptance_rate", "auc_mean")):
        return f"{metric} >= {bound:g} can never hold ({metric} is a fraction in [0, 1]); give a bound <= 1"
    return None


def _pcts(x: np.ndarray, qs: tuple[float, ...]) -> list[float]:
    """Percentiles ``qs`` of the finite values of ``x`` (NaN without any), in one np.percentile
    call (each q is the same linear interpolation as alone; a call costs ~40 us of overhead)."""
    x = x[np.isfinite(x)]
    return [float(v) for v in np.percentile(x, qs)] if x.size else [float("nan")] * len(qs)


def _time_avg(x: np.ndarray, w: np.ndarray) -> float:
    return float((x * w).sum() / w.sum()) if w.size and w.sum() > 0 else float("nan")


def _mean(x: np.ndarray) -> float:
    return float(x.mean()) if x.size else float("nan")


def compute_metrics(st: EngineState) -> dict[str, Any]:
    """Summary metrics of one run (names carry units). See the module docstring for definitions.

    Returns:
        A dict with every name of :data:`METRIC_NAMES` (scalars) plus ``rejected_by_reason`` and,
        when confidences were recorded, ``calibration_by_position`` (per-position ECE, AUC, Brier and
        reliability curves).
    """
    t0 = t0_of(st)
    makespan = max(st.end_s - t0, 1e-12)
    m = _request_metrics(st, makespan)
    m.update(_round_metrics(st, t0, makespan))
    m.update(_calibration_metrics(st))
    return m


def _request_metrics(st: EngineState, makespan: float) -> dict[str, Any]:
    """Per-request latency and speed percentiles, completion and rejection counts."""
    done = st.status == FINISHED
    rej = st.status == REJECTED
    arr, first, fin = st.arrival_at_s, st.first_token_at_s, st.finished_at_s
    ttft = (first - arr)[done]
    e2e = (fin - arr)[done]
    queue = (st.admitted_at_s - st.ready_at_s)[done]
    multi = done & (st.output_tokens >= 2)
    decode_s = (fin - first)[multi]
    n_dec_tokens = (st.output_tokens - 1)[multi]
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot_ms = np.where(n_dec_tokens > 0, decode_s / n_dec_tokens * 1e3, np.nan)
        user_tps = np.where(decode_s > 0, n_dec_tokens / decode_s, np.nan)
    tpot_ms, user_tps = tpot_ms[np.isfinite(tpot_ms)], user_tps[np.isfinite(user_tps)]
    reasons: dict[str, int] = {}
    for reason in st.reject_reason[rej]:
        reasons[reason] = reasons.get(reason, 0) + 1
    user_p10, user_p50, user_p90 = _pcts(user_tps, (10, 50, 90))
    ttft_p50, ttft_p90, ttft_p99 = _pcts(ttft, (50, 90, 99))
    tpot_p50, tpot_p90, tpot_p99 = _pcts(tpot_ms, (50, 90, 99))
    e2e_p50, e2e_p90, e2e_p99 = _pcts(e2e, (50, 90, 99))
    queue_p50, queue_p90 = _pcts(queue, (50, 90))
    return {
        "num_requests": int(st.status.size),
        "num_completed": int(done.sum()),
        "num_rejected": int(rej.sum()),
        "rejected_by_reason": reasons,
        "output_tokens_total": int(st.generated_tokens[done].sum()),
        "makespan_s": makespan,
        "makespan_throughput_tok_per_s": float(st.generated_tokens.sum()) / makespan,
        "request_throughput_per_s": float(done.sum()) / makespan,
        "tok_per_s_user_p10": user_p10,
        "tok_per_s_user_p50": user_p50,
        "tok_per_s_user_p90": user_p90,
        "tok_per_s_user_mean": _mean(user_tps),
        "ttft_s_p50": ttft_p50,
        "ttft_s_p90": ttft_p90,
        "ttft_s_p99": ttft_p99,
        "tpot_ms_p50": tpot_p50,
        "tpot_ms_p90": tpot_p90,
        "tpot_ms_p99": tpot_p99,
        "e2e_s_p50": e2e_p50,
        "e2e_s_p90": e2e_p90,
        "e2e_s_p99": e2e_p99,
        "mean_e2e_s": _mean(e2e),
        "queue_s_p50": queue_p50,
        "queue_s_p90": queue_p90,
        "num_preemptions": int(st.num_preemptions.sum()),
        "mean_in_system": st.in_system_area / makespan,
        "arrival_rate_per_s": _arrival_rate(st),
        "num_not_arrived": int(st.num_not_arrived),
        "offered_load_ratio": _offered_load_ratio(st),
        "offered_load_ratio_late": _offered_load_ratio_late(st),
    }


#: ``offered_load_ratio`` above this flags a run whose queue grows without bound (see below; the
#: reports' flag, not the capacity search's test).
OVERLOAD_RATIO = 1.2
#: Arrivals a run needs before its ratio can flag overload: requests still in flight when arrivals
#: stop lift a stable system's ratio to arrivals / (arrivals - in flight), so on a handful it says
#: nothing (2 arrivals, 1 in flight: 2.0); from 20 it takes 4 in flight to pass OVERLOAD_RATIO.
OVERLOAD_MIN_ARRIVALS = 20


#: ``extrapolated_cost_frac`` above this gets a warning: a few stray passes past the table's edge move
#: little, but beyond 5% of passes the results lean on the extrapolation rule, not on measurements.
EXTRAPOLATED_WARN_FRAC = 0.05


def is_overloaded(offered_load_ratio: float, num_arrived: float, *, limit: float = OVERLOAD_RATIO) -> bool:
    """The overload verdict: the ratio exceeds ``limit`` on at least :data:`OVERLOAD_MIN_ARRIVALS`
    arrivals (``num_requests``: every request that arrived; NaN ratio, e.g. a closed loop: not
    overloaded). With the default :data:`OVERLOAD_RATIO` on ``offered_load_ratio`` it is the study
    reports' flag (terminal and HTML): coarse, it misses overloads below about 20% (the whole-window
    ratio's start-empty bias needs the margin); the SLA capacity search passes
    ``offered_load_ratio_late`` with the sharper :func:`memtp_sim.capacity.overload_limit`."""
    return bool(num_arrived >= OVERLOAD_MIN_ARRIVALS and offered_load_ratio > limit)


def _offered_load_ratio(st: EngineState) -> float:
    """Arrivals / completions while load is offered (open loop; NaN for a closed loop).

    Over the window from the first to the last arrival, a stable queue completes about as many
    requests as arrive (the ratio tends to 1; requests still in the system at the window's end
    keep it slightly above). A ratio above :data:`OVERLOAD_RATIO` means arrivals outpaced the
    GPU: the queue grows without bound, so TTFT and queueing time measure the backlog, not the
    system.
    """
    t0 = t0_of(st)
    if st.closed_loop or not st.last_arrival_s > t0:
        return float("nan")
    arrived = int(np.count_nonzero(st.arrival_at_s <= st.last_arrival_s))
    completed = int(np.count_nonzero(np.nan_to_num(st.finished_at_s, nan=np.inf) <= st.last_arrival_s))
    return arrived / max(1, completed)


def _offered_load_ratio_late(st: EngineState) -> float:
    """Arrivals / departures over the late half of the arrival window (open loop; NaN for a closed loop).

    The window is ``(mid, last arrival]``, ``mid`` halfway between the first and the last arrival; a
    departure is a completion, or a rejection (at its arrival). By flow conservation
    ``arrivals - departures = N(last) - N(mid)``, the growth of the number in system over the window,
    so the ratio is ``1 + (N(last) - N(mid)) / departures``. A stable queue is about as full at the
    window's end as at its start: the ratio scatters around 1, without the start-empty bias of
    :func:`_offered_load_ratio` (whose window starts with nobody in the system). An overloaded one is
    saturated over the window, departing at its service rate ``mu`` while requests arrive at ``lambda``:
    the ratio tends to ``lambda / mu`` whatever the run's length.
    """
    t0 = t0_of(st)
    t1 = st.last_arrival_s
    if st.closed_loop or not t1 > t0:
        return float("nan")
    mid = t0 + 0.5 * (t1 - t0)
    arr = st.arrival_at_s
    gone = np.nan_to_num(np.where(st.status == REJECTED, arr, st.finished_at_s), nan=np.inf)
    arrived = int(np.count_nonzero((arr > mid) & (arr <= t1)))
    departed = int(np.count_nonzero((gone > mid) & (gone <= t1)))
    return arrived / max(1, departed)


def _arrival_rate(st: EngineState) -> float:
    """Requests per second from the first to the last arrival (NaN when they coincide): the offered
    rate, not Little's ``lambda`` (that is ``request_throughput_per_s``, over the whole run)."""
    t0 = t0_of(st)
    return float(st.status.size) / (st.last_arrival_s - t0) if st.last_arrival_s > t0 else float("nan")


def t0_of(st: EngineState) -> float:
    """First arrival time of the run (0 when no request arrived), seconds."""
    return float(np.nanmin(st.arrival_at_s)) if np.isfinite(st.arrival_at_s).any() else 0.0


def _round_metrics(st: EngineState, t0: float, makespan: float) -> dict[str, Any]:
    """Throughput over the steady window, verify/accept counts, memory and depth over time."""
    r = st.rounds
    end_round = r["start_s"] + r["duration_s"]
    window_end = st.last_arrival_s if (st.last_arrival_s - t0) >= 0.5 * makespan else st.end_s
    in_window = (end_round > t0) & (end_round <= window_end + 1e-12)
    window_len = max(window_end - t0, 1e-12)
    dec_rounds = float(r["num_decode"].sum())
    verified = float(r["verify_tokens"].sum())
    accepted = float(r["accepted_tokens"].sum())
    total_time = float(r["duration_s"].sum())
    in_system = r["num_waiting"] + r["num_running"] + r["num_remote_prefill"]
    theta, theta_g = r["theta"], r["theta_global"]
    has_theta = np.isfinite(theta) & np.isfinite(theta_g)
    gap = has_theta & (theta_g > theta * (1 + 1e-9))
    w = r["duration_s"]
    return {
        "steady_window_s": window_len,
        "throughput_tok_per_s": float(r["emitted_tokens"][in_window].sum()) / window_len,
        "num_rounds": int(r["start_s"].size),
        "mean_decode_batch": dec_rounds / max(1, int((r["num_decode"] > 0).sum())),
        "mean_batch_tokens": _mean(r["batch_tokens"]),
        "mean_verify_len": verified / dec_rounds if dec_rounds else float("nan"),
        "tau": (accepted + dec_rounds) / dec_rounds if dec_rounds else float("nan"),
        "acceptance_rate": accepted / verified if verified else float("nan"),
        "verified_draft_tokens": int(verified),
        "accepted_draft_tokens": int(accepted),
        "wasted_verify_tokens": int(verified - accepted),
        "wasted_verify_frac": (verified - accepted) / max(1.0, float(r["batch_tokens"].sum())),
        "draft_time_frac": float(r["draft_s"].sum()) / total_time if total_time else 0.0,
        "busy_frac": total_time / makespan,
        "kv_capacity_blocks": int(st.kv_capacity_blocks),
        "kv_peak_frac": float(r["kv_blocks_peak"].max()) / st.kv_capacity_blocks if r["start_s"].size else 0.0,
        "mean_depth": _time_avg(r["depth"], w),
        "num_depth_changes": int(st.num_depth_changes),
        "mean_heads_gib": _time_avg(r["heads_gib"], w),
        "mean_kv_gib": _time_avg(r["kv_gib"], w),
        "peak_kv_gib": float(r["kv_gib"].max()) if r["kv_gib"].size else 0.0,
        "mean_free_gib": _time_avg(r["free_gib"], w),
        "mean_coherence": _time_avg(r["coherence"], w),
        "head_load_s_total": float(r["head_load_s"].sum()),
        "mean_waiting": _time_avg(r["num_waiting"], w),
        "num_draft_trims": int(r["num_trimmed"].sum()),
        "early_stop_gap_frac": float(gap.sum() / has_theta.sum()) if has_theta.any() else float("nan"),
        "mean_in_system_sampled": float((in_system * w).sum()) / makespan,
        "extrapolated_cost_frac": _mean(r["cost_extrapolated"]),
        "mean_kv_read_tokens": _time_avg(r["kv_read_tokens"], w),
        "overhead_time_frac": float(r["overhead_s"].sum()) / total_time if total_time else 0.0,
    }


def _position_metrics(a: np.ndarray, y: np.ndarray, *, several: bool, auc: bool) -> tuple[float, float, float]:
    """ECE (15 bins), AUC (NaN without ``auc``) and Brier score of one position's joint survivals
    ``a`` ``(n,)`` against its outcomes ``y`` ``(n,)`` bool: bit for bit what
    :func:`~memtp_sim.confidence.per_position_metrics` gives for the last of ``k`` positions
    (``several``: k > 1). Its bins and ranks are row by row, and numpy sums the Brier score's
    squared errors in row order over several columns (pairwise over one).

    Source:
        Guo et al. (2017, ICML) section 2 (binned ECE); DSpark paper section 3.2 (joint survival).
    """
    a_row, y_row = a[None, :], y[None, :]
    sq = (a - y) ** 2
    brier = np.cumsum(sq)[-1] / a.size if several else np.mean(sq[:, None], axis=0)[0]
    return (_ece_rows(a_row, y_row, 15)[0], _auc_rows(a_row, y_row)[0] if auc else np.float64(np.nan), brier)


def _calibration_metrics(st: EngineState) -> dict[str, Any]:
    """ECE / AUC / Brier of the cumulative confidence per position, raw head vs what the policy saw.

    Outcomes are the simulated acceptance of every drafted position (the simulator knows them even
    where a position was not verified); only the first ``Engine.DIAG_ROUNDS`` request-rounds are used.
    """
    raw, used, ok, width = st.confidence_raw, st.confidence_used, st.confidence_outcome, st.confidence_width
    nan = {"ece_raw_mean": float("nan"), "ece_mean": float("nan"), "auc_mean": float("nan")}
    if raw.size == 0 or raw.shape[0] < 50:
        return nan
    ece_raw, ece, auc, brier_raw, brier, counts = [], [], [], [], [], []
    curves = {}
    full = bool((width == raw.shape[1]).all())
    if full:  # every round drafted every position: one pass over all positions
        # the raw head's AUC is not reported (only its ECE and Brier score): not computed
        (m_raw_all, curves_raw), (m_used_all, curves_used) = (survival_calibration(raw, ok, auc=False),
                                                              survival_calibration(used, ok))
        curves_all = {"raw": curves_raw, "used": curves_used}
    else:
        cum_raw, cum_used = np.cumprod(raw, axis=1), np.cumprod(used, axis=1)
    n = raw.shape[0]
    for k in range(1, raw.shape[1] + 1):
        rows = None if full else width >= k  # rounds that drafted position k (elastic depth varies)
        num_rows = n if full else int(rows.sum())
        if num_rows < 50:
            break
        if full:
            m_raw = (m_raw_all.ece[k - 1], m_raw_all.auc[k - 1], m_raw_all.brier[k - 1])
            m_used = (m_used_all.ece[k - 1], m_used_all.auc[k - 1], m_used_all.brier[k - 1])
        else:  # position k alone (per_position_metrics of the first k would score all k of them)
            y = ok[rows, k - 1]
            m_raw = _position_metrics(cum_raw[rows, k - 1], y, several=k > 1, auc=False)
            m_used = _position_metrics(cum_used[rows, k - 1], y, several=k > 1, auc=True)
        ece_raw.append(m_raw[0])
        ece.append(m_used[0])
        auc.append(m_used[1])
        brier_raw.append(m_raw[2])
        brier.append(m_used[2])
        counts.append(num_rows)
        for name in ("raw", "used"):
            if full:
                rc = curves_all[name][k - 1]
            else:
                # = prod(conf[rows, :k]): the same left-to-right products
                a_k = (cum_raw if name == "raw" else cum_used)[rows, k - 1]
                rc = reliability_curve(a_k, ok[rows, k - 1], n_bins=10)
            curves[f"{name}_{k}"] = {"mean_prob": np.round(rc.mean_prob, 4).tolist(),
                                     "frac_positive": np.round(rc.frac_positive, 4).tolist(),
                                     "counts": rc.counts.tolist()}
    if not ece:
        return nan

    def nanmean(v: list[float]) -> float:  # AUC is NaN where every draft was accepted (or rejected)
        a = np.asarray(v, dtype=np.float64)
        return float(a[np.isfinite(a)].mean()) if np.isfinite(a).any() else float("nan")

    return {
        "ece_raw_mean": nanmean(ece_raw),
        "ece_mean": nanmean(ece),
        "auc_mean": nanmean(auc),
        "calibration_by_position": {
            "num_request_rounds": counts,
            "ece_raw": np.round(ece_raw, 5).tolist(),
            "ece": np.round(ece, 5).tolist(),
            "auc": np.round(auc, 5).tolist(),
            "brier_raw": np.round(brier_raw, 5).tolist(),
            "brier": np.round(brier, 5).tolist(),
            "reliability": curves,
        },
    }


@dataclass(frozen=True)
class RunResult:
    """Everything one run produced.

    Attributes:
        scenario: the validated scenario, as a plain dict.
        seed: the run's seed.
        metrics: :func:`compute_metrics` output (units in names).
        state: raw engine arrays (per request and per round).
        provenance: what the run was computed from: hardware and acceptance profile summaries with
            their sources, and the confidence settings with the temperatures applied.
        notes: human-readable remarks (e.g. extrapolation, rejections).
        version: memtp_sim version that produced it.
        wall_s: wall-clock seconds the simulation took.
    """

    scenario: dict[str, Any]
    seed: int
    metrics: dict[str, Any]
    state: EngineState
    provenance: dict[str, Any]
    policy_label: str
    version: str
    wall_s: float
    notes: list[str] = field(default_factory=list)

    def requests_frame(self) -> pd.DataFrame:
        """Per-request table (one row per request)."""
        import pandas as pd  # lazy: pandas costs a third of `import memtp_sim`
        s = self.state
        with np.errstate(divide="ignore", invalid="ignore"):
            dec_s = s.finished_at_s - s.first_token_at_s
            tps = np.where((s.output_tokens >= 2) & (dec_s > 0), (s.output_tokens - 1) / dec_s, np.nan)
        status = np.array(["pending", "waiting", "running", "finished", "rejected"])[s.status]
        return pd.DataFrame({
            "request_id": np.arange(s.status.size),
            "status": status,
            "reject_reason": s.reject_reason.astype(str),
            "domain": s.domain,
            "prompt_tokens": s.prompt_tokens,
            "output_tokens": s.output_tokens,
            "generated_tokens": s.generated_tokens,
            "arrival_at_s": s.arrival_at_s,
            "ready_at_s": s.ready_at_s,
            "admitted_at_s": s.admitted_at_s,
            "queue_s": s.admitted_at_s - s.ready_at_s,
            "first_token_at_s": s.first_token_at_s,
            "finished_at_s": s.finished_at_s,
            "ttft_s": s.first_token_at_s - s.arrival_at_s,
            "e2e_s": s.finished_at_s - s.arrival_at_s,
            "tok_per_s_user": tps,
            "num_decode_rounds": s.num_rounds,
            "draft_tokens_verified": s.draft_tokens_verified,
            "draft_tokens_accepted": s.draft_tokens_accepted,
            "num_preemptions": s.num_preemptions,
            "difficulty": s.difficulty,
        })

    def rounds_frame(self) -> pd.DataFrame:
        """Per-round table (one row per engine round)."""
        import pandas as pd  # lazy: pandas costs a third of `import memtp_sim`
        return pd.DataFrame(self.state.rounds)

    def files(self) -> dict[str, bytes]:
        """The run's result files as bytes: ``requests.csv`` (:meth:`requests_frame`, no index)
        and ``rounds.parquet`` (the round log's columns, the table :meth:`rounds_frame` reads back),
        the files a study's and the dashboard's run folders hold."""
        import io

        import pyarrow as pa  # lazy, as pandas above
        import pyarrow.parquet as pq
        buf_csv, buf_parquet = io.StringIO(), io.BytesIO()
        self.requests_frame().to_csv(buf_csv, index=False)
        # straight from the round log's arrays (through pandas, the conversion cost more than the
        # write), NaN stored as null as pandas' to_parquet stores it (theta where nothing was planned)
        pq.write_table(pa.table({name: pa.array(col, from_pandas=True) for name, col in self.state.rounds.items()}),
                       buf_parquet)
        return {"requests.csv": buf_csv.getvalue().encode(), "rounds.parquet": buf_parquet.getvalue()}

    def summary(self) -> dict[str, Any]:
        """JSON-ready summary: config, seed, version, provenance (profiles and their sources), metrics, notes."""
        return {
            "memtp_sim_version": self.version,
            "seed": self.seed,
            "policy": self.policy_label,
            "scenario": self.scenario,
            "provenance": self.provenance,
            "metrics": self.metrics,
            "notes": self.notes,
            "wall_s": self.wall_s,
        }

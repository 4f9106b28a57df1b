"""The study report's numbers: every aggregation behind its tables, notes and figures.

Each function takes a :class:`~memtp_sim.report.StudyResults` (or a slice of its ``table``) and
returns pandas DataFrames, NamedTuples of numbers, or plain-words notes built from them. Nothing
here draws: :mod:`memtp_sim.report.figures` turns these frames into Plotly figures, so a report and
a dashboard can share the numbers and tests can check them by hand.

Conventions: a metric ``m`` averaged over seeds appears as ``m_mean`` (arithmetic mean), ``m_sd``
(sample standard deviation, ddof=1; 0 for one seed) and ``num_seeds``; groups keep the order the
study lists them in (its YAML order), not sorted.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from ..hardware.fidelity import find_cliffs
from ..metrics import EXTRAPOLATED_WARN_FRAC, OVERLOAD_MIN_ARRIVALS, is_overloaded
from ._results import StudyResults, load_phases

__all__ = [
    "HEADLINE",
    "MEMORY_HEADLINE",
    "TIMELINE_COLUMNS",
    "DsparkGaps",
    "LatencySamples",
    "Reliability",
    "SpsCurve",
    "TERMINAL_HEADLINE",
    "TerminalTable",
    "Timeline",
    "aggregate",
    "extrapolation_notes",
    "overload_notes",
    "calibration_table",
    "cliff_notes",
    "cliffs",
    "dspark_gaps",
    "dspark_losses",
    "facets",
    "frontier_points",
    "headline_table",
    "is_numeric",
    "latency_samples",
    "load_curves",
    "phase_notes",
    "phase_table",
    "rejection_notes",
    "rejections",
    "reliability_curves",
    "short_policy_labels",
    "sps_curve",
    "terminal_table",
    "time_weighted_bins",
    "timeline",
    "winners",
    "winners_notes",
]

HEADLINE = [
    ("throughput_tok_per_s", "throughput tok/s"),
    ("tok_per_s_user_p50", "tok/s/user p50"),
    ("tok_per_s_user_p10", "tok/s/user p10"),
    ("ttft_s_p50", "TTFT p50 s"),
    ("tpot_ms_p50", "TPOT p50 ms"),
    ("mean_verify_len", "verify len"),
    ("tau", "tau"),
    ("acceptance_rate", "accept rate"),
    ("num_rejected", "rejected"),
]
MEMORY_HEADLINE = [
    ("queue_s_p90", "queue p90 s"),
    ("mean_depth", "mean depth"),
    ("mean_heads_gib", "heads GiB"),
    ("mean_kv_gib", "KV GiB mean"),
    ("peak_kv_gib", "KV GiB peak"),
]
# the MEMTP timeline's per-round columns (rounds.parquet), in panel order
TIMELINE_COLUMNS = ("depth", "free_gib", "kv_gib", "coherence", "num_waiting")
_DSPARK = "dspark"
_STATIC = ("static", "mtp1")
_CONFIDENCE_POLICIES = ("dspark", "threshold", "goodput")  # policies that rank draft confidences


def is_numeric(col: pd.Series) -> bool:
    """True when every value of ``col`` reads as a number (the axis is then numeric, else categorical).

    Args:
        col: one column of a runs table (any dtype).

    Returns:
        True when ``pandas.to_numeric(col, errors="coerce")`` has no NaN (an empty column is
        numeric).
    """
    return bool(pd.to_numeric(col, errors="coerce").notna().all())


def _as_tuple(key: Any) -> tuple:
    return key if isinstance(key, tuple) else (key,)


def _where(keys: list[str], values: tuple) -> str:
    return ", ".join(f"{k} = {v}" for k, v in zip(keys, values))


def _ratio(num: Any, den: Any) -> float:
    """``num / den``, or NaN when either is not a finite number or ``den`` is not above 0: every
    ratio this module states goes through here, so none divides by zero or reads ``nan%``."""
    try:
        n, d = float(num), float(den)
    except (TypeError, ValueError):
        return float("nan")
    if not (np.isfinite(n) and np.isfinite(d)) or d <= 0:
        return float("nan")
    return n / d


def _join(items: list[Any]) -> str:
    """``a``, ``a and b``, ``a, b and c`` (never ``a-b``, which reads like one name)."""
    words = [str(i) for i in items]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _span_label(x: str | None, xs: list[Any], numeric: bool) -> str:
    """A span of the sweep axis in words: ``x 1-8`` for a run of ascending numbers, else every
    value listed (``variant ewma and tower``)."""
    if not x:
        return ""
    if len(xs) == 1:
        return f"{x} {xs[0]}"
    if numeric and list(xs) == sorted(xs):
        return f"{x} {xs[0]}-{xs[-1]}"
    return f"{x} {_join(xs)}"


def _completed(frame: pd.DataFrame) -> np.ndarray:
    """Per row, whether it completed any request (``num_completed_mean`` or ``num_completed`` above
    0); every row counts as completed when the frame has neither column (older results)."""
    for col in ("num_completed_mean", "num_completed"):
        if col in frame:
            return pd.to_numeric(frame[col], errors="coerce").to_numpy(dtype=float) > 0
    return np.ones(len(frame), dtype=bool)


def _with_completed(table: pd.DataFrame, metrics: list[str]) -> list[str]:
    """``metrics`` plus ``num_completed`` when the runs table records it."""
    return metrics + (["num_completed"] if "num_completed" in table and "num_completed" not in metrics else [])


def aggregate(table: pd.DataFrame, keys: list[str], metrics: list[str]) -> pd.DataFrame:
    """Mean, standard deviation and count over seeds for each combination of ``keys``.

    Args:
        table: one row per run (runs.csv), with columns ``keys`` and ``metrics``.
        keys: the grouping columns (e.g. sweep keys and ``policy``); NaN is a group of its own.
        metrics: numeric columns to average.

    Returns:
        One row per group, in the order the table first lists each group (its YAML order), not
        sorted: ``keys``, ``<metric>_mean`` for each metric, ``<metric>_sd`` (ddof=1; 0 for a
        single run), ``num_seeds`` (runs in the group). Units are those of each metric.

    Raises:
        KeyError: a key or metric column is missing.

    Source:
        Arithmetic mean and sample standard deviation (Bessel's correction, ddof=1) via pandas
        ``GroupBy.mean`` / ``GroupBy.std``.
    """
    g = table.groupby(keys, dropna=False, sort=False)[metrics]
    mean = g.mean().add_suffix("_mean")
    sd = g.std(ddof=1).fillna(0.0).add_suffix("_sd")
    out = pd.concat([mean, sd], axis=1)
    out["num_seeds"] = g.size()
    return out.reset_index()


def facets(res: StudyResults) -> list[tuple[str, pd.DataFrame]]:
    """The study's runs split by the sweep keys other than the x axis (one set of figures each).

    Args:
        res: the study (its ``facet_keys`` split ``res.grouped_table``).

    Returns:
        ``(title, rows)`` pairs in study order; the title reads ``"key = value, ..."`` (``""`` and
        the whole table when there is nothing to split by).
    """
    keys = res.facet_keys
    if not keys:
        return [("", res.grouped_table)]
    return [(_where(keys, _as_tuple(vals)), sub)
            for vals, sub in res.grouped_table.groupby(keys, dropna=False, sort=False)]


def headline_table(res: StudyResults) -> pd.DataFrame:
    """Headline metrics, mean over seeds, per facet / load point / policy.

    Args:
        res: the study; runs.csv needs the metrics of :data:`HEADLINE` (and of
            :data:`MEMORY_HEADLINE` when a run drives the MEMTP ensemble).

    Returns:
        Columns: the facet keys, the x key, ``policy``, then the labels of :data:`HEADLINE`
        (``throughput tok/s``, ``tok/s/user p50``, ``tok/s/user p10``, ``TTFT p50 s``,
        ``TPOT p50 ms``, ``verify len``, ``tau``, ``accept rate``, ``rejected``) and, when the study
        runs the MEMTP ensemble, those of :data:`MEMORY_HEADLINE` (``queue p90 s``,
        ``mean depth``, ``heads GiB``, ``KV GiB mean``, ``KV GiB peak``), plus ``offered/served``
        when runs report an ``offered_load_ratio``.

    Raises:
        KeyError: runs.csv lacks a headline metric.

    Source:
        Each metric is defined once in :mod:`memtp_sim.metrics` (its module docstring gives the
        formulas); :func:`aggregate` averages them over seeds.
    """
    keys = res.facet_keys + ([res.x_key] if res.x_key else []) + ["policy"]
    cols_spec = HEADLINE + (MEMORY_HEADLINE if res.uses_memtp else [])
    if "offered_load_ratio" in res.table and res.table["offered_load_ratio"].notna().any():
        cols_spec = cols_spec + [("offered_load_ratio", "offered/served")]
    agg = aggregate(res.table, keys, [m for m, _ in cols_spec])
    cols = keys + [f"{m}_mean" for m, _ in cols_spec]
    return agg[cols].rename(columns={f"{m}_mean": label for m, label in cols_spec})


#: The terminal summary's columns (the rest are in runs.csv and the report's table).
TERMINAL_HEADLINE = [
    ("throughput_tok_per_s", "total tok/s"),
    ("tok_per_s_user_p50", "user tok/s p50"),
    ("ttft_s_p50", "TTFT p50 s"),
    ("tpot_ms_p50", "TPOT p50 ms"),
    ("tau", "tau"),
    ("num_rejected", "rejected"),
]
_TERMINAL_MEMORY = [("mean_depth", "mean depth"), ("queue_s_p90", "queue p90 s")]


class TerminalTable(NamedTuple):
    """The terminal summary of a study (see :func:`terminal_table`).

    Attributes:
        table: one row per facet / load point / policy (mean over seeds), short policy labels.
        legend: one line per shortened label, ``"dspark = dspark(gamma=7, early_stop=False, ...)"``.
    """

    table: pd.DataFrame
    legend: list[str]


def short_policy_labels(policies: list[str], *, max_len: int = 16) -> dict[str, str]:
    """A short label per policy: the label itself when it has at most ``max_len`` characters
    (``static(k=5)``), else its name without parameters (``dspark`` for ``dspark(gamma=7, ...)``),
    numbered (``dspark#1``, ``dspark#2``) where two would read the same.

    Args:
        policies: full policy labels in study order.
        max_len: labels up to this length are kept whole.

    Returns:
        ``full label -> short label``; the short labels are unique (a label that cannot be
        shortened uniquely is kept whole).
    """
    short = {p: str(p) if len(str(p)) <= max_len else (str(p).split("(", 1)[0].strip() or str(p))
             for p in policies}
    values = list(short.values())
    seen: dict[str, int] = {}
    for p in policies:
        s = short[p]
        if values.count(s) > 1 and s != p:
            seen[s] = seen.get(s, 0) + 1
            short[p] = f"{s}#{seen[s]}"
    taken: set[str] = set()
    for p in policies:  # a numbered or cut label that equals another policy's label: keep it whole
        if short[p] in taken or (short[p] != p and short[p] in short):
            short[p] = str(p)
        taken.add(short[p])
    return short


def terminal_table(res: StudyResults) -> TerminalTable:
    """The headline results narrowed for a terminal of 100-120 columns: short policy labels (with a
    legend) and the metrics of :data:`TERMINAL_HEADLINE` (plus mean depth and queue p90 when the
    study runs the MEMTP ensemble); everything else stays in runs.csv and the report's table.

    Args:
        res: the study (runs.csv columns of :data:`TERMINAL_HEADLINE`).

    Returns:
        ``table``: columns the facet keys and the x key (by their last dotted part, e.g.
        ``concurrency``, where that stays unique), ``policy`` (short label), then the labels of
        :data:`TERMINAL_HEADLINE` (``total tok/s`` = throughput, ``user tok/s p50``,
        ``TTFT p50 s``, ``TPOT p50 ms``, ``tau``, ``rejected``) and, with MEMTP, ``mean depth`` and
        ``queue p90 s``; means over seeds. ``legend``: ``"short = full"`` for each policy label and
        key shortened.

    Raises:
        KeyError: runs.csv lacks a metric of :data:`TERMINAL_HEADLINE`.

    Source:
        :func:`aggregate`; labels from :func:`short_policy_labels`.
    """
    keys = res.facet_keys + ([res.x_key] if res.x_key else []) + ["policy"]
    spec = TERMINAL_HEADLINE + (_TERMINAL_MEMORY if res.uses_memtp else [])
    missing = [m for m, _ in spec if m not in res.table]
    if missing:
        raise KeyError(f"runs.csv lacks {', '.join(missing)}")
    agg = aggregate(res.table, keys, [m for m, _ in spec])
    table = agg[keys + [f"{m}_mean" for m, _ in spec]].rename(columns={f"{m}_mean": lab for m, lab in spec})
    rej = pd.to_numeric(table["rejected"], errors="coerce").to_numpy(dtype=float)
    if np.isfinite(rej).all() and (rej == np.round(rej)).all():
        table["rejected"] = rej.astype(np.int64)  # a count: no decimals unless seeds differ
    short = short_policy_labels(res.policies)
    table["policy"] = table["policy"].map(lambda p: short.get(p, p))
    legend = [f"{s} = {p}" for p, s in short.items() if s != p]
    # sweep keys by their last part (workload.concurrency -> concurrency) where that stays unique
    tails = {k: k.rsplit(".", 1)[-1] for k in keys[:-1]}
    if len(set(tails.values())) == len(tails) and not set(tails.values()) & (set(table.columns) - set(tails)):
        table = table.rename(columns=tails)
        legend += [f"{t} = {k}" for k, t in tails.items() if t != k]
    return TerminalTable(table, legend)


def overload_notes(res: StudyResults) -> list[str]:
    """One line per (facet, load point, policy) whose offered load exceeds capacity.

    A point is flagged when its mean ``offered_load_ratio`` (arrivals / completions while load is
    offered, :func:`memtp_sim.metrics._offered_load_ratio`) exceeds
    :data:`memtp_sim.metrics.OVERLOAD_RATIO` on a mean of at least
    :data:`memtp_sim.metrics.OVERLOAD_MIN_ARRIVALS` arrivals (:func:`memtp_sim.metrics.is_overloaded`;
    fewer are too few to tell): the queue grows without bound there, so its TTFT and queueing
    figures measure the backlog, not the system.

    Args:
        res: the study (runs.csv columns ``offered_load_ratio``, ``num_requests``; ``ttft_s_p50`` in s).

    Returns:
        Plain-text lines (empty when no point is overloaded or every run is a closed loop).

    Source:
        The stability condition of a queue (arrivals must not outpace service, utilisation < 1);
        threshold and ratio as defined in :mod:`memtp_sim.metrics` (``OVERLOAD_RATIO``).
    """
    if "offered_load_ratio" not in res.table or not res.table["offered_load_ratio"].notna().any():
        return []
    keys = res.facet_keys + ([res.x_key] if res.x_key else []) + ["policy"]
    arrived = "num_requests" if "num_requests" in res.table else None
    agg = aggregate(res.table, keys, ["offered_load_ratio", "ttft_s_p50"] + ([arrived] if arrived else []))
    n = agg[f"{arrived}_mean"] if arrived else pd.Series(OVERLOAD_MIN_ARRIVALS, index=agg.index)
    over = [is_overloaded(r, a) for r, a in zip(agg["offered_load_ratio_mean"], n)]
    out = []
    for _, row in agg[over].iterrows():
        where = ", ".join(f"{k} = {row[k]}" for k in keys if pd.notna(row[k]))  # a key the runs lack: left out
        ttft = row["ttft_s_p50_mean"]
        out.append(f"{where}: offered load above capacity ({row['offered_load_ratio_mean']:.2f} arrivals per "
                   f"completion while load was offered): the queue grows without bound, so TTFT "
                   + (f"(p50 {ttft:.1f} s) " if np.isfinite(ttft) else "") + "measures the backlog")
    return out


def extrapolation_notes(res: StudyResults) -> list[str]:
    """One line per (facet, load point, policy) whose passes were often priced outside the measured B range.

    A point is flagged when its mean ``extrapolated_cost_frac`` (fraction of rounds whose pass was
    priced by the profile's below_min / beyond_max rule) exceeds
    :data:`memtp_sim.metrics.EXTRAPOLATED_WARN_FRAC`: those timings come from the rule, not from
    measurements. The line names the measured B range of the run's profile.

    Args:
        res: the study (runs.csv column ``extrapolated_cost_frac``; each run's summary for the
            profile's measured ``batch_tokens``).

    Returns:
        Plain-text lines (empty when no point passes the threshold).

    Source:
        The profile's lookup rules (:mod:`memtp_sim.hardware.cost`); threshold in :mod:`memtp_sim.metrics`.
    """
    if "extrapolated_cost_frac" not in res.table or not res.table["extrapolated_cost_frac"].notna().any():
        return []
    keys = res.facet_keys + ([res.x_key] if res.x_key else []) + ["policy"]
    table = res.table.copy()  # the profile may be swept: each run names its own measured range
    table["_measured"] = [_measured_range(res.summaries.get(str(r), {})) for r in table["run_id"]]
    agg = aggregate(table, keys + ["_measured"], ["extrapolated_cost_frac"])
    out = []
    for _, row in agg[agg["extrapolated_cost_frac_mean"] > EXTRAPOLATED_WARN_FRAC].iterrows():
        where = ", ".join(f"{k} = {row[k]}" for k in keys if pd.notna(row[k]))  # a key the runs lack: left out
        rng = row["_measured"]
        out.append(f"{where}: {row['extrapolated_cost_frac_mean']:.0%} of passes priced outside the measured B range"
                   + (f" ({rng})" if rng else "") + " by the profile's extrapolation rule, not by measurements "
                   "(extrapolated_cost_frac in runs.csv)")
    return out


def _measured_range(summary: dict[str, Any]) -> str:
    """``"measured B 64..512, below that flat, beyond that roofline"`` from a run summary's profile
    ('' when absent): both rules, since passes outside the range may lie on either side."""
    sps = ((summary.get("provenance") or {}).get("hardware") or {}).get("sps") or {}
    b = sps.get("batch_tokens") or []
    if not b:
        return ""
    below = f", below that {sps.get('below_min', 'extrapolated')}" if min(b) > 1 else ""
    return f"measured B {min(b)}..{max(b)}{below}, beyond that {sps.get('beyond_max', 'extrapolated')}"


# ---------------------------------------------------------------------------------------------
# who wins where


def _rank_point(pt: pd.DataFrame, metric: str) -> tuple[str, str, float, tuple[str, ...]]:
    """``(leader, runner_up, lead, left_out)`` at one point of the sweep axis.

    Only policies with a finite value that completed at least one request are ranked; the others
    are ``left_out`` (``"<policy> completed no request"`` / ``"<policy> has no value"``). ``lead``
    is NaN when there is no runner-up or the runner-up measured 0 (no percentage is meaningful)."""
    col = f"{metric}_mean"
    vals = pd.to_numeric(pt[col], errors="coerce").to_numpy(dtype=float)
    done = _completed(pt)
    ok = np.isfinite(vals) & done
    left_out = tuple(f"{p} {'completed no request' if not d else 'has no value'}"
                     for p, d, k in zip(pt["policy"], done, ok) if not k)
    ranked = pt[ok].sort_values(col, ascending=False, kind="stable")
    if ranked.empty:
        return "", "", float("nan"), left_out
    best = ranked.iloc[0]
    if len(ranked) == 1:
        return str(best["policy"]), "", float("nan"), left_out
    second = ranked.iloc[1]
    return str(best["policy"]), str(second["policy"]), _ratio(best[col], second[col]) - 1, left_out


def _winner_spans(points: list[tuple[Any, pd.DataFrame]], metric: str) -> list[dict[str, Any]]:
    """Neighbouring points with the same verdict (leader, presence of a rival, whether a lead can be
    stated, policies left out) merged."""
    spans: list[dict[str, Any]] = []
    for xv, pt in points:
        policy, runner_up, lead, left_out = _rank_point(pt, metric)
        kind = (policy, bool(runner_up), bool(np.isfinite(lead)), left_out)
        last = spans[-1] if spans else None
        if last is not None and last["kind"] == kind:
            last["xs"].append(xv)
            if np.isfinite(lead) and lead > last["lead"]:
                last.update(lead=lead, runner_up=runner_up)
        else:
            spans.append({"kind": kind, "xs": [xv], "policy": policy, "lead": lead, "runner_up": runner_up,
                          "left_out": list(left_out)})
    for span in spans:
        del span["kind"]
    return spans


def winners(res: StudyResults) -> pd.DataFrame:
    """Per facet and metric, which policy leads at each point of the sweep axis (mean over seeds),
    with neighbouring points that share a verdict merged into one span.

    Metrics: ``throughput_tok_per_s`` (tok/s) and ``tok_per_s_user_p50`` (tok/s per user, median).
    A policy is ranked at a point only where its mean is a finite number and (when runs.csv has
    ``num_completed``) it completed at least one request: a run whose every request was rejected
    measures nothing, so it neither wins nor loses.

    Args:
        res: the study (runs.csv columns ``throughput_tok_per_s``, ``tok_per_s_user_p50``, and
            ``num_completed`` when recorded).

    Returns:
        One row per span, in study order: ``facet`` (``"key = value, ..."``, ``""`` without facets),
        ``metric``, ``xs`` (list of x values in the span; ``["all"]`` without an x axis),
        ``policy`` (the leader; ``""`` where no policy could be ranked), ``lead`` (largest fraction
        by which the leader beats the runner-up within the span, e.g. 0.08 = 8%; NaN where only one
        policy could be ranked or the runner-up measured 0), ``runner_up`` (the policy second at
        that point; ``""`` where none), ``left_out`` (list of ``"<policy> completed no request"`` /
        ``"<policy> has no value"`` for the policies not ranked).

    Raises:
        KeyError: runs.csv lacks one of the metrics.

    Source:
        Means over seeds from :func:`aggregate`; metric definitions in :mod:`memtp_sim.metrics`.
    """
    x = res.x_key
    keys = res.facet_keys + ([x] if x else []) + ["policy"]
    agg = aggregate(res.grouped_table, keys, _with_completed(res.table, ["throughput_tok_per_s", "tok_per_s_user_p50"]))
    groups = agg.groupby(res.facet_keys, dropna=False, sort=False) if res.facet_keys else [((), agg)]
    rows = []
    for facet, sub in groups:
        where = _where(res.facet_keys, _as_tuple(facet))
        points = list(sub.groupby(x, sort=False, dropna=False)) if x else [("all", sub)]
        for metric in ("throughput_tok_per_s", "tok_per_s_user_p50"):
            for span in _winner_spans(points, metric):
                rows.append({"facet": where, "metric": metric, **span})
    return pd.DataFrame(rows, columns=["facet", "metric", "xs", "policy", "lead", "runner_up", "left_out"])


def _verdict(r: pd.Series, tie: float) -> str:
    """One span of :func:`winners` in words; never a percentage from NaN or a zero denominator."""
    left = list(r["left_out"])
    if not r["policy"]:
        return "no winner: " + _join(left) if left else "no winner: nothing to rank"
    if not r["runner_up"]:
        verdict = f"only {r['policy']} can be ranked" if left else f"only {r['policy']} was run"
    elif not np.isfinite(r["lead"]):
        verdict = f"{r['policy']}, ahead of {r['runner_up']}, which measured 0 (no percentage to state)"
    elif r["lead"] < tie:
        verdict = f"near tie, {r['policy']} and {r['runner_up']} within {tie:.0%}"
    else:
        verdict = f"{r['policy']}, up to {r['lead']:.0%} ahead of {r['runner_up']}"
    return verdict + (f" (not ranked: {_join(left)})" if left else "")


def winners_notes(res: StudyResults, *, tie: float = 0.01) -> list[str]:
    """In plain words, per facet: which policy gives the highest throughput and which the highest
    median per-user speed along the sweep axis (from :func:`winners`).

    Args:
        res: the study.
        tie: a lead under this fraction (default 0.01 = 1%) is called a near tie.

    Returns:
        One sentence per facet and metric, e.g. ``"highest throughput: workload.concurrency 1-8:
        dspark(...), up to 12% ahead of mtp1; ..."`` (a categorical axis lists its values:
        ``"variant ewma and tower"``). A study that ran a single policy gets one sentence saying so
        (there is no rival to rank it against), and a study in which no run completed a request
        one sentence saying that nothing can be ranked. Points where a policy completed nothing or
        has no value name it as not ranked instead of letting it win or lose.
    """
    if len(res.policies) == 1:
        return [(f"Only {res.policies[0]} was run in this study, so there is no rival policy to rank it "
                 "against; the figures below compare the sweep settings instead.")]
    if not _completed(res.table).any():
        return [(f"No policy is ranked: none of the study's {len(res.table)} runs completed a request (see "
                 "the rejected requests above), so there is no throughput or per-user speed to compare.")]
    x = res.x_key
    numeric = bool(x) and is_numeric(res.grouped_table[x])
    what = {"throughput_tok_per_s": "highest throughput", "tok_per_s_user_p50": "fastest per user (p50)"}
    w = winners(res)
    notes = []
    for (facet, metric), spans in w.groupby(["facet", "metric"], sort=False):
        parts = []
        for _, r in spans.iterrows():
            span = _span_label(x, r["xs"], numeric)
            verdict = _verdict(r, tie)
            parts.append(f"{span}: {verdict}" if span else verdict)
        notes.append(f"{facet + ': ' if facet else ''}{what[metric]}: " + "; ".join(parts) + ".")
    return notes


# ---------------------------------------------------------------------------------------------
# where DSpark loses to a static policy


class DsparkGaps(NamedTuple):
    """Load points where a DSpark policy trails the best static policy (see :func:`dspark_gaps`).

    Attributes:
        points: one row per loss; columns as listed in :func:`dspark_gaps` (throughputs in tok/s,
            ``*_frac`` fractions in [0, 1]).
        dspark_policies: DSpark policy labels the study ran (``dspark*``).
        static_policies: static baseline labels the study ran (``static*``, ``mtp1*``).
    """

    points: pd.DataFrame
    dspark_policies: list[str]
    static_policies: list[str]


_GAP_COLUMNS = ["facet", "x", "policy", "throughput_tok_per_s", "mean_verify_len", "draft_time_frac",
                "early_stop_gap_frac", "static_policy", "static_throughput_tok_per_s",
                "static_mean_verify_len", "static_draft_time_frac", "gap_frac", "noise_frac"]


def dspark_gaps(res: StudyResults, *, margin: float = 0.02) -> DsparkGaps:
    """Every point where a DSpark policy's throughput trails the best static policy (a policy whose
    label starts with ``static`` or ``mtp1``) by more than ``margin`` and by more than the seed spread.

    The gap is ``1 - dspark_mean / static_mean``; the spread is ``(dspark_sd + static_sd) /
    static_mean`` (throughput over seeds, tok/s). A point is listed when the gap exceeds both.
    Points without a measurement are not compared: a policy whose runs completed no request (every
    request rejected) or whose throughput is not a number, and a static baseline of 0 tok/s.

    Args:
        res: the study.
        margin: the smallest gap worth listing, as a fraction (default 0.02 = 2%).

    Returns:
        ``points``: one row per loss, sorted by facet and x: ``facet`` (``"key = value, ..."``),
        ``x`` (the point on the sweep axis; None without one), ``policy``,
        ``throughput_tok_per_s``, ``mean_verify_len``, ``draft_time_frac``, ``early_stop_gap_frac``
        (means over seeds), the same for the best static policy with a ``static_`` prefix
        (``static_policy`` its label), ``gap_frac`` and ``noise_frac``. ``dspark_policies`` and
        ``static_policies``: what the study ran of each kind; with either empty there is nothing to
        compare and ``points`` is empty.

    Raises:
        KeyError: runs.csv lacks ``throughput_tok_per_s``, ``early_stop_gap_frac``,
            ``mean_verify_len`` or ``draft_time_frac``.

    Source:
        The comparison rule (margin and seed spread) is this report's own; the policies are those
        of DSpark paper (Cheng et al. 2026) Algorithm 1 and section 5.2 against MTP-1 / static k.
    """
    ds_pol = [p for p in res.policies if p.startswith(_DSPARK)]
    st_pol = [p for p in res.policies if p.startswith(_STATIC)]
    empty = pd.DataFrame(columns=_GAP_COLUMNS)
    if not ds_pol or not st_pol:
        return DsparkGaps(empty, ds_pol, st_pol)
    x = res.x_key
    keys = res.facet_keys + ([x] if x else []) + ["policy"]
    m = ["throughput_tok_per_s", "early_stop_gap_frac", "mean_verify_len", "draft_time_frac"]
    agg = aggregate(res.grouped_table, keys, _with_completed(res.table, m))
    # only points that measured something compare: a finite throughput from runs that completed requests
    thr = pd.to_numeric(agg["throughput_tok_per_s_mean"], errors="coerce").to_numpy(dtype=float)
    agg = agg[np.isfinite(thr) & _completed(agg)]
    groups = agg.groupby(res.facet_keys, dropna=False) if res.facet_keys else [((), agg)]
    rows = []
    for facet, sub in groups:
        where = _where(res.facet_keys, _as_tuple(facet))
        for xv, pt in (sub.groupby(x) if x else [(None, sub)]):
            ds = pt[pt["policy"].str.startswith(_DSPARK)]
            st = pt[pt["policy"].str.startswith(_STATIC)]
            st = st[st["throughput_tok_per_s_mean"] > 0]  # a zero baseline gives no fraction to state
            if ds.empty or st.empty:
                continue
            best = st.loc[st["throughput_tok_per_s_mean"].idxmax()]
            for _, d in ds.iterrows():
                gap = 1 - _ratio(d["throughput_tok_per_s_mean"], best["throughput_tok_per_s_mean"])
                noise = _ratio(d["throughput_tok_per_s_sd"] + best["throughput_tok_per_s_sd"],
                               best["throughput_tok_per_s_mean"])
                if not np.isfinite(gap) or gap <= max(margin, noise if np.isfinite(noise) else 0.0):
                    continue
                rows.append({"facet": where, "x": xv, "policy": d["policy"],
                             **{c: d[f"{c}_mean"] for c in m}, "static_policy": best["policy"],
                             **{f"static_{c}": best[f"{c}_mean"] for c in m if c != "early_stop_gap_frac"},
                             "gap_frac": gap, "noise_frac": noise})
    return DsparkGaps(pd.DataFrame(rows, columns=_GAP_COLUMNS) if rows else empty, ds_pol, st_pol)


def _loss_reasons(p: pd.Series) -> list[str]:
    reasons = []
    trapped = p["early_stop_gap_frac"]
    if np.isfinite(trapped) and trapped > 0.05:
        reasons.append(
            f"in {trapped:.0%} of its rounds early stop halted although a global search over the "
            "same candidates expected a higher token rate further on: the next candidate would "
            "cross a jump in the measured SPS(B) (see the SPS figure), and Algorithm 1's lossless "
            "rule stops at the first non-improvement (the paper's section 5.2 caveat; the "
            "production variant's global search does not stop there)")
    if p["draft_time_frac"] - p["static_draft_time_frac"] > 0.05:
        reasons.append(
            f"drafting takes {p['draft_time_frac']:.0%} of its time against "
            f"{p['static_draft_time_frac']:.0%} for {p['static_policy']}: it drafts gamma tokens for "
            "every request every round, and on this chip a drafter pass over R x gamma tokens is "
            "a sizeable fraction of a verify pass")
    if not reasons:
        reasons.append("its objective looks one round ahead only; neither early stop nor drafting "
                       "time explains the gap here")
    return reasons


def dspark_losses(res: StudyResults, *, margin: float = 0.02) -> list[str]:
    """Plain-words notes for every point of :func:`dspark_gaps`, with the measured reasons: how often
    early stop halted below a better batch (``early_stop_gap_frac`` over 5%) and how much more of
    the time went to drafting than for the static policy (``draft_time_frac``, 5 points more).

    Args:
        res: the study.
        margin: the smallest gap worth listing, as a fraction (default 0.02 = 2%).

    Returns:
        One note per loss; empty when there is none, and also when the study ran no DSpark or no
        static policy (check :func:`dspark_gaps` to tell the two apart).

    Source:
        DSpark paper (Cheng et al. 2026) Algorithm 1: early stop halts at the first
        non-improvement, which finds the global optimum only when Theta is unimodal in B (section
        3.2); the production scheduler's global search (section 5.2) is not trapped by SPS cliffs.
    """
    x = res.x_key
    notes = []
    for _, p in dspark_gaps(res, margin=margin).points.iterrows():
        where = ", ".join(s for s in (p["facet"], f"{x} = {p['x']}" if x else "") if s)
        reasons = _loss_reasons(p)
        vl, st_vl = p["mean_verify_len"], p["static_mean_verify_len"]
        # a verify length that was not measured (NaN) is left out rather than printed as "nan"
        verify = (f"; mean verify length {vl:.2f} vs {st_vl:.2f}" if np.isfinite(vl) and np.isfinite(st_vl)
                  else "")
        notes.append(
            f"{where + ': ' if where else ''}{p['policy']} gives {p['throughput_tok_per_s']:.1f} tok/s vs "
            f"{p['static_policy']} {p['static_throughput_tok_per_s']:.1f} tok/s ({p['gap_frac']:.1%} lower"
            f"{verify}). "
            + " ".join(("Also, " + r if i else r[0].upper() + r[1:]) + "." for i, r in enumerate(reasons)))
    return notes


# ---------------------------------------------------------------------------------------------
# figures' data: frontier, load sweep, latency


def _sorted_per_policy(agg: pd.DataFrame, x: str | None) -> pd.DataFrame:
    """Policies in study order, each one's points sorted by ``x`` when ``x`` is numeric."""
    parts = [d.sort_values(x) if x and is_numeric(d[x]) else d for _, d in agg.groupby("policy", sort=False)]
    return pd.concat(parts, ignore_index=True) if parts else agg


def frontier_points(table: pd.DataFrame, x: str | None) -> pd.DataFrame:
    """Throughput vs per-user speed, one point per policy and setting of ``x`` (the paper's Fig. 7).

    Args:
        table: runs.csv rows (one facet of the study, or all of it).
        x: the sweep-axis column, or None (one point per policy).

    Returns:
        Columns ``x`` (when given), ``policy``, ``throughput_tok_per_s_mean``/``_sd`` (tok/s),
        ``tok_per_s_user_p50_mean``/``_sd`` (tok/s per user, median over requests), ``num_seeds``;
        policies in study order, each one's points sorted by ``x`` when numeric.

    Source:
        DSpark paper (Cheng et al. 2026) section 5.4: aggregate throughput against per-user speed
        (tok/s/user) under an SLA.
    """
    agg = aggregate(table, ([x] if x else []) + ["policy"], ["throughput_tok_per_s", "tok_per_s_user_p50"])
    return _sorted_per_policy(agg, x)


def load_curves(table: pd.DataFrame, x: str) -> pd.DataFrame:
    """Throughput, verify budget and per-user speed against the sweep axis (the paper's Fig. 8).

    Args:
        table: runs.csv rows (one facet of the study, or all of it).
        x: the sweep-axis column.

    Returns:
        Columns ``x``, ``policy``, ``<m>_mean`` and ``<m>_sd`` for ``throughput_tok_per_s`` (tok/s),
        ``mean_verify_len`` (draft tokens verified per request per round), ``tok_per_s_user_p50``
        (tok/s per user) and ``verify_budget`` (tokens per request per round including the bonus
        token: ``mean_verify_len + 1``), ``num_seeds``; ordered as :func:`frontier_points`.

    Source:
        DSpark paper (Cheng et al. 2026) Fig. 8: tokens verified per request (MTP-1: a static 2
        including the bonus) against concurrency.
    """
    agg = aggregate(table, [x, "policy"], ["throughput_tok_per_s", "mean_verify_len", "tok_per_s_user_p50"])
    agg["verify_budget_mean"] = agg["mean_verify_len_mean"] + 1.0
    agg["verify_budget_sd"] = agg["mean_verify_len_sd"]
    return _sorted_per_policy(agg, x)


class LatencySamples(NamedTuple):
    """Per-request latencies of the first seed's runs (see :func:`latency_samples`).

    Attributes:
        samples: one row per finished request: ``policy``, ``x_value``, ``ttft_s`` (s),
            ``tpot_ms`` (ms), ``e2e_s`` (s).
        seed: the seed the samples come from.
    """

    samples: pd.DataFrame
    seed: int


def latency_samples(res: StudyResults, table: pd.DataFrame, x: str | None) -> LatencySamples:
    """TTFT, TPOT and end-to-end latency of every finished request of the lowest seed's runs.

    Args:
        res: the study (to find each run's requests.csv).
        table: runs.csv rows (one facet of the study, or all of it).
        x: the sweep-axis column, or None.

    Returns:
        ``samples``: one row per finished request: ``policy``, ``x_value`` (the run's ``x`` as
        text; the policy without an x axis), ``ttft_s``, ``tpot_ms`` (1000 / tok/s/user; NaN where
        tok/s/user is not above 0), ``e2e_s``;
        policies in study order, runs in table order; runs without requests.csv are skipped.
        ``seed``: the seed used (the lowest in ``table``).

    Source:
        TTFT, TPOT and end-to-end as defined in :mod:`memtp_sim.metrics` (TPOT = 1000 /
        tok/s/user).
    """
    seed = int(table["seed"].min())
    first_seed = table[table["seed"] == seed]
    frames = []
    for pol in res.policies:
        for _, row in first_seed[first_seed["policy"] == pol].iterrows():
            f = res.run_file(row["run_id"], "requests.csv")
            if not f.is_file():
                continue
            rq = pd.read_csv(f, usecols=["status", "ttft_s", "e2e_s", "tok_per_s_user"])
            rq = rq[rq["status"] == "finished"]
            tps = pd.to_numeric(rq["tok_per_s_user"], errors="coerce").to_numpy(dtype=float)
            tpot = np.divide(1000.0, tps, out=np.full_like(tps, np.nan), where=tps > 0)  # NaN, not inf, at 0
            frames.append(pd.DataFrame({
                "policy": pol, "x_value": str(row[x]) if x else pol, "ttft_s": rq["ttft_s"].to_numpy(),
                "tpot_ms": tpot, "e2e_s": rq["e2e_s"].to_numpy()}))
    cols = ["policy", "x_value", "ttft_s", "tpot_ms", "e2e_s"]
    return LatencySamples(pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=cols), seed)


# ---------------------------------------------------------------------------------------------
# hardware profile: SPS(B) and its cliffs


class SpsCurve(NamedTuple):
    """The hardware profile's verify-pass table (see :func:`sps_curve`).

    Attributes:
        name: the hardware profile's name.
        measured: the measured points: ``batch_tokens`` (tokens), ``pass_ms`` (ms),
            ``verify_tok_per_s`` (tok/s).
        rule: the same columns at every integer B between the first and last measured point.
    """

    name: str
    measured: pd.DataFrame
    rule: pd.DataFrame


def sps_curve(res: StudyResults) -> SpsCurve | None:
    """The measured SPS(B) points of the study's hardware profile and the simulator's lookup rule
    (pass time linear between measured points) at every integer B in between.

    Args:
        res: the study (the first run's summary holds the profile: every run shares it).

    Returns:
        ``name``: the profile; ``measured`` and ``rule``: columns ``batch_tokens`` (B, tokens in the
        pass), ``pass_ms`` (ms per pass), ``verify_tok_per_s`` (B x SPS(B) = B / pass time). None
        when no run has a summary.

    Raises:
        KeyError: the summary has no ``provenance.hardware.sps`` table.

    Source:
        docs/model.md section 1 step 4 (SPS(B) is a measured, jagged table); the lookup rule
        ``linear_pass_time`` of :mod:`memtp_sim.hardware.cost`.
    """
    summ = res.first_summary
    if not summ:
        return None
    hw = summ["provenance"]["hardware"]
    b = np.asarray(hw["sps"]["batch_tokens"])  # B stays integer (tokens)
    t = np.asarray(hw["sps"]["pass_ms"], dtype=np.float64)
    dense = np.arange(b[0], b[-1] + 1)
    t_dense = np.interp(dense, b, t)

    def frame(bb: np.ndarray, tt: np.ndarray) -> pd.DataFrame:
        rate = np.divide(bb * 1000.0, tt, out=np.full(tt.shape, np.nan), where=tt > 0)  # NaN, not inf, at 0 ms
        return pd.DataFrame({"batch_tokens": bb, "pass_ms": tt, "verify_tok_per_s": rate})

    return SpsCurve(str(hw.get("name", "")), frame(b, t), frame(dense, t_dense))


def cliffs(res: StudyResults) -> pd.DataFrame:
    """Cliffs between neighbouring measured points of the profile's SPS(B).

    A cliff is either a ``rate_drop`` (verify tokens per second B / pass time falls by more than 5%
    from one measured point to the next) or a ``pass_jump`` (pass time grows more than 1.6x).

    Args:
        res: the study (the first run's summary holds the profile).

    Returns:
        One row per cliff: ``b_from``, ``b_to`` (tokens), ``pass_ms_from``, ``pass_ms_to`` (ms),
        ``verify_tok_per_s_from``, ``verify_tok_per_s_to``, ``kind``. Empty without summaries.

    Source:
        docs/model.md section 1 step 4 (SPS(B) is jagged, with cliffs); the rule and its 5% and
        1.6x thresholds are :func:`memtp_sim.hardware.fidelity.find_cliffs`'s.
    """
    cols = ["b_from", "b_to", "pass_ms_from", "pass_ms_to", "verify_tok_per_s_from", "verify_tok_per_s_to", "kind"]
    summ = res.first_summary
    if not summ:
        return pd.DataFrame(columns=cols)
    sps = summ["provenance"]["hardware"]["sps"]
    cl = find_cliffs(sps["batch_tokens"], sps["pass_ms"])
    cl["verify_tok_per_s_from"] = 1000.0 * cl["b_from"] / cl["pass_ms_from"]
    cl["verify_tok_per_s_to"] = 1000.0 * cl["b_to"] / cl["pass_ms_to"]
    return cl[cols]


def cliff_notes(cl: pd.DataFrame) -> list[str]:
    """One phrase per row of :func:`cliffs`.

    Args:
        cl: :func:`cliffs`.

    Returns:
        e.g. ``"B=32 to 64: pass time 266.4 to 1076.6 ms (120 to 59 verify tok/s)"`` for a rate drop,
        ``"B=8 to 16: pass time jumps 47.3 to 86.5 ms (x1.83)"`` for a pass-time jump.
    """
    out = []
    for _, c in cl.iterrows():
        b0, b1 = int(c["b_from"]), int(c["b_to"])
        if c["kind"] == "rate_drop":
            out.append(f"B={b0} to {b1}: pass time {c['pass_ms_from']:.1f} to {c['pass_ms_to']:.1f} ms "
                       f"({c['verify_tok_per_s_from']:.0f} to {c['verify_tok_per_s_to']:.0f} verify tok/s)")
        else:
            out.append(f"B={b0} to {b1}: pass time jumps {c['pass_ms_from']:.1f} to {c['pass_ms_to']:.1f} ms "
                       f"(x{_ratio(c['pass_ms_to'], c['pass_ms_from']):.2f})")
    return out


# ---------------------------------------------------------------------------------------------
# confidence calibration


class Reliability(NamedTuple):
    """Reliability diagrams' data (see :func:`reliability_curves`).

    Attributes:
        curves: long frame, one row per bin (columns in :func:`reliability_curves`).
        picks: the run behind each curve.
        positions: requested draft positions (1-based) that have data.
        missing: requested positions without data.
        max_position: the deepest position any picked run stores.
    """

    curves: pd.DataFrame
    picks: pd.DataFrame
    positions: tuple[int, ...]
    missing: tuple[int, ...]
    max_position: int


def _stored_positions(res: StudyResults, run_id: str) -> set[int]:
    cal = res.summaries.get(run_id, {}).get("metrics", {}).get("calibration_by_position") or {}
    return {int(k.split("_", 1)[1]) for k in (cal.get("reliability") or {}) if k.startswith("used_")}


def _reliability_picks(res: StudyResults, positions: tuple[int, ...]) -> pd.DataFrame:
    """Per curve (variant, else one), the lowest-seed confidence-ranking run that stores the most of
    ``positions`` (the first such run in table order on a tie)."""
    t = res.table
    cand = t[(t["seed"] == t["seed"].min()) & t["policy"].str.startswith(_CONFIDENCE_POLICIES)]
    groups = cand.groupby("variant", sort=False) if "variant" in t else [(None, cand)]
    rows = []
    for variant, g in groups:
        if g.empty:
            continue
        stored = [_stored_positions(res, rid) for rid in g["run_id"]]
        score = [(len(s & set(positions)), len(s)) for s in stored]
        i = max(range(len(score)), key=lambda j: (score[j], -j))
        row = g.iloc[i]
        run = ", ".join([f"{k} = {row[k]}" for k in res.sweep_keys if pd.notna(row[k])] + [f"seed {int(row['seed'])}"])
        rows.append({"label": str(variant) if variant is not None else row["policy"], "run_id": row["run_id"],
                     "policy": row["policy"], "run": run, "num_positions": len(stored[i])})
    return pd.DataFrame(rows, columns=["label", "run_id", "policy", "run", "num_positions"])


def reliability_curves(res: StudyResults, positions: tuple[int, ...] = (1, 3, 5, 7)) -> Reliability | None:
    """Reliability of the cumulative confidence a_k at a few draft positions: the raw head once, and
    what the policy saw (after temperatures) per variant (one curve when the study has no variants).

    Each curve comes from one run of the lowest seed with a confidence-ranking policy (DSpark,
    threshold, goodput). The runs' summaries keep a position's curve only where that position was
    drafted often enough, so a run with a shallow draft (MEMTP depth 1, gamma 2, ...) has none for
    the deeper positions; the run picked per curve is the one storing the most of ``positions``.

    Args:
        res: the study.
        positions: draft positions k (1-based) to show.

    Returns:
        ``curves``: long frame ``label`` (variant or policy; ``raw head`` for the raw curve),
        ``kind`` (``raw`` / ``used``), ``position``, ``mean_prob`` (mean a_k in the bin),
        ``frac_positive`` (fraction of those request-rounds with positions 1..k all accepted),
        ``count`` (request-rounds in the bin; NaN if the summary has no counts).
        ``picks``: the run behind each curve (``label``, ``run_id``, ``policy``, ``run``
        (its sweep settings and seed, in words), ``num_positions`` stored). ``positions``: the
        requested positions with data; ``missing``: those without; ``max_position``: the deepest
        position any picked run stores. None when no run ranks confidences or none stores a curve.

    Source:
        Reliability diagrams (DeGroot and Fienberg 1983) of the joint survival a_k, as in DSpark
        paper (Cheng et al. 2026) Fig. 6; bins from :func:`memtp_sim.confidence.reliability_curve`.
    """
    picks = _reliability_picks(res, positions)
    rows = []
    for i, p in enumerate(picks.itertuples()):
        cal = res.summaries.get(p.run_id, {}).get("metrics", {}).get("calibration_by_position") or {}
        rel = cal.get("reliability") or {}
        for k in positions:
            for kind in ("raw", "used"):
                c = rel.get(f"{kind}_{k}")
                if c is None or (kind == "raw" and any(r["kind"] == "raw" and r["position"] == k for r in rows)):
                    continue  # the raw head is the same in every variant: keep it once
                n = len(c["mean_prob"])
                rows += [{"label": "raw head" if kind == "raw" else p.label, "kind": kind, "position": k,
                          "mean_prob": c["mean_prob"][j], "frac_positive": c["frac_positive"][j],
                          "count": c["counts"][j] if "counts" in c else np.nan} for j in range(n)]
    if not rows:
        return None
    curves = pd.DataFrame(rows)
    have = set(curves["position"])
    return Reliability(curves, picks, tuple(k for k in positions if k in have),
                       tuple(k for k in positions if k not in have), int(picks["num_positions"].max()))


def calibration_table(res: StudyResults) -> pd.DataFrame | None:
    """ECE and AUC of the cumulative confidence per facet and policy, mean over seeds.

    Args:
        res: the study (runs.csv columns ``ece_raw_mean``, ``ece_mean``, ``auc_mean``).

    Returns:
        Columns: the facet keys, ``policy``, ``raw head ECE``, ``ECE as used``, ``AUC`` (runs.csv
        ``ece_raw_mean``, ``ece_mean``, ``auc_mean`` averaged over seeds); None when the study
        records no calibration (no ``ece_mean`` column, or all NaN). ECE is a fraction, AUC in
        [0, 1].

    Source:
        ECE (Naeini et al. 2015; Guo et al. 2017) and Mann-Whitney AUC per position as in DSpark
        paper (Cheng et al. 2026) Fig. 6; computed by :mod:`memtp_sim.confidence`.
    """
    if "ece_mean" not in res.table:
        return None
    keys = res.facet_keys + ["policy"]
    agg = aggregate(res.table, keys, ["ece_raw_mean", "ece_mean", "auc_mean"])
    if agg["ece_mean_mean"].isna().all():
        return None
    return agg[keys + ["ece_raw_mean_mean", "ece_mean_mean", "auc_mean_mean"]].rename(columns={
        "ece_raw_mean_mean": "raw head ECE", "ece_mean_mean": "ECE as used", "auc_mean_mean": "AUC"})


# ---------------------------------------------------------------------------------------------
# MEMTP: timeline and load phases


def time_weighted_bins(rounds: pd.DataFrame, columns: tuple[str, ...] | list[str], bin_s: float) -> pd.DataFrame:
    """Time-weighted means of per-round quantities in fixed bins of simulated time.

    A round belongs to the bin holding its ``start_s``; its weight is its ``duration_s``. Bins with
    no round are absent; a bin whose rounds all last 0 s gives NaN.

    Args:
        rounds: one row per round: ``start_s``, ``duration_s`` (s) and ``columns``.
        columns: the quantities to average.
        bin_s: bin width (s).

    Returns:
        Indexed by ``bin_start_s`` (multiples of ``bin_s``, ascending), one column per quantity:
        ``sum(value * duration) / sum(duration)`` over the bin's rounds.

    Source:
        A duration-weighted (time) average, so long rounds count for the time they last.
    """
    b = (rounds["start_s"] // bin_s) * bin_s
    w = rounds["duration_s"]
    cols = list(columns)
    out = rounds[cols].mul(w, axis=0).groupby(b).sum().div(w.groupby(b).sum(), axis=0)
    out.index.name = "bin_start_s"
    return out


class Timeline(NamedTuple):
    """The MEMTP timeline's data (see :func:`timeline`).

    Attributes:
        bins: time-weighted per-bin values (columns in :func:`timeline`).
        phases: the load ramp: ``start_s``, ``end_s`` (s), ``rate_per_s`` (req/s).
        policy: the policy shown.
        seed: the seed shown.
        bin_s: bin width, s.
    """

    bins: pd.DataFrame
    phases: pd.DataFrame
    policy: str
    seed: int
    bin_s: float


def timeline(res: StudyResults, bin_s: float = 60.0) -> Timeline | None:
    """Ensemble depth, free memory, KV in use, coherence R and queue over simulated time, for the
    first policy's runs of the lowest seed (one line per setting of the x axis).

    Args:
        res: the study.
        bin_s: bin width (s) of :func:`time_weighted_bins`.

    Returns:
        ``bins``: ``label`` (``"<x> = <value>"``, or the policy), ``run_id``, ``bin_start_s`` and the
        time-weighted :data:`TIMELINE_COLUMNS` (``depth`` heads, ``free_gib``, ``kv_gib`` GiB,
        ``coherence`` in [0, 1], ``num_waiting`` requests); runs without rounds.parquet are skipped.
        ``phases``: the load ramp of the first run (``start_s``, ``end_s``, ``rate_per_s``; empty
        without a ramp). ``policy``, ``seed``, ``bin_s``: what was shown. None when the study is empty.

    Source:
        docs/model.md section 2 (depth, free memory and coherence R of the MEMTP ensemble).
    """
    t, x = res.table, res.x_key
    if t.empty:
        return None
    seed, policy = int(t["seed"].min()), t["policy"].iloc[0]
    first = t[(t["seed"] == seed) & (t["policy"] == policy)]
    frames = []
    for _, row in first.iterrows():
        f = res.run_file(row["run_id"], "rounds.parquet")
        if not f.is_file():
            continue
        r = pd.read_parquet(f, columns=["start_s", "duration_s", *TIMELINE_COLUMNS])
        binned = time_weighted_bins(r, TIMELINE_COLUMNS, bin_s).reset_index()
        binned.insert(0, "run_id", row["run_id"])
        binned.insert(0, "label", f"{x} = {row[x]}" if x else row["policy"])
        frames.append(binned)
    cols = ["label", "run_id", "bin_start_s", *TIMELINE_COLUMNS]
    bins = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=cols)
    phases = pd.DataFrame(load_phases(res.summaries.get(first["run_id"].iloc[0], {})),
                          columns=["start_s", "end_s", "rate_per_s"])
    return Timeline(bins, phases, policy, seed, bin_s)


_DEPTH = "memtp.depth"


def _depth_setting(summary: dict[str, Any]) -> Any:
    """The run's MEMTP depth setting (``1``, ``16``, ``elastic``; None without MEMTP)."""
    return (summary.get("scenario", {}).get("memtp", {}) or {}).get("depth")


def _phase_rows(res: StudyResults, run: pd.Series, phases: list[tuple[float, float, float]],
                keys: list[str]) -> list[dict]:
    rq = pd.read_csv(res.run_file(run["run_id"], "requests.csv"),
                     usecols=["status", "arrival_at_s", "queue_s", "ttft_s", "tok_per_s_user"])
    rd = pd.read_parquet(res.run_file(run["run_id"], "rounds.parquet"),
                         columns=["start_s", "duration_s", "depth", "kv_gib"])
    labels = {key: run[key] if key in run else _depth_setting(res.summaries.get(run["run_id"]) or {})
              for key in keys}
    rows = []
    for k, (start, end, rate) in enumerate(phases):
        sel = rq[(rq["arrival_at_s"] >= start) & (rq["arrival_at_s"] < end)]
        done = sel[sel["status"] == "finished"]
        rr = rd[(rd["start_s"] >= start) & (rd["start_s"] < end)]
        w = rr["duration_s"].sum()
        rows.append({
            **labels, "policy": run["policy"], "seed": run["seed"],
            "phase": f"{k + 1}: {rate:g} req/s",
            "requests": len(sel), "rejected": int((sel["status"] == "rejected").sum()),
            "tok/s/user p50": done["tok_per_s_user"].median(),
            "TTFT p50 s": done["ttft_s"].median(),
            "queue p90 s": done["queue_s"].quantile(0.9),
            "mean depth": _ratio((rr["depth"] * rr["duration_s"]).sum(), w),
            "peak KV GiB": rr["kv_gib"].max() if len(rr) else np.nan,
        })
    return rows


def phase_table(res: StudyResults) -> pd.DataFrame | None:
    """Per load phase of a ramped workload, what each run group saw (mean over seeds).

    Requests belong to the phase their arrival falls in; rounds to the phase their start falls in.

    Args:
        res: the study; each run's summary gives its ramp (``scenario.workload.rate_schedule``),
            its requests.csv and rounds.parquet the rest.

    Returns:
        One row per sweep setting, policy and phase (study order): the sweep keys, then
        ``memtp.depth`` (the run's depth setting, from its summary) when the study runs the MEMTP
        ensemble and does not sweep it (variants that set the depth then still show it),
        ``policy``, ``phase`` (``"<n>: <rate> req/s"``), ``requests`` (arrived), ``rejected``,
        ``tok/s/user p50``, ``TTFT p50 s`` and ``queue p90 s`` (finished requests; NaN where none
        finished), ``mean depth`` (time-weighted over rounds, heads; NaN without rounds),
        ``peak KV GiB``. None when a run has no load ramp (or no summary), or the study is empty.

    Raises:
        FileNotFoundError: a run's requests.csv or rounds.parquet is missing.

    Source:
        docs/model.md section 2 (more heads leave less KV for admitting requests: the trade-off
        the MEMTP study measures).
    """
    keys = res.sweep_keys + ([_DEPTH] if res.uses_memtp and _DEPTH not in res.sweep_keys else [])
    rows = []
    for _, run in res.table.iterrows():
        phases = load_phases(res.summaries.get(run["run_id"]) or {})
        if not phases:
            return None
        rows += _phase_rows(res, run, phases, keys)
    if not rows:
        return None
    df = pd.DataFrame(rows)
    return (df.drop(columns="seed").groupby(keys + ["policy", "phase"], sort=False, dropna=False)
            .mean(numeric_only=True).reset_index())


def _keys_of(ph: pd.DataFrame) -> list[str]:
    """The setting columns of a :func:`phase_table` (those before ``policy``)."""
    return list(ph.columns[: ph.columns.get_loc("policy")])


def _name(row: pd.Series, keys: list[str]) -> str:
    return ", ".join(f"{k} = {row[k]}" for k in keys if pd.notna(row[k]))  # a key this run lacks: left out


def _phase_note(pol: str, phase: str, g: pd.DataFrame, keys: list[str], depth_col: str, tie: float) -> str:
    """One sentence of :func:`phase_notes` for one (policy, phase) group."""
    differ = [k for k in keys if g[k].astype(str).nunique() > 1] or keys[:1]
    speed = pd.to_numeric(g["tok/s/user p50"], errors="coerce")
    ranked = g[np.isfinite(speed.to_numpy(dtype=float))].sort_values("tok/s/user p50", ascending=False, kind="stable")
    head = f"{pol}, phase {phase}: "
    if ranked.empty:
        msg = head + "no request that arrived in this phase finished"
        best = None
    else:
        best = ranked.iloc[0]
        second = ranked.iloc[1] if len(ranked) > 1 else None
        lead = _ratio(best["tok/s/user p50"], second["tok/s/user p50"]) - 1 if second is not None else np.nan
        if second is not None and np.isfinite(lead) and lead < tie:
            msg = (head + f"fastest per user: near tie, {_name(best, differ)} and {_name(second, differ)} within "
                   f"{tie:.0%} ({best['tok/s/user p50']:.1f} tok/s/user p50)")
        else:
            msg = head + f"fastest per user with {_name(best, differ)} ({best['tok/s/user p50']:.1f} tok/s/user p50)"
    if depth_col in g:
        el_all = g[g[depth_col].astype(str) == "elastic"]
        el_keys = [k for k in differ if k != depth_col and el_all[k].astype(str).nunique() > 1]
        el = el_all[el_all.index != (best.name if best is not None else None)]
        parts = []
        for _, e in el.iterrows():
            who = f"elastic ({_name(e, el_keys)})" if el_keys else "elastic"
            v, d = e["tok/s/user p50"], e["mean depth"]
            parts.append(f"{who} " + (f"{v:.1f}" if np.isfinite(v) else "no request finished")
                         + (f" at mean depth {d:.1f}" if np.isfinite(d) else ""))
        if parts:
            msg += "; " + ", ".join(parts)
    rej = g[g["rejected"] > 0]
    if not rej.empty:
        msg += "; rejected: " + ", ".join(f"{_name(r, differ)}: {r['rejected']:g}" for _, r in rej.iterrows())
    return msg


def phase_notes(ph: pd.DataFrame, x: str | None, *, tie: float = 0.01) -> list[str]:
    """One sentence per (policy, phase) of :func:`phase_table`: which setting gives the best median
    per-user speed, where each ``elastic`` setting stands, and who rejected requests.

    Every setting is named by all the keys that differ between the rows compared (e.g. ``variant =
    depth16, memtp.depth = 16``), so a winner never hides the depth behind a variant name. Rows
    where no request finished are not ranked.

    Args:
        ph: :func:`phase_table`.
        x: the sweep key to compare along (e.g. ``memtp.depth`` or ``variant``), or None.
        tie: a lead under this fraction (default 0.01 = 1%) is called a near tie.

    Returns:
        Sentences sorted by policy and phase; empty when ``x`` is None or not a column of ``ph``.
        The reasons for rejections are in each run's summary (:func:`rejections`).
    """
    if x is None or x not in ph:
        return []
    keys = _keys_of(ph)
    depth_col = _DEPTH if _DEPTH in ph else x
    return [_phase_note(pol, phase, g, keys, depth_col, tie)
            for (pol, phase), g in ph.groupby(["policy", "phase"], sort=True)]


# ---------------------------------------------------------------------------------------------
# rejected requests, runs that completed nothing


def _count(row: pd.Series, col: str) -> float:
    v = pd.to_numeric(pd.Series([row.get(col, np.nan)]), errors="coerce").iloc[0]
    return float(v)


def _rejection_rows(res: StudyResults) -> pd.DataFrame:
    """:func:`rejections` with the ``run_id`` of each row kept."""
    cols = res.sweep_keys + ["policy", "seed", "requests", "completed", "rejected", "never arrived", "reasons"]
    done = _completed(res.table)
    rows = []
    for i, (_, row) in enumerate(res.table.iterrows()):
        rejected = _count(row, "num_rejected")
        if not (rejected > 0 or not done[i]):
            continue
        by = (res.summaries.get(row["run_id"], {}).get("metrics", {}) or {}).get("rejected_by_reason") or {}
        reasons = ", ".join(f"{k}: {int(v)}" for k, v in by.items()) or ("not recorded" if rejected > 0 else "")
        rows.append({"run_id": row["run_id"], **{k: row[k] for k in res.sweep_keys if k in row},
                     "policy": row["policy"], "seed": row["seed"], "requests": _count(row, "num_requests"),
                     "completed": _count(row, "num_completed"), "rejected": rejected,
                     "never arrived": _count(row, "num_not_arrived"), "reasons": reasons})
    return pd.DataFrame(rows, columns=["run_id"] + cols)


def rejections(res: StudyResults) -> pd.DataFrame:
    """One row per run that rejected requests or completed none, with the reasons.

    Args:
        res: the study (runs.csv ``num_requests``, ``num_completed``, ``num_rejected``,
            ``num_not_arrived`` where recorded; each summary's ``metrics.rejected_by_reason``).

    Returns:
        Columns: the sweep keys, ``policy``, ``seed``, ``requests`` (arrived), ``completed``,
        ``rejected``, ``never arrived`` (whole counts, pandas ``Int64``; ``<NA>`` where runs.csv
        lacks them) and ``reasons``
        (``"exceeds_max_model_len: 20, ..."``; ``"not recorded"`` when the summary has no
        breakdown). Study order; empty when every run completed requests and rejected none.

    Source:
        The reject reasons counted by :mod:`memtp_sim.engine` (``exceeds_max_model_len``,
        ``exceeds_kv_capacity``) and summed per run by :mod:`memtp_sim.metrics`.
    """
    out = _rejection_rows(res).drop(columns="run_id")
    for col in ("requests", "completed", "rejected", "never arrived"):
        out[col] = out[col].round().astype("Int64")  # counts (NaN shows as <NA>, '-' on the page)
    return out


def _reason_totals(res: StudyResults, run_ids: list[str], rejected: float) -> str:
    """``"exceeds_max_model_len (20), ..."`` summed over ``run_ids``."""
    totals: dict[str, int] = {}
    for rid in run_ids:
        by = (res.summaries.get(rid, {}).get("metrics", {}) or {}).get("rejected_by_reason") or {}
        for k, v in by.items():
            totals[k] = totals.get(k, 0) + int(v)
    unknown = int(rejected) - sum(totals.values())
    if unknown > 0:
        totals["reason not recorded"] = unknown
    return ", ".join(f"{k} ({v})" for k, v in totals.items()) or "no reason recorded"


def rejection_notes(res: StudyResults) -> list[str]:
    """Warnings, in words, about runs that measured nothing or turned requests away.

    Args:
        res: the study (see :func:`rejections` for the columns read).

    Returns:
        Up to three lines, loudest first: ``"every request rejected in 4 of 4 runs:
        exceeds_max_model_len (40); ..."`` for runs whose every request was rejected; ``"no request
        completed in N of M runs ..."`` for other runs that completed nothing; ``"K request(s)
        rejected in N of M runs: <reason> (count), ..."`` for runs that completed others. Empty when
        every run completed requests and rejected none.

    Source:
        :func:`rejections`.
    """
    rj = _rejection_rows(res)
    if rj.empty:
        return []
    m = len(res.table)
    none = rj[~(rj["completed"] > 0)]
    all_rej = none[(none["rejected"] > 0) & (none["rejected"] >= none["requests"])]
    other = none.drop(all_rej.index)
    some = rj[rj["completed"] > 0]
    notes = []
    if len(all_rej):
        notes.append(f"every request rejected in {len(all_rej)} of {m} run(s): "
                     f"{_reason_totals(res, all_rej['run_id'].tolist(), all_rej['rejected'].sum())}; those runs "
                     "measured nothing (throughput 0, no latencies), so no policy is ranked on them")
    if len(other):
        notes.append(f"no request completed in {len(other)} of {m} run(s) ({other['rejected'].sum():g} rejected, "
                     f"{other['never arrived'].sum():g} never arrived); those runs measured nothing, so no policy "
                     "is ranked on them")
    if len(some):
        notes.append(f"{some['rejected'].sum():g} request(s) rejected in {len(some)} of {m} run(s) that completed "
                     f"others: {_reason_totals(res, some['run_id'].tolist(), some['rejected'].sum())}")
    return notes

"""DSpark: the hardware-aware prefix scheduler (paper Algorithm 1) and its two policies.

Given each request's conditional confidences ``c[r, k]`` (probability that draft position k is
accepted given positions 1..k-1 were), the joint survival ``a[r, j] = prod_{k<=j} c[r, k]`` is the
expected contribution of verifying position j. Candidates ``(r, j)`` are admitted in order of
decreasing ``a``; admitting one adds one token to the verify batch B and ``a[r, j]`` to the
expected accepted tokens tau. The objective is the expected token rate

    Theta(B) = tau(B) / (overhead_s + 1 / SPS(B))        (overhead_s = 0: tau * SPS(B))

starting from ``B = R + prefill_tokens`` (one anchor/bonus slot per request), ``tau = R``.
With ``early_stop`` the scan stops at the first candidate that does not raise Theta (the paper's
lossless, non-anticipating rule); without it, the best prefix over the whole scan is taken (the
global search the paper's production scheduler uses to size its capacity, section 5.2).

Policies: ``dspark`` (:class:`DSparkPolicy`, Algorithm 1 each round, synchronous) and
``dspark_async`` (:class:`DSparkAsyncPolicy`, the production scheduler of section 5.2: capacity
from a global search two rounds earlier, top-K of the current round).

Source: Cheng et al. 2026 (DSpark), section 3.2 and Algorithm 1; Appendix A for why early stop
keeps the output distribution exact; section 5.2 for the asynchronous scheduler.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping, Sequence

import numpy as np

from collections import deque

from pydantic import Field

from .. import _compiled
from ..errors import InvalidArgumentError
from ..hardware import HardwareProfile, SPSTable, load_profile
from ._candidates import (
    FALLBACK_FIELD,
    GAMMA_FIELD,
    PROBE_FIELD,
    FallbackGate,
    FallbackGated,
    draft_budget,
    expected_rate,
    plain_rate,
    plain_rate_of,
    survival,
    take_top,
)
from .base import Policy, PolicyParams, RoundPlan, RoundView
from .registry import register

_cumprod, _cumsum = np.multiply.accumulate, np.add.accumulate  # np.cumprod/np.cumsum without their wrapper

__all__ = ["ScheduleResult", "hardware_aware_prefix_scheduler", "as_sps_table", "pad_confidences",
           "DSparkPolicy", "DSparkAsyncPolicy"]


@dataclass(frozen=True)
class ScheduleResult:
    """Decision of one scheduling round.

    Attributes:
        lengths: draft tokens to verify per request, bonus excluded, shape (R,), ints.
        theta: expected accepted tokens per second of the chosen batch.
        tau: expected accepted tokens of the round, one bonus per request included
            (``R + sum of admitted a``).
        batch_tokens: tokens in the verify pass, ``R + sum(lengths) + prefill_tokens``.
        theta_global: best Theta over the whole candidate scan (== theta without early stop);
            NaN when the SPS table does not cover the whole scan.
        batch_tokens_global: B at ``theta_global`` (-1 when not computed).

    Units: ``theta`` and ``theta_global`` in tok/s, ``tau`` in tokens, ``batch_tokens`` in tokens.

    Source:
        DSpark paper (Cheng et al. 2026) Algorithm 1 (B, tau, Theta = tau * SPS(B)); tau counts
        the bonus token (PAPER_NOTES conventions; docs/model.md section 1 step 3).
    """

    lengths: np.ndarray
    theta: float
    tau: float
    batch_tokens: int
    theta_global: float = float("nan")
    batch_tokens_global: int = -1

    @property
    def num_candidates(self) -> int:
        """Candidates admitted: draft tokens verified in all, ``lengths.sum()``."""
        return int(self.lengths.sum())


@lru_cache(maxsize=1)
def _default_table() -> SPSTable:
    return load_profile(None).sps


def as_sps_table(sps: SPSTable | HardwareProfile | Mapping[int, float] | None) -> SPSTable:
    """Coerce the accepted SPS forms into an :class:`SPSTable` (None = shipped default profile).

    Args:
        sps: an :class:`SPSTable`, a :class:`HardwareProfile` (its ``sps``), a mapping
            ``{B (tokens): steps per second}``, or None.

    Returns:
        The table.

    Raises:
        TypeError: any other type.
        InvalidArgumentError: an invalid mapping (from :meth:`SPSTable.from_mapping`).
    """
    if sps is None:
        return _default_table()
    if isinstance(sps, SPSTable):
        return sps
    if isinstance(sps, HardwareProfile):
        return sps.sps
    if isinstance(sps, Mapping):
        return SPSTable.from_mapping(sps)
    raise TypeError(f"sps: expected a mapping {{B: steps/s}}, an SPSTable or a HardwareProfile, got {type(sps).__name__}")


def pad_confidences(confidences: Any) -> tuple[np.ndarray, np.ndarray | None]:
    """Turn a 2-D array or a ragged list of lists into (values, valid mask), both shape (R, L).

    The mask is None when every entry is valid (a rectangular input).

    Args:
        confidences: ``(R, L)`` array, or R sequences of conditional confidences (ragged allowed).

    Returns:
        ``(values, mask)``: ``(R, L)`` float64 with padding 0, and a ``(R, L)`` bool mask of
        real entries (or None), L the longest row.

    Raises:
        InvalidArgumentError: values outside [0, 1], NaN, or not one sequence per request.
    """
    if isinstance(confidences, np.ndarray) and confidences.ndim == 2:
        vals = confidences.astype(np.float64, copy=False)
        if vals.size and not (vals.min() >= 0.0 and vals.max() <= 1.0):  # NaN fails both
            bad = vals[~((vals >= 0) & (vals <= 1))]
            raise InvalidArgumentError(f"confidences: values must lie in [0, 1], got {float(bad[0]):g}")
        return vals, None
    if isinstance(confidences, np.ndarray) and confidences.ndim != 2:
        raise InvalidArgumentError(f"confidences: expected a 2-D array (requests x positions), got {confidences.ndim}-D")
    rows: Sequence[Sequence[float]] = list(confidences)
    if rows and np.ndim(rows[0]) == 0:
        raise InvalidArgumentError("confidences: expected one sequence per request (2-D), got a flat sequence")
    width = max((len(r) for r in rows), default=0)
    vals = np.zeros((len(rows), width))
    mask = np.zeros((len(rows), width), dtype=bool)
    for i, r in enumerate(rows):
        arr = np.asarray(r, dtype=np.float64)
        if arr.ndim != 1:
            raise InvalidArgumentError(f"confidences: request {i} is not a 1-D sequence")
        vals[i, : arr.size] = arr
        mask[i, : arr.size] = True
    inside = (vals >= 0) & (vals <= 1)
    if not inside[mask].all():
        raise InvalidArgumentError(f"confidences: values must lie in [0, 1], got {float(vals[mask & ~inside][0]):g}")
    return vals, (None if mask.all() else mask)


def _plain(v: Any) -> str:
    """A value for a message: numpy scalars as plain numbers (``1.5``, never ``np.float64(1.5)``)."""
    return repr(v.item()) if isinstance(v, np.generic) else repr(v)


def _is_count(v: Any) -> bool:
    """An integer (Python or numpy), not a bool and not a float, even a whole one."""
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _is_seconds(v: Any) -> bool:
    """A finite real number (Python or numpy), not a bool: a time in seconds."""
    return (isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))
            and bool(np.isfinite(v)))


def hardware_aware_prefix_scheduler(
    confidences: Any,
    sps: SPSTable | HardwareProfile | Mapping[int, float] | None = None,
    *,
    early_stop: bool = True,
    prefill_tokens: int = 0,
    max_batch_tokens: int | None = None,
    overhead_s: float = 0.0,
    no_draft_pass_s: float | None = None,
) -> ScheduleResult:
    """Choose per-request verify lengths maximising the expected token rate (Algorithm 1).

    Args:
        confidences: conditional confidences ``c[r, k]`` in [0, 1]; a 2-D array (R, gamma) or a
            list of per-request lists (requests may have different lengths).
        sps: ``{B: steps per second}``, an :class:`SPSTable`, a :class:`HardwareProfile`, or
            None for the shipped default profile. Between measured B the table's documented rule
            (linear in pass time between neighbours) applies.
        early_stop: stop at the first non-improving candidate (lossless, paper Algorithm 1);
            False runs the global search (paper section 5.2).
        prefill_tokens: prefill tokens sharing the verify pass (count toward B, not tau).
        max_batch_tokens: cap on B (candidates beyond it are not considered).
        overhead_s: fixed time of the round outside the verify pass (e.g. drafting), seconds.
        no_draft_pass_s: the pass time when no draft is admitted (a plain decode pass, which a
            profile may price apart from verify passes), seconds; None: the table's at B = R + prefill.

    Returns:
        ScheduleResult with ``lengths`` (bonus excluded), ``theta``, ``tau`` (bonus included)
        and ``batch_tokens`` (one anchor slot per request included).

    Raises:
        InvalidArgumentError: confidences outside [0, 1] or not 2-D; an SPS table that lacks a B
            the search needs (outside its measured range, where the lookup rule does not apply);
            a prefill or cap that is not a whole number >= 0, a cap below the anchor slots, or an
            ``overhead_s`` that is not a finite number >= 0.
        TypeError: ``sps`` of another type (from :func:`as_sps_table`).

    Source:
        DSpark paper (Cheng et al. 2026) Algorithm 1 and section 3.2 (greedy order by a_{r,j},
        early stop at the first non-improvement, lossless); section 5.2 for the global search;
        the example below is the Appendix A worked example (SPS(1) = 1.0, SPS(2) = 0.5,
        SPS(3) = 0.45, a_1 = 0.8: early stop returns l = 0).

    Example:
        >>> r = hardware_aware_prefix_scheduler([[0.8, 0.9]], {1: 1.0, 2: 0.5, 3: 0.45})
        >>> r.lengths.tolist(), r.batch_tokens
        ([0], 1)
    """
    table = as_sps_table(sps)
    vals, mask = pad_confidences(confidences)
    num_req = vals.shape[0]
    if not _is_count(prefill_tokens) or prefill_tokens < 0:
        raise InvalidArgumentError(f"prefill_tokens: must be a whole number of tokens >= 0, got {_plain(prefill_tokens)}")
    if max_batch_tokens is not None and (not _is_count(max_batch_tokens) or max_batch_tokens < 0):
        raise InvalidArgumentError(f"max_batch_tokens: must be a whole number of tokens >= 0, got {_plain(max_batch_tokens)}")
    if not (_is_seconds(overhead_s) and overhead_s >= 0):
        raise InvalidArgumentError(f"overhead_s: must be a finite number of seconds >= 0, got {_plain(overhead_s)}")
    if no_draft_pass_s is not None and not (_is_seconds(no_draft_pass_s) and no_draft_pass_s > 0):
        raise InvalidArgumentError(f"no_draft_pass_s: must be a finite number of seconds > 0 (or None), "
                                   f"got {_plain(no_draft_pass_s)}")
    base_b = num_req + int(prefill_tokens)
    if max_batch_tokens is not None and base_b > max_batch_tokens:
        raise InvalidArgumentError(f"max_batch_tokens: {max_batch_tokens} is below the {base_b} anchor and prefill tokens")
    return _schedule(vals, mask, table, early_stop, int(prefill_tokens), max_batch_tokens, overhead_s, no_draft_pass_s)


def _ranked_candidates(vals: np.ndarray, mask: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None]:
    """Every candidate's joint survival ``a_{r,j}`` in descending order, ties in (request,
    position) order, and ``order`` with ``order // L`` the candidate's request (None for one
    request: its candidates are its row, in order). Padding (``mask`` False) is never a candidate.
    (ufunc and ndarray methods throughout: the np.* wrappers cost ~1 us each, every drafted round.)"""
    if mask is None and vals.shape[0] == 1:
        # one request: its row is already in that order (a[j+1] <= a[j] for values in [0, 1]), so
        # the stable sort below would return 0..L-1 (a single user's round skips it: ~3 us)
        return _cumprod(vals, axis=1).ravel(), None
    if mask is None:
        a = _cumprod(vals, axis=1).ravel()
        # Descending a; a stable sort keeps ties in row-major (request, position) order, so each
        # request's candidates stay a prefix (a[r, j+1] <= a[r, j] always holds).
        order = (-a).argsort(kind="stable")
        return a[order], order
    surv = _cumprod(np.where(mask, vals, 1.0), axis=1)
    rows, cols = np.nonzero(mask)
    a = surv[rows, cols]
    order = np.lexsort((cols, rows, -a))
    return a[order], rows[order] * vals.shape[1]  # so that order // width is the row


def _schedule(vals: np.ndarray, mask: np.ndarray | None, table: SPSTable, early_stop: bool, prefill_tokens: int,
              max_batch_tokens: int | None, overhead_s: float, no_draft_pass_s: float | None) -> ScheduleResult:
    """Algorithm 1 on checked inputs (:func:`hardware_aware_prefix_scheduler` checks them once;
    the engine's rounds pass confidences it built itself). Raises as the public function for an
    SPS table that cannot price the scan."""
    num_req = vals.shape[0]
    base_b = num_req + prefill_tokens
    if num_req == 0:
        return ScheduleResult(np.zeros(0, dtype=np.int64), 0.0, 0.0, base_b, 0.0, base_b)

    width = vals.shape[1]
    kernels = _compiled.active() if mask is None and width else None
    if kernels is not None and vals.flags.c_contiguous:
        return ScheduleResult(*_scan_compiled(kernels, vals, table, early_stop, base_b, max_batch_tokens, overhead_s,
                                              no_draft_pass_s))
    a_sorted, order = _ranked_candidates(vals, mask)

    # Algorithm 1: only drafts with positive probability are candidates (they sort last; a >= 0,
    # so nonzero is positive).
    n_max = int(np.count_nonzero(a_sorted))
    if max_batch_tokens is not None:
        n_max = min(n_max, int(max_batch_tokens) - base_b)
    if not table.covers(base_b):
        raise _uncovered(table, base_b, None, early_stop)
    # The lookup rule covers one interval of B; the scan is evaluated as far as it reaches.
    n_cov = n_max if table.covers(base_b + n_max) else table.max_batch_tokens - base_b
    tau = np.empty(n_cov + 1)
    tau[0] = 0.0
    _cumsum(a_sorted[:n_cov], out=tau[1:])
    tau += num_req
    times = table.pass_time_range_s(base_b, base_b + n_cov)
    if no_draft_pass_s is not None:
        times = times.copy()
        times[0] = no_draft_pass_s
    theta = tau / (overhead_s + times)
    best = int(theta.argmax())  # the first maximum, as np.argmax

    if early_stop:
        not_better = theta[1:] <= theta[:-1]
        first = int(not_better.argmax()) if n_cov else 0
        if n_cov and not_better[first]:
            n_star = first
        elif n_cov < n_max:
            raise _uncovered(table, base_b + n_cov + 1, base_b + n_max, early_stop)
        else:
            n_star = n_max
    else:
        if n_cov < n_max:
            raise _uncovered(table, base_b + n_cov + 1, base_b + n_max, early_stop)
        n_star = best

    if order is None:  # one request: it verifies the n* best, a prefix of its row
        lengths = np.array([n_star], dtype=np.int64)
    else:
        lengths = np.bincount(order[:n_star] // width, minlength=num_req).astype(np.int64, copy=False)
    g_star = best if n_cov == n_max else -1
    return ScheduleResult(
        lengths=lengths,
        theta=float(theta[n_star]),
        tau=float(tau[n_star]),
        batch_tokens=base_b + n_star,
        theta_global=float(theta[g_star]) if g_star >= 0 else float("nan"),
        batch_tokens_global=base_b + g_star if g_star >= 0 else -1,
    )


def _uncovered(table: SPSTable, b_first: int, b_last: int | None, early_stop: bool) -> InvalidArgumentError:
    """The error of a scan that needs B the table does not price: the anchor batch ``b_first``
    (``b_last`` None), or candidates up to ``b_last`` from ``b_first`` on."""
    where = f"measured range {table.min_batch_tokens}..{table.max_batch_tokens}"
    if b_last is None:
        return InvalidArgumentError(f"sps: no value for B={b_first} (the anchor batch); {where}")
    need = f"the scan needs B={b_first}" if early_stop else f"the global search needs B up to {b_last}"
    return InvalidArgumentError(f"sps: {need}, beyond the {where}; give a larger table or max_batch_tokens")


def _scan_compiled(kernels: Any, vals: np.ndarray, table: SPSTable, early_stop: bool, base_b: int,
                   max_batch_tokens: int | None, overhead_s: float,
                   no_draft_pass_s: float | None) -> tuple[np.ndarray, float, float, int, float, int]:
    """:func:`_schedule` by the compiled scan (``_kernels.prefix_scan``), the same result and errors
    bit for bit, as :class:`ScheduleResult`'s fields in order (``lengths, theta, tau,
    batch_tokens, theta_global, batch_tokens_global``): the engine's rounds skip building it. The table
    prices every B the scan may read (the candidates the pass and the table allow) before the
    kernel learns how many have positive survival."""
    num_req, width = vals.shape
    total = num_req * width
    n_limit = total if max_batch_tokens is None else min(total, int(max_batch_tokens) - base_b)
    if not table.covers(base_b):
        raise _uncovered(table, base_b, None, early_stop)
    n_cov_limit = n_limit if table.covers(base_b + n_limit) else table.max_batch_tokens - base_b
    times = table.pass_time_range_s(base_b, base_b + n_cov_limit)  # float64; the kernel checks the layout
    lengths = np.zeros(num_req, dtype=np.int64)
    n_star, n_cov, n_max, best, theta, tau, theta_best = kernels.prefix_scan(
        vals, times, float(overhead_s), no_draft_pass_s is not None, 0.0 if no_draft_pass_s is None else float(no_draft_pass_s),
        n_limit, n_cov_limit, early_stop, lengths)
    if n_cov < n_max and (n_star == n_cov or not early_stop):  # the scan needed B beyond the table
        raise _uncovered(table, base_b + n_cov + 1, base_b + n_max, early_stop)
    full = n_cov == n_max
    return (lengths, theta, tau, base_b + n_star, theta_best if full else float("nan"),
            base_b + best if full else -1)


def _compiled_scan(c: np.ndarray, table: SPSTable, early_stop: bool, prefill_tokens: int, max_batch_tokens: int,
                   overhead_s: float, no_draft_pass_s: float | None) -> tuple | None:
    """The compiled scan on an engine round whose other inputs passed the view's checks, as
    :func:`_scan_compiled`'s tuple; None without the kernels, or when the scan refuses the round
    (a confidence outside [0, 1], a table that cannot price it, times not float64 and contiguous):
    the numpy path or the public function then raises its one-line error."""
    kernels = _compiled.active()
    if kernels is None or not c.size or not c.flags.c_contiguous:
        return None
    try:
        return _scan_compiled(kernels, c, table, early_stop, c.shape[0] + prefill_tokens, max_batch_tokens,
                              overhead_s, no_draft_pass_s)
    except (TypeError, ValueError):
        return None


def _plan_round(view: RoundView, early_stop: bool) -> ScheduleResult:
    """Algorithm 1 on an engine round: a float64 (R, L) array in [0, 1] (the engine's own
    confidences) goes straight to the scan; anything else through the public checks. The
    compiled scan checks the range itself while it multiplies the rows (numpy's two reductions
    cost ~2 us a round)."""
    c = view.confidences
    if (type(c) is np.ndarray and c.dtype == np.float64 and c.ndim == 2 and isinstance(view.sps, SPSTable)
            and type(view.prefill_tokens) is int and type(view.max_batch_tokens) is int
            and type(view.draft_overhead_s) is float and view.draft_overhead_s >= 0.0
            and (view.no_draft_pass_s is None or (type(view.no_draft_pass_s) is float
                                                  and 0.0 < view.no_draft_pass_s < float("inf")))
            and view.num_requests + view.prefill_tokens <= view.max_batch_tokens):
        res = _compiled_scan(c, view.sps, early_stop, view.prefill_tokens, view.max_batch_tokens,
                             view.draft_overhead_s, view.no_draft_pass_s)
        if res is not None:
            return ScheduleResult(*res)
        if not c.size or (np.minimum.reduce(c, axis=None) >= 0.0 and np.maximum.reduce(c, axis=None) <= 1.0):
            return _schedule(c, None, view.sps, early_stop, view.prefill_tokens, view.max_batch_tokens,
                             view.draft_overhead_s, view.no_draft_pass_s)
    return hardware_aware_prefix_scheduler(c, view.sps, early_stop=early_stop, prefill_tokens=view.prefill_tokens,
                                           max_batch_tokens=view.max_batch_tokens, overhead_s=view.draft_overhead_s,
                                           no_draft_pass_s=view.no_draft_pass_s)


# ------------------------------------------------------------------------------------ policies
class DSparkParams(PolicyParams):
    """Parameters of ``dspark``.

    Attributes:
        gamma: draft tokens proposed per request per round (block size), 1..64.
        early_stop: stop at the first non-improving candidate (the paper's Algorithm 1); False
            (the default, as the production scheduler of section 5.2 does on a profiled table)
            runs the global search, which a jagged measured SPS(B) cannot trap below a cliff.
        fallback: decode plainly while drafting does not pay (:class:`FallbackGate`).
        probe_every: while falling back, draft again every this many rounds.

    Source:
        DSpark paper (Cheng et al. 2026) Algorithm 1 and Appendix A (why early stop matters).
    """

    gamma: int = Field(7, ge=1, le=64, description="draft tokens proposed per request (block size)")
    early_stop: bool = Field(False, description="stop at the first non-improving candidate (Algorithm 1); "
                             "default: the global search production engines run on a profiled table")
    fallback: bool = Field(True, **FALLBACK_FIELD)
    probe_every: int = Field(16, **PROBE_FIELD)


@register("dspark")
class DSparkPolicy(FallbackGated, Policy):
    """DSpark's hardware-aware prefix scheduler (paper Algorithm 1), synchronous.

    Drafts ``gamma`` tokens per request, then verifies the prefix set that maximises the expected
    token rate, counting this round's drafting time as fixed overhead of the step.

    Source:
        Cheng et al. 2026 (DSpark), Algorithm 1 and section 3.2.
    """

    Params = DSparkParams
    plans_in_critical_path = True

    def __init__(self, params: DSparkParams) -> None:
        super().__init__(params)
        self._gate = FallbackGate(params.fallback, params.probe_every)

    @property
    def draft_len(self) -> int:
        """``gamma``: draft tokens proposed per request per round."""
        return self.params.gamma

    def plan(self, view: RoundView) -> RoundPlan:
        """Run :func:`hardware_aware_prefix_scheduler` on this round.

        Args:
            view: the round (confidences ``(R, L)``, SPS table, prefill, token cap, drafting
                time in s).

        Returns:
            The plan with the scheduler's lengths, ``theta`` and ``theta_global`` (tok/s).

        Raises:
            InvalidArgumentError: as :func:`hardware_aware_prefix_scheduler`.

        Source:
            DSpark paper (Cheng et al. 2026) Algorithm 1.
        """
        res = _plan_round(view, self.params.early_stop)
        self._report(int(view.round_index), res.theta, res.theta_global, plain_rate(view))
        return RoundPlan(res.lengths, theta=res.theta, theta_global=res.theta_global)

    def _report(self, round_index: int, theta: float, theta_global: float, plain_tok_s: float) -> None:
        # the fallback gate learns from the best rate the scan found against plain decoding
        self._gate.report(round_index, theta_global if math.isfinite(theta_global) else theta, plain_tok_s)

    def plan_round(self, confidences: np.ndarray, sps: SPSTable, prefill_tokens: int, max_batch_tokens: int,
                   draft_overhead_s: float, round_index: int,
                   no_draft_pass_s: float | None) -> tuple[np.ndarray, float, float]:
        """:meth:`plan` without the view: the compiled scan straight on the engine's round (the
        same result; without the kernels, or on anything the scan refuses, :meth:`plan`, whose
        checks raise the public one-line errors).

        Returns:
            ``(lengths, theta, theta_global)``.
        """
        res = None
        if (type(self).plan is DSparkPolicy.plan  # a subclass's own plan runs as such
                and 0.0 <= draft_overhead_s < math.inf and confidences.shape[0] + prefill_tokens <= max_batch_tokens
                and (no_draft_pass_s is None or 0.0 < no_draft_pass_s < math.inf)):  # the view's checks
            res = _compiled_scan(confidences, sps, self.params.early_stop, prefill_tokens, max_batch_tokens,
                                 draft_overhead_s, no_draft_pass_s)
        if res is not None:
            lengths, theta, _, _, theta_global, _ = res
            self._report(round_index, theta, theta_global,
                         plain_rate_of(confidences.shape[0], prefill_tokens, sps, no_draft_pass_s))
            return lengths, theta, theta_global
        return super().plan_round(confidences, sps, prefill_tokens, max_batch_tokens, draft_overhead_s, round_index,
                                  no_draft_pass_s)


class DSparkAsyncParams(PolicyParams):
    """Parameters of ``dspark_async``.

    Attributes:
        gamma: draft tokens proposed per request per round (block size), 1..64.
        lag_rounds: engine rounds between computing the capacity K and using it, 0..1024
            (the paper's production scheduler: 2).

    Source:
        DSpark paper (Cheng et al. 2026) section 5.2 (capacity from confidences two steps earlier).
    """

    gamma: int = Field(7, **GAMMA_FIELD)
    lag_rounds: int = Field(2, ge=0, le=1024,
                            description="engine rounds between computing the capacity K and using it")


@register("dspark_async")
class DSparkAsyncPolicy(Policy):
    """DSpark's asynchronous production scheduler (paper section 5.2).

    Each round t:

    1. run the *global* search (Algorithm 1 without early stop) on round t's confidences, with
       this round's prefill, token cap and drafting overhead, and remember its capacity
       ``K_t`` = number of admitted candidates (draft tokens, bonus excluded);
    2. take the capacity of ``lag_rounds`` rounds earlier, ``K_{t-lag}`` (the engine must know
       the next batch size before the current step ends: zero-overhead scheduling);
    3. admit round t's top ``min(K_{t-lag}, R*gamma, budget)`` candidates ranked by the current
       ``a[r, j]`` (ties by request then position), ``budget = max_batch_tokens - R - prefill``.

    Rounds are identified by ``view.round_index``: the capacity used at round t is the latest
    one computed at a round ``<= t - lag_rounds``. A round in which the policy was not consulted
    (no decoding requests, hence no confidences) leaves no capacity, so the one before it stays
    in force. **Warm-up:** while no capacity that old exists (the first ``lag_rounds`` rounds of
    a run), the capacity is 0 and nothing is verified: the next batch size must be known before
    the current step ends, and no earlier step has produced one (section 5.2).
    A ``round_index`` lower than the previous call's starts a new run (history cleared).

    The policy is stateful: use one instance per run.

    ``RoundPlan.theta`` is the expected rate of the admitted set,
    ``(R + sum admitted a) / (draft_overhead_s + pass_time(B))`` (tokens/s; NaN if the table
    cannot price B); ``theta_global`` is the global search's best rate this round.
    ``extra`` holds ``capacity_now`` (K_t) and ``capacity_used`` (the lagged K, before capping).

    Raises (from :meth:`plan`):
        InvalidArgumentError: confidences not (R, <=gamma) in [0, 1]; anchors plus prefill above the cap;
            an SPS table that does not cover the search (see the prefix scheduler).

    Source: Cheng et al. 2026 (DSpark), section 5.2 (production scheduler: capacity from a global
    search over confidences of two steps earlier, top-K of the current step) and Algorithm 1.
    """

    Params = DSparkAsyncParams

    def __init__(self, params: DSparkAsyncParams) -> None:
        super().__init__(params)
        self._history: deque[tuple[int, int]] = deque()  # (round_index, K), increasing index

    @property
    def draft_len(self) -> int:
        """``gamma``: draft tokens proposed per request per round."""
        return self.params.gamma

    def reset(self) -> None:
        """Forget the capacity history (start of a new run)."""
        self._history.clear()

    def _lagged_capacity(self, t: int) -> int | None:
        """Latest remembered K from a round ``<= t - lag`` (None during warm-up); drops entries
        older than it, which later rounds can no longer need."""
        limit = t - self.params.lag_rounds
        found = None
        while self._history and self._history[0][0] <= limit:
            if len(self._history) >= 2 and self._history[1][0] <= limit:
                self._history.popleft()
                continue
            found = self._history[0][1]
            break
        return found

    def plan(self, view: RoundView) -> RoundPlan:
        """Steps 1-3 of the class docstring for round ``view.round_index``.

        Args:
            view: the round.

        Returns:
            The plan: top-``K`` lengths, ``theta`` (tok/s, NaN if B cannot be priced),
            ``theta_global`` and ``extra`` (``capacity_now``, ``capacity_used``).

        Raises:
            InvalidArgumentError: as listed in the class docstring.

        Source:
            DSpark paper (Cheng et al. 2026) section 5.2.
        """
        gamma = self.params.gamma
        a = survival(view, gamma)
        budget = draft_budget(view)
        t = int(view.round_index)
        if self._history and t < self._history[-1][0]:
            self.reset()

        res = _plan_round(view, False)
        k_now = res.num_candidates

        k_lag = self._lagged_capacity(t) if self.params.lag_rounds > 0 else k_now
        if k_lag is None:  # warm-up: no capacity lag_rounds old yet -> verify nothing (section 5.2)
            k_lag = 0
        if self._history and self._history[-1][0] == t:
            self._history[-1] = (t, k_now)
        else:
            self._history.append((t, k_now))

        lengths, sum_a = take_top(a, min(k_lag, a.size, budget))
        n = int(lengths.sum())
        return RoundPlan(lengths, theta=expected_rate(view, sum_a, n), theta_global=float(res.theta_global),
                         extra={"capacity_now": int(k_now), "capacity_used": int(k_lag)})

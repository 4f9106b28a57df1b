"""Algorithm 1's fast formulation (policies/dspark.py ``_schedule``: ufunc calls, no np.*
wrappers, rows recovered only for the admitted prefix) against the plain numpy formulation the
engine ran before issue 13's last speed pass, written out here: on random rounds with ties,
ragged rows, token caps, overheads and a separately priced plain pass, the same lengths and
bit-identical Theta, tau and B (a speed change must not change an answer).
"""

from __future__ import annotations

import numpy as np
import pytest

from memtp_sim.hardware import SPSTable
from memtp_sim.policies.dspark import _schedule


def numpy_scan(vals, mask, times, n_cap, overhead_s, no_draft_pass_s, early_stop):
    """Algorithm 1 as vectorised numpy (the pre-kernel engine code), on a times array that covers
    the whole scan. Returns (lengths, theta, tau, n_star, g_star, theta_g)."""
    num_req, width = vals.shape
    if mask is None:
        a = np.cumprod(vals, axis=1).ravel()
        order = np.argsort(-a, kind="stable")
        a_sorted, r_sorted = a[order], order // width
    else:
        surv = np.cumprod(np.where(mask, vals, 1.0), axis=1)
        rows, cols = np.nonzero(mask)
        a = surv[rows, cols]
        order = np.lexsort((cols, rows, -a))
        a_sorted, r_sorted = a[order], rows[order]
    n_max = min(int(np.count_nonzero(a_sorted > 0.0)), n_cap)
    tau = np.empty(n_max + 1)
    tau[0] = 0.0
    np.cumsum(a_sorted[:n_max], out=tau[1:])
    tau += num_req
    t = times[: n_max + 1].copy()
    if no_draft_pass_s is not None:
        t[0] = no_draft_pass_s
    theta = tau / (overhead_s + t)
    if early_stop:
        worse = np.flatnonzero(theta[1:] <= theta[:-1])
        n_star = int(worse[0]) if worse.size else n_max
    else:
        n_star = int(np.argmax(theta))
    lengths = np.bincount(r_sorted[:n_star], minlength=num_req)
    g_star = int(np.argmax(theta))
    return lengths, theta[n_star], tau[n_star], n_star, g_star, theta[g_star]


def random_round(rng, max_req=12):
    num_req, width = int(rng.integers(1, max_req)), int(rng.integers(1, 9))
    if rng.random() < 0.5:  # coarse values: many exact ties across and within requests
        vals = rng.integers(0, 5, size=(num_req, width)) / 4.0
    else:
        vals = rng.random((num_req, width))
    mask = None
    if rng.random() < 0.4:
        lens = rng.integers(0, width + 1, size=num_req)
        mask = np.arange(width)[None, :] < lens[:, None]
        if mask.all():
            mask = None
    n_cap = int(rng.integers(0, num_req * width + 1)) if rng.random() < 0.3 else num_req * width
    # a pass time that falls, then rises (a cliff somewhere), never below 1 ms
    b = np.arange(num_req * width + 1)
    times = 0.010 + 0.0004 * b + 0.003 * (b > rng.integers(0, num_req * width + 1)) - 0.002 * np.exp(-b / 3.0)
    overhead_s = float(rng.choice([0.0, 0.002, 0.02]))
    no_draft = float(times[0] * 0.9) if rng.random() < 0.3 else None
    return vals, mask, times, n_cap, overhead_s, no_draft


@pytest.mark.parametrize("early_stop", [True, False])
@pytest.mark.parametrize("max_req", [12, 140])  # 140: merges of many rows, odd counts at every level
def test_fast_scan_matches_the_numpy_algorithm_on_random_rounds(early_stop, max_req):
    rng = np.random.default_rng(13 + max_req)
    for _ in range(400 if max_req == 12 else 100):
        vals, mask, times, n_cap, overhead_s, no_draft = random_round(rng, max_req)
        num_req = vals.shape[0]
        # a table whose pass time at B = num_req + i is times[i] (B below num_req: the first value)
        table = SPSTable.from_mapping({b: 1.0 / times[max(0, b - num_req)] for b in range(1, num_req + times.size)})
        times = table.pass_time_range_s(num_req, num_req + times.size - 1)  # as the table prices them
        want = numpy_scan(vals, mask, times, n_cap, overhead_s, no_draft, early_stop)
        got = _schedule(vals, mask, table, early_stop, 0, num_req + n_cap, overhead_s, no_draft)
        assert got.lengths.dtype == np.int64 and got.lengths.tolist() == want[0].tolist()
        assert (got.theta, got.tau, got.batch_tokens - num_req) == (want[1], want[2], want[3])  # bit for bit
        assert (got.theta_global, got.batch_tokens_global - num_req) == (want[5], want[4])
        if mask is not None:  # padding is never verified
            assert np.all(got.lengths <= mask.sum(axis=1))

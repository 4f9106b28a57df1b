"""Tests for the confidence-ranked rivals of DSpark: dspark_async, threshold, goodput.

Oracles are hand-derived (arithmetic in the comments), the prefix scheduler's own global search
(for dspark_async with unchanging confidences: DSpark section 5.2 says the async scheduler only
lags the capacity, so with nothing changing it must agree), and the budget / range invariants
every plan must keep. Confidences 1.0 / 0.0 and products of "nice" binary fractions are used where
exact floating-point ties matter.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

import memtp_sim
from memtp_sim.config import Scenario
from memtp_sim.hardware import SPSTable
from memtp_sim.policies import (
    DSparkAsyncPolicy,
    GoodputPolicy,
    RoundView,
    ThresholdPolicy,
    make_policy,
)
from memtp_sim.policies import hardware_aware_prefix_scheduler

TRACE = Path(__file__).parents[1] / "data" / "traces" / "azure2023_conv.csv"

# SPS (steps/s) falling by 10 per token from B = 2: Theta = tau * SPS(B) is easy by hand.
# pass times 10, 10, 11.1, 12.5, 14.3, 16.7, 20, 25 ms.
STEP_TABLE = SPSTable.from_mapping({1: 100, 2: 100, 3: 90, 4: 80, 5: 70, 6: 60, 7: 50, 8: 40})


def view(conf, sps=STEP_TABLE, *, prefill=0, max_batch=8, overhead=0.0, t=0) -> RoundView:
    return RoundView(confidences=np.asarray(conf, dtype=np.float64), sps=sps, prefill_tokens=prefill,
                     max_batch_tokens=max_batch, draft_overhead_s=overhead, round_index=t)


def check_plan(plan, v: RoundView, gamma: int) -> None:
    """The contract of every plan (base.RoundPlan docstring)."""
    lengths = np.asarray(plan.lengths)
    assert lengths.shape == (v.num_requests,)
    assert np.issubdtype(lengths.dtype, np.integer)
    assert (lengths >= 0).all() and (lengths <= gamma).all()
    assert v.num_requests + int(lengths.sum()) + v.prefill_tokens <= v.max_batch_tokens


# ============================================================================ dspark_async


def test_dspark_async_equals_global_search_when_confidences_are_constant():
    # A jagged table with a cliff after B = 12 and a partial recovery at 24: the global search
    # (no early stop) is the reference. Same confidences every round -> K_{t-2} == K_t from round 2
    # on, and the top-K of the same ranking is the global search's own set; rounds 0 and 1 are the
    # warm-up (no capacity two rounds old yet: verify nothing).
    sps = SPSTable.from_mapping({1: 50, 8: 48, 12: 46, 13: 30, 20: 29, 24: 31, 32: 20, 64: 10})
    conf = np.array([
        [0.95, 0.9, 0.9, 0.85, 0.8, 0.8, 0.7],
        [0.6, 0.5, 0.9, 0.9, 0.9, 0.9, 0.9],
        [0.99, 0.99, 0.98, 0.97, 0.96, 0.95, 0.94],
        [0.3, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9],
    ])
    for prefill, max_batch, overhead in [(0, 64, 0.0), (5, 40, 0.004), (3, 20, 0.01)]:
        ref = hardware_aware_prefix_scheduler(conf, sps, early_stop=False, prefill_tokens=prefill,
                                              max_batch_tokens=max_batch, overhead_s=overhead)
        pol = make_policy("dspark_async", {"gamma": 7})
        for t in range(5):
            v = view(conf, sps, prefill=prefill, max_batch=max_batch, overhead=overhead, t=t)
            plan = pol.plan(v)
            check_plan(plan, v, 7)
            if t < 2:
                assert plan.lengths.tolist() == [0, 0, 0, 0], (prefill, t)
                continue
            assert plan.lengths.tolist() == ref.lengths.tolist(), (prefill, t)
            assert plan.theta == pytest.approx(ref.theta, rel=1e-12)


def test_dspark_async_global_search_is_not_trivial_here():
    # Guard for the test above: with the first setting the global search neither admits nothing
    # nor everything, so equality is a real check.
    sps = SPSTable.from_mapping({1: 50, 8: 48, 12: 46, 13: 30, 20: 29, 24: 31, 32: 20, 64: 10})
    conf = np.array([[0.95, 0.9, 0.9, 0.85, 0.8, 0.8, 0.7], [0.6, 0.5, 0.9, 0.9, 0.9, 0.9, 0.9],
                     [0.99, 0.99, 0.98, 0.97, 0.96, 0.95, 0.94], [0.3, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9]])
    n = hardware_aware_prefix_scheduler(conf, sps, early_stop=False, max_batch_tokens=64).num_candidates
    assert 0 < n < 28


# Rounds of the lag test. STEP_TABLE, overhead 0 -> Theta(B) = tau * SPS(B).
#
# Warm-up (section 5.2): until a capacity from lag_rounds rounds earlier exists, K = 0 (verify
# nothing). A zero-survival draft is never admitted (Algorithm 1, line 4).
# t=0  R=2, c all 1 -> every a = 1, tau = B: B*SPS = 200,270,320,350,360,350,320 (B=2..8)
#      -> K0 = 4 (B=6). Warm-up: K = 0 -> [0, 0].
# t=1  R=2, c=[[1,0,0],[0,0,0]] -> a=[[1,0,0],[0,0,0]]: one positive candidate: B2 2*100=200,
#      B3 3*90=270 -> K1 = 1. Warm-up: K = 0 -> [0, 0].
# t=2  R=1, c=[[1,1,0]] -> a=[1,1,0]. Uses K0=4, capped at the 2 positive candidates -> [2].
#      K2: B1 100, B2 200, B3 270 -> K2 = 2.
# t=3  R=2, c=[[.5,.5,.5],[.9,.9,.9]] -> a0=.5,.25,.125; a1=.9,.81,.729. Uses K1=1 -> (1,0) -> [0, 1].
#      K3: sorted .9,.81,.729,.5,.25,.125; tau 2.9,3.71,4.439,4.939,5.189,5.314 at B=3..8
#      -> 261, 296.8, 310.73, 296.34, 259.45, 212.56 (B2: 200) -> K3 = 3.
# t=4  R=2, c=[[.8,.5,1],[.7,1,.2]] -> a0=.8,.4,.4; a1=.7,.7,.14. Uses K2=2 -> (0,0),(1,0) -> [1, 1].
#      K4: tau 2.8,3.5,4.2,4.6,5.0,5.14 -> 252, 280, 294, 276, 250, 205.6 -> K4 = 3.
# t=5  R=3, prefill 1, cap 5 -> budget 5-3-1 = 1. Uses K3=3, capped at 1:
#      c rows .6/.95/.7 (constant) -> top-1 is (1,0) a=.95 -> [0, 1, 0].
#      K5: base B=4, one candidate at most: B4 3*80=240, B5 3.95*70=276.5 -> K5 = 1.
# t=6  R=2, c=[[.3,1,1],[.6,.5,1]] -> a0=.3,.3,.3; a1=.6,.3,.3 (0.6*0.5 == 0.3 exactly in binary).
#      Uses K4=3 -> (1,0) then ties at .3 by request then position: (0,0),(0,1) -> [2, 1].
#      K6: tau 2.6,2.9,3.2,3.5,3.8,4.1 -> 234, 232, 224, 210, 190, 164 -> K6 = 1.
# t=7  R=2, c=[[.2]*3,[.1]*3] -> a0=.2,.04,.008; a1=.1,.01,.001. Uses K5=1 (computed with R=3 and
#      a tight cap) -> (0,0) -> [1, 0]. K7: B2 200, B3 2.2*90=198 -> K7 = 0.
LAG_ROUNDS = [
    # (confidences, prefill, max_batch, expected lengths, K used, K now, positive candidates, budget)
    ([[1, 1, 1], [1, 1, 1]], 0, 8, [0, 0], 0, 4, 6, 6),
    ([[1, 0, 0], [0, 0, 0]], 0, 8, [0, 0], 0, 1, 1, 6),
    ([[1, 1, 0]], 0, 8, [2], 4, 2, 2, 7),
    ([[.5, .5, .5], [.9, .9, .9]], 0, 8, [0, 1], 1, 3, 6, 6),
    ([[.8, .5, 1], [.7, 1, .2]], 0, 8, [1, 1], 2, 3, 6, 6),
    ([[.6, .6, .6], [.95, .95, .95], [.7, .7, .7]], 1, 5, [0, 1, 0], 3, 1, 9, 1),
    ([[.3, 1, 1], [.6, .5, 1]], 0, 8, [2, 1], 3, 1, 6, 6),
    ([[.2, .2, .2], [.1, .1, .1]], 0, 8, [1, 0], 1, 0, 6, 6),
]


def test_dspark_async_uses_capacity_from_two_rounds_earlier():
    pol = make_policy("dspark_async", {"gamma": 3})  # lag_rounds defaults to 2
    for t, (conf, prefill, cap, expected, k_used, k_now, cands, budget) in enumerate(LAG_ROUNDS):
        v = view(conf, prefill=prefill, max_batch=cap, t=t)
        plan = pol.plan(v)
        check_plan(plan, v, 3)
        assert int(plan.lengths.sum()) == min(k_used, cands, budget), t
        assert plan.lengths.tolist() == expected, t
        assert plan.extra["capacity_now"] == k_now, t
        assert plan.extra["capacity_used"] == k_used, t


def test_dspark_async_differs_from_sync_global_search_when_confidences_change():
    # t=3 above: the round's own global search admits 3 (K3), the async plan admits K1 = 1.
    pol = make_policy("dspark_async", {"gamma": 3})
    plans = [pol.plan(view(c, prefill=p, max_batch=m, t=t)) for t, (c, p, m, *_) in enumerate(LAG_ROUNDS[:4])]
    ref = hardware_aware_prefix_scheduler(LAG_ROUNDS[3][0], STEP_TABLE, early_stop=False, max_batch_tokens=8)
    assert ref.lengths.tolist() == [0, 3]  # .9,.81,.729 of request 1 (hand: K3 = 3)
    assert plans[3].lengths.tolist() == [0, 1]


def test_dspark_async_lag_one_and_zero():
    # lag 1 on the first three rounds above: t=0 warm-up K=0 -> [0,0]; t=1 uses K0=4 on
    # a=[[1,0,0],[0,0,0]] -> (0,0) only (zeros are never candidates) -> [1,0];
    # t=2 uses K1=1 on a=[1,1,0] -> [1].
    pol = make_policy("dspark_async", {"gamma": 3, "lag_rounds": 1})
    got = [pol.plan(view(c, prefill=p, max_batch=m, t=t)).lengths.tolist()
           for t, (c, p, m, *_) in enumerate(LAG_ROUNDS[:3])]
    assert got == [[0, 0], [1, 0], [1]]
    # lag 0: every round is its own global search: K0=4 -> [3,1]; K1=1 -> [1,0]; K2=2 -> [2].
    pol = make_policy("dspark_async", {"gamma": 3, "lag_rounds": 0})
    got = [pol.plan(view(c, prefill=p, max_batch=m, t=t)).lengths.tolist()
           for t, (c, p, m, *_) in enumerate(LAG_ROUNDS[:3])]
    assert got == [[3, 1], [1, 0], [2]]


def test_dspark_async_round_gap_keeps_latest_old_capacity():
    # Rounds 0 and 1 consulted (K0=4, K1=1); rounds 2..4 had no decoding requests (policy not
    # called); at t=5 the latest capacity from a round <= 3 is K1 = 1 -> top-1 of [1,1,0] -> [1].
    pol = make_policy("dspark_async", {"gamma": 3})
    pol.plan(view(LAG_ROUNDS[0][0], t=0))
    pol.plan(view(LAG_ROUNDS[1][0], t=1))
    assert pol.plan(view([[1, 1, 0]], t=5)).lengths.tolist() == [1]


def test_dspark_async_new_run_restarts_warm_up():
    # round_index going back to 0 = a new run: warm-up again, so t=0 and t=1 verify nothing and
    # t=2 uses the new run's K0 = 4 (not the old run's K1 = 1) -> [3, 1] on all-ones.
    pol = make_policy("dspark_async", {"gamma": 3})
    pol.plan(view(LAG_ROUNDS[0][0], t=0))
    pol.plan(view(LAG_ROUNDS[1][0], t=1))
    assert pol.plan(view(LAG_ROUNDS[0][0], t=0)).lengths.tolist() == [0, 0]
    assert pol.plan(view(LAG_ROUNDS[1][0], t=1)).lengths.tolist() == [0, 0]
    assert pol.plan(view(LAG_ROUNDS[0][0], t=2)).lengths.tolist() == [3, 1]


def test_dspark_async_theta_is_rate_of_chosen_set():
    # t=3 of LAG_ROUNDS with K1 = 1: admitted a = .9 -> tau = 2.9, B = 3 -> 2.9 * 90 = 261 tok/s.
    pol = make_policy("dspark_async", {"gamma": 3})
    plans = [pol.plan(view(c, prefill=p, max_batch=m, t=t)) for t, (c, p, m, *_) in enumerate(LAG_ROUNDS[:4])]
    assert plans[3].theta == pytest.approx(261.0, rel=1e-9)
    # theta_global: round 3's own global best, 310.73 (B = 5, hand-derived above).
    assert plans[3].theta_global == pytest.approx(310.73, rel=1e-9)


# ============================================================================== threshold

C_ROW = [0.9, 0.8, 0.5]  # a = 0.9, 0.72, 0.36


@pytest.mark.parametrize("t, expected", [
    (0.7, 2),    # 0.9 >= .7, 0.72 >= .7, 0.36 < .7
    (0.95, 0),   # 0.9 < .95
    (0.0, 3),    # everything >= 0 -> gamma
    (0.3, 3),    # 0.36 >= .3
    (0.8, 1),    # 0.9 >= .8, 0.72 < .8
])
def test_threshold_hand_cases(t, expected):
    pol = make_policy("threshold", {"gamma": 3, "threshold": t})
    v = view([C_ROW], max_batch=100)
    plan = pol.plan(v)
    check_plan(plan, v, 3)
    assert plan.lengths.tolist() == [expected]


def test_threshold_defaults_and_row_independence():
    # default t = 0.5, gamma = 7. Rows: a = .9,.72,.36 (-> 2); c = 1 everywhere (a = 1 -> 7 but
    # gamma 7 draws 7 positions); c = .4 first (-> 0).
    pol = make_policy("threshold", {})
    assert pol.draft_len == 7
    conf = [C_ROW + [1.0] * 4, [1.0] * 7, [0.4] + [1.0] * 6]
    assert pol.plan(view(conf, max_batch=100)).lengths.tolist() == [2, 7, 0]


def test_threshold_trims_lowest_confidence_first():
    # Row 0: a = .9, .72, .36; row 1: c = .8,.5,.5 -> a = .8, .4, .2. t = .3 selects
    # .9,.72,.36 | .8,.4 -> [3, 2] (5 drafts). Cap 5 with R = 2 -> budget 3: keep .9, .8, .72
    # -> [2, 1]. Budget 4: keep also .4 -> [2, 2].
    pol = make_policy("threshold", {"gamma": 3, "threshold": 0.3})
    conf = [C_ROW, [0.8, 0.5, 0.5]]
    assert pol.plan(view(conf, max_batch=100)).lengths.tolist() == [3, 2]
    assert pol.plan(view(conf, max_batch=5)).lengths.tolist() == [2, 1]
    assert pol.plan(view(conf, max_batch=6)).lengths.tolist() == [2, 2]
    # prefill takes budget first: cap 6, prefill 3 -> budget 1 -> only .9 -> [1, 0].
    assert pol.plan(view(conf, prefill=3, max_batch=6)).lengths.tolist() == [1, 0]


def test_threshold_trim_ties_by_request_then_position():
    # a = .5,.5 | .5,.5 (c = .5, 1): all selected at t = .5; budget 3 keeps (0,0),(0,1),(1,0).
    pol = make_policy("threshold", {"gamma": 2, "threshold": 0.5})
    assert pol.plan(view([[0.5, 1.0], [0.5, 1.0]], max_batch=5)).lengths.tolist() == [2, 1]


# ================================================================================ goodput

GP_CONF = [[0.9, 0.5], [0.7, 0.5]]  # a0 = .9, .45 ; a1 = .7, .35
# tau_0 = 2, tau_1 = 2 + .9 + .7 = 3.6, tau_2 = 3.6 + .45 + .35 = 4.4 ; B_k = 2 + 2k = 2, 4, 6


def test_goodput_hand_case_no_overhead():
    # SPS 100, 80, 60 at B = 2, 4, 6: rates 2*100 = 200, 3.6*80 = 288, 4.4*60 = 264 -> k = 1.
    sps = SPSTable.from_mapping({2: 100, 4: 80, 6: 60})
    plan = make_policy("goodput", {"gamma": 2}).plan(view(GP_CONF, sps, max_batch=6))
    assert plan.lengths.tolist() == [1, 1]
    assert plan.theta == pytest.approx(288.0, rel=1e-9)


def test_goodput_overhead_favours_longer_k():
    # overhead 50 ms; pass 10, 12.5, 16.667 ms: 2/.06 = 33.3, 3.6/.0625 = 57.6, 4.4/.066667 = 66.0
    # -> k = 2.
    sps = SPSTable.from_mapping({2: 100, 4: 80, 6: 60})
    plan = make_policy("goodput", {"gamma": 2}).plan(view(GP_CONF, sps, max_batch=6, overhead=0.05))
    assert plan.lengths.tolist() == [2, 2]
    assert plan.theta == pytest.approx(66.0, rel=1e-9)
    # Same, but cap 5: B_2 = 6 > 5 is skipped -> k = 1 (57.6).
    plan = make_policy("goodput", {"gamma": 2}).plan(view(GP_CONF, sps, max_batch=5, overhead=0.05))
    assert plan.lengths.tolist() == [1, 1]
    assert plan.theta == pytest.approx(57.6, rel=1e-9)


def test_goodput_k0_wins_when_sps_falls_steeply():
    # SPS 100, 40, 20: rates 200, 3.6*40 = 144, 4.4*20 = 88 -> k = 0.
    sps = SPSTable.from_mapping({2: 100, 4: 40, 6: 20})
    plan = make_policy("goodput", {"gamma": 2}).plan(view(GP_CONF, sps, max_batch=6))
    assert plan.lengths.tolist() == [0, 0]
    assert plan.theta == pytest.approx(200.0, rel=1e-9)


def test_goodput_tie_goes_to_smaller_k():
    # R = 1, c = 1: rate_0 = 1 * 100 = 100, rate_1 = 2 * 50 = 100 (pass 10 ms vs 20 ms) -> k = 0.
    sps = SPSTable.from_mapping({1: 100, 2: 50})
    plan = make_policy("goodput", {"gamma": 1}).plan(view([[1.0]], sps, max_batch=2))
    assert plan.lengths.tolist() == [0]


def test_goodput_counts_prefill_in_batch():
    # prefill 2: B_k = 4 + 2k = 4, 6, 8. SPS 80, 60, 30 -> 2*80 = 160, 3.6*60 = 216, 4.4*30 = 132
    # -> k = 1 (without prefill the B would be 2, 4, 6 and priced differently).
    sps = SPSTable.from_mapping({2: 100, 4: 80, 6: 60, 8: 30})
    plan = make_policy("goodput", {"gamma": 2}).plan(view(GP_CONF, sps, prefill=2, max_batch=8))
    assert plan.lengths.tolist() == [1, 1]
    assert plan.theta == pytest.approx(216.0, rel=1e-9)


# ============================================================================ budget property

BIG_TABLE = SPSTable.from_mapping({1: 60, 4: 59, 16: 55, 17: 40, 33: 38, 64: 30, 65: 20, 128: 12})


@st.composite
def rounds(draw):
    gamma = draw(st.integers(1, 8))
    out = []
    for t in range(draw(st.integers(1, 5))):
        r = draw(st.integers(0, 6))
        conf = np.array(draw(st.lists(st.floats(0.0, 1.0), min_size=r * gamma, max_size=r * gamma)),
                        dtype=np.float64).reshape(r, gamma)
        prefill = draw(st.integers(0, 12))
        extra = draw(st.integers(0, r * gamma + 3))
        overhead = draw(st.sampled_from([0.0, 0.003, 0.05]))
        out.append(RoundView(conf, BIG_TABLE, prefill, r + prefill + extra, overhead, t))
    return gamma, out


@pytest.mark.parametrize("name, extra", [("dspark_async", {}), ("threshold", {"threshold": 0.3}),
                                         ("threshold", {"threshold": 0.0}), ("goodput", {})])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=rounds())
def test_every_policy_respects_budget_and_range(name, extra, case):
    gamma, views = case
    pol = make_policy(name, {"gamma": gamma, **extra})
    for v in views:
        check_plan(pol.plan(v), v, gamma)


@settings(max_examples=100, deadline=None)
@given(case=rounds())
def test_dspark_async_admits_exactly_the_capped_lagged_capacity(case):
    # sum(lengths) == min(K_{t-2} (0 in warm-up), positive candidates, budget), with K_t taken from
    # the global search itself (the reference, not the policy).
    gamma, views = case
    pol = make_policy("dspark_async", {"gamma": gamma})
    ks = []
    for t, v in enumerate(views):
        k_t = hardware_aware_prefix_scheduler(v.confidences, v.sps, early_stop=False,
                                              prefill_tokens=v.prefill_tokens,
                                              max_batch_tokens=v.max_batch_tokens,
                                              overhead_s=v.draft_overhead_s).num_candidates
        ks.append(k_t)
        k_used = ks[t - 2] if t >= 2 else 0
        budget = v.max_batch_tokens - v.num_requests - v.prefill_tokens
        plan = pol.plan(v)
        positive = int(np.count_nonzero(np.cumprod(v.confidences, axis=1) > 0))
        assert int(plan.lengths.sum()) == min(k_used, positive, budget)
        # prefix property of the admitted set: every admitted a is >= every non-admitted a
        a = np.cumprod(v.confidences, axis=1)
        taken = np.arange(gamma)[None, :] < plan.lengths[:, None]
        if taken.any() and (~taken).any():
            assert a[taken].min() >= a[~taken].max()


# ============================================================================== bad params


@pytest.mark.parametrize("name, params", [
    ("threshold", {"threshold": 1.5}),
    ("threshold", {"threshold": -0.1}),
    ("threshold", {"gamma": 0}),
    ("threshold", {"thresh": 0.5}),
    ("goodput", {"gamma": 0}),
    ("goodput", {"k": 3}),
    ("dspark_async", {"gamma": 0}),
    ("dspark_async", {"lag_rounds": -1}),
    ("dspark_async", {"early_stop": True}),
])
def test_bad_params_raise_validation_error(name, params):
    with pytest.raises(ValidationError):
        make_policy(name, params)


def test_registered_classes_and_defaults():
    assert isinstance(make_policy("dspark_async"), DSparkAsyncPolicy)
    assert isinstance(make_policy("threshold"), ThresholdPolicy)
    assert isinstance(make_policy("goodput"), GoodputPolicy)
    p = make_policy("dspark_async")
    assert (p.params.gamma, p.params.lag_rounds, p.draft_len) == (7, 2, 7)
    p = make_policy("threshold")
    assert (p.params.gamma, p.params.threshold) == (7, 0.5)
    assert make_policy("goodput").draft_len == 7


def test_bad_views_raise():
    pol = make_policy("threshold", {"gamma": 2})
    with pytest.raises(ValueError, match="gamma"):
        pol.plan(view([[0.5, 0.5, 0.5]], max_batch=10))  # wider than gamma
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        pol.plan(view([[1.5, 0.5]], max_batch=10))
    with pytest.raises(ValueError, match="max_batch_tokens"):
        pol.plan(view([[0.5, 0.5]], prefill=5, max_batch=4))  # 1 anchor + 5 prefill > 4


# ============================================================================ engine smoke


@pytest.mark.parametrize("name", ["dspark_async", "threshold", "goodput"])
def test_engine_smoke(name):
    scen = Scenario.model_validate({
        "workload": {"trace": str(TRACE), "mode": "closed_loop", "concurrency": 4, "num_requests": 30},
        "engine": {"prefill": "disaggregated", "prefill_gpus": 4},
        "policy": {"name": name},
    })
    res = memtp_sim.run(scen, seed=0)
    m = res.metrics
    assert m["num_completed"] == 30 and m["num_rejected"] == 0
    assert (res.state.generated_tokens == res.state.output_tokens).all()
    assert 0.0 <= m["mean_verify_len"] <= 7.0

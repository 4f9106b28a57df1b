"""DSpark Algorithm 1 (``hardware_aware_prefix_scheduler``): worked examples and properties.

Oracles:
* the paper's Appendix A worked example (PAPER_NOTES.md), typed in here;
* hand-derived multi-request cases, the greedy order of the joint survivals a = cumulative
  products and the Theta = tau * SPS(B) sequence worked out in the comments;
* the shipped default profile's measured pass times (typed from the measurements CSV) for the
  seed's "confident request verifies longer than a chatty one" example;
* a brute-force enumeration of every prefix choice (hypothesis), which does not use the greedy
  order at all: for a fixed B the best tau is the best over all prefix choices of that size.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from memtp_sim import SPSTable, hardware_aware_prefix_scheduler

# ------------------------------------------------------------------------------------------
# Paper Appendix A: R = 1, gamma = 2, SPS(1) = 1.0, SPS(2) = 0.5, SPS(3) = 0.45, c = [0.8, 0.9]
# ------------------------------------------------------------------------------------------
APPENDIX_A_SPS = {1: 1.0, 2: 0.5, 3: 0.45}


def test_appendix_a_early_stop_verifies_nothing():
    # Theta0 = 1 * SPS(1) = 1.0; Theta1 = (1 + 0.8) * SPS(2) = 0.9 <= 1.0 -> stop with l = 0.
    r = hardware_aware_prefix_scheduler([[0.8, 0.9]], APPENDIX_A_SPS)
    assert r.lengths.tolist() == [0]
    assert r.theta == pytest.approx(1.0)
    assert r.tau == pytest.approx(1.0)
    assert r.batch_tokens == 1


def test_appendix_a_global_search_verifies_both():
    # a = [0.8, 0.72]; Theta2 = (1 + 0.8 + 0.72) * SPS(3) = 2.52 * 0.45 = 1.134 > Theta0 = 1.0.
    r = hardware_aware_prefix_scheduler([[0.8, 0.9]], APPENDIX_A_SPS, early_stop=False)
    assert r.lengths.tolist() == [2]
    assert r.theta == pytest.approx(2.52 * 0.45)
    assert r.theta == pytest.approx(1.134)
    assert r.tau == pytest.approx(2.52)
    assert r.batch_tokens == 3


def test_appendix_a_early_stop_reports_the_global_optimum_it_missed():
    r = hardware_aware_prefix_scheduler([[0.8, 0.9]], APPENDIX_A_SPS)
    assert r.theta_global == pytest.approx(1.134)
    assert r.batch_tokens_global == 3


def test_appendix_a_retrospective_with_low_c2_verifies_nothing():
    # c2 = 0: a = [0.8, 0]; Theta1 = 0.9, Theta2 = 1.8 * 0.45 = 0.81; max is Theta0 = 1.0 -> l = 0.
    r = hardware_aware_prefix_scheduler([[0.8, 0.0]], APPENDIX_A_SPS, early_stop=False)
    assert r.lengths.tolist() == [0]
    assert r.theta == pytest.approx(1.0)


# ------------------------------------------------------------------------------------------
# The seed's example on the shipped default profile (sps=None)
# ------------------------------------------------------------------------------------------


def test_default_profile_confident_request_verifies_longer_than_chatty():
    # Measured pass times (gfx1151, shisa-v2-llama3.1-8b Q4_K_M, Vulkan AMDVLK, fa=1), ms:
    #   B=1 23.7809, 2 26.6534, 4 32.3816, 8 47.2655; linear in pass time in between:
    #   B=3 29.5175, B=5 36.102575, B=6 39.82355, B=7 43.544525.
    # chatty, c = 0.5: tau = 1, 1.5, 1.75, 1.875 at B = 1..4
    #   Theta (1/ms) = .04205, .05628, .05929, .05790 -> stops after 2 drafts (B = 3).
    # confident, c = 0.95: tau = 1, 1.95, 2.8525, 3.709875, 4.52438, 5.29816, 6.03325, 6.73159
    #   Theta = .0421, .0732, .0966, .1146, .1253, .1330, .1386, .1424 -> rises to B = 8: all 7.
    chatty = hardware_aware_prefix_scheduler([[0.5] * 7])
    confident = hardware_aware_prefix_scheduler([[0.95] * 7])
    assert confident.lengths[0] > chatty.lengths[0]
    assert chatty.lengths.tolist() == [2]
    assert confident.lengths.tolist() == [7]
    assert chatty.theta == pytest.approx(1.75 / 29.5175e-3, rel=1e-6)
    assert confident.theta == pytest.approx(6.7315913742 / 47.2655e-3, rel=1e-6)
    both = hardware_aware_prefix_scheduler([[0.95] * 7, [0.5] * 7])
    assert both.lengths[0] > both.lengths[1]


# ------------------------------------------------------------------------------------------
# Hand-derived multi-request cases
# ------------------------------------------------------------------------------------------


def test_two_requests_greedy_order_across_requests():
    # c0 = [0.9, 0.5] -> a0 = [0.9, 0.45];  c1 = [0.8, 0.8] -> a1 = [0.8, 0.64]
    # greedy order: 0.9 (r0), 0.8 (r1), 0.64 (r1), 0.45 (r0)
    # SPS: B=2 1.0, 3 0.95, 4 0.9, 5 0.8, 6 0.68
    # Theta0 = 2 * 1.0 = 2.0
    # Theta1 = 2.9 * 0.95 = 2.755   keep
    # Theta2 = 3.7 * 0.9  = 3.33    keep
    # Theta3 = 4.34 * 0.8 = 3.472   keep  (request 1's second draft beats request 0's)
    # Theta4 = 4.79 * 0.68 = 3.2572 stop
    sps = {2: 1.0, 3: 0.95, 4: 0.9, 5: 0.8, 6: 0.68}
    for early in (True, False):
        r = hardware_aware_prefix_scheduler([[0.9, 0.5], [0.8, 0.8]], sps, early_stop=early)
        assert r.lengths.tolist() == [1, 2]
        assert r.tau == pytest.approx(4.34)
        assert r.theta == pytest.approx(3.472)
        assert r.batch_tokens == 5


def test_two_requests_stop_after_two_candidates():
    # same confidences; SPS(5) = 0.7 instead: Theta3 = 4.34 * 0.7 = 3.038 < 3.33 -> stop at B = 4.
    # global: Theta4 = 4.79 * 0.68 = 3.2572 < 3.33, so it agrees.
    sps = {2: 1.0, 3: 0.95, 4: 0.9, 5: 0.7, 6: 0.68}
    for early in (True, False):
        r = hardware_aware_prefix_scheduler([[0.9, 0.5], [0.8, 0.8]], sps, early_stop=early)
        assert r.lengths.tolist() == [1, 1]
        assert r.tau == pytest.approx(3.7)
        assert r.theta == pytest.approx(3.33)
        assert r.batch_tokens == 4


def test_tied_candidates_across_requests():
    # c = [[0.5], [0.5]]: two candidates with a = 0.5 (a tie).
    # SPS: B=2 1.0, 3 0.9, 4 0.6. Theta0 = 2; Theta1 = 2.5 * 0.9 = 2.25; Theta2 = 3 * 0.6 = 1.8.
    # Exactly one of the tied requests verifies one token (which one is not part of the contract).
    r = hardware_aware_prefix_scheduler([[0.5], [0.5]], {2: 1.0, 3: 0.9, 4: 0.6})
    assert sorted(r.lengths.tolist()) == [0, 1]
    assert r.tau == pytest.approx(2.5)
    assert r.theta == pytest.approx(2.25)
    assert r.batch_tokens == 3


def test_tied_candidates_within_a_request_keep_prefixes():
    # c0 = [1, 1, 0.5] -> a0 = [1, 1, 0.5];  c1 = [1] -> a1 = [1]. Three candidates tie at a = 1.
    # SPS (steps/s): B=2..4 1000, 5 500, 6 400.
    # Theta0 = 2000, Theta1 = 3000, Theta2 = 4000, Theta3 = 5 * 500 = 2500 (stop), Theta4 = 5.5 * 400.
    # Two of the three tied candidates are admitted, as prefixes: [2, 0] or [1, 1].
    r = hardware_aware_prefix_scheduler([[1.0, 1.0, 0.5], [1.0]], {2: 1000, 3: 1000, 4: 1000, 5: 500, 6: 400})
    assert r.lengths.tolist() in ([2, 0], [1, 1])
    assert r.tau == pytest.approx(4.0)
    assert r.theta == pytest.approx(4000.0)
    assert r.batch_tokens == 4


def test_equal_theta_is_not_an_improvement():
    # Exact binary pass times: B=1 1.0 s, B=2 1.5 s; c = [0.5].
    # Theta0 = 1 / 1.0 = 1.0; Theta1 = 1.5 / 1.5 = 1.0 -> "keep while Theta improves": l = 0.
    flat_tie = SPSTable(np.array([1, 2]), np.array([1000.0, 1500.0]))
    r = hardware_aware_prefix_scheduler([[0.5]], flat_tie)
    assert r.lengths.tolist() == [0]
    assert r.theta == 1.0
    # B=2 at 1.25 s: Theta1 = 1.5 / 1.25 = 1.2 > 1.0 -> l = 1.
    better = SPSTable(np.array([1, 2]), np.array([1000.0, 1250.0]))
    r = hardware_aware_prefix_scheduler([[0.5]], better)
    assert r.lengths.tolist() == [1]
    assert r.theta == pytest.approx(1.2)


def test_ragged_requests():
    # c0 = [0.9, 0.8]        -> a0 = [0.9, 0.72]
    # c1 = [0.7]             -> a1 = [0.7]
    # c2 = [0.95, 0.9, 0.5]  -> a2 = [0.95, 0.855, 0.4275]
    # greedy order: .95 (r2), .9 (r0), .855 (r2), .72 (r0), .7 (r1), .4275 (r2)
    # pass time (6 + B) ms, i.e. SPS(B) = 1000 / (6 + B); Theta = tau / (6 + B) per ms:
    #   B=3 3/9 = .33333, B=4 3.95/10 = .395, B=5 4.85/11 = .44091, B=6 5.705/12 = .47542,
    #   B=7 6.425/13 = .49423, B=8 7.125/14 = .50893, B=9 7.5525/15 = .5035 (stop)
    sps = {b: 1000.0 / (6 + b) for b in range(3, 10)}
    conf = [[0.9, 0.8], [0.7], [0.95, 0.9, 0.5]]
    for early in (True, False):
        r = hardware_aware_prefix_scheduler(conf, sps, early_stop=early)
        assert r.lengths.tolist() == [2, 1, 2]
        assert r.tau == pytest.approx(7.125)
        assert r.theta == pytest.approx(7.125 / 0.014)
        assert r.batch_tokens == 8


def test_ragged_padding_is_never_a_candidate():
    # Flat SPS: every candidate with a > 0 raises Theta, so everything real is admitted;
    # the short request has one position only: lengths [3, 1], B = 2 + 4 = 6,
    # tau = 2 + (.99 + .9801 + .970299) + .99 = 5.930399.
    r = hardware_aware_prefix_scheduler([[0.99, 0.99, 0.99], [0.99]], {b: 1.0 for b in range(2, 9)})
    assert r.lengths.tolist() == [3, 1]
    assert r.batch_tokens == 6
    assert r.tau == pytest.approx(5.930399)


def test_request_without_drafts():
    # [[], [0.5]]: the first request has no candidate; flat SPS admits the other one.
    r = hardware_aware_prefix_scheduler([[], [0.5]], {2: 1.0, 3: 1.0})
    assert r.lengths.tolist() == [0, 1]
    assert r.tau == pytest.approx(2.5)
    assert r.batch_tokens == 3
    # no request has any draft: only the anchors
    r = hardware_aware_prefix_scheduler([[], []], {2: 1.0})
    assert r.lengths.tolist() == [0, 0]
    assert r.tau == pytest.approx(2.0)
    assert r.batch_tokens == 2


def test_early_stop_and_global_search_differ_for_two_requests():
    # c0 = [0.9, 1, 1] -> a0 = [0.9, 0.9, 0.9];  c1 = [0.2] -> a1 = [0.2]
    # SPS: B=2 1.0, 3 0.6, 4 0.58, 5 0.56, 6 0.5 (a cliff at B = 3, then nearly flat)
    # Theta0 = 2.0
    # Theta1 = 2.9 * 0.6  = 1.74   <- early stop here: verify nothing
    # Theta2 = 3.8 * 0.58 = 2.204
    # Theta3 = 4.7 * 0.56 = 2.632  <- global optimum: request 0 verifies all three
    # Theta4 = 4.9 * 0.5  = 2.45
    sps = {2: 1.0, 3: 0.6, 4: 0.58, 5: 0.56, 6: 0.5}
    conf = [[0.9, 1.0, 1.0], [0.2]]
    early = hardware_aware_prefix_scheduler(conf, sps)
    assert early.lengths.tolist() == [0, 0]
    assert early.theta == pytest.approx(2.0)
    assert early.tau == pytest.approx(2.0)
    assert early.batch_tokens == 2
    assert early.theta_global == pytest.approx(2.632)
    assert early.batch_tokens_global == 5
    glob = hardware_aware_prefix_scheduler(conf, sps, early_stop=False)
    assert glob.lengths.tolist() == [3, 0]
    assert glob.theta == pytest.approx(2.632)
    assert glob.tau == pytest.approx(4.7)
    assert glob.batch_tokens == 5


def test_prefill_tokens_shift_the_batch():
    # Appendix A confidences with 2 prefill tokens sharing the pass: base B = 1 + 2 = 3, tau0 = 1.
    # SPS: 1 1.0, 2 0.5, 3 0.45, 4 0.44, 5 0.3
    # Theta0 = 1 * 0.45 = 0.45; Theta1 = 1.8 * 0.44 = 0.792 (keep); Theta2 = 2.52 * 0.3 = 0.756 (stop)
    # -> one draft verified (without prefill the same table verifies none: Appendix A).
    sps = {1: 1.0, 2: 0.5, 3: 0.45, 4: 0.44, 5: 0.3}
    r = hardware_aware_prefix_scheduler([[0.8, 0.9]], sps, prefill_tokens=2)
    assert r.lengths.tolist() == [1]
    assert r.batch_tokens == 4  # 1 anchor + 1 draft + 2 prefill
    assert r.tau == pytest.approx(1.8)  # prefill tokens do not count toward tau
    assert r.theta == pytest.approx(0.792)
    assert hardware_aware_prefix_scheduler([[0.8, 0.9]], sps).lengths.tolist() == [0]


def test_max_batch_tokens_caps_the_scan():
    # flat SPS, c = [0.9] * 3: a = .9, .81, .729; every candidate improves Theta.
    conf = [[0.9, 0.9, 0.9]]
    flat = {1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0}
    r = hardware_aware_prefix_scheduler(conf, flat)
    assert r.lengths.tolist() == [3]
    assert r.tau == pytest.approx(3.439)  # 1 + .9 + .81 + .729
    assert r.batch_tokens == 4
    for early in (True, False):
        r = hardware_aware_prefix_scheduler(conf, flat, max_batch_tokens=3, early_stop=early)
        assert r.lengths.tolist() == [2]
        assert r.tau == pytest.approx(2.71)
        assert r.theta == pytest.approx(2.71)
        assert r.batch_tokens == 3
        r = hardware_aware_prefix_scheduler(conf, flat, max_batch_tokens=1, early_stop=early)
        assert r.lengths.tolist() == [0]
        assert r.batch_tokens == 1


def test_max_batch_tokens_means_the_table_need_not_go_further():
    # The cap stops the scan at B = 3, so a table measured up to B = 3 is enough.
    for early in (True, False):
        r = hardware_aware_prefix_scheduler([[0.9, 0.9, 0.9]], {1: 1.0, 2: 1.0, 3: 1.0}, max_batch_tokens=3,
                                            early_stop=early)
        assert r.lengths.tolist() == [2]


def test_max_batch_tokens_below_anchors_is_an_error():
    with pytest.raises(ValueError, match="max_batch_tokens"):
        hardware_aware_prefix_scheduler([[0.9], [0.9]], {1: 1.0, 2: 1.0, 3: 1.0}, max_batch_tokens=1)


def test_overhead_changes_the_decision():
    # c = [0.5]; pass times 10 ms (B=1) and 20 ms (B=2).
    # no overhead: Theta0 = 1 / 0.01 = 100, Theta1 = 1.5 / 0.02 = 75 -> l = 0
    # 0.1 s of drafting per round: Theta0 = 1 / 0.11 = 9.0909, Theta1 = 1.5 / 0.12 = 12.5 -> l = 1
    sps = {1: 100.0, 2: 50.0}
    r = hardware_aware_prefix_scheduler([[0.5]], sps)
    assert r.lengths.tolist() == [0]
    assert r.theta == pytest.approx(100.0)
    r = hardware_aware_prefix_scheduler([[0.5]], sps, overhead_s=0.1)
    assert r.lengths.tolist() == [1]
    assert r.theta == pytest.approx(12.5)
    assert r.tau == pytest.approx(1.5)
    assert r.batch_tokens == 2


def test_accepts_2d_array_and_lists_alike():
    conf = [[0.9, 0.5], [0.8, 0.8]]
    sps = {2: 1.0, 3: 0.95, 4: 0.9, 5: 0.8, 6: 0.68}
    a = hardware_aware_prefix_scheduler(conf, sps)
    b = hardware_aware_prefix_scheduler(np.array(conf), sps)
    assert a.lengths.tolist() == b.lengths.tolist() == [1, 2]
    assert a.theta == pytest.approx(b.theta)


def test_no_requests():
    r = hardware_aware_prefix_scheduler([], {1: 1.0})
    assert r.lengths.size == 0
    assert r.tau == 0.0


# ------------------------------------------------------------------------------------------
# errors
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("conf", [
    [[1.2]],
    [[0.5, -0.1]],
    [[0.5], [float("nan")]],
    np.array([[0.3, 1.0001]]),
    np.array([[np.nan, 0.5]]),
])
def test_confidences_outside_unit_interval(conf):
    with pytest.raises(ValueError, match="confidences"):
        hardware_aware_prefix_scheduler(conf, {1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0})


@pytest.mark.parametrize("early", [True, False])
def test_sps_table_missing_a_needed_batch(early):
    # One request with a = 0.9: deciding on it needs B = 2; the table only knows B = 1.
    with pytest.raises(ValueError, match="sps"):
        hardware_aware_prefix_scheduler([[0.9]], {1: 1.0}, early_stop=early)


def test_sps_table_missing_the_anchor_batch():
    with pytest.raises(ValueError, match="sps"):
        hardware_aware_prefix_scheduler([[0.9]], {2: 1.0, 3: 1.0})


@pytest.mark.parametrize("early", [True, False])
def test_zero_survival_draft_is_never_admitted_even_when_sps_rises(early):
    # Hand case (Algorithm 1, line 4: only drafts with positive probability are candidates). SPS
    # rises with B, so admitting any token raises Theta = tau * SPS(B) even when it adds nothing
    # to tau: a = [0.5, 0] -> only the first draft; a = [0, 0] -> none.
    sps = {1: 1.0, 2: 2.0, 3: 3.0}
    r = hardware_aware_prefix_scheduler([[0.5, 0.0]], sps, early_stop=early)
    assert r.lengths.tolist() == [1] and r.batch_tokens == 2 and r.theta == pytest.approx(1.5 * 2.0)
    r = hardware_aware_prefix_scheduler([[0.0, 0.9]], sps, early_stop=early)
    assert r.lengths.tolist() == [0] and r.batch_tokens == 1 and r.theta == pytest.approx(1.0)


def test_early_stop_needs_no_more_of_the_table_than_it_scans():
    # Appendix A stops at B = 1 after looking at B = 2; SPS(3) is not needed for early stop,
    # while the global search needs the whole scan.
    r = hardware_aware_prefix_scheduler([[0.8, 0.9]], {1: 1.0, 2: 0.5})
    assert r.lengths.tolist() == [0]
    with pytest.raises(ValueError, match="sps"):
        hardware_aware_prefix_scheduler([[0.8, 0.9]], {1: 1.0, 2: 0.5}, early_stop=False)


# ------------------------------------------------------------------------------------------
# properties against brute force over all prefix choices
# ------------------------------------------------------------------------------------------

_conf_value = st.one_of(st.sampled_from([0.0, 1.0, 0.5, 0.25]), st.floats(0.0, 1.0, allow_nan=False))


@st.composite
def _instances(draw):
    num_req = draw(st.integers(1, 4))
    conf = [draw(st.lists(_conf_value, min_size=0, max_size=4)) for _ in range(num_req)]
    prefill = draw(st.integers(0, 3))
    total = sum(len(r) for r in conf)
    base = num_req + prefill
    cap = draw(st.one_of(st.none(), st.integers(base, base + total)))
    overhead = draw(st.sampled_from([0.0, 0.0, 0.05, 1.0]))
    sps = {b: draw(st.floats(0.2, 5.0, allow_nan=False)) for b in range(base, base + total + 1)}
    return conf, sps, prefill, cap, overhead


def _best_tau_by_size(conf, cap_k):
    """Best tau for every number k of admitted drafts, over all prefix choices (no greedy order)."""
    num_req = len(conf)
    gains = [np.concatenate(([0.0], np.cumsum(np.cumprod(row)))) if row else np.zeros(1) for row in conf]
    # Algorithm 1, line 4: only drafts with positive joint survival are candidates
    usable = [int(np.count_nonzero(np.cumprod(row) > 0)) if row else 0 for row in conf]
    best: dict[int, float] = {}
    for choice in itertools.product(*(range(u + 1) for u in usable)):
        k = sum(choice)
        if k > cap_k:
            continue
        tau = num_req + sum(g[c] for g, c in zip(gains, choice))
        best[k] = max(best.get(k, -math.inf), tau)
    return best


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_instances())
def test_properties_against_brute_force(inst):
    conf, sps, prefill, cap, overhead = inst
    num_req = len(conf)
    base = num_req + prefill
    total = sum(len(r) for r in conf)
    positive = sum(int(np.count_nonzero(np.cumprod(row) > 0)) for row in conf if row)
    cap_k = min(positive, total if cap is None else cap - base)
    best_tau = _best_tau_by_size(conf, cap_k)
    theta_star = [best_tau[k] / (overhead + 1.0 / sps[base + k]) for k in range(cap_k + 1)]

    results = {}
    for early in (True, False):
        r = hardware_aware_prefix_scheduler(conf, sps, early_stop=early, prefill_tokens=prefill,
                                            max_batch_tokens=cap, overhead_s=overhead)
        results[early] = r
        lengths = r.lengths.tolist()
        # a valid prefix choice
        assert len(lengths) == num_req
        assert all(0 <= ln <= len(row) for ln, row in zip(lengths, conf))
        # B = anchors + drafts + prefill, within the cap
        assert r.batch_tokens == num_req + sum(lengths) + prefill
        if cap is not None:
            assert r.batch_tokens <= cap
        # tau = R + sum of the admitted joint survivals (products of the leading confidences)
        tau = num_req + sum(float(np.prod(row[:j])) for row, ln in zip(conf, lengths) for j in range(1, ln + 1))
        assert r.tau == pytest.approx(tau, rel=1e-9, abs=1e-12)
        # theta is the objective at the chosen B, and the chosen tau is the best for that size
        assert r.theta == pytest.approx(tau / (overhead + 1.0 / sps[r.batch_tokens]), rel=1e-9)
        assert r.tau == pytest.approx(best_tau[sum(lengths)], rel=1e-9, abs=1e-12)

    # global search finds the best prefix choice of all; it is never worse than early stop
    assert results[False].theta == pytest.approx(max(theta_star), rel=1e-9)
    assert results[False].theta >= results[True].theta * (1 - 1e-12)
    assert results[True].theta_global == pytest.approx(max(theta_star), rel=1e-9)

    # early stop: the first size whose successor does not improve (skip float near-ties)
    k_stop = next((k for k in range(cap_k) if theta_star[k + 1] <= theta_star[k]), cap_k)
    gaps = [abs(theta_star[k + 1] - theta_star[k]) / max(theta_star[k], 1e-300) for k in range(min(k_stop + 1, cap_k))]
    assume(all(g > 1e-9 for g in gaps))
    assert int(results[True].lengths.sum()) == k_stop
    assert results[True].theta == pytest.approx(theta_star[k_stop], rel=1e-9)

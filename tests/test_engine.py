"""The engine on hand-made hardware: exact timings, memory, conservation, rejections.

Every profile here has a flat SPS table (10 ms per pass whatever B, unless stated), a drafter
that costs nothing (unless stated) and a KV cache of an exact number of 16-token blocks, so each
expected time below is a sum of pass times worked out in the comment.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hst

from _sim_helpers import certain_acceptance, flat_profile, run_engine, workload, zero_drafter
from memtp_sim.acceptance import AcceptanceModel
from memtp_sim.engine import FINISHED, REJECT_REASONS, REJECTED
from memtp_sim.metrics import compute_metrics


def _check_conservation(st, remote_first_tokens: int = 0):
    """Every request finished or was rejected with a known reason; finished ones got all tokens.

    ``remote_first_tokens``: first tokens emitted by disaggregated prefill GPUs (outside the rounds).
    """
    finished = st.status == FINISHED
    rejected = st.status == REJECTED
    assert np.all(finished | rejected)
    assert np.array_equal(st.generated_tokens[finished], st.output_tokens[finished])
    assert all(reason in REJECT_REASONS for reason in st.reject_reason[rejected])
    assert all(reason == "" for reason in st.reject_reason[finished])
    assert np.all(np.isfinite(st.finished_at_s[finished]))
    # tokens leave the engine only through rounds: emitted tokens add up to generated tokens
    assert st.rounds["emitted_tokens"].sum() + remote_first_tokens == st.generated_tokens.sum()


# ------------------------------------------------------------------------------------------
# exact timings
# ------------------------------------------------------------------------------------------


def test_single_request_no_spec_timing():
    # prompt 10 (one prefill chunk), output 5: the prefill pass emits token 1 at 10 ms, then four
    # decode passes of 10 ms: tokens 2..5 at 20, 30, 40, 50 ms.
    st = run_engine(flat_profile(), workload([10], [5]))
    assert st.first_token_at_s[0] == pytest.approx(0.010)
    assert st.finished_at_s[0] == pytest.approx(0.050)
    assert st.rounds["start_s"].tolist() == pytest.approx([0.0, 0.01, 0.02, 0.03, 0.04])
    assert st.rounds["batch_tokens"].tolist() == [10, 1, 1, 1, 1]
    m = compute_metrics(st)
    assert m["ttft_s_p50"] == pytest.approx(0.010)
    assert m["e2e_s_p50"] == pytest.approx(0.050)
    assert m["tpot_ms_p50"] == pytest.approx(10.0)  # (50 - 10) ms / 4 tokens
    assert m["tok_per_s_user_p50"] == pytest.approx(100.0)
    assert m["mean_verify_len"] == 0.0
    _check_conservation(st)


def test_late_arrival_starts_when_it_arrives():
    st = run_engine(flat_profile(), workload([10], [5], arrival=[1.0]))
    assert st.rounds["start_s"][0] == pytest.approx(1.0)
    assert st.first_token_at_s[0] == pytest.approx(1.010)
    assert st.finished_at_s[0] == pytest.approx(1.050)
    assert compute_metrics(st)["ttft_s_p50"] == pytest.approx(0.010)


def test_two_requests_share_passes():
    # both prompts (10 + 10 = 20 <= chunk 32) prefill in one pass: first tokens at 10 ms.
    # then both decode together (B = 2): A (output 3) ends at 30 ms, B (output 5) at 50 ms.
    st = run_engine(flat_profile(), workload([10, 10], [3, 5]))
    assert st.first_token_at_s.tolist() == pytest.approx([0.01, 0.01])
    assert st.finished_at_s.tolist() == pytest.approx([0.03, 0.05])
    assert st.rounds["batch_tokens"].tolist() == [20, 2, 2, 1, 1]
    _check_conservation(st)


def test_chunked_prefill():
    # prompt 70 with 32-token chunks: 32 + 32 + 6 over three passes, first token at 30 ms;
    # output 2: one decode pass, done at 40 ms.
    st = run_engine(flat_profile(), workload([70], [2]))
    assert st.rounds["prefill_tokens"].tolist() == [32, 32, 6, 0]
    assert st.first_token_at_s[0] == pytest.approx(0.03)
    assert st.finished_at_s[0] == pytest.approx(0.04)


def test_prefill_chunk_shares_a_pass_with_decode():
    # A: prompt 10, output 10, arrives at 0. B: prompt 40, arrives at 15 ms (inside pass 2).
    # pass 1 [0, 10): prefill A (10)          pass 2 [10, 20): decode A (1)
    # pass 3 [20, 30): A anchor + 32 of B = 33 pass 4 [30, 40): A anchor + 8 of B = 9 -> B's token 1 at 40 ms
    st = run_engine(flat_profile(), workload([10, 40], [10, 3], arrival=[0.0, 0.015]))
    assert st.rounds["batch_tokens"][:4].tolist() == [10, 1, 33, 9]
    assert st.first_token_at_s[1] == pytest.approx(0.040)
    assert compute_metrics(st)["ttft_s_p90"] > 0.02
    _check_conservation(st)


def test_speculation_all_accepted_timing():
    # acceptance 1, static k = 3; drafter: t_small 2 ms + 3 * t_seq 1 ms = 5 ms per decode round.
    # pass 1: prefill (10 ms, no drafting: nothing decodes yet) -> token 1 at 10 ms.
    # decode rounds take 5 + 10 = 15 ms and emit 1 + 3 = 4 tokens: 4 at 25 ms, 4 at 40 ms,
    # then the last token (capped at the remaining output 1) at 55 ms.
    prof = flat_profile(drafter=zero_drafter(t_seq_s=0.001, t_small_s=0.002))
    st = run_engine(prof, workload([10], [10]), "static", {"k": 3}, acceptance=certain_acceptance(True))
    assert st.finished_at_s[0] == pytest.approx(0.055)
    assert st.rounds["draft_s"].tolist() == pytest.approx([0.0, 0.005, 0.005, 0.005])
    assert st.rounds["batch_tokens"].tolist() == [10, 4, 4, 4]
    assert st.rounds["emitted_tokens"].tolist() == [1, 4, 4, 1]
    m = compute_metrics(st)
    assert m["tau"] == pytest.approx(4.0)  # uncapped by the remaining output
    assert m["acceptance_rate"] == pytest.approx(1.0)
    assert m["mean_verify_len"] == pytest.approx(3.0)
    _check_conservation(st)


def test_speculation_all_rejected_timing():
    # acceptance 0, static k = 3: every decode round emits only the bonus token; output 5 -> four
    # decode rounds of 5 + 10 ms after the 10 ms prefill: done at 70 ms; 12 drafts verified, all wasted.
    prof = flat_profile(drafter=zero_drafter(t_seq_s=0.001, t_small_s=0.002))
    st = run_engine(prof, workload([10], [5]), "static", {"k": 3}, acceptance=certain_acceptance(False))
    assert st.finished_at_s[0] == pytest.approx(0.070)
    m = compute_metrics(st)
    assert m["tau"] == pytest.approx(1.0)
    assert m["acceptance_rate"] == pytest.approx(0.0)
    assert m["wasted_verify_tokens"] == 12


def test_verify_time_follows_the_sps_table():
    # pass time 10 ms at B = 1 and 40 ms at B = 4 (linear in between: B = 4 -> 40 ms).
    # static k = 3 with acceptance 1: decode passes have B = 4 -> 40 ms each.
    # prefill B = 2 -> 20 ms; output 5: token 1 at 20 ms, 4 more in one decode pass -> 60 ms.
    from memtp_sim.hardware import SPSTable

    sps = SPSTable(np.array([1, 4, 64]), np.array([10.0, 40.0, 640.0]))
    st = run_engine(flat_profile(sps=sps), workload([2], [5]), "static", {"k": 3},
                    acceptance=certain_acceptance(True))
    assert st.rounds["verify_s"].tolist() == pytest.approx([0.020, 0.040])
    assert st.finished_at_s[0] == pytest.approx(0.060)


def test_disaggregated_prefill_timing():
    # remote prefill of 10 tokens on a prefill GPU: one 10 ms pass, token 1 at 10 ms; then the
    # decode GPU runs 4 passes: done at 50 ms. Two prompts and one prefill GPU: the second prompt
    # waits for the first one (its token 1 at 20 ms).
    st = run_engine(flat_profile(), workload([10, 10], [5, 5]), prefill="disaggregated", prefill_gpus=1)
    assert st.first_token_at_s.tolist() == pytest.approx([0.01, 0.02])
    assert st.finished_at_s[0] == pytest.approx(0.05)
    st2 = run_engine(flat_profile(), workload([10, 10], [5, 5]), prefill="disaggregated", prefill_gpus=2)
    assert st2.first_token_at_s.tolist() == pytest.approx([0.01, 0.01])
    assert st2.finished_at_s.tolist() == pytest.approx([0.05, 0.05])
    # a 100-token prompt with max_batch_tokens 64: prefill passes of 64 + 36 tokens = 20 ms
    st3 = run_engine(flat_profile(), workload([100, 10], [2, 5]), prefill="disaggregated", prefill_gpus=1)
    assert st3.first_token_at_s[0] == pytest.approx(0.02)
    assert st3.finished_at_s[0] == pytest.approx(0.03)
    for s in (st, st2, st3):
        _check_conservation(s, remote_first_tokens=2)


def test_disaggregated_output_one_finishes_at_prefill_when_engine_busy():
    # request 0 (output 1) is done by its prefill alone; request 1 keeps the engine running.
    st = run_engine(flat_profile(), workload([10, 10], [1, 5]), prefill="disaggregated", prefill_gpus=1)
    assert st.finished_at_s[0] == pytest.approx(0.01)
    _check_conservation(st, remote_first_tokens=2)


@pytest.mark.parametrize("prompts,outputs", [([10], [1]), ([100], [1]), ([10, 10], [5, 1])])
def test_disaggregated_last_request_done_at_prefill(prompts, outputs):
    # the last request to finish needs nothing from the decode GPU (output 1 = the prefill's token)
    arrival = [0.0, 1.0][: len(prompts)]
    st = run_engine(flat_profile(), workload(prompts, outputs, arrival=arrival), prefill="disaggregated",
                    prefill_gpus=1)
    _check_conservation(st, remote_first_tokens=len(prompts))


def test_closed_loop_think_time():
    # one user, think time 0.5 s; each request: prompt 10, output 5 -> 50 ms in the engine.
    # request 0: [0, 0.05]; request 1 submitted at 0.55, done at 0.60.
    st = run_engine(flat_profile(), workload([10, 10], [5, 5], concurrency=1, think_time_s=0.5))
    assert st.arrival_at_s.tolist() == pytest.approx([0.0, 0.55])
    assert st.finished_at_s.tolist() == pytest.approx([0.05, 0.60])


# ------------------------------------------------------------------------------------------
# rejection and memory
# ------------------------------------------------------------------------------------------


def test_rejections_with_reasons_not_crashes():
    # KV cache: 32 blocks x 16 tokens = 512 tokens; max_model_len 1000.
    #   (10, 10)   fits
    #   (300, 300) 600 tokens > 512             -> exceeds_kv_capacity
    #   (16, 496)  512 tokens = exactly the cache -> fits (alone)
    #   (500, 700) 1200 tokens > max_model_len    -> exceeds_max_model_len
    prof = flat_profile(kv_blocks=32, max_model_len=1000)
    wl = workload([10, 300, 16, 500], [10, 300, 496, 700], arrival=[0.0, 0.0, 0.0, 0.0])
    for policy, params in (("no_spec", {}), ("static", {"k": 3}), ("dspark", {"gamma": 4})):
        st = run_engine(prof, wl, policy, params, acceptance=AcceptanceModel.fixed(0.8))
        assert st.status.tolist() == [FINISHED, REJECTED, FINISHED, REJECTED]
        assert st.reject_reason.tolist() == ["", "exceeds_kv_capacity", "", "exceeds_max_model_len"]
        assert st.generated_tokens.tolist() == [10, 0, 496, 0]
        assert st.rounds["kv_blocks_peak"].max() <= 32
        _check_conservation(st)
        m = compute_metrics(st)
        assert m["num_rejected"] == 2
        assert m["rejected_by_reason"] == {"exceeds_kv_capacity": 1, "exceeds_max_model_len": 1}


def test_everything_rejected_still_terminates():
    prof = flat_profile(kv_blocks=4, max_model_len=1000)  # 64 tokens of KV
    st = run_engine(prof, workload([100, 2000], [10, 10]))
    assert st.reject_reason.tolist() == ["exceeds_kv_capacity", "exceeds_max_model_len"]
    _check_conservation(st)


@pytest.mark.parametrize("policy,params,prefill", [
    ("static", {"k": 3}, "colocated"),
    ("no_spec", {}, "colocated"),
    ("dspark", {"gamma": 5}, "colocated"),
    ("static", {"k": 3}, "disaggregated"),
])
def test_memory_pressure_preempts_and_never_overflows(policy, params, prefill):
    # 32 blocks (512 tokens); 10 requests of prompt 16 + output 100 arrive together. Each fits alone
    # (116 tokens = 8 blocks) and all ten prompts fit at admission (10 blocks), but together they
    # grow to 10 x 8 = 80 blocks > 32: the engine must preempt, and still finish every request.
    prof = flat_profile(kv_blocks=32)
    wl = workload(np.full(10, 16), np.full(10, 100))
    st = run_engine(prof, wl, policy, params, acceptance=AcceptanceModel.fixed(0.7), prefill=prefill,
                    prefill_gpus=2)
    assert st.kv_capacity_blocks == 32
    assert np.all(st.rounds["kv_blocks_peak"] <= st.kv_capacity_blocks)
    assert np.all(st.rounds["kv_blocks_after"] <= st.kv_capacity_blocks)
    assert st.rounds["kv_blocks_peak"].max() >= 30  # the cache really was full
    assert st.num_preemptions.sum() > 0
    assert compute_metrics(st)["num_preemptions"] > 0
    assert np.all(st.status == FINISHED)
    _check_conservation(st, remote_first_tokens=10 if prefill == "disaggregated" else 0)


def test_no_preemption_when_memory_is_ample():
    st = run_engine(flat_profile(kv_blocks=4096), workload(np.full(10, 16), np.full(10, 100)), "static", {"k": 3})
    assert st.num_preemptions.sum() == 0
    _check_conservation(st)


def test_engine_is_deterministic_given_the_rng_seed():
    prof = flat_profile(kv_blocks=32)
    wl = workload(np.full(10, 16), np.full(10, 100))
    a = run_engine(prof, wl, "static", {"k": 3}, seed=5)
    b = run_engine(prof, wl, "static", {"k": 3}, seed=5)
    c = run_engine(prof, wl, "static", {"k": 3}, seed=6)
    assert np.array_equal(a.finished_at_s, b.finished_at_s)
    assert all(np.array_equal(a.rounds[k], b.rounds[k], equal_nan=True) for k in a.rounds)
    assert not np.array_equal(a.rounds["accepted_tokens"], c.rounds["accepted_tokens"])


# ------------------------------------------------------------------------------------------
# limits and the policy inside the engine
# ------------------------------------------------------------------------------------------


def test_max_num_seqs_limits_running_requests():
    st = run_engine(flat_profile(), workload(np.full(5, 10), np.full(5, 6)), max_num_seqs=2)
    assert st.rounds["num_running"].max() == 2
    assert st.rounds["num_decode"].max() <= 2
    _check_conservation(st)


def test_static_drafts_are_trimmed_to_the_token_budget():
    # 8 requests, static k = 3, max_batch_tokens 16: 8 anchors leave 8 draft slots (not 24).
    st = run_engine(flat_profile(), workload(np.full(8, 1), np.full(8, 40)), "static", {"k": 3},
                    acceptance=certain_acceptance(False), max_batch_tokens=16, prefill_chunk_tokens=8)
    r = st.rounds
    assert r["batch_tokens"].max() <= 16
    full = r["num_decode"] == 8
    assert full.any()
    assert np.all(r["verify_tokens"][full] == 8)
    assert np.all(r["batch_tokens"][full] == 16)
    _check_conservation(st)


def test_dspark_in_engine_verifies_all_when_certain_and_none_when_hopeless():
    # flat SPS, no drafting cost: with acceptance 1 every candidate has a = 1 and raises Theta,
    # so all gamma drafts are verified; with acceptance 0 (a = 0) Theta never improves: none.
    wl = workload([10, 10], [30, 30])
    sure = run_engine(flat_profile(), wl, "dspark", {"gamma": 4}, acceptance=certain_acceptance(True))
    m = compute_metrics(sure)
    assert m["mean_verify_len"] == pytest.approx(4.0)
    assert m["tau"] == pytest.approx(5.0)
    hopeless = run_engine(flat_profile(), wl, "dspark", {"gamma": 4}, acceptance=certain_acceptance(False))
    m = compute_metrics(hopeless)
    assert m["mean_verify_len"] == 0.0
    assert m["tau"] == pytest.approx(1.0)
    # with nothing verified each decode round emits exactly one token: 1 prefill + 29 decode rounds
    assert hopeless.finished_at_s.tolist() == pytest.approx([0.30, 0.30])


# ------------------------------------------------------------------------------------------
# fuzz: random small workloads on a small cache never crash, overflow or lose tokens
# ------------------------------------------------------------------------------------------


@hst.composite
def _fuzz_case(draw, *, may_reject: bool):
    n = draw(hst.integers(1, 8))
    prefill = draw(hst.sampled_from(["colocated", "disaggregated"]))
    kv_blocks = draw(hst.integers(4, 40))
    min_out = 1
    limit = 10_000 if may_reject else min(200, 16 * kv_blocks)
    prompts, outputs = [], []
    for _ in range(n):
        p_ = draw(hst.integers(1, min(120, limit - min_out)))
        prompts.append(p_)
        outputs.append(draw(hst.integers(min_out, min(120, limit - p_))))
    arrivals = sorted(draw(hst.lists(hst.floats(0.0, 0.5), min_size=n, max_size=n)))
    policy = draw(hst.sampled_from([("no_spec", {}), ("static", {"k": 3}), ("dspark", {"gamma": 5}),
                                    ("mtp1", {})]))
    alpha = draw(hst.sampled_from([0.3, 0.8, 0.95]))
    return prompts, outputs, arrivals, policy, kv_blocks, alpha, prefill, draw(hst.integers(0, 3))


def _fuzz_check(case):
    prompts, outputs, arrivals, (policy, params), kv_blocks, alpha, prefill, seed = case
    prof = flat_profile(kv_blocks=kv_blocks, max_model_len=200)
    st = run_engine(prof, workload(prompts, outputs, arrival=arrivals), policy, params,
                    acceptance=AcceptanceModel.fixed(alpha), seed=seed, prefill=prefill, prefill_gpus=1)
    total = np.asarray(prompts) + np.asarray(outputs)
    expect_reason = np.where(total > 200, "exceeds_max_model_len",
                             np.where(-(-total // 16) > kv_blocks, "exceeds_kv_capacity", ""))
    assert st.reject_reason.tolist() == expect_reason.tolist()
    assert np.all(st.rounds["kv_blocks_peak"] <= kv_blocks)
    assert np.all(st.rounds["batch_tokens"] <= 64)
    # each admitted request's first token came from a remote prefill GPU when disaggregated
    remote = int((st.status == FINISHED).sum()) if prefill == "disaggregated" else 0
    _check_conservation(st, remote_first_tokens=remote)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_fuzz_case(may_reject=False))
def test_fuzz_small_workloads_spread_arrivals(case):
    _fuzz_check(case)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_fuzz_case(may_reject=True))
def test_fuzz_small_workloads_with_rejections(case):
    _fuzz_check(case)


@pytest.mark.parametrize("prompts,outputs", [([10, 1], [5, 64]), ([10, 150], [5, 100])],
                         ids=["exceeds-kv", "exceeds-max-model-len"])
def test_rejection_while_engine_idle(prompts, outputs):
    # KV 4 blocks = 64 tokens, max_model_len 200. Request 0 is done by 50 ms; request 1 arrives at 1 s
    # (the engine is idle) and is too big: it must be rejected and the run must end.
    st = run_engine(flat_profile(kv_blocks=4, max_model_len=200), workload(prompts, outputs, arrival=[0.0, 1.0]))
    assert st.status.tolist() == [FINISHED, REJECTED]


def test_rejection_while_engine_busy():
    # same request 1, arriving at 20 ms while request 0 still decodes: rejected, run ends.
    st = run_engine(flat_profile(kv_blocks=4), workload([10, 1], [5, 64], arrival=[0.0, 0.02]))
    assert st.reject_reason.tolist() == ["", "exceeds_kv_capacity"]
    _check_conservation(st)

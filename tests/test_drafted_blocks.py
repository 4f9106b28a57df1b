"""Drafted rounds (DSpark's and its asynchronous scheduler's, static k's, MTP-1's, threshold's and goodput's) run
as blocks (engine ``_drafted_block``, compiled
kernel ``_kernels.drafted_block``, issue 13): an exact shortcut, so every run must match the round-by-round
engine (``Engine.DRAFT_BLOCKS = False``) to the last bit: the random streams, per-request times and
counters, the calibration diagnostics, and every column of every round of the round log.

Oracle: the round-by-round engine itself (and, on a few scenarios, the numpy engine without any
kernel), on scenarios that reach every way a block stops (an arrival or completion inside a round,
a request finishing, a prefill completing, a KV trim or preemption, the diagnostics filling up
mid-block) and that go through the fallback gate's plain rounds and probes; with dense and context-priced cost tables, one
or two tables, noisy, oracle and per-position acceptance models, both coherence estimators; and
random hand-made workloads (fuzz).
"""

from __future__ import annotations

import numpy as np
import pytest

from memtp_sim import _compiled, run
from memtp_sim.acceptance import AcceptanceModel
from memtp_sim.engine import Engine
from memtp_sim.hardware.cost import SPSTable

from _sim_helpers import assert_same_state, flat_profile, grid_tie_workload, run_engine, scenario, workload

pytestmark = pytest.mark.skipif(_compiled.kernels is None, reason="needs the compiled kernels (pip install -e .)")


def both_ways(monkeypatch, fn):
    """(round by round, with drafted blocks, rounds each block call ran)."""
    monkeypatch.setattr(Engine, "DRAFT_BLOCKS", False)
    slow = fn()
    monkeypatch.setattr(Engine, "DRAFT_BLOCKS", True)
    calls = []
    orig = Engine._drafted_block
    monkeypatch.setattr(Engine, "_drafted_block",
                        lambda self, *a: (lambda out: calls.append(out[0]) or out)(orig(self, *a)))
    fast = fn()
    return slow, fast, calls


H200 = {"profile": "h200-llama31-8b-bf16"}
SCENARIOS = {
    "closed-4": {},
    "closed-4-early-stop": {"policy": {"name": "dspark", "early_stop": True}},
    "closed-16-think": {"workload": {"concurrency": 16, "num_requests": 60, "think_time_s": 0.5}},
    # prefill chunks share the passes with the drafts; prefills complete inside blocks
    "poisson-colocated": {"workload": {"mode": "poisson", "rate_per_s": 2.0, "num_requests": 40}},
    "closed-8-chunked": {"workload": {"concurrency": 8, "num_requests": 40},
                         "engine": {"max_batch_tokens": 256, "prefill_chunk_tokens": 64}},
    # a pass the drafts nearly fill: the prefill chunks get what they leave (more in a round without drafts)
    "closed-8-tight-pass": {"workload": {"concurrency": 8, "num_requests": 40},
                            "engine": {"max_batch_tokens": 64, "prefill_chunk_tokens": 56}},
    "disaggregated": {"workload": {"concurrency": 6, "num_requests": 36},
                      "engine": {"prefill": "disaggregated", "prefill_gpus": 2}},
    # context-priced verify and decode tables: every round priced at its own context
    "h200-context": {"hardware": H200, "workload": {"concurrency": 8, "num_requests": 40}},
    "h200-poisson": {"hardware": H200, "workload": {"mode": "poisson", "rate_per_s": 8.0, "num_requests": 60}},
    "oracle-head": {"confidence": {"head": "oracle", "sts": "none"}},
    "per-position-acceptance": {"acceptance": {"per_position": [0.8, 0.6, 0.45, 0.3, 0.2, 0.12, 0.07],
                                               "sigma_round": 0.5}},
    "no-round-spread": {"acceptance": {"profile": "dspark-qwen3", "sigma_round": 0.0}},
    "memtp-fixed-per-tested": {"memtp": {"depth": 4, "coherence_estimator": "per_tested"}},
    "memtp-fixed-per-verified": {"memtp": {"depth": 6}},
    "kv-pressure": {  # a 2-GiB KV budget: admission waits for memory, drafts are trimmed, requests preempted
        "workload": {"concurrency": 12, "num_requests": 36},
        "hardware": {"table": {1: 20.0, 64: 25.0, 512: 80.0},
                     "memory": {"gpu_allocatable_gib": 4.0, "weights_bytes": 1 << 30, "kv_bytes_per_token": 131072,
                                "max_model_len": 8192}}},
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_drafted_blocks_match_round_by_round_on_scenarios(name, monkeypatch):
    sections = {"policy": {"name": "dspark"}} | SCENARIOS[name]
    scen = scenario(**sections)
    slow, fast, calls = both_ways(monkeypatch, lambda: run(scen, seed=5).state)
    assert calls and max(calls) > 1, "no drafted block of two rounds or more: the test would prove nothing"
    assert_same_state(slow, fast)


@pytest.mark.parametrize("name", ["disaggregated", "poisson-colocated", "closed-16-think"])
def test_a_last_round_across_an_event_is_kept_in_its_block(name, monkeypatch):
    # a round whose pass runs across an arrival, a remote prefill's end or a user's think time is
    # kept in its block (its acceptance drawn before the events inside the pass run, in SimPy, as
    # the round path draws it after them: no callback draws from the run's generators), and the
    # requests it finished are freed after the wait: the same state bit for bit, and blocks that
    # ended so, some of them with requests finished in that round
    ended, finished = [], []
    orig = Engine._drafted_block

    def block(self, *a):  # noqa: ANN001, ANN202
        out = orig(self, *a)
        if out[4]:
            ended.append(out[0])
            finished.append(len(self._finished_after_wait))
        return out

    scen = scenario(**({"policy": {"name": "dspark"}} | SCENARIOS[name]))
    monkeypatch.setattr(Engine, "DRAFT_BLOCKS", False)
    slow = run(scen, seed=5).state
    monkeypatch.setattr(Engine, "DRAFT_BLOCKS", True)
    # blocks that stop at the events (not going on past remote prefills' ends and completions, whose
    # tests are test_absorbed_completions.py's): this path is the one where they cannot go on
    monkeypatch.setattr(Engine, "_absorb_setup", lambda self: None)
    monkeypatch.setattr(Engine, "_drafted_block", block)
    fast = run(scen, seed=5).state
    assert_same_state(slow, fast)
    assert len(ended) >= 5 and max(ended) > 1, ended
    assert any(finished), "no block's last round across an event finished a request: the wait's frees unseen"


STATIC = {"static-5": {"name": "static", "k": 5}, "static-9": {"name": "static", "k": 9}, "mtp1": {"name": "mtp1"}}


@pytest.mark.parametrize("policy", sorted(STATIC))
@pytest.mark.parametrize("name", ["closed-4", "poisson-colocated", "closed-8-chunked", "disaggregated", "h200-context",
                                  "per-position-acceptance", "memtp-fixed-per-tested", "kv-pressure"])
def test_static_policies_drafted_blocks_match_round_by_round(name, policy, monkeypatch):
    # static k and MTP-1 verify k drafts of every request (no scan, no gate): their blocks must be
    # the rounds one by one too, bit for bit, through prefill chunks, KV trims and preemptions
    scen = scenario(**(SCENARIOS[name] | {"policy": STATIC[policy]}))  # a fixed MEMTP depth caps k
    slow, fast, calls = both_ways(monkeypatch, lambda: run(scen, seed=3).state)
    assert calls and max(calls) > 1, "no drafted block of two rounds or more: the test would prove nothing"
    assert_same_state(slow, fast)
    verified = fast.rounds["verify_tokens"][fast.rounds["verify_tokens"] > 0]
    k = {"static-5": 5, "static-9": 9, "mtp1": 1}[policy]
    num_dec = fast.rounds["num_decode"][fast.rounds["verify_tokens"] > 0]
    assert np.all(verified <= num_dec * k) and np.any(verified == num_dec * min(k, int(fast.rounds["gamma"].max())))


DRAFT_MODEL = {"hardware": {"profile": "gfx1151-llama31-8b-q4km-vulkan"}, "drafter": {"kind": "draft_model"}}


@pytest.mark.parametrize("policy", [{"name": "static", "k": 3}, {"name": "dspark"}, {"name": "threshold", "threshold": 0.3}])
@pytest.mark.parametrize("name", ["closed-4", "poisson-colocated", "closed-8-chunked", "disaggregated"])
def test_draft_model_drafted_blocks_match_round_by_round(name, policy, monkeypatch):
    # a draft model prefills its own cache: a round with prefill chunks pays its drafter's prefill
    # of them (Drafter.prefill_time_s), which the kernel does not price; such a round stops the
    # block and runs in Python, the others run in blocks, bit for bit
    scen = scenario(**(SCENARIOS[name] | DRAFT_MODEL | {"policy": policy}))
    slow, fast, calls = both_ways(monkeypatch, lambda: run(scen, seed=6).state)
    assert calls and max(calls) > 1, "no drafted block of two rounds or more: the test would prove nothing"
    assert_same_state(slow, fast)
    r = fast.rounds
    if name in ("poisson-colocated", "closed-8-chunked"):  # drafted rounds that prefilled, priced with the drafter's prefill
        assert np.any((r["prefill_tokens"] > 0) & (r["verify_tokens"] > 0))


# dynamic draft-length controllers (policies.control) in blocks: the k each round drafts and the
# tax on its pass follow the batch (a block holds its batch), or the acceptance EMA
CONTROLS = {
    # k from the batch; 0 beyond 6 decoding requests (plain rounds, switches that cost 2 ms)
    "batch-table": {"name": "batch_table", "table": {"1-2": 5, "3-4": 3, "5-6": 2, "7-4096": 0}, "switch_s": 0.002},
    "disable-by-batch": {"name": "disable_by_batch_size", "max_batch": 3, "hysteresis": 1, "tax": 0.1,
                         "switch_s": 0.001},
    # k steps with the acceptance EMA, down to 0 (plain rounds, probes of one position) and back up
    "acceptance-target": {"name": "acceptance_target", "target": 0.6},
    "acceptance-target-steps": {"name": "acceptance_target", "target": 0.75, "hysteresis": 0.0,
                                "half_life_rounds": 2.0, "k_min": 0, "probe_every": 3},
    # a full-block probe every few rounds, in between the k of the best expected rate (often 0)
    "probing": {"name": "probing", "probe_every": 4},
    "probing-taxed": {"name": "probing", "probe_every": 9, "tax": 0.2, "switch_s": 0.003},
}
CONTROL_POLICIES = {"static-5": {"name": "static", "k": 5}, "mtp1": {"name": "mtp1"},
                    "threshold": {"name": "threshold", "threshold": 0.3},
                    "async": {"name": "dspark_async", "gamma": 5, "lag_rounds": 2}}


def control_both_ways(monkeypatch, name: str, control: str, policy: str, seed: int):
    scen = scenario(**(SCENARIOS[name] | {"policy": CONTROL_POLICIES[policy], "draft_control": CONTROLS[control]}))
    slow, fast, calls = both_ways(monkeypatch, lambda: run(scen, seed=seed).state)
    assert calls and max(calls) > 1, "no drafted block of two rounds or more: the test would prove nothing"
    assert_same_state(slow, fast)
    return fast.rounds


@pytest.mark.parametrize("control", sorted(CONTROLS))
@pytest.mark.parametrize("name", ["closed-4", "poisson-colocated", "closed-8-chunked", "closed-8-tight-pass",
                                  "disaggregated", "h200-context", "kv-pressure"])
def test_dynamic_controllers_drafted_blocks_match_round_by_round(name, control, monkeypatch):
    # the controller's k, its tax on every pass and its switch cost, and acceptance_target's
    # learning, kept by the kernel round after round: bit for bit the rounds one by one
    r = control_both_ways(monkeypatch, name, control, "static-5", seed=7)
    assert len(np.unique(r["gamma"][r["num_decode"] > 0])) >= 2, "k never changed: the controller decided nothing"


@pytest.mark.parametrize("policy", ["mtp1", "threshold", "async"])
@pytest.mark.parametrize("control", sorted(CONTROLS))
def test_dynamic_controllers_with_other_policies_match_round_by_round(control, policy, monkeypatch):
    control_both_ways(monkeypatch, "poisson-colocated", control, policy, seed=8)


def test_acceptance_target_learning_steps_inside_blocks(monkeypatch):
    # reach: the EMA moves k up and down while blocks run (a block stops at each change) and the
    # overhead column carries the switches of the rounds that turn speculation back on
    r = control_both_ways(monkeypatch, "closed-8-chunked", "acceptance-target-steps", "static-5", seed=7)
    k = r["gamma"][r["num_decode"] > 0]
    assert {0, 1}.issubset(set(k.tolist())) and k.max() >= 3
    assert np.any(np.diff(k) > 0) and np.any(np.diff(k) < 0)


def test_acceptance_target_past_the_depth_keeps_its_blocks(monkeypatch):
    # a low target: the EMA stays above the band, k steps up every round and cap clamps it to the
    # depth; the kernel clamps it too and goes on (the review's mutant without the clamp stopped
    # every block after a round: the same state, most rounds one by one)
    scen = scenario(policy={"name": "static", "k": 3}, workload={"concurrency": 4, "num_requests": 24},
                    draft_control={"name": "acceptance_target", "target": 0.2, "hysteresis": 0.0})
    slow, fast, calls = both_ways(monkeypatch, lambda: run(scen, seed=2).state)
    assert_same_state(slow, fast)
    assert (fast.rounds["gamma"][fast.rounds["num_decode"] > 0] == 3).all()
    assert sum(calls) / len(calls) >= 4, f"{sum(calls)} rounds in {len(calls)} blocks"


@pytest.mark.parametrize("control", ["acceptance-target-steps", "probing"])
def test_rounds_without_drafts_run_inside_blocks(control, monkeypatch):
    # reach: a controller's rounds of k 0 (plain passes, taxed, with switches) run in the kernel
    # between its drafted ones, not one by one in Python
    scen = scenario(**(SCENARIOS["closed-8-chunked"] | {"policy": CONTROL_POLICIES["static-5"],
                                                        "draft_control": CONTROLS[control]}))
    slow, fast, calls = both_ways(monkeypatch, lambda: run(scen, seed=7).state)
    assert_same_state(slow, fast)
    r = fast.rounds
    plain = int(np.count_nonzero((r["gamma"] == 0) & (r["num_decode"] > 0)))
    in_python = r["start_s"].size - sum(calls)  # rounds not kept by a block
    assert plain >= 20 and in_python < plain / 2, (plain, in_python)


@pytest.mark.parametrize("case", ["cheap-drafts-static", "dear-drafts-threshold"])
def test_probing_with_host_and_planner_overheads_matches_round_by_round(case, monkeypatch):
    # the host time is in probing's expected rates (DraftView.fixed_s): with 20 ms of it cheap
    # drafts pay off where they would not without, and dear ones (22 ms for one position) do not
    # where they would if it were left out of the drafting rounds' time; a plain round pays the
    # host time alone where a drafted one of a planning policy (threshold) pays the planner's too
    from dataclasses import replace

    from memtp_sim.engine import EngineSettings
    from memtp_sim.hardware.cost import Overheads
    from memtp_sim.policies import make_policy
    from memtp_sim.policies.control import make_control

    from _sim_helpers import zero_drafter

    cheap = case.startswith("cheap")
    drafter = zero_drafter(t_seq_s=0.004 if cheap else 0.02, t_small_s=0.002)
    prof = replace(flat_profile(pass_ms=10.0, kv_blocks=512, drafter=drafter),
                   overheads=Overheads(host_s=0.02, planner_s=0.003))
    policy = ("static", {"k": 3}) if cheap else ("threshold", {"threshold": 0.2, "gamma": 3})

    def go():
        return Engine(prof, AcceptanceModel.fixed(0.55), workload([8] * 6, [60, 50, 40, 70, 30, 45]),
                      make_policy(*policy), EngineSettings(max_batch_tokens=64, prefill_chunk_tokens=32,
                                                           kv_watermark_frac=0.0),
                      np.random.default_rng(3), control=make_control("probing", {"probe_every": 5, "switch_s": 0.001})
                      ).run()

    slow, fast, calls = both_ways(monkeypatch, go)
    assert calls and max(calls) > 1
    assert_same_state(slow, fast)
    k = fast.rounds["gamma"][fast.rounds["num_decode"] > 0]
    # (without the host time in the rates the cheap case drafts nothing in 31 of its 54 rounds)
    assert (k == 0).sum() < (k > 0).sum() / 4 if cheap else ((k == 0).sum() > 20 and (k > 0).sum() > 5)


@pytest.mark.parametrize("patch", ["cap_instance", "observe_instance", "tax_function", "expected_rate"])
def test_a_replaced_dynamic_controller_runs_round_by_round(patch, monkeypatch):
    # the kernel keeps the controller's answer and learning in its place: a patched cap or
    # observe (or the tax's function) must run instead, round by round, and change the run
    import memtp_sim.policies.control as control_mod
    from memtp_sim.engine import EngineSettings
    from memtp_sim.policies import make_policy
    from memtp_sim.policies.control import make_control

    def build() -> Engine:
        control = make_control("probing", {"probe_every": 4, "tax": 0.1}) if patch == "expected_rate" else \
            make_control("acceptance_target", {"target": 0.6, "tax": 0.1})
        return Engine(flat_profile(pass_ms=10.0, kv_blocks=64), AcceptanceModel.fixed(0.7),
                      workload([8, 8, 8], [60, 50, 40]), make_policy("static", {"k": 4}),
                      EngineSettings(max_batch_tokens=64, prefill_chunk_tokens=32, kv_watermark_frac=0.0),
                      np.random.default_rng(0), control=control)

    calls = []
    orig = Engine._drafted_block
    monkeypatch.setattr(Engine, "_drafted_block", lambda self, *a: calls.append(1) or orig(self, *a))
    plain = build().run()
    assert calls
    calls.clear()
    eng = build()
    if patch == "cap_instance":
        orig_cap = eng.control.cap
        eng.control.cap = lambda view: min(orig_cap(view), 1)
    elif patch == "observe_instance":
        eng.control.observe = lambda outcome: None  # k never learns
    elif patch == "tax_function":
        monkeypatch.setattr(control_mod, "dynamic_tax_frac", lambda tax, n: 0.5)
    else:  # probing's view of the rates: drafting always looks best
        from memtp_sim.policies.base import DraftView
        orig_rate = DraftView.expected_rate
        monkeypatch.setattr(DraftView, "expected_rate", lambda self, k, a: orig_rate(self, k, a) * (1 + k))
    patched = eng.run()
    assert calls == []
    with pytest.raises(AssertionError):
        assert_same_state(plain, patched)


@pytest.mark.parametrize("threshold", [0.0, 0.3, 0.75, 1.0])
@pytest.mark.parametrize("name", ["closed-4", "poisson-colocated", "disaggregated", "h200-context", "kv-pressure"])
def test_threshold_drafted_blocks_match_round_by_round(name, threshold, monkeypatch):
    # the threshold policy verifies each request's drafts whose joint survival clears the bar
    # (its round-log theta from their survivals' sum, numpy's pairwise order): bit for bit
    scen = scenario(**(SCENARIOS[name] | {"policy": {"name": "threshold", "threshold": threshold}}))
    slow, fast, calls = both_ways(monkeypatch, lambda: run(scen, seed=4).state)
    assert calls and max(calls) > 1, "no drafted block of two rounds or more: the test would prove nothing"
    assert_same_state(slow, fast)
    assert np.isfinite(fast.rounds["theta"]).any()


def crowded_pass_both_ways(monkeypatch, policy: dict, seed: int):
    """16 users decoding (disaggregated prefill) in 64-token passes, both ways, asserted equal and
    with a drafted block of two rounds or more; the blocked run's round log."""
    scen = scenario(policy=policy, workload={"concurrency": 16, "num_requests": 48},
                    engine={"max_batch_tokens": 64, "prefill_chunk_tokens": 32, "prefill": "disaggregated",
                            "prefill_gpus": 4})
    slow, fast, calls = both_ways(monkeypatch, lambda: run(scen, seed=seed).state)
    assert calls and max(calls) > 1
    assert_same_state(slow, fast)
    return fast.rounds


def test_a_threshold_plan_over_the_budget_drops_the_lowest_drafts_in_a_block(monkeypatch):
    # threshold 0 selects every positive draft: 16 users x 7 do not fit a 64-token pass, so the
    # kernel ranks the candidates and keeps the top (take_top) inside its blocks
    r = crowded_pass_both_ways(monkeypatch, {"name": "threshold", "threshold": 0.0}, seed=2)
    assert np.any(r["batch_tokens"] == 64) and np.any(r["verify_tokens"] < 7 * r["num_decode"])


@pytest.mark.parametrize("lag", [1, 2, 7])
@pytest.mark.parametrize("name", ["closed-4", "closed-16-think", "poisson-colocated", "disaggregated", "h200-poisson",
                                  "memtp-fixed-per-tested", "kv-pressure"])
def test_async_scheduler_drafted_blocks_match_round_by_round(name, lag, monkeypatch):
    # DSpark's asynchronous scheduler verifies the top K of the global search lag rounds before:
    # its capacity history runs inside the block (and across blocks and the round path's rounds)
    scen = scenario(**(SCENARIOS[name] | {"policy": {"name": "dspark_async", "lag_rounds": lag}}))
    slow, fast, calls = both_ways(monkeypatch, lambda: run(scen, seed=6).state)
    assert calls and max(calls) > 1, "no drafted block of two rounds or more: the test would prove nothing"
    assert_same_state(slow, fast)
    r = fast.rounds
    assert np.isfinite(r["theta_global"]).any() and (r["verify_tokens"][:lag] == 0).all()  # warm-up: nothing


def test_an_async_scheduler_reused_for_a_second_run_starts_afresh(monkeypatch):
    # a round index below the last one remembered starts a new run: the policy forgets its
    # capacities (DSparkAsyncPolicy.plan), and the kernel must too when one instance runs twice
    from memtp_sim.engine import EngineSettings
    from memtp_sim.policies.dspark import DSparkAsyncParams, DSparkAsyncPolicy

    def two_runs() -> list:
        policy = DSparkAsyncPolicy(DSparkAsyncParams(gamma=4, lag_rounds=3))
        return [Engine(flat_profile(pass_ms=10.0, kv_blocks=64), AcceptanceModel.fixed(0.7),
                       workload([8, 8, 8], [60, 40, 50]), policy,
                       EngineSettings(max_batch_tokens=64, prefill_chunk_tokens=32, kv_watermark_frac=0.0),
                       np.random.default_rng(seed)).run() for seed in (0, 1)]

    slow, fast, calls = both_ways(monkeypatch, two_runs)
    assert calls and max(calls) > 1
    for a, b in zip(slow, fast):
        assert_same_state(a, b)
    r = fast[1].rounds
    assert r["verify_tokens"][np.flatnonzero(r["num_decode"] > 0)[0]] == 0  # warm-up again


@pytest.mark.parametrize("policy", ["threshold", "dspark_async", "goodput"])
def test_a_drafter_wider_than_the_policy_s_gamma_runs_round_by_round_and_raises(policy, monkeypatch):
    # review: survival() refuses more drafted positions than the policy's gamma; the kernel must
    # not run such rounds (an Engine built by hand with another drafter), so both ways raise
    from memtp_sim.drafting import Drafter, DraftSpec
    from memtp_sim.engine import EngineSettings
    from memtp_sim.errors import InvalidArgumentError
    from memtp_sim.policies import make_policy

    prof = flat_profile(pass_ms=10.0, kv_blocks=64)

    def go() -> str:
        eng = Engine(prof, AcceptanceModel.fixed(0.7), workload([8, 8], [40, 40]), make_policy(policy, {"gamma": 3}),
                     EngineSettings(max_batch_tokens=64, prefill_chunk_tokens=32, kv_watermark_frac=0.0),
                     np.random.default_rng(0), drafter=Drafter(DraftSpec(policy, {"gamma": 5}, 5), prof))
        with pytest.raises(InvalidArgumentError, match="more than gamma=3") as err:
            eng.run()
        return str(err.value)

    slow, fast, calls = both_ways(monkeypatch, go)
    assert calls == [] and slow == fast


def test_threshold_rounds_of_more_than_128_drafts_sum_as_numpy_does(monkeypatch):
    # review: numpy sums more than 128 values in recursive halves; the kernel's theta must follow
    scen = scenario(policy={"name": "threshold", "threshold": 0.0}, workload={"concurrency": 32, "num_requests": 64},
                    engine={"prefill": "disaggregated", "prefill_gpus": 4})
    slow, fast, calls = both_ways(monkeypatch, lambda: run(scen, seed=0).state)
    assert calls and max(calls) > 1
    assert_same_state(slow, fast)
    assert (fast.rounds["verify_tokens"] > 128).sum() > 10


ALL_POLICIES = [("dspark", {"gamma": 10}), ("goodput", {"gamma": 10}), ("threshold", {"gamma": 10, "threshold": 0.2}),
                ("dspark_async", {"gamma": 10, "lag_rounds": 1}), ("static", {"k": 10}), ("mtp1", {})]


@pytest.mark.parametrize("policy, params", ALL_POLICIES)
def test_no_scratch_the_kernel_did_not_write_is_read_back(policy, params, monkeypatch):
    # review: a pending round (its pass across an arrival) with prefilling requests and no room
    # for their chunks read its chunks back unwritten on resume (np.empty's leftovers could be
    # negative: a refusal). The kind: every buffer the kernel is handed starts as garbage here
    # (NaN, -5), and the runs must still be the rounds one by one
    orig = Engine._drafted_block_inputs

    def poisoned(self):  # noqa: ANN001, ANN202
        out = orig(self)
        if out is not None:
            drafts, ids, crossing = out[4][4]
            drafts[:], ids[:], crossing[:] = np.nan, -5, np.nan
            out[4][6][:] = -5
        return out

    monkeypatch.setattr(Engine, "_drafted_block_inputs", poisoned)
    sps = SPSTable(np.array([1, 128]), np.array([5.0, 20.0]))
    prof = flat_profile(kv_blocks=200, sps=sps)
    # one long decoder, then arrivals that prefill beside it with no room in an 8-token pass
    wl = workload([8, 40, 40, 40], [200, 20, 20, 20], [0.0, 0.013, 0.031, 0.052])
    slow, fast, calls = both_ways(monkeypatch, lambda: run_engine(prof, wl, policy, params, seed=0, max_batch_tokens=8,
                                                                   prefill_chunk_tokens=32, max_num_seqs=4))
    assert calls
    assert_same_state(slow, fast)


def test_a_patched_gate_reset_runs_round_by_round(monkeypatch):
    # review: the kernel clears the gate for a new run as FallbackGate._reset does; a patched
    # _reset must run instead (a policy reused for a second run calls it)
    from memtp_sim.engine import EngineSettings
    from memtp_sim.policies import make_policy
    from memtp_sim.policies._candidates import FallbackGate

    def pessimistic(self):  # noqa: ANN001, ANN202
        self._gain, self._skipped, self._last_round = -1.0, 0, -1

    monkeypatch.setattr(FallbackGate, "_reset", pessimistic)
    prof, wl = flat_profile(kv_blocks=400), workload(np.full(6, 16), np.full(6, 60), concurrency=3)

    def two_runs() -> tuple:
        pol = make_policy("goodput", {"gamma": 4, "probe_every": 4})
        st = EngineSettings(max_batch_tokens=64, prefill_chunk_tokens=32, kv_watermark_frac=0.0)
        Engine(prof, AcceptanceModel.fixed(0.7), wl, pol, st, np.random.default_rng(1)).run()
        out = Engine(prof, AcceptanceModel.fixed(0.7), wl, pol, st, np.random.default_rng(0)).run()
        return out, (pol._gate._gain, pol._gate._last_round, pol._gate._skipped)

    (slow, slow_gate), (fast, fast_gate), calls = both_ways(monkeypatch, two_runs)
    assert calls == []
    assert_same_state(slow, fast)
    assert slow_gate == fast_gate


def test_async_scheduler_without_lag_runs_round_by_round(monkeypatch):
    # lag 0 remembers every round's K (the policy never drops one): the kernel keeps no such history
    scen = scenario(policy={"name": "dspark_async", "lag_rounds": 0}, workload={"concurrency": 4, "num_requests": 8})
    slow, fast, calls = both_ways(monkeypatch, lambda: run(scen, seed=0).state)
    assert calls == []
    assert_same_state(slow, fast)


def test_async_scheduler_subclass_runs_round_by_round(monkeypatch):
    # the kernel keeps the capacity history in the policy's place: a subclass's _lagged_capacity runs instead
    from memtp_sim.engine import EngineSettings
    from memtp_sim.policies.dspark import DSparkAsyncParams, DSparkAsyncPolicy

    class Eager(DSparkAsyncPolicy):
        def _lagged_capacity(self, t):  # noqa: ANN001, ANN202
            found = super()._lagged_capacity(t)
            return 3 if found is None else found

    def build(policy) -> Engine:  # noqa: ANN001
        return Engine(flat_profile(pass_ms=10.0, kv_blocks=64), AcceptanceModel.fixed(0.7),
                      workload([8, 8, 8], [40, 40, 30]), policy,
                      EngineSettings(max_batch_tokens=64, prefill_chunk_tokens=32, kv_watermark_frac=0.0),
                      np.random.default_rng(0))

    calls = []
    orig = Engine._drafted_block
    monkeypatch.setattr(Engine, "_drafted_block", lambda self, *a: calls.append(1) or orig(self, *a))
    def first_drafted(state) -> int:  # noqa: ANN001 - the drafts the first round with decoding requests verified
        r = state.rounds
        return int(r["verify_tokens"][np.flatnonzero(r["num_decode"] > 0)[0]])

    eager = build(Eager(DSparkAsyncParams(gamma=4))).run()
    assert calls == [] and first_drafted(eager) > 0  # no warm-up: its own rule ran
    whole = build(DSparkAsyncPolicy(DSparkAsyncParams(gamma=4))).run()
    assert calls and first_drafted(whole) == 0


@pytest.mark.parametrize("module", ["threshold", "_candidates"])
def test_a_threshold_helper_replaced_by_a_patch_runs_round_by_round(module, monkeypatch):
    # the kernel does take_top's work in its place: a patched take_top (where the policy finds
    # it, or where it was defined) must run instead, round by round, and change the run
    import importlib

    mod = importlib.import_module(f"memtp_sim.policies.{module}")
    scen = scenario(policy={"name": "threshold", "threshold": 0.3}, workload={"concurrency": 4, "num_requests": 12})
    calls = []
    orig = Engine._drafted_block
    monkeypatch.setattr(Engine, "_drafted_block", lambda self, *a: calls.append(1) or orig(self, *a))
    plain = run(scen, seed=0).state
    assert calls
    calls.clear()
    orig_take = mod.take_top
    monkeypatch.setattr(mod, "take_top", lambda a, n: orig_take(a, min(n, 1)))
    patched = run(scen, seed=0).state
    assert calls == []
    if module == "threshold":  # the policy calls its own module's name: the patch changes the plan
        assert patched.rounds["verify_tokens"].max() <= 1
        with pytest.raises(AssertionError):
            assert_same_state(plain, patched)


def test_a_static_plan_trimmed_to_the_budget_goes_on_in_python(monkeypatch):
    # 16 users drafting 5 each do not fit a 64-token pass: fit_to_budget trims those rounds (the
    # round path), the rounds that fit run in blocks, and both ways agree
    r = crowded_pass_both_ways(monkeypatch, {"name": "static", "k": 5}, seed=1)
    drafted = r["verify_tokens"] > 0
    assert np.any(r["verify_tokens"][drafted] < 5 * r["num_decode"][drafted])  # trimmed rounds
    assert np.any(r["verify_tokens"][drafted] == 5 * r["num_decode"][drafted])  # whole ones


@pytest.mark.parametrize("policy", [{"name": "dspark"}, {"name": "static", "k": 4}, {"name": "mtp1"},
                                    {"name": "threshold", "threshold": 0.4}, {"name": "dspark_async"},
                                    {"name": "goodput"}])
@pytest.mark.parametrize("name", ["closed-4", "h200-poisson", "kv-pressure"])
def test_drafted_blocks_match_the_numpy_engine(name, policy, monkeypatch):
    # an oracle with no kernel at all: numpy draws, numpy scan (or the static plan), numpy acceptance
    scen = scenario(**({"policy": policy} | SCENARIOS[name]))
    monkeypatch.setattr(_compiled, "ENABLED", False)
    numpy_state = run(scen, seed=2).state
    monkeypatch.setattr(_compiled, "ENABLED", True)
    assert_same_state(numpy_state, run(scen, seed=2).state)


@pytest.mark.parametrize("diag_rounds", [1, 37, 500])
def test_the_diagnostics_fill_up_inside_a_block(diag_rounds, monkeypatch):
    # the calibration diagnostics keep the first DIAG_ROUNDS request-rounds: the limit falls
    # inside a block (and inside one round's rows) and the recorded rows must be the same
    monkeypatch.setattr(Engine, "DIAG_ROUNDS", diag_rounds)
    scen = scenario(policy={"name": "dspark"}, workload={"concurrency": 6, "num_requests": 30})
    slow, fast, calls = both_ways(monkeypatch, lambda: run(scen, seed=1).state)
    assert max(calls) > 1
    assert_same_state(slow, fast)
    assert fast.confidence_raw.shape[0] == diag_rounds


def gate_blocks(monkeypatch, scen, seed: int):  # noqa: ANN201 - (dict, list[int], EngineState)
    """The drafted-block calls of a run: their count, the rounds they kept, the blocks holding
    both plain (k 0) and drafted rounds, the run's rounds and its plain ones; the rounds at
    which a call started where the gate announced plain rounds; and the run's state."""
    calls, in_plain = [], []
    real_block = Engine._drafted_block

    def block(self, dec, pre, gamma, round_index, *a):  # noqa: ANN001, ANN202
        if self.policy.plain_rounds_ahead(round_index):
            in_plain.append(round_index)
        out = real_block(self, dec, pre, gamma, round_index, *a)
        calls.append((round_index, out[0]))
        return out

    monkeypatch.setattr(Engine, "_drafted_block", block)
    state = run(scen, seed=seed).state
    verify = state.rounds["verify_tokens"]
    mixed = sum(1 for at, n in calls if np.any(verify[at: at + n] == 0) and np.any(verify[at: at + n] > 0))
    return dict(calls=len(calls), rounds=sum(n for _, n in calls), mixed=mixed, total=verify.size,
                plain_rounds=int(np.sum(verify == 0))), in_plain, state


@pytest.mark.parametrize("policy", [{"name": "dspark"}, {"name": "dspark", "early_stop": True}, {"name": "goodput"}])
def test_the_gate_s_plain_rounds_run_inside_drafted_blocks(policy, monkeypatch):
    # at 64 users on gfx1151 drafting stops paying: the gate decodes plainly between probes, and
    # a block goes on through its plain rounds and probes (it stopped at each, 176 calls for the
    # benchmark's 1,552 rounds); the same answers as round by round
    scen = scenario(policy=policy, workload={"concurrency": 64, "num_requests": 150},
                    engine={"prefill": "disaggregated", "prefill_gpus": 4})
    monkeypatch.setattr(Engine, "DRAFT_BLOCKS", False)
    slow = run(scen, seed=0).state
    monkeypatch.setattr(Engine, "DRAFT_BLOCKS", True)
    blocks, _, fast = gate_blocks(monkeypatch, scen, 0)
    assert_same_state(slow, fast)
    assert blocks["plain_rounds"] >= 50 and np.any(fast.rounds["verify_tokens"] > 0)
    assert blocks["mixed"] >= 1 and blocks["calls"] * 5 < blocks["rounds"]


@pytest.mark.parametrize("seed", range(16))
def test_drafted_blocks_match_round_by_round_on_random_workloads(seed, monkeypatch):
    random_case(seed, monkeypatch)


@pytest.mark.parametrize("block_tokens", [1, 3, 5, 12, 32])
@pytest.mark.parametrize("seed", range(3))
def test_kv_blocks_of_any_size_match_the_numpy_engine(block_tokens, seed, monkeypatch):
    # oracle: the numpy engine (the compiled kernels off), whose KV blocks are -(-tokens // size);
    # the kernels shift where the size is a power of two and divide where it is not: both sizes,
    # under KV pressure (preemptions, trimmed drafts), blocks and round by round
    fast = random_case(seed, monkeypatch, block_tokens)
    monkeypatch.setattr(_compiled, "ENABLED", False)
    assert_same_state(random_case(seed, monkeypatch, block_tokens), fast)
    assert fast.rounds["kv_blocks_after"].max() > 0


def random_case(seed, monkeypatch, block_tokens=16):
    """A random hand-made workload run both ways (asserting they agree); the blocked run's state.
    ``block_tokens``: the KV cache's block size (the kernels shift by a power of two, divide by
    any other)."""
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(3, 25))
    kv_blocks = int(rng.integers(24, 120))  # tight: requests wait for memory, drafts are trimmed, requests preempted
    prompt = np.minimum(rng.integers(1, 300, n), kv_blocks * block_tokens // 3)
    output = np.minimum(rng.integers(1, 150, n), kv_blocks * block_tokens // 3)
    closed = rng.random() < 0.5
    wl = (workload(prompt, output, concurrency=int(rng.integers(1, 7)), think_time_s=float(rng.choice([0.0, 0.05])))
          if closed else workload(prompt, output, np.sort(rng.exponential(0.2, n)).cumsum()))
    # a measured range that may end inside the pass (B = its last point measured, beyond it
    # extrapolated or refused), with rising pass times so that the plan has a best B
    beyond = str(rng.choice(["error", "roofline"]))
    top = 64 if beyond == "error" else int(rng.choice([24, 32, 64]))  # "error": the table must hold every pass
    pass_ms = float(rng.choice([5.0, 10.0]))
    sps = SPSTable(np.array([1, top // 2, top]), np.array([pass_ms, pass_ms * 1.3, pass_ms * 2.0]),
                   beyond_max=beyond, dense_limit=64)
    prof = flat_profile(kv_blocks=kv_blocks, sps=sps, block_tokens=block_tokens)
    settings = {"max_num_seqs": int(rng.integers(1, 9)), "kv_watermark_frac": float(rng.choice([0.0, 0.05])),
                "max_batch_tokens": int(rng.choice([32, 64])), "prefill_chunk_tokens": int(rng.choice([8, 32]))}
    params = {"gamma": int(rng.integers(1, 8)), "early_stop": bool(rng.random() < 0.5),
              "fallback": bool(rng.random() < 0.5)}
    # static k and threshold: budget trims at 32 tokens
    policy = str(rng.choice(["dspark", "dspark", "static", "mtp1", "threshold", "dspark_async", "goodput", "no_spec"]))
    if policy == "no_spec":  # every round plain: blocks where prefill chunks share the passes
        params = {}
    elif policy == "goodput":
        params = {"gamma": params["gamma"], "fallback": params["fallback"]}
    elif policy == "dspark_async":
        params = {"gamma": params["gamma"], "lag_rounds": int(rng.integers(1, 4))}
    elif policy != "dspark":
        params = ({"k": params["gamma"]} if policy == "static" else {} if policy == "mtp1" else
                  {"gamma": params["gamma"], "threshold": float(rng.choice([0.0, 0.2, 0.6]))})
    slow, fast, calls = both_ways(
        monkeypatch, lambda: run_engine(prof, wl, policy, params, seed=seed, **settings))
    # no_spec calls the kernel only for a round that holds decoding requests and prefill chunks
    # (one user's prompt prefills alone): its blocks are checked on the scenarios above; the numpy
    # engine (compiled kernels off) runs no blocks
    assert calls or policy == "no_spec" or not _compiled.ENABLED
    assert_same_state(slow, fast)
    return fast


def test_the_random_workloads_reach_the_measured_range_s_last_point_and_beyond(monkeypatch):
    # the fuzz above must price passes at the table's last measured B and beyond it (the
    # round log's cost_extrapolated flag), or it would not test those rules
    extrapolated, at_top = 0, 0
    for seed in range(16):
        state = random_case(seed, monkeypatch)
        extrapolated += int(state.rounds["cost_extrapolated"].sum())
        at_top += int(np.isin(state.rounds["batch_tokens"], [24, 32, 64]).sum())
    assert extrapolated > 0 and at_top > 0


@pytest.mark.parametrize("gamma", [1, 3, 7])
@pytest.mark.parametrize("name", ["closed-4", "poisson-colocated", "disaggregated", "h200-context", "kv-pressure"])
def test_goodput_drafted_blocks_match_round_by_round(name, gamma, monkeypatch):
    # goodput verifies one k for every request, the best expected rate's (tau_k from the survivals'
    # column sums), and reports to its fallback gate: bit for bit, rates included
    scen = scenario(**(SCENARIOS[name] | {"policy": {"name": "goodput", "gamma": gamma}}))
    slow, fast, calls = both_ways(monkeypatch, lambda: run(scen, seed=7).state)
    assert calls and max(calls) > 1, "no drafted block of two rounds or more: the test would prove nothing"
    assert_same_state(slow, fast)
    r = fast.rounds
    drafted = r["verify_tokens"] > 0
    assert np.all(r["verify_tokens"][drafted] % r["num_decode"][drafted] == 0)  # one k for all


@pytest.mark.parametrize("gamma", [1, 7])
def test_goodput_at_64_users_falls_back_and_sums_columns_as_numpy_does(gamma, monkeypatch):
    # 64 users: the gate turns to plain rounds and probes (inside blocks), and one drafted
    # column of 64 survivals is summed pairwise by numpy (a.sum(axis=0) of a single column)
    scen = scenario(policy={"name": "goodput", "gamma": gamma}, workload={"concurrency": 64, "num_requests": 150},
                    engine={"prefill": "disaggregated", "prefill_gpus": 4})
    slow, fast, calls = both_ways(monkeypatch, lambda: run(scen, seed=0).state)
    assert calls
    assert_same_state(slow, fast)
    r = fast.rounds
    assert np.any(r["verify_tokens"] == 0) and np.any(r["num_decode"] >= 16)


@pytest.mark.parametrize("name", ["closed-4", "poisson-colocated", "closed-8-chunked", "closed-8-tight-pass",
                                  "h200-poisson", "kv-pressure"])
def test_no_speculation_runs_the_rounds_with_prefill_chunks_in_blocks(name, monkeypatch):
    # plain blocks take no round that carries prefill chunks: no_spec's such rounds run in the
    # drafted-block kernel as rounds of k 0 (before, every one of them ran in Python); bit for
    # bit as round by round, and the round log's depth is the drafter's (0), not the buffers' 1
    scen = scenario(**(SCENARIOS[name] | {"policy": {"name": "no_spec"}}))
    slow, fast, calls = both_ways(monkeypatch, lambda: run(scen, seed=3).state)
    assert calls and max(calls) > 1, "no block of two rounds or more: the test would prove nothing"
    assert_same_state(slow, fast)
    r = fast.rounds
    assert np.all(r["depth"] == 0) and np.all(r["verify_tokens"] == 0) and np.any(r["prefill_tokens"] > 0)


def test_a_static_policy_whose_plan_is_replaced_runs_round_by_round(monkeypatch):
    # the kernel verifies k of every request in the static policies' place: a subclass's plan,
    # or a patch of the module's _every_request, must run instead, round by round
    import memtp_sim.policies.static as static_mod
    from memtp_sim.engine import EngineSettings

    class Halved(static_mod.StaticPolicy):
        def plan(self, view):  # noqa: ANN001, ANN202
            return static_mod.RoundPlan(np.full(view.num_requests, max(1, self.params.k // 2), dtype=np.int64))

    def build(policy) -> Engine:  # noqa: ANN001
        return Engine(flat_profile(pass_ms=10.0, kv_blocks=64), AcceptanceModel.fixed(0.7),
                      workload([8, 8, 8], [40, 40, 30]), policy,
                      EngineSettings(max_batch_tokens=64, prefill_chunk_tokens=32, kv_watermark_frac=0.0),
                      np.random.default_rng(0))

    def per_request(state) -> set:  # noqa: ANN001 - the drafts each decoding request verified
        r = state.rounds
        return set((r["verify_tokens"][r["num_decode"] > 0] / r["num_decode"][r["num_decode"] > 0]).tolist())

    calls = []
    orig = Engine._drafted_block
    monkeypatch.setattr(Engine, "_drafted_block", lambda self, *a: calls.append(1) or orig(self, *a))
    halved = build(Halved(Halved.Params(k=4))).run()
    assert calls == [] and per_request(halved) == {2}
    orig_every = static_mod._every_request
    monkeypatch.setattr(static_mod, "_every_request", lambda view, k: orig_every(view, 1))
    patched = build(static_mod.StaticPolicy(static_mod.StaticParams(k=4))).run()
    assert calls == [] and per_request(patched) == {1}
    monkeypatch.setattr(static_mod, "_every_request", orig_every)
    whole = build(static_mod.StaticPolicy(static_mod.StaticParams(k=4))).run()
    assert calls and per_request(whole) == {4}


@pytest.mark.parametrize("offset", [0, 1, 2])
def test_an_arrival_exactly_at_a_round_end_is_seen_by_the_next_round(offset, monkeypatch):
    # Every pass costs exactly 10 ms and drafting nothing, so drafted rounds end on the float grid
    # 0 + 0.01 + 0.01 + ...; requests arriving on that grid tie with a round's end: the round-by-round
    # engine lets the arrival in before the next round, so a block must stop at such a round.
    wl, arrival = grid_tie_workload(offset)
    prof = flat_profile(pass_ms=10.0, kv_blocks=64)
    params = {"gamma": 3, "fallback": False}
    slow, fast, calls = both_ways(monkeypatch, lambda: run_engine(prof, wl, "dspark", params, max_num_seqs=4))
    assert max(calls) > 1
    assert_same_state(slow, fast)
    ends = fast.rounds["start_s"] + fast.rounds["duration_s"]
    assert np.isin(arrival[1:], ends).sum() >= 2  # ties this test is about happened (not all: idle gaps shift the grid)


@pytest.mark.parametrize("top", [4, 8])
def test_a_flat_table_verifies_every_draft_and_flags_passes_beyond_it(top, monkeypatch):
    # Hand-derived: one request, gamma 7, a flat table (every B costs the same, beyond the last
    # point by the roofline's flat line), a zero-cost drafter: each added draft raises the token
    # rate, so Algorithm 1 verifies all 7 and every pass holds B = 1 + 7 = 8 tokens, measured when
    # the table reaches 8 and extrapolated when it stops at 4.
    sps = SPSTable(np.array([1, top]), np.array([10.0, 10.0]), beyond_max="roofline", dense_limit=64)
    prof = flat_profile(kv_blocks=256, sps=sps)
    wl = workload([16], [400])
    params = {"gamma": 7, "fallback": False}
    slow, fast, calls = both_ways(monkeypatch, lambda: run_engine(prof, wl, "dspark", params,
                                                                  acceptance=AcceptanceModel.fixed(0.6)))
    assert_same_state(slow, fast)
    assert sum(calls) > 0.9 * fast.rounds["batch_tokens"].size  # the rounds ran as blocks
    drafted = fast.rounds["verify_tokens"] > 0
    assert np.all(fast.rounds["batch_tokens"][drafted] == 8) and np.all(fast.rounds["verify_tokens"][drafted] == 7)
    assert np.all(fast.rounds["cost_extrapolated"][drafted] == (1 if top < 8 else 0))


def test_a_long_stretch_is_several_drafted_blocks(monkeypatch):
    # one request of 1,500 output tokens alone, blocks capped at 100 rounds: several blocks in a row
    import memtp_sim.engine as eng

    monkeypatch.setattr(eng, "_MAX_BLOCK_ROUNDS", 100)
    wl = workload([16], [1500])
    prof = flat_profile(pass_ms=10.0, kv_blocks=512)
    slow, fast, calls = both_ways(monkeypatch, lambda: run_engine(prof, wl, "dspark", {"fallback": False}))
    assert max(calls) == 100 and calls.count(100) >= 3
    assert_same_state(slow, fast)


def test_a_round_whose_checks_fail_goes_on_in_python_and_raises_the_same_error(monkeypatch):
    # a drafted round the block cannot keep (here the memory check of Engine._check_pass fails:
    # the memory left after weights is shrunk under the KV in use) is handed to the round path
    # drawn but unplanned, which raises; both ways raise the same error at the same round
    from memtp_sim.engine import EngineSettings
    from memtp_sim.errors import EngineInvariantError
    from memtp_sim.policies import make_policy

    def go() -> str:
        eng = Engine(flat_profile(pass_ms=10.0, kv_blocks=64), AcceptanceModel.fixed(0.7), workload([8, 8], [40, 40]),
                     make_policy("dspark", {"gamma": 3, "fallback": False}),
                     EngineSettings(max_batch_tokens=64, prefill_chunk_tokens=32, kv_watermark_frac=0.0),
                     np.random.default_rng(0))
        eng.log.fixed_gib = 2.5 / 64  # room for two KV blocks (the prompts'), the drafter holding nothing
        with pytest.raises(EngineInvariantError, match="exceed") as err:
            eng.run()
        return str(err.value)

    slow_msg = (monkeypatch.setattr(Engine, "DRAFT_BLOCKS", False), go())[1]
    monkeypatch.setattr(Engine, "DRAFT_BLOCKS", True)
    handed_over = []
    orig = Engine._drafted_block
    monkeypatch.setattr(Engine, "_drafted_block",
                        lambda self, *a: (lambda out: handed_over.append(out[3] is not None) or out)(orig(self, *a)))
    assert go() == slow_msg
    assert handed_over[-1], "the failing round was not handed to the round path drawn (the case under test)"


def test_a_subclass_or_instance_that_replaces_a_mirrored_method_runs_round_by_round(monkeypatch):
    # the kernel does the work of the engine's own round steps: an engine whose step is another
    # function (a subclass's, or one set on the instance) must run that function, round by round
    from memtp_sim.engine import EngineSettings
    from memtp_sim.policies import make_policy

    seen = []

    class Traced(Engine):
        def _check_pass(self, *a):  # noqa: ANN002, ANN202
            seen.append(1)
            return super()._check_pass(*a)

    def build(cls):
        return cls(flat_profile(pass_ms=10.0, kv_blocks=64), AcceptanceModel.fixed(0.7), workload([8, 8], [40, 40]),
                   make_policy("dspark", {"gamma": 3, "fallback": False}),
                   EngineSettings(max_batch_tokens=64, prefill_chunk_tokens=32, kv_watermark_frac=0.0),
                   np.random.default_rng(0))

    plain = build(Engine).run()
    traced = build(Traced).run()
    assert_same_state(plain, traced)
    assert len(seen) == traced.rounds["start_s"].size  # every round through the subclass's step
    seen.clear()
    eng = build(Engine)
    eng._check_pass = lambda *a: seen.append(1) or Engine._check_pass(eng, *a)
    assert_same_state(plain, eng.run())
    assert len(seen) == plain.rounds["start_s"].size


_KERNEL_CALL = '''
import numpy as np
from memtp_sim import _kernels as K

def ints(*v):
    return np.array(v, dtype=np.int64)

price = (False, np.ones(9), None, None, 0.0, 0.0, 0.0, 1, 8, 1, False)
args = dict(run=ints(0), prefilled=ints(0), target=ints(0), domain=ints(0), difficulty=np.zeros(1),
            generated=ints(0), output=ints(5), num_rounds=ints(0), verified=ints(0), accepted=ints(0),
            tokens=ints(0), blocks=ints(0), first_token_at=np.zeros(1), mu=np.zeros(1), slope=np.zeros(1),
            base=None, sigma_round=0.0, oracle=True, noise_sd=0.0, overconfidence=1.0, temps=np.ones(2),
            rng=np.random.default_rng(), head_rng=np.random.default_rng(), verify_price=price,
            decode_price=price, separate_decode=False, draft_times=np.zeros(2), gamma=2, max_batch_tokens=8,
            prefill_chunk_tokens=8, block_tokens=16, capacity=8, blocks_used=0, now=0.0, next_event=100.0,
            overhead_s=0.0, early_stop=False, plan_kind=0, fixed_k=0, threshold=0.0, lag_rounds=0,
            history=np.zeros((4, 2), dtype=np.int64), history_len=0, block_gib=0.0, held_gib=0.0, fixed_gib=1.0,
            gate=(True, 0.1, 0.0, -1, 0, 16, 0.0), coherence=(0.1, 1.0, 0, False), round_index=0, max_rounds=4,
            rows=[], row_consts=(0, 1, 0), dec_out=ints(0), pre_out=ints(0), probs=np.empty((1, 2)),
            raw=np.empty((1, 2)), conf=np.empty((1, 2)), finished=ints(0), diag_raw=None, diag_conf=None,
            diag_would=None, lengths_out=ints(0), chunks_out=ints(0), crossing=np.zeros(2))
# a valid elastic controller: max_depth 4, 1 GiB heads, R thresholds, dwell 2, no margin, epsilon,
# 8 GiB left after weights, nobody waiting, no earlier round
ELASTIC = (4, 1.0, 0.3, 0.9, 2, 0.0, 1e-9, 8.0, 0, -1, -1, -1, -1, 0)
# a valid acceptance_target (kind 2): depth 4, 1 decoding request, 10% tax, speculation on, a 1 ms
# switch, a plain round's overhead, the first round's k 2 = the width; EMA factor, a band no EMA
# leaves, k_min 1, probe_every 4; k 2, no EMA yet, no round off
CONTROL = (2, 4, 1, 1.1, True, 0.001, 0.0005, 2, (0.1, 0.0, 1.0, 1, 4), (2, float("nan"), 0))
# probing (kind 3) at depth 2: probe every 4 rounds, no host time, drafting times by k, the
# acceptance's buffer; no round since the probe, no probe yet
PROBING = (3, 2, 1, 1.1, True, 0.001, 0.0005, 2, (4, 0.0, np.zeros(3), np.zeros(2)), (0, False, -1))


def two_requests(rows=2, priced=3, limit=2, kind=tuple):
    # going on past a remote prefill's end (absorb with events): request 0 decodes, request 1's
    # prompt is prefilled on another GPU until 1 us (the next event) and then admitted (the batch
    # grows to 2); the out arrays get ``rows`` rows, the drafting times ``priced`` entries,
    # admission ``limit``; the fields to update the valid call's with
    z, nan2 = (lambda: ints(0, 0)), (lambda: np.full(2, np.nan))
    two = dict(prefilled=z(), target=z(), domain=z(), difficulty=np.zeros(2), generated=z(), output=ints(5, 5),
               num_rounds=z(), verified=z(), accepted=z(), tokens=z(), blocks=z(), first_token_at=nan2(),
               next_event=1e-6, draft_times=np.zeros(priced), row_consts=(0, 1, 1), finished=z(),
               dec_out=np.zeros(rows, dtype=np.int64), pre_out=np.zeros(rows, dtype=np.int64),
               probs=np.empty((rows, 2)), raw=np.empty((rows, 2)), conf=np.empty((rows, 2)),
               lengths_out=np.zeros(rows, dtype=np.int64), chunks_out=np.zeros(rows, dtype=np.int64), max_rounds=8)
    events = (np.array([1e-6]), ints(3), ints(1), 1, float("inf"), 2, 0, 0, limit, z(), ints(8, 8),
              np.zeros(2, dtype=bool), nan2(), two["first_token_at"], nan2(), (two["target"], two["prefilled"]))
    two["absorb"] = kind((2, nan2(), np.array([2, 1], dtype=np.int8), np.zeros(16, dtype=np.int8),
                          np.zeros(16, dtype=np.int64), np.zeros(16), 2, 2, 0, np.zeros(2), np.zeros(2, dtype=bool),
                          0.0, events))
    return two
'''


@pytest.mark.parametrize("bad", [
    "gate=(True, 0.1)", "coherence=(0.1,)", "row_consts=()", "plan_kind=1, fixed_k=3", "plan_kind=1, fixed_k=0",
    "plan_kind=2, threshold=1.5", "plan_kind=2, threshold=float('nan')", "plan_kind=6", "plan_kind=-1",
    "plan_kind=5, fixed_k=-1", "plan_kind=5, fixed_k=128",
    "plan_kind=3, lag_rounds=0",
    "history=np.zeros((4, 3), dtype=np.int64)", "history=np.zeros((4, 2))", "history_len=5", "history_len=-1",
    # the crossing round's out buffer of another size
    "crossing=np.zeros(6)", "crossing=np.zeros(1)",
    # the elastic ensemble's controller: a short tuple, a list, a depth beyond max_depth, a head
    # that costs nothing, thresholds the wrong way round, no dwell, a negative waiting head
    "elastic=(4, 1.0)", "elastic=list(ELASTIC)", "elastic=(1,) + ELASTIC[1:]", "elastic=ELASTIC[:1] + (0.0,) + ELASTIC[2:]",
    "elastic=ELASTIC[:2] + (0.9, 0.3) + ELASTIC[4:]", "elastic=ELASTIC[:4] + (0,) + ELASTIC[5:]",
    "elastic=ELASTIC[:8] + (-1,) + ELASTIC[9:]",
    # the tower coherence's levels: a short tuple, fewer levels than positions, depth 0, float counts
    "tower=(np.ones(2),)", "tower=(np.ones(1), ints(0), 1)", "tower=(np.ones(2), ints(0, 0), 0)",
    "tower=(np.ones(2), np.zeros(2), 1)",
    # a dynamic controller: a short tuple, a list, no such kind, settings of another kind, a depth
    # under the width, a tax under 1, a first k neither the width nor 0, an EMA factor over 1, a band the
    # wrong way round, a short state, probing's drafting times too short for its depth
    "control=CONTROL[:3]", "control=list(CONTROL)", "control=(9,) + CONTROL[1:]", "control=(1,) + CONTROL[1:]",
    "control=CONTROL[:1] + (1,) + CONTROL[2:]", "control=CONTROL[:3] + (0.9,) + CONTROL[4:]",
    "control=CONTROL[:7] + (1,) + CONTROL[8:]", "control=CONTROL[:8] + ((1.5, 0.0, 1.0, 1, 4),) + CONTROL[9:]",
    "control=CONTROL[:8] + ((0.1, 0.8, 0.4, 1, 4),) + CONTROL[9:]", "control=CONTROL[:9] + ((2, float('nan')),)",
    "control=PROBING[:8] + ((4, 0.0, np.zeros(2), np.zeros(2)),) + PROBING[9:]",
    # going on past remote prefills' ends: the out arrays or the drafting times too short for the
    # batch admissions may grow to (review: rows past them were written and read); absorb a list
    "**two_requests(rows=1)", "**two_requests(priced=2)", "**two_requests(kind=list)",
])
def test_the_kernel_refuses_bad_fields_instead_of_crashing(bad):
    # review: the module reads tuples and the pending round's ids without bounds checks; short
    # tuples and a resume with ids or lengths out of range crashed the interpreter (signal 11)
    import subprocess
    import sys

    code = _KERNEL_CALL + (f"args.update({bad})\ntry:\n    K.drafted_block(**args)\n    print('ran')\n"
                           "except (TypeError, ValueError, IndexError) as e:\n    print('refused:', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"exit code {out.returncode}: {out.stderr[-300:]}"
    assert out.stdout.startswith("refused:"), out.stdout


def test_the_valid_call_of_the_refusal_test_runs():
    # the oracle of the test above: without the bad field the same call runs a round
    import subprocess
    import sys

    for extra in ("", "args.update(elastic=ELASTIC)\n",  # a fixed drafter, the elastic ensemble, its tower,
                  "args.update(elastic=ELASTIC, tower=(np.ones(2), ints(0, 0), 2))\n",  # dynamic controllers
                  "args.update(control=CONTROL, plan_kind=1, fixed_k=2)\n",
                  "args.update(control=(1,) + CONTROL[1:8] + ((), ()), plan_kind=1, fixed_k=2)\n",
                  "args.update(control=PROBING, plan_kind=1, fixed_k=2)\n", "args.update(two_requests())\n"):
        code = _KERNEL_CALL + extra + "out = K.drafted_block(**args)\nprint(out[1], len(args['rows']))\n"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr[-300:]
        rounds, rows = map(int, out.stdout.split())
        assert rounds >= 2 and rows == rounds  # a second round: the elastic call asked its controller


def test_a_drafted_block_going_on_past_a_prefill_s_end_admits_it_and_returns_the_queue_it_mirrored():
    # review: the valid call above checked rounds only, and the queue length the block returns
    # (which the engine compares with its own) was untested; and each refusal of a malformed
    # absorb must say why (the refusal test above checks only that it is refused)
    import ast  # (the child prints its results with repr)
    import subprocess
    import sys

    code = _KERNEL_CALL + (
        "args.update(two_requests())\nout = K.drafted_block(**args)\nab = args['absorb']\n"
        "for x in (out[-1], ab[3][:out[-1][0]].tolist(), ab[4][:out[-1][0]].tolist(), "
        "sorted({r[4] for r in args['rows']})):\n    print(repr(x))\n"
        "for bad in (dict(rows=1), dict(priced=2), dict(rows=1, kind=list)):\n"
        "    args.update(two_requests(**bad))\n"
        "    try:\n        K.drafted_block(**args)\n        print('ran')\n"
        "    except (TypeError, ValueError) as e:\n        print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-300:]
    lines = out.stdout.splitlines()
    # request 1's prefill ends inside the first pass: the wait's key (1), its end (2), its
    # admission (3), then both complete (0, 0); the mirror leaves nothing in remote prefill, 1 GPU
    # idle, nobody waiting, and the prefill queue empty (0: mirrored; -1 would say not mirrored)
    absorbed, codes, ids, batches = (ast.literal_eval(x) for x in lines[:4])
    assert absorbed == (5, 2, 1, 0, 0, 0) and codes == [1, 2, 3, 0, 0], lines[:4]
    assert ids[1:3] == [1, 1] and sorted(ids[3:]) == [0, 1] and 2 in batches, lines[:4]  # (rows' batch sizes)
    assert lines[4].startswith("absorb: admissions may run 2 requests, but the out arrays hold 1 rows"), lines[4]
    assert lines[5] == "draft_times: 3 elements needed, got 2", lines[5]
    assert lines[6] == "absorb: a tuple is required, got list", lines[6]


@pytest.mark.parametrize("patch", ["coherence_instance", "table_class", "policy_instance", "module_function",
                                   "drafter_instance"])
def test_a_collaborator_replaced_by_a_patch_runs_round_by_round(patch, monkeypatch):
    # review: only the base classes' methods were compared, so a patch on an instance (the run's
    # coherence, policy, drafter) or on a cost table's or a module's function the kernel mirrors
    # was bypassed; each patch here changes the results, and both ways must show the change
    import memtp_sim.policies.dspark as dspark_mod
    from memtp_sim.engine import EngineSettings
    from memtp_sim.policies import make_policy

    def build() -> Engine:
        # later arrivals' prompts are prefilled in chunks inside drafted rounds
        return Engine(flat_profile(pass_ms=10.0, kv_blocks=64), AcceptanceModel.fixed(0.7),
                      workload([100, 100, 100], [40, 30, 50], [0.0, 0.05, 0.1]),
                      make_policy("dspark", {"gamma": 3, "fallback": True}),
                      EngineSettings(max_batch_tokens=64, prefill_chunk_tokens=32, kv_watermark_frac=0.0),
                      np.random.default_rng(0))

    def patched() -> Engine:
        eng = build()
        if patch == "coherence_instance":
            orig = eng.coherence.update
            eng.coherence.update = lambda a, v: orig(0, v)
        elif patch == "policy_instance":
            orig_plan = eng.policy.plan_round
            eng.policy.plan_round = lambda c, *a: (lambda r: (np.zeros_like(r[0]), *r[1:]))(orig_plan(c, *a))
        elif patch == "drafter_instance":
            eng.drafter.prefill_time_s = lambda tokens: 0.001 * tokens
        return eng

    if patch == "table_class":
        orig_t = SPSTable.pass_time_s
        monkeypatch.setattr(SPSTable, "pass_time_s", lambda self, b: orig_t(self, b) * 2)
    elif patch == "module_function":
        orig_rate = dspark_mod.plain_rate_of
        monkeypatch.setattr(dspark_mod, "plain_rate_of", lambda *a: orig_rate(*a) * 3)
    plain = build()
    monkeypatch.setattr(Engine, "DRAFT_BLOCKS", False)
    slow = patched().run()
    monkeypatch.setattr(Engine, "DRAFT_BLOCKS", True)
    fast = patched().run()
    assert_same_state(slow, fast)
    with pytest.raises(AssertionError):  # the patch changed the run (else this test would prove nothing)
        monkeypatch.undo()
        assert_same_state(plain.run(), fast)


def test_a_kernel_built_against_another_numpy_runs_round_by_round(monkeypatch):
    # its draws come from the numpy C library it was linked with: under another numpy they may
    # differ from the run's Generators, so the engine warns once and runs the rounds one by one
    import memtp_sim.engine as eng

    calls = []
    monkeypatch.setattr(_compiled.kernels, "NUMPY_BUILD_VERSION", "0.0.0-other")
    monkeypatch.setattr(eng, "_numpy_warned", False)
    orig = Engine._drafted_block
    monkeypatch.setattr(Engine, "_drafted_block", lambda self, *a: calls.append(1) or orig(self, *a))
    scen = scenario(policy={"name": "dspark"}, workload={"concurrency": 2, "num_requests": 6})
    with pytest.warns(RuntimeWarning, match="built against numpy 0.0.0-other"):
        state = run(scen, seed=0).state
    assert calls == []
    monkeypatch.undo()
    assert_same_state(state, run(scen, seed=0).state)


def test_the_run_long_arguments_are_still_the_engines_own_at_the_end(monkeypatch):
    # the kernel's run-long arguments are gathered once per run (Engine._drafted_block_inputs):
    # correct only while none of those objects is rebound during the run. The guard: every call
    # got the very arrays and generators the engine (and its KV manager and acceptance model) holds at the end
    from memtp_sim._compiled import kernels

    calls, engines = [], []
    real_kernel, real_init = kernels.drafted_block, Engine.__init__
    monkeypatch.setattr(kernels, "drafted_block", lambda *a: calls.append(a[1:27]) or real_kernel(*a))
    monkeypatch.setattr(Engine, "__init__", lambda self, *a, **k: engines.append(self) or real_init(self, *a, **k))
    for name in ("disaggregated", "closed-8-chunked", "h200-context"):
        calls.clear()
        engines.clear()
        run(scenario(**SCENARIOS[name]), seed=2)
        eng = engines[-1]
        kv, acc = eng.kv, eng.acc
        want = (eng.prefilled, eng.prefill_target, eng.domain, eng.difficulty, eng.generated, eng.output,
                eng.num_rounds, eng.verified, eng.accepted, kv.tokens, kv.blocks, eng.first_token_at, acc.mu,
                acc.slope)
        assert calls, f"{name}: no drafted block ran"
        for args in calls:
            assert all(a is b for a, b in zip(args, want)), name
            assert args[19] is eng.temps and args[20] is eng.rng and args[21] is eng.head_rng, name


# ---------------------------------------------------------------------------------------------
# the elastic MEMTP ensemble: its depth controller resizes inside the blocks
# ---------------------------------------------------------------------------------------------

ELASTIC_KV = {"table": {1: 20.0, 64: 25.0, 512: 80.0},
              "memory": {"gpu_allocatable_gib": 4.5, "reserve_gib": 0.5, "weights_bytes": 1 << 30,
                         "kv_bytes_per_token": 131072, "max_model_len": 8192}}
ELASTIC = {
    # KV binds: admission waits (the waiting head's KV counts against the heads: a prompt's KV is
    # worth several 0.1-GiB heads), heads are released for memory inside what would be a block
    # (before the dwell a coherence shrink would wait for) and regrown, requests preempted
    "elastic-kv": dict(workload={"concurrency": 24, "num_requests": 48}, hardware=ELASTIC_KV,
                       memtp={"depth": "elastic", "max_depth": 8, "head_cost_gib": 0.1, "min_dwell_rounds": 3}),
    # coherence steers: acceptance falls along the block, the ensemble shrinks and grows after its dwell
    "elastic-coherence": dict(workload={"concurrency": 4, "num_requests": 30},
                              memtp={"depth": "elastic", "max_depth": 8, "head_cost_gib": 1.0, "min_dwell_rounds": 3,
                                     "r_low": 0.5, "r_high": 0.95},
                              acceptance={"per_position": [0.8, 0.6, 0.45, 0.3, 0.2, 0.12, 0.07, 0.05]}),
    # prefill chunks in the passes (only decoding requests' anchors count), arrivals inside rounds,
    # the per-tested coherence and a growth margin
    "elastic-poisson-chunked": dict(workload={"mode": "poisson", "rate_per_s": 2.0, "num_requests": 40},
                                    hardware=ELASTIC_KV, engine={"max_batch_tokens": 256, "prefill_chunk_tokens": 64},
                                    memtp={"depth": "elastic", "max_depth": 8, "head_cost_gib": 0.3,
                                           "min_dwell_rounds": 3, "coherence_estimator": "per_tested"}),
    # the tower coherence: R the product of every position's EWMA (issue 14)
    "elastic-tower": dict(workload={"concurrency": 4, "num_requests": 30},
                          memtp={"depth": "elastic", "max_depth": 8, "head_cost_gib": 1.0, "min_dwell_rounds": 3,
                                 "coherence": "tower", "r_low": 0.05, "r_high": 0.5},
                          acceptance={"per_position": [0.8, 0.6, 0.45, 0.3, 0.2, 0.12, 0.07, 0.05]}),
    # passes that cost more the more they verify: at 32 users drafting stops paying and the gate
    # falls back inside blocks, after the controller answered for that round (the answer stands
    # only for a round that drafts: the round path asks again)
    "elastic-gate": dict(workload={"concurrency": 32, "num_requests": 96},
                         hardware=ELASTIC_KV | {"table": {1: 10.0, 64: 60.0, 512: 400.0},
                                                "memory": ELASTIC_KV["memory"] | {"gpu_allocatable_gib": 8.0}},
                         memtp={"depth": "elastic", "max_depth": 8, "head_cost_gib": 1.0, "min_dwell_rounds": 4}),
    "elastic-disaggregated": dict(workload={"concurrency": 10, "num_requests": 40}, hardware=ELASTIC_KV,
                                  engine={"prefill": "disaggregated", "prefill_gpus": 2},
                                  memtp={"depth": "elastic", "max_depth": 6, "head_cost_gib": 0.2,
                                         "min_dwell_rounds": 2}),
}
ELASTIC_POLICIES = {"dspark": {"name": "dspark"}, "dspark_async": {"name": "dspark_async", "lag_rounds": 2},
                    "static-3": {"name": "static", "k": 3}, "threshold": {"name": "threshold", "threshold": 0.3},
                    "goodput": {"name": "goodput"}}


def _controller_state(ctl):  # noqa: ANN001, ANN202 - a DepthController
    return (ctl.depth, ctl.changes, ctl._last_round, ctl._last_target, ctl._above_since, ctl._below_since,
            ctl._below_max_target)


def _coherence_state(coh):  # noqa: ANN001, ANN202 - a CoherenceEWMA or TowerCoherence
    if hasattr(coh, "_levels"):
        return coh._depth, [(e._value, e._num_updates) for e in coh._levels]
    return coh._value, coh._num_updates


def elastic_both_ways(monkeypatch, scen, seed: int = 2):
    """The run both ways, asserted equal, with the controllers' states and changes equal too;
    returns the blocked run's controller and its block calls ``(rounds, waiting at the call)``."""
    engines, calls = [], []
    real_run, real_block = Engine.run, Engine._drafted_block
    monkeypatch.setattr(Engine, "run", lambda self: engines.append(self) or real_run(self))

    def block(self, *a):  # noqa: ANN001, ANN202
        waiting = len(self.waiting)
        out = real_block(self, *a)
        calls.append((out[0], waiting))
        return out

    monkeypatch.setattr(Engine, "_drafted_block", block)
    monkeypatch.setattr(Engine, "DRAFT_BLOCKS", False)
    slow = run(scen, seed=seed).state
    assert not calls
    monkeypatch.setattr(Engine, "DRAFT_BLOCKS", True)
    fast = run(scen, seed=seed).state
    assert_same_state(slow, fast)
    slow_ctl, fast_ctl = engines[0].drafter.controller, engines[1].drafter.controller
    assert _controller_state(fast_ctl) == _controller_state(slow_ctl)
    assert _coherence_state(engines[1].coherence) == _coherence_state(engines[0].coherence)
    return fast_ctl, calls


@pytest.mark.parametrize("policy", sorted(ELASTIC_POLICIES))
@pytest.mark.parametrize("name", sorted(ELASTIC))
def test_elastic_ensemble_drafted_blocks_match_round_by_round(name, policy, monkeypatch):
    # Engine._resize_drafter runs before every round: inside a block the kernel asks the same
    # questions (the memory left once the anchors and the waiting head have their KV, then
    # DepthController.propose's target and rules) and stops before a round whose depth changes.
    # The same rounds, state, round log and controller (every change, its round and reason)
    scen = scenario(policy=ELASTIC_POLICIES[policy], **ELASTIC[name])
    ctl, calls = elastic_both_ways(monkeypatch, scen)
    assert max(r for r, _ in calls) > 1, "no drafted block of two rounds or more: the test would prove nothing"
    if policy == "dspark":  # the oracle's reach: the depth changes in every scenario
        assert ctl.changes, "the depth never changed: the controller's rules were not exercised"


def test_elastic_scenarios_reach_every_rule_inside_blocks(monkeypatch):
    # the oracle's reach: the KV-bound scenario releases heads for memory, shrinks for coherence
    # and grows, with requests waiting for KV during blocks (their KV counts against the heads)
    ctl, calls = elastic_both_ways(monkeypatch, scenario(policy={"name": "dspark"}, **ELASTIC["elastic-kv"]))
    assert {c.reason for c in ctl.changes} == {"memory", "coherence", "grow"}
    assert any(rounds > 1 and waiting for rounds, waiting in calls)


def test_a_patched_depth_controller_runs_round_by_round(monkeypatch):
    # DepthController.propose mirrored in the kernel: replaced, the run's rounds go one by one
    # through the replacement (here: the same rule, counted)
    from memtp_sim.memtp import DepthController

    scen = scenario(policy={"name": "dspark"}, **ELASTIC["elastic-coherence"])
    plain = run(scen, seed=2).state
    asked, real = [], DepthController.propose
    monkeypatch.setattr(DepthController, "propose", lambda self, *a: asked.append(a[2]) or real(self, *a))
    calls = []
    real_block = Engine._drafted_block
    monkeypatch.setattr(Engine, "_drafted_block", lambda self, *a: calls.append(1) or real_block(self, *a))
    assert_same_state(plain, run(scen, seed=2).state)
    assert calls == [] and asked == sorted(set(asked)) and len(asked) == plain.rounds["start_s"].size


@pytest.mark.parametrize("change", ["update_positions", "level_alpha"])
def test_a_tower_the_kernel_does_not_mirror_runs_round_by_round(change, monkeypatch):
    # the kernel keeps the tower's levels as EWMAs of one alpha: a replaced update_positions, or
    # a level of another alpha, sends the run round by round (the same answers either way)
    from memtp_sim.memtp import TowerCoherence

    scen = scenario(policy={"name": "dspark"}, **ELASTIC["elastic-tower"])
    if change == "update_positions":
        real = TowerCoherence.update_positions
        monkeypatch.setattr(TowerCoherence, "update_positions", lambda self, *a, **k: real(self, *a, **k))
    else:
        real_init = TowerCoherence.__init__

        def init(self, *a, **k):  # noqa: ANN001, ANN202
            real_init(self, *a, **k)
            self._levels[1]._alpha *= 0.5

        monkeypatch.setattr(TowerCoherence, "__init__", init)
    calls = []
    real_block = Engine._drafted_block
    monkeypatch.setattr(Engine, "_drafted_block", lambda self, *a: calls.append(1) or real_block(self, *a))
    fast = run(scen, seed=2).state
    monkeypatch.setattr(Engine, "DRAFT_BLOCKS", False)
    assert_same_state(run(scen, seed=2).state, fast)
    assert calls == []


def test_a_growth_margin_holds_back_growth_inside_blocks(monkeypatch):
    # the engine builds its controllers without a growth margin; one that has one (here 1.5 GiB,
    # set on the instance: not a replaced function) grows only with that much more memory free
    from memtp_sim.memtp import DepthController

    real_init = DepthController.__init__

    def init(self, *a, **k):  # noqa: ANN001, ANN202
        real_init(self, *a, **k)
        self._grow_margin_gib = 1.5

    monkeypatch.setattr(DepthController, "__init__", init)
    sections = ELASTIC["elastic-kv"] | {"memtp": ELASTIC["elastic-kv"]["memtp"] | {"head_cost_gib": 0.2}}
    ctl, calls = elastic_both_ways(monkeypatch, scenario(policy={"name": "dspark"}, **sections))
    assert max(r for r, _ in calls) > 1 and any(c.reason == "grow" for c in ctl.changes)


def test_the_memtp_study_s_elastic_runs_match_round_by_round(monkeypatch):
    # the shipped study's elastic ensemble (Qwen3-32B on gfx1151, Mooncake prompts, a Poisson load
    # ramp, 64 remote prefill GPUs), its ramp a sixth as long: heads are loaded and released, and
    # blocks run between (their last rounds' passes across the arrivals kept in them)
    from pathlib import Path

    from memtp_sim.config import load_study

    path = Path(__file__).resolve().parents[1] / "studies" / "memtp.yaml"
    specs = {(lab["variant"], lab["policy"].split("(")[0], seed): sc
             for lab, sc, seed in load_study(path).expand(source=str(path))}
    for variant in ("elastic_ewma", "elastic_tower"):
        scen = specs[(variant, "dspark", 0)]
        doc = scen.model_dump()
        doc["workload"]["rate_schedule"] = [dict(seg, duration_s=seg["duration_s"] / 6)
                                            for seg in doc["workload"]["rate_schedule"]]
        ctl, calls = elastic_both_ways(monkeypatch, type(scen).model_validate(doc), seed=0)
        assert max(r for r, _ in calls) > 1 and len(ctl.changes) >= 5, variant


def test_the_elastic_ensemble_runs_the_gate_s_plain_rounds_in_the_kernel(monkeypatch):
    # the kernel runs the rounds the fallback gate announces as plain (rounds of k 0) with the
    # depth controller asked each round: blocks start in them and hold plain and drafted rounds
    # together, so the calls are few (a reviewer's goodput run once made 8,156 calls for 509
    # rounds kept, slower than round by round). Same answers: "elastic-gate" in the tests above
    blocks, in_plain, _ = gate_blocks(monkeypatch, scenario(policy={"name": "dspark"}, **ELASTIC["elastic-gate"]), 2)
    assert in_plain and blocks["mixed"] >= 1
    assert blocks["plain_rounds"] >= 20  # the gate did fall back to plain rounds
    assert blocks["rounds"] >= 0.9 * blocks["total"] and blocks["calls"] * 2 < blocks["rounds"]


@pytest.mark.parametrize("control", [
    {"name": "acceptance_target", "half_life_rounds": 1e17},  # its EMA factor rounds to 0: k never moves
    {"name": "acceptance_target", "half_life_rounds": 1e-300, "k_min": 0, "probe_every": 1},  # factor 1
    {"name": "acceptance_target", "k_min": 127, "target": 0.01, "probe_every": 100000, "tax": 4.99},
    {"name": "probing", "probe_every": 100000, "switch_s": 10.0},
    {"name": "probing", "probe_every": 2, "tax": 0.0, "switch_s": 0.0},
    {"name": "batch_table", "table": {"1-4096": 0}, "tax": 0.0},
])
def test_extreme_controller_settings_run_in_blocks_as_round_by_round(control, monkeypatch):
    # the kind (a fresh user's report): a setting validation accepts must run, and give the same
    # answers, in the compiled blocks; the kernel refused a half-life of 1e17 (an EMA factor of 0)
    scen = scenario(policy={"name": "static", "k": 3}, workload={"concurrency": 4, "num_requests": 16},
                    draft_control=control)
    slow, fast, _ = both_ways(monkeypatch, lambda: run(scen, seed=1).state)
    assert_same_state(slow, fast)


# Probing's choice at its edges (a reviewer's survivors: a pass the full block fills exactly, the
# no-draft pass priced by the decode table, the host time in the drafting rates): 8 users, every
# draft accepted, a probe every 5 rounds; between probes the one k that pays, bit for bit both ways
def _probing_edge(monkeypatch, prof, max_batch_tokens: int, want_k: int) -> None:
    from _sim_helpers import certain_acceptance
    from memtp_sim.engine import EngineSettings
    from memtp_sim.policies import make_policy
    from memtp_sim.policies.control import make_control

    def go():
        return Engine(prof, certain_acceptance(True), workload([8] * 8, [120] * 8, concurrency=8),
                      make_policy("static", {"k": 3}),
                      EngineSettings(max_batch_tokens=max_batch_tokens, prefill_chunk_tokens=16, kv_watermark_frac=0.0),
                      np.random.default_rng(1), control=make_control("probing", {"probe_every": 5})).run()

    slow, fast, calls = both_ways(monkeypatch, go)
    assert_same_state(slow, fast)
    k = slow.rounds["gamma"][slow.rounds["num_decode"] == 8]
    between = np.delete(k, np.arange(0, k.size, 5))  # not the probes
    assert (between == want_k).mean() > 0.7, k
    assert calls and max(calls) > 4


def test_probing_full_block_that_exactly_fills_the_pass(monkeypatch):
    # 8 x (1 + 3) = 32 = max_batch_tokens and a 25 ms drafting step: k 0 800 tok/s, k 1..3 457,
    # 686, 914: only the full block, B exactly at the limit, pays
    from _sim_helpers import zero_drafter
    prof = flat_profile(pass_ms=10.0, kv_blocks=1024, drafter=zero_drafter(t_seq_s=0.0, t_small_s=0.025))
    _probing_edge(monkeypatch, prof, 32, 3)


def test_probing_prices_the_no_draft_pass_by_the_decode_table(monkeypatch):
    # verify 20 ms, decode 10 ms: k 0 at 800 tok/s beats the full block's 32 / 45 ms = 711
    # (priced by the verify table k 0 would be 400 and lose)
    from dataclasses import replace

    from _sim_helpers import zero_drafter
    sps = SPSTable(np.array([1, 64]), np.array([20.0, 20.0]), source="test: verify")
    dec = SPSTable(np.array([1, 64]), np.array([10.0, 10.0]), source="test: decode")
    prof = replace(flat_profile(kv_blocks=1024, sps=sps, drafter=zero_drafter(t_seq_s=0.0, t_small_s=0.025)),
                   decode=dec)
    _probing_edge(monkeypatch, prof, 64, 0)


def test_probing_counts_the_host_time_in_the_drafting_rates(monkeypatch):
    # host 20 ms, pass 10 ms, drafting 100 ms: k 0 at 8 / 30 ms = 267 tok/s beats the full
    # block's 32 / 130 ms = 246 (without the host time in the drafting rates: 291, and it wins)
    from dataclasses import replace

    from _sim_helpers import zero_drafter
    from memtp_sim.hardware.cost import Overheads
    prof = replace(flat_profile(pass_ms=10.0, kv_blocks=1024, drafter=zero_drafter(t_seq_s=0.0, t_small_s=0.1)),
                   overheads=Overheads(host_s=0.02))
    _probing_edge(monkeypatch, prof, 64, 0)

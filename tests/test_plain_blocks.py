"""Rounds without drafts run as blocks (engine ``_plain_block``, issue 13): an exact shortcut, so
every run must match the round-by-round engine (``Engine.PLAIN_BLOCKS = False``) to the last bit:
per-request times and counters, and every column of every round of the round log.

Oracle: the round-by-round engine itself, on the shipped scenarios where blocks are taken
(closed and open loop, colocated and disaggregated prefill, think time, a batch-slot limit, KV
pressure with preemption) and on random hand-made workloads (fuzz). Every test runs twice: blocks
planned and applied by the compiled kernels (``memtp_sim/_kernels.pyx``, the default) and by the
numpy code (``memtp_sim._compiled.ENABLED = False``).
"""

from __future__ import annotations

import numpy as np
import pytest

from memtp_sim import _compiled, run
from memtp_sim.engine import Engine

from _sim_helpers import assert_same_state, flat_profile, grid_tie_workload, run_engine, scenario, workload


@pytest.fixture(autouse=True, params=["compiled", "compiled-apart", "numpy"])
def compiled(request, monkeypatch):
    """The three ways a plain block runs: planned, checked, applied and logged in one kernel call
    (``_kernels.plain_block``, the default), by the separate kernels with the checks in Python
    (as where ``Engine._check_pass`` is replaced), and by the numpy code."""
    if request.param == "numpy":
        monkeypatch.setattr(_compiled, "ENABLED", False)
        yield None
        return
    assert _compiled.kernels is not None, "memtp_sim._kernels is not built: run pip install -e ."
    kernels, kernel_name = _compiled.kernels, "plain_block"
    if request.param == "compiled-apart":
        monkeypatch.setattr(Engine, "_plain_block_inputs", lambda self: None)
        kernels, kernel_name = Engine, "_plan_plain_block_compiled"
    planned, ran = [], []
    plan, block = getattr(kernels, kernel_name), Engine._plain_run
    monkeypatch.setattr(kernels, kernel_name, lambda *a: planned.append(1) or plan(*a))

    def traced(self, *a):  # noqa: ANN001, ANN002, ANN202
        rounds = block(self, *a)
        ran.append(rounds)
        return rounds

    monkeypatch.setattr(Engine, "_plain_run", traced)
    yield
    # blocks ran, so the compiled planner must have planned (not the numpy code behind it)
    assert planned or not any(ran), "blocks ran but none was planned by the compiled kernels"


def both_ways(monkeypatch, fn):
    monkeypatch.setattr(Engine, "PLAIN_BLOCKS", False)
    slow = fn()
    monkeypatch.setattr(Engine, "PLAIN_BLOCKS", True)
    calls = []
    orig = Engine._plain_run

    def traced(self, *a):  # noqa: ANN001, ANN002, ANN202
        rounds = orig(self, *a)
        if rounds:
            calls.append(rounds)
        return rounds

    monkeypatch.setattr(Engine, "_plain_run", traced)
    fast = fn()
    return slow, fast, calls


SCENARIOS = {
    "closed-1-colocated": {"workload": {"concurrency": 1, "num_requests": 12}},
    "closed-3-disaggregated": {"workload": {"concurrency": 3, "num_requests": 30},
                               "engine": {"prefill": "disaggregated", "prefill_gpus": 2}},
    "closed-16-think": {"workload": {"concurrency": 16, "num_requests": 60, "think_time_s": 0.5}},
    "poisson": {"workload": {"mode": "poisson", "rate_per_s": 0.5, "num_requests": 30}},
    # pass time grows with the context every round (attention term): each round of a block priced apart
    "h200-context": {"hardware": {"profile": "h200-llama31-8b-bf16"}, "workload": {"concurrency": 8, "num_requests": 40}},
    "h200-context-disaggregated": {"hardware": {"profile": "h200-llama31-8b-bf16"},
                                   "workload": {"concurrency": 2, "num_requests": 12},
                                   "engine": {"prefill": "disaggregated"}},
    "trace-disaggregated": {"workload": {"mode": "trace", "num_requests": 30, "rate_scale": 0.2},
                            "engine": {"prefill": "disaggregated"}},
    "two-seats": {"workload": {"concurrency": 6, "num_requests": 24}, "engine": {"max_num_seqs": 2}},
    "kv-pressure": {  # a 2-GiB KV budget: admission waits for memory, requests are preempted
        "workload": {"concurrency": 12, "num_requests": 36},
        "hardware": {"table": {1: 20.0, 64: 25.0, 512: 80.0},
                     "memory": {"gpu_allocatable_gib": 4.0, "weights_bytes": 1 << 30, "kv_bytes_per_token": 131072,
                                "max_model_len": 8192}}},
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_blocks_match_round_by_round_on_scenarios(name, monkeypatch, tmp_path):
    sections = SCENARIOS[name]
    scen = scenario(policy={"name": "no_spec"}, **sections)
    slow, fast, calls = both_ways(monkeypatch, lambda: run(scen, seed=3).state)
    assert calls and max(calls) > 1, "no block was taken: the test would prove nothing"
    assert_same_state(slow, fast)


@pytest.mark.parametrize("seed", range(12))
def test_blocks_match_round_by_round_on_random_workloads(seed, monkeypatch):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 25))
    prompt = rng.integers(1, 200, n)
    output = rng.integers(1, 120, n)
    kv_blocks = int(rng.integers(16, 80))  # tight: requests wait for memory and get preempted
    prompt = np.minimum(prompt, kv_blocks * 16 // 2)
    output = np.minimum(output, kv_blocks * 16 // 2)
    closed = rng.random() < 0.5
    wl = (workload(prompt, output, concurrency=int(rng.integers(1, 6)), think_time_s=float(rng.choice([0.0, 0.05])))
          if closed else workload(prompt, output, np.sort(rng.exponential(0.3, n)).cumsum()))
    prof = flat_profile(pass_ms=float(rng.choice([5.0, 10.0])), kv_blocks=kv_blocks)
    settings = {"max_num_seqs": int(rng.integers(1, 8)), "kv_watermark_frac": float(rng.choice([0.0, 0.05]))}
    slow, fast, calls = both_ways(monkeypatch, lambda: run_engine(prof, wl, seed=seed, **settings))
    assert_same_state(slow, fast)


def test_a_policy_that_drafts_takes_no_block(monkeypatch):
    scen = scenario(policy={"name": "dspark"}, workload={"concurrency": 2, "num_requests": 6})
    slow, fast, calls = both_ways(monkeypatch, lambda: run(scen, seed=0).state)
    assert calls == []
    assert_same_state(slow, fast)


@pytest.mark.parametrize("policy", [{"name": "dspark"}, {"name": "dspark", "early_stop": True}, {"name": "goodput"}])
def test_a_policy_falling_back_runs_its_plain_rounds_as_blocks(policy, monkeypatch):
    # at 64 users on gfx1151 drafting stops paying: the fallback gate decodes plainly between
    # probes (policy.plain_rounds_ahead), and those rounds run as blocks; the gate's state, the
    # probes and every drafted round stay as round by round. Drafted blocks run the gate's plain
    # rounds themselves (tests/test_drafted_blocks.py): off here, as where drafted rounds cannot
    # run as blocks (the numpy engine, a p_min, a policy that learns)
    monkeypatch.setattr(Engine, "DRAFT_BLOCKS", False)
    scen = scenario(policy=policy, workload={"concurrency": 64, "num_requests": 150},
                    engine={"prefill": "disaggregated", "prefill_gpus": 4})
    slow, fast, calls = both_ways(monkeypatch, lambda: run(scen, seed=0).state)
    assert calls and max(calls) > 1
    assert_same_state(slow, fast)
    assert np.any(fast.rounds["verify_tokens"] > 0)  # it still probes and drafts


def test_the_fallback_gate_announces_exactly_its_plain_rounds():
    # oracle: the gate's own draft_lengths, asked round by round
    from memtp_sim.policies._candidates import FallbackGate

    class View:
        max_draft_len = 5

        def __init__(self, i):
            self.round_index = i

    for probe_every in (1, 2, 7):
        a, b = FallbackGate(True, probe_every), FallbackGate(True, probe_every)
        for g in (a, b):
            g.report(0, 1.0, 2.0)  # drafting did not pay: falling back
        i = 1
        while i < 60:
            ahead = a.plain_rounds_ahead(i)
            answers = [b.draft_lengths(View(i + j)) for j in range(ahead + 1)]
            assert answers == [0] * ahead + [5], (probe_every, i)  # the round after them probes
            a.skip_plain_rounds(i, ahead)
            assert a.draft_lengths(View(i + ahead)) == 5
            i += ahead + 1


@pytest.mark.parametrize("offset", [0, 1, 2])
def test_an_arrival_exactly_at_a_round_end_is_seen_by_the_next_round(offset, monkeypatch):
    # Every pass costs exactly 10 ms, so rounds end on the float grid 0 + 0.01 + 0.01 + ...;
    # requests arriving on that grid tie with a round's end: the round-by-round engine lets the
    # arrival in before the next round, so a block must end at such a round.
    wl, arrival = grid_tie_workload(offset)
    prof = flat_profile(pass_ms=10.0, kv_blocks=64)
    slow, fast, calls = both_ways(monkeypatch, lambda: run_engine(prof, wl, max_num_seqs=4))
    assert calls and max(calls) > 1
    assert_same_state(slow, fast)


def test_a_long_stretch_is_several_blocks(monkeypatch):
    # one request of 1,000 output tokens alone, blocks capped at 300 rounds: several blocks in a row
    import memtp_sim.engine as eng

    monkeypatch.setattr(eng, "_MAX_BLOCK_ROUNDS", 300)
    wl = workload([16], [1000])
    prof = flat_profile(pass_ms=10.0, kv_blocks=128)
    slow, fast, calls = both_ways(monkeypatch, lambda: run_engine(prof, wl))
    assert max(calls) == 300 and sum(calls) >= 990
    assert_same_state(slow, fast)


def test_a_block_whose_checks_may_fail_runs_through_the_engines_own_check(monkeypatch, compiled):
    # the one-call kernel leaves a block to Engine._check_pass where a check may fail; here its
    # memory limit is set below every block's need, so every block takes that way: the engine's
    # check (with the true limit) passes, and the run is the round-by-round run
    if _compiled.kernels is None or not _compiled.ENABLED:
        pytest.skip("not a case for the numpy engine: the one-call kernel is one of the compiled kernels")
    real, block = Engine._plain_block_inputs, Engine._plain_block
    checked = []

    def stricter(self):  # noqa: ANN001, ANN202
        inputs = real(self)
        return None if inputs is None else (*inputs[:2], (inputs[2][0], inputs[2][1], -1.0))

    monkeypatch.setattr(Engine, "_plain_block_inputs", stricter)
    monkeypatch.setattr(Engine, "_plain_block", lambda self, *a: checked.append(1) or block(self, *a))
    scen = scenario(policy={"name": "no_spec"}, **SCENARIOS["closed-16-think"])
    slow, fast, calls = both_ways(monkeypatch, lambda: run(scen, seed=3).state)
    assert calls and max(calls) > 1 and len(checked) == len(calls)  # every block through the engine's check
    assert_same_state(slow, fast)


def test_a_replaced_round_check_runs_for_every_plain_block(monkeypatch, compiled):
    # an engine whose _check_pass is another function (a subclass's) runs it: the one-call kernel,
    # which checks in C, steps aside
    if _compiled.kernels is None or not _compiled.ENABLED:
        pytest.skip("not a case for the numpy engine: the one-call kernel is one of the compiled kernels")
    from memtp_sim.engine import EngineSettings
    from memtp_sim.acceptance import AcceptanceModel
    from memtp_sim.policies import make_policy

    seen = []

    class Traced(Engine):
        def _check_pass(self, *a):  # noqa: ANN002, ANN202
            seen.append(a[0])
            return super()._check_pass(*a)

    def build(cls):
        return cls(flat_profile(pass_ms=10.0, kv_blocks=64), AcceptanceModel.fixed(0.7), workload([8, 8, 8], [40, 30, 50]),
                   make_policy("no_spec", {}), EngineSettings(max_batch_tokens=64, prefill_chunk_tokens=32,
                                                             kv_watermark_frac=0.0), np.random.default_rng(0))

    want = build(Engine).run()
    assert_same_state(want, build(Traced).run())
    assert len(seen) >= 3 and len(set(seen)) == len(seen)  # once per block (or round), each at its first round
    # the same for the drafter's prefill time (a plain round's draft time), replaced on the instance
    eng = build(Engine)
    priced = []
    eng.drafter.prefill_time_s = lambda tokens: priced.append(tokens) or 0.0
    assert_same_state(want, eng.run())
    assert len(priced) >= 3


def test_the_kv_after_fix_needs_a_row_and_lands_on_it():
    # review: the fix of a block's last row's KV is kept until the rows are packed; with no row
    # waiting it would land on a later batch's last row: refused instead (it raised IndexError
    # when it rebuilt the tuple), and a fix lands on its own row, not the last one packed
    import pytest

    from memtp_sim.engine import _LOGGED, _RoundLog
    from memtp_sim.errors import EngineInvariantError

    log = _RoundLog(block_gib=0.5, fixed_gib=10.0)
    with pytest.raises(EngineInvariantError, match="no row to set the KV after"):
        log.set_last_kv_after(3)
    row = tuple(0.0 if i < 4 else 0 for i in range(len(_LOGGED)))
    log.append(row)
    log.set_last_kv_after(7)
    log.append(row)
    cols = log.arrays()
    assert cols["kv_blocks_after"].tolist() == [7, 0] and cols["kv_gib"].tolist() == [3.5, 0.0]

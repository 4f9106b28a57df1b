"""Blocks that go on past completions (issue 13): where nothing waits for admission, a drafted or
plain block frees the requests a round finished and goes on with the rest, and the engine runs each
completion (its user's next submission) afterwards at the completion's own time. An exact shortcut:
every run must match the one whose blocks stop at each completion, and the round-by-round path."""

from __future__ import annotations

import dataclasses
import inspect
from collections import Counter

import numpy as np
import pytest

from memtp_sim import _compiled, run
from memtp_sim.engine import Engine
from memtp_sim.hardware import SPSTable

from _sim_helpers import assert_same_state, flat_profile, run_engine, scenario, workload

pytestmark = pytest.mark.skipif(_compiled.kernels is None, reason="needs the compiled kernels (pip install -e .)")

# each kind of what a completion sets off: an open loop's (nothing), closed-loop users who go on
# at once to remote prefill GPUs (a submission: a new event where a GPU is free), users who think
# first (an event at the think time's end); prompts longer than the model takes are refused as
# they arrive (their users go on at once)
CASES = {
    "open-loop": ({"name": "dspark"}, {"workload": {"mode": "poisson", "rate_per_s": 2.0, "num_requests": 40}}),
    "remote-prefill": ({"name": "dspark"}, {"workload": {"concurrency": 24, "num_requests": 120},
                                            "engine": {"prefill": "disaggregated", "prefill_gpus": 2}}),
    "remote-prefill-no-spec": ({"name": "no_spec"}, {"workload": {"concurrency": 24, "num_requests": 120},
                                                     "engine": {"prefill": "disaggregated", "prefill_gpus": 3}}),
    "remote-prefill-refused": ({"name": "dspark"}, {
        "workload": {"concurrency": 16, "num_requests": 120},
        "engine": {"prefill": "disaggregated", "prefill_gpus": 2},
        "hardware": {"table": {1: 20.0, 64: 25.0, 512: 80.0},
                     "memory": {"gpu_allocatable_gib": 40.0, "weights_bytes": 1 << 30, "kv_bytes_per_token": 131072,
                                "max_model_len": 1500}}}),
    "think": ({"name": "dspark"}, {"workload": {"concurrency": 16, "num_requests": 60, "think_time_s": 0.5}}),
}


def _absorbed_by_caller(monkeypatch) -> Counter:
    counts: Counter = Counter()
    real = Engine._absorbed

    def counted(self, absorbed):
        caller = inspect.stack()[1].function
        counts[caller] += absorbed[0]
        counts.update((caller, code) for code in self._absorb[4][0][:absorbed[0]].tolist())
        return real(self, absorbed)

    monkeypatch.setattr(Engine, "_absorbed", counted)
    return counts


@pytest.mark.parametrize("name", sorted(CASES))
def test_blocks_that_go_on_past_completions_match_blocks_that_stop_there(name, monkeypatch):
    policy, sections = CASES[name]
    scen = scenario(policy=policy, **sections)
    counts = _absorbed_by_caller(monkeypatch)
    fast = run(scen, seed=3)
    assert sum(counts.values()) > 0, "no completion went on past: the test would prove nothing"
    # drafted blocks went on past completions, and plain ones (all of no_spec's rounds are plain); on
    # remote prefill GPUs, past the prefills' ends in their passes too (and admitted their requests)
    caller = "_plain_run" if policy["name"] == "no_spec" else "_drafted_block"
    assert counts[caller, 0] > 0, counts
    if name.startswith("remote-prefill"):
        assert counts[caller, 1] > 0 and counts[caller, 2] > 0 and counts[caller, 3] > 0, counts
    if name == "remote-prefill-refused":
        assert fast.metrics["num_rejected"] > 0
    monkeypatch.setattr(Engine, "_absorb_setup", lambda self: None)
    stopping = run(scen, seed=3)
    assert_same_state(stopping.state, fast.state)
    monkeypatch.setattr(Engine, "DRAFT_BLOCKS", False)
    monkeypatch.setattr(Engine, "PLAIN_BLOCKS", False)
    assert_same_state(run(scen, seed=3).state, fast.state)


def test_colocated_closed_loop_users_join_the_queue_so_blocks_stop_at_completions(monkeypatch):
    # a completion's user submits at once to this GPU's admission queue: the next round admits it
    counts = _absorbed_by_caller(monkeypatch)
    run(scenario(policy={"name": "dspark"}, workload={"concurrency": 8, "num_requests": 40}), seed=0)
    assert sum(counts.values()) == 0


def test_a_replaced_completion_runs_for_every_request_at_its_finish_time(monkeypatch):
    # a subclass's (or a patch's) _complete: blocks stop at completions and call it there, so it
    # sees each request at its finish time (the kernel's mirror of it is not used)
    seen: list[tuple[int, float]] = []
    real = Engine._complete

    def complete(self, i):
        seen.append((i, self.env.now))
        real(self, i)

    counts = _absorbed_by_caller(monkeypatch)
    monkeypatch.setattr(Engine, "_complete", complete)
    policy, sections = CASES["remote-prefill"]
    res = run(scenario(policy=policy, **sections), seed=3)
    assert sum(counts.values()) == 0 and len(seen) == res.metrics["num_requests"]
    assert all(t == res.state.finished_at_s[i] for i, t in seen)


def _remote_prefill_case(seed: int, monkeypatch) -> Counter:
    """A random closed loop on remote prefill GPUs (hand-made workload and profile: short and long
    prompts, outputs of one token, a tight KV cache, a small batch limit, refused requests) run
    three ways that must agree bit for bit: blocks going on past completions and remote prefills'
    ends, blocks stopping there, round by round. Returns the actions the first logged, by code."""
    rng = np.random.default_rng(700 + seed)
    n = int(rng.integers(8, 40))
    kv_blocks = int(rng.integers(24, 160))
    prompt = rng.integers(1, 400, n)
    output = np.where(rng.random(n) < 0.1, 1, rng.integers(1, 120, n))
    wl = workload(prompt, output, concurrency=int(rng.integers(1, 12)))
    prof = flat_profile(kv_blocks=kv_blocks, pass_ms=float(rng.choice([2.0, 10.0])),
                        max_model_len=int(rng.choice([400, 1_000_000])))
    settings = {"max_num_seqs": int(rng.integers(1, 12)), "kv_watermark_frac": float(rng.choice([0.0, 0.05])),
                "prefill": "disaggregated", "prefill_gpus": int(rng.integers(1, 5))}
    policy = str(rng.choice(["no_spec", "dspark", "static"]))
    params = {"k": 2} if policy == "static" else {"gamma": 3, "fallback": True} if policy == "dspark" else {}
    codes: Counter = Counter()
    real = Engine._absorbed

    def counted(self, absorbed):
        codes.update(self._absorb[4][0][:absorbed[0]].tolist())
        return real(self, absorbed)

    monkeypatch.setattr(Engine, "_absorbed", counted)
    fast = run_engine(prof, wl, policy, params, seed=seed, **settings)
    monkeypatch.setattr(Engine, "_absorb_setup", lambda self: None)
    assert_same_state(run_engine(prof, wl, policy, params, seed=seed, **settings), fast)
    monkeypatch.setattr(Engine, "DRAFT_BLOCKS", False)
    monkeypatch.setattr(Engine, "PLAIN_BLOCKS", False)
    assert_same_state(run_engine(prof, wl, policy, params, seed=seed, **settings), fast)
    monkeypatch.undo()
    return codes


@pytest.mark.parametrize("seed", range(12))
def test_random_remote_prefill_loops_match_without_going_on_and_round_by_round(seed, monkeypatch):
    _remote_prefill_case(seed, monkeypatch)


def test_the_random_remote_prefill_loops_go_on_past_each_kind_of_thing(monkeypatch):
    # the fuzz above must log completions, waits across events, prefills' ends and admissions
    codes: Counter = Counter()
    for seed in range(12):
        codes += _remote_prefill_case(seed, monkeypatch)
    assert all(codes[c] > 0 for c in range(4)), codes


def test_a_refused_request_s_prompt_is_not_priced_for_remote_prefill():
    # a reviewer's case: the refused request's prompt (65 tokens, longer than the model takes with
    # its output) is never prefilled, so a prefill curve that cannot price it must not fail the run
    # (going on past completions priced every prompt once)
    prof = dataclasses.replace(flat_profile(max_model_len=100),
                               prefill=SPSTable(np.array([8, 64]), np.array([10.0, 10.0]), source="test"))
    wl = workload([16, 16, 65, 16, 16], [10, 10, 40, 10, 10], concurrency=2)
    state = run_engine(prof, wl, policy="no_spec", prefill="disaggregated", prefill_gpus=1)
    assert state.status.tolist() == [3, 3, 4, 3, 3]


def test_an_admission_the_kernel_logged_must_be_the_admission_queue_s_head():
    # review: the replay took the queue's head whatever id the kernel had logged, so a mirror that
    # admitted another request than the head went unseen (the running list then held the wrong one)
    from collections import deque

    from memtp_sim.acceptance import AcceptanceModel
    from memtp_sim.engine import EngineInvariantError, EngineSettings
    from memtp_sim.policies import make_policy

    eng = Engine(flat_profile(), AcceptanceModel.fixed(0.7), workload([8, 8, 8], [4, 4, 4]),
                 make_policy("no_spec", {}), EngineSettings(), np.random.default_rng(0))
    eng._absorb = (None,) * 4 + ((np.array([3], dtype=np.int8), np.array([2]), np.array([0.0])),)
    eng.waiting = deque([1, 2])
    with pytest.raises(EngineInvariantError, match="request 2 was admitted.*head is 1"):
        eng._absorbed((1, 0, eng._prefill_idle, 0, 1, -1))
    eng.waiting = deque([2, 1])
    eng._absorbed((1, 0, eng._prefill_idle, 0, 1, -1))  # the head: admitted, as the kernel mirrored (one left waiting)
    assert list(eng.waiting) == [1] and eng.running == [2]

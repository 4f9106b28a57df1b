"""Closed-loop users go on at their request's completion (engine ``_complete``, issue 13).

Where a user's next submission cannot join the admission queue at the instant it is made (it goes
to a remote prefill GPU, or the user thinks first), the engine lets the user go on inside the
completion itself instead of through a SimPy completion event, which stopped the running block of
rounds at every completion (half the events of a busy closed loop).

Oracle: the event path itself (``_resubmit_at_once`` off), which is how every closed loop ran
before: every request's times, lengths, outcomes and every round-log column but one must agree to
the last bit, rejections at submission included (they free their user inside the completion
loop, in the order their events would have run). The one column that may differ is
``num_remote_prefill``, a count taken at a round's start: a request submitted at the end of a
round is now counted by the round that starts at that instant, where the event path counted it
one round later. Hand-derived: that count never falls below the event path's, and it is the
users' count exactly where every user is in the system.

The one change of answers, by design: a request that joins the queue exactly at a round's end
after a remote prefill or a think time (its SimPy timeout now scheduled before the engine's) is
admitted by the round that starts then, the rule open-loop arrivals at a round's end already kept
(tests/test_plain_blocks.py); the event path admitted it a round later. Exact ties need pass,
prefill and think times on a common grid (hand-made flat profiles): on the shipped profiles and
traces no request changed (the 36-run state reference of issue 13; a review's 80 random runs on
the shipped trace).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from memtp_sim import run
from memtp_sim.engine import FINISHED, REJECTED, Engine
from memtp_sim.hardware import SPSTable

from _sim_helpers import flat_profile, run_engine, scenario, workload


def _both_ways(monkeypatch, fn):
    """(event path, at-once path) states of the same run."""
    init = Engine.__init__

    def events_only(self, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
        init(self, *a, **k)
        self._resubmit_at_once = False

    monkeypatch.setattr(Engine, "__init__", events_only)
    slow = fn()
    monkeypatch.setattr(Engine, "__init__", init)
    return slow, fn()


def _same_but_the_remote_count(slow, fast) -> None:
    for f in dataclasses.fields(slow):
        a, b = getattr(slow, f.name), getattr(fast, f.name)
        if f.name == "rounds":
            assert a.keys() == b.keys()
            for col in a:
                if col != "num_remote_prefill":
                    assert np.array_equal(a[col], b[col], equal_nan=a[col].dtype.kind == "f"), f"rounds.{col}"
            # a submission at a round's end is counted from the round that starts then, not the next
            assert (b["num_remote_prefill"] >= a["num_remote_prefill"]).all()
        elif isinstance(a, np.ndarray):
            assert np.array_equal(a, b, equal_nan=a.dtype.kind == "f"), f.name
        else:
            assert a == b or (a != a and b != b), f.name


CASES = {
    "disaggregated-64": ({"workload": {"concurrency": 64, "num_requests": 300},
                          "engine": {"prefill": "disaggregated", "prefill_gpus": 4}}, "no_spec"),
    "disaggregated-dspark": ({"workload": {"concurrency": 16, "num_requests": 120},
                              "engine": {"prefill": "disaggregated", "prefill_gpus": 2}}, "dspark"),
    "think-colocated": ({"workload": {"concurrency": 8, "num_requests": 60, "think_time_s": 0.3},
                         "engine": {"prefill": "colocated"}}, "dspark"),
    "think-disaggregated": ({"workload": {"concurrency": 8, "num_requests": 60, "think_time_s": 0.3},
                             "engine": {"prefill": "disaggregated", "prefill_gpus": 1}}, "no_spec"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_users_going_on_at_completion_change_no_request(name, monkeypatch):
    sections, policy = CASES[name]
    scen = scenario(policy={"name": policy}, **sections)
    slow, fast = _both_ways(monkeypatch, lambda: run(scen, seed=2).state)
    _same_but_the_remote_count(slow, fast)


@pytest.mark.parametrize("prefill", ["disaggregated", "colocated"])
@pytest.mark.parametrize("think_time_s", [0.0, 0.05])
def test_rejections_at_submission_free_their_users_in_order(prefill, think_time_s, monkeypatch):
    # every third request is longer than the model allows: rejected as it is submitted, inside the
    # completion that let its user go on; the next submissions follow in the event path's order
    # (pass times off the round grid: a prefill ending exactly at a round's end is the one place
    # the two paths differ, test_kv_arriving_exactly_at_a_round_end_is_admitted_by_the_next_round)
    n = 90
    prompt = np.where(np.arange(n) % 3 == 1, 5000, 40)
    wl = workload(prompt, np.full(n, 12), concurrency=6, think_time_s=think_time_s)
    prof = flat_profile(max_model_len=4096, sps=SPSTable(np.array([1, 64]), np.array([10.0, 13.7]), source="test"))
    slow, fast = _both_ways(monkeypatch, lambda: run_engine(prof, wl, prefill=prefill, prefill_gpus=2))
    assert (fast.status == REJECTED).sum() == n // 3
    _same_but_the_remote_count(slow, fast)


def test_a_long_run_of_rejections_does_not_recurse():
    # 5,000 requests rejected one after the other: each frees its user inside the same loop (a
    # nested call per rejection would exceed Python's recursion limit)
    n = 5001
    prompt = np.full(n, 5000)
    prompt[-1] = 40
    wl = workload(prompt, np.full(n, 4), concurrency=1)
    st = run_engine(flat_profile(max_model_len=4096), wl, prefill="disaggregated", prefill_gpus=1)
    assert (st.status == REJECTED).sum() == n - 1 and st.status[-1] == FINISHED


def test_the_round_count_is_the_users_while_every_user_is_in_the_system():
    # hand-derived: 4 users, think time 0, remote prefill: from the first round on, each user has
    # exactly one request waiting, running or in remote prefill at every round start until the
    # last submission, so the three counts add up to 4 exactly (the event path counted a
    # resubmitted request one round late: 3 at the rounds right after a completion)
    wl = workload(np.full(40, 16), np.full(40, 9), concurrency=4)
    st = run_engine(flat_profile(), wl, prefill="disaggregated", prefill_gpus=2)
    r = st.rounds
    last_submit = np.nanmax(st.arrival_at_s)
    early = r["start_s"] < last_submit
    assert early.sum() > 10
    total = r["num_waiting"] + r["num_running"] + r["num_remote_prefill"]
    assert (total[early] == 4).all()


def test_kv_arriving_exactly_at_a_round_end_is_admitted_by_the_next_round(monkeypatch):
    # hand-derived: flat 10 ms passes, 16-token prompts priced as one 10 ms pass on 2 idle prefill
    # GPUs, 2 users: a request submitted at a round's end t gets its KV at t + 0.01, the end of the
    # next round (the same float addition), and is admitted by the round that starts there; the
    # event path admitted some of them 10 ms later
    wl = workload(np.full(12, 16), np.array([3, 5, 4, 6, 2, 7, 3, 5, 4, 6, 2, 7]), concurrency=2)
    slow, fast = _both_ways(monkeypatch, lambda: run_engine(flat_profile(), wl, prefill="disaggregated",
                                                            prefill_gpus=2))
    assert np.array_equal(fast.admitted_at_s, fast.first_token_at_s)
    assert np.allclose(fast.first_token_at_s - fast.arrival_at_s, 0.01)  # one prefill pass each
    late = slow.admitted_at_s > slow.first_token_at_s
    assert late.any() and np.allclose(slow.admitted_at_s[late] - slow.first_token_at_s[late], 0.01)


def test_a_request_after_a_think_time_ending_at_a_round_end_is_admitted_by_the_next_round(monkeypatch):
    # hand-derived (a review's case): flat 250 ms passes, colocated, 2 users thinking 0.25 s: a
    # request completing at a round's end t is followed by its user's next one at t + 0.25, the
    # end of the next round, which joins the queue then and is admitted by the round that starts
    # there; the event path admitted some of them 0.25 s later
    wl = workload(np.full(6, 8), np.array([3, 40, 3, 40, 3, 40]), concurrency=2, think_time_s=0.25)
    slow, fast = _both_ways(monkeypatch, lambda: run_engine(flat_profile(pass_ms=250.0), wl, prefill="colocated"))
    assert np.array_equal(fast.admitted_at_s, fast.arrival_at_s)
    late = slow.admitted_at_s > slow.arrival_at_s
    assert late.any() and np.allclose(slow.admitted_at_s[late] - slow.arrival_at_s[late], 0.25)

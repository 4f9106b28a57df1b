"""Truths every run must keep (docs/model.md section 4), checked through ``memtp_sim.run``:

conservation, KV memory within capacity (with preemption counted), determinism, Little's law.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

import memtp_sim
from _sim_helpers import TRACE, scenario, scenario_doc
from memtp_sim.cli import main
from memtp_sim.engine import REJECT_REASONS


def _check_conservation(res, *, disaggregated: bool):
    rf = res.requests_frame()
    assert set(rf["status"]) <= {"finished", "rejected"}
    done = rf[rf["status"] == "finished"]
    rej = rf[rf["status"] == "rejected"]
    assert (done["generated_tokens"] == done["output_tokens"]).all()
    assert rej["reject_reason"].isin(REJECT_REASONS).all()
    assert (rej["generated_tokens"] == 0).all()
    assert (done["reject_reason"] == "").all()
    m = res.metrics
    assert m["num_completed"] + m["num_rejected"] == m["num_requests"] == len(rf)
    assert m["output_tokens_total"] == int(done["output_tokens"].sum())
    assert sum(m["rejected_by_reason"].values()) == m["num_rejected"]
    # tokens come out of rounds (plus one first token per remote prefill when disaggregated)
    remote = len(done) if disaggregated else 0
    assert int(res.state.rounds["emitted_tokens"].sum()) + remote == int(done["generated_tokens"].sum())
    # every finished request has a consistent timeline
    assert (done["first_token_at_s"] >= done["arrival_at_s"]).all()
    assert (done["finished_at_s"] >= done["first_token_at_s"]).all()


@pytest.fixture(scope="module")
def tight_profile(tmp_path_factory) -> str:
    """The shipped profile with 0.2505 GiB of KV (128 blocks of 16 tokens = 2048 tokens) left next to
    weights, reserve and drafter, and max_model_len 4096: Azure conversation requests longer than
    2048 tokens cannot fit, those above 4096 exceed the model length, and 16 users overflow the cache."""
    prof = memtp_sim.load_profile(None)
    doc = yaml.safe_load(Path(prof.path).read_text())
    doc["measurements"] = str((Path(prof.path).parent / doc["measurements"]).resolve())
    mem = doc["memory"]
    used_gib = mem["weights_bytes"] / 2**30 + mem["reserve_gib"] + doc["drafter"]["weights_gib"]
    mem["gpu_allocatable_gib"] = used_gib + 0.2505
    mem["max_model_len"] = 4096
    doc["name"] = "test-tight-kv"
    path = tmp_path_factory.mktemp("profiles") / "tight.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


# ------------------------------------------------------------------------------------------
# conservation and memory
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", [{"name": "no_spec"}, {"name": "mtp1"}, {"name": "static", "k": 5},
                                    {"name": "dspark"}])
@pytest.mark.parametrize("prefill", ["colocated", "disaggregated"])
def test_conservation_default_profile(policy, prefill):
    res = memtp_sim.run(scenario(workload={"mode": "poisson", "rate_per_s": 0.5, "num_requests": 60},
                                 engine={"prefill": prefill, "prefill_gpus": 4}, policy=policy), seed=1)
    _check_conservation(res, disaggregated=prefill == "disaggregated")
    assert res.metrics["num_completed"] == 60
    r = res.state.rounds
    assert np.all(r["kv_blocks_peak"] <= res.state.kv_capacity_blocks)
    assert np.all(r["batch_tokens"] <= 512)


@pytest.mark.parametrize("policy", [{"name": "static", "k": 5}, {"name": "dspark"}, {"name": "no_spec"}])
@pytest.mark.parametrize("prefill", ["colocated", "disaggregated"])
def test_tight_memory_rejects_preempts_and_conserves(tight_profile, policy, prefill):
    res = memtp_sim.run(scenario(hardware={"profile": tight_profile},
                                 workload={"concurrency": 16, "num_requests": 120},
                                 engine={"prefill": prefill, "prefill_gpus": 4}, policy=policy), seed=0)
    st = res.state
    rf = res.requests_frame()
    _check_conservation(res, disaggregated=prefill == "disaggregated")
    # KV never above capacity, and the cache really was the bottleneck
    assert np.all(st.rounds["kv_blocks_peak"] <= st.kv_capacity_blocks)
    assert np.all(st.rounds["kv_blocks_after"] <= st.kv_capacity_blocks)
    assert st.rounds["kv_blocks_peak"].max() == st.kv_capacity_blocks
    assert res.metrics["num_preemptions"] > 0
    # rejection reasons follow from the request sizes alone (block = 16 tokens)
    total = rf["prompt_tokens"] + rf["output_tokens"]
    too_long = total > 4096
    too_big = ~too_long & (np.ceil(total / 16) > st.kv_capacity_blocks)
    assert (rf.loc[too_long, "reject_reason"] == "exceeds_max_model_len").all()
    assert (rf.loc[too_big, "reject_reason"] == "exceeds_kv_capacity").all()
    assert (rf.loc[~too_long & ~too_big, "status"] == "finished").all()
    assert too_long.any()
    if policy["name"] != "no_spec":  # without a drafter the cache is 1 GiB larger
        assert too_big.any()


# ------------------------------------------------------------------------------------------
# determinism
# ------------------------------------------------------------------------------------------


def test_same_seed_same_results_different_seed_different():
    sc = scenario(workload={"mode": "poisson", "rate_per_s": 0.5, "num_requests": 40},
                  engine={"prefill": "disaggregated", "prefill_gpus": 4}, policy={"name": "dspark"})
    a, b, c = memtp_sim.run(sc, seed=11), memtp_sim.run(sc, seed=11), memtp_sim.run(sc, seed=12)
    pd.testing.assert_frame_equal(a.requests_frame(), b.requests_frame())
    pd.testing.assert_frame_equal(a.rounds_frame(), b.rounds_frame())
    assert not a.requests_frame().equals(c.requests_frame())
    assert not a.rounds_frame().equals(c.rounds_frame())


def test_same_seed_same_results_closed_loop():
    sc = scenario(workload={"concurrency": 8, "num_requests": 40}, policy={"name": "static", "k": 3})
    a, b = memtp_sim.run(sc, seed=4), memtp_sim.run(sc, seed=4)
    pd.testing.assert_frame_equal(a.requests_frame(), b.requests_frame())
    pd.testing.assert_frame_equal(a.rounds_frame(), b.rounds_frame())


# ------------------------------------------------------------------------------------------
# Little's law
# ------------------------------------------------------------------------------------------


def _undercount_bound_s(res) -> float:
    """Upper bound on request-seconds the round-start sampling misses.

    ``mean_in_system_sampled`` counts a request from the first round that *starts* after it arrived, so a
    request arriving during round k is missed for at most that round's duration (a colocated
    closed-loop request submitted at the end of a round without think time is missed for the next
    round, which starts at its arrival). Summing the duration of the round in force at each
    arrival bounds the miss.
    """
    r = res.state.rounds
    start, dur = r["start_s"], r["duration_s"]
    arr = res.requests_frame()["arrival_at_s"].to_numpy()
    k = np.searchsorted(start, arr, side="right") - 1
    inside = (k >= 0) & (arr < start[np.clip(k, 0, None)] + dur[np.clip(k, 0, None)])
    return float(dur[k[inside]].sum())


def _little_terms(res):
    rf = res.requests_frame()
    done = rf[rf["status"] == "finished"]
    makespan = res.metrics["makespan_s"]
    lam = len(done) / makespan
    w = float(done["e2e_s"].mean())
    return lam, w, float(done["e2e_s"].sum())


OPEN_LOOP = [
    pytest.param({"mode": "poisson", "rate_per_s": 0.3, "num_requests": 150}, id="poisson-light"),
    pytest.param({"mode": "poisson", "rate_per_s": 0.6, "num_requests": 150}, id="poisson-overloaded"),
    pytest.param({"mode": "trace", "rate_scale": 0.05, "num_requests": 150}, id="trace-replay"),
]


@pytest.mark.parametrize("wl", OPEN_LOOP)
def test_littles_law_open_loop(wl):
    # L (time average of waiting + running, from the per-round table) vs lambda * W.
    # Tolerance: sampling at round starts misses each arrival's first partial round, i.e. about half
    # a round (<= 0.5 s here) out of a W of 10-150 s: well under 3 %; nothing is ever over-counted.
    res = memtp_sim.run(scenario(workload=wl, engine={"prefill": "colocated"}, policy={"name": "dspark"}), seed=0)
    lam, w, sum_e2e = _little_terms(res)
    # the engine's exact integral of its own arrival/completion events equals lambda * W
    assert res.metrics["mean_in_system"] == pytest.approx(lam * w, rel=1e-9)
    big_l = res.metrics["mean_in_system_sampled"]
    assert big_l == pytest.approx(lam * w, rel=0.03)
    # the sharper sandwich: sum of e2e - missed <= area under the in-system curve <= sum of e2e
    area = big_l * res.metrics["makespan_s"]
    slack = _undercount_bound_s(res)
    assert area <= sum_e2e * (1 + 1e-9)
    assert area >= sum_e2e - slack - 1e-9 * sum_e2e


@pytest.mark.parametrize("concurrency", [1, 4, 8])
def test_closed_loop_in_system_equals_concurrency(concurrency):
    # think time 0: while requests remain, every user always has exactly one request in the system,
    # so L = N until the last submission t_last, and L <= N afterwards (the drain). Hence
    #   N * t_last / T - missed / T  <=  mean_in_system  <=  N.
    # With ~200 requests over N users the drain is a few % of the run: L within 6 % of N.
    res = memtp_sim.run(scenario(workload={"concurrency": concurrency, "num_requests": 200},
                                 engine={"prefill": "colocated"}, policy={"name": "dspark"}), seed=0)
    big_l = res.metrics["mean_in_system_sampled"]
    makespan = res.metrics["makespan_s"]
    t_last = float(np.nanmax(res.requests_frame()["arrival_at_s"]))
    assert big_l <= concurrency * (1 + 1e-9)
    assert big_l >= concurrency * t_last / makespan - _undercount_bound_s(res) / makespan - 1e-9
    assert big_l == pytest.approx(concurrency, rel=0.06)
    lam, w, _ = _little_terms(res)
    assert big_l == pytest.approx(lam * w, rel=0.03)


def test_littles_law_holds_on_the_runs_csv_columns(tmp_path):
    # fault (fresh user): L = lambda W computed from runs.csv failed (64 users: L = 55.3, arrival_rate_per_s
    # x mean_e2e_s = 75.8) because arrival_rate_per_s covers first to last arrival only. The law's terms all
    # span the whole run: L = mean_in_system, lambda = num_completed / makespan_s = request_throughput_per_s,
    # W = mean_e2e_s; the docs must say so, and the columns must satisfy it to rounding.
    doc = {"name": "little", "base": scenario_doc(engine={"prefill": "colocated"}, policy={"name": "dspark"}),
           "sweep": {"workload": [{"trace": str(TRACE), "mode": "closed_loop", "concurrency": 64, "num_requests": 150},
                                  {"trace": str(TRACE), "mode": "poisson", "rate_per_s": 0.3, "num_requests": 150},
                                  {"trace": str(TRACE), "mode": "poisson", "rate_per_s": 0.6, "num_requests": 150}]}}
    f = tmp_path / "little.yaml"
    f.write_text(yaml.safe_dump(doc))
    assert main(["run", str(f), "--out", str(tmp_path / "out"), "--jobs", "1", "--quiet"]) == 0
    t = pd.read_csv(tmp_path / "out" / "little" / "runs.csv")
    assert len(t) == 3
    for _, r in t.iterrows():
        lam = r["num_completed"] / r["makespan_s"]
        assert r["request_throughput_per_s"] == pytest.approx(lam, rel=1e-12)
        assert r["mean_in_system"] == pytest.approx(lam * r["mean_e2e_s"], rel=1e-9)
    # the first-to-last-arrival rate is not the law's lambda: a closed loop drains after its last arrival
    (_, closed), = t[t["offered_load_ratio"].isna()].iterrows()  # NaN only for the closed loop
    assert closed["arrival_rate_per_s"] * closed["mean_e2e_s"] > 1.1 * closed["mean_in_system"]
    law = " ".join(memtp_sim.metrics.__doc__.split())
    assert "mean_in_system = request_throughput_per_s x mean_e2e_s" in law
    assert "``arrival_rate_per_s`` is not the law's ``lambda``" in law


@pytest.mark.parametrize("wl", [
    pytest.param({"mode": "poisson", "rate_per_s": 0.3, "num_requests": 150}, id="poisson"),
    pytest.param({"mode": "closed_loop", "concurrency": 4, "num_requests": 150}, id="closed-loop"),
])
def test_littles_law_disaggregated(wl):
    # Requests in remote prefill are in the system too. The round-start sample cannot see them while
    # the decode engine idles, so this uses the engine's exact event integral.
    res = memtp_sim.run(scenario(workload=wl, engine={"prefill": "disaggregated", "prefill_gpus": 2},
                                 policy={"name": "dspark"}), seed=0)
    lam, w, _ = _little_terms(res)
    assert res.metrics["mean_in_system"] == pytest.approx(lam * w, rel=1e-9)
    assert res.metrics["mean_in_system_sampled"] <= res.metrics["mean_in_system"] * (1 + 1e-9)


def test_disaggregated_trace_ending_with_one_token_output(tmp_path):
    trace = tmp_path / "mooncake.csv"
    # Mooncake format: ms timestamps; the second request arrives 10 s later and wants 1 token.
    trace.write_text("timestamp,input_length,output_length\n0,10,5\n10000,10,1\n")
    res = memtp_sim.run(scenario(workload={"trace": str(trace), "mode": "trace", "num_requests": 2},
                                 engine={"prefill": "disaggregated", "prefill_gpus": 1},
                                 policy={"name": "no_spec"}), seed=0)
    assert res.metrics["num_completed"] == 2


def test_colocated_trace_ending_with_a_rejected_request(tmp_path):
    trace = tmp_path / "mooncake.csv"
    trace.write_text("timestamp,input_length,output_length\n0,10,5\n10000,200000,10\n")
    res = memtp_sim.run(scenario(workload={"trace": str(trace), "mode": "trace", "num_requests": 2},
                                 engine={"prefill": "colocated"}, policy={"name": "no_spec"}), seed=0)
    assert res.metrics["rejected_by_reason"] == {"exceeds_max_model_len": 1}

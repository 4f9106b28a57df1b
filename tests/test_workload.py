"""Workloads: trace replay, Poisson arrivals, closed loop, domain mix, trace formats.

Trace oracles are the first rows of data/traces/azure2023_conv.csv, typed in:

    2023-11-16 18:15:46.6805900, 374, 44
    2023-11-16 18:15:50.9951690, 396, 109
    2023-11-16 18:15:51.2224670, 879, 55
    2023-11-16 18:15:51.3910170,  91, 16
"""

from __future__ import annotations

import numpy as np
import pytest

from _sim_helpers import TRACE, scenario
from memtp_sim.errors import ConfigError
from memtp_sim.workload import build_workload, load_trace

# offsets from the first row: 50.9951690 - 46.6805900 = 4.3145790, 5.2224670 - 0.6805900 = 4.5418770,
# 5.3910170 - 0.6805900 = 4.7104270
FIRST_OFFSETS = [0.0, 4.314579, 4.541877, 4.710427]
FIRST_PROMPTS = [374, 396, 879, 91]
FIRST_OUTPUTS = [44, 109, 55, 16]


def _build(mode, n, seed=0, probs=(1.0,), **kw):
    return build_workload(load_trace(TRACE), mode=mode, num_requests=n, rng=np.random.default_rng(seed),
                          domain_probs=np.asarray(probs, dtype=float), **kw)


def test_azure_trace_is_read():
    tr = load_trace(TRACE)
    assert tr.format == "azure2023"
    assert tr.arrival_s[:4].tolist() == pytest.approx(FIRST_OFFSETS, abs=1e-6)
    assert tr.prompt_tokens[:4].tolist() == FIRST_PROMPTS
    assert tr.output_tokens[:4].tolist() == FIRST_OUTPUTS
    assert np.all(np.diff(tr.arrival_s) >= 0)


def test_trace_replay_scales_arrival_times():
    wl = _build("trace", 4, rate_scale=0.5)  # half the rate: times doubled
    assert wl.arrival_s.tolist() == pytest.approx([2 * t for t in FIRST_OFFSETS], abs=1e-6)
    assert wl.prompt_tokens.tolist() == FIRST_PROMPTS
    assert wl.output_tokens.tolist() == FIRST_OUTPUTS
    assert not wl.closed_loop


def test_trace_replay_start_offset():
    # start at 4.4 s of trace time: the first request at or after it is row 2 (4.541877 s)
    wl = _build("trace", 2, start_offset_s=4.4)
    assert wl.arrival_s.tolist() == pytest.approx([0.0, 4.710427 - 4.541877], abs=1e-6)
    assert wl.prompt_tokens.tolist() == [879, 91]


def test_trace_replay_with_too_few_rows_is_a_config_error():
    n_rows = len(load_trace(TRACE))
    with pytest.raises(ConfigError, match="requested"):
        _build("trace", n_rows + 1)


def test_poisson_rate():
    # exponential gaps with mean 1/rate = 0.5 s; n - 1 = 3999 gaps, sd of the mean = 0.5 / sqrt(3999)
    n, rate = 4000, 2.0
    wl = _build("poisson", n, rate_per_s=rate)
    gaps = np.diff(wl.arrival_s)
    assert wl.arrival_s[0] == 0.0
    assert np.all(gaps >= 0)
    assert abs(gaps.mean() - 0.5) < 4 * 0.5 / np.sqrt(n - 1)
    # lengths come from the trace rows
    tr = load_trace(TRACE)
    assert set(wl.prompt_tokens.tolist()) <= set(tr.prompt_tokens.tolist())


def test_closed_loop_has_no_arrival_times():
    wl = _build("closed_loop", 10, concurrency=3, think_time_s=1.5)
    assert wl.closed_loop
    assert wl.concurrency == 3
    assert wl.think_time_s == 1.5
    assert np.all(np.isnan(wl.arrival_s))


def test_domain_mix_frequencies():
    # binomial: fraction of each domain within 4 sd of its probability
    n, probs = 6000, np.array([0.2, 0.3, 0.5])
    wl = _build("closed_loop", n, probs=probs, concurrency=1)
    frac = np.bincount(wl.domain, minlength=3) / n
    assert np.all(np.abs(frac - probs) < 4 * np.sqrt(probs * (1 - probs) / n))


def test_unknown_mode_is_a_config_error():
    with pytest.raises(ConfigError, match="mode"):
        _build("bursty", 5)


def test_mooncake_trace_format(tmp_path):
    # Mooncake: timestamp in ms; same-timestamp requests arrive together, order kept.
    p = tmp_path / "mc.csv"
    p.write_text("timestamp,input_length,output_length,hash_ids\n1000,10,5,[]\n1000,20,6,[]\n3000,30,7,[]\n")
    tr = load_trace(p)
    assert tr.format == "mooncake"
    assert tr.arrival_s.tolist() == pytest.approx([0.0, 0.0, 2.0])
    assert tr.prompt_tokens.tolist() == [10, 20, 30]
    assert tr.output_tokens.tolist() == [5, 6, 7]


def test_azure_timestamps_with_and_without_fractions_of_a_second(tmp_path):
    # a fresh user's trace wrote whole seconds (refused before); hand-derived offsets from the
    # earliest request: 0, 0.68059, 1 and 61.5 s
    p = tmp_path / "az.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,10,5\n"
                 "2023-11-16 18:15:46.6805900,20,6\n2023-11-16 18:15:47,30,7\n2023-11-16 18:16:47.5,40,8\n")
    tr = load_trace(p)
    assert tr.arrival_s.tolist() == pytest.approx([0.0, 0.68059, 1.0, 61.5], abs=1e-9)
    assert tr.prompt_tokens.tolist() == [10, 20, 30, 40]
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15,10,5\n")
    with pytest.raises(ConfigError, match="row 2, column TIMESTAMP: '2023-11-16 18:15' is not a time"):
        load_trace(p)


def test_unknown_trace_columns_are_a_config_error(tmp_path):
    p = tmp_path / "x.csv"
    p.write_text("a,b\n1,2\n")
    with pytest.raises(ConfigError, match="columns"):
        load_trace(p)


def test_missing_trace_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_trace(tmp_path / "nope.csv")


def test_scenario_poisson_arrivals_through_run():
    import memtp_sim

    res = memtp_sim.run(scenario(workload={"mode": "poisson", "rate_per_s": 0.2, "num_requests": 40},
                                 engine={"prefill": "disaggregated", "prefill_gpus": 4},
                                 policy={"name": "no_spec"}), seed=3)
    arr = res.requests_frame()["arrival_at_s"].to_numpy()
    assert arr[0] == 0.0
    assert np.all(np.diff(np.sort(arr)) >= 0)
    assert res.metrics["num_requests"] == 40

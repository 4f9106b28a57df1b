"""Every pass and drafting time is positive, finite and never falls beyond the measured range.

The fault this guards (a kind, not one input): H200's decode passes were measured at 18.0 ms for
B = 448 and 16.1 ms for B = 512, so the roofline through the last two points fell, and a 1,920-token
prefill chunk priced on that table took -27 ms (SimPy stopped on a negative delay). Any lookup
that extrapolates (verify, decode and prefill tables, measured drafter kernels) had the same
exposure. Checked over every shipped profile, with Hypothesis choosing batch sizes and contexts,
and end to end on the scenario that failed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import memtp_sim
from memtp_sim.config import Scenario
from memtp_sim.hardware import list_profiles, load_profile
from memtp_sim.hardware.cost import roofline_extrapolate

PROFILES = sorted(list_profiles())
TRACE = Path(__file__).resolve().parents[1] / "data" / "traces" / "azure2023_conv.csv"


def _tables(p):
    out = {"verify": p.sps, "decode": p.decode_table, "prefill": p.prefill_table}
    return {k: t for k, t in out.items() if t is not None and t.beyond_max != "error"}


def test_roofline_never_falls_hand_cases():
    xs, ts = np.array([256.0, 448.0, 512.0]), np.array([9.42, 18.03, 16.08])
    # the last secant falls: the chord from 512 down to 256 (nearest half) rises 6.66 ms over 256
    assert roofline_extrapolate(1024.0, xs, ts) == pytest.approx(16.08 + 512 * (16.08 - 9.42) / 256)
    # a rising last secant is kept as it was
    assert roofline_extrapolate(3.0, np.array([1.0, 2.0]), np.array([1.0, 3.0])) == pytest.approx(5.0)
    # every earlier point slower than the last: flat, never below the last measured time
    assert roofline_extrapolate(4096.0, np.array([256.0, 512.0]), np.array([20.0, 10.0])) == pytest.approx(10.0)
    assert roofline_extrapolate(8.0, np.array([4.0]), np.array([2.0])) == pytest.approx(4.0)


@pytest.mark.parametrize("name", PROFILES)
def test_every_table_is_positive_and_never_falls_beyond_the_measured_range(name):
    p = load_profile(name)
    for kind, t in _tables(p).items():
        top = int(t.max_batch_tokens)
        bs = np.arange(max(1, int(t.min_batch_tokens)), 4 * top + 1)
        for view in (t, t.at_context(1, 0, 0), t.at_context(64, 8192, 64 * 4096)):
            ms = np.asarray(view.pass_time_s(bs)) * 1000.0
            assert np.all(np.isfinite(ms)) and np.all(ms > 0), (name, kind, bs[np.argmin(ms)], ms.min())
            beyond = ms[bs >= top]
            assert np.all(np.diff(beyond) >= -1e-9), (name, kind)  # never falls past the last point


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(PROFILES), b=st.integers(1, 8192), r=st.integers(1, 256),
       l_max=st.integers(0, 131072), frac=st.floats(0.0, 1.0))
def test_any_batch_and_context_has_a_positive_time(name, b, r, l_max, frac):
    p = load_profile(name)
    kv = int(frac * r * l_max)
    for kind, t in _tables(p).items():
        if b < t.min_batch_tokens:
            continue
        v = t.at_context(r, l_max, kv).pass_time_s(b)
        assert np.isfinite(v) and v > 0, (name, kind, b, r, l_max, kv, v)


@settings(max_examples=100, deadline=None)
@given(name=st.sampled_from(PROFILES), r=st.integers(1, 4096), gamma=st.integers(1, 32))
def test_any_drafting_round_has_a_positive_time(name, r, gamma):
    p = load_profile(name)
    for drafter in p.drafters.values():
        v = drafter.round_time_s(r, gamma)
        assert np.isfinite(v) and v > 0, (name, drafter, r, gamma, v)


def test_big_prefill_chunks_on_h200_take_positive_time():
    """The reported run: 2,048-token passes with 1,920-token prefill chunks, no speculation."""
    sc = Scenario.model_validate({
        "hardware": {"profile": "h200-llama31-8b-bf16"},
        "workload": {"trace": str(TRACE), "mode": "trace", "num_requests": 200,
                     "rate_scale": 0.05},
        "engine": {"prefill": "colocated", "max_num_seqs": 128, "max_batch_tokens": 2048,
                   "prefill_chunk_tokens": 1920},
        "policy": {"name": "no_spec"}})
    r = memtp_sim.run(sc, seed=0).state.rounds
    assert np.min(r["verify_s"]) > 0 and np.min(r["duration_s"]) > 0


def test_a_non_positive_pass_stops_the_run_with_an_engine_invariant_error(monkeypatch):
    """Defence in depth: the engine may move SimPy's clock without an event, which would accept a
    negative duration silently; a bad price must stop the run naming the round instead."""
    from memtp_sim import engine as engine_mod
    from memtp_sim.errors import EngineInvariantError

    real = engine_mod.Engine._pass_time

    def broken(self, table, batch_tokens, num_dec, k, drafted):
        v, ext, ov = real(self, table, batch_tokens, num_dec, k, drafted)
        return -v, ext, ov

    monkeypatch.setattr(engine_mod.Engine, "_pass_time", broken)
    sc = Scenario.model_validate({"workload": {"trace": str(TRACE), "mode": "closed_loop", "concurrency": 2,
                                               "num_requests": 4}, "policy": {"name": "no_spec"}})
    with pytest.raises(EngineInvariantError, match=r"round \d+: pass of \d+ tokens priced verify -"):
        memtp_sim.run(sc, seed=0)

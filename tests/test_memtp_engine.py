"""MEMTP in the engine: head memory, elastic depth, breathing under a load ramp.

Oracles: hand-computed capacities (exact binary-fraction memory sizes), the docs/model.md section 2
formula's reference point, the invariant "KV + heads + weights never exceed memory", and the
study's expected breathing (depth lower while memory binds than before and after).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from _sim_helpers import scenario
from memtp_sim import run
from memtp_sim.acceptance import AcceptanceModel
from memtp_sim.config import load_study
from memtp_sim.drafting import Drafter, DraftSpec
from memtp_sim.engine import Engine, EngineSettings
from memtp_sim.memtp import MemtpSettings
from memtp_sim.errors import ConfigError
from memtp_sim.hardware import GIB, DrafterCost, HardwareProfile, MemorySpec, SPSTable
from memtp_sim.policies import make_policy
from memtp_sim.study import plan_runs
from memtp_sim.workload import Workload

REPO = Path(__file__).resolve().parents[1]
MIB = 1 << 20


def profile(alloc_gib: float, weights_gib: float = 0.0, reserve_gib: float = 0.0) -> HardwareProfile:
    # 1 MiB of KV per token, 16-token blocks: one block = 1/64 GiB exactly
    mem = MemorySpec(gpu_allocatable_gib=alloc_gib, weights_gib=weights_gib, drafter_weights_gib=0.0,
                     reserve_gib=reserve_gib, kv_bytes_per_token=MIB, kv_block_tokens=16, max_model_len=10**7)
    sps = SPSTable(np.array([1, 512]), np.array([10.0, 50.0]), source="test")
    drafter = DrafterCost(0.001, 512, 0.0, 1.0, 0.0001, 0.0, "test")
    return HardwareProfile("test", "", "", sps, drafter, mem, "<memory>")


def engine(prof: HardwareProfile, memtp: MemtpSettings, prompts, outputs, *, concurrency=4, seed=0) -> Engine:
    prompts, outputs = np.asarray(prompts), np.asarray(outputs)
    wl = Workload(np.full(prompts.size, np.nan), prompts, outputs, np.zeros(prompts.size, dtype=np.int64),
                  concurrency=concurrency)
    spec = DraftSpec.resolve("dspark", {}, memtp)
    pol = make_policy(spec.policy_name, spec.policy_params)
    return Engine(prof, AcceptanceModel.fixed(0.8), wl, pol,
                  EngineSettings(max_batch_tokens=512, prefill_chunk_tokens=128, kv_watermark_frac=0.0),
                  np.random.default_rng(seed), drafter=Drafter(spec, prof))


def test_fixed_depth_capacity_is_what_the_heads_leave():
    # 20 GiB, 3 heads of 2.5 GiB -> 12.5 GiB of KV = 800 blocks of 1/64 GiB
    eng = engine(profile(20.0), MemtpSettings(depth=3, head_cost_gib=2.5, max_depth=8), [100] * 4, [10] * 4)
    assert eng.kv.capacity == 800
    state = eng.run()
    assert np.all(state.rounds["depth"] == 3)
    assert np.all(state.rounds["heads_gib"] == 7.5)
    dec = state.rounds["num_decode"] > 0
    assert np.all(state.rounds["gamma"][dec] == 3)  # the draft length is the ensemble depth


def test_elastic_starts_at_the_formula_reference_point():
    # docs/model.md section 2: 21.49 GiB free, 4 GiB per head, R = 1 -> depth 5
    eng = engine(profile(21.49 + 30.0, weights_gib=30.0), MemtpSettings(depth="elastic", max_depth=16), [64], [4],
                 concurrency=1)
    assert eng.drafter.depth == 5
    assert eng.kv.capacity == int(np.floor((21.49 - 5 * 4.0) * 64))


def test_growing_a_head_stalls_for_its_load_time():
    # start at 1 head, lots of free memory, dwell 1: the controller grows one head per round
    ms = MemtpSettings(depth="elastic", max_depth=4, head_cost_gib=1.0, min_dwell_rounds=1, initial_depth=1,
                       head_load_gb_per_s=2.0)
    state = engine(profile(40.0), ms, [32] * 2, [200] * 2, concurrency=2).run()
    r = state.rounds
    prev = np.concatenate(([1.0], r["depth"][:-1]))  # initial depth 1
    grew = np.flatnonzero(r["depth"] > prev)
    assert grew.size == 3  # 1 -> 2 -> 3 -> 4, one head per round
    assert np.all(r["head_load_s"][r["depth"] <= prev] == 0.0)
    # one head of 1 GiB at 2 GB/s
    assert np.allclose(r["head_load_s"][grew], GIB / 2e9)
    assert np.allclose(r["duration_s"][grew], r["head_load_s"][grew] + r["draft_s"][grew] + r["verify_s"][grew])


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# found by Hypothesis: the elastic ensemble took the block a lone request's anchor needed (the
# heads' budget left no room for this round's anchors, and a lone request cannot be preempted)
@example(alloc=6.0, head_cost=0.5, depth="elastic", prompts=[16, 16, 16, 2511], conc=4, seed=4)
@given(
    alloc=st.floats(6.0, 24.0),
    head_cost=st.floats(0.5, 3.0),
    depth=st.one_of(st.just("elastic"), st.integers(1, 3)),
    prompts=st.lists(st.integers(16, 3000), min_size=3, max_size=12),
    conc=st.integers(1, 6),
    seed=st.integers(0, 10),
)
def test_kv_plus_heads_plus_weights_never_exceed_memory(alloc, head_cost, depth, prompts, conc, seed):
    weights = 2.0
    ms = MemtpSettings(depth=depth, max_depth=6, head_cost_gib=head_cost, min_dwell_rounds=2)
    prof = profile(alloc, weights_gib=weights, reserve_gib=0.5)
    outputs = [20 + (p % 37) for p in prompts]
    try:
        eng = engine(prof, ms, prompts, outputs, concurrency=conc, seed=seed)
    except ValueError:  # CalibrationError: a fixed depth that leaves no KV at all is refused up front
        return
    state = eng.run()
    r = state.rounds
    block_gib = 1.0 / 64
    used = r["kv_blocks_peak"] * block_gib + r["heads_gib"] + weights + 0.5
    assert np.all(used <= alloc + 1e-9)
    assert np.all((r["depth"] >= 1) & (r["depth"] <= 6))
    finished = state.status == 3
    rejected = state.status == 4
    assert np.all(finished | rejected)
    assert np.array_equal(state.generated_tokens[finished], state.output_tokens[finished])


def test_memtp_config_errors_name_the_field(tmp_path):
    base = (REPO / "studies" / "memtp.yaml").read_text().replace("../data/traces/", str(REPO / "data" / "traces") + "/")
    bad = tmp_path / "bad.yaml"
    bad.write_text(base.replace("    r_low: 0.3", "    r_low: 0.95"))
    with pytest.raises(ConfigError, match=r"bad\.yaml.*r_low"):
        load_study(bad)
    bad.write_text(base.replace("    max_depth: 16", "    max_depth: 4\n    initial_depth: 5"))
    with pytest.raises(ConfigError, match=r"bad\.yaml.*initial_depth"):
        load_study(bad)
    # with MEMTP the ensemble owns the block (gamma), whatever the YAML says: max_depth (16) when
    # elastic, the number of heads when fixed; labels leave gamma out, so every depth is one policy
    ok = tmp_path / "ok.yaml"
    ok.write_text(base.replace("  policy: {name: dspark, gamma: 16}", "  policy: {name: dspark, gamma: 7}"))
    specs = plan_runs(load_study(ok))
    assert {s.labels["policy"] for s in specs} == {
        "dspark(early_stop=False, fallback=True, probe_every=16)", "dspark_async(lag_rounds=2)"}
    gammas = {(s.scenario.memtp.depth, s.scenario.draft_spec().policy_params["gamma"]) for s in specs}
    assert gammas == {(1, 1), (5, 5), (16, 16), ("elastic", 16)}
    # each setup once: coherence steers only the elastic controller, so no fixed depth runs twice
    # with another coherence (it would give identical results)
    setups = [(s.scenario.memtp.depth, s.scenario.memtp.coherence, s.labels["policy"], s.seed) for s in specs]
    assert len(setups) == len(set(setups)) == 20
    assert {(d, c) for d, c, _, _ in setups if d == "elastic"} == {("elastic", "ewma"), ("elastic", "tower")}


def _check_breathing(res) -> None:  # noqa: ANN001 - a RunResult
    """The elastic ensemble is shallower while load is high, within the hysteresis bound, and
    rejects nothing."""
    r = res.rounds_frame()
    sched = res.scenario["workload"]["rate_schedule"]
    ends = np.cumsum([seg["duration_s"] for seg in sched])

    def mean_depth(t0, t1):
        sel = (r["start_s"] >= t0) & (r["start_s"] < t1)
        return float((r["depth"][sel] * r["duration_s"][sel]).sum() / r["duration_s"][sel].sum())

    low1, high, low2 = mean_depth(0, ends[0]), mean_depth(ends[0], ends[1]), mean_depth(ends[1], ends[2])
    assert high < low1 and high < low2, (low1, high, low2)
    # hysteresis: changes <= 2 * (rounds / dwell + 1) + max_depth - 1 (DepthController's bound)
    dwell, max_depth = 32, 16
    bound = 2 * (res.metrics["num_rounds"] / dwell + 1) + max_depth - 1
    assert 0 < res.metrics["num_depth_changes"] <= bound
    assert res.metrics["num_rejected"] == 0


def _ramp_specs() -> dict:
    study = load_study(REPO / "studies" / "memtp.yaml")
    return {(s.labels["variant"], s.labels["policy"].split("(")[0]): s for s in plan_runs(study) if s.seed == 0}


# Until the study was restructured, this test looked its run up by (memtp.depth, policy), a key the
# EWMA and tower variants shared, so it silently checked the tower variant only. Checked
# explicitly, the EWMA ensemble does not breathe on seed 0 (time-weighted depth 5.37 -> 5.64 ->
# 5.46 over the three phases; seed 1: 6.74 -> 3.24 -> 3.60): a known finding, kept visible here.
@pytest.mark.slow
@pytest.mark.parametrize("variant", [
    "elastic_tower",
    pytest.param("elastic_ewma", marks=pytest.mark.xfail(
        strict=True, reason="EWMA coherence, seed 0: the depth does not fall while load is high, because "
        "accepted / verified rises as DSpark verifies shorter prefixes (see the closed-form test below)")),
])
def test_ramp_study_breathes_and_hysteresis_bounds_changes(variant):
    _check_breathing(run(_ramp_specs()[(variant, "dspark")].scenario, seed=0))


@pytest.mark.slow
def test_sixteen_fixed_heads_reject_the_longest_prompts():
    fixed16 = run(_ramp_specs()[("depth16", "dspark")].scenario, seed=0)
    # 64 GiB of heads leave ~18 GiB of KV: the longest Mooncake prompts cannot be admitted at all
    assert fixed16.metrics["rejected_by_reason"].get("exceeds_kv_capacity", 0) > 0


# Why the EWMA ensemble need not breathe: its default estimator reads what the scheduler chose to
# verify. Oracle (i.i.d. acceptance alpha, L positions verified per request): the accepted run is
# truncated-geometric, E[accepted] = alpha (1 - alpha^L) / (1 - alpha), so accepted / verified is
# that over L and falls as L grows (0.72 at L = 2, 0.538 at L = 5 for alpha = 0.8), while accepted /
# tested has E[accepted] / E[min(L, accepted + 1)] = alpha at every L. Under load DSpark verifies
# shorter prefixes, so per_verified R rises just as free memory falls (studies/memtp.yaml seed 0:
# R 0.47 -> 0.83 -> 0.50 while verify per user goes 3.9 -> 2.0 -> 4.0), and the two cancel.
@pytest.mark.parametrize("estimator", ["per_verified", "per_tested"])
def test_coherence_estimators_against_the_truncated_geometric_closed_form(estimator):
    alpha = 0.8
    for k in (2, 5):
        sc = scenario(acceptance={"alpha": alpha}, memtp={"depth": k, "coherence_estimator": estimator},
                      policy={"name": "static", "k": k}, workload={"num_requests": 200, "concurrency": 8})
        r = run(sc, seed=0).rounds_frame()
        coherence = float(r["coherence"].iloc[len(r) // 4:].mean())  # past the EWMA's start at 1.0
        expected = alpha * (1 - alpha**k) / (1 - alpha) / k if estimator == "per_verified" else alpha
        # tolerance: sampling over ~1,500 rounds of 8 requests, and the EWMA of per-round ratios
        # sits slightly below the ratio of sums (Jensen)
        assert coherence == pytest.approx(expected, abs=0.025), (k, coherence, expected)


def test_the_widest_draft_block_fits_the_round_log_s_8_bit_columns(tmp_path):
    # a fresh user's report: memtp.depth 128 (or an elastic max_depth 128) under the static policy
    # simulated for a minute, then failed writing the round log, whose draft-length columns are
    # 8-bit (a policy with a gamma is held to 64; static, without one, took any width). The kind:
    # a setting that can exceed the column it is logged in. Every bound fits the columns, and a
    # wider MEMTP block is refused at load, naming the field
    import yaml

    from memtp_sim.config import load_scenario
    from memtp_sim.drafting import MAX_DRAFT_LEN
    from memtp_sim.engine import ROUND_DTYPES
    from memtp_sim.errors import ConfigError
    from memtp_sim.policies import policy_class

    for col in ("gamma", "depth"):
        assert MAX_DRAFT_LEN <= np.iinfo(ROUND_DTYPES[col]).max
    for name in ("dspark", "threshold", "goodput", "dspark_async", "static"):
        for field in ("gamma", "k"):
            info = policy_class(name).Params.model_fields.get(field)
            if info is not None:
                assert [m.le for m in info.metadata if hasattr(m, "le")][0] <= MAX_DRAFT_LEN, (name, field)
    wl = {"trace": str(Path(__file__).resolve().parents[1] / "data" / "traces" / "azure2023_conv.csv"),
          "mode": "closed_loop", "concurrency": 2, "num_requests": 4}
    f = tmp_path / "scen.yaml"
    for memtp, field in (({"depth": MAX_DRAFT_LEN + 1}, "memtp.depth"),
                         ({"depth": "elastic", "max_depth": MAX_DRAFT_LEN + 1}, "memtp.max_depth")):
        f.write_text(yaml.safe_dump({"workload": wl, "memtp": {**memtp, "head_cost_gib": 1e-4},
                                     "policy": {"name": "static"}}))
        with pytest.raises(ConfigError) as exc:
            load_scenario(f)
        assert str(exc.value) == (f"{f}: {field}: {MAX_DRAFT_LEN + 1} is wider than a run's round log holds (the "
                                  f"draft length is kept in 8 bits); allowed: <= {MAX_DRAFT_LEN}"), str(exc.value)
    f.write_text(yaml.safe_dump({"workload": wl, "memtp": {"depth": MAX_DRAFT_LEN, "head_cost_gib": 1e-4},
                                 "policy": {"name": "static"}}))
    state = run(load_scenario(f), seed=0).state  # at the bound: it runs and logs
    assert state.rounds["depth"].max() == MAX_DRAFT_LEN


@pytest.mark.parametrize("coherence", ["ewma", "tower"])
def test_heads_of_almost_no_memory_do_not_overflow(coherence, monkeypatch):
    # a fresh user's report: head_cost_gib 1e-310 raised OverflowError (floor of inf) where the
    # free memory over the head cost leaves float range. Now it counts as more heads than any
    # cap (and as none under a gate of 0, where inf * 0 is NaN), in Python and in the kernel
    from memtp_sim.engine import Engine
    from memtp_sim.memtp import memtp_depth

    for free, cost in ((100.0, 1e-310), (1e300, 5e-324), (0.0, 5e-324)):
        for r in (0.0, 0.3, 0.5, 1.0):
            d = memtp_depth(free, r, max_depth=16, head_cost_gib=cost, r_low=0.3, r_high=0.9)
            assert d == (16 if r > 0.3 and free > 0 else 1)
    scen = scenario(policy={"name": "dspark"}, workload={"concurrency": 4, "num_requests": 12},
                    memtp={"depth": "elastic", "max_depth": 8, "head_cost_gib": 1e-310, "min_dwell_rounds": 2,
                           "coherence": coherence, "r_low": 0.3, "r_high": 0.9})
    fast = run(scen, seed=1).state
    monkeypatch.setattr(Engine, "DRAFT_BLOCKS", False)
    slow = run(scen, seed=1).state
    assert np.array_equal(fast.rounds["depth"], slow.rounds["depth"]) and fast.rounds["depth"].max() == 8
    assert np.array_equal(fast.finished_at_s, slow.finished_at_s)

"""Drafter kinds and draft-length control (issue 11): closed forms and hand-derived cases.

Oracles: Leviathan, Kalman, Matias (2023) for a draft model's speedup at a fixed k and i.i.d.
acceptance; the chained-step cost worked out by hand; KV reservations on a cache of a known
number of blocks; switch counts of a controller on a batch that hovers at its threshold.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from _sim_helpers import flat_profile, workload  # noqa: E402

from memtp_sim.acceptance import AcceptanceModel, expected_tau_iid
from memtp_sim.drafting import Drafter, DraftSpec
from memtp_sim.engine import Engine, EngineSettings
from memtp_sim.hardware import HardwareProfile, MeasuredDrafterCost
from memtp_sim.policies import make_policy
from memtp_sim.policies.base import DraftView
from memtp_sim.policies.control import dynamic_tax_frac, make_control, parse_range_table


def _with_drafters(prof: HardwareProfile, **drafters) -> HardwareProfile:  # noqa: ANN003
    from dataclasses import replace

    return replace(prof, drafters=dict(drafters))


def _engine(prof, wl, policy, params, *, kind=None, control=None, p_min=0.0, alpha=0.7, seed=0, **settings):  # noqa: ANN001, ANN003
    spec = DraftSpec.resolve(policy, params, None, kind=kind, p_min=p_min)
    st = {"max_batch_tokens": 64, "prefill_chunk_tokens": 32, "kv_watermark_frac": 0.0}
    st.update(settings)
    return Engine(prof, AcceptanceModel.fixed(alpha), wl, make_policy(spec.policy_name, spec.policy_params),
                  EngineSettings(**st), np.random.default_rng(seed), drafter=Drafter(spec, prof),
                  control=make_control(*control) if control else None)


# ------------------------------------------------------------------------------- drafter cost
def test_chained_steps_cost_the_requests_still_drafting():
    # mtp step time by requests: 1 -> 1 ms, 4 -> 2 ms (linear between). Four requests drafting
    # 3, 1, 2, 3 positions: step 1 runs 4 requests (2 ms), step 2 three (5/3 ms), step 3 two
    # (4/3 ms): 5 ms in all; uniform k = 2 for 4 requests: 2 + 2 = 4 ms.
    prof = _with_drafters(flat_profile(), mtp=MeasuredDrafterCost("mtp", [1, 4], [1.0, 2.0], weights_gib=0.0))
    d = Drafter(DraftSpec.resolve("static", {"k": 3}, None, kind="mtp"), prof)
    assert d.ragged_time_s(np.array([3, 1, 2, 3]), 3) == pytest.approx(0.005)
    assert d.round_time_s(4, 2) == pytest.approx(0.004)


@pytest.mark.parametrize("profile", ["gfx1151-llama31-8b-q4km-vulkan", "h200-llama31-8b-bf16"])
@pytest.mark.parametrize("kind", ["dspark_block", "mtp", "per_sequence", "ngram"])
def test_a_uniform_round_costs_what_its_lengths_cost(profile, kind):
    # oracle: the ragged cost of R lengths all k (the array path); the uniform round's price (a
    # shortcut for the block drafter) must be the same float
    from memtp_sim.hardware import load_profile

    prof = load_profile(profile)
    for r in (1, 2, 7, 64, 129):
        for k in (1, 3, 7):
            d = Drafter(DraftSpec.resolve("static", {"k": k}, None, kind=kind), prof)
            assert d.round_time_s(r, k) == d.ragged_time_s(np.full(r, k, dtype=np.int64), k), (r, k)


def test_per_sequence_drafter_cost_grows_with_concurrency_block_does_not():
    # a block drafter pass of n tokens: 1 ms up to 8 tokens, then 1 ms + (n - 8) * 0.1 ms
    blk = MeasuredDrafterCost("block", [1, 8, 64], [1.0, 1.0, 6.6])
    prof = _with_drafters(flat_profile(), dspark_block=blk)
    batched = Drafter(DraftSpec.resolve("static", {"k": 2}, None, kind="dspark_block"), prof)
    per_seq = Drafter(DraftSpec.resolve("static", {"k": 2}, None, kind="per_sequence"), prof)
    # 4 requests x 2 tokens = 8 tokens in one pass: 1 ms; per sequence: 4 passes of 2 tokens: 4 ms
    assert batched.round_time_s(4, 2) == pytest.approx(0.001)
    assert per_seq.round_time_s(4, 2) == pytest.approx(0.004)
    assert per_seq.round_time_s(16, 2) == pytest.approx(4 * per_seq.round_time_s(4, 2))


@pytest.mark.slow
def test_draft_model_speedup_matches_leviathan():
    # Leviathan et al. 2023: with i.i.d. acceptance alpha, k drafts per round and a draft step
    # costing c of a target pass, tokens per second = (1 - a^(k+1)) / (1 - a) / (k c T + T).
    # A flat target pass T = 10 ms, a draft model step of 2 ms (c = 0.2), one request decoding a
    # long output: throughput must match the closed form within sampling error.
    t_ms, step_ms, k, alpha = 10.0, 2.0, 4, 0.7
    dm = MeasuredDrafterCost("model", [1, 512], [step_ms, step_ms], weights_gib=0.0)
    prof = _with_drafters(flat_profile(pass_ms=t_ms, max_b=512, kv_blocks=4096), draft_model=dm)
    out = 20000
    eng = _engine(prof, workload([8], [out], concurrency=1), "static", {"k": k}, kind="draft_model", alpha=alpha,
                  max_batch_tokens=512, prefill_chunk_tokens=256)
    st = eng.run()
    r = st.rounds
    dec = r["num_decode"] > 0
    tokens = float(r["emitted_tokens"][dec].sum())
    seconds = float(r["duration_s"][dec].sum())
    want = expected_tau_iid(alpha, k) / ((k * step_ms + t_ms) / 1000.0)
    rounds = int(dec.sum())
    se = np.sqrt(alpha * (1 - alpha)) * 3 / np.sqrt(rounds) / ((k * step_ms + t_ms) / 1000.0)  # generous
    assert tokens / seconds == pytest.approx(want, abs=4 * se + 1e-9)


# --------------------------------------------------------------------------------- p_min
def test_p_min_stops_drafting_and_saves_draft_time():
    # conf = sigmoid(logit(0.7)) = 0.7 at every position (oracle head): p_min 0.75 drafts nothing
    # worth verifying; p_min 0.5 drafts all.
    prof = _with_drafters(flat_profile(), mtp=MeasuredDrafterCost("mtp", [1, 64], [1.0, 1.0]))
    wl = workload([8] * 4, [40] * 4, concurrency=4)
    full = _engine(prof, wl, "dspark", {"gamma": 4, "fallback": False}, kind="mtp", p_min=0.5).run()
    none = _engine(prof, wl, "dspark", {"gamma": 4, "fallback": False}, kind="mtp", p_min=0.75).run()
    assert none.rounds["verify_tokens"].sum() == 0
    assert none.rounds["draft_s"].sum() == 0.0  # every request stopped before its first step
    assert full.rounds["verify_tokens"].sum() > 0


# ------------------------------------------------------------------------- KV reservations
def test_lookahead_reservation_preempts_under_kv_pressure():
    # 4 blocks of 16 tokens. Two requests, each storing 15 tokens (prompt 15 -> one block each).
    # No speculation: anchors need a 2nd block each (tokens 16): 4 blocks, both run.
    # static k = 4: each needs 15 + 1 + 4 = 20 tokens -> 2 blocks each = 4: fits. k = 20: 36 tokens
    # -> 3 blocks each = 6 > 4: the newest admission is preempted.
    prof = flat_profile(kv_blocks=4, max_b=64)
    wl = workload([15, 15], [3, 3], concurrency=2)
    fits = _engine(prof, wl, "static", {"k": 4}).run()
    assert fits.num_preemptions.sum() == 0
    deep = _engine(prof, wl, "static", {"k": 20}).run()
    assert deep.num_preemptions.sum() >= 1
    assert (deep.rounds["kv_blocks_peak"] <= 4).all()


def test_draft_tokens_take_pass_budget_before_prefill():
    # max_batch 64, 4 decoding requests drafting k = 7: 4 * (1 + 7) = 32 tokens reserved, so a
    # prefilling request gets at most 32 (and its chunk cap, 32) -> prefill chunk <= 32; with no
    # speculation it could take min(32, 64 - 4) = 32 as well, so use a chunk cap of 48.
    prof = flat_profile(kv_blocks=1024, max_b=64)
    wl = workload([8, 8, 8, 8, 400], [50, 50, 50, 50, 5], concurrency=5)
    st = _engine(prof, wl, "static", {"k": 7}, prefill_chunk_tokens=48).run()
    r = st.rounds
    both = (r["num_decode"] == 4) & (r["prefill_tokens"] > 0) & (r["gamma"] == 7)
    assert both.any()
    assert (r["prefill_tokens"][both] <= 64 - 4 * 8).all()


# ------------------------------------------------------------------------------ controllers
def _view(r: int, k: int = 7) -> DraftView:
    return DraftView(num_requests=r, prefill_tokens=0, max_batch_tokens=4096, max_draft_len=k,
                     context_tokens=np.full(r, 100), sps=flat_profile(max_b=4096).sps, no_draft_pass_s=0.01,
                     draft_time_s=lambda kk: 0.001 * kk)


def test_flapping_at_a_threshold_and_hysteresis():
    # a batch hovering at the threshold: 16, 17, 16, 17, ... Without hysteresis the controller
    # switches every round; with 2 units of hysteresis it turns off once and stays off (it needs
    # the batch to fall to 14 to switch back on).
    hover = [16, 17] * 20
    plain = make_control("disable_by_batch_size", {"max_batch": 16})
    ks = [plain.cap(_view(r)) for r in hover]
    switches = sum(1 for a, b in zip(ks, ks[1:]) if (a > 0) != (b > 0))
    assert switches == len(hover) - 1
    damped = make_control("disable_by_batch_size", {"max_batch": 16, "hysteresis": 2})
    ks = [damped.cap(_view(r)) for r in hover]
    assert sum(1 for a, b in zip(ks, ks[1:]) if (a > 0) != (b > 0)) == 1
    assert [damped.cap(_view(r)) for r in (15, 14, 13)] == [0, 7, 7]


def test_flapping_costs_time_in_the_engine():
    # the same hovering in a run: every switch pays switch_s. 17 users, max_batch 16 -> the batch
    # moves across the threshold as requests finish and arrive.
    prof = flat_profile(kv_blocks=4096, max_b=512)
    wl = workload([8] * 40, [12] * 40, concurrency=17)
    flappy = _engine(prof, wl, "static", {"k": 2}, control=("disable_by_batch_size", {"max_batch": 16,
                                                                                     "switch_s": 0.05, "tax": 0.0}),
                     max_batch_tokens=512, prefill_chunk_tokens=256).run()
    calm = _engine(prof, wl, "static", {"k": 2}, control=("disable_by_batch_size",
                                                          {"max_batch": 16, "switch_s": 0.05, "tax": 0.0,
                                                           "hysteresis": 8}),
                   max_batch_tokens=512, prefill_chunk_tokens=256).run()
    assert flappy.rounds["overhead_s"].sum() > calm.rounds["overhead_s"].sum()


def test_batch_table_follows_vllm_semantics():
    # vLLM PR #32374: inclusive ranges; a gap inherits the previous range's k; clamped to the max
    ctl = make_control("batch_table", {"table": {"1-16": 3, "64-128": 2, "256-4096": 0}})
    assert [ctl.cap(_view(r)) for r in (1, 16, 17, 63, 64, 128, 200, 256, 5000)] == [3, 3, 3, 3, 2, 2, 2, 0, 0]
    assert ctl.cap(_view(4, k=2)) == 2
    with pytest.raises(ValueError, match="overlap"):
        parse_range_table({"1-16": 3, "10-20": 2}, "t")
    with pytest.raises(Exception, match="not 'lo-hi'"):
        make_control("batch_table", {"table": {"16-1": 3}})


def test_context_table_picks_by_batch_and_context():
    ctl = make_control("context_table", {"rows": [{"batch": "1-8", "context": "0-2048", "k": 2},
                                                  {"batch": "1-8", "context": "2049-1000000", "k": 5}],
                                         "default_k": 0})
    short = DraftView(4, 0, 4096, 7, np.full(4, 1000), flat_profile(max_b=4096).sps, 0.01, lambda k: 0.0)
    long = DraftView(4, 0, 4096, 7, np.full(4, 8000), flat_profile(max_b=4096).sps, 0.01, lambda k: 0.0)
    assert ctl.cap(short) == 2 and ctl.cap(long) == 5 and ctl.cap(_view(32)) == 0


def test_acceptance_target_steps_k_down_then_probes():
    from memtp_sim.policies.base import RoundOutcome

    ctl = make_control("acceptance_target", {"target": 0.6, "hysteresis": 0.05, "half_life_rounds": 1.0,
                                             "k_min": 0, "probe_every": 3})
    assert ctl.cap(_view(4, k=3)) == 3
    bad = RoundOutcome(np.full(4, 3), np.full(4, 3), np.zeros(4, dtype=int), np.zeros(3), np.full(3, 4))
    ks = []
    for _ in range(3):
        ctl.observe(bad)
        ks.append(ctl.cap(_view(4, k=3)))
    assert ks == [2, 1, 0]
    assert [ctl.cap(_view(4, k=3)) for _ in range(3)] == [0, 1, 0]  # a one-position probe every 3 rounds


def test_dynamic_tax_interpolates_the_measured_points():
    # vLLM issue #49548: +6.56% at 2 requests, +21.58% at 189; linear between, flat outside
    assert dynamic_tax_frac("measured", 2) == pytest.approx(0.0656)
    assert dynamic_tax_frac("measured", 189) == pytest.approx(0.2158)
    assert dynamic_tax_frac("measured", 95.5) == pytest.approx((0.0656 + 0.2158) / 2)
    assert dynamic_tax_frac("measured", 1000) == pytest.approx(0.2158)
    assert dynamic_tax_frac(0.1, 7) == 0.1


def test_dspark_falls_back_to_plain_decoding_when_drafting_cannot_pay():
    # drafting costs 50 ms a round against a 10 ms pass: no draft can repay it, so after its
    # first drafted rounds DSpark drafts only on the probes (every 16 rounds)
    slow = MeasuredDrafterCost("block", [1, 512], [50.0, 50.0])
    prof = _with_drafters(flat_profile(max_b=512, kv_blocks=4096), dspark_block=slow)
    wl = workload([8] * 4, [200] * 4, concurrency=4)
    st = _engine(prof, wl, "dspark", {"gamma": 4}, kind="dspark_block", max_batch_tokens=512,
                 prefill_chunk_tokens=256).run()
    dec = st.rounds["num_decode"] > 0
    drafted = (st.rounds["gamma"][dec] > 0).mean()
    assert drafted < 0.15
    off = _engine(prof, wl, "dspark", {"gamma": 4, "fallback": False}, kind="dspark_block",
                  max_batch_tokens=512, prefill_chunk_tokens=256).run()
    assert st.end_s < off.end_s


# ------------------------------------------------------------------------------------ export
@pytest.mark.parametrize("control, key, want", [
    # vLLM's merged field is a list of (range_start, range_end, num_speculative_tokens), inclusive
    ({"name": "batch_table", "table": {"17-64": 1, "1-16": 3, "65-4096": 0}}, "num_speculative_tokens_per_batch_size",
     [[1, 16, 3], [17, 64, 1], [65, 4096, 0]]),
    ({"name": "disable_by_batch_size", "max_batch": 32}, "disable_by_batch_size", 33),
])
def test_vllm_export_carries_the_batch_schedule_and_it_parses_back(control, key, want):
    import json

    from memtp_sim.tuning.export import build_export, deployment_settings

    scen = {"policy": {"name": "static", "k": 3}, "draft_control": control}
    out = build_export("vllm", deployment_settings(scen), {"study": "t"})
    cfg = json.loads(out["main"])["speculative_config"]
    assert cfg["num_speculative_tokens"] == 3 and cfg[key] == want
    if key == "num_speculative_tokens_per_batch_size":
        # parses back into the same controller, which gives the same k at every batch
        back = make_control("batch_table", {"table": {f"{lo}-{hi}": k for lo, hi, k in cfg[key]}})
        orig = make_control(control["name"], {k: v for k, v in control.items() if k != "name"})
        assert [back.cap(_view(r, 3)) for r in range(1, 100)] == [orig.cap(_view(r, 3)) for r in range(1, 100)]
    sg = build_export("sglang", deployment_settings(scen), {"study": "t"}, sps_table=None, sps_file_name="x.json")
    assert "draft_control" in sg["main"] and "--speculative-num-steps 3" in sg["main"]


def test_the_engines_draft_view_prices_its_context_once_and_only_when_read():
    # the engine's DraftView (engine._PricedOnReadDraftView): the same fields as an eager view, the
    # context priced on the first read of any of its three fields, never for depth or round reads
    from dataclasses import replace

    from memtp_sim.engine import _PricedOnReadDraftView

    calls = []
    sps = flat_profile(max_b=4096).sps
    tokens = np.array([100, 250])

    def price():  # noqa: ANN202
        calls.append(1)
        return tokens, sps, 0.0125

    view = _PricedOnReadDraftView(price, num_requests=2, prefill_tokens=0, max_batch_tokens=4096, max_draft_len=5,
                                  draft_time_s=lambda k: 0.001 * k, fixed_s=0.0005, round_index=9)
    assert isinstance(view, DraftView) and (view.max_draft_len, view.round_index, view.num_requests) == (5, 9, 2)
    assert not calls
    assert view.no_draft_pass_s == 0.0125 and view.sps is sps and view.context_tokens is tokens
    assert len(calls) == 1
    eager = DraftView(2, 0, 4096, 5, tokens, sps, 0.0125, view.draft_time_s, 0.0005, 9)
    assert view.expected_rate(3, 1.5) == eager.expected_rate(3, 1.5)
    assert view.expected_rate(0, 0.0) == eager.expected_rate(0, 0.0)
    deeper = replace(view, max_draft_len=7)
    assert (deeper.max_draft_len, deeper.sps, deeper.no_draft_pass_s) == (7, sps, 0.0125) and len(calls) == 1
    with pytest.raises(AttributeError, match="no attribute 'depth'"):
        view.depth  # noqa: B018


@pytest.mark.parametrize("compiled", [True, False])
def test_a_lone_requests_drafts_are_trimmed_to_its_last_kv_block_and_logged_as_verified(compiled, monkeypatch):
    # One request, prompt 26 + output 38 = 64 tokens in a 4-block (64-token) cache: near its end
    # it cannot reserve 1 + 7 lookahead slots, and alone it cannot be preempted, so fit_lookahead
    # trims its drafts (seed 0: in its last two rounds). The round log's verify_tokens is the plan less the trims:
    # checked against the trimmed lengths themselves.
    from memtp_sim import _compiled
    from memtp_sim.kv_cache import KVCacheManager

    seen = []
    fit = KVCacheManager.fit_lookahead

    def recording_fit(self, reqs, lengths):  # noqa: ANN001, ANN202
        out = fit(self, reqs, lengths)
        seen.append((int(lengths.sum()), out[1]))
        return out

    monkeypatch.setattr(KVCacheManager, "fit_lookahead", recording_fit)
    monkeypatch.setattr(_compiled, "ENABLED", compiled)
    monkeypatch.setattr(Engine, "PLAIN_BLOCKS", False)  # every round through the round path: one fit a row
    st = _engine(flat_profile(kv_blocks=4), workload([26], [38], concurrency=1), "static", {"k": 7}, alpha=0.9).run()
    r = st.rounds
    assert r["verify_tokens"].tolist() == [after for after, _ in seen]
    assert r["num_trimmed"].tolist() == [trimmed for _, trimmed in seen]
    assert r["num_trimmed"].sum() > 0 and int(st.generated_tokens[0]) == 38
    assert (r["kv_blocks_peak"] <= 4).all()


def test_a_controller_k_above_the_draft_length_is_named_where_it_is_capped(tmp_path, capsys):
    # a fresh user's report: batch_table's k 9 (or acceptance_target's k_min 9) on a 7-position
    # drafter ran as 7 without a word. Kept (one table may serve drafters of several depths), but
    # `run` names each such setting and in how many runs a cap applies; the runs are the capped ones
    import yaml

    from _sim_helpers import tiny_study_doc
    from memtp_sim.cli import main
    from memtp_sim.config import Scenario

    doc = tiny_study_doc()
    doc["base"]["policy"] = {"name": "static"}
    doc["base"]["draft_control"] = {"name": "batch_table", "table": {"1-2": 9, "3-8": 2}}
    doc["policies"] = [{"name": "static", "k": 7}, {"name": "static", "k": 12}]  # static drafts k positions
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(doc))
    assert main(["run", str(f), "--out", str(tmp_path / "out"), "--quiet", "--jobs", "1"]) == 0
    err = capsys.readouterr().err
    assert ("note: draft_control.table['1-2'] (batch_table) is 9, above the draft length 7: capped at 7 "
            "in 2 of 4 run(s)") in err, err
    assert "table['3-8']" not in err and "draft length 12" not in err, err
    # the same for the other controllers' settings, and none where every k fits
    base = {k: v for k, v in doc["base"].items() if k != "draft_control"} | {"policy": {"name": "static", "k": 7}}
    for control, says in (({"name": "acceptance_target", "k_min": 8}, "draft_control.k_min (acceptance_target) is 8"),
                          ({"name": "context_table", "rows": [{"batch": "1-8", "context": "0-100000", "k": 2}],
                            "default_k": 8}, "draft_control.default_k (context_table) is 8"),
                          ({"name": "batch_table", "table": {"1-8": 7}}, None), ({"name": "always"}, None)):
        notes = Scenario.model_validate(base | {"draft_control": control}).capped_settings()
        assert notes == ([f"{says}, above the draft length 7: capped at 7"] if says else []), notes


def test_under_the_elastic_ensemble_the_note_names_max_depth_and_no_fixed_cap():
    # a fresh user's report: under memtp.depth elastic the note said "capped at 8" (max_depth),
    # where the run caps k at the depth the ensemble runs at, 1..8: a k above max_depth is named
    # so; one within it is what the ensemble does (no note)
    from _sim_helpers import tiny_study_doc
    from memtp_sim.config import Scenario

    base = tiny_study_doc()["base"] | {"policy": {"name": "dspark"},
                                       "memtp": {"depth": "elastic", "max_depth": 8}}
    notes = Scenario.model_validate(base | {"draft_control": {"name": "batch_table", "table": {"1-2": 12}}}
                                    ).capped_settings()
    assert notes == ["draft_control.table['1-2'] (batch_table) is 12, above the elastic ensemble's max_depth 8: "
                     "capped at its depth (at most 8)"], notes
    assert Scenario.model_validate(base | {"draft_control": {"name": "batch_table", "table": {"1-2": 6}}}
                                   ).capped_settings() == []
    # static k under an ensemble: the policy's k is capped the same way (it ran as the depth silently)
    static = base | {"policy": {"name": "static", "k": 7}}
    assert Scenario.model_validate(static | {"memtp": {"depth": 5}}).capped_settings() == [
        "policy.k (static) is 7, above the draft length 5: capped at 5"]
    assert Scenario.model_validate(static | {"memtp": {"depth": "elastic", "max_depth": 6}}).capped_settings() == [
        "policy.k (static) is 7, above the elastic ensemble's max_depth 6: capped at its depth (at most 6)"]
    assert Scenario.model_validate(static | {"memtp": {"depth": "elastic", "max_depth": 8}}).capped_settings() == []


def test_a_controller_s_own_check_is_named_by_its_section_once(tmp_path):
    # a fresh user's report: a context_table row without `batch` read "draft_control.'context_table':
    # rows[0]: ..." (the name quoted where a field goes)
    import yaml

    from _sim_helpers import tiny_study_doc
    from memtp_sim.config import load_scenario
    from memtp_sim.errors import ConfigError

    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(tiny_study_doc()["base"] | {
        "draft_control": {"name": "context_table", "rows": [{"context": "0-9", "k": 2}]}}))
    with pytest.raises(ConfigError) as e:
        load_scenario(f)
    msg = str(e.value)
    assert "draft_control: rows[0]: needs exactly batch, context and k" in msg and "'context_table'" not in msg, msg

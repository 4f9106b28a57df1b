"""The search space (memtp_sim.tuning._space): pair rules hold for every draw, conditional entries
are sampled only when their condition holds."""

from __future__ import annotations

import optuna
import pytest

from memtp_sim.tuning import parse_tune_spec, sample_params, scenario_for, static_ranges

from ._helpers import tiny_doc

optuna.logging.set_verbosity(optuna.logging.WARNING)


def test_pair_rule_holds_for_every_int_draw():
    """engine.prefill_chunk_tokens < engine.max_batch_tokens (implied: the scenario requires it)."""
    doc = tiny_doc()
    doc["search_space"] = {
        "engine.prefill_chunk_tokens": {"type": "int", "low": 64, "high": 512, "step": 64},
        "engine.max_batch_tokens": {"type": "int", "low": 128, "high": 512, "step": 64},
    }
    spec = parse_tune_spec(doc)
    # propagated by hand: chunk <= 512 - 64 = 448 (next grid value below max's top); max >= 64 + 64
    assert static_ranges(spec) == {"engine.prefill_chunk_tokens": (64, 448), "engine.max_batch_tokens": (128, 512)}
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    seen = set()
    for _ in range(300):
        trial = study.ask()
        v = sample_params(trial, spec)
        chunk, cap = v["engine.prefill_chunk_tokens"], v["engine.max_batch_tokens"]
        assert chunk < cap and chunk % 64 == 0 and cap % 64 == 0 and 64 <= chunk and cap <= 512
        seen.add((chunk, cap))
        study.tell(trial, 0.0)
    assert (448, 512) in seen and (64, 128) in seen  # both extremes are reachable
    scenario_for(spec, {"engine.prefill_chunk_tokens": 448, "engine.max_batch_tokens": 512})


def test_pair_rule_float_with_gap():
    doc = tiny_doc()
    doc["base"]["memtp"] = {"depth": "elastic", "max_depth": 4}
    doc["base"]["policy"] = {"name": "dspark"}  # no gamma: the ensemble sets the draft length
    doc["search_space"] = {
        "memtp.r_low": {"type": "float", "low": 0.1, "high": 0.9},
        "memtp.r_high": {"type": "float", "low": 0.3, "high": 0.95},
    }
    doc["pair_constraints"] = [{"rule": "memtp.r_low < memtp.r_high", "name": "gate", "min_gap": 0.05}]
    spec = parse_tune_spec(doc)
    lo_rng, hi_rng = static_ranges(spec)["memtp.r_low"], static_ranges(spec)["memtp.r_high"]
    assert lo_rng == pytest.approx((0.1, 0.9)) and hi_rng == pytest.approx((0.3, 0.95))
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=2))
    for _ in range(300):
        trial = study.ask()
        v = sample_params(trial, spec)
        assert v["memtp.r_high"] - v["memtp.r_low"] >= 0.05 - 1e-12
        assert 0.3 <= v["memtp.r_high"] <= 0.95 and 0.1 <= v["memtp.r_low"] <= 0.9
        study.tell(trial, 0.0)


def test_conditional_entry_only_when_its_policy_is_chosen():
    doc = tiny_doc()
    doc["search_space"] = {
        "policy.name": {"type": "categorical", "choices": ["dspark", "threshold"]},
        "policy.threshold": {"type": "float", "low": 0.1, "high": 0.9, "when": {"policy.name": "threshold"}},
    }
    doc["base"]["policy"] = {"name": "dspark", "gamma": 4, "early_stop": True}
    spec = parse_tune_spec(doc)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    names = set()
    for _ in range(40):
        trial = study.ask()
        v = sample_params(trial, spec)
        names.add(v["policy.name"])
        assert ("policy.threshold" in v) == (v["policy.name"] == "threshold")
        scen = scenario_for(spec, v)  # early_stop is dropped for threshold, gamma kept
        assert scen.policy.name == v["policy.name"]
        study.tell(trial, 0.0)
    assert names == {"dspark", "threshold"}

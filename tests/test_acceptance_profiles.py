"""Per-position acceptance profiles (memtp_sim.acceptance, ``kind: per_position``).

Oracles, each independent of the fitting code:
* with no noise the fitted base logits are ``logit(c)`` and the model's conditional acceptance is
  the given vector exactly;
* with request and round noise, the population conditional acceptance is measured by Monte Carlo
  from the model's own draws (``round_logits``, Bernoulli acceptance) and must match the vector
  within sampling error (4 standard errors);
* Leviathan et al. (2023): a flat vector without noise gives ``(1 - a^(g+1)) / (1 - a)`` tokens per
  round;
* the shipped Table-1 profile draws exactly what the linear formula ``mu + u + z + slope (k - 1)``
  gives (so existing runs are unchanged).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy.special import expit, logit

import memtp_sim
from _sim_helpers import scenario
from memtp_sim.acceptance import (
    EXTRAPOLATED_POSITIONS,
    AcceptanceModel,
    acceptance_dir,
    fit_per_position_logits,
    load_acceptance,
    parse_conditional_acceptance,
    population_conditional_acceptance,
)
from memtp_sim.errors import CalibrationError

VEC = (0.84, 0.60, 0.39, 0.27)
LAB_PROFILES = ("lab-ar", "lab-parallel", "lab-markov", "lab-rnn", "lab-tower")


def _mc_conditional(model: AcceptanceModel, rounds: int, gamma: int, seed: int = 0):
    """Monte Carlo c_k, its standard error, from the model's own draws: one request per round."""
    rng = np.random.default_rng(seed)
    diff = model.sample_difficulty(rng, rounds)
    lg = model.round_logits(rng, np.zeros(rounds, dtype=np.int64), diff, gamma)
    ok = np.cumprod(rng.random(lg.shape) < expit(lg), axis=1).astype(bool)
    tested = np.concatenate([np.full((rounds, 1), True), ok[:, :-1]], axis=1).sum(axis=0)
    c = ok.sum(axis=0) / tested
    return c, np.sqrt(c * (1 - c) / tested)


# ------------------------------------------------------------------------------------------
# the Table-1 fit is unchanged
# ------------------------------------------------------------------------------------------


def test_table1_profile_draws_are_the_linear_formula_bit_for_bit():
    m = load_acceptance("dspark-qwen3")
    assert m.kind == "linear" and m.measured_positions is None
    dom = np.array([0, 1, 2, 2, 1, 0])
    diff = np.random.default_rng(5).normal(0, m.sigma_request, dom.size)
    got = m.round_logits(np.random.default_rng(9), dom, diff, 16)
    z = np.random.default_rng(9).normal(0.0, m.sigma_round, size=dom.size)
    want = ((m.mu[dom] + diff) + z)[:, None] + m.slope[dom][:, None] * np.arange(16.0)[None, :]
    assert np.array_equal(got, want)
    assert np.allclose(m.base_logits(16), m.mu[:, None] + m.slope[:, None] * np.arange(16.0))


# ------------------------------------------------------------------------------------------
# per-position fit
# ------------------------------------------------------------------------------------------


def test_no_noise_fit_is_logit_and_reproduces_the_vector_exactly():
    m = AcceptanceModel.per_position(VEC)
    assert m.kind == "per_position" and m.measured_positions == 4
    assert np.array_equal(m.base[0, :4], logit(np.array(VEC)))
    c = population_conditional_acceptance(m.base_logits(4)[0], 0.0)
    assert np.allclose(c, VEC, rtol=0, atol=1e-15)
    # beyond the measured positions: the last level repeated, flat
    assert np.allclose(expit(m.base_logits(20)[0, 4:]), VEC[-1], atol=1e-15)


@pytest.mark.parametrize("s_req,s_round", [(0.5, 1.2), (0.0, 2.0)])
def test_noisy_fit_matches_monte_carlo_population(s_req, s_round):
    m = AcceptanceModel.per_position(VEC, sigma_request=s_req, sigma_round=s_round, domains=("chat",))
    # quadrature says it holds (the fitting rule) ...
    assert np.allclose(population_conditional_acceptance(m.base_logits(8)[0], m.sigma_total)[:4], VEC, atol=1e-9)
    # ... and an independent Monte Carlo of the model's draws agrees, including the flat extrapolation
    c, se = _mc_conditional(m, 400_000, 8, seed=1)
    want = np.array(VEC + (VEC[-1],) * 4)
    assert np.all(np.abs(c - want) < 4 * se), (c, want, se)


def test_the_fit_can_fail_without_noise_correction():
    # logit(c) (the no-noise fit) under noise gives a different population: the test above has power
    m = AcceptanceModel(("chat",), np.zeros(1), np.zeros(1), 0.5, 1.2, base=logit(np.array(VEC))[None, :])
    c, se = _mc_conditional(m, 100_000, 4, seed=2)
    assert np.max(np.abs(c - np.array(VEC)) / se) > 10


def test_flat_extrapolation_holds_to_64_then_base_repeats():
    m = AcceptanceModel.per_position([0.9, 0.7], sigma_round=1.0, domains=("chat",))
    c = population_conditional_acceptance(m.base_logits(EXTRAPOLATED_POSITIONS)[0], m.sigma_total)
    assert np.allclose(c[1:], 0.7, atol=1e-8)
    far = m.base_logits(EXTRAPOLATED_POSITIONS + 10)[0]
    assert np.all(far[EXTRAPOLATED_POSITIONS - 1:] == far[EXTRAPOLATED_POSITIONS - 1])


@pytest.mark.parametrize("alpha,gamma", [(0.6, 1), (0.8, 5), (0.9, 7), (0.75, 16)])
def test_flat_vector_without_noise_is_leviathan(alpha, gamma):
    m = AcceptanceModel.per_position([alpha] * 3)
    closed = (1 - alpha ** (gamma + 1)) / (1 - alpha)
    assert m.expected_tau("chat", gamma) == pytest.approx(closed, rel=1e-12)
    # and by Monte Carlo: tokens per round = 1 + leading accepted of gamma
    rng = np.random.default_rng(3)
    lg = m.round_logits(rng, np.zeros(200_000, dtype=np.int64), np.zeros(200_000), gamma)
    tau = 1 + np.cumprod(rng.random(lg.shape) < expit(lg), axis=1).sum(axis=1)
    assert abs(tau.mean() - closed) < 4 * tau.std() / math.sqrt(tau.size)


def test_expected_tau_with_noise_matches_static_rounds():
    # one request, many rounds: tau is the plain mean of 1 + leading accepted (no request weighting)
    m = AcceptanceModel.per_position(VEC, sigma_round=1.0, domains=("chat",))
    rng = np.random.default_rng(4)
    lg = m.round_logits(rng, np.zeros(300_000, dtype=np.int64), np.zeros(300_000), 7)
    tau = 1 + np.cumprod(rng.random(lg.shape) < expit(lg), axis=1).sum(axis=1)
    assert abs(tau.mean() - m.expected_tau("chat", 7)) < 4 * tau.std() / math.sqrt(tau.size)


def test_per_position_builders_and_parse():
    assert parse_conditional_acceptance("0.84/0.60/0.39/0.27") == VEC
    assert parse_conditional_acceptance("0.84, 0.6") == (0.84, 0.6)
    m = AcceptanceModel.per_position({"math": [0.9, 0.8], "chat": [0.7, 0.6]})
    assert m.domains == ("math", "chat") and m.base.shape == (2, EXTRAPOLATED_POSITIONS)
    assert m.name.startswith("per-position-0.9/0.8")
    with pytest.raises(ValueError, match="conditional"):
        parse_conditional_acceptance("0.8/high")
    with pytest.raises(ValueError, match="position 2"):
        AcceptanceModel.per_position([0.8, 1.0])
    with pytest.raises(ValueError, match="same number"):
        AcceptanceModel.per_position({"a": [0.8], "b": [0.8, 0.7]})
    with pytest.raises(ValueError):
        fit_per_position_logits([0.5], -1.0)


# ------------------------------------------------------------------------------------------
# loading
# ------------------------------------------------------------------------------------------


def _write(tmp_path: Path, doc: dict) -> Path:
    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


GOOD = {"name": "t", "kind": "per_position", "sigma_request": 0.0, "sigma_round": 0.5,
        "domains": {"chat": {"conditional_acceptance": [0.9, 0.8, 0.7]}},
        "confidence": {"noise_sd": 0.5, "overconfidence": 1.2}}


def test_load_per_position_profile(tmp_path):
    m = load_acceptance(_write(tmp_path, GOOD))
    assert m.kind == "per_position" and m.domains == ("chat",) and m.measured_positions == 3
    assert m.confidence == {"noise_sd": 0.5, "overconfidence": 1.2}
    assert np.allclose(population_conditional_acceptance(m.base_logits(3)[0], 0.5), [0.9, 0.8, 0.7], atol=1e-9)
    s = m.summary()
    assert s["kind"] == "per_position" and s["measured_positions"] == 3


@pytest.mark.parametrize("change,field", [
    ({"sigma_round": None}, "sigma_round"),
    ({"sigma_round": -1}, "sigma_round"),
    ({"domains": {"chat": {"conditional_acceptance": [0.9, 1.0]}}}, "domains.chat.conditional_acceptance"),
    ({"domains": {"chat": {"conditional_acceptance": "high"}}}, "domains.chat.conditional_acceptance"),
    # a key the domain does not know, named with the one it needs (allowed: conditional_acceptance)
    ({"domains": {"chat": {"alpha": [0.9]}}}, "domains.chat.alpha: unknown key; allowed: conditional_acceptance"),
    ({"domains": {"a": {"conditional_acceptance": [0.9]}, "b": {"conditional_acceptance": [0.9, 0.8]}}},
     "domains"),
    ({"sigma_rounds": 0.5}, "sigma_rounds"),
    ({"confidence": {"noise_sd": -1, "overconfidence": 1}}, "confidence.noise_sd"),
    ({"confidence": {"noise_sd": 1}}, "confidence.overconfidence"),
    ({"beyond_measured": "decay"}, "beyond_measured"),
    ({"kind": "perposition"}, "kind"),
])
def test_bad_profiles_name_file_and_field(tmp_path, change, field):
    doc = dict(GOOD)
    for k, v in change.items():
        if v is None:
            doc.pop(k)
        else:
            doc[k] = v
    path = _write(tmp_path, doc)
    with pytest.raises(CalibrationError) as e:
        load_acceptance(path)
    msg = str(e.value)
    assert "\n" not in msg and str(path.resolve()) in msg and field in msg, msg


# ------------------------------------------------------------------------------------------
# the lab's shipped profiles
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", LAB_PROFILES)
def test_shipped_lab_profile_loads(name):
    path = acceptance_dir() / f"{name}.yaml"
    m = load_acceptance(path)
    assert m.kind == "per_position" and m.domains == ("lab",) and m.measured_positions >= 8
    assert set(m.confidence) == {"noise_sd", "overconfidence"}
    text = path.read_text()
    assert "Made by: python -m memtp_sim drafter-lab studies/drafter_lab.yaml" in text and "seed 0" in text


@pytest.mark.parametrize("name", ["lab-markov", "lab-parallel"])
def test_lab_profile_runs_through_the_engine(name):
    path = str(acceptance_dir() / f"{name}.yaml")
    res = memtp_sim.run(scenario(acceptance={"profile": path, "domain_mix": {"lab": 1.0}},
                                 policy={"name": "static", "k": 7},
                                 workload={"concurrency": 8, "num_requests": 60}), seed=0)
    want = load_acceptance(path).expected_tau("lab", 7)
    assert res.metrics["num_completed"] == 60
    assert 1.0 < res.metrics["tau"] < 8.0
    # tau of many request-rounds is near the model's static-gamma value (a loose, sanity band)
    assert abs(res.metrics["tau"] - want) < 0.25 * want, (res.metrics["tau"], want)

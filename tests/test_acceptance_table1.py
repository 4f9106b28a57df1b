"""Accepted tokens per round: the Leviathan closed form and the DSpark paper's Table 1.

* Leviathan, Kalman, Matias (2023): with i.i.d. per-position acceptance alpha and gamma drafted
  tokens all verified, tokens per round (bonus included) = (1 - alpha^(gamma+1)) / (1 - alpha).
* DSpark paper, Table 1 (block size 7, full block verified, offline): the Qwen3 DSpark rows,
  typed in below from PAPER_NOTES.md (not read from the package's calibration files).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import memtp_sim
from _sim_helpers import scenario

# ------------------------------------------------------------------------------------------
# Leviathan closed form
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("alpha,gamma", [(0.6, 3), (0.8, 5), (0.9, 7)])
def test_static_verification_matches_leviathan_closed_form(alpha, gamma):
    res = memtp_sim.run(scenario(acceptance={"alpha": alpha}, policy={"name": "static", "k": gamma},
                                 workload={"concurrency": 16, "num_requests": 300},
                                 engine={"prefill": "disaggregated", "prefill_gpus": 8}), seed=7)
    r = res.state.rounds
    # precondition: every decoding request verified its whole block every round (nothing trimmed)
    assert np.array_equal(r["verify_tokens"], gamma * r["num_decode"])
    n = float(r["num_decode"].sum())  # request-rounds, independent given fixed alpha

    closed_form = (1 - alpha ** (gamma + 1)) / (1 - alpha)
    # X = accepted drafts in one request-round: P(X >= j) = alpha^j for j = 1..gamma, so
    # E[X] = sum alpha^j and E[X^2] = sum (2j - 1) alpha^j (a truncated geometric).
    ex = sum(alpha**j for j in range(1, gamma + 1))
    ex2 = sum((2 * j - 1) * alpha**j for j in range(1, gamma + 1))
    assert 1 + ex == pytest.approx(closed_form)
    se = math.sqrt((ex2 - ex * ex) / n)
    # 4 standard errors (false alarm about 6e-5); with n ~ 5,000-15,000 request-rounds that is
    # 1-1.5 % of tau.
    assert abs(res.metrics["tau"] - closed_form) < 4 * se, (res.metrics["tau"], closed_form, se)
    # the acceptance rate of verified drafts is E[X] / gamma
    se_rate = se / gamma
    assert abs(res.metrics["acceptance_rate"] - ex / gamma) < 4 * se_rate


# ------------------------------------------------------------------------------------------
# Table 1, Qwen3 DSpark rows (GSM8K, MATH500, AIME25 | MBPP, HumanEval, LiveCodeBench |
# MT-Bench, Alpaca, Arena-Hard)
# ------------------------------------------------------------------------------------------
TABLE1_DSPARK_QWEN3 = {
    "Qwen3-4B": [6.11, 5.70, 4.89, 5.13, 5.38, 4.86, 3.64, 3.54, 3.29],
    "Qwen3-8B": [6.17, 5.78, 5.01, 5.16, 5.52, 5.17, 3.72, 3.58, 3.21],
    "Qwen3-14B": [6.21, 5.74, 4.94, 5.26, 5.43, 5.02, 3.70, 3.58, 3.13],
}
DOMAIN_COLUMNS = {"math": slice(0, 3), "code": slice(3, 6), "chat": slice(6, 9)}


def table1_target(domain: str) -> float:
    vals = [v for row in TABLE1_DSPARK_QWEN3.values() for v in row[DOMAIN_COLUMNS[domain]]]
    assert len(vals) == 9
    return float(np.mean(vals))


def test_table1_targets_typed_correctly():
    # hand sums: math 50.55 / 9, code 46.93 / 9, chat 31.39 / 9
    assert table1_target("math") == pytest.approx(50.55 / 9)
    assert table1_target("code") == pytest.approx(46.93 / 9)
    assert table1_target("chat") == pytest.approx(31.39 / 9)


def _run_table1(domain: str, num_requests: int, seed: int = 0):
    # 64 users x (1 anchor + 7 drafts) = 512 = the largest measured B: the whole block is always
    # verified; disaggregated prefill keeps prompts out of the decode passes.
    return memtp_sim.run(scenario(acceptance={"profile": "dspark-qwen3", "domain_mix": {domain: 1.0}},
                                  policy={"name": "static", "k": 7},
                                  workload={"concurrency": 64, "num_requests": num_requests},
                                  engine={"prefill": "disaggregated", "prefill_gpus": 8}), seed=seed)


def _tau_and_cluster_se(res) -> tuple[float, float]:
    """Ratio estimator tau = sum(y) / sum(x) over requests (y = accepted + rounds, x = rounds) and its
    standard error with requests as the independent units (rounds of one request share its difficulty)."""
    rf = res.requests_frame()
    rf = rf[rf["num_decode_rounds"] > 0]
    x = rf["num_decode_rounds"].to_numpy(float)
    y = rf["draft_tokens_accepted"].to_numpy(float) + x
    tau = y.sum() / x.sum()
    n = x.size
    se = math.sqrt(((y - tau * x) ** 2).sum() / (n * (n - 1))) / x.mean()
    return tau, se


@pytest.mark.slow
@pytest.mark.parametrize("domain", ["math", "code", "chat"])
def test_table1_tau_per_domain(domain):
    target = table1_target(domain)
    res = _run_table1(domain, 12000)
    r = res.state.rounds
    assert np.array_equal(r["verify_tokens"], 7 * r["num_decode"])  # full block verified, as in Table 1
    tau, se = _tau_and_cluster_se(res)
    assert tau == pytest.approx(res.metrics["tau"], rel=1e-12)
    # Monte Carlo error: 12,000 requests (~300,000 request-rounds); the request-level standard error
    # is 0.15-0.25 % of tau, so 4 SE stays below 1 %, well inside the 3 % band.
    assert 4 * se < 0.01 * target, se
    assert abs(tau - target) / target < 0.03, (domain, tau, target)


def test_table1_domain_order_quick():
    # Table 1 averages: math 5.62 > code 5.21 > chat 3.49. With 600 requests per domain the
    # request-level SE is ~0.04 tokens, far below the 0.4-token gap between math and code.
    taus = {d: _tau_and_cluster_se(_run_table1(d, 600))[0] for d in ("math", "code", "chat")}
    assert taus["math"] > taus["code"] > taus["chat"]
    for d, t in taus.items():
        assert abs(t - table1_target(d)) / table1_target(d) < 0.05, (d, t)

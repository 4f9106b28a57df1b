"""SLA capacity (memtp_sim.capacity): SLO parsing, and the rate search against a queue whose
capacity is known in closed form.

The oracle is an M/D/1 queue built from the library itself: a hand-made flat hardware profile
(every pass takes ``PASS_S`` whatever its size), one request at a time (``engine.max_num_seqs: 1``),
every request a 16-token prompt with 1 output token (the prefill pass emits it, so every request
is served in exactly one pass: deterministic service ``S = PASS_S``), no speculation, Poisson
arrivals. The Pollaczek-Khinchine formula gives the mean waiting time of M/G/1,
``W_q = lambda E[S^2] / (2 (1 - rho))``, which for deterministic service is
``W_q = rho S / (2 (1 - rho))`` (``rho = lambda S``). With the SLO ``mean_e2e_s <= S + w`` the
capacity is the rate where ``W_q = w``: ``rho* = 2 w / (S + 2 w)``, ``lambda* = rho* / S``.

Sampling error of the oracle check: at ``rho = 2/3`` and 4,000 requests the per-seed mean waiting
time scatters by about 7% (12 seeds measured: 0.103 +- 0.0073 s against the formula's 0.100 s), so
the mean of 3 seeds by about 4%; ``lambda*`` moves by ``(1 - rho)`` times the relative error of
``W_q`` (``d ln W_q / d ln rho = 1 / (1 - rho)``), about 1.4%. The check allows 5% (3.5 standard
errors) on top of the search tolerance.

The same queue is the oracle of the overload test: its service rate is ``mu = 1 / S`` = 10 req/s in
closed form, so with an SLO any backlog meets the capacity must lie below ``mu`` (within the test's
stated resolution, :mod:`memtp_sim.capacity`), and a stable rate at 0.9 or 0.95 ``mu`` must pass.

Source: Pollaczek-Khinchine mean-value formula (e.g. Kleinrock, *Queueing Systems* vol. 1, 1975,
section 5.6; Gross & Harris, *Fundamentals of Queueing Theory*, M/G/1).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import optuna
import pytest
import yaml

from memtp_sim.api import run
from memtp_sim.capacity import (
    LOAD_MONOTONE,
    NO_GAIN_HALVINGS,
    OVERLOAD_MIN_REQUESTS,
    SLO,
    SLOTerm,
    capacity_objective,
    load_capacity_scenarios,
    overload_limit,
    parse_policies,
    poisson_scenario,
    sla_capacity,
)
from memtp_sim.cli import main
from memtp_sim.config import Scenario
from memtp_sim.errors import ConfigError, InvalidArgumentError
from memtp_sim.metrics import METRIC_NAMES, OVERLOAD_RATIO
from memtp_sim.tuning import evaluate, parse_tune_spec, run_tune, scenario_for

REPO = Path(__file__).resolve().parents[1]
PASS_S = 0.1  # every pass, seconds: the deterministic service time S of one request
MU = 1.0 / PASS_S  # service rate, requests per second

COSTS = """kind,model,batch_tokens,num_requests,tokens_per_request,context_tokens,pass_ms,p10_ms,p90_ms,source
verify,flat,1,1,1,0,{ms},,,hand-made flat table (test)
verify,flat,512,512,1,0,{ms},,,hand-made flat table (test)
draft_block,flat,1,1,1,0,1.0,,,hand-made (unused: no speculation)
draft_block,flat,512,512,1,0,1.0,,,hand-made (unused: no speculation)
"""

PROFILE = """format: 2
name: flat-md1-test
description: every pass takes the same time (an M/D/1 server with max_num_seqs 1)
costs: costs.csv
select: {model: flat}
verify:
  reference_context: 0
  below_min: flat
  beyond_max: roofline
  context: none
drafters:
  dspark_block:
    kind: block
    select: {kind: draft_block}
    weights_gib: 0.0
default_drafter: dspark_block
memory:
  gpu_allocatable_gib: 100.0
  weights_bytes: 1073741824
  kv_bytes_per_token: 131072
  kv_block_tokens: 16
  reserve_gib: 1.0
  max_model_len: 131072
"""

SCENARIO = """hardware: {profile: flat.yaml}
acceptance: {alpha: 0.5}
workload: {trace: trace.csv, mode: closed_loop, concurrency: 4, num_requests: 100}
engine: {max_num_seqs: 1}
policy: {name: no_spec}
"""


@pytest.fixture(scope="module")
def md1_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("md1")
    (d / "costs.csv").write_text(COSTS.format(ms=PASS_S * 1000.0))
    (d / "flat.yaml").write_text(PROFILE)
    (d / "trace.csv").write_text("timestamp,input_length,output_length\n0,16,1\n")
    (d / "md1.yaml").write_text(SCENARIO)
    return d


@pytest.fixture(scope="module")
def md1(md1_dir):
    """The M/D/1 scenario (closed loop in the file: sla_capacity converts it to Poisson)."""
    return load_capacity_scenarios(md1_dir / "md1.yaml")[0]


def pk_capacity(service_s: float, wait_bound_s: float) -> float:
    """Rate (req/s) at which the M/D/1 mean waiting time equals ``wait_bound_s`` (Pollaczek-Khinchine)."""
    rho = 2.0 * wait_bound_s / (service_s + 2.0 * wait_bound_s)
    return rho / service_s


# ------------------------------------------------------------------------------ SLO parsing
@pytest.mark.parametrize("spec, terms", [
    ("ttft_s_p90 <= 2", [("ttft_s_p90", "<=", 2.0)]),
    ("tpot_ms_p90<=50", [("tpot_ms_p90", "<=", 50.0)]),
    ("  throughput_tok_per_s >= 1.5e3 ", [("throughput_tok_per_s", ">=", 1500.0)]),
    ("ttft_s_p90 <= 2 AND tpot_ms_p90 <= 50", [("ttft_s_p90", "<=", 2.0), ("tpot_ms_p90", "<=", 50.0)]),
    ("ttft_s_p90 <= .5 and tok_per_s_user_p10 >= 20 && num_rejected <= 0",
     [("ttft_s_p90", "<=", 0.5), ("tok_per_s_user_p10", ">=", 20.0), ("num_rejected", "<=", 0.0)]),
    (["ttft_s_p90 <= 2", "tpot_ms_p90 <= 50"], [("ttft_s_p90", "<=", 2.0), ("tpot_ms_p90", "<=", 50.0)]),
])
def test_slo_parses(spec, terms):
    slo = SLO.parse(spec)
    assert [(t.metric, t.op, t.bound) for t in slo.terms] == terms
    assert SLO.parse(slo) is slo
    assert SLO.parse(slo.label) == slo  # the label reads back


@pytest.mark.parametrize("spec, says", [
    ("", "empty"),
    ("   ", "empty"),
    ([], "no term"),
    ("ttft_s_p90 < 2", "use <= or >="),
    ("ttft_s_p90 == 2", "use <= or >="),
    ("ttft_s_p90 <= two", "is not 'metric <= number'"),
    ("ttft_s_p90 <= nan", "is not 'metric <= number'"),
    ("ttft_s_p90 <= 2 AND", "is not 'metric <= number'"),
    ("2 >= ttft_s_p90", "is not 'metric <= number'"),
    ("ttft_p90 <= 2", "closest: ttft_s_p90"),
    ("latency <= 2", "unknown metric 'latency'"),
    ([3], "expected text"),
])
def test_slo_refuses_bad_text_in_one_line(spec, says):
    with pytest.raises(InvalidArgumentError) as e:
        SLO.parse(spec)
    assert says in str(e.value)
    assert "\n" not in str(e.value)


def test_slo_terms_are_inclusive_and_nan_fails():
    slo = SLO.parse("ttft_s_p90 <= 2 AND tok_per_s_user_p10 >= 20")
    assert slo.holds({"ttft_s_p90": 2.0, "tok_per_s_user_p10": 20.0})
    assert slo.failures({"ttft_s_p90": 2.5, "tok_per_s_user_p10": 25.0}) == ["ttft_s_p90 = 2.5, not <= 2"]
    assert not slo.holds({"ttft_s_p90": float("nan"), "tok_per_s_user_p10": 25.0})
    assert not slo.holds({"tok_per_s_user_p10": 25.0})  # a missing metric counts as NaN
    assert not SLOTerm("ttft_s_p90", "<=", 2.0).holds(None)
    assert slo.metrics == ("ttft_s_p90", "tok_per_s_user_p10")


# ------------------------------------------------------------------------------ scenarios
def test_poisson_scenario_keeps_the_trace_and_drops_the_closed_loop(md1):
    scen = poisson_scenario(md1, 3.5, 250)
    assert scen.workload.mode == "poisson" and scen.workload.rate_per_s == 3.5
    assert scen.workload.num_requests == 250 and scen.workload.concurrency is None
    assert scen.workload.trace == md1.workload.trace
    assert scen.engine == md1.engine and scen.policy == md1.policy and md1.workload.mode == "closed_loop"
    with pytest.raises(InvalidArgumentError, match="rate_per_s"):
        poisson_scenario(md1, 0.0, 10)


def test_policies_from_the_command_line():
    assert parse_policies(["dspark", "{name: static, k: 3}", '{"name": "goodput"}', "[no_spec, mtp1]"]) == [
        {"name": "dspark"}, {"name": "static", "k": 3}, {"name": "goodput"}, {"name": "no_spec"}, {"name": "mtp1"}]
    for bad in ("{k: 3}", "{name: static", "3", ""):
        with pytest.raises(ConfigError, match="--policies"):
            parse_policies([bad])


def test_one_scenario_per_policy(md1_dir):
    scens = load_capacity_scenarios(md1_dir / "md1.yaml", ["no_spec", "{name: static, k: 2}"])
    assert [s.policy.name for s in scens] == ["no_spec", "static"]
    # a bad --policies item is the flag's fault: the error names the item, not the scenario file
    for item, says in (("{name: static, kk: 2}", "--policies: {name: static, kk: 2}: policy.kk: unknown parameter"),
                       ("nosuch", "--policies: nosuch: unknown policy 'nosuch'"),
                       ("[no_spec, {name: threshold, threshold: 2}]",
                        "--policies: {name: threshold, threshold: 2}: policy.threshold: Input should be less")):
        with pytest.raises(ConfigError) as e:
            load_capacity_scenarios(md1_dir / "md1.yaml", [item])
        assert str(e.value).startswith(says) and "md1.yaml" not in str(e.value), str(e.value)


# ------------------------------------------------------------------------------ the search
def test_md1_capacity_matches_pollaczek_khinchine(md1):
    wait_bound = PASS_S  # SLO: mean waiting time <= S, i.e. mean e2e <= 2 S
    expected = pk_capacity(PASS_S, wait_bound)  # rho* = 2/3: 6.67 req/s
    rel_tol, sampling = 0.05, 0.05
    res = sla_capacity(md1, f"mean_e2e_s <= {PASS_S + wait_bound}", seeds=(0, 1, 2), rel_tol=rel_tol,
                       min_requests=4000)
    lo, hi = res.interval_per_s
    assert res.converged and res.capacity_per_s == lo
    assert hi / lo <= 1 + rel_tol
    # the closed form lies in the bracket, up to the sampling error of a finite run
    assert lo <= expected * (1 + sampling) and hi >= expected * (1 - sampling)
    assert lo >= expected * (1 - sampling) / (1 + rel_tol)
    assert res.unloaded_e2e_s == pytest.approx(PASS_S)
    # every point: the rate, the seed means, a verdict per seed; the runs add up
    assert res.num_runs == 1 + sum(p.num_runs for p in res.points) == 1 + 3 * len(res.points)
    by_rate = {p.rate_per_s: p for p in res.points}
    assert by_rate[lo].passed and not by_rate[hi].passed
    for p in res.points:
        assert len(p.seed_passed) == 3 and len(p.per_seed["mean_e2e_s"]) == 3
        assert p.means["mean_e2e_s"] == pytest.approx(sum(p.per_seed["mean_e2e_s"]) / 3)
        assert p.num_requests >= 4000
    # deterministic service, same seeds at every rate: passing rates all lie below failing ones
    assert max(p.rate_per_s for p in res.points if p.passed) < min(p.rate_per_s for p in res.points if not p.passed)
    assert json.loads(json.dumps(res.to_dict()))["capacity_per_s"] == lo


def test_looser_slo_never_gives_a_lower_capacity(md1):
    caps = [sla_capacity(md1, f"mean_e2e_s <= {PASS_S + w}", seeds=(0, 1), min_requests=1500).capacity_per_s
            for w in (0.3 * PASS_S, PASS_S, 3 * PASS_S)]
    assert caps == sorted(caps) and caps[0] < caps[-1]
    for w, cap in zip((0.3 * PASS_S, PASS_S, 3 * PASS_S), caps, strict=True):  # each near its closed form
        assert cap == pytest.approx(pk_capacity(PASS_S, w), rel=0.12)


def test_the_bracket_contains_the_answer_from_given_rates(md1):
    expected = pk_capacity(PASS_S, PASS_S)
    res = sla_capacity(md1, f"mean_e2e_s <= {2 * PASS_S}", seeds=(0, 1), rate_lo=2.0, rate_hi=9.0,
                       min_requests=1500, rel_tol=0.03)
    assert [p.rate_per_s for p in res.points[:2]] == [2.0, 9.0]
    lo, hi = res.interval_per_s
    assert res.converged and hi / lo <= 1.03
    assert lo * 0.93 <= expected <= hi * 1.07


def test_an_slo_any_backlog_meets_finds_the_service_rate(md1):
    # fault (fresh user): an SLO with no queue-sensitive term passed a rate 18% past what the GPU sustains
    # (offered_load_ratio over the whole arrival window <= 1.2 allowed up to ~1.2 mu; this test allowed 1.32 mu).
    # Oracle: one request at a time, every request one pass of S = PASS_S, so the service rate is mu = 1 / S
    # = 10 req/s and every rate above it is overloaded. Tolerance (module docstring, overload): at 4,000
    # requests a run and three seeds the test flags 95% of draws at 1.02 mu and every one from 1.05 mu, and
    # none at 0.95 mu; so every rate >= 1.05 mu must fail, every rate <= 0.95 mu pass. The grid from these
    # given rates (8, 16, 11.3, 9.51, 10.37, 9.93) has no rate in (mu, 1.03 mu], so the capacity is below mu.
    rel_tol = 0.05
    res = sla_capacity(md1, "mean_e2e_s <= 1e9", seeds=(0, 1, 2), rate_lo=8.0, rate_hi=16.0, rel_tol=rel_tol)
    lo, hi = res.interval_per_s
    assert res.converged and res.capacity_per_s == lo and hi / lo <= 1 + rel_tol
    assert MU * 0.95 / (1 + rel_tol) <= lo < MU, res.summary_line()
    failing = [p for p in res.points if not p.passed]
    assert failing and all(p.overloaded and p.failures[-1].startswith("overloaded: offered_load_ratio_late") for p in failing)
    assert all(p.means["mean_e2e_s"] <= 1e9 for p in failing)  # the percentile term itself held
    assert all(not p.passed for p in res.points if p.rate_per_s >= 1.05 * MU)
    assert all(p.passed for p in res.points if p.rate_per_s <= 0.95 * MU)
    # every rate that passed rests on runs of at least OVERLOAD_MIN_REQUESTS requests (rerun when shorter)
    assert all(p.num_requests >= OVERLOAD_MIN_REQUESTS for p in res.points if p.passed)


@pytest.mark.parametrize("load", [0.9, 0.95])
def test_stable_rates_below_the_service_rate_are_not_overloaded(md1, load):
    # no false overload near capacity: ten seeds at 0.9 and 0.95 of the service rate, each judged alone
    seeds = tuple(range(10))
    res = sla_capacity(md1, "mean_e2e_s <= 1e9", seeds=seeds, rate_lo=load * MU, max_runs=1 + 2 * len(seeds))
    (p,) = res.points
    assert p.rate_per_s == load * MU and p.num_requests == OVERLOAD_MIN_REQUESTS
    assert p.passed and not p.overloaded and all(p.seed_passed), p.per_seed["offered_load_ratio_late"]
    assert max(p.per_seed["offered_load_ratio_late"]) <= overload_limit(OVERLOAD_MIN_REQUESTS, 1)


def test_cli_help_states_the_rerun_length(capsys):
    with pytest.raises(SystemExit):
        main(["capacity", "--help"])
    assert f"at least {OVERLOAD_MIN_REQUESTS}:" in " ".join(capsys.readouterr().out.split())


def test_overload_limit_is_one_poisson_standard_deviation_of_the_late_arrivals():
    # k seeds of n requests: k n / 2 arrivals in the late halves, standard deviation sqrt(k n / 2)
    assert overload_limit(4000) == pytest.approx(1 + 1 / math.sqrt(2000))
    assert overload_limit(4000, 3) == pytest.approx(1 + 1 / math.sqrt(6000))
    assert overload_limit(1000) > overload_limit(4000) > overload_limit(4000, 3) > 1.0


@pytest.mark.parametrize("trace, expected_late, expected_whole", [
    # 2.5x overload: arrivals every 40 ms from 0 to 1.96 s and one at 2.02 s; the server finishes one every
    # 0.1 s from 0.1 s. Late half (1.01, 2.02]: 25 arrivals (1.04 ... 1.96, 2.02), 10 departures (1.1 ... 2.0).
    # Whole window [0, 2.02]: 51 arrivals, 20 completions.
    ([40 * i for i in range(50)] + [2020], 25 / 10, 51 / 20),
    # stable (rho = 0.4): arrivals every 0.25 s from 0 to 2 s, each done 0.1 s later. Late half (1, 2]: 4
    # arrivals (1.25 ... 2.0), 4 departures (1.1 ... 1.85). Whole window: 9 arrivals, 8 completions (the one
    # arriving at 2.0 is still in service: the start-empty bias of the whole-window ratio).
    ([250 * i for i in range(9)], 4 / 4, 9 / 8),
])
def test_late_offered_load_ratio_by_hand(md1, md1_dir, trace, expected_late, expected_whole):
    f = md1_dir / f"replay{len(trace)}.csv"
    f.write_text("timestamp,input_length,output_length\n" + "".join(f"{t},16,1\n" for t in trace))
    wl = md1.workload.model_validate({"trace": str(f), "mode": "trace", "num_requests": len(trace)})
    m = run(md1.model_copy(update={"workload": wl}), seed=0).metrics
    assert m["offered_load_ratio_late"] == pytest.approx(expected_late, rel=1e-12)
    assert m["offered_load_ratio"] == pytest.approx(expected_whole, rel=1e-12)


@pytest.mark.slow
def test_h200_capacity_is_not_an_overloaded_rate(capsys):
    # the fresh user's repro: 19.37 req/s passed (offered_load_ratio 1.197) although the box sustains about
    # 16.4 req/s (completions at 19.37 and at 30 req/s; the queue grew 2.3 -> 17.4 s TTFT over 2,377 requests)
    rc = main(["capacity", str(REPO / "scenarios" / "h200-colocated.yaml"), "--slo", "tok_per_s_user_p50 >= 10",
               "--policies", "no_spec", "--seeds", "0"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    cap = float(re.search(r"capacity ([\d.]+) req/s", out).group(1))
    assert 0.9 * 16.4 <= cap <= 16.5, out
    assert re.search(r"14\.94 req/s  pass", err), err  # 0.91 of the sustainable rate: not a false overload


def test_an_unmeetable_slo_gives_zero(md1):
    # offered_load_ratio is not a load-monotone latency (no unloaded shortcut): the search halves down
    res = sla_capacity(md1, "offered_load_ratio <= 0.5", seeds=(0,), min_requests=200, max_runs=30)
    assert res.status == "no_passing_rate" and res.capacity_per_s == 0.0 and not res.unreachable
    assert res.interval_per_s[0] == 0.0 and res.interval_per_s[1] == min(p.rate_per_s for p in res.points)
    assert "fails at every rate" in res.note


@pytest.mark.parametrize("slo", ["throughput_tok_per_s >= 1e9", "acceptance_rate >= 0.5"])
def test_an_slo_lower_load_does_not_help_stops_halving_early(md1, slo):
    # fault (fresh user): such SLOs halved the rate 21 times (to 3.6e-05 req/s) before "fails at every rate"
    # (throughput falls with the rate; no_spec verifies no draft, so its acceptance rate is never measured)
    res = sla_capacity(md1, slo, seeds=(0,), min_requests=200)
    assert res.status == "no_passing_rate" and res.capacity_per_s == 0.0 and not res.unreachable
    assert len(res.points) == NO_GAIN_HALVINGS + 1, [p.rate_per_s for p in res.points]
    assert res.interval_per_s[1] == min(p.rate_per_s for p in res.points)
    assert "fails at every rate" in res.note and "does not get better at lower load" in res.note
    assert slo.split()[0] in res.note and "\n" not in res.note


@pytest.mark.parametrize("slo", ["mean_e2e_s <= 0.2", "offered_load_ratio <= 1.1"])
def test_an_slo_lower_load_helps_halves_on_to_its_capacity(md1, slo):
    # from 100x overload: a load-monotone latency barely moves while the backlog dominates, and the
    # offered-load ratio falls with each halving; neither may stop the search early
    res = sla_capacity(md1, slo, seeds=(0,), rate_lo=1000.0, min_requests=200, rel_tol=0.2)
    assert res.converged and 0 < res.capacity_per_s <= MU * OVERLOAD_RATIO
    assert sum(1 for p in res.points if p.rate_per_s < 1000.0 and not p.passed) >= NO_GAIN_HALVINGS


def test_the_run_budget_stops_the_search(md1):
    res = sla_capacity(md1, f"mean_e2e_s <= {2 * PASS_S}", seeds=(0,), min_requests=500, max_runs=4)
    assert res.status == "max_runs" and not res.converged and res.num_runs <= 4
    lo, hi = res.interval_per_s
    assert lo < hi and "max_runs" in res.note


@pytest.mark.parametrize("kw, says", [
    ({"seeds": ()}, "seeds"),
    ({"seeds": (0, 0)}, "at most once"),
    ({"seeds": (-1,)}, "seeds"),
    ({"rate_lo": 5.0, "rate_hi": 5.0}, "below rate_hi"),
    ({"rate_lo": -1.0}, "rate_lo"),
    ({"rel_tol": 0.0}, "rel_tol"),
    ({"max_runs": 2}, "max_runs"),
    ({"min_requests": 0}, "min_requests"),
])
def test_bad_arguments_are_refused(md1, kw, says):
    with pytest.raises(InvalidArgumentError, match=says):
        sla_capacity(md1, "mean_e2e_s <= 1", **kw)


def test_capacity_objective_is_the_capacity(md1):
    kw = {"rate_lo": 4.0, "rate_hi": 8.0, "min_requests": 500, "rel_tol": 0.1}
    value = capacity_objective(md1, "mean_e2e_s <= 0.2", seeds=(0,), **kw)
    assert value == sla_capacity(md1, "mean_e2e_s <= 0.2", seeds=(0,), **kw).capacity_per_s
    assert math.isfinite(value) and value > 0


# ------------------------------------------------------------------------------ CLI
def test_cli_prints_capacity_per_policy(md1_dir, capsys, tmp_path):
    out_json = tmp_path / "cap.json"
    code = main(["capacity", str(md1_dir / "md1.yaml"), "--slo", "mean_e2e_s <= 0.2", "--slo", "num_rejected <= 0",
                 "--policies", "no_spec", "{name: static, k: 1}", "--seeds", "0", "--min-requests", "500",
                 "--rel-tol", "0.1", "--json", str(out_json)])
    out = capsys.readouterr()
    assert code == 0
    lines = [ln for ln in out.out.splitlines() if ": capacity " in ln]
    assert len(lines) == 2 and lines[0].startswith("no_spec: capacity") and lines[1].startswith("static(")
    assert "interval [" in lines[0] and "req/s" in out.err and f"results: {out_json}" in out.out
    data = json.loads(out_json.read_text())
    assert [d["slo"] for d in data] == ["mean_e2e_s <= 0.2 AND num_rejected <= 0"] * 2


def test_cli_bad_slo_is_one_line_and_exit_2(md1_dir, capsys):
    assert main(["capacity", str(md1_dir / "md1.yaml"), "--slo", "ttft_s_p90 < 2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: SLO") and err.count("\n") == 1


def test_scenario_files_resolve_relative_paths(md1_dir):
    scen = load_capacity_scenarios(md1_dir / "md1.yaml")[0]
    assert isinstance(scen, Scenario) and scen.hardware.profile == str((md1_dir / "flat.yaml").resolve())


# ------------------------------------------------------------------------------ as a tune objective
def _tune_doc(**over) -> dict:
    doc = {
        "name": "cap",
        "base": yaml.safe_load(SCENARIO),
        "search_space": {"engine.max_num_seqs": {"type": "int", "low": 1, "high": 2}},
        "objectives": [{"metric": "sla_capacity_per_s", "direction": "maximize"}],
        "constraints": [],
        "seeds": [0],
        "n_trials": 2,
        "sampler": {"name": "random", "seed": 0},
        "capacity": {"slo": "mean_e2e_s <= 0.2", "min_requests": 1500, "rel_tol": 0.05},
    }
    doc.update(over)
    return doc


def test_tune_objective_sla_capacity_needs_its_slo(md1_dir):
    doc = _tune_doc()
    del doc["capacity"]
    with pytest.raises(ConfigError, match=r"capacity.*sla_capacity_per_s needs a `capacity:` section"):
        parse_tune_spec(doc, source="cap.yaml", base_dir=md1_dir)
    with pytest.raises(ConfigError, match=r"cap.yaml.*capacity.slo.*unknown metric 'mean_e2e'"):
        parse_tune_spec(_tune_doc(capacity={"slo": "mean_e2e <= 1"}), source="cap.yaml", base_dir=md1_dir)


def test_tune_maximises_sla_capacity_against_pollaczek_khinchine(md1_dir, tmp_path):
    """At one request a pass the objective is the M/D/1 closed form (the oracle above, one seed,
    1,500 requests: sampling error about 3%; allowed 8% with the 5% search tolerance); batching two
    requests into one flat-cost pass must raise it; and ``tune`` records the same numbers."""
    spec = parse_tune_spec(_tune_doc(), source="cap.yaml", base_dir=md1_dir)
    value = {}
    for k in (1, 2):
        ev = evaluate(scenario_for(spec, {"engine.max_num_seqs": k}), spec.seeds, spec.tracked_metrics,
                      capacity=spec.capacity)
        assert ev["replicates"]["sla_capacity_per_s"] == [ev["means"]["sla_capacity_per_s"]]
        value[k] = ev["means"]["sla_capacity_per_s"]
    assert value[1] == pytest.approx(pk_capacity(PASS_S, 0.2 - PASS_S), rel=0.08)
    assert value[2] > 1.3 * value[1]
    url = f"sqlite:///{tmp_path / 'cap.db'}"
    out = run_tune(spec, storage_url=url, n_trials=2, out_dir=tmp_path, validate=False, report=False)
    assert out.complete == 2
    trials = optuna.load_study(study_name="cap", storage=url).get_trials(deepcopy=False)
    for t in trials:
        assert t.value == value[t.params["engine.max_num_seqs"]]  # same seed, same search
    assert out.warnings == []  # some trial found a passing rate


# ------------------------------------------------------------------------------ unmeetable even unloaded
def test_a_latency_bound_missed_unloaded_stops_after_the_unloaded_run(md1, md1_dir, capsys):
    # unloaded, each request takes exactly PASS_S: a bound below it fails at every rate, so no rate
    # is tried (before: 21 halvings down to a millionth of the start rate)
    res = sla_capacity(md1, f"mean_e2e_s <= {0.5 * PASS_S}", seeds=(0, 1), min_requests=200)
    assert res.status == "no_passing_rate" and res.unreachable and res.capacity_per_s == 0.0
    assert res.num_runs == 1 and res.points == () and res.interval_per_s == (0.0, 0.0)
    assert f"mean_e2e_s = {PASS_S:g} > {0.5 * PASS_S:g} even unloaded (one request at a time" in res.note
    assert res.to_dict()["unloaded"] == {"mean_e2e_s": pytest.approx(PASS_S)}
    rc = main(["capacity", str(md1_dir / "md1.yaml"), "--slo", f"mean_e2e_s <= {0.5 * PASS_S}", "--seeds", "0"])
    out, err = capsys.readouterr()
    assert rc == 0 and "no_passing_rate: mean_e2e_s = 0.1 > 0.05 even unloaded" in out and "req/s  FAIL" not in err


@pytest.fixture(scope="module")
def flat_batch(md1_dir):
    """The flat profile with 8-token outputs and up to 4 requests a pass (every load-monotone metric defined)."""
    (md1_dir / "trace8.csv").write_text("timestamp,input_length,output_length\n0,16,8\n0,48,8\n")
    doc = yaml.safe_load(SCENARIO) | {"engine": {"max_num_seqs": 4}}
    doc["workload"]["trace"] = "trace8.csv"
    (md1_dir / "flat8.yaml").write_text(yaml.safe_dump(doc))
    return load_capacity_scenarios(md1_dir / "flat8.yaml")[0]


def test_load_monotone_metrics_only_get_worse_with_load(flat_batch):
    # the premise of the shortcut: every metric of LOAD_MONOTONE is no better under load than with
    # one request at a time (a throughput-like metric put in the list would fail here)
    assert set(LOAD_MONOTONE) <= set(METRIC_NAMES) and set(LOAD_MONOTONE.values()) <= {"<=", ">="}
    closed1 = flat_batch.workload.model_copy(update={"concurrency": 1, "num_requests": 32})
    alone = run(flat_batch.model_copy(update={"workload": closed1}), seed=0).metrics
    loaded = run(poisson_scenario(flat_batch, 3.0, 300), seed=0).metrics
    assert loaded["mean_in_system"] > 1.5  # really loaded
    for m, op in LOAD_MONOTONE.items():
        a, b = float(alone[m]), float(loaded[m])
        assert math.isfinite(a) and math.isfinite(b), m
        assert (b >= a * 0.999) if op == "<=" else (b <= a * 1.001), (m, a, b)


@pytest.mark.parametrize("metric", sorted(LOAD_MONOTONE))
def test_every_load_monotone_term_is_judged_on_the_unloaded_run(flat_batch, metric):
    # each metric, each side of its unloaded value: just past it in the failing direction stops after
    # the unloaded run; just inside it does not (the search goes on to try rates)
    closed1 = flat_batch.workload.model_copy(update={"concurrency": 1, "num_requests": 32})
    v = float(run(flat_batch.model_copy(update={"workload": closed1}), seed=0).metrics[metric])
    op = LOAD_MONOTONE[metric]
    failing, passing = (v * 0.9, v * 1.1) if op == "<=" else (v * 1.1, v * 0.9)
    if v == 0.0:  # no queueing with one request at a time: only a negative bound fails, refused at parse
        with pytest.raises(InvalidArgumentError, match="can never hold"):
            SLO.parse(f"{metric} <= -0.001")
        failing, passing = None, 0.001
    if failing is not None:
        stop = sla_capacity(flat_batch, f"{metric} {op} {failing!r}", seeds=(0,), min_requests=50, max_runs=3)
        assert stop.unreachable and stop.num_runs == 1 and f"{metric} = " in stop.note and "even unloaded" in stop.note
    go = sla_capacity(flat_batch, f"{metric} {op} {passing!r}", seeds=(0,), min_requests=50, max_runs=3)
    assert not go.unreachable and go.num_runs > 1 and go.points


@pytest.mark.parametrize("metric", METRIC_NAMES)
def test_a_bound_no_value_can_meet_is_refused_at_parse_time(metric):
    # every metric is a count, a time, a rate, a size or a fraction: never negative
    with pytest.raises(InvalidArgumentError, match=rf"{metric} <= -1 can never hold \({metric} is never negative\)"):
        SLO.parse(f"{metric} <= -1")
    assert SLO.parse(f"{metric} <= 0").terms[0].bound == 0.0
    if metric.endswith("_frac") or metric in ("acceptance_rate", "auc_mean"):
        with pytest.raises(InvalidArgumentError, match="can never hold.*fraction in \\[0, 1\\]"):
            SLO.parse(f"{metric} >= 1.5")


def test_cli_refuses_a_never_holding_bound_in_one_line(md1_dir, capsys):
    rc = main(["capacity", str(md1_dir / "md1.yaml"), "--slo", "ttft_s_p90 <= -1"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "ttft_s_p90 <= -1 can never hold" in err


def test_tune_warns_when_every_trial_scores_zero_because_the_slo_fails_unloaded(md1_dir, tmp_path, capsys):
    doc = _tune_doc(capacity={"slo": f"mean_e2e_s <= {0.5 * PASS_S}", "min_requests": 200})
    doc["base"]["hardware"]["profile"] = str(md1_dir / "flat.yaml")
    doc["base"]["workload"]["trace"] = str(md1_dir / "trace.csv")
    spec = parse_tune_spec(doc, source="cap.yaml")
    out = run_tune(spec, storage_url=f"sqlite:///{tmp_path / 'z.db'}", n_trials=2, out_dir=tmp_path,
                   validate=False, report=False)
    assert out.complete == 2 and len(out.warnings) == 1
    assert "every trial scored sla_capacity_per_s 0" in out.warnings[0]
    assert "cannot be met with no load at all: mean_e2e_s = 0.1 > 0.05 even unloaded" in out.warnings[0]
    for t in optuna.load_study(study_name="cap", storage=f"sqlite:///{tmp_path / 'z.db'}").trials:
        assert t.value == 0.0 and "even unloaded" in t.user_attrs["capacity_unreachable"][0]
    # the command says it too, on stderr, after the trial lines
    (tmp_path / "cap.yaml").write_text(yaml.safe_dump(doc | {"name": "cap2"}))
    rc = main(["tune", str(tmp_path / "cap.yaml"), "--out", str(tmp_path), "--no-validate", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 0 and "warning: every trial scored sla_capacity_per_s 0: the SLO" in err

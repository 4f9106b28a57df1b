"""Optuna tuning (memtp_sim.tune): a known-answer calibration oracle, the search space and its pair
rules, noise handling (common random numbers, fresh-seed confidence intervals), bad tune YAML, and
the storage contract (two worker processes; resume after SIGKILL) over SQLite, journal and
PostgreSQL.

PostgreSQL tests read ``PG_URL`` (e.g. postgresql+psycopg2://memtp:memtp@127.0.0.1:5432/memtp_optuna)
and skip without it; with ``MEMTP_REQUIRE_POSTGRES=1`` (set by .ci/run) they fail instead, so CI
cannot skip them silently.
"""

from __future__ import annotations

import copy
import datetime
import math
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import optuna
import pytest
import yaml
from optuna.trial import TrialState

from memtp_sim.cli import main
from memtp_sim.errors import ConfigError
from memtp_sim.tune import (
    open_storage,
    open_study,
    parse_tune_spec,
    run_tune,
    sample_params,
    scenario_for,
    static_ranges,
    t_confidence_interval,
    validate_trials,
)

REPO = Path(__file__).resolve().parents[1]
TRACE = REPO / "data" / "traces" / "azure2023_conv.csv"

optuna.logging.set_verbosity(optuna.logging.WARNING)


def tiny_doc(name: str = "t", **over) -> dict:
    """A fast tune spec: 24 requests, 4 users, no STS fit (~0.05 s per run)."""
    doc = {
        "name": name,
        "base": {
            "workload": {"trace": str(TRACE), "mode": "closed_loop", "concurrency": 4, "num_requests": 24},
            "engine": {"prefill": "disaggregated", "prefill_gpus": 4},
            "confidence": {"sts": "none"},
            "policy": {"name": "dspark", "gamma": 4},
        },
        "search_space": {
            "confidence.temperature": {"type": "float", "low": 0.5, "high": 3.0, "log": True},
            "policy.gamma": {"type": "int", "low": 1, "high": 6},
        },
        "seeds": [0, 1],
        "n_trials": 6,
        "sampler": {"name": "tpe", "seed": 0, "n_startup_trials": 4},
        "validation": {"top_k": 2, "num_seeds": 3},
    }
    doc.update(copy.deepcopy(over))
    return doc


def _write(tmp_path: Path, doc: dict, name: str = "tune.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    return p


def _assert_one_line_error(rc: int, err: str, *must_contain: str) -> None:
    assert rc == 2, err
    assert "Traceback" not in err
    lines = err.strip("\n").split("\n")
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    for s in must_contain:
        assert s in lines[0], (s, lines[0])


# ----------------------------------------------------------------------------- known answer
@pytest.mark.slow
def test_temperature_recovers_known_overconfidence(tmp_path):
    """Oracle: with a noise-free head whose logits are scaled by 2 (c_raw = sigmoid(2 logit p)), the
    global temperature that makes the confidences calibrated is exactly 2 (c = sigmoid(logit(c_raw)
    / T) = p at T = 2). Minimising the mean ECE of what the policy saw must land there.

    Throughput is nearly flat in the temperature (a few percent over 0.5..5), so it is no sharp oracle;
    the calibration error is. Tolerance +-15%: with ~3,000 request-rounds per run the ECE near the
    optimum is flat within its sampling noise over about +-5%, and 35 TPE trials on a log scale
    resolve a few percent; at 1.7 and 2.3 (+-15%) the ECE is already about twice its minimum, so the
    band still rejects a badly tuned head while leaving room for the noise.
    """
    doc = tiny_doc(
        "calib",
        objectives=[{"metric": "ece_mean", "direction": "minimize"}],
        constraints=[],
        seeds=[0],
        sampler={"name": "tpe", "seed": 0, "n_startup_trials": 10},
    )
    doc["base"]["workload"].update(num_requests=40, concurrency=4)
    doc["base"]["confidence"] = {"head": "model", "noise_sd": 0.0, "overconfidence": 2.0, "sts": "none"}
    doc["base"]["policy"] = {"name": "dspark", "gamma": 7}
    doc["search_space"] = {"confidence.temperature": {"type": "float", "low": 0.5, "high": 5.0, "log": True}}
    spec = parse_tune_spec(doc)
    url = f"sqlite:///{tmp_path / 'calib.db'}"
    out = run_tune(spec, storage_url=url, n_trials=35, out_dir=tmp_path, validate=False, report=False)
    assert out.complete == 35
    study = optuna.load_study(study_name="calib", storage=url)
    best_t = study.best_trial.params["confidence.temperature"]
    assert abs(best_t / 2.0 - 1.0) <= 0.15, best_t
    # and the uncorrected head (T = 1) is clearly worse than the best trial
    raw = [t for t in study.trials if abs(t.params["confidence.temperature"] - 1.0) < 0.1]
    assert all(t.value > 1.5 * study.best_value for t in raw)


# ----------------------------------------------------------------------------- search space
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


# ----------------------------------------------------------------------------- bad tune YAML
@pytest.mark.parametrize(
    "mutate, expect",
    [
        (lambda d: d.update(searchspace={}), ["searchspace", "unknown key"]),
        (lambda d: d["search_space"]["confidence.temperature"].update(lo=1), ["search_space.confidence.temperature.lo",
                                                                            "unknown key"]),
        (lambda d: d["search_space"]["confidence.temperature"].update(low=4.0, high=1.0),
         ["search_space.confidence.temperature", "low must be < high"]),
        (lambda d: d["search_space"]["confidence.temperature"].update(low=0.0),
         ["search_space.confidence.temperature", "log: true needs low > 0"]),
        (lambda d: d["search_space"]["policy.gamma"].update(step=4), ["search_space.policy.gamma", "multiple of step"]),
        (lambda d: d["search_space"].update({"confidence.temprature": {"type": "float", "low": 1, "high": 2}}),
         ["search_space.confidence.temprature", "unknown field", "temperature"]),
        (lambda d: d["search_space"].update({"policy.gama": {"type": "int", "low": 1, "high": 2}}),
         ["search_space.policy.gama", "unknown policy parameter"]),
        (lambda d: d["search_space"].update({"confidence.temperature": {"type": "uniform", "low": 1, "high": 2}}),
         ["search_space.confidence.temperature.type", "float, int or categorical"]),
        (lambda d: d.update(constraints=["tok_per_s_user_p10 > 5"]), ["constraints.0", "metric >= number"]),
        (lambda d: d["search_space"]["policy.gamma"].update(high=99), ["search_space", "policy.gamma=99"]),
    ],
)
def test_bad_tune_yaml_one_line_exit_2(tmp_path, capsys, mutate, expect):
    doc = tiny_doc()
    mutate(doc)
    path = _write(tmp_path, doc)
    rc = main(["tune", str(path), "--out", str(tmp_path / "results"), "--quiet"])
    _assert_one_line_error(rc, capsys.readouterr().err, str(path), *expect)
    assert not (tmp_path / "results").exists()  # nothing ran


def test_impossible_pair_rule_is_refused(tmp_path, capsys):
    """r_low's whole range at or above r_high's: no sample can satisfy r_low < r_high."""
    doc = tiny_doc()
    doc["search_space"] = {
        "memtp.r_low": {"type": "float", "low": 0.6, "high": 0.9},
        "memtp.r_high": {"type": "float", "low": 0.2, "high": 0.5},
    }
    doc["pair_constraints"] = ["memtp.r_low < memtp.r_high"]
    path = _write(tmp_path, doc)
    rc = main(["tune", str(path), "--out", str(tmp_path / "results"), "--quiet"])
    _assert_one_line_error(rc, capsys.readouterr().err, str(path), "memtp.r_low", "impossible")


def test_unknown_objective_metric_is_refused(tmp_path, capsys):
    doc = tiny_doc(objectives=[{"metric": "througput", "direction": "maximize"}])
    path = _write(tmp_path, doc)
    rc = main(["tune", str(path), "--out", str(tmp_path / "results"), "--quiet"])
    _assert_one_line_error(rc, capsys.readouterr().err, "unknown metric 'througput'", "throughput_tok_per_s")


# ----------------------------------------------------------------------------- noise
def test_t_interval_matches_table_value():
    """[1, 2, 3]: mean 2, s = 1, t_{0.975, 2} = 4.303 (printed t tables) -> half-width 4.303 / sqrt(3)."""
    ci = t_confidence_interval([1.0, 2.0, 3.0])
    assert ci["mean"] == 2.0 and ci["sd"] == pytest.approx(1.0) and ci["n"] == 3
    assert ci["half_width"] == pytest.approx(4.302653 / math.sqrt(3), rel=1e-6)
    assert (ci["low"], ci["high"]) == pytest.approx((2 - 2.484138, 2 + 2.484138), abs=1e-5)
    assert math.isnan(t_confidence_interval([5.0])["half_width"])


def test_crn_replicates_and_fresh_seed_validation(tmp_path):
    spec = parse_tune_spec(tiny_doc("noise"))
    out = run_tune(spec, storage_url=f"sqlite:///{tmp_path / 'n.db'}", n_trials=5, out_dir=tmp_path, report=False)
    assert out.complete == 5 and not out.short
    study = optuna.load_study(study_name="noise", storage=f"sqlite:///{tmp_path / 'n.db'}")
    for t in study.trials:
        assert t.user_attrs["seeds"] == [0, 1]  # common random numbers: same seeds for every trial
        reps = t.user_attrs["replicates"]
        for i, name in enumerate(spec.objective_names):
            assert len(reps[name]) == 2
            assert t.values[i] == pytest.approx(np.mean(reps[name]))  # the value is the replicate mean
    assert out.validation, "top trials were re-run"
    assert set(spec.fresh_seeds).isdisjoint(spec.seeds)
    for num, rec in out.validation.items():
        assert rec["seeds"] == spec.fresh_seeds
        for m, ci in rec["metrics"].items():
            again = t_confidence_interval(ci["values"])
            assert ci["n"] == 3 and ci["half_width"] == pytest.approx(again["half_width"], nan_ok=True)
    stored = study.user_attrs["validation"]
    assert set(stored) == {str(k) for k in out.validation}
    import json

    on_disk = json.loads((tmp_path / "noise" / "validation.json").read_text())
    assert on_disk["fresh_seeds"] == spec.fresh_seeds and set(on_disk["trials"]) == set(stored)
    # re-validating gives the same numbers (fresh seeds are fixed, runs are deterministic)
    again = validate_trials(study, spec, [next(iter(out.validation))], out_dir=None)
    k = next(iter(again))
    assert again[k]["metrics"]["throughput_tok_per_s"]["mean"] == out.validation[k]["metrics"][
        "throughput_tok_per_s"]["mean"]
    html = (tmp_path / "noise" / "report.html").read_text() if (tmp_path / "noise" / "report.html").exists() else ""
    assert html == ""  # report=False wrote nothing


def test_infeasible_trials_kept_but_not_on_front(tmp_path):
    spec = parse_tune_spec(tiny_doc("infeas", constraints=["num_rejected <= -1"]))
    url = f"sqlite:///{tmp_path / 'i.db'}"
    out = run_tune(spec, storage_url=url, n_trials=3, out_dir=tmp_path, report=True)
    assert out.complete == 3 and out.validation == {}
    study = optuna.load_study(study_name="infeas", storage=url)
    assert all(t.user_attrs["feasible"] is False for t in study.trials)
    assert study.best_trials == []  # Optuna's own Pareto front also excludes them
    assert "0 of 0 feasible" in out.report.read_text()


def test_resume_refuses_a_changed_spec(tmp_path):
    url = f"sqlite:///{tmp_path / 'c.db'}"
    spec = parse_tune_spec(tiny_doc("changed"))
    open_study(spec, open_storage(url))
    doc = tiny_doc("changed")
    doc["search_space"]["policy.gamma"]["high"] = 5
    with pytest.raises(ConfigError, match="different search_space"):
        open_study(parse_tune_spec(doc), open_storage(url))


# ----------------------------------------------------------------------------- storage contract
def _pg_url() -> str:
    url = os.environ.get("PG_URL")
    if not url:
        if os.environ.get("MEMTP_REQUIRE_POSTGRES") == "1":
            pytest.fail("MEMTP_REQUIRE_POSTGRES=1 but PG_URL is not set: .ci/run must start PostgreSQL and "
                        "export PG_URL=postgresql+psycopg2://...")
        pytest.skip("PG_URL is not set: start PostgreSQL and export PG_URL=postgresql+psycopg2://user:pass@host/db "
                    "to run the PostgreSQL tests (CI does)")
    return url


BACKENDS = ["sqlite", "journal", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture
def storage_url(request, tmp_path):
    """A storage URL per backend, and a study name unique to this test (PostgreSQL is shared)."""
    kind = request.param
    name = f"w_{uuid.uuid4().hex[:10]}"
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path / 'optuna.db'}"
    elif kind == "journal":
        url = f"journal://{tmp_path / 'optuna.log'}"
    else:
        url = _pg_url()
    yield url, name
    if kind == "postgres":
        try:
            optuna.delete_study(study_name=name, storage=url)
        except KeyError:
            pass


def _trials(url: str, name: str) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=name, storage=open_storage(url)).get_trials(deepcopy=False)


@pytest.mark.slow
@pytest.mark.parametrize("storage_url", BACKENDS, indirect=True)
def test_two_worker_processes_share_one_study(storage_url, tmp_path):
    url, name = storage_url
    spec = parse_tune_spec(tiny_doc(name))
    out = run_tune(spec, storage_url=url, n_trials=8, workers=2, out_dir=tmp_path, validate=False, report=False)
    assert out.worker_exit_codes == [0, 0] and out.complete == 8 and not out.short
    trials = _trials(url, name)
    assert sorted(t.number for t in trials) == list(range(8))  # none lost, none duplicated
    assert all(t.state == TrialState.COMPLETE for t in trials)
    pids = {t.user_attrs["worker"]["pid"] for t in trials}
    assert len(pids) == 2 and os.getpid() not in pids  # two separate processes did the work
    # a rerun with the same total does nothing more
    again = run_tune(spec, storage_url=url, n_trials=8, workers=2, out_dir=tmp_path, validate=False, report=False)
    assert again.ran == 0 and len(_trials(url, name)) == 8


def _cli(args: list[str]) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, "-m", "memtp_sim", *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
@pytest.mark.parametrize("storage_url", BACKENDS, indirect=True)
def test_resume_after_a_worker_is_killed_mid_trial(storage_url, tmp_path):
    url, name = storage_url
    doc = tiny_doc(name)
    doc["base"]["workload"].update(num_requests=80, concurrency=8)  # ~1 s per trial: room to kill one mid-trial
    path = _write(tmp_path, doc)
    args = ["tune", str(path), "--storage", url, "--n-trials", "4", "--workers", "2", "--no-validate", "--quiet",
            "--out", str(tmp_path / "results")]
    proc = _cli(args)
    victim = None
    deadline = time.monotonic() + 120
    storage = None
    while victim is None and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
        try:
            storage = storage or open_storage(url)
            study = optuna.load_study(study_name=name, storage=storage)
        except (KeyError, ConfigError):
            continue
        now = datetime.datetime.now()
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            # a trial that started < 0.3 s ago has most of its ~1 s still to run: the kill lands mid-trial
            if "worker" in t.user_attrs and (now - t.datetime_start).total_seconds() < 0.3:
                victim = t
                os.kill(t.user_attrs["worker"]["pid"], signal.SIGKILL)
                break
    assert victim is not None, "never saw a RUNNING trial to kill"
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 1, err  # the study is short; the command says so and how to resume
    assert "run the same command again to resume" in err
    state = {t.number: t.state for t in _trials(url, name)}
    assert state[victim.number] == TrialState.RUNNING  # the killed worker's trial is stuck until resumed
    assert sum(s == TrialState.COMPLETE for s in state.values()) < 4

    proc = _cli(args)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    trials = _trials(url, name)
    assert sum(t.state == TrialState.COMPLETE for t in trials) == 4
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    assert sorted(t.number for t in trials) == list(range(len(trials)))  # contiguous, unique
    dead = [t for t in trials if t.number == victim.number][0]
    assert dead.state == TrialState.FAIL and "died" in dead.user_attrs["failed_reason"]


def test_postgres_url_without_driver_is_a_clear_error(capsys, tmp_path):
    doc = tiny_doc()
    path = _write(tmp_path, doc)
    try:
        import psycopg  # noqa: F401

        pytest.skip("psycopg 3 is installed: plain postgresql:// is valid here")
    except ImportError:
        pass
    rc = main(["tune", str(path), "--storage", "postgresql://u:secret@127.0.0.1:1/db", "--quiet"])
    err = capsys.readouterr().err
    _assert_one_line_error(rc, err, "postgresql+psycopg2://")
    assert "secret" not in err

"""Optuna tuning (memtp_sim.tune): a known-answer calibration oracle, the search space and its pair
rules, noise handling (common random numbers, fresh-seed confidence intervals), parameter
importances for the objective's good direction, bad tune YAML (one line naming the file and the
field), the export hint, Ctrl-C, and the storage contract (two worker processes; resume after
SIGKILL) over SQLite, journal and PostgreSQL.

PostgreSQL tests read ``PG_URL`` (e.g. postgresql+psycopg2://memtp:memtp@127.0.0.1:5432/memtp_optuna)
and skip without it; with ``MEMTP_REQUIRE_POSTGRES=1`` (set by .ci/run) they fail instead, so CI
cannot skip them silently.
"""

from __future__ import annotations

import datetime
import math
import os
import shlex
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

from _sim_helpers import tiny_tune_doc

from memtp_sim.cli import main
from memtp_sim.errors import ConfigError
from memtp_sim.tune import (
    constraint_failures,
    importance_figure,
    param_importances,
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
    """A fast tune spec (see ``_sim_helpers.tiny_tune_doc``)."""
    return tiny_tune_doc(name, **over)


def _write(tmp_path: Path, doc: dict, name: str = "tune.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    return p


def _assert_one_line_error(rc: int, err: str, *must_contain: str, starts: str = "error: ") -> None:
    assert rc == 2, err
    assert "Traceback" not in err
    lines = err.strip("\n").split("\n")
    assert len(lines) == 1, err
    assert lines[0].startswith(starts), (starts, lines[0])
    assert "np." not in lines[0] and "numpy.float" not in lines[0], lines[0]  # numbers are written plainly
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
        # run seeds: >= 0 (numpy refuses negative seeds, in a worker, with a traceback) and unique
        (lambda d: d.update(seeds=[-1]), ["seeds.0: must be >= 0 (got -1)"]),
        (lambda d: d.update(seeds=[3, 1, 3]), ["seeds: each seed at most once", "3 is listed 2 times"]),
        (lambda d: d.update(validation={"top_k": 1, "seeds": [7, -2]}), ["validation.seeds.1: must be >= 0"]),
        (lambda d: d.update(validation={"top_k": 1, "seeds": [7, 7]}), ["validation.seeds:", "7 is listed 2 times"]),
        # metrics are checked against memtp_sim.metrics.METRIC_NAMES before anything else
        (lambda d: d.update(constraints=["ttft_p90 <= 3"]),
         ["constraints.0.metric: unknown metric 'ttft_p90'", "ttft_s_p90"]),
        (lambda d: d.update(objectives=[{"metric": "throughput", "direction": "maximize"}],
                            export={"best_by": "throughput_tok_per_s"}),
         ["objectives.0.metric: unknown metric 'throughput'", "closest allowed: throughput_tok_per_s"]),
    ],
)
def test_bad_tune_yaml_one_line_exit_2(tmp_path, capsys, mutate, expect):
    doc = tiny_doc()
    mutate(doc)
    path = _write(tmp_path, doc)
    rc = main(["tune", str(path), "--out", str(tmp_path / "results"), "--quiet"])
    # every tune YAML error starts with the file, then the field
    _assert_one_line_error(rc, capsys.readouterr().err, *expect, starts=f"error: {path}: ")
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
    """The shipped spec's shape (export.best_by set): the objective is the error, not best_by; a few
    close names are offered, not all 57."""
    doc = tiny_doc(objectives=[{"metric": "througput", "direction": "maximize"},
                               {"metric": "tok_per_s_user_p50", "direction": "maximize"}],
                   export={"best_by": "throughput_tok_per_s"})
    path = _write(tmp_path, doc)
    rc = main(["tune", str(path), "--out", str(tmp_path / "results"), "--quiet"])
    err = capsys.readouterr().err
    _assert_one_line_error(rc, err, "unknown metric 'througput'", "throughput_tok_per_s",
                           starts=f"error: {path}: objectives.0.metric: ")
    assert "best_by" not in err and "ece_raw_mean" not in err


def test_errors_after_loading_name_the_file(tmp_path, capsys):
    """A spec that no longer matches the study in storage, and an invalid scenario point: the file first."""
    url = f"sqlite:///{tmp_path / 'c.db'}"
    open_study(parse_tune_spec(tiny_doc("moved")), open_storage(url))
    doc = tiny_doc("moved")
    doc["search_space"]["policy.gamma"]["high"] = 5
    path = _write(tmp_path, doc)
    rc = main(["tune", str(path), "--storage", url, "--quiet"])
    _assert_one_line_error(rc, capsys.readouterr().err, "different search_space", "new name",
                           starts=f"error: {path}: search_space: ")
    spec = parse_tune_spec(tiny_doc(), source="my.yaml")
    with pytest.raises(ConfigError) as e:  # numpy scalars (what a sampler might hand over) are written plainly
        scenario_for(spec, {"confidence.temperature": np.float64(-1.5), "policy.gamma": np.int64(2)})
    assert str(e.value).startswith("my.yaml: search_space: invalid scenario at "
                                   "(confidence.temperature=-1.5, policy.gamma=2): "), str(e.value)


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


def test_constraint_failures_say_which_and_by_how_much():
    spec = parse_tune_spec(tiny_doc(constraints=["tok_per_s_user_p10 >= 16", "num_rejected <= 0", "tau >= 1"]))
    means = {"tok_per_s_user_p10": np.float64(12.25), "num_rejected": np.int64(2), "tau": np.float64("nan")}
    got = constraint_failures(spec, [np.float64(3.75), np.float64(2.0), 1e18], means)
    assert got == ["tok_per_s_user_p10 >= 16: tok_per_s_user_p10 = 12.25, short by 3.75",
                   "num_rejected <= 0: num_rejected = 2, over by 2", "tau >= 1: tau is NaN"]
    assert constraint_failures(spec, [-1.0, 0.0, -0.5], means) == []


# ----------------------------------------------------------------------------- importances
def _step(x: float) -> float:
    """About 10 for x > 0.8, about 0 below: x alone decides whether a value is good."""
    return 10.0 / (1.0 + math.exp(-(x - 0.8) * 60.0))


@pytest.mark.parametrize("direction", ["maximize", "minimize"])
def test_importances_rank_what_makes_a_good_value(direction):
    """Objective 1 is good (high when maximised, low when minimised) exactly when x > 0.8; y only
    adds a ripple of 0.1, so the *bad* values are sorted by y. x must rank first either way. Before
    the fix the maximised case ranked y first: Optuna 5's default evaluator (PED-ANOVA) explains
    low target values, i.e. the worst throughputs. Objective 0 depends on y only."""
    sign = 1.0 if direction == "maximize" else -1.0
    study = optuna.create_study(directions=["minimize", direction], sampler=optuna.samplers.RandomSampler(seed=0))

    def f(trial: optuna.trial.Trial) -> tuple[float, float]:
        x, y = trial.suggest_float("x", 0.0, 1.0), trial.suggest_float("y", 0.0, 1.0)
        return y, sign * (_step(x) + 0.1 * y)

    study.optimize(f, n_trials=60)
    imp = param_importances(study, 1)
    assert list(imp) == ["x", "y"] and imp["x"] > 0.8, imp
    assert list(param_importances(study, 0))[0] == "y"
    fig, notes = importance_figure(study, 1, "obj", direction)  # what the report draws
    assert fig.data[0].y[-1] == "x"  # plotly bars run from least to most important
    good = "high" if direction == "maximize" else "low"
    assert f"importance for {good} obj" in fig.layout.title.text
    assert notes == []  # the expected PED-ANOVA "low target" warning is filtered; nothing else came up
    one = optuna.create_study(directions=["minimize", direction])
    one.optimize(f, n_trials=1)
    _, notes = importance_figure(one, 1, "obj")  # other warnings are not silenced: the report shows them
    assert any("too small" in n for n in notes), notes


def test_resume_refuses_a_changed_spec(tmp_path):
    url = f"sqlite:///{tmp_path / 'c.db'}"
    spec = parse_tune_spec(tiny_doc("changed"))
    open_study(spec, open_storage(url))
    doc = tiny_doc("changed")
    doc["search_space"]["policy.gamma"]["high"] = 5
    with pytest.raises(ConfigError, match="different search_space"):
        open_study(parse_tune_spec(doc), open_storage(url))


# ----------------------------------------------------------------------------- CLI: export hint, Ctrl-C
def test_export_hint_reads_the_same_study(tmp_path, capsys):
    """The printed export command, run as printed, exports from the study just tuned (--out and a
    non-default --storage carried over)."""
    path = _write(tmp_path, tiny_doc("hint", validation={"top_k": 1, "num_seeds": 2}))
    results = tmp_path / "my results"
    runs = [[], ["--storage", f"sqlite:///{tmp_path / 'elsewhere.db'}"]]
    for extra in runs:
        rc = main(["tune", str(path), "--out", str(results), "--n-trials", "2", "--quiet", *extra])
        cap = capsys.readouterr()
        assert rc == 0, cap.err
        hints = [line for line in cap.out.splitlines() if line.startswith("export: ")]
        assert len(hints) == 1, cap.out
        argv = shlex.split(hints[0][len("export: "):].split("   (or")[0])
        assert argv[:4] == ["python", "-m", "memtp_sim", "export"]
        assert argv[argv.index("--out") + 1] == str(results)
        assert ("--storage" in argv) == bool(extra) and (not extra or argv[argv.index("--storage") + 1] == extra[1])
        rc = main(argv[3:])
        cap = capsys.readouterr()
        assert rc == 0, cap.err
        written = Path(cap.out.strip().splitlines()[0])
        import json

        prov = json.loads(written.read_text())["provenance"]
        assert written.is_relative_to(results) and prov["study"] == "hint"
        assert prov["storage"] == (extra[1] if extra else f"sqlite:///{(results / 'hint' / 'optuna.db').resolve()}")


def test_ctrl_c_in_process_stops_between_seed_runs(tmp_path):
    """One process: the first Ctrl-C lets Optuna finish recording and stops; nothing is left RUNNING."""
    spec = parse_tune_spec(tiny_doc("sigint1"))
    url = f"sqlite:///{tmp_path / 's.db'}"
    before = signal.getsignal(signal.SIGINT)

    def on_progress(done: int, total: int) -> None:
        if done == 1:
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt):
        run_tune(spec, storage_url=url, n_trials=6, out_dir=tmp_path, validate=False, report=False,
                 on_progress=on_progress)
    assert signal.getsignal(signal.SIGINT) is before
    assert [t.state for t in _trials(url, "sigint1")] == [TrialState.COMPLETE]  # stopped right after trial 0
    out = run_tune(spec, storage_url=url, n_trials=3, out_dir=tmp_path, validate=False, report=False)
    assert out.complete == 3 and not out.short


@pytest.mark.slow
def test_ctrl_c_with_two_workers_is_one_clean_line_and_resumes(tmp_path):
    """Ctrl-C reaches the whole process group (parent and workers). Before the fix a worker could
    print ~60 lines (an UnboundLocalError inside Optuna, from a second SIGINT); now workers ignore
    SIGINT and stop when the parent says so, leaving no RUNNING trial, and the study resumes."""
    name = f"sig_{uuid.uuid4().hex[:8]}"
    doc = tiny_doc(name)
    doc["base"]["workload"].update(num_requests=80, concurrency=8)  # ~0.5 s per seed run
    path = _write(tmp_path, doc)
    url = f"sqlite:///{tmp_path / 'sig.db'}"
    args = ["tune", str(path), "--storage", url, "--n-trials", "4", "--workers", "2", "--no-validate", "--quiet"]
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "memtp_sim", *args], cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 120
    pids: set[int] = set()
    while len(pids) < 2 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)  # wait until both workers are inside a trial
        try:
            trials = _trials(url, name)
        except (KeyError, ConfigError):
            continue
        pids = {t.user_attrs["worker"]["pid"] for t in trials
                if t.state == TrialState.RUNNING and "worker" in t.user_attrs}
    assert len(pids) == 2, "never saw both workers in a trial"
    os.killpg(proc.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "Error" not in err, err
    assert err.strip().splitlines() == ["interrupted: finished runs are kept; run the same command again to resume"]
    trials = _trials(url, name)
    assert not [t for t in trials if t.state == TrialState.RUNNING]  # the workers stopped, not killed
    for t in trials:
        if t.state == TrialState.FAIL:
            assert "interrupted" in t.user_attrs["failed_reason"]
    done = sum(t.state == TrialState.COMPLETE for t in trials)
    out = run_tune(parse_tune_spec(doc), storage_url=url, n_trials=done + 1, out_dir=tmp_path, validate=False,
                   report=False)  # resumes: one more COMPLETE trial, nothing stale to clean up
    assert out.complete == done + 1 and out.ran == 1 and not out.short and out.stale_failed == []


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

"""Production-config export (memtp_sim.tuning.export): the files parse and match the chosen trial, the
"best" rule picks what a brute-force search over the trials picks, every file carries provenance,
bad requests (empty study, unknown study, r_low >= r_high) are one-line errors with exit 2, and a
trial exported by number that fails the constraints gets one warning line."""

from __future__ import annotations

import copy
import json
import shlex
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import optuna
import pytest
import yaml

from _sim_helpers import tiny_tune_doc

import memtp_sim
from memtp_sim.cli import main
from memtp_sim.errors import ConfigError
from memtp_sim.hardware import load_profile
from memtp_sim.tuning import STUDY_ATTR, open_storage, open_study, parse_tune_spec, run_tune
from memtp_sim.tuning.export import _infeasibility_warning, build_export, deployment_settings, method_mismatch

from ._helpers import _sha16, _write, imported_profile, profiled_doc

REPO = Path(__file__).resolve().parents[2]
TRACE = REPO / "data" / "traces" / "azure2023_conv.csv"
PROFILE = "gfx1151-llama31-8b-q4km-vulkan"
SLA_VERIFY = 1.5  # constraint: mean_verify_len <= 1.5 (gamma 1 always meets it, gamma 6 never does)

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _doc(name: str) -> dict:
    doc = tiny_tune_doc(name, constraints=[f"mean_verify_len <= {SLA_VERIFY}", "num_rejected <= 0"],
                        validation={"top_k": 1, "num_seeds": 3})
    doc["base"]["hardware"] = {"profile": PROFILE}
    del doc["n_trials"]
    return doc


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """A small tuned study in a results folder; trials 0 and 1 are forced to gamma 1 and gamma 6."""
    out = tmp_path_factory.mktemp("exp")
    spec = parse_tune_spec(_doc("exp"))
    url = f"sqlite:///{out / 'exp' / 'optuna.db'}"
    study = open_study(spec, open_storage(url))
    study.enqueue_trial({"confidence.temperature": 1.0, "policy.gamma": 1})
    study.enqueue_trial({"confidence.temperature": 1.0, "policy.gamma": 6})
    res = run_tune(spec, storage_url=url, n_trials=8, out_dir=out)
    assert res.complete == 8
    return out, optuna.load_study(study_name="exp", storage=url)


def _best_by_brute_force(study) -> optuna.trial.FrozenTrial:
    """Independent oracle: the feasible trial (recomputed from the stored seed-mean metrics) with the
    highest throughput; no dominance test needed, since nothing can beat it on throughput."""
    feas = [t for t in study.trials if t.state.name == "COMPLETE"
            and t.user_attrs["metrics"]["mean_verify_len"] <= SLA_VERIFY
            and t.user_attrs["metrics"]["num_rejected"] <= 0]
    return max(feas, key=lambda t: (t.values[0], -t.number))


def _export(capsys, out: Path, *args: str) -> tuple[int, str, str]:
    rc = main(["export", "--out", str(out), *args])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def _one_line_error(rc: int, err: str, *must: str) -> None:
    assert rc == 2, err
    lines = err.strip("\n").split("\n")
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    for s in must:
        assert s in lines[0], (s, lines[0])


def _check_provenance(prov: dict, trial: optuna.trial.FrozenTrial) -> None:
    assert prov["study"] == "exp" and prov["trial"] == trial.number
    assert prov["params"] == trial.params
    assert prov["memtp_sim_version"] == memtp_sim.__version__ and prov["optuna_version"] == optuna.__version__
    cal = prov["calibration"]
    assert cal["hardware_profile"] == PROFILE and cal["sources"]["verify"] == load_profile(PROFILE).sources["verify"]
    assert cal["acceptance_profile"] == "dspark-qwen3" and cal["acceptance_source"]
    for i, name in enumerate(("throughput_tok_per_s", "tok_per_s_user_p50")):
        obj = prov["objectives"][name]
        assert obj["value"] == pytest.approx(trial.values[i])
        assert obj["tuning"]["replicates"] == trial.user_attrs["replicates"][name]
        v = obj["validation"]
        assert v["n"] == 3 and v["seeds"] == [2, 3, 4]  # fresh: not the tuning seeds 0, 1
        assert v["ci95_low"] <= v["mean"] <= v["ci95_high"]
    assert set(prov["constraints"]) == {f"mean_verify_len <= {SLA_VERIFY:g}", "num_rejected <= 0"}
    # the files the trial read, with their digests, checked against those recorded when the study was made
    files = prov["input_files"]
    assert files["trace"] == {"path": str(TRACE), "sha256_16": _sha16(TRACE)}
    assert files["hardware"]["sha256_16"] == _sha16(REPO / "calibration" / "gfx1151" / "llama31-8b-q4km-vulkan.yaml")
    assert files["measurements"]["sha256_16"] == _sha16(REPO / "calibration" / "gfx1151" / "measurements.csv")
    assert set(files) == {"trace", "hardware", "measurements", "acceptance"} and prov["input_files_checked"] is True


def test_best_rule_and_report(tuned):
    out, study = tuned
    best = _best_by_brute_force(study)
    feas = [t.user_attrs["feasible"] for t in study.trials]
    assert any(feas) and not all(feas), "the constraint should split the trials"
    assert study.trials[1].user_attrs["feasible"] is False  # gamma 6 verifies more than 1.5 per round
    # the tuner validated exactly the best trial (top_k = 1) before anything was exported
    assert set(study.user_attrs["validation"]) == {str(best.number)}
    html = (out / "exp" / "report.html").read_text()
    for title in ("Pareto front", "Parameter importances", "Optimisation history", "Fresh-seed validation"):
        assert title in html
    # both objectives are maximised: the importances explain high values, and say so
    assert "Parameter importances for high throughput_tok_per_s" in html
    assert "importance for high tok_per_s_user_p50" in html


def test_vllm_export_matches_trial(tuned, capsys):
    out, study = tuned
    best = _best_by_brute_force(study)
    rc, stdout, err = _export(capsys, out, "--study", "exp", "--format", "vllm")
    assert rc == 0, err
    path = Path(stdout.strip().splitlines()[0])
    assert path.name == f"exp-trial{best.number}.vllm.json"
    doc = json.loads(path.read_text())
    sc = doc["speculative_config"]
    # the default method is vLLM's DSpark drafter, whose adaptive verification runs the DSpark policy
    assert sc["num_speculative_tokens"] == best.params["policy.gamma"] and sc["method"] == "dspark"
    assert sc["enable_adaptive_verification"] is True
    assert sc["dspark"]["temperature"] == pytest.approx(best.params["confidence.temperature"])
    assert sc["dspark"]["policy"] == "dspark" and sc["dspark"]["policy_params"]["gamma"] == best.params["policy.gamma"]
    assert len(sc["dspark"]["position_temperatures"]) == best.params["policy.gamma"]
    cli = shlex.split(doc["vllm_cli"])
    assert cli[0] == "--speculative-config" and json.loads(cli[1]) == {
        "method": "dspark", "num_speculative_tokens": best.params["policy.gamma"], "enable_adaptive_verification": True}
    _check_provenance(doc["provenance"], best)
    assert doc["provenance"]["selection"].startswith("best:") and doc["provenance"]["feasible"] is True
    # the study simulated the DSpark block drafter and policy, which vLLM's dspark method runs: no warning
    assert "warning" not in err and "drafter_mismatch" not in doc["provenance"]
    assert "stock_engine_gaps" not in doc["provenance"]
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]  # atomic: no leftovers


def test_sglang_export_and_sps_table(tuned, capsys, tmp_path):
    out, study = tuned
    target = tmp_path / "serve" / "flags.txt"
    rc, stdout, err = _export(capsys, out, "--study", "exp", "--format", "sglang", "--trial", "0", "-o", str(target))
    assert rc == 0, err
    trial = study.trials[0]
    text = target.read_text()
    tokens = shlex.split(text, comments=True)
    flags = dict(zip(tokens[::2], tokens[1::2]))
    assert flags == {"--speculative-algorithm": "NEXTN", "--speculative-num-steps": "1",
                     "--speculative-eagle-topk": "1", "--speculative-num-draft-tokens": "2"}
    comments = "\n".join(line[4:] for line in text.splitlines() if line.startswith("#   "))
    meta = yaml.safe_load(comments)
    _check_provenance(meta["provenance"], trial)
    assert meta["provenance"]["selection"] == "trial 0 (chosen by hand)"
    assert meta["dspark"]["sps_table"] == "flags.sps.json"
    sps = json.loads((target.parent / "flags.sps.json").read_text())
    prof = load_profile(PROFILE)
    assert [r["batch_tokens"] for r in sps["table"]] == prof.sps.batch_tokens.tolist()
    for row, ms in zip(sps["table"], prof.sps.pass_ms):  # steps per second = 1000 / measured pass time
        assert row["sps"] == pytest.approx(1000.0 / ms) and row["pass_ms"] == pytest.approx(ms)
    assert sps["source"] == prof.sps.source and sps["provenance"]["trial"] == 0
    # trial 0 was not among the validated top trials: export validated it first, and kept the record
    assert "0" in optuna.load_study(study_name="exp", storage=study._storage).user_attrs["validation"]


def test_memtp_export_of_a_study_without_the_ensemble_is_refused(tuned, capsys, tmp_path):
    # the study never simulated MEMTP (memtp.depth unset): its gate and head cost would be library
    # defaults presented as tuned output, so --format memtp is refused in one line and writes nothing
    out, study = tuned
    target = tmp_path / "ctrl.yaml"
    rc, _, err = _export(capsys, out, "--study", "exp", "--format", "memtp", "-o", str(target))
    _one_line_error(rc, err, "--format memtp", "did not simulate the MEMTP ensemble", "memtp.depth unset",
                    "--format vllm")
    assert not target.exists()
    # the library settings say the same: the gate is marked as defaults, never as the scenario's
    s = deployment_settings({"policy": {"name": "dspark", "gamma": 4}, "memtp": {"depth": None, "r_low": 0.3}})
    assert not s["memtp"]["enabled"] and "not simulated" in s["memtp"]["source"]
    with pytest.raises(ConfigError, match="did not simulate the MEMTP ensemble"):
        build_export("memtp", s, {})


def test_memtp_ensemble_depth_and_gate_come_from_the_memtp_section():
    scen = {"policy": {"name": "dspark", "gamma": 7}, "confidence": {"temperature": 1.7},
            "memtp": {"depth": "elastic", "max_depth": 5, "r_low": 0.2, "r_high": 0.75, "head_cost_gib": 3.5}}
    s = deployment_settings(scen, [1.1, 1.2])
    assert s["max_depth"] == 5 and s["depth_source"] == "memtp.max_depth"
    assert s["policy_params"]["gamma"] == 5  # the engine drafts max_depth positions with the ensemble on
    assert (s["memtp"]["r_low"], s["memtp"]["r_high"], s["memtp"]["head_cost_gib"]) == (0.2, 0.75, 3.5)
    assert s["temperature"] == 1.7 and s["position_temperatures"] == [1.1, 1.2]
    bad = copy.deepcopy(scen)
    bad["memtp"].update(r_low=0.9, r_high=0.3)
    with pytest.raises(ConfigError, match=r"r_low \(0.9\) must be < r_high \(0.3\)"):
        deployment_settings(bad)


def test_tuned_memtp_ensemble_exports_its_knobs(tmp_path, capsys):
    doc = _doc("ens")
    doc["base"]["memtp"] = {"depth": "elastic", "max_depth": 4}
    doc["base"]["policy"] = {"name": "dspark"}  # no gamma: the ensemble sets the draft length
    doc["search_space"] = {
        "memtp.max_depth": {"type": "int", "low": 2, "high": 6},
        "memtp.r_low": {"type": "float", "low": 0.1, "high": 0.7},
        "memtp.r_high": {"type": "float", "low": 0.3, "high": 0.95},
    }  # r_low < r_high is implied (the memtp section requires it)
    doc["constraints"] = []
    doc["validation"] = {"top_k": 1, "num_seeds": 2}
    spec = parse_tune_spec(doc)
    res = run_tune(spec, n_trials=3, out_dir=tmp_path, report=False)
    assert res.complete == 3
    rc, _, err = _export(capsys, tmp_path, "--study", "ens", "--format", "memtp", "-o", str(tmp_path / "c.yaml"))
    assert rc == 0, err
    ctl = yaml.safe_load((tmp_path / "c.yaml").read_text())["controller"]
    trial = optuna.load_study(study_name="ens", storage=f"sqlite:///{tmp_path / 'ens' / 'optuna.db'}").trials[
        yaml.safe_load((tmp_path / "c.yaml").read_text())["provenance"]["trial"]]
    assert ctl["max_depth"] == trial.params["memtp.max_depth"] and ctl["depth"] == "elastic"
    assert ctl["r_low"] == pytest.approx(trial.params["memtp.r_low"])
    assert ctl["r_high"] == pytest.approx(trial.params["memtp.r_high"])
    assert ctl["r_low"] < ctl["r_high"]
    rc, _, err = _export(capsys, tmp_path, "--study", "ens", "--format", "vllm", "-o", str(tmp_path / "v.json"))
    assert rc == 0, err
    vdoc = json.loads((tmp_path / "v.json").read_text())
    assert vdoc["speculative_config"]["num_speculative_tokens"] == trial.params["memtp.max_depth"]
    assert vdoc["speculative_config"]["dspark"]["memtp_gate"]["r_low"] == pytest.approx(trial.params["memtp.r_low"])


# ----------------------------------------------------------------------------- errors
def test_unknown_study_name(tuned, capsys, tmp_path):
    out, _ = tuned
    rc, _, err = _export(capsys, tmp_path, "--study", "nope", "--format", "vllm")
    _one_line_error(rc, err, "study 'nope' not found", "optuna.db")
    rc, _, err = _export(capsys, out, "--study", "nope", "--format", "vllm", "--storage",
                         f"sqlite:///{out / 'exp' / 'optuna.db'}")
    _one_line_error(rc, err, "study 'nope' not found", "studies there: exp")


def test_empty_study(tmp_path, capsys):
    spec = parse_tune_spec(_doc("empty"))
    open_study(spec, open_storage(f"sqlite:///{tmp_path / 'empty' / 'optuna.db'}"))
    rc, _, err = _export(capsys, tmp_path, "--study", "empty", "--format", "memtp")
    _one_line_error(rc, err, "no complete trials")


def test_bad_trial_numbers(tuned, capsys):
    out, _ = tuned
    rc, _, err = _export(capsys, out, "--study", "exp", "--format", "vllm", "--trial", "99")
    _one_line_error(rc, err, "no trial 99")
    rc, _, err = _export(capsys, out, "--study", "exp", "--format", "vllm", "--trial", "first")
    _one_line_error(rc, err, "--trial")


def test_no_feasible_trial(tmp_path, capsys):
    doc = _doc("infeasible")
    doc["constraints"] = ["num_completed >= 1000"]  # (possible in principle, out of these trials' reach)
    doc["validation"] = {"top_k": 0, "num_seeds": 2}
    spec_path = tmp_path / "infeasible.yaml"
    spec_path.write_text(yaml.safe_dump(doc))
    rc = main(["tune", str(spec_path), "--out", str(tmp_path), "--n-trials", "2", "--quiet"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "no feasible trial: none of the 2 complete trials meets the constraints (num_completed >= 1000)" in out
    assert "export:" not in out  # no export hint that could only fail
    rc, _, err = _export(capsys, tmp_path, "--study", "infeasible", "--format", "vllm")
    _one_line_error(rc, err, "meets the constraints", "--trial N")
    rc, stdout, err = _export(capsys, tmp_path, "--study", "infeasible", "--format", "vllm", "--trial", "1")
    assert rc == 0, err  # an infeasible trial can still be exported by number: a warning, then the file
    lines = err.strip().splitlines()
    assert lines[0] == ("warning: trial 1 is infeasible: num_completed >= 1000: num_completed = 24, short by 976 "
                        "(mean over tuning seeds 0, 1); writing it anyway, as asked")
    assert len(lines) == 1  # vLLM's dspark method runs this trial's drafter and policy (no other warning)
    path = tmp_path / "infeasible" / "export" / "infeasible-trial1.vllm.json"
    assert stdout.strip() == str(path)
    assert json.loads(path.read_text())["provenance"]["feasible"] is False


def test_warning_when_only_fresh_seeds_fail():
    """A trial that met the constraints on the tuning seeds but not on the fresh ones is worth one
    line too; numbers are written plainly even when they arrive as numpy scalars."""
    spec = parse_tune_spec(_doc("w"))
    trial = SimpleNamespace(number=5, user_attrs={"constraint_values": [-0.25, 0.0],
                                                  "metrics": {"mean_verify_len": 1.25, "num_rejected": 0}})
    fresh = {"seeds": [2, 3, 4], "constraint_values": [np.float64(0.125), np.float64(0.0)],
             "metrics": {"mean_verify_len": {"mean": np.float64(1.625)}, "num_rejected": {"mean": np.int64(0)}}}
    assert _infeasibility_warning(spec, trial, fresh) == (
        "trial 5 meets the constraints on the tuning seeds but not on fresh seeds 2, 3, 4: "
        "mean_verify_len <= 1.5: mean_verify_len = 1.625, over by 0.125")
    fresh["constraint_values"] = [np.float64(-0.1), np.float64(0.0)]
    assert _infeasibility_warning(spec, trial, fresh) is None


def test_search_space_with_r_low_above_r_high(tmp_path, capsys):
    doc = _doc("gate")
    doc["base"]["memtp"] = {"depth": "elastic", "max_depth": 4}
    doc["search_space"] = {
        "memtp.r_low": {"type": "float", "low": 0.6, "high": 0.9},
        "memtp.r_high": {"type": "float", "low": 0.2, "high": 0.6},
    }
    path = tmp_path / "gate.yaml"
    path.write_text(yaml.safe_dump(doc))
    rc = main(["tune", str(path), "--out", str(tmp_path), "--quiet"])
    err = capsys.readouterr().err
    _one_line_error(rc, err, str(path), "memtp.r_low < memtp.r_high", "impossible")


@pytest.mark.parametrize("fmt, method, kind, match", [
    ("vllm", "mtp", "mtp", True), ("vllm", "deepseek_mtp", "mtp", True), ("vllm", "qwen3_next_mtp", "mtp", True),
    ("vllm", "eagle3", "eagle", True), ("vllm", "draft_model", "draft_model", True), ("vllm", "ngram", "ngram", True),
    ("sglang", "NEXTN", "mtp", True), ("sglang", "EAGLE3", "eagle", True), ("sglang", "STANDALONE", "draft_model", True),
    ("sglang", "NGRAM", "ngram", True), ("memtp", "anything", "dspark_block", True),
    ("sglang", "eagle3", "eagle", True), ("sglang", "Nextn", "mtp", True),  # SGLang upper-cases the name
    ("vllm", "Draft_Model", "draft_model", True), ("sglang", "nextn", "dspark_block", False),
    ("vllm", "mtp", "dspark_block", False), ("vllm", "eagle", "mtp", False), ("vllm", "medusa", "mtp", False),
    ("sglang", "NEXTN", "draft_model", False), ("sglang", "EAGLE", "per_sequence", False),
])
def test_an_export_method_that_runs_another_drafter_is_named(fmt, method, kind, match):
    said = method_mismatch(fmt, method, kind)
    assert (said is None) == match
    if not match:
        assert f"simulated the {kind} drafter" in said and repr(method) in said and "\n" not in said
        assert ("algorithm" if fmt == "sglang" else "method") in said


def test_an_unknown_export_method_is_named_as_unknown():
    said = method_mismatch("vllm", "bogus_method", "dspark_block")
    assert "'bogus_method' is not one memtp_sim can match" in said and "eagle3" in said
    said = method_mismatch("sglang", "EAGLE4", "eagle")
    assert "sglang algorithm 'EAGLE4' is not one memtp_sim can match" in said and "NEXTN" in said


def test_a_study_that_simulated_mtp_heads_exports_vllm_mtp_without_a_warning(tmp_path, capsys):
    doc = tiny_tune_doc("mtpheads", n_trials=2)
    doc["base"]["hardware"] = {"profile": "h200-llama31-8b-bf16"}
    doc["base"]["drafter"] = {"kind": "mtp"}
    doc["export"] = {"vllm_method": "mtp"}
    spec = parse_tune_spec(doc)
    assert run_tune(spec, out_dir=tmp_path, report=False).complete == 2
    rc, stdout, err = _export(capsys, tmp_path, "--study", "mtpheads", "--format", "vllm", "--trial", "0")
    assert rc == 0, err
    assert "the trial simulated" not in err  # no drafter-mismatch line (the dspark policy's gap line stays)
    assert "drafter_mismatch" not in json.loads(Path(stdout.strip().splitlines()[0]).read_text())["provenance"]


@pytest.mark.parametrize("fmt", ["vllm", "sglang"])
def test_what_a_stock_engine_cannot_run_is_named(fmt):
    """Review: a threshold policy with an acceptance-target controller exported as a fixed-k vLLM
    flag without a word; a static policy with a batch schedule is what stock vLLM runs."""
    from memtp_sim.tuning.export import deployment_settings, stock_engine_gaps

    base = {"memtp": {"depth": None}, "confidence": {"temperature": 1.0}}
    static = deployment_settings({**base, "policy": {"name": "static", "k": 3},
                                  "draft_control": {"name": "batch_table", "table": {"1-8": 3, "9-4096": 0}}})
    said = stock_engine_gaps(fmt, static)
    assert (said is None) if fmt == "vllm" else said.startswith(f"stock {fmt} cannot run this trial's draft_control batch_table")
    assert stock_engine_gaps(fmt, deployment_settings({**base, "policy": {"name": "mtp1"}})) is None
    tuned = deployment_settings({**base, "policy": {"name": "threshold", "gamma": 4, "threshold": 0.3},
                                 "draft_control": {"name": "acceptance_target", "target": 0.6}})
    said = stock_engine_gaps(fmt, tuned)
    assert said.startswith(f"stock {fmt} cannot run this trial's policy threshold") and "draft_control acceptance_target" in said
    assert "draft and verify 4 tokens a round" in said
    ens = deployment_settings({"memtp": {"depth": "elastic", "max_depth": 5}, "policy": {"name": "static", "k": 2}})
    assert stock_engine_gaps(fmt, ens).startswith(f"stock {fmt} cannot run this trial's MEMTP ensemble (depth elastic")
    assert stock_engine_gaps("memtp", tuned) is None
    # vLLM's dspark method verifies adaptively (enable_adaptive_verification): DSpark policies run there
    dsp = deployment_settings({**base, "policy": {"name": "dspark", "gamma": 5}})
    assert (stock_engine_gaps(fmt, dsp, "dspark") is None) == (fmt == "vllm")
    assert stock_engine_gaps(fmt, dsp, "mtp").startswith(f"stock {fmt} cannot run this trial's policy dspark")
    assert stock_engine_gaps(fmt, tuned, "dspark").startswith(f"stock {fmt} cannot run this trial's policy threshold")


def test_export_refuses_a_study_whose_input_files_changed(tmp_path, capsys):
    """Review: after the profile's cost table changed (B=16: 58.7391 -> 99.0 ms), `export --format sglang`
    wrote an SPS table with (16, 99.0), a table the trial never simulated, without a warning."""
    costs = tmp_path / "prof" / "p.costs.csv"
    spec = parse_tune_spec(profiled_doc("tprof", imported_profile(tmp_path)))
    assert run_tune(spec, n_trials=2, out_dir=tmp_path, validate=False, report=False).complete == 2
    costs.write_bytes(costs.read_bytes().replace(b"58.7391", b"99.0"))
    capsys.readouterr()
    rc, stdout, err = _export(capsys, tmp_path, "--study", "tprof", "--format", "sglang", "--trial", "0")
    _one_line_error(rc, err, f"error: export: input changed since study 'tprof' was tuned: measurements ({costs}); "
                             "its trials were priced on the old contents; a config exported now would take its SPS "
                             "table and calibration from the new ones; restore the old file(s), or tune again under a "
                             "new name")
    assert not (tmp_path / "tprof" / "export").exists()  # nothing written, nothing validated on the new table
    assert "validation" not in optuna.load_study(study_name="tprof",
                                                 storage=f"sqlite:///{tmp_path / 'tprof' / 'optuna.db'}").user_attrs


def test_a_study_without_input_digests_resumes_and_exports_with_a_note(tmp_path, capsys):
    """A study made before tune recorded its input files' digests cannot be checked: it still resumes
    and exports, each with one line saying so (and the export's provenance says it too)."""
    path = _write(tmp_path, tiny_tune_doc("old"))
    args = ["tune", str(path), "--out", str(tmp_path), "--no-validate", "--quiet"]
    assert main([*args, "--n-trials", "2"]) == 0
    study = optuna.load_study(study_name="old", storage=f"sqlite:///{tmp_path / 'old' / 'optuna.db'}")
    rec = study.user_attrs[STUDY_ATTR]
    del rec["inputs"]  # as a study made before the digests were recorded
    study.set_user_attr(STUDY_ATTR, rec)
    capsys.readouterr()
    assert main([*args, "--n-trials", "3"]) == 0
    out, err = capsys.readouterr()
    note = ("study 'old' records no digests of its input files (made before tune recorded them), so it cannot be "
            "checked that the trace and profiles are still the files its trials read")
    assert err == f"note: {note}\n" and "3/3 complete trials (1 started now: 1 complete; " in out
    rc, stdout, err = _export(capsys, tmp_path, "--study", "old", "--format", "vllm", "--trial", "0")
    assert rc == 0 and err.splitlines()[0] == f"warning: {note}", err
    prov = json.loads(Path(stdout.strip()).read_text())["provenance"]
    assert prov["input_files_checked"] is False and prov["input_files"]["trace"]["sha256_16"] == _sha16(TRACE)


def test_the_stock_engine_warning_reads_as_a_sentence():
    """Review: "stock vllm cannot run this trial's the MEMTP ensemble". Each item reads after "this
    trial's" (the first) or "its" (the rest), joined as a list: every combination the code makes."""
    from memtp_sim.tuning.export import stock_engine_gaps

    tail = ("the exported flags draft and verify 5 tokens a round; those settings are only in the file's dspark "
            "block, for a DSpark-aware build, so a stock deployment will not match the simulated numbers")
    pol = "policy threshold (it verifies a confidence-chosen subset of the drafted tokens)"
    ens = "MEMTP ensemble (depth elastic, coherence gate)"
    ctl = "draft_control acceptance_target"
    assert stock_engine_gaps("vllm", deployment_settings(
        {"memtp": {"depth": "elastic", "max_depth": 5}, "policy": {"name": "static", "k": 2}})) == \
        f"stock vllm cannot run this trial's {ens}: {tail}"
    assert stock_engine_gaps("sglang", deployment_settings(
        {"memtp": {"depth": "elastic", "max_depth": 5}, "policy": {"name": "threshold", "threshold": 0.3},
         "draft_control": {"name": "acceptance_target", "target": 0.6}})) == \
        f"stock sglang cannot run this trial's {pol}, its {ctl} or its {ens}: {tail}"
    for policy, control, memtp, want in [  # the other combinations
            ("threshold", None, None, f"this trial's {pol}"),
            ("static", "acceptance_target", None, f"this trial's {ctl}"),
            ("threshold", "acceptance_target", None, f"this trial's {pol} or its {ctl}"),
            ("threshold", None, "elastic", f"this trial's {pol} or its {ens}"),
            ("static", "acceptance_target", "elastic", f"this trial's {ctl} or its {ens}")]:
        doc = {"memtp": {"depth": memtp, "max_depth": 5}, "policy": {"name": policy, "gamma": 5, "threshold": 0.3}
               if policy == "threshold" else {"name": "static", "k": 5}}
        if control:
            doc["draft_control"] = {"name": control, "target": 0.6}
        assert stock_engine_gaps("vllm", deployment_settings(doc)) == f"stock vllm cannot run {want}: {tail}"


def test_memtp_export_carries_every_knob_the_trial_ran(tmp_path, capsys):
    """Review: tuned min_dwell_rounds, coherence and its half-life were only under provenance.params."""
    doc = _doc("knobs")
    doc["base"]["memtp"] = {"depth": "elastic", "max_depth": 4, "coherence": "ewma"}
    doc["base"]["policy"] = {"name": "dspark"}
    doc["base"]["confidence"] = {"sts": "fit", "sts_rounds": 2000}
    doc["search_space"] = {"memtp.min_dwell_rounds": {"type": "int", "low": 8, "high": 64},
                           "memtp.coherence_half_life_rounds": {"type": "float", "low": 4.0, "high": 32.0}}
    doc["constraints"] = []
    doc["validation"] = {"top_k": 1, "num_seeds": 2}
    assert run_tune(parse_tune_spec(doc), n_trials=2, out_dir=tmp_path, report=False).complete == 2
    rc, _, err = _export(capsys, tmp_path, "--study", "knobs", "--format", "memtp", "--trial", "1",
                         "-o", str(tmp_path / "c.yaml"))
    assert rc == 0, err
    out = yaml.safe_load((tmp_path / "c.yaml").read_text())
    ctl, params = out["controller"], out["provenance"]["params"]
    assert ctl["min_dwell_rounds"] == params["memtp.min_dwell_rounds"]
    assert ctl["coherence_half_life_rounds"] == pytest.approx(params["memtp.coherence_half_life_rounds"])
    assert ctl["coherence"] == "ewma" and ctl["max_depth"] == 4
    # the STS temperatures say whose fit they are
    assert out["provenance"]["position_temperatures_from"].startswith("the STS fit of tuning seed 0")

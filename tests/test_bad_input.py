"""Bad input found by a fresh-user review: every case is one line naming the file and the field,
exit code 2, no traceback; settings that would be silently ignored are refused."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from memtp_sim.cli import main

REPO = Path(__file__).resolve().parents[1]
TRACE = REPO / "data" / "traces" / "azure2023_conv.csv"

BASE = f"""name: t
base:
  workload: {{trace: {TRACE}, mode: closed_loop, concurrency: 2, num_requests: 6}}
  engine: {{prefill: disaggregated, prefill_gpus: 2}}
  policy: {{name: no_spec}}
seeds: [0]
"""


def _one_line_exit_2(argv, capsys, *needles):
    rc = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2, err
    assert len(err) == 1, err
    for n in needles:
        assert n in err[0], err[0]
    assert "Traceback" not in err[0]
    return err[0]


@pytest.mark.parametrize("old, new, field", [
    ("seeds: [0]", "seeds: [-1]", "seeds"),
    ("seeds: [0]", "seeds: [0, 0]", "duplicate seed"),
    ("num_requests: 6", "num_requests: true", "num_requests"),
    ("concurrency: 2, num_requests: 6", "concurrency: 2, num_requests: 6, rate_per_s: 5", "rate_per_s"),
    ("mode: closed_loop, concurrency: 2", "mode: poisson, rate_per_s: 1, concurrency: 2", "concurrency"),
    ("policy: {name: no_spec}", "policy: {name: static, k: true}", "policy.k"),
    # set but never used: base.policy's parameters under a policies list; probes without the fallback
    ("policy: {name: no_spec}", "policy: {name: dspark, gamma: 3}\npolicies: [{name: dspark}]", "base.policy"),
    ("policy: {name: no_spec}", "policy: {name: dspark, fallback: false, probe_every: 2}", "policy.probe_every"),
    ("policy: {name: no_spec}", "policy: {name: no_spec}\npolicies: [{name: goodput, fallback: false, probe_every: 2}]",
     "policies.0.probe_every"),
    ("seeds: [0]", "seeds: [0]\npolicies: []", "policies"),
    ("seeds: [0]", "seeds: [0]\nseeds: [1]", "twice"),
    ("  engine:", "  memtp: {depth: 0}\n  engine:", "memtp.depth"),
    ("  engine:", "  confidence: {sts: maybe}\n  engine:", "sts"),
    ("  engine:", "  acceptance: {profile: dspark-qwen3, alpha: 0.7}\n  engine:", "alpha"),
    # every rate vector given as text names its field when a part is not a number
    ("  engine:", "  acceptance: {conditional: 0.8/x}\n  engine:", "conditional acceptance: expected numbers"),
    ("  engine:", "  acceptance: {per_position: 0.8/0.6/x}\n  engine:", "per_position: expected numbers"),
])
def test_bad_study_is_one_line(tmp_path, capsys, old, new, field):
    f = _edited_study(tmp_path, old, new)
    _one_line_exit_2(["run", str(f), "--out", str(tmp_path / "out")], capsys, str(f), field)


def _edited_study(tmp_path, old: str, new: str):
    """BASE with ``old`` replaced by ``new``, written to tmp_path/study.yaml."""
    f = tmp_path / "study.yaml"
    assert old in BASE
    f.write_text(BASE.replace(old, new, 1))
    return f


@pytest.mark.parametrize("old, new, path", [
    ("concurrency: 2, ", "", "base.workload.concurrency: mode closed_loop needs it"),
    ("mode: closed_loop, concurrency: 2", "mode: poisson", "base.workload.rate_per_s: mode poisson needs it"),
    ("  engine:", "  memtp: {depth: elastic, r_low: 0.95, r_high: 0.9}\n  engine:", "base.memtp.r_low: 0.95 must be"),
    ("  engine:", "  acceptance: {profile: dspark-qwen3, domain_mix: {chat: 0.5}}\n  engine:",
     "base.acceptance.domain_mix: probabilities must sum to 1"),
    # (was depth 9 vs max_depth 7: a fixed depth no longer reads max_depth, see test_config_inputs)
    ("  engine:", "  memtp: {depth: elastic, initial_depth: 9, max_depth: 7}\n  engine:",
     "base.memtp.initial_depth: 9 exceeds max_depth 7"),
    # a check that names its own section's path: the path once (was "base.policy: policy.gamam: ...")
    ("policy: {name: no_spec}", "policy: {name: dspark, gamam: 5}",
     "base.policy.gamam: unknown parameter of policy 'dspark'; allowed: gamma"),
])
def test_a_sections_check_about_one_field_names_that_fields_path(tmp_path, capsys, old, new, path):
    """A check that spans a section (pydantic locates it at the section) still names the field
    it is about, as that field's own check would: the dashboard shows the line beside that field."""
    f = _edited_study(tmp_path, old, new)
    _one_line_exit_2(["run", str(f), "--out", str(tmp_path / "out")], capsys, f"{f}: {path}")


def test_hardware_accepts_a_profile_name_shorthand(tmp_path, capsys):
    f = tmp_path / "study.yaml"
    f.write_text(BASE.replace("  engine:", "  hardware: gfx1151-llama31-8b-q4km-vulkan\n  engine:"))
    assert main(["run", str(f), "--out", str(tmp_path / "out"), "--quiet"]) == 0


def test_a_one_run_study_says_one_run(tmp_path, capsys):
    # BASE is one policy, one seed, no sweep: the summary line counts "1 run", not "1 runs"
    f = tmp_path / "study.yaml"
    f.write_text(BASE)
    assert main(["run", str(f), "--out", str(tmp_path / "out")]) == 0
    assert "\n1 run in " in capsys.readouterr().out


@pytest.mark.parametrize("content, needle", [
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n", "no rows"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,\n", "row 2"),
])
def test_bad_trace_rows(tmp_path, capsys, content, needle):
    trace = tmp_path / "t.csv"
    trace.write_text(content)
    f = tmp_path / "study.yaml"
    f.write_text(BASE.replace(str(TRACE), str(trace)))
    _one_line_exit_2(["run", str(f), "--out", str(tmp_path / "out")], capsys, needle)


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_unwritable_out_is_refused_before_running(tmp_path, capsys):  # pragma: no cover - non-root CI
    f = tmp_path / "study.yaml"
    f.write_text(BASE)
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    _one_line_exit_2(["run", str(f), "--out", str(ro)], capsys, "cannot write")


def test_unwritable_out_is_refused_before_running_as_any_user(tmp_path, capsys):
    # a path under a regular file can never be created, root or not
    f = tmp_path / "study.yaml"
    f.write_text(BASE)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    _one_line_exit_2(["run", str(f), "--out", str(blocker / "out")], capsys, "cannot write")


@pytest.mark.parametrize("argv, needle", [
    (["schedule", "abc"], "confidences"),
    (["schedule", "0.9", "--sps", "garbage"], "--sps"),
    (["schedule", "0.9,0.8", "0.5,0.4", "--sps", "1=1.0,2=0.6,3=0.5"], "sps"),
    # review: a B given twice was last-wins; inf and B=0 printed numpy RuntimeWarnings first
    (["schedule", "0.8,0.9", "--sps", "1=1.0,2=0.5,3=0.45,2=0.9"], "--sps: B=2 is given twice"),
    (["schedule", "0.8,0.9", "--sps", "1=1.0,2=inf"], "--sps: B=2: inf: steps per second must be"),
    (["schedule", "0.8,0.9", "--sps", "0=1.0,2=0.5"], "--sps: B=0: batch sizes are whole numbers >= 1"),
])
def test_schedule_bad_input(argv, needle, capsys):
    _one_line_exit_2(argv, capsys, needle)


def test_schedule_with_a_cap(capsys):
    # Hand case: SPS(1)=1, SPS(2)=0.6, SPS(3)=0.5; a = [0.9, 0.72] and [0.5, 0.2]; cap B <= 3.
    # B=2: tau 2 * 1/1 -> Theta(B=2) = 2 * 0.6 = 1.2; admit 0.9: tau 2.9, B 3: 2.9 * 0.5 = 1.45 > 1.2.
    assert main(["schedule", "0.9,0.8", "0.5,0.4", "--sps", "1=1.0,2=0.6,3=0.5", "--max-batch-tokens", "3"]) == 0
    assert "lengths=[1, 0] batch_tokens=3" in capsys.readouterr().out


def test_schedule_says_whose_pass_costs_it_used(capsys):
    # fresh user: without --sps it did not say which profile priced the passes
    from memtp_sim.hardware import load_profile

    assert main(["schedule", "0.9,0.8", "0.7"]) == 0
    said = capsys.readouterr()
    assert said.out.startswith("lengths=") and f"the {load_profile(None).name} profile's verify curve" in said.err
    assert main(["schedule", "0.9,0.8", "--sps", "1=1.0,2=0.5,3=0.45"]) == 0
    assert capsys.readouterr().err == ""  # its own curve: nothing to say


def test_report_on_a_folder_that_is_not_a_study(tmp_path, capsys):
    (tmp_path / "runs.csv").write_text("")
    _one_line_exit_2(["report", str(tmp_path)], capsys, "study.json")
    (tmp_path / "study.json").write_text(json.dumps({"name": "x", "sweep_keys": []}))
    _one_line_exit_2(["report", str(tmp_path)], capsys, "none of the study's 0 runs has a verified result")
    (tmp_path / "study.json").write_text('{"garbage')  # review: the line named no file
    _one_line_exit_2(["report", str(tmp_path)], capsys, f"{tmp_path}: study.json is missing or unreadable")


def test_resume_does_not_reuse_results_from_a_changed_trace(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text(TRACE.read_text()[:20000].rsplit("\n", 1)[0])
    f = tmp_path / "study.yaml"
    f.write_text(BASE.replace(str(TRACE), str(trace)))
    out = tmp_path / "out"
    assert main(["run", str(f), "--out", str(out), "--quiet"]) == 0
    summary = next((out / "t" / "runs").glob("*/summary.json"))
    first = json.loads(summary.read_text())
    # triple every output length: the same config, different input contents
    lines = trace.read_text().split("\n")
    rows = [lines[0]] + [",".join(r.split(",")[:2] + [str(3 * int(r.split(",")[2]))]) for r in lines[1:] if r]
    trace.write_text("\n".join(rows))
    assert main(["run", str(f), "--out", str(out), "--quiet"]) == 0
    # run ids hash the input contents: the changed trace's run has a folder of its own, and the
    # earlier result is left as it was
    (other,) = [s for s in (out / "t" / "runs").glob("*/summary.json") if s != summary]
    second = json.loads(other.read_text())
    assert json.loads(summary.read_text()) == first
    assert second["inputs"]["trace"] != first["inputs"]["trace"]
    assert second["metrics"]["output_tokens_total"] > first["metrics"]["output_tokens_total"]


# ------------------------------------------------------------------------------ a full disk
def _disk_full(*_a, **_k):
    import errno as _errno
    raise OSError(_errno.ENOSPC, "No space left on device")  # as write/fsync raise it: no file named


def test_a_full_disk_names_the_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    from memtp_sim import _io
    monkeypatch.setattr(_io.os, "fsync", _disk_full)
    target = tmp_path / "sub" / "summary.json"
    with pytest.raises(OSError) as exc:
        _io.atomic_write_text(target, "{}")
    assert exc.value.filename == str(target) and exc.value.errno == 28
    assert not target.exists() and list(target.parent.iterdir()) == []



@pytest.mark.parametrize("how", ["folder", "rename"])
def test_a_write_that_fails_names_the_destination_not_the_temporary(tmp_path, monkeypatch, how):
    # `export -o /tmp` once said "error: /.tmp.0de47be5afcc.tmp: Is a directory": a name nobody chose
    from memtp_sim import _io
    target = tmp_path / "out"
    if how == "folder":  # an output path that is a folder: refused before anything is written
        target.mkdir()
    else:  # the rename itself fails (e.g. a permission error on the folder): it names both files
        def refused(src, dst):
            raise PermissionError(13, "Permission denied", str(src), None, str(dst))
        monkeypatch.setattr(_io.os, "replace", refused)
    with pytest.raises(OSError) as exc:
        _io.atomic_write_text(target, "{}")
    assert exc.value.filename == str(target), exc.value
    assert ".tmp" not in str(exc.value)
    assert [p.name for p in tmp_path.iterdir()] == (["out"] if how == "folder" else [])
    if how == "folder":
        assert "is a directory" in str(exc.value) and list(target.iterdir()) == []


def test_a_full_disk_during_a_study_is_exit_1_with_the_file_and_what_to_do(tmp_path, capsys, monkeypatch):
    # a full disk is not bad input (exit 2): the run failed (exit 1), and the line says which file
    # and that the same command resumes
    from memtp_sim import _io
    f = tmp_path / "study.yaml"
    f.write_text(BASE)
    real_fsync = os.fsync

    def fills_up(fd):  # the folder checks pass; the disk fills once runs write their results
        return _disk_full() if any((tmp_path / "out").glob("*/runs/*")) else real_fsync(fd)

    monkeypatch.setattr(_io.os, "fsync", fills_up)
    rc = main(["run", str(f), "--out", str(tmp_path / "out"), "--quiet", "--jobs", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1, err
    assert err[-1].startswith(f"error: {tmp_path / 'out'}"), err
    assert "No space left on device" in err[-1] and "run the same command again" in err[-1], err


# ------------------------------------------------- a trace replay the trace cannot fill (load time)
# The kind: input that makes every run fail the same way is refused when the YAML loads (exit 2,
# one line), by every command that loads scenarios, not found run by run (exit 1).
def _short_trace(tmp_path: Path) -> Path:
    trace = tmp_path / "short.csv"
    trace.write_text("\n".join(TRACE.read_text().splitlines()[:4]) + "\n")  # 3 requests
    return trace


_REPLAYS = {  # workload fields -> the field the error names
    "too_few_rows": ("mode: trace, num_requests: 30", "num_requests"),
    "offset_past_the_end": ("mode: trace, num_requests: 1, start_offset_s: 1.0e9", "start_offset_s"),
    "too_few_after_the_offset": ("mode: trace, num_requests: 3, start_offset_s: 0.001", "num_requests"),
}


@pytest.mark.parametrize("case", sorted(_REPLAYS))
@pytest.mark.parametrize("command", ["run", "capacity", "tune"])
def test_a_trace_replay_the_trace_cannot_fill_is_refused_at_load(tmp_path, capsys, command, case):
    trace = _short_trace(tmp_path)
    fields, field = _REPLAYS[case]
    workload = f"workload: {{trace: {trace}, {fields}}}"
    f = tmp_path / "in.yaml"
    if command == "run":
        f.write_text(f"name: t\nbase:\n  {workload}\n  policy: {{name: no_spec}}\n")
        argv = ["run", str(f), "--out", str(tmp_path / "out")]
    elif command == "capacity":
        f.write_text(f"{workload}\npolicy: {{name: no_spec}}\n")
        argv = ["capacity", str(f), "--slo", "ttft_s_p90 <= 2"]
    else:
        f.write_text(f"name: t\nbase:\n  {workload}\n  policy: {{name: dspark}}\nsearch_space:\n"
                     "  confidence.temperature: {type: float, low: 0.5, high: 2.0}\n"
                     "objectives: [{metric: throughput_tok_per_s, direction: maximize}]\nn_trials: 1\n")
        argv = ["tune", str(f), "--out", str(tmp_path / "out")]
    _one_line_exit_2(argv, capsys, str(f), str(trace), f"{field}:", "allowed")
    assert not (tmp_path / "out").exists()  # nothing ran


def test_a_sweep_point_the_trace_cannot_fill_is_refused_at_load_naming_the_point(tmp_path, capsys):
    trace = _short_trace(tmp_path)
    f = tmp_path / "study.yaml"
    f.write_text(f"name: t\nbase:\n  workload: {{trace: {trace}, mode: trace, num_requests: 2}}\n"
                 "  policy: {name: no_spec}\nsweep: {workload.num_requests: [2, 3, 4]}\n")
    _one_line_exit_2(["run", str(f), "--out", str(tmp_path / "out")], capsys, "workload.num_requests=4",
                     "num_requests:", "allowed: <= 3")


# ------------------------------------------------------- failed runs: retry only what a retry helps
@pytest.mark.parametrize("error", ["ConfigError", "CalibrationError", "InvalidArgumentError", "FileNotFoundError",
                                   "RuntimeError", "EngineInvariantError", "MemoryError"])
def test_a_run_that_failed_on_its_input_is_not_told_to_retry(tmp_path, capsys, monkeypatch, error):
    # an input error fails the same way on every rerun: "run again to retry" would loop the user;
    # so does any other error the simulation raised (a run is deterministic for its seed), and an
    # input file gone since the study was loaded (a rerun refuses it at load; a fresh user's
    # report: it was told to retry): only a failure of the machine (memory here) is told a retry may help
    import builtins

    import memtp_sim.errors as errors
    import memtp_sim.study as study

    real = study.run
    kind = {"RuntimeError": "same", "EngineInvariantError": "same", "MemoryError": "transient"}.get(error, "input")

    def fails_for_6(scenario, **kw):
        if scenario.workload.num_requests == 6:
            raise (getattr(errors, error, None) or getattr(builtins, error))("bad on purpose")
        return real(scenario, **kw)

    monkeypatch.setattr(study, "run", fails_for_6)
    f = tmp_path / "study.yaml"
    f.write_text(BASE + "sweep: {workload.num_requests: [5, 6]}\n")
    assert main(["run", str(f), "--out", str(tmp_path / "out"), "--quiet", "--jobs", "1"]) == 1
    got = capsys.readouterr()
    err = got.err
    assert "1 of 2 run(s) failed" in err and f"{error}: bad on purpose" in err, err
    assert "2 runs (1 failed) in" in got.out, got.out  # the closing line does not count it as done
    for _ in range(2):  # `run`, then `report`, which words it the same way
        assert ("retry" in err) == (kind == "transient"), err
        assert ("fix the input" in err) == (kind == "input"), err
        assert ("deterministic for its seed" in err) == (kind == "same"), err
        assert main(["report", str(tmp_path / "out" / "t")]) == 1
        err = capsys.readouterr().err
    page = (tmp_path / "out" / "t" / "report.html").read_text(encoding="utf-8")  # and so does the page
    assert ("<li><i>input</i> r" in page) == (kind == "input"), page[:2000]
    assert ("<li><i>same</i> r" in page) == (kind == "same"), page[:2000]


@pytest.mark.parametrize("sps, says", [
    ("1=1,2=5", "5.0x faster"),  # a 5x faster pass at twice the batch: the rule every profile obeys
    ("1=100,2=10", "10.0x slower"),  # 10x slower for twice the batch
])
def test_schedule_sps_passes_the_same_plausibility_rules_as_a_profile(capsys, sps, says):
    rc = main(["schedule", "0.9,0.8", "--sps", sps])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and err.startswith("error: --sps: B=2:") and says in err, err
    assert main(["schedule", "0.9,0.8", "--sps", "1=100,2=90,3=80,4=70"]) == 0  # a plausible one runs


def test_the_stated_trace_limits_are_exact(tmp_path):
    # ':g' printed 8.464985 as 8.46499: "8.46499 s is past ... allowed: <= 8.46499" contradicted itself
    import re as _re

    from memtp_sim.errors import ConfigError
    from memtp_sim.workload import load_trace, trace_replay_start
    trace = load_trace(_short_trace(tmp_path))
    last = float(trace.arrival_s[-1])
    just_past = float(np.nextafter(last, np.inf))
    with pytest.raises(ConfigError) as exc:
        trace_replay_start(trace, 1, just_past)
    allowed = float(_re.search(r"allowed: <= (\S+)$", str(exc.value)).group(1))
    assert allowed == last and just_past > allowed, str(exc.value)
    assert trace_replay_start(trace, 1, allowed) == len(trace) - 1  # the stated limit is accepted
    with pytest.raises(ConfigError, match=r"has only 1 request from"):
        trace_replay_start(trace, 2, allowed)


_INLINE_MEM = "{gpu_allocatable_gib: 117, weights_bytes: 4912898304, kv_bytes_per_token: 131072, max_model_len: 131072}"


@pytest.mark.parametrize("hardware, says", [
    # review: key 0 printed numpy's "RuntimeWarning: divide by zero" (and its source line) above the error
    (f"{{table: {{0: 24.0, 16: 58.7}}, memory: {_INLINE_MEM}}}", "row key 0, column batch_tokens: 0 is not a whole"),
    # a time so small that the plausibility ratios overflow: numpy's "overflow encountered"
    (f"{{table: {{1: 1.0e-320, 16: 58.7}}, memory: {_INLINE_MEM}}}", "is infx slower"),
    # a memory that holds more KV blocks than a run counts: an OverflowError traceback, or numpy's
    # "invalid value encountered in cast" from every round of the run
    ("{table: {1: 24.0, 16: 58.7}, memory: {gpu_allocatable_gib: 1.0e308, weights_bytes: 4912898304, "
     "kv_bytes_per_token: 131072, max_model_len: 131072}}", "gpu_allocatable_gib 1e+308 holds more than 2,147,483,647"),
    ("{table: {1: 24.0, 16: 58.7}, memory: {gpu_allocatable_gib: 117, weights_bytes: 4912898304, "
     "kv_bytes_per_token: 1, max_model_len: 131072}}", "kv_bytes_per_token 1 x kv_block_tokens 16"),
])
def test_bad_hardware_numbers_are_one_stderr_line_from_the_cli(tmp_path, hardware, says):
    # a real process: pytest would catch the warnings an in-process call prints
    import subprocess
    import sys
    study = tmp_path / "s.yaml"
    study.write_text(f"name: t\nbase:\n  workload: {{trace: {TRACE}, mode: closed_loop, concurrency: 1, "
                     f"num_requests: 2}}\n  hardware: {hardware}\n  policy: {{name: no_spec}}\nseeds: [0]\n")
    env = {**os.environ, "MEMTP_SIM_CACHE_DIR": str(tmp_path / "cache"), "PYTHONWARNINGS": "default"}
    p = subprocess.run([sys.executable, "-m", "memtp_sim", "run", str(study), "--out", str(tmp_path / "out")],
                       capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    err = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(err) == 1, p.stderr
    assert err[0].startswith(f"error: {study}: base.hardware.table: ") and says in err[0], err[0]


def test_check_curve_validates_before_it_divides():
    import warnings

    from memtp_sim.errors import CalibrationError
    from memtp_sim.hardware.profile import check_curve
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a numpy RuntimeWarning fails the test
        for b, t, says in (([0, 16], [24.0, 58.7], "B=0: batch size 0 is not a whole number >= 1"),
                           ([1, 16], [0.0, 58.7], "B=1: pass time 0.0 ms is not a finite number > 0"),
                           ([4, 2], [1.0, 1.0], "B=2: batch size 2 does not follow 4"),
                           ([1, 4], [24.0, 1e-320], "is infx faster")):
            with pytest.raises(CalibrationError, match=says):
                check_curve(np.array(b), np.array(t), where="x")
        with pytest.raises(CalibrationError, match=r"^f.csv: row 3, column pass_ms: pass time nan ms"):
            check_curve(np.array([1, 2]), np.array([1.0, np.nan]), where="f.csv", rows=["2", "3"], column="pass_ms")


def test_a_cost_table_time_that_is_not_finite_names_its_row(tmp_path):
    from memtp_sim.errors import CalibrationError
    from memtp_sim.hardware.tables import read_cost_table
    f = tmp_path / "c.csv"
    f.write_text("kind,model,batch_tokens,num_requests,tokens_per_request,context_tokens,pass_ms,p10_ms,p90_ms,source\n"
                 "verify,m,1,1,1,0,10.0,,,a\nverify,m,2,1,2,0,inf,,,b\n")
    with pytest.raises(CalibrationError, match=r"c.csv: row 3, column pass_ms: 'inf' is not a finite positive number"):
        read_cost_table(f)


def test_a_long_list_of_failed_runs_says_how_many_it_leaves_out(capsys):
    # a fresh user's report: 15 failed runs printed 10 lines and nothing about the other 5
    from memtp_sim.cli import _print_failed

    failed = {f"r{i:02d}": "MemoryError: " for i in range(15)} | {"rbad": "ConfigError: trace.csv: gone"}
    _print_failed(failed, 20, "run the same command again")
    err = capsys.readouterr().err
    assert "16 of 20 run(s) failed" in err and "r09: MemoryError" in err and "r10:" not in err, err
    assert "  ... and 5 more (each with its failed.json under runs/)" in err, err
    assert err.count("... and") == 1 and "1 failed on their input" in err, err  # the short group: no such line


@pytest.mark.parametrize("text, needles", [
    # an unclosed flow mapping: where the parser stopped, what it expected, and where the mapping began
    # (libyaml's and PyYAML's own parser word the problem differently: the needles hold for both)
    # (where the mapping opened comes first: the mistake is there, and the parser finds it a line on)
    ("name: t\npolicies:\n  - {name: mtp1\nseeds: [0]\n", [
        "not valid YAML while parsing a flow mapping at line 3, column 5: ", "expected ',' or '}'", " at line 4, column "]),
    ("name: t\n\tseeds: [0]\n", ["at line 2, column 1: found "]),  # a tab
    ("name: a: b\n", ["at line 1, column 8", "mapping values are not allowed"]),
])
def test_a_yaml_syntax_error_says_what_and_where(tmp_path, capsys, text, needles):
    # fresh user: "not valid YAML at line 38" gave neither the parser's reason nor the column, and the
    # mistake was on the line before (where the mapping opened)
    study = tmp_path / "s.yaml"
    study.write_text(text)
    _one_line_exit_2(["run", str(study), "--out", str(tmp_path / "out")], capsys, f"{study}: not valid YAML",
                     *needles)


@pytest.mark.parametrize("text, needles", [
    # review: these came out as tracebacks (exit 1): datetime's and the unique-key check's own errors
    ("a: 2020-13-45\n", ["at line 1, column 4: '2020-13-45' is not a date (month must be in 1..12)"]),
    ("2020-02-30: 1\n", ["at line 1, column 1: '2020-02-30' is not a date"]),
    ("? [1, 2]\n: 3\n", ["at line 1, column 3: found unhashable key (while constructing a mapping at line 1"]),
    ("a: 'never closed\nb: 1\n", ["not valid YAML while scanning a quoted scalar at line 1, column 4: "]),
    ("{[1]: 2}\n", ["found unhashable key"]),
    ("a: b\x00c\n", ["not valid YAML: unacceptable character #x0000"]),  # (the reader's own words, once lost)
    ("a: 1\na: 2\n", ["at line 2, column 1: key 'a' is given twice"]),
    ("a: !foo 1\n", ["at line 1, column 4: could not determine a constructor for the tag '!foo'"]),
])
def test_yaml_the_parser_reads_but_cannot_build_is_one_line(tmp_path, capsys, text, needles):
    study = tmp_path / "s.yaml"
    study.write_text(text)
    _one_line_exit_2(["run", str(study), "--out", str(tmp_path / "out")], capsys, f"{study}: not valid YAML",
                     *needles)


def test_load_yaml_turns_what_a_constructor_raises_into_a_yaml_error(monkeypatch):
    # nesting deeper than Python's stack (PyYAML's own parser; libyaml stops at 1,000 levels with a
    # marked error) and any other constructor's ValueError or TypeError: every caller catches YAMLError
    import yaml

    from memtp_sim._io import load_yaml, yaml_error_text

    for raised, words in ((RecursionError("deep"), "nested too deeply"), (ValueError("bad value"), "bad value"),
                          (TypeError("bad type"), "bad type")):
        def boom(*_a, raised=raised, **_k):
            raise raised
        monkeypatch.setattr(yaml, "load", boom)
        with pytest.raises(yaml.YAMLError) as e:
            load_yaml("a: 1")
        assert yaml_error_text(e.value) == f"not valid YAML: {words}"


def test_a_yaml_syntax_error_in_a_profile_or_a_cost_table_says_what_and_where(tmp_path):
    # the same words wherever a YAML file is read (they said only the error's class name there)
    from memtp_sim.errors import CalibrationError
    from memtp_sim.hardware import load_profile
    from memtp_sim.hardware.importers import import_measurements

    bad = tmp_path / "p.yaml"
    bad.write_text("name: x\nverify: {b: [1, 2\n")
    for read in (lambda: load_profile(bad), lambda: import_measurements(bad, "table")):
        with pytest.raises(CalibrationError) as e:
            read()
        assert f"{bad}: not valid YAML while parsing a flow" in str(e.value)
        assert str(e.value).endswith(" at line 3, column 1") and "\n" not in str(e.value)


def test_report_on_a_missing_folder_or_on_the_folder_above_the_studies(tmp_path, capsys):
    # fresh user: a path that does not exist was told "no study.json here"; results/ itself named
    # none of the studies inside it
    _one_line_exit_2(["report", str(tmp_path / "nope")], capsys, f"{tmp_path / 'nope'}: no such folder")
    for name in ("load", "memtp"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "study.json").write_text("{}")
    _one_line_exit_2(["report", str(tmp_path)], capsys, "not a study folder, but it holds 2:",
                     str(tmp_path / "load"), str(tmp_path / "memtp"), "report one of them")
    (tmp_path / "memtp" / "study.json").unlink()
    _one_line_exit_2(["report", str(tmp_path)], capsys, f"holds one: {tmp_path / 'load'}; report that")
    (tmp_path / "notes.txt").write_text("x")
    _one_line_exit_2(["report", str(tmp_path / "notes.txt")], capsys, "notes.txt: a file; report takes the folder")
    (tmp_path / "load" / "runs" / "r1").mkdir(parents=True)  # (fresh user: runs/ said "run one first")
    for inner in ("runs", "runs/r1"):
        _one_line_exit_2(["report", str(tmp_path / "load" / inner)], capsys,
                         f"inside the study folder {(tmp_path / 'load').resolve()}; report that")
    (tmp_path / "tune").mkdir()
    (tmp_path / "tune" / "optuna.db").write_bytes(b"")
    _one_line_exit_2(["report", str(tmp_path / "tune")], capsys, "a tuning study's folder, not a study's",
                     "Tuning page", "export")


def test_the_dashboards_study_page_says_what_a_folder_is_not_to_rebuild_it(tmp_path):
    # fresh user: /etc or results/tune on the Study page said "study.json is missing or unreadable
    # (FileNotFoundError); run the study again to rebuild it"
    from memtp_sim.errors import ConfigError
    from memtp_sim.report import load_results

    (tmp_path / "tune").mkdir()
    (tmp_path / "tune" / "validation.json").write_text("{}")
    for folder, says in ((tmp_path, "no study.json here; this is not a study folder"),
                         (tmp_path / "tune", "a tuning study's folder"), (tmp_path / "gone", "no such folder")):
        with pytest.raises(ConfigError) as e:
            load_results(folder)
        assert says in str(e.value) and "rebuild" not in str(e.value)


@pytest.mark.parametrize("given, needles", [
    # fresh user: a scenario said "missing field 'measurements'", a CSV "expected a mapping at the top level"
    (REPO / "scenarios" / "h200-colocated.yaml", ["this is a scenario, not a hardware profile", "capacity"]),
    (REPO / "studies" / "load.yaml", ["this is a study, not a hardware profile", "memtp_sim run"]),
    (REPO / "calibration" / "gfx1151" / "measurements.csv",
     ["not a hardware profile (a YAML file)", "calibrate import", "--format"]),
])
def test_calibrate_check_given_another_kind_of_file_says_what_it_is(capsys, given, needles):
    _one_line_exit_2(["calibrate", "check", str(given), "--out", "/nonexistent-never-written"], capsys, *needles)

"""Bad input through the command line: exit code 2, one line on stderr naming the file and the field,
no traceback. Study YAMLs are written into tmp_path in the shape of studies/load.yaml."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from _sim_helpers import REPO, TRACE
from memtp_sim.cli import main
from memtp_sim.config import load_study
from memtp_sim.errors import ConfigError


def _study_doc() -> dict:
    return {
        "name": "tiny",
        "description": "CLI error tests",
        "base": {
            "hardware": {"profile": "gfx1151-llama31-8b-q4km-vulkan"},
            "acceptance": {"profile": "dspark-qwen3", "domain_mix": {"chat": 1.0}},
            "workload": {"trace": str(TRACE), "mode": "closed_loop", "concurrency": 2, "num_requests": 10},
            "engine": {"max_batch_tokens": 512, "prefill_chunk_tokens": 256, "prefill": "disaggregated",
                       "prefill_gpus": 4},
            "policy": {"name": "dspark"},
        },
        "sweep": {"workload.concurrency": [1, 2]},
        "policies": [{"name": "mtp1"}, {"name": "dspark", "gamma": 7}],
        "seeds": [0],
    }


def _write(tmp_path, doc, name="study.yaml"):
    p = tmp_path / name
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    return p


def _run_cli(capsys, tmp_path, path):
    rc = main(["run", str(path), "--out", str(tmp_path / "results"), "--quiet", "--jobs", "1"])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def _assert_one_line_error(rc, err, *must_contain):
    assert rc == 2
    assert "Traceback" not in err
    lines = err.strip("\n").split("\n")
    assert len(lines) == 1, err
    for s in must_contain:
        assert s in lines[0], (s, lines[0])


def test_valid_study_validates(tmp_path):
    study = load_study(_write(tmp_path, _study_doc()))
    assert study.name == "tiny"
    assert len(study.expand()) == 4  # 2 concurrencies x 2 policies x 1 seed


def _mutate(path_keys, value):
    def f(doc):
        node = doc
        for k in path_keys[:-1]:
            node = node[k]
        node[path_keys[-1]] = value
        return doc
    return f


def _poisson_negative(doc):
    wl = doc["base"]["workload"]
    wl.pop("concurrency")
    wl["mode"] = "poisson"
    wl["rate_per_s"] = -1
    doc["sweep"] = {}
    return doc


def _del(path_keys):
    def f(doc):
        node = doc
        for k in path_keys[:-1]:
            node = node[k]
        del node[path_keys[-1]]
        return doc
    return f


BAD_STUDIES = [
    pytest.param(_mutate(["base", "workload", "bogus"], 1), ["base.workload.bogus"], id="unknown-key"),
    pytest.param(_mutate(["base", "engine", "turbo"], True), ["base.engine.turbo"], id="unknown-engine-key"),
    pytest.param(_mutate(["base", "workload", "num_requests"], "many"), ["base.workload.num_requests"],
                 id="wrong-type"),
    pytest.param(_mutate(["base", "engine", "prefill_gpus"], [4]), ["base.engine.prefill_gpus"],
                 id="wrong-type-list"),
    pytest.param(_poisson_negative, ["base.workload.rate_per_s"], id="negative-rate"),
    pytest.param(_mutate(["base", "workload", "trace"], "/nonexistent/trace.csv"), ["base.workload.trace"],
                 id="missing-trace"),
    pytest.param(_mutate(["base", "policy"], {"name": "nosuch"}), ["base.policy", "nosuch"],
                 id="unknown-policy-base"),
    pytest.param(_mutate(["policies"], [{"name": "mtp1"}, {"name": "nosuch"}]), ["policies.1", "nosuch"],
                 id="unknown-policy-list"),
    pytest.param(_mutate(["policies"], [{"name": "dspark", "gama": 3}]), ["policies.0", "gama"],
                 id="unknown-policy-param"),
    pytest.param(_mutate(["policies"], [{"name": "static", "k": 0}]), ["policies.0", "k"],
                 id="policy-param-out-of-range"),
    pytest.param(_mutate(["sweep"], {"workload.nope": [1, 2]}), ["workload.nope"], id="unknown-sweep-key"),
    pytest.param(_mutate(["sweep"], {"workload.concurrency": [1, 0]}), ["workload.concurrency"],
                 id="bad-sweep-value"),
    pytest.param(_mutate(["base", "acceptance", "domain_mix"], {"poetry": 1.0}), ["base.acceptance", "poetry"],
                 id="unknown-domain"),
    pytest.param(_mutate(["base", "engine", "max_batch_tokens"], 1024), ["base", "max_batch_tokens"],
                 id="beyond-measured-B"),
    pytest.param(_mutate(["seeds"], ["zero"]), ["seeds.0"], id="bad-seed"),
    pytest.param(_del(["base", "workload", "trace"]), ["base.workload.trace"], id="missing-required"),
]


@pytest.mark.parametrize("mutate,fields", BAD_STUDIES)
def test_bad_study_one_line_exit_2(tmp_path, capsys, mutate, fields):
    path = _write(tmp_path, mutate(_study_doc()))
    rc, out, err = _run_cli(capsys, tmp_path, path)
    _assert_one_line_error(rc, err, str(path), *fields)
    assert not (tmp_path / "results").exists()  # nothing ran


@pytest.mark.parametrize("mutate,fields", BAD_STUDIES[:3])
def test_load_study_raises_config_error(tmp_path, mutate, fields):
    path = _write(tmp_path, mutate(_study_doc()))
    with pytest.raises(ConfigError) as ei:
        load_study(path)
    assert str(path) in str(ei.value)
    assert fields[0] in str(ei.value)


def test_missing_yaml_file(tmp_path, capsys):
    path = tmp_path / "does_not_exist.yaml"
    rc, out, err = _run_cli(capsys, tmp_path, path)
    _assert_one_line_error(rc, err, str(path), "not found")


@pytest.mark.parametrize("text", ["name: x\nbase: [1, 2\n  foo: }\n", "name: x\nbase:\n  workload: {trace: a\n",
                                  "name: x\n\tbase: 1\n"])
def test_invalid_yaml(tmp_path, capsys, text):
    path = tmp_path / "broken.yaml"
    path.write_text(text)
    rc, out, err = _run_cli(capsys, tmp_path, path)
    _assert_one_line_error(rc, err, str(path), "YAML")


@pytest.mark.parametrize("text", ["", "- just\n- a list\n", "42\n"])
def test_yaml_not_a_mapping(tmp_path, capsys, text):
    path = tmp_path / "odd.yaml"
    path.write_text(text)
    rc, out, err = _run_cli(capsys, tmp_path, path)
    _assert_one_line_error(rc, err, str(path))


def test_non_utf8_yaml(tmp_path, capsys):
    path = tmp_path / "binary.yaml"
    path.write_bytes(b"\xff\xfe\x00name: x\n")
    rc, out, err = _run_cli(capsys, tmp_path, path)
    _assert_one_line_error(rc, err, str(path))


def test_trace_that_is_not_a_trace_is_caught_at_validation(tmp_path, capsys):
    bogus = tmp_path / "not_a_trace.csv"
    bogus.write_text("a,b\n1,2\n")
    path = _write(tmp_path, _mutate(["base", "workload", "trace"], str(bogus))(_study_doc()))
    rc, out, err = _run_cli(capsys, tmp_path, path)
    _assert_one_line_error(rc, err, str(path), "base.workload.trace")


def test_cli_subprocess_negative_rate(tmp_path):
    # the real entry point: python -m memtp_sim run <yaml>
    path = _write(tmp_path, _poisson_negative(_study_doc()))
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-m", "memtp_sim", "run", str(path), "--out", str(tmp_path / "out")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip("\n").split("\n")
    assert len(lines) == 1, proc.stderr
    assert str(path) in lines[0] and "base.workload.rate_per_s" in lines[0]


def test_schedule_command_appendix_a(capsys):
    assert main(["schedule", "0.8,0.9", "--sps", "1=1.0,2=0.5,3=0.45"]) == 0
    assert "lengths=[0]" in capsys.readouterr().out
    assert main(["schedule", "0.8,0.9", "--sps", "1=1.0,2=0.5,3=0.45", "--global-search"]) == 0
    out = capsys.readouterr().out
    assert "lengths=[2]" in out and "batch_tokens=3" in out


def test_schedule_command_bad_confidence(capsys):
    rc = main(["schedule", "0.8,1.5", "--sps", "1=1.0,2=0.5,3=0.45"])
    err = capsys.readouterr().err
    _assert_one_line_error(rc, err, "confidences")


def test_eta_is_elapsed_plus_what_remains_at_the_pace_after_the_first_run():
    from memtp_sim.cli import _eta

    assert _eta(30.0, 10, 112, first_done_s=3.0) == "30 s, about 5 min left"   # (30 - 3) / 9 x 102 = 306 s
    assert _eta(600.0, 10, 112, first_done_s=60.0) == "10 min, about 1.7 h left"  # 60 s a run x 102
    # fresh user: the first run carries the start-up (6 s study, "about 3 min left" after it)
    assert _eta(1.0, 1, 112, first_done_s=1.0) == "1 s"
    assert _eta(1.5, 3, 112, first_done_s=1.0) == "2 s, about 27 s left"  # 0.25 s a run x 109
    # resumed: 23 runs reused took no time; the pace is that of the 7 computed
    assert _eta(10.0, 30, 112, reused=23, first_done_s=4.0) == "10 s, about 82 s left"
    assert _eta(3.0, 112, 112, first_done_s=1.0) == "3 s" and _eta(100.0, 0, 10) == "2 min"  # done, or nothing to go on


def test_run_without_a_terminal_prints_one_progress_line_per_run_with_its_eta(tmp_path, capsys):
    import re

    from _sim_helpers import tiny_study_doc

    f = tmp_path / "tiny.yaml"
    f.write_text(yaml.safe_dump(tiny_study_doc()))
    assert main(["run", str(f), "--out", str(tmp_path / "out"), "--jobs", "1"]) == 0
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("  [")]
    pat = re.compile(r"  \[(\d+)/4\] \S+ \((\d+ s)(, about \d+ (s|min|h) left)?\)$")
    got = [pat.match(ln) for ln in lines]
    assert len(lines) == 4 and all(got), lines
    assert [int(m.group(1)) for m in got] == [1, 2, 3, 4]
    # the first run: no pace yet; the last: nothing left
    assert got[0].group(3) is None and got[-1].group(3) is None and all(m.group(3) for m in got[1:-1])

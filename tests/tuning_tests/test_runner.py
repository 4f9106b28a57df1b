"""Running a study (memtp_sim.tuning._runner): a known-answer calibration oracle, the export hint
the tune command prints, and Ctrl-C in process and with worker processes."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from memtp_sim.cli import main
from memtp_sim.tuning import parse_tune_spec, run_tune

import _boom

from ._helpers import _trials, _write, cli_env, held_doc, tiny_doc

optuna.logging.set_verbosity(optuna.logging.WARNING)


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
    hold = tmp_path / "hold"
    hold.mkdir()
    doc = held_doc(name, hold)  # each trial's runs wait until released
    path = _write(tmp_path, doc)
    url = f"sqlite:///{tmp_path / 'sig.db'}"
    # 200 trials: the Ctrl-C must land mid-study (fast trials could otherwise all finish first and exit 0)
    args = ["tune", str(path), "--storage", url, "--n-trials", "200", "--workers", "2", "--no-validate", "--quiet"]
    proc = subprocess.Popen([sys.executable, "-m", "memtp_sim", *args], cwd=tmp_path, env=cli_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    # both workers held inside a trial; released just before the Ctrl-C (a held worker would finish
    # its trial only after the hold's time limit), so both are mid-study when it lands
    _boom.wait_started(hold, 2, alive=lambda: proc.poll() is None)
    (hold / "release").touch()
    os.killpg(proc.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "Error" not in err, err
    assert err.strip().splitlines() == ["interrupted: finished trials are kept; run the same command again to resume"]
    trials = _trials(url, name)
    assert not [t for t in trials if t.state == TrialState.RUNNING]  # the workers stopped, not killed
    for t in trials:
        if t.state == TrialState.FAIL:
            assert "interrupted" in t.user_attrs["failed_reason"]
    done = sum(t.state == TrialState.COMPLETE for t in trials)
    out = run_tune(parse_tune_spec(doc), storage_url=url, n_trials=done + 1, out_dir=tmp_path, validate=False,
                   report=False)  # resumes: one more COMPLETE trial, nothing stale to clean up
    assert out.complete == done + 1 and out.ran == 1 and not out.short and out.stale_failed == []

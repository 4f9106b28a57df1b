"""Noise (memtp_sim.tuning._evaluation, ._validation): common random numbers, the t interval, and
fresh-seed validation of the top trials."""

from __future__ import annotations

import math

import numpy as np
import optuna
import pytest

from memtp_sim.tuning import parse_tune_spec, run_tune, t_confidence_interval, validate_trials

from ._helpers import tiny_doc

optuna.logging.set_verbosity(optuna.logging.WARNING)


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

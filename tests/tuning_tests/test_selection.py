"""Selection (memtp_sim.tuning._selection): infeasible trials stay in the study but off the front;
failed constraints are named with by how much."""

from __future__ import annotations

import numpy as np
import optuna

from memtp_sim.tuning import constraint_failures, parse_tune_spec, run_tune

from ._helpers import tiny_doc

optuna.logging.set_verbosity(optuna.logging.WARNING)


def test_infeasible_trials_kept_but_not_on_front(tmp_path):
    spec = parse_tune_spec(tiny_doc("infeas", constraints=["num_completed >= 1000"]))
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

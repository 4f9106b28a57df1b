"""Parameter importances (memtp_sim.tuning._importances) for the objective's good direction."""

from __future__ import annotations

import math

import optuna
import pytest

from memtp_sim.tuning import importance_figure, param_importances

optuna.logging.set_verbosity(optuna.logging.WARNING)


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

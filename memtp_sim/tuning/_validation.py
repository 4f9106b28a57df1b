"""Fresh-seed validation: re-run chosen trials on seeds the tuner never saw, with t intervals.

After tuning, the top ``validation.top_k`` trials (feasible Pareto trials, best ``export.best_by``
first) are re-run on *fresh* seeds (never in ``seeds``) and reported with a t-distribution 95%
confidence interval over those replicates (:func:`t_confidence_interval`); the result is stored in
the study's user attribute ``validation`` and in ``results/<name>/validation.json``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .._io import atomic_write_text
from ._evaluation import evaluate
from ._space import scenario_for
from ._spec import TuneSpec

if TYPE_CHECKING:  # pragma: no cover
    import optuna

__all__ = ["t_confidence_interval", "validate_trials"]


def t_confidence_interval(values: Sequence[float], level: float = 0.95) -> dict[str, Any]:
    """Mean and two-sided t-distribution confidence interval over replicates.

    ``mean ± t_{(1+level)/2, n-1} · s / sqrt(n)``, ``s`` the sample standard deviation (ddof 1).

    Args:
        values: replicate values, length ``n`` (NaN ones are dropped).
        level: confidence level in (0, 1).

    Returns:
        ``{"mean", "sd", "n", "half_width", "low", "high", "level", "values"}``; the interval is
        NaN when fewer than two finite values remain. ``values`` is the input, NaNs included.

    Source:
        Student's t interval for a mean with unknown variance (e.g. NIST/SEMATECH
        e-Handbook of Statistical Methods, section 7.2.2.1); quantile from ``scipy.stats.t.ppf``.
    """
    arr = np.asarray([float(v) for v in values], dtype=np.float64)
    finite = arr[np.isfinite(arr)]
    n = int(finite.size)
    mean = float(finite.mean()) if n else float("nan")
    if n >= 2:
        from scipy import stats  # lazy: 0.7 s to import, which every tune and export command paid at start

        sd = float(finite.std(ddof=1))
        half = float(stats.t.ppf(0.5 + level / 2.0, n - 1)) * sd / math.sqrt(n)
    else:
        sd, half = float("nan"), float("nan")
    return {"mean": mean, "sd": sd, "n": n, "half_width": half, "low": mean - half, "high": mean + half,
            "level": level, "values": arr.tolist()}


def validate_trials(study: optuna.Study, spec: TuneSpec, numbers: Sequence[int], *,
                    out_dir: str | Path | None = "results") -> dict[int, dict[str, Any]]:
    """Re-run trials on fresh seeds and record confidence intervals.

    For each trial the scenario is rebuilt from ``trial.params`` and run on ``spec.fresh_seeds``
    (disjoint from the tuning seeds); every tracked metric gets :func:`t_confidence_interval`, and
    the constraints are re-checked on the fresh means. The records are merged into the study's
    user attribute ``validation`` and written to ``<out_dir>/<name>/validation.json``.

    Args:
        study: the study.
        spec: its tune spec.
        numbers: trial numbers (COMPLETE trials).
        out_dir: results folder, or None for no JSON file.

    Returns:
        ``{trial number: {"trial", "params", "seeds", "metrics": {metric: CI dict}, "feasible",
        "constraint_values", "method"}}`` for the given trials.

    Raises:
        KeyError: a number that is not a trial of the study.
        ConfigError: a trial's parameters make an invalid scenario.

    Source:
        Student's t intervals (:func:`t_confidence_interval`) over fresh-seed replicates; fresh
        seeds guard against selecting on the tuning seeds' noise (the winner's curse of a
        maximum over noisy trials).
    """
    fresh = spec.fresh_seeds
    by_num = {t.number: t for t in study.get_trials(deepcopy=False)}
    out: dict[int, dict[str, Any]] = {}
    for num in numbers:
        t = by_num[num]
        ev = evaluate(scenario_for(spec, t.params), fresh, spec.tracked_metrics, capacity=spec.capacity)
        cis = {m: t_confidence_interval(v, spec.validation.confidence) for m, v in ev["replicates"].items()}
        cons = [c.violation(ev["means"].get(c.metric, float("nan"))) for c in spec.constraints]
        out[num] = {"trial": num, "params": dict(t.params), "seeds": fresh, "metrics": cis,
                    "constraint_values": cons, "feasible": bool(all(v <= 0 for v in cons)),
                    "method": f"t-distribution {spec.validation.confidence:.0%} CI over {len(fresh)} "
                              "fresh-seed replicates"}
    stored = dict(study.user_attrs.get("validation", {}))
    stored.update({str(k): v for k, v in out.items()})
    study.set_user_attr("validation", stored)
    if out_dir is not None:
        doc = {"study": spec.name, "tuning_seeds": list(spec.seeds), "fresh_seeds": fresh,
               "objectives": [o.model_dump() for o in spec.objectives],
               "constraints": [c.label for c in spec.constraints], "trials": stored}
        atomic_write_text(Path(out_dir) / spec.name / "validation.json", json.dumps(doc, indent=2, allow_nan=True))
    return out

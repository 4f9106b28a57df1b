"""The public names the issues promise are importable from the package root."""

import re

import numpy as np
import pytest

import memtp_sim


def test_every_public_name_exists():
    for name in memtp_sim.__all__:
        assert hasattr(memtp_sim, name), name


def test_promised_entry_points():
    from memtp_sim import (  # noqa: F401
        analytical_acceptance,
        expected_calibration_error,
        hardware_aware_prefix_scheduler,
        memtp_depth,
        memtp_depth_live,
        sequential_temperature_scaling,
    )

    # hand cases: Leviathan acceptance 1 - 0.5 * |(0.5,0.5) - (0.7,0.3)|_1 = 0.8; docs/model.md section 2
    assert abs(analytical_acceptance((0.5, 0.5), (0.7, 0.3)) - 0.8) < 1e-12
    assert memtp_depth(21.49, 1.0) == 5 and memtp_depth(21.49, 0.3) == 1


def test_metric_names_list_every_scalar_metric():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from _sim_helpers import scenario

    from memtp_sim.metrics import METRIC_NAMES

    res = memtp_sim.run(scenario(policy={"name": "dspark"}, workload={"num_requests": 20}), seed=0)
    scalars = {k for k, v in res.metrics.items() if not isinstance(v, dict)}
    assert scalars == set(METRIC_NAMES)


def test_import_and_help_load_no_heavy_dependency():
    """``import memtp_sim`` and ``python -m memtp_sim --help`` load none of the libraries that make
    a cold start slow (issue 13: import < 0.3 s); the first access to a public name loads its
    submodule, and the names are the same objects as the submodules'."""
    import json
    import subprocess
    import sys

    heavy = ["pydantic", "scipy", "pandas", "optuna", "simpy", "plotly", "dash"]
    code = f"import sys, json, memtp_sim; print(json.dumps(sorted(set({heavy!r}) & set(sys.modules))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []
    code = ("import sys, json, runpy\nsys.argv = ['memtp_sim', '--help']\ntry:\n    runpy.run_module('memtp_sim', "
            f"run_name='__main__')\nexcept SystemExit:\n    pass\nprint(json.dumps(sorted(set({heavy!r}) & set(sys.modules))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.splitlines()[-1]) == []
    import memtp_sim
    from memtp_sim.policies import dspark

    assert memtp_sim.hardware_aware_prefix_scheduler is dspark.hardware_aware_prefix_scheduler
    assert set(memtp_sim.__all__) <= set(dir(memtp_sim))
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        memtp_sim.not_a_name  # noqa: B018


def test_the_tuning_package_loads_neither_scipy_nor_optuna():
    """``tune`` and ``export`` validate their input before anything needs scipy or optuna: the
    tuning package imported scipy.stats at its top (0.7 s), so a typo in a tune spec took 1.9 s to
    report (fresh user), and every export paid it."""
    import json
    import subprocess
    import sys

    code = ("import sys, json, memtp_sim.tuning; "
            "print(json.dumps(sorted(m for m in ('scipy', 'optuna') if m in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []
    from memtp_sim.tuning import t_confidence_interval

    assert t_confidence_interval([1.0, 3.0])["half_width"] == pytest.approx(12.706204736 * 1.0)  # t(0.975, 1) s/sqrt(2)


def test_every_submodule_is_an_attribute_after_a_bare_import():
    """``import memtp_sim`` then ``memtp_sim.<submodule>.X`` works for every public submodule (the docs
    write ``memtp_sim.metrics.METRIC_NAMES``), whatever was touched first: the lazy loader
    resolves submodules as well as public names."""
    import json
    import pkgutil
    import subprocess
    import sys

    # public submodules (private ones may need optional packages: _measure_torch needs torch)
    names = sorted(m.name for m in pkgutil.iter_modules(memtp_sim.__path__) if not m.name.startswith("_"))
    code = ("import json, sys, memtp_sim\nok = []\nfor n in sys.argv[1:]:\n    ok.append(getattr(memtp_sim, n)"
            ".__name__)\nprint(json.dumps(ok))")
    out = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == [f"memtp_sim.{n}" for n in names]


def test_the_cli_says_its_version():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "memtp_sim", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.split()[-1] == memtp_sim.__version__


@pytest.mark.parametrize("seed, shown", [(None, "None"), (-1, "-1"), ("0", "'0'"), (True, "True"), (1.0, "1.0"),
                                         (np.bool_(True), "True")])
def test_run_takes_the_seeds_a_study_takes(seed, shown):
    # run(seed="0") ran seed 0 and run(seed=True) seed 1, which a study YAML refuses; None and -1
    # ended in numpy tracebacks
    from memtp_sim.errors import InvalidArgumentError
    with pytest.raises(InvalidArgumentError, match=rf"^seed: expected an integer >= 0 .*got {re.escape(shown)}$"):
        memtp_sim.run(_small_scenario(), seed=seed)


def test_run_takes_numpy_integer_seeds_as_the_same_seed():
    a = memtp_sim.run(_small_scenario(), seed=np.int64(3)).metrics
    b = memtp_sim.run(_small_scenario(), seed=3).metrics
    assert a["output_tokens_total"] == b["output_tokens_total"] and a["makespan_s"] == b["makespan_s"]


def test_run_refuses_a_plain_dict_for_a_scenario():
    from memtp_sim.errors import InvalidArgumentError
    with pytest.raises(InvalidArgumentError, match=r"^scenario: expected a memtp_sim.config.Scenario .*got dict$"):
        memtp_sim.run({"workload": {"num_requests": 4}})


def _small_scenario():
    from _sim_helpers import scenario
    return scenario(workload={"concurrency": 1, "num_requests": 4}, policy={"name": "no_spec"})

"""Loading a tune YAML (memtp_sim.tuning._loading): bad tune YAML is one line naming the file and
the field (exit 2), impossible pair rules and unknown metrics are refused, errors found after
loading name the file too."""

from __future__ import annotations

import numpy as np
import optuna
import pytest

from memtp_sim.cli import main
from memtp_sim.errors import ConfigError
from memtp_sim.tuning import open_storage, open_study, parse_tune_spec, scenario_for

from ._helpers import _assert_one_line_error, _write, tiny_doc

optuna.logging.set_verbosity(optuna.logging.WARNING)


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
    _assert_one_line_error(rc, capsys.readouterr().err, "(its search_space differs)", "new name",
                           starts=f"error: {path}: search_space: ")
    spec = parse_tune_spec(tiny_doc(), source="my.yaml")
    with pytest.raises(ConfigError) as e:  # numpy scalars (what a sampler might hand over) are written plainly
        scenario_for(spec, {"confidence.temperature": np.float64(-1.5), "policy.gamma": np.int64(2)})
    assert str(e.value).startswith("my.yaml: search_space: invalid scenario at "
                                   "(confidence.temperature=-1.5, policy.gamma=2): "), str(e.value)


def _param_pairs() -> list[tuple[str, str, str]]:
    """(parameter, a policy that takes it, a policy that does not), over every registered policy."""
    from memtp_sim.policies.registry import available_policies, policy_class

    fields = {n: set(policy_class(n).Params.model_fields) for n in available_policies()}
    return sorted({(p, a, b) for a in fields for p in fields[a] for b in fields if p not in fields[b]})


@pytest.mark.parametrize("param, taker, other", _param_pairs())
def test_a_policy_parameter_tuned_across_policies_suggests_the_when_that_fixes_it(param, taker, other):
    # the kind: policy.name categorical over policies of which some lack the tuned parameter
    doc = tiny_doc()
    doc["search_space"] = {"policy.name": {"type": "categorical", "choices": [taker, other]},
                           f"policy.{param}": {"type": "float", "low": 0.1, "high": 0.9}}
    with pytest.raises(ConfigError) as exc:
        parse_tune_spec(doc, source="t.yaml")
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith(f"t.yaml: search_space.policy.{param}: "), msg
    assert f"unknown parameter of policy {other!r}" in msg and f"when: {{policy.name: {taker}}}" in msg, msg
    doc["search_space"][f"policy.{param}"]["when"] = {"policy.name": taker}  # what the message says to add
    try:
        parse_tune_spec(doc, source="t.yaml")
    except ConfigError as e:  # a later check (e.g. a float range for an int parameter) may still refuse it
        assert "unknown parameter of policy" not in str(e), str(e)


def test_the_when_suggestion_on_the_reported_case(tmp_path, capsys):
    doc = tiny_doc()
    doc["search_space"]["policy.name"] = {"type": "categorical", "choices": ["dspark", "no_spec"]}
    rc = main(["tune", str(_write(tmp_path, doc)), "--out", str(tmp_path)])
    _assert_one_line_error(rc, capsys.readouterr().err, "search_space.policy.gamma",
                           "unknown parameter of policy 'no_spec'", "add `when: {policy.name: dspark}`")
    doc["search_space"]["policy.gamma"]["when"] = {"policy.name": "dspark"}
    assert parse_tune_spec(doc).search_space["policy.gamma"].when == {"policy.name": "dspark"}

"""How a study expands into runs when its settings apply to some runs only (a fresh user's review):

* a sweep or variant of ``policy.<param>`` over a policies list with baselines that lack the
  parameter applies to the policies that have it; the others run once, their label for the key
  empty (it was refused: ``policy.gamma: unknown parameter of policy 'no_spec'``);
* one policy written two ways (``{name: dspark}`` and ``{name: dspark, gamma: 7}``, the default)
  is refused as a duplicate, as the same entry written twice is;
* an error names the field the user wrote (``memtp.max_depth``), not the one derived from it
  (the policy's ``gamma``);
* ``report_x`` in a study without a sweep says so instead of listing nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from memtp_sim.capacity import load_capacity_scenarios
from memtp_sim.cli import main
from memtp_sim.config import load_scenario, load_study
from memtp_sim.errors import ConfigError
from memtp_sim.report import load_results
from memtp_sim.report import numbers
from memtp_sim.report._results import StudyResults
from memtp_sim.study import plan_runs

REPO = Path(__file__).resolve().parents[1]
TRACE = REPO / "data" / "traces" / "azure2023_conv.csv"
_WL = {"trace": str(TRACE), "mode": "closed_loop", "concurrency": 2, "num_requests": 4}
#: studies/load.yaml's policies, DSpark without its gamma (default 7) so that a sweep sets it.
_LOAD_POLICIES = [{"name": "no_spec"}, {"name": "mtp1"}, {"name": "static", "k": 5},
                  {"name": "dspark", "early_stop": True}]


def _study(tmp_path: Path, doc: dict[str, Any], name: str = "s.yaml") -> Path:
    f = tmp_path / name
    f.write_text(yaml.safe_dump({"name": "s", **doc}, sort_keys=False))
    return f


def _load_like(**extra: Any) -> dict[str, Any]:
    return {"base": {"workload": dict(_WL), "engine": {"prefill": "disaggregated", "prefill_gpus": 2}}, "policies": _LOAD_POLICIES,
            "seeds": [0, 1], **extra}


# ---------------------------------------------- 1. a policy parameter some listed policies lack
def test_a_gamma_sweep_applies_to_the_policies_that_have_it_and_runs_the_rest_once(tmp_path):
    sweep = {"engine.prefill": ["colocated", "disaggregated"], "policy.gamma": [3, 5]}
    specs = plan_runs(load_study(_study(tmp_path, _load_like(sweep=sweep))))
    # by hand: per prefill, no_spec, mtp1 and static(k=5) once and DSpark at gamma 3 and 5: 5 runs,
    # x 2 prefill x 2 seeds = 20 (the review's error: none; duplicating the baselines: 28)
    assert len(specs) == 20 and len({s.run_id for s in specs}) == 20
    by = {(s.labels["engine.prefill"], s.labels["policy.gamma"], s.scenario.policy.name, s.seed): s for s in specs}
    assert len(by) == 20
    for prefill in ("colocated", "disaggregated"):
        for seed in (0, 1):
            for name in ("no_spec", "mtp1", "static"):
                s = by[(prefill, None, name, seed)]  # runs once, its policy.gamma label empty
                assert "gamma" not in s.scenario.policy.params
            for g in (3, 5):
                s = by[(prefill, g, "dspark", seed)]
                assert s.scenario.policy.params == {"early_stop": True, "gamma": g}
                assert s.labels["policy"].startswith(f"dspark(gamma={g}, early_stop=True")
    # a baseline the sweep leaves alone is the same run as in the study without the sweep:
    # its results are reused, not recomputed
    plain = plan_runs(load_study(_study(tmp_path, _load_like(sweep={"engine.prefill": ["colocated", "disaggregated"]}),
                                        "plain.yaml")))
    assert ({s.run_id for s in specs if s.scenario.policy.name != "dspark"}
            == {s.run_id for s in plain if s.scenario.policy.name != "dspark"})


def test_variants_of_a_policy_parameter_apply_where_it_exists(tmp_path):
    doc = _load_like(variants={"g3": {"policy.gamma": 3}, "g5": {"policy.gamma": 5}}, seeds=[0])
    specs = plan_runs(load_study(_study(tmp_path, doc)))
    got = sorted((str(s.labels["variant"]), s.scenario.policy.name, s.scenario.policy.params.get("gamma"))
                 for s in specs)
    # each baseline once, no variant (neither changes it); DSpark once per variant
    assert got == [("None", "mtp1", None), ("None", "no_spec", None), ("None", "static", None),
                   ("g3", "dspark", 3), ("g5", "dspark", 5)]
    # a variant that also changes the baseline keeps its name there
    doc["variants"]["g5"] = {"policy.gamma": 5, "engine.prefill_gpus": 3}
    got = {(s.labels["variant"], s.scenario.policy.name) for s in plan_runs(load_study(_study(tmp_path, doc)))}
    assert (None, "no_spec") in got and ("g5", "no_spec") in got and ("g3", "no_spec") not in got


def test_a_policy_name_sweep_takes_base_parameters_where_the_policy_has_them(tmp_path):
    doc = {"base": {"workload": dict(_WL), "policy": {"name": "dspark", "gamma": 3}},
           "sweep": {"policy.name": ["no_spec", "dspark", "static"]}}
    got = [(s.policy.name, s.policy.params) for _, s, _ in load_study(_study(tmp_path, doc)).expand()]
    assert got == [("no_spec", {}), ("dspark", {"gamma": 3}), ("static", {})]
    doc["sweep"]["policy.name"] = ["no_spec", "static"]  # now gamma is nowhere: refused, naming base
    with pytest.raises(ConfigError) as exc:
        load_study(_study(tmp_path, doc))
    assert str(exc.value).endswith("base.policy.gamma: unknown parameter of every policy this study runs "
                                   "(no_spec, static); allowed: k"), str(exc.value)


@pytest.mark.parametrize("doc, where", [
    ({"base": {"workload": dict(_WL)}, "policies": [{"name": "no_spec"}], "sweep": {"policy.gamma": [3, 5]}},
     "sweep.policy.gamma: unknown parameter of policy 'no_spec'; allowed: no parameters"),
    ({"base": {"workload": dict(_WL), "policy": {"name": "no_spec"}}, "variants": {"a": {"policy.gamma": 3}}},
     "variants.a.policy.gamma: unknown parameter of policy 'no_spec'; allowed: no parameters"),
    ({"base": {"workload": dict(_WL)}, "policies": [{"name": "no_spec"}, {"name": "static"}],
      "sweep": {"policy.gamma": [3]}},
     "sweep.policy.gamma: unknown parameter of every policy this study runs (no_spec, static); allowed: k"),
    ({"base": {"workload": dict(_WL)}, "policies": _LOAD_POLICIES, "sweep": {"policy.gama": [3]}},  # a typo
     "sweep.policy.gama: unknown parameter of every policy this study runs (no_spec, mtp1, static, dspark); "
     "allowed: k, gamma, early_stop, fallback, probe_every"),
])
def test_a_policy_parameter_no_run_has_is_still_refused(tmp_path, doc, where):
    f = _study(tmp_path, doc)
    with pytest.raises(ConfigError) as exc:
        load_study(f)
    assert str(exc.value) == f"{f}: {where}"


@pytest.mark.parametrize("over", [{"sweep": {"policy.gamma": [3, 5]}}, {"variants": {"g3": {"policy.gamma": 3}}}])
def test_a_policy_parameter_set_by_an_entry_and_a_sweep_is_refused(tmp_path, over):
    # fresh check: the load study's {name: dspark, gamma: 7, ...} entry beside a policy.gamma sweep
    # ran gamma 3 and 5 only; the entry's 7 never ran, without a word
    policies = [{"name": "no_spec"}, {"name": "dspark", "gamma": 7, "early_stop": True}]
    f = _study(tmp_path, {"base": {"workload": dict(_WL)}, "policies": policies, **over})
    where = "sweep" if "sweep" in over else "variants.g3"
    with pytest.raises(ConfigError) as exc:
        load_study(f)
    assert str(exc.value) == (f"{f}: {where}.policy.gamma: the policies entry {{name: dspark, gamma: 7, early_stop: "
                              "true} also sets gamma; one value per run, so set it in one place (drop gamma from "
                              "the entry)")

def test_the_review_study_runs_and_its_report_puts_each_baseline_beside_each_gamma(tmp_path, capsys):
    f = _study(tmp_path, _load_like(sweep={"workload.concurrency": [1, 2], "policy.gamma": [3, 5]}, seeds=[0]))
    assert main(["run", str(f), "--out", str(tmp_path / "out"), "--quiet", "--jobs", "1"]) == 0, capsys.readouterr()
    out = capsys.readouterr().out  # the terminal table: an empty gamma reads "-", as in the report
    assert "no_spec" in out and "<NA>" not in out and "nan" not in out, out
    assert "&lt;NA&gt;" not in (tmp_path / "out" / "s" / "report.html").read_text()
    csv = pd.read_csv(tmp_path / "out" / "s" / "runs.csv")
    assert len(csv) == 2 * 5  # per concurrency: 3 baselines once, DSpark at 3 and 5
    assert csv.loc[csv["policy"] == "no_spec", "policy.gamma"].isna().all()
    res = load_results(tmp_path / "out" / "s")
    titles = {}
    for title, sub in numbers.facets(res):  # facets by policy.gamma: the baselines in each
        titles[title] = sorted(set(sub["policy"].str.split("(").str[0]))
        assert len(sub) == 2 * 4, title  # 2 concurrencies x (3 baselines + this gamma's DSpark)
    assert titles == {f"policy.gamma = {g}": ["dspark", "mtp1", "no_spec", "static"] for g in (3, 5)}
    table = numbers.headline_table(res)  # each run once; the gamma it lacks shows as empty
    assert len(table) == 10 and table.loc[table["policy"] == "no_spec", "policy.gamma"].isna().all()
    assert set(table["policy.gamma"].dropna()) == {3, 5}  # whole numbers, not 3.0


def test_grouped_table_repeats_a_run_under_every_value_of_a_key_it_lacks():
    t = pd.DataFrame({"run_id": ["a", "b", "c", "d"], "variant": ["v1", "v1", "v2", "v2"],
                      "policy.gamma": pd.array([None, 3, None, 5], dtype="Int64"),
                      "policy": ["no_spec", "dspark3", "no_spec", "dspark5"], "seed": [0, 0, 0, 0]})
    res = StudyResults(Path("/nonexistent"), {"sweep_keys": ["variant", "policy.gamma"]}, t, {})
    g = res.grouped_table
    # by hand: a -> (v1, 3), (v1, 5); c -> (v2, 3), (v2, 5); b and d as they are, in table order
    assert list(zip(g["run_id"], g["variant"], g["policy.gamma"])) == [
        ("a", "v1", 3), ("a", "v1", 5), ("b", "v1", 3), ("c", "v2", 3), ("c", "v2", 5), ("d", "v2", 5)]
    assert len(res.table) == 4  # the per-run table is untouched


# ---------------------------------------------- 2. one policy written two ways
@pytest.mark.parametrize("policies", [
    [{"name": "dspark", "gamma": 7, "early_stop": True}, {"name": "dspark", "early_stop": True}],
    [{"name": "static"}, {"name": "static", "k": 5}],
    [{"name": "no_spec"}, {"name": "no_spec"}],
])
def test_one_policy_listed_twice_is_refused_however_written(tmp_path, capsys, policies):
    f = _study(tmp_path, {"base": {"workload": dict(_WL)}, "policies": [{"name": "mtp1"}, *policies]})
    assert main(["run", str(f), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {f}: policies: ") and "are the same policy" in err, err
    assert "\n" not in err and "list each policy once" in err, err
    assert not (tmp_path / "out" / "s" / "runs").exists()  # nothing ran


def test_capacity_policies_given_twice_are_refused_naming_the_flag(tmp_path):
    scen = tmp_path / "scen.yaml"
    scen.write_text(yaml.safe_dump({"workload": dict(_WL)}))
    with pytest.raises(ConfigError) as exc:
        load_capacity_scenarios(scen, ["no_spec", "dspark", "{name: dspark, gamma: 7}"])
    assert str(exc.value).startswith("--policies: dspark and {name: dspark, gamma: 7} are the same policy"), str(exc.value)


@pytest.mark.parametrize("extra", [
    {"sweep": {"policy": [{"name": "dspark"}, {"name": "dspark", "gamma": 7}]}},
    {"base": {"workload": dict(_WL), "policy": {"name": "static"}}, "variants": {"a": {}, "b": {"policy.k": 5}}},
])
def test_a_sweep_or_variant_that_writes_one_policy_two_ways_is_refused(tmp_path, extra):
    f = _study(tmp_path, {"base": {"workload": dict(_WL)}, **extra})
    with pytest.raises(ConfigError, match="are the same scenario"):
        plan_runs(load_study(f), source=str(f))


# ---------------------------------------------- 3. errors name the field the user wrote
@pytest.mark.parametrize("policy", ["dspark", "dspark_async", "threshold", "goodput"])
@pytest.mark.parametrize("memtp, field", [({"depth": "elastic", "max_depth": 100}, "memtp.max_depth"),
                                          ({"depth": 100}, "memtp.depth")])
def test_a_depth_too_wide_for_the_policy_names_the_memtp_field(tmp_path, policy, memtp, field):
    f = tmp_path / "scen.yaml"
    f.write_text(yaml.safe_dump({"workload": dict(_WL), "memtp": {**memtp, "head_cost_gib": 0.01},
                                 "policy": {"name": policy}}))
    with pytest.raises(ConfigError) as exc:
        load_scenario(f)
    # the policies' gamma is at most 64 (policies/_candidates.py, dspark.py): the bound is stated
    assert str(exc.value) == (f"{f}: {field}: 100 is wider than policy {policy!r} drafts (the ensemble sets its "
                              "gamma, at most 64); allowed: <= 64"), str(exc.value)
    f.write_text(yaml.safe_dump({"workload": dict(_WL), "memtp": {**memtp, field.split(".")[1]: 64,
                                                                  "head_cost_gib": 0.01}, "policy": {"name": policy}}))
    load_scenario(f)  # at the bound: accepted


def test_the_review_study_names_max_depth(tmp_path):
    f = _study(tmp_path, {"base": {"workload": dict(_WL), "memtp": {"depth": "elastic", "max_depth": 100}},
                          "policies": _LOAD_POLICIES})
    with pytest.raises(ConfigError) as exc:
        load_study(f)
    msg = str(exc.value)
    assert "memtp.max_depth: 100 is wider than policy 'dspark'" in msg and "allowed: <= 64" in msg, msg
    assert "gamma: Input should be" not in msg, msg


def test_a_fixed_depth_above_the_elastic_cap_runs(tmp_path):
    # max_depth caps the elastic controller only (a fixed depth drafts its own heads, and max_depth
    # set beside it is refused as having no effect), so depth 20 > max_depth's default 16 was
    # refused with no way out
    from memtp_sim import run
    f = tmp_path / "scen.yaml"
    f.write_text(yaml.safe_dump({"workload": dict(_WL), "memtp": {"depth": 20, "head_cost_gib": 0.01},
                                 "policy": {"name": "dspark"}}))
    assert run(load_scenario(f), seed=0).metrics["mean_depth"] == pytest.approx(20.0)  # 20 heads every round
    f.write_text(yaml.safe_dump({"workload": dict(_WL), "memtp": {"depth": 20, "max_depth": 32}}))
    with pytest.raises(ConfigError, match=r"memtp\.max_depth: has no effect in this scenario"):
        load_scenario(f)


def test_a_policies_list_base_is_not_checked_with_a_policy_no_run_has(tmp_path):
    # without base.policy the base was checked as the default dspark, whose block (max_depth 100)
    # is refused, though the list runs static and mtp1 only
    doc = {"base": {"workload": dict(_WL), "memtp": {"depth": "elastic", "max_depth": 100, "head_cost_gib": 0.01}},
           "policies": [{"name": "static", "k": 3}, {"name": "mtp1"}]}
    runs = load_study(_study(tmp_path, doc)).expand()
    assert [s.policy.name for _, s, _ in runs] == ["static", "mtp1"]
    assert runs[0][1].draft_spec().max_draft_len == 100


# ---------------------------------------------- 4. report_x without a sweep
def test_report_x_without_a_sweep_says_there_is_none(tmp_path):
    f = _study(tmp_path, {"base": {"workload": dict(_WL)}, "report_x": "workload.concurrency"})
    with pytest.raises(ConfigError) as exc:
        load_study(f)
    msg = str(exc.value)
    assert msg.startswith(f"{f}: report_x: 'workload.concurrency' is not a sweep key: this study has no sweep or "
                          "variants"), msg
    assert not msg.rstrip().endswith("allowed:"), msg
    f = _study(tmp_path, {"base": {"workload": dict(_WL)}, "sweep": {"workload.concurrency": [1, 2]},
                          "report_x": "workload.mode"})
    with pytest.raises(ConfigError, match=r"report_x: 'workload.mode' is not a sweep key; allowed: "
                                          r"workload\.concurrency$"):
        load_study(f)


def test_study_json_labels_a_run_a_key_does_not_apply_to_with_null(tmp_path, capsys):
    f = _study(tmp_path, {"base": {"workload": dict(_WL)}, "policies": [{"name": "no_spec"}, {"name": "dspark"}],
                          "sweep": {"policy.gamma": [3, 5]}})
    assert main(["run", str(f), "--out", str(tmp_path / "out"), "--quiet", "--jobs", "1"]) == 0, capsys.readouterr()
    runs = json.loads((tmp_path / "out" / "s" / "study.json").read_text())["runs"]
    assert sorted((r["labels"]["policy"].split("(")[0], r["labels"]["policy.gamma"]) for r in runs
                  if r["labels"]["policy.gamma"] is not None) == [("dspark", 3), ("dspark", 5)]
    assert [r["labels"]["policy"] for r in runs if r["labels"]["policy.gamma"] is None] == ["no_spec"]


def test_a_run_no_variant_changes_is_drawn_as_its_policy_when_variants_are_the_series(tmp_path, capsys):
    f = _study(tmp_path, {"base": {"workload": dict(_WL)}, "policies": [{"name": "no_spec"}, {"name": "dspark"}],
                          "variants": {"g3": {"policy.gamma": 3}, "g5": {"policy.gamma": 5}},
                          "report_series": "variant"})
    assert main(["run", str(f), "--out", str(tmp_path / "out"), "--quiet", "--jobs", "1"]) == 0, capsys.readouterr()
    # no_spec once, under no variant: its series is its policy, not "nan"
    assert sorted(load_results(tmp_path / "out" / "s").table["policy"]) == ["g3", "g5", "no_spec"]

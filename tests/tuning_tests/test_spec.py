"""The tune spec's types (memtp_sim.tuning._spec) are as strict as a study's: YAML ``true`` is not a
number, ``"7"`` is not a number, ``1`` is not a boolean. Each refusal is one line that names the file
and the field, in the words the study loader uses (memtp_sim.config.format_validation_error).

The walk over the spec's fields finds every int / float / bool field of every spec model by
introspection, so a numeric field added later is covered (or the test says where to put it)."""

from __future__ import annotations

import types
import typing
from typing import Any, Callable

import pytest
import yaml
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from memtp_sim.cli import main
from memtp_sim.config import Scenario, StrictModel, load_study
from memtp_sim.errors import ConfigError
from memtp_sim.tuning import (
    CapacitySpec,
    CategoricalDist,
    ExportSpec,
    FloatDist,
    IntDist,
    MetricConstraint,
    Objective,
    PairConstraint,
    SamplerSpec,
    TuneSpec,
    ValidationSpec,
    load_tune_spec,
    parse_tune_spec,
)

from ._helpers import TRACE, _assert_one_line_error, _write, tiny_doc


def test_every_spec_model_is_a_strict_model():
    for model in (TuneSpec, FloatDist, IntDist, CategoricalDist, PairConstraint, Objective, MetricConstraint,
                  SamplerSpec, ValidationSpec, ExportSpec, CapacitySpec):
        assert issubclass(model, StrictModel), model
        assert model.model_config.get("strict") is True and model.model_config.get("extra") == "forbid", model


def test_bool_seeds_are_refused_as_in_a_study_yaml(tmp_path, capsys):
    """Before: ``seeds: [true, 2]`` silently became ``[1, 2]`` in a tune YAML; a study YAML refused it."""
    path = _write(tmp_path, tiny_doc(seeds=[True, 2]))
    rc = main(["tune", str(path), "--out", str(tmp_path / "results"), "--quiet"])
    err = capsys.readouterr().err
    _assert_one_line_error(rc, err, "valid integer", "(got True)", starts=f"error: {path}: seeds.0: ")
    assert not (tmp_path / "results").exists()
    # the same words as the study loader's for the same mistake
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump({"name": "s", "base": {"workload": {"trace": str(TRACE), "concurrency": 2}},
                                     "seeds": [True, 2]}))
    with pytest.raises(ConfigError) as e:
        load_study(study)
    assert str(e.value) == f"{study}: " + err.strip().removeprefix(f"error: {path}: ")


def test_string_n_trials_is_refused(tmp_path, capsys):
    """Before: ``n_trials: "7"`` was read as 7."""
    path = _write(tmp_path, tiny_doc(n_trials="7"))
    rc = main(["tune", str(path), "--out", str(tmp_path / "results"), "--quiet"])
    _assert_one_line_error(rc, capsys.readouterr().err, "valid integer", "(got '7')",
                           starts=f"error: {path}: n_trials: ")


def test_an_int_where_a_float_is_expected_is_still_fine():
    """YAML writes ``3`` for 3.0; strict types keep accepting it (as scenario configs do)."""
    doc = tiny_doc(constraints=[{"metric": "num_rejected", "op": "<=", "value": 0}],
                   pair_constraints=[{"rule": "confidence.temperature < policy.gamma", "min_gap": 0}])
    doc["search_space"]["confidence.temperature"].update(low=1, high=3)
    spec = parse_tune_spec(doc)
    assert spec.search_space["confidence.temperature"].low == 1.0
    assert isinstance(spec.search_space["confidence.temperature"].low, float)
    assert spec.constraints[0].value == 0.0 and spec.pair_constraints[0].min_gap == 0.0


# ----------------------------------------------------------------------------- the walk
#: Where each spec model sits in a tiny tune YAML: (dotted location for messages, the mapping in the
#: document). Models without numeric fields need no entry.
_WHERE: dict[type[BaseModel], tuple[str, Callable[[dict[str, Any]], dict[str, Any]]]] = {
    TuneSpec: ("", lambda d: d),
    SamplerSpec: ("sampler", lambda d: d.setdefault("sampler", {})),
    ValidationSpec: ("validation", lambda d: d.setdefault("validation", {})),
    ExportSpec: ("export", lambda d: d.setdefault("export", {})),
    CapacitySpec: ("capacity", lambda d: d.setdefault("capacity", {"slo": "ttft_s_p90 <= 2"})),
    FloatDist: ("search_space.confidence.temperature", lambda d: d["search_space"]["confidence.temperature"]),
    IntDist: ("search_space.policy.gamma", lambda d: d["search_space"]["policy.gamma"]),
    PairConstraint: ("pair_constraints.0", lambda d: _one(d, "pair_constraints",
                                                          {"rule": "confidence.temperature < policy.gamma"})),
    MetricConstraint: ("constraints.0", lambda d: _one(d, "constraints",
                                                       {"metric": "num_rejected", "op": "<=", "value": 0.0})),
}

#: A valid value per field where the default is not one the tiny spec can take as it is.
_GOOD: dict[tuple[type[BaseModel], str], Any] = {
    (TuneSpec, "seeds"): [3, 4],
    (ValidationSpec, "seeds"): [7, 8],
}


def _one(doc: dict[str, Any], key: str, entry: dict[str, Any]) -> dict[str, Any]:
    doc[key] = [entry]
    return entry


def _strip(ann: Any) -> tuple[Any, bool]:
    """(scalar type or model or union, is a list) with Annotated / Optional peeled off."""
    is_list = False
    while True:
        origin = typing.get_origin(ann)
        if origin is typing.Annotated:
            ann = typing.get_args(ann)[0]
        elif origin in (typing.Union, types.UnionType) and type(None) in typing.get_args(ann):
            rest = [a for a in typing.get_args(ann) if a is not type(None)]
            ann = rest[0] if len(rest) == 1 else typing.Union[tuple(rest)]
        elif origin is list:
            ann, is_list = typing.get_args(ann)[0], True
        else:
            return ann, is_list


def _models_in(ann: Any) -> list[type[BaseModel]]:
    """Spec models an annotation can hold (through lists, dict values and unions)."""
    ann, _ = _strip(ann)
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return [ann]
    origin = typing.get_origin(ann)
    if origin is dict:
        return _models_in(typing.get_args(ann)[1])
    if origin in (typing.Union, types.UnionType):
        return [m for a in typing.get_args(ann) for m in _models_in(a)]
    return []


def _numeric_fields() -> list[tuple[type[BaseModel], str, type, bool]]:
    """(model, field, int / float / bool, is a list) for every spec model reachable from TuneSpec.

    The base scenario is skipped: it is a :class:`memtp_sim.config.Scenario` (its own tests).
    Unions with ``str`` (categorical choices, ``when`` values) take any scalar by design.
    """
    out, todo, seen = [], [TuneSpec], set()
    while todo:
        model = todo.pop(0)
        if model in seen or model is Scenario:
            continue
        seen.add(model)
        for name, field in model.model_fields.items():
            ann, is_list = _strip(field.annotation)
            if ann in (int, float, bool):
                out.append((model, name, ann, is_list))
            else:
                todo.extend(_models_in(field.annotation))
    return out


NUMERIC_FIELDS = _numeric_fields()


#: Stands for "the field's valid value, written as a string" (``"0.95"``, ``"3"``).
AS_STRING = object()


def _cases() -> list[Any]:
    cases = []
    for model, name, kind, is_list in NUMERIC_FIELDS:
        bad = [(1, "int-as-bool"), ("true", "string-as-bool")] if kind is bool else \
            [(True, "bool-as-number"), (AS_STRING, "string-as-number")]
        for value, what in bad:
            cases.append(pytest.param(model, name, kind, is_list, value, id=f"{model.__name__}.{name}-{what}"))
    return cases


def test_the_walk_finds_the_numeric_fields():
    found = {(m.__name__, n) for m, n, *_ in NUMERIC_FIELDS}
    assert {("TuneSpec", "seeds"), ("TuneSpec", "n_trials"), ("SamplerSpec", "seed"), ("FloatDist", "low"),
            ("IntDist", "step"), ("FloatDist", "log"), ("PairConstraint", "min_gap"), ("MetricConstraint", "value"),
            ("ValidationSpec", "seeds"), ("ValidationSpec", "confidence")} <= found, found
    missing = sorted({m.__name__ for m, *_ in NUMERIC_FIELDS} - {m.__name__ for m in _WHERE})
    assert not missing, f"add these spec models to _WHERE (where they sit in a tune YAML): {missing}"


@pytest.mark.parametrize("model, name, kind, is_list, bad", _cases())
def test_no_numeric_field_coerces(tmp_path, model, name, kind, is_list, bad):
    """Each numeric field refuses a bool (for a bool field: an int) and a value written as a string,
    with one line naming the file and the field; the same document with a valid value loads."""
    where, locate = _WHERE[model]
    doc = tiny_doc()
    good = _GOOD.get((model, name), model.model_fields[name].get_default(call_default_factory=True))
    if good is PydanticUndefined:  # a required field: the tiny spec's own value
        good = locate(doc)[name]
    locate(doc)[name] = good
    load_tune_spec(_write(tmp_path, doc, "good.yaml"))  # the location and the valid value are right
    value = str(good[0] if is_list else good) if bad is AS_STRING else bad
    locate(doc)[name] = [value, *good[1:]] if is_list else value
    path = _write(tmp_path, doc, "bad.yaml")
    with pytest.raises(ConfigError) as e:
        load_tune_spec(path)
    field = ".".join(p for p in (where, name, "0" if is_list else "") if p)
    line = str(e.value)
    assert "\n" not in line and line.startswith(f"{path}: {field}: "), line
    assert f"(got {value!r})" in line, line
    assert ("valid boolean" if kind is bool else "valid integer" if kind is int else "valid number") in line, line


# ------------------------------------------------------------------ settings that change no trial
# The kind (issue 9): every field a tune YAML sets changes some trial's scenario or is refused in
# one line, as `run` refuses it in a study. Review found `tune` accepting base.memtp.r_low without
# memtp.depth, and tuning memtp.r_low, engine.prefill_gpus (colocated) and confidence.* (no_spec).
def _ignorable_paths() -> dict[str, str]:
    """Every path Scenario.ignored_fields can name, from a scenario where all of them are ignored."""
    scen = Scenario.model_validate({"workload": {"trace": str(TRACE), "mode": "closed_loop", "concurrency": 4,
                                                 "num_requests": 24},
                                    "engine": {"prefill": "colocated"}, "policy": {"name": "no_spec"}})
    return scen.ignored_fields()


def _default_of(path: str) -> Any:
    node: Any = Scenario.model_validate({"workload": {"trace": str(TRACE), "mode": "closed_loop",
                                                      "concurrency": 4, "num_requests": 24}})
    for part in path.split("."):
        node = getattr(node, part)
    return node.model_dump(mode="json", exclude_defaults=True) if isinstance(node, BaseModel) else node


@pytest.mark.parametrize("path", sorted(_ignorable_paths()))
def test_a_base_field_that_changes_no_trial_is_refused(path):
    doc = tiny_doc()
    doc["base"]["engine"] = {"prefill": "colocated"}
    doc["base"]["policy"] = {"name": "no_spec"}
    doc["base"]["confidence"] = {}
    doc["search_space"] = {"workload.concurrency": {"type": "int", "low": 2, "high": 4}}
    if "." in path:
        section, field = path.split(".", 1)
        doc["base"].setdefault(section, {})[field] = _default_of(path)  # even the default, when written out
    else:  # a whole section (draft_control)
        doc["base"][path] = _default_of(path)
    with pytest.raises(ConfigError) as e:
        parse_tune_spec(doc, source="t.yaml")
    msg = str(e.value)
    assert msg.startswith(f"t.yaml: base.{path}: has no effect in any trial") and "\n" not in msg, msg
    assert _ignorable_paths()[path] in msg


@pytest.mark.parametrize(("base", "entry", "reason"), [
    ({}, {"memtp.r_low": {"type": "float", "low": 0.1, "high": 0.5}}, "only used with memtp.depth"),
    ({"engine": {"prefill": "colocated"}}, {"engine.prefill_gpus": {"type": "int", "low": 1, "high": 4}},
     "engine.prefill: disaggregated"),
    ({"policy": {"name": "no_spec"}}, {"confidence.temperature": {"type": "float", "low": 0.5, "high": 2.0}},
     "drafts nothing"),
])
def test_a_tuned_path_that_changes_no_trial_is_refused(base, entry, reason):
    doc = tiny_doc()
    doc["base"].update(base)
    if doc["base"]["policy"]["name"] == "no_spec":
        doc["base"]["confidence"] = {}
    doc["search_space"] = dict(entry)
    with pytest.raises(ConfigError) as e:
        parse_tune_spec(doc, source="t.yaml")
    key = next(iter(entry))
    assert str(e.value).startswith(f"t.yaml: search_space.{key}: has no effect in any trial"), str(e.value)
    assert reason in str(e.value)


@pytest.mark.parametrize(("base", "space"), [
    # r_low matters in the trials where the tuned depth is elastic (no gamma: the ensemble sets it)
    ({"policy": {"name": "dspark"}}, {"memtp.depth": {"type": "categorical", "choices": [1, "elastic"]},
          "memtp.r_low": {"type": "float", "low": 0.1, "high": 0.5}}),
    # the temperature matters in the trials that draft
    ({"policy": {"name": "no_spec"}}, {"policy.name": {"type": "categorical", "choices": ["no_spec", "dspark"]},
                                       "confidence.temperature": {"type": "float", "low": 0.5, "high": 2.0}}),
])
def test_a_path_that_matters_in_some_trial_is_accepted(base, space):
    doc = tiny_doc()
    doc["base"].update(base)
    doc["search_space"] = dict(space)
    parse_tune_spec(doc, source="t.yaml")


def test_a_base_gamma_the_memtp_ensemble_replaces_is_refused():
    # the kind of the study check: with memtp.depth set in every trial, the base policy's gamma is
    # replaced by the ensemble's depth in every trial (run refuses it in a study the same way)
    doc = tiny_doc()
    doc["base"]["memtp"] = {"depth": "elastic"}
    doc["base"]["policy"] = {"name": "dspark", "gamma": 7}
    doc["search_space"] = {"memtp.max_depth": {"type": "int", "low": 2, "high": 8}}
    with pytest.raises(ConfigError, match=r"^t\.yaml: base\.policy\.gamma: has no effect in any trial"):
        parse_tune_spec(doc, source="t.yaml")
    doc["base"]["policy"] = {"name": "dspark"}
    parse_tune_spec(doc, source="t.yaml")


@pytest.mark.parametrize("constraint, says", [
    ("num_rejected <= -1", "constraints.0: num_rejected <= -1 can never hold (num_rejected is never negative)"),
    ({"metric": "acceptance_rate", "op": ">=", "value": 1.5},
     "constraints.0: acceptance_rate >= 1.5 can never hold (acceptance_rate is a fraction in [0, 1])"),
    ("wasted_verify_frac >= 2", "constraints.0: wasted_verify_frac >= 2 can never hold"),
])
def test_a_constraint_no_run_can_meet_is_refused_at_load(tmp_path, capsys, constraint, says):
    """Before: every trial ran, then "no feasible trial ... run more trials", which could never help;
    capacity refused the same bound as an SLO term (one rule for both: metrics.bound_never_holds)."""
    path = _write(tmp_path, tiny_doc(constraints=[constraint]))
    rc = main(["tune", str(path), "--out", str(tmp_path / "results"), "--quiet"])
    _assert_one_line_error(rc, capsys.readouterr().err, says, starts=f"error: {path}: ")
    assert not (tmp_path / "results").exists()
    # the bounds at the edge hold for some run, and stay allowed
    for fine in ("num_rejected <= 0", "acceptance_rate >= 1", "tok_per_s_user_p10 >= 1e+06"):
        assert MetricConstraint.model_validate(fine).label == fine

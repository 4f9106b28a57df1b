"""What-if settings without a browser: the URL round trip, the scenario they make, the library's
errors and where they show, tuning trials as links, policy controls from ``Params`` models."""

from __future__ import annotations

import re

import urllib.parse

import pytest
from pydantic import Field, ValidationError

from memtp_sim.config import Scenario, format_validation_error
from memtp_sim.dashboard._settings import (
    DEFAULTS,
    Invalid,
    Workdir,
    applicable,
    policy_param_fields,
    query_to_settings,
    settings_from_scenario,
    settings_to_query,
    validate,
)
from memtp_sim.dashboard._whatif import error_target, full_settings
from memtp_sim.dashboard._whatif_layout import control_values, policy_param_controls
from memtp_sim.hardware import load_profile
from memtp_sim.policies import Policy, PolicyParams, RoundPlan, make_policy, register
from memtp_sim.policies.registry import _REGISTRY

from ._expect import TINY_QUERY, tiny_doc


def _same_run(a: Scenario, b: Scenario) -> bool:
    """Equal scenarios up to policy parameters given explicitly at their defaults."""
    pa, pb = (make_policy(s.policy.name, s.policy.params).params for s in (a, b))
    return a.model_dump(exclude={"policy"}) == b.model_dump(exclude={"policy"}) and pa == pb


def _scenario(query: str, tmp_path) -> tuple[Scenario, list[int]]:
    full, extras, ignored = query_to_settings(query)
    assert not ignored
    out = validate(applicable(full), extras, Workdir(tmp_path))
    assert not isinstance(out, Invalid), out
    return out


def test_the_tiny_link_makes_the_documented_scenario(tmp_path):
    scen, seeds = _scenario("?" + TINY_QUERY, tmp_path)
    assert seeds == [0]
    want = Scenario.model_validate(tiny_doc())
    assert _same_run(scen, want)  # the page passes the policy's defaults explicitly


def test_an_empty_link_is_the_default_point(tmp_path):
    scen, seeds = _scenario("", tmp_path)
    assert seeds == [0, 1, 2]
    assert scen.workload.num_requests == DEFAULTS["workload.num_requests"]
    assert scen.workload.concurrency == 16 and scen.engine.prefill == "disaggregated"
    assert scen.confidence.sts == "fit" and scen.confidence.sts_rounds == DEFAULTS["confidence.sts_rounds"]
    assert settings_to_query(applicable(query_to_settings("")[0])) == ""


@pytest.mark.parametrize("query", [
    "?confidence.temperature=1.5&policy.gamma=4",
    "?workload.mode=poisson&workload.rate_per_s=0.7&engine.prefill=colocated",
    "?memtp.depth=elastic&memtp.max_depth=9&memtp.r_low=0.2&memtp.r_high=0.8&memtp.head_cost_gib=2.5",
    "?memtp.depth=3&policy.name=threshold&policy.threshold=0.25",
    "?policy.name=static&policy.k=2&seeds=4%2C5",
    "?workload.mode=trace&workload.rate_scale=2&confidence.sts=none",
    "?engine.max_batch_tokens=384&acceptance.domain_mix=%7B%22chat%22%3A0.5%2C%22code%22%3A0.5%7D",
])
def test_links_round_trip(query, tmp_path):
    full, extras, _ = query_to_settings(query)
    again = settings_to_query(applicable(full), extras)
    assert dict(urllib.parse.parse_qsl(again[1:])) == dict(urllib.parse.parse_qsl(query[1:]))
    assert _scenario(again, tmp_path) == _scenario(query, tmp_path)


def test_controls_round_trip_through_their_values():
    full, _, _ = query_to_settings("?memtp.depth=elastic&memtp.max_depth=9&confidence.temperature=2")
    v = control_values(full)
    assert v["memtp-mode"] == "elastic" and v["pol-depth"] == 9 and v["conf-temp-slider"] == 1.0
    params = {k.split(".", 1)[1]: val for k, val in full.items() if k.startswith("policy.") and k != "policy.gamma"}
    back = applicable(full_settings(v, params))
    assert back == applicable(full)


def test_unknown_link_keys_are_reported_not_applied():
    _, extras, ignored = query_to_settings("?nonsense=1&workload.bogus=2&engine.max_batch_tokens=256")
    assert ignored == ["nonsense", "workload.bogus"]
    assert extras == {"engine.max_batch_tokens": 256}


@pytest.mark.parametrize("update, target", [
    ({"workload.concurrency": 0}, "wl-concurrency"),
    ({"confidence.temperature": -1.0}, "conf-temp"),
    ({"workload.num_requests": None}, "wl-requests"),
    ({"hardware.profile": "no-such-profile"}, "hw-profile"),
])
def test_the_librarys_error_shows_beside_its_control(update, target, tmp_path):
    full, _, _ = query_to_settings("?" + TINY_QUERY)
    out = validate(applicable({**full, **update}), None, Workdir(tmp_path))
    assert isinstance(out, Invalid)
    assert error_target(out.path) == target
    doc_over: dict = {}
    for k, v in update.items():
        section, field = k.split(".")
        doc_over.setdefault(section, {})[field] = v
    with pytest.raises(ValidationError) as e:
        Scenario.model_validate(tiny_doc(**doc_over))
    assert out.message == format_validation_error(e.value, "what-if", Scenario)


def test_bad_seeds_and_pair_rules_get_the_library_message(tmp_path):
    full, _, _ = query_to_settings("?" + TINY_QUERY)
    dup = validate(applicable({**full, "seeds": "1,1"}), None, Workdir(tmp_path))
    assert isinstance(dup, Invalid) and dup.path == "seeds" and "duplicate seed(s) [1]" in dup.message
    pair = validate(applicable({**full, "memtp.depth": "elastic", "memtp.r_low": 0.95}), None, Workdir(tmp_path))
    assert isinstance(pair, Invalid) and error_target(pair.path) == "memtp-r-low"
    assert "memtp.r_low: 0.95 must be below r_high (0.9)" in pair.message


#: Numeric boxes of the page, each with the settings under which it shows.
_BOXES = {"hw-extra": {}, "wl-concurrency": {}, "wl-rate": {"workload.mode": "poisson"}, "wl-rate-scale": {"workload.mode": "trace"},
          "wl-requests": {}, "eng-prefill-gpus": {"engine.prefill": "disaggregated"}, "pol-depth": {},
          "conf-temp": {}, "conf-sts-rounds": {"confidence.sts": "fit"}, "memtp-heads": {"memtp.depth": 3},
          "memtp-head-cost": {"memtp.depth": "elastic"}, "memtp-r-low": {"memtp.depth": "elastic"},
          "memtp-r-high": {"memtp.depth": "elastic"}}


@pytest.mark.parametrize("box", sorted(_BOXES))
@pytest.mark.parametrize("bad", [None, -1, 0.5])
def test_every_boxs_bad_value_shows_beside_that_box(box, bad, tmp_path):
    """A box emptied (the browser sends None), negative or fractional: wherever the library
    catches it (the field's own check or its section's), the error line is the box's own, never
    its section's, and nothing is dropped silently (an emptied concurrency box showed its error
    under the workload mode; an emptied head count ran without MEMTP)."""
    values = control_values({**DEFAULTS, **_BOXES[box]})
    values[box] = bad
    out = validate(applicable(full_settings(values, {})), None, Workdir(tmp_path))
    if bad is None:
        assert isinstance(out, Invalid), f"an empty {box} box was accepted"
    if isinstance(out, Invalid):
        assert error_target(out.path) == box, out.message


def test_free_memory_makes_a_derived_profile(tmp_path):
    full, _, _ = query_to_settings("?" + TINY_QUERY + "&extra_gib=20")
    scen, _ = _scenario("?" + TINY_QUERY + "&extra_gib=20", tmp_path)
    base = load_profile("gfx1151-llama31-8b-q4km-vulkan")
    more = load_profile(scen.hardware.profile)
    assert more.memory.gpu_allocatable_gib == pytest.approx(base.memory.gpu_allocatable_gib + 20)
    assert more.sps.pass_ms.tolist() == base.sps.pass_ms.tolist() and more.name.endswith("+20GiB")
    # equal settings, equal file: the runs' cache key does not move
    assert _scenario("?" + TINY_QUERY + "&extra_gib=20", tmp_path)[0] == scen
    too_little = validate(applicable({**full, "extra_gib": -500.0}), None, Workdir(tmp_path))
    assert isinstance(too_little, Invalid) and error_target(too_little.path) == "hw-extra"
    # what was typed and what is allowed, not a cache path; the stated bound is the profile's own
    # budget rule (weights + reserve + drafter + one KV block <= allocatable), hand-computed here
    m = base.memory
    need = m.weights_gib + m.reserve_gib + m.drafter_weights_gib + m.kv_bytes_per_token * m.kv_block_tokens / 2**30
    assert too_little.message.startswith(
        f"what-if: extra memory: -500 GiB leaves {m.gpu_allocatable_gib - 500:.2f} of {base.name}'s "
        f"{m.gpu_allocatable_gib:.2f} GiB allocatable, less than the {need:.2f} GiB") and ".yaml" not in too_little.message
    bound = float(re.search(r"allowed: ([-+0-9.]+) GiB or more$", too_little.message).group(1))
    assert need - m.gpu_allocatable_gib <= bound < need - m.gpu_allocatable_gib + 0.01
    assert isinstance(validate(applicable({**full, "extra_gib": bound}), None, Workdir(tmp_path)), tuple)
    below = validate(applicable({**full, "extra_gib": bound - 0.01}), None, Workdir(tmp_path))
    assert isinstance(below, Invalid) and error_target(below.path) == "hw-extra" and f"{bound:+.2f}" in below.message
    # enough for the profile, not for the MEMTP heads as well: the library's own check, without a file path
    heads = validate(applicable({**full, "extra_gib": bound, "memtp.depth": 4, "memtp.head_cost_gib": 2.0}),
                     None, Workdir(tmp_path))
    assert isinstance(heads, Invalid) and "no KV block fits" in heads.message, heads
    assert str(tmp_path) not in heads.message and ".yaml" not in heads.message


def test_fields_without_effect_are_dropped_so_equal_runs_share_a_key(tmp_path):
    a, _ = _scenario("?policy.name=no_spec&confidence.temperature=2", tmp_path)
    b, _ = _scenario("?policy.name=no_spec", tmp_path)
    assert a == b


def test_a_scenario_comes_back_from_its_settings(tmp_path):
    doc = tiny_doc(workload={"concurrency": 3}, confidence={"temperature": 1.7},
                   policy={"name": "threshold", "gamma": 5, "threshold": 0.4},
                   engine={"max_batch_tokens": 384, "prefill_chunk_tokens": 128})
    scen = Scenario.model_validate(doc)
    settings, extras = settings_from_scenario(scen, [3, 4])
    assert extras == {"engine.max_batch_tokens": 384, "engine.prefill_chunk_tokens": 128}
    back, seeds = _scenario(settings_to_query(settings, extras), tmp_path)
    assert seeds == [3, 4]
    assert _same_run(back, scen)


def test_a_new_policy_gets_controls_from_its_params_model():
    class Params(PolicyParams):
        gamma: int = Field(4, ge=1, le=64)
        margin: float = Field(0.25, ge=0.0, description="a knob only this policy has")
        greedy: bool = True

    @register("dashboard_test_policy")
    class _NewPolicy(Policy):
        pass

    _NewPolicy.Params = Params
    try:
        assert list(policy_param_fields("dashboard_test_policy")) == ["margin", "greedy"]
        html = str(policy_param_controls("dashboard_test_policy", {"margin": 0.5}))
        assert "'name': 'margin'" in html and "'name': 'greedy'" in html and "0.5" in html
        assert "a knob only this policy has" in html
        full, _, _ = query_to_settings("?policy.name=dashboard_test_policy&policy.margin=0.75")
        assert applicable(full)["policy.margin"] == 0.75 and applicable(full)["policy.greedy"] is True
    finally:
        _REGISTRY.pop("dashboard_test_policy")
    assert RoundPlan  # the policy interface the dashboard never calls


def test_uploaded_files_are_checked_by_the_library(tmp_path):
    from memtp_sim.dashboard._whatif import _check_file
    from memtp_sim.errors import ConfigError
    from memtp_sim.workload import load_trace

    saved = Workdir(tmp_path).save_upload([("trace.csv", b"a,b\n1,2\n")])
    good, err = _check_file("trace", saved, load_trace)
    with pytest.raises(ConfigError) as e:
        load_trace(saved[0])
    assert good is None and err == str(e.value) and "unknown trace columns" in err
    again = Workdir(tmp_path).save_upload([("trace.csv", b"a,b\n1,2\n")])
    assert again == saved  # stored by content: a link to it stays valid
    ok, err = _check_file("profile", [load_profile("gfx1151-llama31-8b-q4km-vulkan").path], load_profile)
    assert ok is not None and err == ""


def test_a_typed_profile_path_that_is_not_a_yaml_says_so():
    # fault (fresh user): typing /etc/passwd in "or a profile YAML path" said "no .yaml or .yml file
    # among the uploaded ones", about uploads the user never made
    from memtp_sim.dashboard._whatif import _check_file
    from memtp_sim.hardware import load_profile

    good, err = _check_file("profile", ["/etc/passwd"], load_profile, typed=True)
    assert good is None and err.startswith("/etc/passwd: not a .yaml or .yml file") and "uploaded" not in err
    good, err = _check_file("profile", ["/nonexistent.yaml"], load_profile, typed=True)
    assert good is None and "not found" in err
    good, err = _check_file("profile", ["a.csv"], load_profile)  # uploads keep their wording
    assert good is None and "among the uploaded ones" in err


@pytest.mark.parametrize("query", ["?memtp.depth=", "?memtp.depth=abc", "?memtp.depth=2.5"])
def test_a_link_with_a_head_count_that_is_not_one_shows_the_error_not_four_heads(query, tmp_path):
    # review: the page wrote memtp.depth= for an emptied heads box; opening that link showed fixed
    # heads with the box filled to 4, no error, and the 4-head result
    full, _, _ = query_to_settings(query)
    values = control_values({**DEFAULTS, **full})
    assert values["memtp-mode"] == "fixed" and values["memtp-heads"] is None
    out = validate(applicable(full_settings(values, {})), None, Workdir(tmp_path))
    assert isinstance(out, Invalid) and error_target(out.path) == "memtp-heads"


@pytest.mark.parametrize("field", ["workload.trace", "hardware.profile", "acceptance.profile"])
@pytest.mark.parametrize("value", ["/etc/passwd", "../../../../../../etc/passwd"])
def test_a_link_cannot_make_the_server_read_a_file_outside_its_folders(field, value, tmp_path, monkeypatch):
    """Review: ?workload.trace=../../etc/passwd answered with the file's first line in the error."""
    from memtp_sim.dashboard._settings import outside_served

    monkeypatch.chdir(tmp_path)
    full, extras, _ = query_to_settings(f"?{field}={urllib.parse.quote(value)}")
    out = validate(applicable({**DEFAULTS, **full}), extras, Workdir(tmp_path / "wd"))
    assert isinstance(out, Invalid) and out.path == field
    assert "outside the folders this dashboard reads" in out.message and "root:" not in out.message
    # what it may read: shipped names, files under the folder it was started in, its own uploads
    assert outside_served("azure2023_conv.csv", None) is None
    (tmp_path / "mine.yaml").write_text("x")
    assert outside_served(str(tmp_path / "mine.yaml"), None) is None
    assert outside_served(str(tmp_path / "wd" / "uploads" / "a.csv"), Workdir(tmp_path / "wd")) is None


def test_run_notes_say_which_seeds_they_come_from():
    # review: two seeds each rejecting one request showed "1 request(s) rejected" once
    from memtp_sim.dashboard._whatif import notes_by_seed

    runs = [{"seed": 0, "notes": ["1 request(s) rejected: {'exceeds_kv_capacity': 1}", "2 preemption(s)"]},
            {"seed": 1, "notes": ["2 preemption(s)"]},
            {"seed": 2, "notes": ["1 request(s) rejected: {'exceeds_kv_capacity': 1}", "2 preemption(s)"]}]
    assert notes_by_seed(runs) == ["seeds 0, 2: 1 request(s) rejected: {'exceeds_kv_capacity': 1}",
                                   "each of the 3 seeds: 2 preemption(s)"]
    assert notes_by_seed(runs[:1]) == runs[0]["notes"]
    assert notes_by_seed([runs[1], {"seed": 5, "notes": []}]) == ["seed 1: 2 preemption(s)"]


@pytest.mark.parametrize("query", ["?policy.name=bogus", "?policy.name=null"])
def test_an_unknown_policy_in_a_link_is_named_beside_the_policy_dropdown(query, tmp_path):
    # review: ?policy.name=bogus showed "policy.name: Input should be a valid string (got None)"
    # under the policy parameters
    full, extras, _ = query_to_settings(query)
    out = validate(applicable(full), extras, Workdir(tmp_path))
    assert isinstance(out, Invalid) and error_target(out.path) == "pol-name"
    assert "choose one of: dspark" in out.message and "valid string" not in out.message


def test_sweep_levels_given_twice_are_refused():
    # review: "4,4" ran the same level twice without a word
    from memtp_sim.dashboard._whatif import _levels

    assert _levels("4,4", "workload.concurrency") == "levels: 4 is given twice; give each load level once"
    assert _levels("1, 2,4", "workload.concurrency") == [1, 2, 4]
    assert _levels("0.5,0.50", "workload.rate_per_s") == "levels: 0.50 is given twice; give each load level once"

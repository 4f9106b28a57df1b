"""Reading a tune YAML: validation into a :class:`TuneSpec`, one-line errors, search-space checks.

Every error is a :class:`~memtp_sim.errors.ConfigError` of one line that starts with the file and
the field, like the study loader's (:func:`memtp_sim.config.format_validation_error`). After the
models validate, the search space is checked against the scenario (:func:`_check_space`): pair
rules name numeric entries and are satisfiable, ``when`` conditions name categorical entries and
their choices, every path exists in the scenario, and the corners of the space make valid
scenarios.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from ..config import Scenario, format_validation_error, read_config_yaml, set_paths
from ..errors import ConfigError
from ._space import (
    base_doc,
    ceil_in,
    policy_fields,
    sampling_order,
    scenario_doc,
    static_ranges,
    when_ok,
)
from ._spec import CategoricalDist, FloatDist, IntDist, TuneSpec, format_values

__all__ = ["load_tune_spec", "parse_tune_spec"]

_DIST_MODELS: dict[str, type[BaseModel]] = {"float": FloatDist, "int": IntDist, "categorical": CategoricalDist}


def _format(e: ValidationError, source: str) -> str:
    """One line naming the field; drops the discriminator tag from search-space locations."""
    err = e.errors()[0]
    loc = tuple(str(x) for x in err["loc"])
    if err["type"] == "extra_forbidden" and len(loc) == 4 and loc[0] == "search_space" and loc[2] in _DIST_MODELS:
        allowed = ", ".join(sorted(set(_DIST_MODELS[loc[2]].model_fields) - {"type"}))
        return f"{source}: search_space.{loc[1]}.{loc[3]}: unknown key; allowed for type {loc[2]}: {allowed}"
    line = format_validation_error(e, source, TuneSpec)
    line = re.sub(r"(search_space\.[\w.]+?)\.(float|int|categorical)(?=[.:])", r"\1", line)
    return line.replace(": (top level): ", ": ")


def parse_tune_spec(doc: dict[str, Any], *, source: str = "<tune>", base_dir: str | Path | None = None,
                    check_effects: bool = True) -> TuneSpec:
    """Validate a tune spec mapping (see :mod:`memtp_sim.tuning` for the shape).

    Types are strict, as in scenario and study YAML: ``seeds: [true, 2]`` or ``n_trials: "7"``
    is an error, not ``[1, 2]`` or 7.

    Args:
        doc: the parsed YAML mapping.
        source: file name used in error messages.
        base_dir: folder that relative paths (trace, profile) resolve against.
        check_effects: refuse a base field or tuned path that changes no trial (as ``run``
            refuses one in a study). False for a spec stored with a study: it was checked when
            the study was made, and its dump lists every field as set.

    Returns:
        The validated :class:`TuneSpec`.

    Raises:
        ConfigError: one line naming the source and the field: a top level that is not a
            mapping, unknown key, wrong type, unknown distribution ``type``, bad distribution
            bounds, unknown scenario path, impossible pair rule, a search-space corner that makes
            an invalid scenario, a set or tuned field that has no effect in any trial.

    Source:
        pydantic v2 validation on the package's strict models (:class:`memtp_sim.config.StrictModel`);
        distributions mirror Optuna's ``FloatDistribution`` / ``IntDistribution`` /
        ``CategoricalDistribution`` (Optuna documentation).
    """
    if not isinstance(doc, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level (name, base, search_space, ...)")
    space = doc.get("search_space")
    if isinstance(space, dict):  # a clearer message than pydantic's for a missing / unknown `type`
        for key, entry in space.items():
            if isinstance(entry, dict) and entry.get("type") not in ("float", "int", "categorical"):
                raise ConfigError(f"{source}: search_space.{key}.type: expected float, int or categorical "
                                  f"(got {entry.get('type')!r})")
    try:
        spec = TuneSpec.model_validate(doc, context={"base_dir": str(base_dir) if base_dir is not None else None})
    except ValidationError as e:
        raise ConfigError(_format(e, source)) from None
    spec._source = source
    _check_space(spec, source)
    if check_effects:
        _check_effects(spec, source)
    return spec


def load_tune_spec(path: str | Path) -> TuneSpec:
    """Read and validate a tune YAML; relative paths resolve against the YAML's folder.

    Args:
        path: the YAML file.

    Returns:
        The validated :class:`TuneSpec`.

    Raises:
        ConfigError: a folder, an unreadable file or invalid YAML, a file of another kind (a study,
            a scenario, a drafter-lab spec: the message names the command that takes it; from
            :func:`memtp_sim.config.read_config_yaml`), or any error :func:`parse_tune_spec` raises.

    Source:
        :func:`memtp_sim.config.read_config_yaml` (safe loader, unique keys, kind check), then
        :func:`parse_tune_spec`.
    """
    doc = read_config_yaml(path, "tune spec")
    return parse_tune_spec(doc, source=str(path), base_dir=Path(path).parent)


# ------------------------------------------------------------------------------------ space checks
def _check_space(spec: TuneSpec, source: str) -> None:
    """Pair rules, conditions and paths; then validate the scenario at the space's corners."""
    _check_pair_rules(spec, source)
    _check_conditions(spec, source)
    _check_paths(spec, source)
    _check_corners(spec, source)


def _check_pair_rules(spec: TuneSpec, source: str) -> None:
    """Both ends numeric entries without ``when``; the rules acyclic and satisfiable."""
    space = spec.search_space
    for i, pc in enumerate(spec.pair_constraints):
        for side in (pc.lower, pc.upper):
            where = f"{source}: pair_constraints.{i} ({pc.rule})"
            if side not in space:
                raise ConfigError(f"{where}: {side} is not in search_space; both sides must be tuned")
            if isinstance(space[side], CategoricalDist):
                raise ConfigError(f"{where}: {side} is categorical; ordered pairs need float or int entries")
    for pc in spec.all_pairs():
        for side in (pc.lower, pc.upper):
            if space[side].when is not None:
                raise ConfigError(f"{source}: search_space.{side}: an entry with `when` cannot be in a pair rule "
                                  f"({pc.rule})")
    sampling_order(spec, source)  # raises on cycles
    static_ranges(spec, source=source)  # raises on an impossible rule


def _check_conditions(spec: TuneSpec, source: str) -> None:
    """Every ``when`` names a categorical entry and some of its choices."""
    space = spec.search_space
    for key, d in space.items():
        for target, want in (d.when or {}).items():
            if target not in space or not isinstance(space[target], CategoricalDist):
                raise ConfigError(f"{source}: search_space.{key}.when: {target} must be a categorical "
                                  f"entry of search_space")
            wants = want if isinstance(want, list) else [want]
            bad = [w for w in wants if w not in space[target].choices]
            if bad:
                raise ConfigError(f"{source}: search_space.{key}.when: {bad!r} not among the choices of {target} "
                                  f"({space[target].choices!r})")


def _check_paths(spec: TuneSpec, source: str) -> None:
    """Every key is a field of the scenario, or ``policy.name`` / a parameter of a possible policy."""
    space = spec.search_space
    base = base_doc(spec)
    policy_names = [spec.base.policy.name]
    if "policy.name" in space:
        d = space["policy.name"]
        if not isinstance(d, CategoricalDist):
            raise ConfigError(f"{source}: search_space.policy.name: must be categorical")
        policy_names = [str(c) for c in d.choices]
        try:
            for n in policy_names:
                policy_fields(n)
        except ValueError as e:
            raise ConfigError(f"{source}: search_space.policy.name: {e}") from None
    for key in space:
        parts = key.split(".")
        if parts[0] == "policy":
            allowed = {"name"}.union(*(policy_fields(n) for n in policy_names))
            if len(parts) != 2 or parts[1] not in allowed:
                raise ConfigError(f"{source}: search_space.{key}: unknown policy parameter; allowed: "
                                  f"{', '.join(sorted(allowed))}")
            if parts[1] != "name":
                _check_policy_param(spec, key, policy_names, source)
            continue
        node: Any = base
        for j, part in enumerate(parts):
            if not isinstance(node, dict) or part not in node:
                where = ".".join(parts[:j]) or "scenario"
                allowed = ", ".join(sorted(node)) if isinstance(node, dict) else "(not a section)"
                raise ConfigError(f"{source}: search_space.{key}: unknown field; allowed in {where}: {allowed}")
            node = node[part]
    mem = base.get("memtp")
    if isinstance(mem, dict) and mem.get("depth") is not None and "policy.gamma" in space:
        raise ConfigError(f"{source}: search_space.policy.gamma: has no effect while base memtp.depth is set "
                          "(the ensemble's max_depth is the draft length); tune memtp.max_depth instead")


def _check_policy_param(spec: TuneSpec, key: str, policy_names: list[str], source: str) -> None:
    """A tuned ``policy.<param>`` is sampled only when ``policy.name`` is a policy that takes it.

    Raises:
        ConfigError: one line naming a policy it would be sampled for that lacks the parameter,
            and the ``when: {policy.name: ...}`` that samples it only for the policies that take it.
    """
    param = key.split(".", 1)[1]
    when = (spec.search_space[key].when or {}).get("policy.name")
    sampled_for = policy_names if when is None else [str(w) for w in (when if isinstance(when, list) else [when])]
    lacking = [n for n in sampled_for if param not in policy_fields(n)]
    if not lacking:
        return
    takers = [n for n in policy_names if param in policy_fields(n)]
    cond = takers[0] if len(takers) == 1 else "[" + ", ".join(takers) + "]"
    raise ConfigError(f"{source}: search_space.{key}: unknown parameter of policy {lacking[0]!r} (a choice of "
                      f"policy.name); sample it only for the policies that take it: add `when: {{policy.name: "
                      f"{cond}}}` to search_space.{key}")


def _check_corners(spec: TuneSpec, source: str) -> None:
    """Every corner of the space (see :func:`_corners`) makes a valid scenario."""
    for values in _corners(spec):
        try:
            Scenario.model_validate(scenario_doc(spec, values))
        except ValidationError as e:
            raise ConfigError(format_validation_error(
                e, f"{source}: search_space: invalid scenario at ({format_values(values)})", Scenario)) from None


#: Above this many combinations of categorical choices, the effect check uses the corners only.
_MAX_CHOICE_COMBINATIONS = 256


def _check_effects(spec: TuneSpec, source: str) -> None:
    """Every field the base sets and every tuned path changes some trial's scenario: the rule
    ``run`` applies to a study (:meth:`memtp_sim.config.Study.expand`), over every combination of
    the space's categorical choices (numeric entries at both ends), or its corners when there are
    more than :data:`_MAX_CHOICE_COMBINATIONS` combinations.

    Raises:
        ConfigError: one line naming the path (``base.`` or ``search_space.``), why it has no
            effect, and what to do.
    """
    space = spec.search_space
    cats = [k for k, d in space.items() if isinstance(d, CategoricalDist)]
    combos = [dict(zip(cats, c)) for c in itertools.product(*(space[k].choices for k in cats))]
    if len(combos) > _MAX_CHOICE_COMBINATIONS:
        points = _corners(spec)
    else:
        points = [_assign(spec, end, c) for c in combos for end in ("low", "high")]
    paths = {f"base.{p}": p for p in set_paths(spec.base)} | {
        f"base.{p}": p for p in spec.base.policy.param_paths if p not in space} | {
        f"search_space.{k}": k for k in space if not k.startswith("policy.")}  # policy params: _check_paths
    reasons: dict[str, str] = {}
    for values in points:
        try:
            ignored = Scenario.model_validate(scenario_doc(spec, values)).ignored_fields()
        except ValidationError:
            continue  # an invalid combination is no trial (the corners were checked above)
        for where, path in list(paths.items()):
            if path in ignored:
                reasons.setdefault(where, ignored[path])
            else:
                del paths[where]  # takes effect in this trial
        if not paths:
            return
    where = sorted(paths)[0]
    raise ConfigError(f"{source}: {where}: has no effect in any trial of this study ({reasons[where]}); "
                      "remove it or change the setting it depends on")


def _corners(spec: TuneSpec) -> list[dict[str, Any]]:
    """All-low and all-high assignments (pair-consistent), and every categorical choice."""
    space = spec.search_space
    cats = [k for k, d in space.items() if isinstance(d, CategoricalDist)]
    corners = [_assign(spec, "low", {}), _assign(spec, "high", {})]
    for key in cats:
        for choice in space[key].choices:
            corners.append(_assign(spec, "low", {key: choice}))
    unique: list[dict[str, Any]] = []
    for c in corners:
        if c not in unique:
            unique.append(c)
    return unique


def _assign(spec: TuneSpec, numeric_end: str, cat_values: dict[str, Any]) -> dict[str, Any]:
    """One point of the space: numeric entries at their ``low`` or ``high`` end (pair-consistent),
    categorical entries at ``cat_values`` (else their first choice), ``when`` respected."""
    rng = static_ranges(spec, source=spec.source)
    space = spec.search_space
    out: dict[str, Any] = {}
    for key in sampling_order(spec, spec.source):
        d = space[key]
        if not when_ok(d.when, out):
            continue
        if isinstance(d, CategoricalDist):
            out[key] = cat_values.get(key, d.choices[0])
            continue
        lo, hi = rng[key]
        if numeric_end == "low":
            for pc in spec.all_pairs():
                if pc.upper == key:
                    lo = max(lo, ceil_in(d, out[pc.lower] + pc.min_gap, pc.min_gap == 0))
            out[key] = lo
        else:
            out[key] = hi
    return out

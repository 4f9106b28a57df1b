"""The search space: pair-rule ranges, sampling through Optuna, and the scenario of a point.

**Search space.** Each key is a dotted path into the scenario (``section.field``; for the policy,
``policy.name`` or ``policy.<param>`` of the policy); the Optuna parameter has the same name, so
``trial.params`` are scenario values. ``type`` is ``float`` (``low``, ``high``, ``log``), ``int``
(``low``, ``high``, ``step``, ``log``) or ``categorical`` (``choices``). ``when: {path: value or
[values]}`` makes an entry conditional on a categorical entry (sampled only when it matches). If
``policy.name`` is sampled, base policy parameters the chosen policy does not know are dropped;
with the MEMTP ensemble on (``memtp.depth`` set) an untuned base ``policy.gamma`` that differs from
``memtp.max_depth`` is dropped too (the ensemble depth is the draft length).

**Ordered pairs** (``"lower < upper"``, optionally ``{rule: ..., name: ..., min_gap: g}``): every
sampled pair satisfies ``upper > lower`` and ``upper - lower >= min_gap``. Both ends must be numeric
search-space entries. At load the rules' bounds are propagated through the (acyclic) rule graph
(:func:`static_ranges`): ``lower`` is clipped to values that leave room below ``upper``'s maximum,
``upper`` to values above ``lower``'s minimum; an empty range means the space is impossible (e.g.
``r_low``'s range lies entirely at or above ``r_high``'s) and loading fails. When sampling
(:func:`sample_params`), ``lower`` is drawn from its clipped (fixed) range first and ``upper``
*conditionally*, from ``[max(upper.low, lower + gap), upper.high]`` (the next grid value above
``lower`` for ints; the next float above it when ``min_gap`` is 0). So ``trial.params`` stay plain
scenario values (readable in optuna-dashboard and by the exporter); the price is that ``upper``'s
distribution varies between trials, which Optuna allows and which TPE models per trial. Two known
scenario orderings are added automatically when both ends are tuned and no rule names them:
``memtp.r_low < memtp.r_high`` and ``engine.prefill_chunk_tokens < engine.max_batch_tokens``.
"""

from __future__ import annotations

import copy
import math
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from ..config import Scenario, format_validation_error
from ..errors import ConfigError
from ..policies import policy_class
from ._spec import CategoricalDist, FloatDist, IntDist, TuneSpec, format_values

if TYPE_CHECKING:  # pragma: no cover
    import optuna

__all__ = [
    "base_doc",
    "ceil_in",
    "floor_in",
    "policy_fields",
    "sample_params",
    "sampling_order",
    "scenario_doc",
    "scenario_for",
    "static_ranges",
    "when_ok",
]


# ------------------------------------------------------------------------------------ grids
def ceil_in(d: FloatDist | IntDist, x: float, strict: bool) -> float | int:
    """Smallest value of ``d``'s domain (ignoring ``high``) that is >= x (> x if ``strict``).

    Args:
        d: the entry (its grid: ``low + k * step`` for ints, every float for floats).
        x: the bound, in the field's units.
        strict: exclude ``x`` itself (the next float above it, or the next grid value).

    Returns:
        The value (an int for :class:`IntDist`).

    Source:
        Optuna's ``IntDistribution`` grid (``low + k * step``); :func:`math.nextafter` for the
        next float (IEEE 754).
    """
    if isinstance(d, FloatDist):
        return math.nextafter(x, math.inf) if strict else float(x)
    k = math.ceil((x - d.low) / d.step)
    v = d.low + k * d.step
    if strict and v <= x:
        v += d.step
    return int(v)


def floor_in(d: FloatDist | IntDist, x: float, strict: bool) -> float | int:
    """Largest value of ``d``'s domain (ignoring ``low``) that is <= x (< x if ``strict``).

    Args:
        d: the entry.
        x: the bound, in the field's units.
        strict: exclude ``x`` itself.

    Returns:
        The value (an int for :class:`IntDist`).

    Source:
        Optuna's ``IntDistribution`` grid (``low + k * step``); :func:`math.nextafter` for the
        previous float (IEEE 754).
    """
    if isinstance(d, FloatDist):
        return math.nextafter(x, -math.inf) if strict else float(x)
    k = math.floor((x - d.low) / d.step)
    v = d.low + k * d.step
    if strict and v >= x:
        v -= d.step
    return int(v)


def static_ranges(spec: TuneSpec, *, source: str = "<tune>") -> dict[str, tuple[float | int, float | int]]:
    """Numeric ranges after propagating the pair rules (fixed for the whole study).

    For each rule ``lower < upper`` (gap g): ``lower <= max(upper) - g`` and ``upper >= min(lower) + g``
    (strict when g = 0), repeated until nothing changes.

    Args:
        spec: the tune spec.
        source: file name for error messages.

    Returns:
        ``{path: (low, high)}`` for every float / int entry.

    Raises:
        ConfigError: a rule empties a range (the space cannot satisfy it).

    Source:
        Bounds propagation over ``x < y`` constraints (interval bounds consistency, as in
        constraint programming), iterated to a fixed point.
    """
    space = spec.search_space
    rng = {k: (d.low, d.high) for k, d in space.items() if not isinstance(d, CategoricalDist)}
    pairs = spec.all_pairs()
    for _ in range(len(pairs) * max(1, len(rng)) + 1):
        changed = False
        for pc in pairs:
            ld, ud = space[pc.lower], space[pc.upper]
            strict = pc.min_gap == 0
            (llo, lhi), (ulo, uhi) = rng[pc.lower], rng[pc.upper]
            new_lhi = min(lhi, floor_in(ld, uhi - pc.min_gap, strict))
            new_ulo = max(ulo, ceil_in(ud, llo + pc.min_gap, strict))
            if new_lhi < llo or new_ulo > uhi:
                gap = f" - {pc.min_gap:g}" if pc.min_gap else ""
                raise ConfigError(
                    f"{source}: pair_constraints ({pc.label}): impossible: {pc.lower} ranges over [{llo}, {lhi}] "
                    f"but {pc.upper}{gap} is at most {uhi - pc.min_gap:g}; the lower side's range must start "
                    f"below the upper side's end")
            if (new_lhi, new_ulo) != (lhi, ulo):
                rng[pc.lower], rng[pc.upper] = (llo, new_lhi), (new_ulo, uhi)
                changed = True
        if not changed:
            break
    return rng


# ------------------------------------------------------------------------------------ sampling
def sampling_order(spec: TuneSpec, source: str = "<tune>") -> list[str]:
    """Entries in declaration order, moved after what they depend on (``when`` targets, pair lowers).

    Args:
        spec: the tune spec.
        source: file name for error messages.

    Returns:
        The search-space keys in sampling order.

    Raises:
        ConfigError: the ``when`` conditions and pair rules form a cycle.

    Source:
        A stable topological sort (Kahn's algorithm, earliest declared ready entry first).
    """
    keys = list(spec.search_space)
    deps: dict[str, set[str]] = {k: set() for k in keys}
    for k, d in spec.search_space.items():
        deps[k].update(t for t in (d.when or {}) if t in deps)
    for pc in spec.all_pairs():
        deps[pc.upper].add(pc.lower)
    order: list[str] = []
    done: set[str] = set()
    while len(order) < len(keys):
        ready = [k for k in keys if k not in done and deps[k] <= done]
        if not ready:
            left = [k for k in keys if k not in done]
            raise ConfigError(f"{source}: pair_constraints / when: the rules form a cycle among {', '.join(left)}")
        order.append(ready[0])
        done.add(ready[0])
    return order


def when_ok(when: dict[str, Any] | None, values: dict[str, Any]) -> bool:
    """Whether an entry's ``when`` condition holds for the values drawn so far.

    Args:
        when: ``{categorical path: value or [values]}``, or None (always).
        values: dotted path -> value drawn so far.

    Returns:
        True when every named entry was drawn with one of its wanted values.

    Source:
        Conditional parameters of Optuna's define-by-run search spaces (Optuna documentation,
        "Pythonic search space").
    """
    if not when:
        return True
    for target, want in when.items():
        wants = want if isinstance(want, list) else [want]
        if target not in values or values[target] not in wants:
            return False
    return True


def sample_params(trial: optuna.trial.Trial, spec: TuneSpec) -> dict[str, Any]:
    """Draw one point of the search space through ``trial.suggest_*``.

    Pair rules hold for every draw: the lower side comes from its propagated (fixed) range, the
    upper side from ``[max(static low, lower + gap), static high]`` (see the module docstring).

    Args:
        trial: a live Optuna trial.
        spec: the tune spec.

    Returns:
        ``{dotted path: value}`` for every entry whose ``when`` condition holds.

    Raises:
        ConfigError: an impossible pair rule or a cycle (from :func:`static_ranges` /
            :func:`sampling_order`; normally refused when the spec is loaded).
        AssertionError: an empty conditional range (an internal invariant; cannot happen after
            :func:`static_ranges`).

    Source:
        Optuna documentation: ``Trial.suggest_float`` / ``suggest_int`` / ``suggest_categorical``,
        whose ranges may differ between trials (define-by-run).
    """
    rng = static_ranges(spec, source=spec.source)
    pairs = spec.all_pairs()
    values: dict[str, Any] = {}
    for key in sampling_order(spec, spec.source):
        d = spec.search_space[key]
        if not when_ok(d.when, values):
            continue
        if isinstance(d, CategoricalDist):
            values[key] = trial.suggest_categorical(key, d.choices)
            continue
        lo, hi = rng[key]
        for pc in pairs:
            if pc.upper == key:
                lo = max(lo, ceil_in(d, values[pc.lower] + pc.min_gap, pc.min_gap == 0))
        if lo > hi:  # cannot happen after static_ranges; keep the invariant loud
            raise AssertionError(f"{key}: empty conditional range [{lo}, {hi}]")
        if isinstance(d, FloatDist):
            values[key] = trial.suggest_float(key, float(lo), float(hi), log=d.log)
        else:
            values[key] = trial.suggest_int(key, int(lo), int(hi), step=d.step, log=d.log)
    return values


# ------------------------------------------------------------------------------------ scenarios
def base_doc(spec: TuneSpec) -> dict[str, Any]:
    """The base scenario as a plain mapping, policy flattened (``{name, **params}``).

    Args:
        spec: the tune spec.

    Returns:
        A fresh mapping (safe to modify at the top level; copy before changing nested sections).

    Source:
        pydantic ``BaseModel.model_dump(mode="python")``.
    """
    doc = spec.base.model_dump(mode="python")
    doc["policy"] = {"name": spec.base.policy.name, **spec.base.policy.params}
    return doc


def policy_fields(name: str) -> set[str]:
    """The parameter names of a registered policy.

    Args:
        name: policy name, e.g. ``"dspark"``.

    Returns:
        Its ``Params`` model's field names.

    Raises:
        InvalidArgumentError: unknown policy (a ValueError; the message lists the registered ones),
            from :func:`memtp_sim.policies.policy_class`.

    Source:
        The policy registry (:mod:`memtp_sim.policies.registry`) and pydantic ``model_fields``.
    """
    return set(policy_class(name).Params.model_fields)


def scenario_doc(spec: TuneSpec, values: dict[str, Any]) -> dict[str, Any]:
    """The base scenario mapping with ``values`` set (not validated; see :func:`scenario_for`).

    Args:
        spec: the tune spec.
        values: dotted path -> value.

    Returns:
        The scenario mapping.

    Raises:
        InvalidArgumentError: ``values["policy.name"]`` is not a registered policy (from
            :func:`policy_fields`).
    """
    doc = copy.deepcopy(base_doc(spec))
    name = values.get("policy.name")
    if name is not None and name != doc["policy"]["name"]:
        keep = policy_fields(str(name))
        doc["policy"] = {"name": name, **{k: v for k, v in doc["policy"].items() if k in keep}}
    for key, value in values.items():
        parts = key.split(".")
        node = doc
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    mem = doc.get("memtp")
    if (isinstance(mem, dict) and mem.get("depth") is not None and "policy.gamma" not in values
            and "gamma" in doc["policy"] and doc["policy"]["gamma"] != mem.get("max_depth")):
        del doc["policy"]["gamma"]  # with the ensemble on, the draft length is memtp.max_depth
    return doc


def scenario_for(spec: TuneSpec, values: dict[str, Any]) -> Scenario:
    """The base scenario with ``values`` (dotted path -> value) set.

    When ``policy.name`` changes the policy, base policy parameters the new policy does not
    define are dropped; with ``memtp.depth`` set, an untuned ``policy.gamma`` that differs from
    ``memtp.max_depth`` is dropped (the ensemble depth is the draft length).

    Args:
        spec: the tune spec.
        values: search-space values, e.g. ``trial.params``.

    Returns:
        The validated scenario.

    Raises:
        ConfigError: the values make an invalid scenario.
        InvalidArgumentError: ``values["policy.name"]`` is not a registered policy (from
            :func:`scenario_doc`).

    Source:
        pydantic v2 ``model_validate`` on :class:`memtp_sim.config.Scenario`; errors formatted
        by :func:`memtp_sim.config.format_validation_error`.
    """
    try:
        return Scenario.model_validate(scenario_doc(spec, values))
    except ValidationError as e:
        raise ConfigError(format_validation_error(
            e, f"{spec.source}: search_space: invalid scenario at ({format_values(values)})", Scenario)) from None

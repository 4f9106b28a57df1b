"""What-if settings: the controls' values, the URL query that carries them, the scenario they make.

A *settings* mapping holds one value per control, keyed by the dotted scenario path the control
sets (``workload.concurrency``, ``policy.gamma``, ``confidence.temperature``, ...), plus two keys
of the page itself: ``seeds`` (replicate seeds as text, ``"0,1,2"``) and ``extra_gib`` (memory
added to the hardware profile's allocatable memory, GiB; it funds KV blocks and MEMTP heads).
Only the keys that apply in the chosen modes are present (``workload.concurrency`` only in
closed-loop mode, ``memtp.r_low`` only with the elastic ensemble, ...).

*Extras* are dotted scenario paths that no control sets (``engine.max_batch_tokens``,
``acceptance.domain_mix``, ...): a link (e.g. from a tuning trial) may carry them, and they are
applied on top of everything else.

The URL query holds every setting that differs from :data:`DEFAULTS` and every extra
(:func:`settings_to_query`), so a link reproduces the view (:func:`query_to_settings`). Values are
written as JSON (numbers, ``true``, lists), plain text for strings.

Nothing here simulates: :func:`validate` asks :class:`memtp_sim.config.Scenario` (the library's
one-line errors, :func:`memtp_sim.config.format_validation_error`), and the fields the library says
cannot take effect (:meth:`Scenario.ignored_fields`) are dropped so that equal runs share one cache
entry.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import re
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

import memtp_sim

from .._io import atomic_write_bytes, atomic_write_text, load_yaml
from ..config import Scenario, Study, format_validation_error
from ..errors import MemtpSimError
from ..hardware import DEFAULT_PROFILE, calibration_dir, list_profiles, load_profile
from ..memtp import MEMTP_DEFAULTS
from ..policies import available_policies, policy_class

__all__ = [
    "DEFAULTS",
    "DEFAULT_TRACE",
    "LOAD_KEYS",
    "SOURCE",
    "Invalid",
    "Workdir",
    "applicable",
    "parse_seeds",
    "policy_param_fields",
    "query_to_settings",
    "scenario_doc",
    "settings_from_scenario",
    "settings_to_query",
    "shipped_traces",
    "sweep_key",
    "validate",
]

#: The name the library's error lines start with (``what-if: workload.concurrency: ...``).
SOURCE = "what-if"

#: The shipped trace the what-if page starts from (the tuning study's traffic).
DEFAULT_TRACE = "azure2023_conv.csv"

#: Defaults of the what-if page: the disaggregated gfx1151 deployment of ``studies/tune.yaml`` at
#: 16 closed-loop users. ``workload.num_requests`` (120 instead of the tuning study's 160) and
#: ``confidence.sts_rounds`` (5,000 held-out rounds instead of the library's 20,000: 0.11 s instead
#: of 0.48 s per seed, ECE of the fitted head 0.014 instead of 0.013) keep one what-if point (3 seeds,
#: about 0.3 s each) under 2 s on 2 cores; ``benchmarks/bench_dashboard.py`` measures it.
DEFAULTS: dict[str, Any] = {
    "hardware.profile": DEFAULT_PROFILE,
    "extra_gib": 0.0,
    "workload.trace": DEFAULT_TRACE,
    "workload.mode": "closed_loop",
    "workload.concurrency": 16,
    "workload.rate_per_s": 1.0,
    "workload.rate_scale": 1.0,
    "workload.num_requests": 120,
    "engine.prefill": "disaggregated",
    "engine.prefill_gpus": 4,
    "policy.name": "dspark",
    "policy.gamma": 7,
    "confidence.temperature": 1.0,
    "confidence.sts": "fit",
    "confidence.sts_rounds": 5000,
    "memtp.depth": None,
    "memtp.max_depth": 7,
    "memtp.head_cost_gib": float(MEMTP_DEFAULTS.head_cost_gib),
    "memtp.r_low": float(MEMTP_DEFAULTS.r_low),
    "memtp.r_high": float(MEMTP_DEFAULTS.r_high),
    "seeds": "0,1,2",
}

#: Sections the scenario has no control for keep these values (the tuning study's base).
_HIDDEN_BASE: dict[str, Any] = {
    "acceptance": {"profile": "dspark-qwen3", "domain_mix": {"chat": 1.0}},
    "engine": {"max_batch_tokens": 512, "prefill_chunk_tokens": 256},
}

#: The load axis of each workload mode (what a load sweep varies).
LOAD_KEYS = {"closed_loop": "workload.concurrency", "poisson": "workload.rate_per_s",
             "trace": "workload.rate_scale"}

#: Keys the page owns (never scenario paths).
_PAGE_KEYS = ("seeds", "extra_gib")


def sweep_key(settings: dict[str, Any]) -> str:
    """The scenario path a load sweep varies for these settings (by workload mode).

    Args:
        settings: what-if settings.

    Returns:
        ``workload.concurrency``, ``workload.rate_per_s`` or ``workload.rate_scale``.
    """
    return LOAD_KEYS.get(str(settings.get("workload.mode")), LOAD_KEYS["closed_loop"])


# ------------------------------------------------------------------------------------ files
def shipped_traces() -> dict[str, Path]:
    """The request traces shipped with the repository, by file name.

    Looks in ``<repo>/data/traces`` (an editable install) and ``./data/traces``.

    Returns:
        ``{file name: path}``, sorted by name; empty when neither folder exists.
    """
    out: dict[str, Path] = {}
    for folder in (Path(memtp_sim.__file__).resolve().parent.parent / "data" / "traces",
                   Path.cwd() / "data" / "traces"):
        if folder.is_dir():
            for p in sorted(folder.glob("*.csv")):
                out.setdefault(p.name, p.resolve())
    return dict(sorted(out.items()))


@dataclass(frozen=True)
class Workdir:
    """The dashboard's own folder: cached runs, uploaded files and derived hardware profiles.

    Attributes:
        root: the folder (created on first use).
    """

    root: Path

    def save_upload(self, files: list[tuple[str, bytes]]) -> list[Path]:
        """Store uploaded files together in a content-addressed folder (so a link to them stays valid).

        Args:
            files: ``(file name, contents)`` pairs uploaded together (a profile YAML and its
                measurements CSV, or a trace).

        Returns:
            The stored paths, in input order.
        """
        h = hashlib.sha256()
        for name, data in sorted(files):
            h.update(name.encode() + b"\0" + data)
        folder = self.root / "uploads" / h.hexdigest()[:16]
        out = []
        for name, data in files:
            path = folder / Path(name).name
            if not path.is_file():
                atomic_write_bytes(path, data)
            out.append(path)
        return out

    def derived_profile(self, profile: str, extra_gib: float) -> str:
        """A copy of a hardware profile with ``extra_gib`` more allocatable memory.

        The copy names its measurements file by absolute path, is named ``<name>+<extra>GiB`` and
        is stored by content, so equal settings give the same path (and the same cached runs).

        Args:
            profile: shipped profile name or YAML path.
            extra_gib: memory to add (negative removes), GiB.

        Returns:
            The copy's path.

        Raises:
            CalibrationError: the profile cannot be read.
        """
        src = Path(load_profile(profile).path)
        doc = load_yaml(src.read_text(encoding="utf-8"))
        doc["measurements"] = str((src.parent / str(doc["measurements"])).resolve())
        doc["name"] = f"{doc['name']}{extra_gib:+g}GiB"
        mem = doc["memory"]
        mem["gpu_allocatable_gib"] = float(mem["gpu_allocatable_gib"]) + float(extra_gib)
        mem["gpu_allocatable_source"] = (f"{mem.get('gpu_allocatable_source', '')} "
                                         f"[what-if: {extra_gib:+g} GiB set in the dashboard]").strip()
        text = yaml.safe_dump(doc, sort_keys=False)
        path = self.root / "profiles" / hashlib.sha256(text.encode()).hexdigest()[:16] / src.name
        if not path.is_file():
            atomic_write_text(path, text)
        return str(path)


# ------------------------------------------------------------------------------------ policies
def policy_param_fields(name: str) -> dict[str, Any]:
    """The parameters of a registered policy (its pydantic ``Params`` fields), gamma excluded.

    ``gamma`` (the block size) is the page's *max depth* control; every other parameter gets a
    control built from its field, so a newly registered policy appears without dashboard changes.

    Args:
        name: policy name.

    Returns:
        ``{parameter: pydantic FieldInfo}`` in declaration order; empty for an unknown policy.
    """
    if name not in available_policies():
        return {}
    return {k: f for k, f in policy_class(name).Params.model_fields.items() if k != "gamma"}


def _has_gamma(name: str) -> bool:
    return name in available_policies() and "gamma" in policy_class(name).Params.model_fields


# ------------------------------------------------------------------------------------ URL
def _encode(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v, separators=(",", ":"))


def _decode(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _section_model(name: str) -> type[BaseModel] | None:
    """The model of a Scenario section (``workload`` -> WorkloadConfig), None for a plain field."""
    ann = Scenario.model_fields[name].annotation
    return ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None


def _is_scenario_path(path: str) -> bool:
    """``section.field`` of the Scenario model, or a top-level field that is no section (any
    ``policy.<param>`` counts)."""
    parts = path.split(".")
    if parts[0] not in Scenario.model_fields or len(parts) > 2:
        return False
    model = _section_model(parts[0])
    if len(parts) == 1:
        return model is None
    if model is None:
        return False
    return model.model_config.get("extra") == "allow" or parts[1] in model.model_fields  # policy: its params


def _control_paths(settings: dict[str, Any]) -> set[str]:
    """Paths a control of the page owns for these settings (the rest of a link is an extra)."""
    own = {k for k in DEFAULTS if k != "policy.gamma"}
    own |= {f"policy.{p}" for p in policy_param_fields(str(settings.get("policy.name")))}
    if _has_gamma(str(settings.get("policy.name"))):
        own.add("policy.gamma")
    return own


def settings_to_query(settings: dict[str, Any], extras: dict[str, Any] | None = None) -> str:
    """The URL query (with its ``?``) holding the settings that differ from :data:`DEFAULTS`, then
    the extras.

    Args:
        settings: what-if settings (only the keys that apply).
        extras: dotted scenario paths without a control, and their values.

    Returns:
        e.g. ``"?confidence.temperature=1.5&policy.gamma=4"``; ``""`` when all are defaults.
    """
    pairs = []
    for k, v in settings.items():
        default = DEFAULTS.get(k, _param_default(settings, k))
        if v != default:
            pairs.append((k, _encode(v)))
    pairs += [(k, _encode(v)) for k, v in sorted((extras or {}).items())]
    return "?" + urllib.parse.urlencode(pairs) if pairs else ""


def _param_default(settings: dict[str, Any], key: str) -> Any:
    """The policy's own default for ``policy.<param>`` (a value no setting can equal otherwise)."""
    if key.startswith("policy."):
        field = policy_param_fields(str(settings.get("policy.name"))).get(key.split(".", 1)[1])
        if field is not None:
            return field.default
    return object()


def query_to_settings(search: str | None) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """Read a URL query back into settings (defaults for what it does not say) and extras.

    Args:
        search: the query, with or without its ``?`` (``dcc.Location.search``).

    Returns:
        ``(settings, extras, ignored)``: settings hold every key of :data:`DEFAULTS` plus the
        policy's parameters (its defaults unless given), extras the other scenario paths of the
        link, ignored the keys that are neither (shown to the user, never applied).
    """
    given = dict(urllib.parse.parse_qsl((search or "").lstrip("?"), keep_blank_values=True))
    settings = dict(DEFAULTS)
    for k in DEFAULTS:
        if k in given:
            settings[k] = _decode(given[k])
    extras, ignored = {}, []
    if not isinstance(settings["confidence.sts"], str):  # per-position temperatures: no control holds a list
        extras["confidence.sts"], settings["confidence.sts"] = settings["confidence.sts"], DEFAULTS["confidence.sts"]
    name = str(settings["policy.name"])
    for p, field in policy_param_fields(name).items():
        key = f"policy.{p}"
        settings[key] = _decode(given[key]) if key in given else field.default
    own = _control_paths(settings) | set(_PAGE_KEYS)
    for k, v in given.items():
        if k in own or k in extras:
            continue
        if _is_scenario_path(k) and not k.startswith("policy."):
            extras[k] = _decode(v)
        else:
            ignored.append(k)
    return settings, extras, ignored


# ------------------------------------------------------------------------------------ scenario
def _set(doc: dict[str, Any], path: str, value: Any) -> None:
    if "." not in path:
        doc[path] = value
        return
    section, field = path.split(".", 1)
    doc.setdefault(section, {})[field] = value


def _unset(doc: dict[str, Any], path: str) -> bool:
    """Remove ``path`` from the scenario mapping; whether it was there."""
    section, _, field = path.partition(".")
    node = doc if not field else doc.get(section)
    key = field or section
    if isinstance(node, dict) and key in node:
        del node[key]
        return True
    return False


#: Scenario fields that name a file the server reads.
FILE_FIELDS = ("workload.trace", "hardware.profile", "acceptance.profile")


def served_roots(workdir: Workdir | None) -> list[Path]:
    """Folders whose files a page may make the server read: the shipped calibration and traces, the
    dashboard's own folder (uploads, derived profiles) and the folder it was started in."""
    roots = [calibration_dir(), *{p.parent for p in shipped_traces().values()}, Path.cwd()]
    if workdir is not None:
        roots.append(workdir.root)
    return [r.resolve() for r in roots]


def outside_served(value: Any, workdir: Workdir | None) -> str | None:
    """Why a file value may not be read for a page (a link or a typed box could otherwise name any
    file on the server, and a parse error would show part of it), or None. A bare name (a shipped
    profile or trace) is always fine: the library looks it up among the shipped files."""
    if not isinstance(value, str) or ("/" not in value and "\\" not in value):
        return None
    path = Path(value).expanduser().resolve()
    if any(path.is_relative_to(root) for root in served_roots(workdir)):
        return None
    return (f"{value}: outside the folders this dashboard reads (the shipped calibration and traces, its "
            "uploads and the folder it was started in); upload the file instead")


def _trace_path(value: Any) -> Any:
    """A shipped trace's file name -> its path; anything else as given (a path)."""
    traces = shipped_traces()
    return str(traces[value]) if isinstance(value, str) and value in traces else value


def scenario_doc(settings: dict[str, Any], extras: dict[str, Any] | None = None,
                 workdir: Workdir | None = None) -> dict[str, Any]:
    """The scenario mapping the settings describe (what :class:`Scenario` validates).

    Starts from the tuning study's base (acceptance ``dspark-qwen3`` chat, 512-token passes,
    256-token prefill chunks), sets every scenario path of ``settings`` (a shipped trace's name
    becomes its path; ``extra_gib`` other than 0 points ``hardware.profile`` at a copy of the
    profile with that much more memory, :meth:`Workdir.derived_profile`), then the extras.

    Args:
        settings: what-if settings.
        extras: paths without a control.
        workdir: where derived profiles go (needed when ``extra_gib`` is not 0).

    Returns:
        The nested scenario mapping.

    Raises:
        MemtpSimError: the profile cannot be read to add memory to it.
    """
    doc = copy.deepcopy(_HIDDEN_BASE)
    for k, v in settings.items():
        if k in _PAGE_KEYS:
            continue
        _set(doc, k, _trace_path(v) if k == "workload.trace" else v)
    extra = settings.get("extra_gib") or 0
    if extra and workdir is not None and isinstance(extra, (int, float)) and not isinstance(extra, bool):
        doc["hardware"]["profile"] = workdir.derived_profile(str(doc["hardware"]["profile"]), float(extra))
    for k, v in (extras or {}).items():
        _set(doc, k, v)
    return doc


@dataclass(frozen=True)
class Invalid:
    """Why settings make no valid scenario: the library's one-line error and the path it names.

    Attributes:
        message: the library's error line (``what-if: workload.concurrency: ... (got 0)``).
        path: the dotted scenario path (or page key, e.g. ``seeds``, ``extra_gib``) the line is
            about; ``""`` when it names none.
    """

    message: str
    path: str


def _error_path(line: str, loc: tuple[Any, ...]) -> str:
    """The dotted path an error line is about: from the error's location, else its first words."""
    parts = [str(x) for x in loc if not isinstance(x, int)]
    if len(parts) >= 2:
        return ".".join(parts[:2])
    m = re.match(rf"{re.escape(SOURCE)}: (\w+\.\w+)", line)
    if m:
        return m.group(1)
    return parts[0] if parts else ""


def parse_seeds(text: Any, scenario: Scenario) -> list[int] | Invalid:
    """Replicate seeds from the page's text (``"0,1,2"``), checked by the library's Study model.

    Args:
        text: comma-separated seeds.
        scenario: the (valid) scenario they replicate (a Study needs a base).

    Returns:
        The seeds, or :class:`Invalid` (path ``seeds``) with the library's one-line error.
    """
    values: list[Any] = []
    for t in (t.strip() for t in str(text if text is not None else "").split(",")):
        if t:
            try:
                values.append(int(t))
            except ValueError:
                values.append(t)
    try:
        study = Study.model_validate({"name": "whatif", "base": scenario, "seeds": values})
    except ValidationError as e:
        return Invalid(format_validation_error(e, SOURCE), "seeds")
    return list(study.seeds)


def applicable(full: dict[str, Any]) -> dict[str, Any]:
    """The settings that apply in the chosen modes, from a value for every control.

    Args:
        full: one value per control key (:data:`DEFAULTS` keys and ``policy.<param>``); the
            page's *max depth* control fills both ``policy.gamma`` and ``memtp.max_depth``.

    Returns:
        The settings: the load key of the workload mode only, ``engine.prefill_gpus`` only when
        disaggregated, the policy's own parameters, ``policy.gamma`` with the classic drafter
        (``memtp.max_depth`` with the elastic ensemble, ``memtp.depth`` = heads when fixed),
        ``confidence.sts_rounds`` only with ``sts: fit``.
    """
    s = {k: full.get(k, DEFAULTS[k]) for k in (
        "hardware.profile", "extra_gib", "workload.trace", "workload.mode", "workload.num_requests",
        "engine.prefill", "policy.name", "confidence.temperature", "confidence.sts", "seeds")}
    load = sweep_key(s)
    s[load] = full.get(load, DEFAULTS[load])
    if s["engine.prefill"] == "disaggregated":
        s["engine.prefill_gpus"] = full.get("engine.prefill_gpus", DEFAULTS["engine.prefill_gpus"])
    name = str(s["policy.name"])
    for p, field in policy_param_fields(name).items():
        s[f"policy.{p}"] = full.get(f"policy.{p}", field.default)
    depth = full.get("memtp.depth")
    if depth is None:
        if _has_gamma(name):
            s["policy.gamma"] = full.get("policy.gamma", DEFAULTS["policy.gamma"])
    else:
        s["memtp.depth"] = depth
        s["memtp.head_cost_gib"] = full.get("memtp.head_cost_gib", DEFAULTS["memtp.head_cost_gib"])
        if depth == "elastic":
            for k in ("memtp.max_depth", "memtp.r_low", "memtp.r_high"):
                s[k] = full.get(k, DEFAULTS[k])
    if s["confidence.sts"] == "fit":
        s["confidence.sts_rounds"] = full.get("confidence.sts_rounds", DEFAULTS["confidence.sts_rounds"])
    return s


def _memory_short(settings: dict[str, Any]) -> str | None:
    """Why the extra memory leaves too little for the weights, reserve and drafter; None when it does
    not (or the profile or value is unreadable: the scenario check says why)."""
    extra = settings.get("extra_gib") or 0
    if not isinstance(extra, (int, float)) or isinstance(extra, bool) or extra >= 0:
        return None
    try:
        prof = load_profile(str(settings.get("hardware.profile", DEFAULT_PROFILE)))
    except MemtpSimError:
        return None
    m = prof.memory
    need = m.least_allocatable_gib
    if m.gpu_allocatable_gib + extra >= need:
        return None
    least = math.ceil((need - m.gpu_allocatable_gib) * 100 + 1e-6) / 100  # rounded up: the shown bound is allowed
    return (f"extra memory: {extra:+g} GiB leaves {m.gpu_allocatable_gib + extra:.2f} of {prof.name}'s "
            f"{m.gpu_allocatable_gib:.2f} GiB allocatable, less than the {need:.2f} GiB its weights "
            f"({m.weights_gib:.2f}), reserve ({m.reserve_gib:.2f}), drafter ({m.drafter_weights_gib:.2f}) and one "
            f"KV block ({m.kv_block_gib:.4f}) need; allowed: {least:+.2f} GiB or more")


def validate(settings: dict[str, Any], extras: dict[str, Any] | None = None,
             workdir: Workdir | None = None) -> tuple[Scenario, list[int]] | Invalid:
    """The validated scenario and seeds of the settings, or the library's reason why there are none.

    Fields the library reports as having no effect (:meth:`Scenario.ignored_fields`, e.g. the
    confidence of a policy that drafts nothing) are dropped and the scenario validated again, so
    equal runs resolve to equal scenarios.

    Args:
        settings: what-if settings.
        extras: paths without a control.
        workdir: where derived profiles go.

    Returns:
        ``(scenario, seeds)``, or :class:`Invalid` with the one-line error and its path.
    """
    extra = settings.get("extra_gib", 0.0)
    if not (isinstance(extra, (int, float)) and not isinstance(extra, bool) and math.isfinite(extra)):
        # an emptied or unreadable box: refused, not read as 0 GiB (a result nobody chose)
        return Invalid(f"{SOURCE}: extra_gib: expected a number of GiB, 0 for the profile's own memory "
                       f"(got {extra!r})", "extra_gib")
    short = _memory_short(settings)
    if short is not None:
        return Invalid(f"{SOURCE}: {short}", "extra_gib")
    name = settings.get("policy.name")
    if name not in available_policies():  # a link's unknown name (the dropdown then shows none)
        said = "no policy chosen (a link may name one this version does not have)" if name is None \
            else f"unknown policy {name!r}"
        return Invalid(f"{SOURCE}: policy.name: {said}; choose one of: {', '.join(available_policies())}",
                       "policy.name")
    for field in FILE_FIELDS:
        why = outside_served(settings.get(field, (extras or {}).get(field)), workdir)
        if why is not None:
            return Invalid(f"{SOURCE}: {field}: {why}", field)
    try:
        doc = scenario_doc(settings, extras, workdir)
    except MemtpSimError as e:
        return Invalid(f"{SOURCE}: hardware.profile: {e}", "hardware.profile")
    try:
        scen = Scenario.model_validate(doc)
        dropped = [path for path in scen.ignored_fields() if _unset(doc, path)]
        scen = Scenario.model_validate(doc) if dropped else scen
    except ValidationError as e:
        line = format_validation_error(e, SOURCE, Scenario)
        path = _error_path(line, tuple(e.errors()[0]["loc"]))
        if path == "hardware.profile" and settings.get("extra_gib"):
            path = "extra_gib"  # the derived profile (more or less memory) is what failed: say so, not its file
            line = re.sub(r"hardware\.profile: \S+\.yaml: ", f"extra memory {settings['extra_gib']:+g} GiB: ", line)
        return Invalid(line, path)
    except MemtpSimError as e:  # a check that raises the library's own error instead of pydantic's
        return Invalid(f"{SOURCE}: {e}", "")
    seeds = parse_seeds(settings.get("seeds", DEFAULTS["seeds"]), scen)
    return seeds if isinstance(seeds, Invalid) else (scen, seeds)


def settings_from_scenario(scenario: Scenario, seeds: list[int] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Settings (and extras) that make ``scenario`` again, e.g. to open a tuning trial.

    Args:
        scenario: a validated scenario.
        seeds: replicate seeds (default: those of :data:`DEFAULTS`).

    Returns:
        ``(settings, extras)``: what :func:`settings_to_query` writes into a link.
    """
    dump = scenario.model_dump(mode="json")
    wl, eng, mem, conf = dump["workload"], dump["engine"], dump["memtp"], dump["confidence"]
    traces = {str(p): n for n, p in shipped_traces().items()}
    profiles = {str(Path(p).resolve()): n for n, p in list_profiles().items()}
    prof = str(dump["hardware"]["profile"])
    s: dict[str, Any] = {"hardware.profile": profiles.get(str(Path(prof).resolve()), prof),
                         "workload.trace": traces.get(str(Path(wl["trace"]).resolve()), wl["trace"]),
                         "workload.mode": wl["mode"], "workload.num_requests": wl["num_requests"],
                         "engine.prefill": eng["prefill"], "policy.name": dump["policy"]["name"]}
    s[LOAD_KEYS[wl["mode"]]] = wl[LOAD_KEYS[wl["mode"]].split(".")[1]]
    if eng["prefill"] == "disaggregated":
        s["engine.prefill_gpus"] = eng["prefill_gpus"]
    params = {k: v for k, v in dump["policy"].items() if k != "name"}
    for p in policy_param_fields(s["policy.name"]):
        s[f"policy.{p}"] = params.get(p, policy_param_fields(s["policy.name"])[p].default)
    if mem["depth"] is not None:
        s["memtp.depth"] = mem["depth"]
        s["memtp.head_cost_gib"] = mem["head_cost_gib"]
        if mem["depth"] == "elastic":
            s.update({"memtp.max_depth": mem["max_depth"], "memtp.r_low": mem["r_low"], "memtp.r_high": mem["r_high"]})
    elif "gamma" in params:
        s["policy.gamma"] = params["gamma"]
    ignored = scenario.ignored_fields()
    if "confidence.temperature" not in ignored:
        s["confidence.temperature"] = conf["temperature"]
        s["confidence.sts"] = conf["sts"] if isinstance(conf["sts"], str) else "fit"
        if conf["sts"] == "fit":
            s["confidence.sts_rounds"] = conf["sts_rounds"]
    s["seeds"] = ",".join(str(x) for x in seeds) if seeds is not None else DEFAULTS["seeds"]
    return s, _extras_of(scenario, dump, s)


def _extras_of(scenario: Scenario, dump: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    """Fields of ``dump`` that the settings alone do not make (the page's hidden base differs)."""
    base = validate(settings)
    base_dump = base[0].model_dump(mode="json") if not isinstance(base, Invalid) else {}
    ignored = scenario.ignored_fields()
    extras: dict[str, Any] = {}
    for section, fields in dump.items():
        if section == "policy":
            continue
        if _section_model(section) is None:  # a top-level field
            if section not in ignored and fields != base_dump.get(section):
                extras[section] = fields
            continue
        for field, value in fields.items():
            path = f"{section}.{field}"
            if path not in ignored and value != base_dump.get(section, {}).get(field):
                extras[path] = value
    if isinstance(dump["confidence"]["sts"], list) and "confidence.sts" not in ignored:
        extras["confidence.sts"] = dump["confidence"]["sts"]
    return extras

"""Production configs from a tuned study: vLLM, SGLang and the MEMTP controller, with provenance.

``python -m memtp_sim export --study NAME [--storage URL] [--trial best|N] --format vllm|sglang|memtp
[-o FILE]`` picks a trial (``best``: see :func:`memtp_sim.tuning.select_trial`), makes sure it has been re-run on
fresh seeds (runs the validation now if the tuner has not), and writes:

* ``vllm``: JSON with ``speculative_config`` (``method``, default ``dspark``: vLLM's DSpark drafter;
  ``num_speculative_tokens`` = the tuned max depth; with ``dspark``, ``enable_adaptive_verification``,
  true for a DSpark policy, whose confidence-scheduled verify budget vLLM's PR #47808 runs; and a
  ``dspark`` block with the simulated settings: policy and its parameters, confidence temperature
  and per-position temperatures, MEMTP gate thresholds when the ensemble is on). ``vllm_cli`` is the
  ``--speculative-config`` argument without the ``dspark`` block (vLLM itself does not know it; a
  DSpark-aware build reads it from the file). vLLM's adaptive verification is the same idea as the
  simulated Algorithm 1 on the profile's SPS(B), not its code.
* ``sglang``: a flags file (one flag per line, ``#`` comments carry the DSpark settings and the
  provenance as YAML) with ``--speculative-algorithm``, ``--speculative-num-steps`` (= max depth),
  ``--speculative-eagle-topk 1`` and ``--speculative-num-draft-tokens`` (= max depth + 1, a single
  chain plus the bonus token), and next to it ``<stem>.sps.json``: the hardware profile's measured
  B -> SPS table (steps per second = 1000 / pass_ms) with its source and lookup rule.
* ``memtp``: YAML ``controller`` block: ``max_depth``, ``r_low``, ``r_high``, ``head_cost_gib``,
  ``temperature`` and ``position_temperatures``, the policy. Only for a trial that simulated the
  MEMTP ensemble (``memtp.depth`` set): otherwise the gate and head cost were never simulated,
  and ``--format memtp`` is refused in one line rather than writing library defaults as if tuned.

The *max depth* is the scenario's ``memtp.max_depth`` when the MEMTP ensemble is on
(``memtp.depth`` set), otherwise the policy's draft length (``policy.gamma``; ``k`` for static).
Gate thresholds and head cost come from the scenario's ``memtp`` section when the ensemble is on;
otherwise :func:`deployment_settings` reports :data:`memtp_sim.memtp.MEMTP_DEFAULTS`, marked as
library defaults that were not simulated (vLLM and SGLang files then carry no gate).

Every file records ``provenance``: study, storage (password masked), trial number and the rule that
chose it, parameters, objective and constraint values (tuning mean and per-seed values; fresh-seed
mean with its t-distribution 95% CI), calibration profiles with their sources, the input files
(trace, profiles) with their content digests (``input_files``; ``input_files_checked`` says whether
they were checked against the digests the study recorded when it was made), and the memtp_sim and
Optuna versions. Files are written atomically.

A study whose input files changed since it was tuned is refused (one line naming the file; see
:func:`memtp_sim.tuning.check_study_inputs`): its trials were priced on the old contents, while the
SGLang SPS table, the calibration provenance and any validation run now would come from the new
ones, so the file would describe a deployment nobody simulated. A study made before the digests
were recorded is exported with one note line saying its inputs cannot be checked.

``--trial N`` exports trial N even when it fails the constraints (it was asked for by number), with
one warning line saying which constraint fails and by how much; so does a trial that meets them on
the tuning seeds but not on the fresh validation seeds.
"""

from __future__ import annotations

import datetime as _dt
import json
import shlex
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml

from .._io import atomic_write_text
from .._version import __version__
from ..api import build_acceptance
from ..config import Scenario
from ..drafting import DEFAULT_DRAFTER_KIND, DraftSpec
from ..errors import ConfigError
from ..hardware import load_profile
from ..memtp import MEMTP_DEFAULTS, MemtpSettings
from ..policies import make_policy
from ..policies.control import parse_range_table
from ._loading import parse_tune_spec
from ._selection import constraint_failures, select_trial
from ._space import scenario_for
from ._spec import STUDY_ATTR, TuneSpec
from ._storage import check_study_inputs, default_storage_url, mask_url, open_storage
from ._validation import validate_trials

if TYPE_CHECKING:  # pragma: no cover
    import optuna

__all__ = ["FORMATS", "build_export", "deployment_settings", "export_config", "method_mismatch", "provenance_for"]

FORMATS = ("vllm", "sglang", "memtp")


class _PlainDumper(yaml.SafeDumper):
    """Safe YAML without anchors/aliases (shared lists are written out in full)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _yaml(doc: Any) -> str:
    return yaml.dump(doc, Dumper=_PlainDumper, sort_keys=False, allow_unicode=True)


_SUFFIX = {"vllm": ".vllm.json", "sglang": ".sglang.args", "memtp": ".memtp.yaml"}

#: Why ``--format memtp`` is refused when the MEMTP ensemble was not simulated (memtp.depth unset).
_NOT_SIMULATED = ("--format memtp: {what} did not simulate the MEMTP ensemble (memtp.depth unset, or a policy "
                  "such as no_spec or mtp1 that the ensemble cannot drive), so its r_low, "
                  "r_high and head_cost_gib would be library defaults, not tuned settings; export --format vllm or "
                  "sglang, or tune with `memtp: {{depth: elastic}}` in the base scenario")


def _memtp_defaults() -> dict[str, float]:
    """The gate thresholds and head cost a scenario without a ``memtp`` section gets."""
    return {k: float(getattr(MEMTP_DEFAULTS, k)) for k in ("r_low", "r_high", "head_cost_gib")}


def deployment_settings(scenario: dict[str, Any], applied_temperatures: list[float] | None = None) -> dict[str, Any]:
    """Serving settings implied by a (tuned) scenario.

    Args:
        scenario: scenario as a plain dict (``Scenario.model_dump(mode="json")``, policy flattened
            or nested with ``name`` and params).
        applied_temperatures: per-position temperatures the engine applied (STS x global), if known.

    Returns:
        ``{"max_depth", "depth_source", "policy", "policy_params", "temperature",
        "position_temperatures", "memtp": {"enabled", "depth", "max_depth", "r_low", "r_high",
        "head_cost_gib", "source", "controller"}}`` (``controller``: the memtp section's other
        fields as the trial ran them; empty without the ensemble).

    Raises:
        ConfigError: ``r_low >= r_high``, or a policy that does not draft (nothing to export).
        InvalidArgumentError: an unknown policy name (from :func:`memtp_sim.policies.make_policy`).

    Source:
        docs/model.md section 2 (the draft length is the ensemble depth; the coherence gate
        ``g(R)`` is linear between ``r_low`` and ``r_high``, in [0, 1]; ``head_cost_gib`` in GiB).
    """
    pol = dict(scenario.get("policy") or {})
    name = pol.pop("name", "dspark")
    mem = scenario.get("memtp")
    enabled = isinstance(mem, dict) and mem.get("depth") is not None
    settings = MemtpSettings(**{k: v for k, v in mem.items() if k in MemtpSettings.__dataclass_fields__}) \
        if enabled else None
    # the drafter owns the draft length (memtp_sim.drafting): ask it, as a run does
    spec = DraftSpec.resolve(name, pol, settings)
    params = make_policy(spec.policy_name, spec.policy_params).params.model_dump(mode="json")
    max_depth = spec.max_draft_len
    if enabled:
        depth_source = "memtp.max_depth" if settings.elastic else "memtp.depth"
    else:
        depth_source = "policy.gamma" if "gamma" in params else f"policy {name} draft length"
    if max_depth < 1:
        raise ConfigError(f"policy {name!r} does not draft (max depth 0); nothing to export")
    defaults = _memtp_defaults()
    if enabled:
        gate = {k: float(mem.get(k, defaults[k])) for k in defaults}
        gate_source = "scenario memtp section (simulated)"
    else:
        gate, gate_source = defaults, ("memtp_sim.memtp.MEMTP_DEFAULTS: library defaults, not simulated "
                                       "(memtp.depth unset)")
    if not gate["r_low"] < gate["r_high"]:
        raise ConfigError(f"memtp: r_low ({gate['r_low']:g}) must be < r_high ({gate['r_high']:g}); "
                          "the coherence gate needs a non-empty linear region")
    conf = scenario.get("confidence") or {}
    ctl = dict(scenario.get("draft_control") or {"name": "always"})
    return {
        "draft_control": ctl,
        "max_depth": max_depth,
        "depth_source": depth_source,
        "policy": name,
        "policy_params": params,
        "temperature": float(conf.get("temperature", 1.0)),
        "sts": conf.get("sts", "fit"),
        "position_temperatures": [float(t) for t in (applied_temperatures or [])],
        "memtp": {"enabled": bool(enabled), "depth": mem.get("depth") if isinstance(mem, dict) else None,
                  "max_depth": max_depth, **gate, "source": gate_source,
                  # the rest of the simulated controller (dwell, coherence estimator, head loading...)
                  "controller": ({k: v for k, v in mem.items() if k not in ("depth", "max_depth", *gate)}
                                 if enabled else {})},
    }


def _calibration(scenario_obj: Scenario) -> dict[str, Any]:
    prof = load_profile(scenario_obj.hardware.profile)
    acc = build_acceptance(scenario_obj).summary()
    return {
        "hardware_profile": prof.name,
        "hardware_profile_path": prof.path,
        "chip": prof.chip,
        "sources": dict(prof.sources),
        "acceptance_profile": acc.get("name"),
        "acceptance_source": acc.get("source"),
    }


def provenance_for(study: optuna.Study, spec: TuneSpec, trial: optuna.trial.FrozenTrial,
                   validation: dict[str, Any], *, storage_url: str, selection: str,
                   scenario_obj: Scenario) -> dict[str, Any]:
    """The provenance block every exported file carries.

    Args:
        study: the Optuna study.
        spec: its :class:`~memtp_sim.tuning.TuneSpec`.
        trial: the exported FrozenTrial.
        validation: the trial's fresh-seed record (see :func:`memtp_sim.tuning.validate_trials`).
        storage_url: storage URL, password masked.
        selection: how the trial was chosen (text).
        scenario_obj: the trial's :class:`~memtp_sim.config.Scenario`.

    Returns:
        A JSON/YAML-ready dict: objective and constraint values (tuning means and replicates,
        fresh-seed mean with its t interval), calibration profiles with their sources, versions
        and the UTC export time (ISO 8601).

    Source:
        Student's t intervals of :func:`memtp_sim.tuning.t_confidence_interval`; the calibration
        sources recorded by the hardware and acceptance profiles.
    """
    import optuna  # lazy: importing memtp_sim.tuning must not import optuna (~0.1 s)

    reps = trial.user_attrs.get("replicates", {})
    means = trial.user_attrs.get("metrics", {})

    def block(metric: str) -> dict[str, Any]:
        ci = validation["metrics"].get(metric, {})
        return {
            "tuning": {"mean": means.get(metric), "replicates": reps.get(metric), "seeds": list(spec.seeds)},
            "validation": {"mean": ci.get("mean"), "ci95_low": ci.get("low"), "ci95_high": ci.get("high"),
                           "half_width": ci.get("half_width"), "sd": ci.get("sd"), "n": ci.get("n"),
                           "replicates": ci.get("values"), "seeds": validation["seeds"]},
        }

    objectives = {}
    for i, o in enumerate(spec.objectives):
        objectives[o.metric] = {"direction": o.direction, "value": float(trial.values[i]), **block(o.metric)}
    constraints = {}
    tuning_cv = trial.user_attrs.get("constraint_values", [])
    for j, c in enumerate(spec.constraints):
        b = block(c.metric)
        constraints[c.label] = {
            "tuning_mean": b["tuning"]["mean"],
            "satisfied_tuning": bool(j < len(tuning_cv) and tuning_cv[j] <= 0),
            "validation_mean": b["validation"]["mean"],
            "validation_ci95": [b["validation"]["ci95_low"], b["validation"]["ci95_high"]],
            "satisfied_validation": bool(validation["constraint_values"][j] <= 0),
        }
    return {
        "study": study.study_name,
        "storage": storage_url,
        "trial": int(trial.number),
        "selection": selection,
        "params": dict(trial.params),
        "objectives": objectives,
        "constraints": constraints,
        "feasible": bool(trial.user_attrs.get("feasible", True)),
        "feasible_on_fresh_seeds": bool(validation["feasible"]),
        "confidence_interval_method": validation.get("method"),
        "calibration": _calibration(scenario_obj),
        "memtp_sim_version": __version__,
        "optuna_version": optuna.__version__,
        "exported_at_utc": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    }


def build_export(fmt: Literal["vllm", "sglang", "memtp"], settings: dict[str, Any], provenance: dict[str, Any], *,
                 sps_table: dict[str, Any] | None = None, sps_file_name: str | None = None,
                 vllm_method: str = "dspark", sglang_algorithm: str = "NEXTN") -> dict[str, str]:
    """Render the export files (pure: no I/O).

    Args:
        fmt: ``vllm``, ``sglang`` or ``memtp``.
        settings: :func:`deployment_settings` output.
        provenance: :func:`provenance_for` output.
        sps_table: sglang: the SPS table document (written next to the flags file).
        sps_file_name: sglang: file name of the SPS table (referenced from the flags file).
        vllm_method: ``speculative_config.method``.
        sglang_algorithm: ``--speculative-algorithm``.

    Returns:
        ``{"main": text}`` plus ``{"sps": text}`` for sglang.

    Raises:
        ConfigError: unknown format, or ``memtp`` for settings whose MEMTP ensemble was not
            simulated (``settings["memtp"]["enabled"]`` false).

    Source:
        vLLM's ``--speculative-config`` (``method``, ``num_speculative_tokens``) and SGLang's
        server arguments (``--speculative-algorithm``, ``--speculative-num-steps``,
        ``--speculative-eagle-topk``, ``--speculative-num-draft-tokens``), as documented by each
        project.
    """
    depth = int(settings["max_depth"])
    dspark: dict[str, Any] = {
        "adaptive_verification": True,
        "policy": settings["policy"],
        "policy_params": settings["policy_params"],
        "temperature": settings["temperature"],
        "position_temperatures": settings["position_temperatures"],
    }
    if settings["memtp"]["enabled"]:
        dspark["memtp_gate"] = {k: settings["memtp"][k] for k in ("r_low", "r_high", "head_cost_gib")}
    ctl = dict(settings.get("draft_control") or {"name": "always"})
    ctl_name = ctl.pop("name", "always")
    if ctl_name != "always":
        dspark["draft_control"] = {"name": ctl_name, **ctl}
    if fmt == "vllm":
        spec_cfg = {"method": vllm_method, "num_speculative_tokens": depth}
        if vllm_method.lower() == "dspark":  # vLLM's DSpark drafter; its adaptive verification is the policy
            spec_cfg["enable_adaptive_verification"] = _adaptive(fmt, vllm_method, settings["policy"])
        if ctl_name == "batch_table":
            # vLLM SpeculativeConfig.num_speculative_tokens_per_batch_size (PR #32374 as merged): a
            # list of (range_start, range_end, num_speculative_tokens), inclusive ranges
            spec_cfg["num_speculative_tokens_per_batch_size"] = [
                list(r) for r in parse_range_table(ctl["table"], "draft_control.table")]
        elif ctl_name == "disable_by_batch_size":
            # vLLM SpeculativeConfig.disable_by_batch_size: the spec-decode worker turns speculation off
            # when running_queue_size >= the value; the simulator, above max_batch requests
            spec_cfg["disable_by_batch_size"] = int(ctl["max_batch"]) + 1
        doc = {
            "speculative_config": {**spec_cfg, "dspark": dspark},
            "vllm_cli": "--speculative-config " + shlex.quote(json.dumps(spec_cfg, separators=(",", ":"))),
            "provenance": provenance,
        }
        return {"main": json.dumps(doc, indent=2, allow_nan=True) + "\n"}
    if fmt == "sglang":
        flags = [
            ("--speculative-algorithm", sglang_algorithm),
            ("--speculative-num-steps", str(depth)),
            ("--speculative-eagle-topk", "1"),
            ("--speculative-num-draft-tokens", str(depth + 1)),
        ]
        if ctl_name != "always":
            dspark["draft_control_note"] = ("stock SGLang has no per-batch-size draft schedule (its batch-size "
                                            "fallback, PR #13376, was not merged): a DSpark/MEMTP-aware build "
                                            "reads draft_control; stock SGLang runs the fixed flags below")
        head = ["# SGLang speculative-decoding flags exported by memtp_sim (one flag per line;",
                "# pass them to `python -m sglang.launch_server` as they are). The comment block below",
                "# (lines starting '#   ') is YAML: `dspark` holds the DSpark adaptive-verification settings",
                "# (read by a DSpark-aware build, not by stock SGLang), `provenance` where they come from."]
        meta = {"dspark": {**dspark, "sps_table": sps_file_name}, "provenance": provenance}
        head += ["#   " + line for line in _yaml(meta).splitlines()]
        body = "\n".join(f"{k} {shlex.quote(v)}" for k, v in flags)
        out = {"main": "\n".join(head) + "\n" + body + "\n"}
        if sps_table is not None:
            out["sps"] = json.dumps({**sps_table, "provenance": provenance}, indent=2, allow_nan=True) + "\n"
        return out
    if fmt == "memtp":
        mem = settings["memtp"]
        if not mem["enabled"]:
            raise ConfigError(_NOT_SIMULATED.format(what="these settings"))
        doc = {
            "controller": {
                "max_depth": depth,
                "r_low": mem["r_low"],
                "r_high": mem["r_high"],
                "head_cost_gib": mem["head_cost_gib"],
                "temperature": settings["temperature"],
                "position_temperatures": settings["position_temperatures"],
                "depth": mem["depth"] if mem["enabled"] else "fixed (policy draft length)",
                **mem["controller"],  # every other knob of the simulated controller, as the trial ran it
                "policy": settings["policy"],
                "policy_params": settings["policy_params"],
            },
            "notes": {"max_depth_from": settings["depth_source"], "gate_from": mem["source"]},
            "provenance": provenance,
        }
        return {"main": "# MEMTP controller block exported by memtp_sim\n" + _yaml(doc)}
    raise ConfigError(f"--format: unknown format {fmt!r}; allowed: {', '.join(FORMATS)}")


def _sps_table(profile_name: str) -> dict[str, Any]:
    prof = load_profile(profile_name)
    sps = prof.sps
    steps = sps.sps(sps.batch_tokens)
    return {
        "profile": prof.name,
        "chip": prof.chip,
        "source": sps.source,
        "lookup": "linear_pass_time (pass time linear in B between measured neighbours; measured points exact)",
        "beyond_max": sps.beyond_max,
        "table": [{"batch_tokens": int(b), "sps": float(s), "pass_ms": float(ms)}
                  for b, s, ms in zip(sps.batch_tokens, steps, sps.pass_ms)],
    }


def _infeasibility_warning(spec: TuneSpec, trial: Any, validation: dict[str, Any]) -> str | None:
    """One line when the trial fails its constraints (tuning seeds, else fresh seeds); None when it meets them."""
    tuning = constraint_failures(spec, trial.user_attrs.get("constraint_values", []),
                                 trial.user_attrs.get("metrics", {}))
    if tuning:
        return (f"trial {trial.number} is infeasible: {'; '.join(tuning)} (mean over tuning seeds "
                f"{', '.join(str(s) for s in spec.seeds)}); writing it anyway, as asked")
    fresh_means = {m: ci.get("mean") for m, ci in validation.get("metrics", {}).items()}
    fresh = constraint_failures(spec, validation.get("constraint_values", []), fresh_means)
    if fresh:
        return (f"trial {trial.number} meets the constraints on the tuning seeds but not on fresh seeds "
                f"{', '.join(str(s) for s in validation.get('seeds', []))}: {'; '.join(fresh)}")
    return None


#: The drafter each engine's method runs, as the simulator's ``drafter.kind`` names it (vLLM's
#: ``SpeculativeConfig.method`` values; SGLang's ``--speculative-algorithm``, where NEXTN is the
#: model's own MTP heads and STANDALONE a separate draft model). dspark_block and per_sequence
#: have no stock method.
_METHOD_KIND = {
    "vllm": {"ngram": "ngram", "eagle": "eagle", "eagle3": "eagle", "draft_model": "draft_model",
             "dspark": "dspark_block"},
    "sglang": {"NEXTN": "mtp", "EAGLE": "eagle", "EAGLE3": "eagle", "STANDALONE": "draft_model",
               "NGRAM": "ngram"},
}


#: Policies a stock engine runs as simulated: every drafted token verified, a fixed count a round.
_STOCK_POLICIES = ("static", "mtp1")
#: Policies vLLM's DSpark method runs with ``enable_adaptive_verification`` (PR #47808): the verify
#: budget of each step from the drafts' confidence and the load, DSpark's Algorithm 1 in production.
_ADAPTIVE_POLICIES = ("dspark", "dspark_async")


def _adaptive(fmt: str, method: str, policy: str) -> bool:
    """Whether the exported engine runs the trial's confidence-scheduled verification itself."""
    return fmt == "vllm" and method.lower() == "dspark" and policy in _ADAPTIVE_POLICIES
#: Draft-length controllers each stock engine's flags can carry (vLLM: PR #32374's schedule and
#: SpeculativeConfig.disable_by_batch_size; SGLang: none).
_STOCK_CONTROLS = {"vllm": ("always", "batch_table", "disable_by_batch_size"), "sglang": ("always",)}


def stock_engine_gaps(fmt: str, settings: dict[str, Any], method: str = "") -> str | None:
    """One line naming what of a trial a stock engine's flags cannot run (they draft and verify a
    fixed number of tokens a round), or None when the flags carry all of it.

    Args:
        fmt: ``vllm`` or ``sglang`` (anything else: None).
        settings: :func:`deployment_settings` of the trial.
        method: the vLLM method or SGLang algorithm the file names (vLLM's ``dspark`` runs DSpark's
            confidence-scheduled verification itself).

    Returns:
        The warning: the confidence-scheduled policy, a draft-length controller the flags do not
        carry, or the MEMTP ensemble; each is kept in the file's ``dspark`` block for a
        DSpark-aware build.
    """
    if fmt not in _STOCK_CONTROLS:
        return None
    gaps = []  # noun phrases, each read after "this trial's" or "its"
    if settings["policy"] not in _STOCK_POLICIES and not _adaptive(fmt, method, settings["policy"]):
        gaps.append(f"policy {settings['policy']} (it verifies a confidence-chosen subset of the drafted tokens)")
    control = (settings.get("draft_control") or {}).get("name", "always")
    if control not in _STOCK_CONTROLS[fmt]:
        gaps.append(f"draft_control {control}")
    if settings["memtp"]["enabled"]:
        gaps.append(f"MEMTP ensemble (depth {settings['memtp']['depth']}, coherence gate)")
    if not gaps:
        return None
    items = [f"this trial's {gaps[0]}", *(f"its {g}" for g in gaps[1:])]
    what = items[0] if len(items) == 1 else f"{', '.join(items[:-1])} or {items[-1]}"
    return (f"stock {fmt} cannot run {what}: the exported flags draft and verify "
            f"{settings['max_depth']} tokens a round; those settings are only in the file's dspark block, "
            "for a DSpark-aware build, so a stock deployment will not match the simulated numbers")


def method_mismatch(fmt: str, method: str, simulated_kind: str) -> str | None:
    """One line when the engine method an export names runs another drafter than the trial simulated.

    Args:
        fmt: ``vllm`` or ``sglang`` (anything else: None).
        method: vLLM ``speculative_config.method`` or SGLang ``--speculative-algorithm``.
        simulated_kind: the trial's drafter (:attr:`memtp_sim.drafting.Drafter.kind`, e.g.
            ``dspark_block``).

    Returns:
        The warning, or None when they match (any vLLM method with ``mtp`` in its name runs MTP heads).
    """
    if fmt not in _METHOD_KIND:
        return None
    # SGLang upper-cases the algorithm name; vLLM's MTP methods are model-specific (deepseek_mtp, ...)
    key = method.upper() if fmt == "sglang" else method.lower()
    runs = "mtp" if fmt == "vllm" and "mtp" in key else _METHOD_KIND[fmt].get(key)
    if runs == simulated_kind:
        return None
    word, field = ("method", "vllm_method") if fmt == "vllm" else ("algorithm", "sglang_algorithm")
    what = (f"runs the {runs} drafter, whose draft cost and acceptance the trial did not price" if runs
            else f"is not one memtp_sim can match to a simulated drafter (known: {', '.join(_METHOD_KIND[fmt])}"
            + (", or a name with mtp" if fmt == "vllm" else "") + ")")
    return (f"the trial simulated the {simulated_kind} drafter, but {fmt} {word} {method!r} {what} (the file's "
            f"dspark block is for a DSpark-aware build); export reads the tune spec stored with the study, so "
            f"tune again under a new name with export.{field} set to the {word} you deploy and drafter.kind "
            "set to match")


def _open_tuned_study(study_name: str, storage_url: str | None, out_dir: str | Path,
                      ) -> tuple[optuna.Study, TuneSpec, str, dict[str, tuple[Path, str]], str | None]:
    """The study, its stored tune spec, the storage URL, and its input files checked
    (:func:`memtp_sim.tuning.check_study_inputs`: the files now, and a note when they cannot be checked).

    Raises:
        ConfigError: missing storage or study, a study not made by ``tune``, changed input files.
    """
    import optuna  # lazy: importing memtp_sim.tuning must not import optuna (~0.1 s)

    if storage_url is None:
        db = Path(out_dir) / study_name / "optuna.db"
        if not db.is_file():
            raise ConfigError(f"study {study_name!r} not found: {db} does not exist; run "
                              "`python -m memtp_sim tune SPEC.yaml` first or pass --storage URL")
        storage_url = default_storage_url(study_name, out_dir)
        storage = open_storage(storage_url, flag="--out")
    else:
        storage = open_storage(storage_url, must_exist=True)  # export reads: a typo must not create a database
    try:
        study = optuna.load_study(study_name=study_name, storage=storage)
    except KeyError:
        names = sorted(s.study_name for s in storage.get_all_studies())
        raise ConfigError(f"study {study_name!r} not found in {mask_url(storage_url)}; studies there: "
                          f"{', '.join(names) or 'none'}") from None
    rec = study.user_attrs.get(STUDY_ATTR)
    if not isinstance(rec, dict) or "tune_spec" not in rec:
        raise ConfigError(f"study {study_name!r} was not created by `python -m memtp_sim tune` (no tune spec stored)")
    spec = parse_tune_spec(rec["tune_spec"], source=f"study {study_name} (stored tune spec)", check_effects=False)
    # refused, not warned: the file would pair the trial's settings and numbers (priced on the old
    # files) with the new files' SPS table and calibration sources, and a validation run now would
    # price the trial on the new files; nothing in it would say which numbers came from which
    inputs, unchecked = check_study_inputs(
        study, spec, where="export",
        todo="a config exported now would take its SPS table and calibration from the new ones; restore the old "
             "file(s), or tune again under a new name")
    return study, spec, storage_url, inputs, unchecked


def export_config(*, study_name: str, fmt: str, storage_url: str | None = None, trial: str | int = "best",
                  output: str | Path | None = None, out_dir: str | Path = "results",
                  warn: Callable[[str], None] | None = None) -> list[Path]:
    """Write a production config for one trial of a tuned study.

    Args:
        study_name: Optuna study name (the tune spec's ``name``).
        fmt: ``vllm``, ``sglang`` or ``memtp``.
        storage_url: storage URL (default: ``sqlite:///<out_dir>/<study>/optuna.db``).
        trial: ``"best"`` or a trial number.
        output: output file (default: ``<out_dir>/<study>/export/<study>-trial<N><suffix>``).
        out_dir: results folder.
        warn: called with one line for each warning: the study's input files cannot be checked
            (no digests recorded), the exported trial fails a constraint (on the tuning seeds, or
            on the fresh validation seeds), the method runs another drafter, a stock engine cannot
            run all of the trial; default: :func:`warnings.warn` (UserWarning).

    Returns:
        The written files (the main file first; sglang adds the SPS table).

    Raises:
        ConfigError: unknown format, missing storage or study, a study not made by
            ``memtp_sim tune``, empty study, no feasible trial, bad trial number, r_low >= r_high,
            ``memtp`` for a trial that did not simulate the MEMTP ensemble (``memtp.depth`` unset),
            an input file (trace, profile, cost table) changed since the study was tuned.

    Source:
        Optuna documentation (``optuna.load_study``); the best-trial rule of
        :func:`memtp_sim.tuning.select_trial`; file formats as in :func:`build_export`.
    """
    if fmt not in FORMATS:
        raise ConfigError(f"--format: unknown format {fmt!r}; allowed: {', '.join(FORMATS)}")
    if trial != "best":
        try:
            trial = int(trial)
        except (TypeError, ValueError):
            raise ConfigError(f"--trial: expected 'best' or a trial number (got {trial!r})") from None
    study, spec, storage_url, inputs, unchecked = _open_tuned_study(study_name, storage_url, out_dir)
    chosen = select_trial(study, spec, trial)
    if trial == "best":
        selection = (f"best: the feasible Pareto trial with the best {spec.best_by} "
                     f"({'; '.join(c.label for c in spec.constraints) or 'no constraints'})")
    else:
        selection = f"trial {chosen.number} (chosen by hand)"
    scen = scenario_for(spec, chosen.params)
    # memtp_settings(), not memtp.depth: a trial of a policy the ensemble cannot drive (no_spec, mtp1)
    # ran without it although the base sets memtp.depth
    if fmt == "memtp" and scen.memtp_settings() is None:  # before validation runs anything
        raise ConfigError(_NOT_SIMULATED.format(what=f"study {study_name!r} (trial {chosen.number})"))
    dump = scen.model_dump(mode="json")
    if scen.memtp_settings() is None:
        dump["memtp"]["depth"] = None
    settings = deployment_settings(dump | {"policy": {"name": scen.policy.name, **scen.policy.params}},
                                   chosen.user_attrs.get("applied_temperatures"))
    validation = study.user_attrs.get("validation", {}).get(str(chosen.number))
    if validation is None:
        validation = validate_trials(study, spec, [chosen.number], out_dir=out_dir)[chosen.number]
    prov = provenance_for(study, spec, chosen, validation, storage_url=mask_url(storage_url), selection=selection,
                          scenario_obj=scen)
    method = {"vllm": spec.export.vllm_method, "sglang": spec.export.sglang_algorithm}.get(fmt, "")
    mismatch = method_mismatch(fmt, method, scen.draft_spec().kind or DEFAULT_DRAFTER_KIND)
    prov["input_files"] = {label: {"path": str(path), "sha256_16": digest} for label, (path, digest) in inputs.items()}
    prov["input_files_checked"] = unchecked is None  # against the digests recorded when the study was made
    if mismatch is not None:
        prov["drafter_mismatch"] = mismatch  # the shipped file says it too
    gaps = stock_engine_gaps(fmt, settings, method)
    if gaps is not None:
        prov["stock_engine_gaps"] = gaps
    if settings["position_temperatures"] and settings["sts"] == "fit":
        prov["position_temperatures_from"] = (
            f"the STS fit of tuning seed {spec.seeds[0]} (each seed fits its own held-out stream); refit STS on "
            "held-out data of the drafter you deploy")
    for message in (unchecked, _infeasibility_warning(spec, chosen, validation), mismatch, gaps):
        if message is None:
            continue
        if warn is not None:
            warn(message)
        else:
            warnings.warn(message, UserWarning, stacklevel=2)
    main = Path(output) if output is not None else (
        Path(out_dir) / study_name / "export" / f"{study_name}-trial{chosen.number}{_SUFFIX[fmt]}")
    stem = main.name[: -len(_SUFFIX["sglang"])] if main.name.endswith(_SUFFIX["sglang"]) else main.stem
    sps_path = main.with_name(stem + ".sps.json")
    files = build_export(fmt, settings, prov, sps_table=_sps_table(scen.hardware.profile) if fmt == "sglang" else None,
                         sps_file_name=sps_path.name, vllm_method=spec.export.vllm_method,
                         sglang_algorithm=spec.export.sglang_algorithm)
    written = [main]
    atomic_write_text(main, files["main"])
    if "sps" in files:
        atomic_write_text(sps_path, files["sps"])
        written.append(sps_path)
    return written

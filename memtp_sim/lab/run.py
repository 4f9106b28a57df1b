"""The drafter lab run: ``python -m memtp_sim drafter-lab studies/drafter_lab.yaml``.

Builds the lab from a YAML (:class:`LabConfig`), fits the drafters on a training corpus of the
source, measures acceptance by block position for five drafters with exact verification, fits the
engine-side noise and confidence head of each, prices the heads, and writes into the output folder:

* ``<prefix>-<drafter>.yaml``: a ``kind: per_position`` acceptance profile per drafter, loadable by
  :func:`memtp_sim.acceptance.load_acceptance` (``acceptance: {profile: <path>, domain_mix: {lab: 1.0}}``);
* ``report.html``: acceptance by position per drafter (one figure), how much each head flattens the
  decay, the fitted engine parameters, and the cost per head;
* ``lab.json``: every number of the report.

Random streams: the source is built from ``seed``; the corpus, reservoir, fitting rounds,
evaluation contexts and each drafter's draws use ``numpy.random.default_rng([seed, i])`` with a
fixed ``i`` per use, so the same YAML reproduces every number.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .._io import read_yaml
from ..errors import ConfigError, InvalidArgumentError
from . import costs as lab_costs
from .drafters import (
    MarkovHead,
    NgramMatryoshka,
    NgramTable,
    ParallelBackbone,
    RnnHead,
    ar_block_dist,
    block_bias,
    fit_gate,
    parallel_block_dist,
    semi_ar_block_dist,
)
from .measure import DraftFn, EngineFit, LabMeasurement, fit_engine_parameters, measure_drafter, target_along
from .profiles import DRAFTERS, MIN_TESTED, tested_through
from .source import MarkovSource

__all__ = ["DRAFTERS", "LabBuild", "LabConfig", "LabResult", "build_lab", "run_lab"]

_DEFAULTS: dict[str, Any] = {
    "name": "drafter_lab",
    "seed": 0,
    "gamma": 16,
    "source": {"vocab_size": 16, "order": 2, "support": 4, "temperature": 0.15, "mix": [0.8, 0.2], "floor": 0.01},
    "training": {"sequences": 300, "length": 256, "smoothing": 4.0, "fit_rounds": 8000},
    "evaluation": {"rounds": 40000},
    "drafters": {"backbone_context": 1, "ar_order": 1, "markov_rank": 8, "rnn_hidden": 64,
                 "rnn_spectral_radius": 0.9, "rnn_context": 1, "rnn_ridge": 0.001, "tower_max_order": 3},
    "profiles": {"prefix": "lab", "domain": "lab", "positions": 16, "confidence_rounds": 10000},
    "costs": {"vocab": 128256, "markov_rank": 256, "rnn_hidden": 256, "tower_rank": 256, "bytes_per_param": 2.0,
              "batch": [1, 64], "gammas": [7, 15], "hardware": {}},
}


def _check_value(where: str, default: Any, value: Any) -> Any:
    if isinstance(default, bool) or default is None:
        return value
    if isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: must be an integer, got {value!r}")
        return value
    if isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
            raise ConfigError(f"{where}: must be a number, got {value!r}")
        return float(value)
    if isinstance(default, str):
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{where}: must be a non-empty string, got {value!r}")
        return value
    if isinstance(default, list):
        if not isinstance(value, list) or not value or any(isinstance(v, bool) or not isinstance(v, (int, float))
                                                           for v in value):
            raise ConfigError(f"{where}: must be a non-empty list of numbers, got {value!r}")
        return value
    return value


def _merge(where: str, defaults: dict[str, Any], given: Any) -> dict[str, Any]:
    if not isinstance(given, dict):
        raise ConfigError(f"{where}: expected a mapping, got {given!r}")
    def name(key: str) -> str:
        return f"{where}.{key}" if where else key

    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise ConfigError(f"{name(unknown[0])}: unknown field; allowed: {', '.join(defaults)}")
    out = {}
    for key, default in defaults.items():
        if key not in given:
            out[key] = default
        elif isinstance(default, dict) and key != "hardware":
            out[key] = _merge(name(key), default, given[key])
        else:
            out[key] = _check_value(name(key), default, given[key])
    return out


def _hardware(where: str, doc: Any) -> dict[str, dict[str, Any]]:
    if not isinstance(doc, dict):
        raise ConfigError(f"{where}: expected a mapping name -> {{memory_bandwidth_gb_s, flops_per_s, source}}")
    out = {}
    for name, hw in doc.items():
        keys = {"memory_bandwidth_gb_s": 1.0, "flops_per_s": 1.0, "source": "s"}
        entry = _merge(f"{where}.{name}", keys, hw)
        if set(keys) - set(hw):
            raise ConfigError(f"{where}.{name}: needs memory_bandwidth_gb_s, flops_per_s and source")
        if entry["memory_bandwidth_gb_s"] <= 0 or entry["flops_per_s"] <= 0:
            raise ConfigError(f"{where}.{name}: rates must be > 0")
        out[str(name)] = entry
    return out


@dataclass(frozen=True)
class LabConfig:
    """A validated drafter-lab YAML (defaults in ``_DEFAULTS``; unknown keys are errors).

    Attributes:
        settings: the merged settings (sections ``source``, ``training``, ``evaluation``,
            ``drafters``, ``profiles``, ``costs``; top-level ``name``, ``seed``, ``gamma``).
        path: the file it came from ("<memory>" for :meth:`from_dict`).
    """

    settings: dict[str, Any]
    path: str = "<memory>"

    @classmethod
    def from_dict(cls, doc: dict[str, Any], path: str = "<memory>") -> "LabConfig":
        """Validate a mapping against the defaults.

        Raises:
            ConfigError: an unknown field, a wrong type, or an out-of-range size (one line naming
                the file and the field).
        """
        try:
            merged = _merge("", _DEFAULTS, doc)
            merged["costs"]["hardware"] = _hardware("costs.hardware", merged["costs"]["hardware"])
        except ConfigError as e:
            raise ConfigError(f"{path}: {e}") from None
        g, k = merged["gamma"], merged["profiles"]["positions"]
        # ranges the lab's constructors would otherwise meet as a numpy traceback
        if merged["seed"] < 0:
            raise ConfigError(f"{path}: seed: must be >= 0 (numpy seeds), got {merged['seed']}")
        if not 0.0 < merged["source"]["floor"] < 1.0:
            raise ConfigError(f"{path}: source.floor: must lie in (0, 1) (with 0 a history never shows most "
                              f"tokens and the estimates have nothing to fit), got {merged['source']['floor']}")
        if merged["evaluation"]["rounds"] < MIN_TESTED:
            raise ConfigError(f"{path}: evaluation.rounds: must be >= {MIN_TESTED} (a position's acceptance is "
                              f"reported from {MIN_TESTED} tested rounds), got {merged['evaluation']['rounds']}")
        if not 2 <= g <= 64 or not 1 <= k <= g:
            raise ConfigError(f"{path}: gamma must lie in 2..64 and profiles.positions in 1..gamma, got {g}, {k}")
        if any(x > g or x < 1 for x in merged["costs"]["gammas"]):
            raise ConfigError(f"{path}: costs.gammas must lie in 1..gamma ({g})")
        return cls(merged, path)

    @classmethod
    def load(cls, path: str | Path) -> "LabConfig":
        """Read and validate a YAML file.

        Raises:
            ConfigError: unreadable or invalid YAML, or as :meth:`from_dict`.
        """
        return cls.from_dict(read_yaml(path, what="a drafter-lab mapping (seed, gamma, source, ...)"), str(path))

    def __getitem__(self, key: str) -> Any:
        return self.settings[key]


@dataclass
class LabBuild:
    """The fitted lab: source, estimates, heads, gates and one :data:`DraftFn` per drafter."""

    source: MarkovSource
    table: NgramTable
    backbone: ParallelBackbone
    markov: MarkovHead
    rnn: RnnHead
    tower: NgramMatryoshka
    gates: dict[str, np.ndarray]
    drafters: dict[str, DraftFn]
    context_width: int


def _fit_heads(cfg: LabConfig, source: MarkovSource, table: NgramTable, backbone: ParallelBackbone,
               heads: dict[str, Any], width: int) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Teacher-forced fitting: the RNN readout, then every head's gate per position."""
    seed, g, d = cfg["seed"], cfg["gamma"], cfg["drafters"]
    seqs = source.sample(np.random.default_rng([seed, 3]), cfg["training"]["fit_rounds"], width + g)
    ctx, cont = seqs[:, :width], seqs[:, width:]
    target = target_along(source, ctx, cont)[:, :g]
    uni = table.unigram_log_probs
    heads = dict(heads, rnn=heads["rnn"].fit_readout(ctx, cont, np.log(target) - uni, ridge=d["rnn_ridge"]))
    b = backbone.logits(ctx, g)
    gates = {}
    for name, head in heads.items():
        h = block_bias(head, ctx, cont)
        gates[name] = np.array([fit_gate(b[:, k], h[:, k], uni, target[:, k]) for k in range(g)])
    return heads, gates


def build_lab(cfg: LabConfig) -> LabBuild:
    """Build the source, fit the estimates and heads, and return the five drafters.

    Raises:
        ConfigError: a setting the lab's constructors reject (one line naming the file).
    """
    try:
        return _build(cfg)
    except InvalidArgumentError as e:
        raise ConfigError(f"{cfg.path}: {e}") from None


def _build(cfg: LabConfig) -> LabBuild:
    seed, g, d, tr = cfg["seed"], cfg["gamma"], cfg["drafters"], cfg["training"]
    source = MarkovSource.sparse(**cfg["source"], seed=seed)
    v = source.vocab_size
    corpus = source.sample(np.random.default_rng([seed, 1]), tr["sequences"], tr["length"])
    top = max(d["tower_max_order"], d["ar_order"], 1)
    table = NgramTable.fit(corpus, v, top, tr["smoothing"])
    backbone = ParallelBackbone.fit(corpus, v, d["backbone_context"], g, np.exp(table.unigram_log_probs),
                                    tr["smoothing"])
    tower = NgramMatryoshka(table, tuple(min(j, d["tower_max_order"]) for j in range(1, g + 1)))
    heads: dict[str, Any] = {
        "markov": MarkovHead.fit(table, d["markov_rank"]),
        "rnn": RnnHead.reservoir(np.random.default_rng([seed, 2]), v, d["rnn_hidden"],
                                 spectral_radius=d["rnn_spectral_radius"], context=d["rnn_context"]),
        "tower": tower,
    }
    width = max(d["backbone_context"], d["ar_order"], d["tower_max_order"], d["rnn_context"], source.order)
    heads, gates = _fit_heads(cfg, source, table, backbone, heads, width)
    uni = table.unigram_log_probs

    def semi_ar(name: str) -> DraftFn:
        return lambda rng, ctx: semi_ar_block_dist(rng, backbone.logits(ctx, g), heads[name], ctx,
                                                   gates=gates[name], unigram_log_probs=uni)

    drafters: dict[str, DraftFn] = {
        "ar": lambda rng, ctx: ar_block_dist(rng, table, d["ar_order"], ctx, g),
        "parallel": lambda rng, ctx: parallel_block_dist(rng, backbone.logits(ctx, g)),
        "markov": semi_ar("markov"), "rnn": semi_ar("rnn"), "tower": semi_ar("tower"),
    }
    return LabBuild(source, table, backbone, heads["markov"], heads["rnn"], tower, gates, drafters, width)


@dataclass
class LabResult:
    """What a lab run measured and wrote."""

    config: LabConfig
    measurements: dict[str, LabMeasurement]
    fits: dict[str, EngineFit]
    costs: list[dict[str, Any]]
    files: dict[str, Path] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)


def cost_rows(cfg: LabConfig) -> list[dict[str, Any]]:
    """Per-head cost rows: per step and per round (each ``costs.gammas``), per batch and hardware.

    Units: ``flops_per_step``, ``mb_per_step`` (10^6 bytes), times in microseconds. The tower's
    "step" is its mean level over a round of the largest gamma.
    """
    c = cfg["costs"]
    v, bpp, gammas = c["vocab"], c["bytes_per_param"], [int(x) for x in c["gammas"]]
    rows = []
    for batch in (int(b) for b in c["batch"]):
        heads: dict[str, tuple[lab_costs.StepCost, Callable[[int], lab_costs.StepCost]]] = {}
        mk = lab_costs.markov_head_step(v, c["markov_rank"], batch=batch, bytes_per_param=bpp)
        rn = lab_costs.rnn_head_step(v, c["rnn_hidden"], batch=batch, bytes_per_param=bpp)
        heads[f"markov (r={c['markov_rank']})"] = (mk, mk.scaled)
        heads[f"rnn (h={c['rnn_hidden']})"] = (rn, rn.scaled)

        def tower(gamma: int, batch: int = batch) -> lab_costs.StepCost:
            return lab_costs.tower_round(v, c["tower_rank"], gamma, batch=batch, bytes_per_param=bpp)

        heads[f"tower (r={c['tower_rank']}, orders 1..gamma)"] = (tower(max(gammas)).scaled(1 / max(gammas)), tower)
        for name, (step, per_round) in heads.items():
            row: dict[str, Any] = {"head": name, "batch": batch, "flops_per_step": step.flops,
                                   "mb_per_step": step.bytes / 1e6}
            for hw, spec in c["hardware"].items():
                bw, fl = spec["memory_bandwidth_gb_s"], spec["flops_per_s"]
                row[f"{hw}_us_per_step"] = step.time_s(bw, fl) * 1e6
                for gm in gammas:
                    row[f"{hw}_us_per_round_gamma{gm}"] = per_round(gm).time_s(bw, fl) * 1e6
            rows.append(row)
    return rows


def run_lab(cfg: LabConfig, out_dir: str | Path, *, command: str | None = None,
            progress: Callable[[str], None] | None = None) -> LabResult:
    """Build, measure, fit, price, and write the profiles, ``report.html`` and ``lab.json``.

    Args:
        cfg: the lab settings.
        out_dir: output folder (created).
        command: the command line to record in the profiles (default: the canonical one).
        progress: optional callback with one line per stage.

    Raises:
        ConfigError: a setting the lab rejects.
        OSError: the output folder cannot be written.
    """
    say = progress or (lambda _msg: None)
    t0 = time.perf_counter()
    build = build_lab(cfg)
    seed, g = cfg["seed"], cfg["gamma"]
    say(f"fitted the drafters ({time.perf_counter() - t0:.1f} s)")
    contexts = build.source.sample(np.random.default_rng([seed, 4]), cfg["evaluation"]["rounds"], build.context_width)
    measurements, fits = {}, {}
    k, conf_rounds = cfg["profiles"]["positions"], cfg["profiles"]["confidence_rounds"]
    for i, (name, draft) in enumerate(build.drafters.items()):
        m = measure_drafter(np.random.default_rng([seed, 10 + i]), build.source, draft, contexts, name)
        measurements[name] = m
        tested = tested_through(m)
        if tested < 2:  # the engine fit needs two positions' acceptance
            raise ConfigError(f"{cfg.path}: evaluation.rounds: {cfg['evaluation']['rounds']} rounds tested drafter "
                              f"{name} at {tested} position(s) {MIN_TESTED} times or more; its fit needs 2: raise "
                              "evaluation.rounds")
        try:
            fits[name] = fit_engine_parameters(m, min(k, tested), rounds=conf_rounds, seed=seed)
        except InvalidArgumentError as e:
            raise ConfigError(f"{cfg.path}: {e}") from None
        say(f"measured {name}: c_1 {m.conditional[0]:.3f}, c_8 {m.conditional[min(7, g - 1)]:.3f} "
            f"({time.perf_counter() - t0:.1f} s)")
    try:
        rows = cost_rows(cfg)
    except InvalidArgumentError as e:
        raise ConfigError(f"{cfg.path}: costs: {e}") from None
    result = LabResult(cfg, measurements, fits, rows)
    from .report import write_outputs  # lazy: plotly and pandas load only when a report is written

    write_outputs(result, build, Path(out_dir), command or _default_command(cfg))
    say(f"wrote {len(result.files)} files to {out_dir} ({time.perf_counter() - t0:.1f} s)")
    return result


def _default_command(cfg: LabConfig) -> str:
    return f"python -m memtp_sim drafter-lab {cfg.path}"

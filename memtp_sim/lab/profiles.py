"""Per-position acceptance profiles written by the drafter lab (``kind: per_position``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import yaml

from .._io import atomic_write_text, json_default
from .._version import __version__
from .measure import EngineFit, LabMeasurement

if TYPE_CHECKING:
    from .run import LabBuild, LabConfig

__all__ = ["DRAFTERS", "MIN_TESTED", "profile_document", "tested_through", "write_json", "write_profile"]

#: A position's c_k is written (and plotted) only when at least this many rounds tested it.
MIN_TESTED = 200

#: The drafters the lab measures, in report order: name -> description.
DRAFTERS: dict[str, str] = {
    "ar": "autoregressive drafting (a bigram-class draft model run gamma times)",
    "parallel": "parallel backbone alone (every position from the context)",
    "markov": "backbone + Markov head (low-rank transition bias on the previous token)",
    "rnn": "backbone + RNN head (echo-state recurrence over the block prefix)",
    "tower": "backbone + n-gram matryoshka tower (order j at position j)",
}

def tested_through(m: LabMeasurement, min_tested: int = MIN_TESTED) -> int:
    """Positions 1..n with at least ``min_tested`` tested rounds (deep positions of a decaying
    drafter are rarely reached; their estimate would be noise)."""
    ok = np.flatnonzero(m.tested < min_tested)
    return int(ok[0]) if ok.size else m.gamma


def profile_document(name: str, m: LabMeasurement, fit: EngineFit, cfg: "LabConfig", build: "LabBuild",
                     command: str) -> tuple[str, dict[str, Any]]:
    """A ``kind: per_position`` profile for one drafter: (header comment, YAML mapping).

    c_k is written for positions 1..n, n the smaller of ``profiles.positions`` and the last
    position tested in at least 200 rounds, clipped to [0.001, 0.999] (the loader needs (0, 1)).
    """
    n = min(cfg["profiles"]["positions"], tested_through(m))
    c = np.clip(m.conditional[:n], 1e-3, 1 - 1e-3)
    prefix = cfg["profiles"]["prefix"]
    src = build.source
    header = (
        f"# Acceptance profile measured by the drafter lab (memtp_sim.lab, issue 14): {DRAFTERS[name]}.\n"
        f"# Made by: {command}   (seed {cfg['seed']}, memtp_sim {__version__})\n"
        f"# Target: synthetic order-{src.order} Markov source over {src.vocab_size} tokens "
        f"({src.entropy_rate_bits():.2f} bits/token); c_k = accepted / tested at block position k over "
        f"{m.n_accepted.size} rounds,\n# exact verification (accept min(1, p/q), resample the residual). Not a "
        f"measurement of a real model: a controlled stand-in\n# whose shape (decay along the block) is the point. "
        f"Use: acceptance: {{profile: <this file>, domain_mix: {{{cfg['profiles']['domain']}: 1.0}}}}\n"
    )
    doc = {
        "name": f"{prefix}-{name}",
        "kind": "per_position",
        "source": f"drafter lab (memtp_sim.lab): {DRAFTERS[name]}; {command}, seed {cfg['seed']}",
        "sigma_request": 0.0,
        "sigma_round": round(fit.sigma_round, 4),
        "sigma_note": ("sigma_round and the confidence head are fitted so that the engine's model matches the lab's "
                       "per-position AUCs and mean confidence (memtp_sim.lab.measure.fit_engine_parameters)"),
        "beyond_measured": "repeat_last",
        "domains": {cfg["profiles"]["domain"]: {"conditional_acceptance": [round(float(x), 4) for x in c]}},
        "confidence": {"noise_sd": round(fit.noise_sd, 4), "overconfidence": round(fit.overconfidence, 4)},
        "provenance": _provenance(name, m, fit, cfg, build, n),
    }
    return header, doc


def _provenance(name: str, m: LabMeasurement, fit: EngineFit, cfg: "LabConfig", build: "LabBuild",
                n: int) -> dict[str, Any]:
    gammas = [int(x) for x in cfg["costs"]["gammas"]]
    out = {
        "drafter": DRAFTERS[name],
        "seed": cfg["seed"],
        "memtp_sim_version": __version__,
        "rounds": int(m.n_accepted.size),
        "positions_written": int(n),
        "tested": [int(x) for x in m.tested],
        "accepted": [int(x) for x in m.accepted],
        "stderr": [round(float(x), 4) for x in np.nan_to_num(m.stderr, nan=-1.0)],
        "tau": {f"gamma_{gm}": round(m.tau(gm), 4) for gm in gammas},
        "lab_confidence": {k: round(float(v), 4) for k, v in fit.lab.items()},
        "engine_model_reached": {k: round(float(v), 4) for k, v in fit.model.items()},
        "target_source": dict(build.source.params, entropy_bits_per_token=round(build.source.entropy_rate_bits(), 4)),
    }
    if name in build.gates:
        out["gates"] = [[round(float(x), 4) for x in row] for row in build.gates[name]]
    return out


def write_profile(path: Path, header: str, doc: dict[str, Any]) -> None:
    """Write a profile YAML (header comment + mapping) atomically."""
    atomic_write_text(path, header + yaml.safe_dump(doc, sort_keys=False, width=110))


def write_json(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` as indented JSON atomically (numpy values as plain numbers)."""
    atomic_write_text(path, json.dumps(payload, indent=1, default=json_default))

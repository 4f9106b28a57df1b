"""Shared builders for the tuning tests (not a test module)."""

from __future__ import annotations

from pathlib import Path

import optuna
import yaml

from _sim_helpers import tiny_tune_doc

from memtp_sim.tuning import open_storage

REPO = Path(__file__).resolve().parents[2]
TRACE = REPO / "data" / "traces" / "azure2023_conv.csv"


def tiny_doc(name: str = "t", **over) -> dict:
    """A fast tune spec (see ``_sim_helpers.tiny_tune_doc``)."""
    return tiny_tune_doc(name, **over)


def _write(tmp_path: Path, doc: dict, name: str = "tune.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    return p


def _assert_one_line_error(rc: int, err: str, *must_contain: str, starts: str = "error: ") -> None:
    assert rc == 2, err
    assert "Traceback" not in err
    lines = err.strip("\n").split("\n")
    assert len(lines) == 1, err
    assert lines[0].startswith(starts), (starts, lines[0])
    assert "np." not in lines[0] and "numpy.float" not in lines[0], lines[0]  # numbers are written plainly
    for s in must_contain:
        assert s in lines[0], (s, lines[0])


def _trials(url: str, name: str) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=name, storage=open_storage(url)).get_trials(deepcopy=False)

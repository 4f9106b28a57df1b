"""Shared builders for the tuning tests (not a test module)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import optuna
import yaml

from _boom import cli_env  # noqa: F401 - the tuning tests' subprocess environment
from _sim_helpers import tiny_tune_doc

from memtp_sim.cli import main
from memtp_sim.tuning import open_storage

REPO = Path(__file__).resolve().parents[2]
TRACE = REPO / "data" / "traces" / "azure2023_conv.csv"


def tiny_doc(name: str = "t", **over) -> dict:
    """A fast tune spec (see ``_sim_helpers.tiny_tune_doc``)."""
    return tiny_tune_doc(name, **over)


def held_doc(name: str, hold: Path) -> dict:
    """:func:`tiny_doc` whose runs each wait in their first round until ``hold/release`` exists
    (the ``test_boom`` policy of ``tests/_boom.py``; a command needs :func:`cli_env`): a test knows
    which trials are mid-run, whatever the engine's speed."""
    doc = tiny_doc(name)
    doc["base"]["policy"] = {"name": "test_boom", "hold": str(hold)}
    doc["search_space"] = {"confidence.temperature": doc["search_space"]["confidence.temperature"],
                           "policy.k": {"type": "int", "low": 1, "high": 3}}
    return doc



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


def imported_profile(folder) -> str:
    """A format-2 profile made by `calibrate import` of the fixture table (B 1..16, B=16 at 58.7391 ms):
    ``folder/prof/p.yaml`` and its cost table ``folder/prof/p.costs.csv``."""
    out = folder / "prof" / "p.yaml"
    rc = main(["calibrate", "import", str(REPO / "tests" / "fixtures" / "calibration" / "table.csv"),
               "--format", "table", "--memory", "gpu_allocatable_gib=110", "--memory", "kv_shape=32,8,128",
               "--memory", "max_model_len=131072", "--memory", "weights_bytes=4912898304", "-o", str(out)])
    assert rc == 0
    return str(out)


def profiled_doc(name: str, profile: str) -> dict:
    doc = tiny_doc(name)
    doc["base"]["hardware"] = {"profile": profile}
    doc["base"]["engine"].update(max_batch_tokens=64, prefill_chunk_tokens=32)  # the table's measured range
    return doc


def _sha16(path) -> str:
    """Independent oracle for a recorded digest: the first 16 hex digits of SHA-256 of the bytes."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]

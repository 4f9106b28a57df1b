"""benchmarks/check_same_results.py, the refactoring check the README names: the same runs pass,
a changed run fails (exit 1) with plain values, bad input is one line with exit 2 (a fresh user's
report: a traceback and exit 1, which read as "different")."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from check_same_results import main  # noqa: E402 - a script beside the tests

TRACE = REPO / "data" / "traces" / "azure2023_conv.csv"


def _study(path: Path, num_requests: int, **extra) -> Path:
    path.write_text(yaml.safe_dump({"name": "t", "seeds": [0], "base": {
        "workload": {"trace": str(TRACE), "mode": "closed_loop", "concurrency": 2, "num_requests": num_requests},
        "policy": {"name": "no_spec"}, **extra}}))
    return path


def test_same_different_and_bad_input(tmp_path, capsys):
    ref = str(tmp_path / "ref.csv")
    study = _study(tmp_path / "s.yaml", 6)
    assert main(["save", str(study), ref]) == 0
    assert main(["compare", str(study), ref]) == 0 and "same: 1 runs" in capsys.readouterr().out
    _study(study, 7)
    assert main(["compare", str(study), ref]) == 1
    out = capsys.readouterr().out
    assert "DIFFERENT" in out and "num_requests: 1 runs differ" in out and ": 6 -> 7" in out, out
    for argv, needle in ((["compare", str(study), str(tmp_path / "none.csv")], "none.csv: reference not found"),
                         (["compare", str(_study(tmp_path / "b.yaml", 6, engine={"prefill_gpus": 4})), ref],
                          "base.engine.prefill_gpus: has no effect")):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0], err

"""pyflakes' checks over the tree (through ruff): an unused import or an undefined name is a
bug or dead code, and a lint that fails on main is one contributors learn to ignore."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_pyflakes_checks_pass() -> None:
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not Path(ruff).exists():
        pytest.fail("ruff is not installed: pip install -e '.[test]' installs it")
    proc = subprocess.run([ruff, "check", "--select", "F", "--output-format", "concise",
                           "memtp_sim", "tests", "benchmarks"], cwd=ROOT, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-1000:]

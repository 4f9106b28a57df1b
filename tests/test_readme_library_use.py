"""README's "Library use" block runs as written (fresh-user check: its scenario silently kept the
study base's no_spec policy; the block now picks DSpark, and this test keeps the block honest)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_library_use_block_runs_and_simulates_dspark(monkeypatch):
    block = re.search(r"## Library use\n\n```python\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    assert block, "README has no Library use block"
    monkeypatch.chdir(REPO)  # its paths are the repository's, as a user runs it from a clone
    env: dict = {}
    exec(compile(block.group(1), "README.md: Library use", "exec"), env)  # noqa: S102 - the README's own code
    assert env["scenario"].policy.name == "dspark"
    m = env["result"].metrics
    assert m["num_completed"] == env["scenario"].workload.num_requests > 0
    assert m["throughput_tok_per_s"] > 0 and m["tau"] > 1.0  # drafts were verified and accepted

"""Resume reuses a run only when every file it read is unchanged: each file a run opens (the
trace, the hardware profile and the measured data behind it, in either profile format, the
acceptance profile) must be in the run's input fingerprint. Recorded with Python's audit hook on
``open``, so no reader can be missed by listing them by hand (the format-2 ``costs:`` table once
was: an edited cost table gave the old results)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from memtp_sim import run
from memtp_sim._io import file_digest, load_yaml
from memtp_sim.config import Scenario
from memtp_sim.study import input_fingerprint

REPO = Path(__file__).resolve().parents[1]
_OPENED: list[str] | None = None


def _audit(event: str, args: tuple) -> None:
    if _OPENED is not None and event == "open" and isinstance(args[0], (str, Path)):
        _OPENED.append(str(args[0]))


sys.addaudithook(_audit)  # cannot be removed; records only while a test sets _OPENED


def _copy_profile(src: Path, dst: Path) -> Path:
    """The profile YAML and its data CSV (whichever key names it), copied fresh (no cache hit)."""
    dst.mkdir()
    doc = load_yaml(src.read_text())
    data = doc.get("costs") or doc["measurements"]
    shutil.copy(src.parent / data, dst / data)
    return Path(shutil.copy(src, dst / src.name))


@pytest.mark.parametrize("profile", ["h200/llama31-8b-bf16.yaml", "gfx1151/llama31-8b-q4km-vulkan.yaml"])
def test_every_file_a_run_reads_is_in_its_fingerprint(tmp_path, monkeypatch, profile):
    global _OPENED
    monkeypatch.setenv("MEMTP_SIM_CACHE_DIR", "off")
    hw = _copy_profile(REPO / "calibration" / profile, tmp_path / "hw")
    acc = Path(shutil.copy(REPO / "calibration" / "acceptance" / "dspark-qwen3.yaml", tmp_path / "acc.yaml"))
    trace = tmp_path / "trace.csv"
    trace.write_text(REPO.joinpath("data", "traces", "azure2023_conv.csv").read_text()[:20000].rsplit("\n", 1)[0])
    _OPENED = []  # validation reads the files too (it checks the profile and the trace)
    try:
        scen = Scenario.model_validate({
            "hardware": {"profile": str(hw)}, "acceptance": {"profile": str(acc)},
            "workload": {"trace": str(trace), "mode": "closed_loop", "concurrency": 2, "num_requests": 4},
            "engine": {"max_batch_tokens": 512, "prefill": "disaggregated"}, "policy": {"name": "dspark"}})
        run(scen, seed=0)
    finally:
        opened, _OPENED = {Path(p).resolve() for p in _OPENED}, None
    read_here = {p for p in opened if tmp_path.resolve() in p.parents}
    assert len(read_here) >= 4, read_here  # trace, profile YAML, its data, acceptance profile
    digests = set(input_fingerprint(scen).values())
    missed = [p.name for p in read_here if file_digest(p) not in digests]
    assert not missed, f"read by the run but not in its resume fingerprint: {missed}"

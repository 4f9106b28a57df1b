"""Run warnings say true things on the evidence they have, and inline hardware names its source.

Faults from a fresh user on a clean clone: a 2-request trace replay was called overloaded
(2 arrivals, 1 still in flight: ratio 2.0); a run whose passes were priced a fifth of the time
beyond the measured table said so only in a runs.csv column; an inline ``hardware.table``'s
memory figures were said to come from ``--memory`` on the command line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from memtp_sim.cli import main
from memtp_sim.metrics import EXTRAPOLATED_WARN_FRAC, OVERLOAD_MIN_ARRIVALS, OVERLOAD_RATIO, is_overloaded

sys.path.insert(0, str(Path(__file__).parent))
from _sim_helpers import TRACE  # noqa: E402

#: The README's inline table: measured to B = 64 only.
INLINE_HW = {"table": {1: 24.0, 16: 58.7, 64: 135.4}, "name": "mybox",
             "memory": {"gpu_allocatable_gib": 117, "weights_bytes": 4912898304, "kv_bytes_per_token": 131072,
                        "max_model_len": 131072}}


def _run(tmp_path: Path, capsys: pytest.CaptureFixture, name: str, base: dict[str, Any],
         sweep: dict[str, Any] | None = None) -> tuple[str, Path]:
    """``memtp_sim run`` of a one-file study: (stderr, study folder)."""
    f = tmp_path / f"{name}.yaml"
    f.write_text(yaml.safe_dump({"name": name, "base": base, **({"sweep": sweep} if sweep else {})}))
    assert main(["run", str(f), "--out", str(tmp_path / "out"), "--jobs", "1", "--quiet"]) == 0
    return capsys.readouterr().err, tmp_path / "out" / name


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMTP_SIM_CACHE_DIR", str(tmp_path / "cache"))


# ======================================================================= 1. overload needs evidence
def test_overload_needs_enough_arrivals():
    assert not is_overloaded(2.0, 2)  # the user's replay: 2 arrivals, 1 finished before the last
    assert not is_overloaded(OVERLOAD_RATIO * 3, OVERLOAD_MIN_ARRIVALS - 1)
    assert is_overloaded(OVERLOAD_RATIO * 1.01, OVERLOAD_MIN_ARRIVALS)
    assert not is_overloaded(float("nan"), 1000)  # a closed loop


def test_a_two_request_replay_is_not_called_overloaded(tmp_path, capsys):
    base = {"workload": {"trace": str(TRACE), "mode": "trace", "num_requests": 2}}
    err, root = _run(tmp_path, capsys, "tiny", base)
    runs = list(root.glob("runs/*/summary.json"))
    m = json.loads(runs[0].read_text())["metrics"]
    assert m["offered_load_ratio"] > OVERLOAD_RATIO and m["num_requests"] == 2  # the ratio alone would flag it
    assert "offered load above capacity" not in err
    assert "Offered load above capacity" not in (root / "report.html").read_text()


# ======================================================================= 2. inline table provenance
def test_inline_table_memory_says_it_came_from_the_scenario_yaml(tmp_path, capsys, cache):
    base = {"hardware": INLINE_HW, "workload": {"trace": str(TRACE), "mode": "closed_loop", "concurrency": 2,
                                                "num_requests": 4}}
    _, root = _run(tmp_path, capsys, "inl", base)
    summary = json.loads(next(root.glob("runs/*/summary.json")).read_text())
    hw = summary["provenance"]["hardware"]
    text = json.dumps(hw) + (root / "report.html").read_text()
    assert "command line" not in text and "--memory" not in text
    assert hw["sources"]["weights"] == "given in the scenario YAML (hardware.memory.weights_bytes)"
    assert hw["sources"]["gpu_allocatable"] == "given in the scenario YAML (hardware.memory.gpu_allocatable_gib)"
    assert "hardware.memory.reserve_gib" in hw["sources"]["reserve"]
    # the measured passes name the scenario's table, not the cache file they pass through
    assert hw["sources"]["verify"].startswith("scenario YAML hardware.table key 1")
    assert "mybox.table.yaml" not in text


def test_kv_shape_given_inline_names_the_scenario_field(tmp_path, monkeypatch):
    from memtp_sim.hardware import load_profile
    from memtp_sim.hardware.importers import inline_table_profile

    monkeypatch.setenv("MEMTP_SIM_CACHE_DIR", str(tmp_path / "cache"))
    mem = {k: v for k, v in INLINE_HW["memory"].items() if k != "kv_bytes_per_token"}
    p = load_profile(inline_table_profile(INLINE_HW["table"], {**mem, "kv_shape": [32, 8, 128]}, "mybox"))
    assert p.summary()["sources"]["kv"].endswith("(hardware.memory.kv_shape)")


# ======================================================================= 3. extrapolation is warned
def test_passes_priced_beyond_the_measured_table_are_warned(tmp_path, capsys, cache):
    base = {"hardware": INLINE_HW, "workload": {"trace": str(TRACE), "mode": "closed_loop", "concurrency": 64,
                                                "num_requests": 96}}
    # 32-token prefill chunks keep nearly every pass inside the table (B <= 64); 256-token ones do not
    err, root = _run(tmp_path, capsys, "ext", base, sweep={"engine.prefill_chunk_tokens": [32, 256]})
    fracs = {}
    for f in root.glob("runs/*/summary.json"):
        s = json.loads(f.read_text())
        fracs[s["scenario"]["engine"]["prefill_chunk_tokens"]] = s["metrics"]["extrapolated_cost_frac"]
    assert fracs[32] < EXTRAPOLATED_WARN_FRAC < fracs[256]
    lines = [ln for ln in err.splitlines() if "outside the measured B range" in ln]
    assert len(lines) == 1 and lines[0].startswith("warning: engine.prefill_chunk_tokens = 256,"), err
    assert f"{fracs[256]:.0%} of passes" in lines[0] and "measured B 1..64" in lines[0]
    html = (root / "report.html").read_text()
    assert "Pass times extrapolated" in html and "measured B 1..64" in html


def test_the_measured_range_names_the_rule_on_each_side_that_can_apply():
    # a table measured from B=64 prices a 1-user pass by its below_min rule: "beyond that roofline"
    # alone named the wrong rule (a fresh user's report)
    from memtp_sim.report.numbers import _measured_range

    def summary(b, below, beyond):
        return {"provenance": {"hardware": {"sps": {"batch_tokens": b, "below_min": below, "beyond_max": beyond}}}}
    assert _measured_range(summary([64, 128, 512], "flat", "roofline")) == \
        "measured B 64..512, below that flat, beyond that roofline"
    assert _measured_range(summary([1, 16, 64], "flat", "roofline")) == "measured B 1..64, beyond that roofline"
    assert _measured_range({}) == ""

"""Tests for memtp_sim.memtp: the MEMTP depth formula, live telemetry, coherence, controller.

Expected values are worked out by hand in the comments (independent oracles), not produced by
running the code under test.
"""

from __future__ import annotations

import itertools
import math
import stat
import sys
import types
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memtp_sim.memtp import (
    FLOOR_EPSILON,
    CoherenceEstimator,
    CoherenceEWMA,
    DepthController,
    coherence_gate,
    memtp_depth,
)
from memtp_sim.telemetry import KNOWN_TELEMETRY_SOURCES, MemoryTelemetry, memtp_depth_live, read_free_memory

GIB = 1 << 30
MIB = 1 << 20


# --------------------------------------------------------------------------------------------
# Formula: hand cases
# --------------------------------------------------------------------------------------------


def test_reference_point_from_design():
    # 21.49 / 4 = 5.3725 -> floor 5 at g = 1.
    assert memtp_depth(21.49, 1.0) == 5
    # R = 0.3 = r_low -> g = 0 -> floor(0) = 0 -> clamped up to 1.
    assert memtp_depth(21.49, 0.3) == 1


def test_clamp_at_one_when_memory_is_short():
    # 2 / 4 = 0.5 -> floor 0 -> clamp 1.
    assert memtp_depth(2.0, 1.0) == 1
    assert memtp_depth(0.0, 1.0) == 1


def test_clamp_at_max_depth():
    # 1000 / 4 = 250 -> clamp 16 (default) or 8.
    assert memtp_depth(1000.0, 1.0) == 16
    assert memtp_depth(1000.0, 1.0, max_depth=8) == 8


def test_linear_region_of_the_gate():
    # g(0.6) = (0.6 - 0.3) / (0.9 - 0.3) = 0.5; 40 / 4 * 0.5 = 5.
    assert coherence_gate(0.6, 0.3, 0.9) == pytest.approx(0.5)
    assert memtp_depth(40.0, 0.6, head_cost_gib=4.0) == 5
    # g(0.75) = 0.45 / 0.6 = 0.75; 10 * 0.75 = 7.5 -> 7.
    assert coherence_gate(0.75, 0.3, 0.9) == pytest.approx(0.75)
    assert memtp_depth(40.0, 0.75, head_cost_gib=4.0) == 7


def test_gate_boundaries_are_exact():
    assert coherence_gate(0.9, 0.3, 0.9) == 1.0
    assert coherence_gate(1.0, 0.3, 0.9) == 1.0
    assert coherence_gate(0.3, 0.3, 0.9) == 0.0
    assert coherence_gate(0.0, 0.3, 0.9) == 0.0
    # R = r_high -> g = 1 -> 40 / 4 = 10.
    assert memtp_depth(40.0, 0.9) == 10
    # R = r_low -> g = 0 -> clamp 1.
    assert memtp_depth(40.0, 0.3) == 1


def test_floor_is_guarded_against_rounding_error():
    # 20 / 4 * 1 = 5 exactly.
    assert memtp_depth(20.0, 1.0) == 5
    # 0.1 * 3 = 0.30000000000000004 in floats, 0.3 / 0.1 = 2.9999999999999996: the latter
    # stands for 3 and must not floor to 2.
    assert 0.3 / 0.1 < 3
    assert memtp_depth(0.3, 1.0, head_cost_gib=0.1) == 3
    # A gate in the linear region whose product stands for an integer: R = 0.6 with
    # r_low = 0.3, r_high = 0.9 gives g = 0.3 / 0.6 (not exactly 0.5 in floats); 12 / 1.2 * g = 5.
    assert memtp_depth(12.0, 0.6, head_cost_gib=1.2) == 5
    assert FLOOR_EPSILON <= 1e-6


# --------------------------------------------------------------------------------------------
# Formula: properties
# --------------------------------------------------------------------------------------------

_free = st.floats(min_value=0.0, max_value=1e4, allow_nan=False, allow_infinity=False)
_coh = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
_cost = st.floats(min_value=0.01, max_value=100.0, allow_nan=False)
_max_depth = st.integers(min_value=1, max_value=64)


@st.composite
def _thresholds(draw):
    lo = draw(st.floats(min_value=0.0, max_value=0.99, allow_nan=False))
    hi = draw(st.floats(min_value=lo, max_value=1.0, allow_nan=False).filter(lambda h: h > lo))
    return lo, hi


@settings(max_examples=300, deadline=None)
@given(a=_free, b=_free, r=_coh, cost=_cost, md=_max_depth, th=_thresholds())
def test_depth_monotone_in_free_memory_and_bounded(a, b, r, cost, md, th):
    lo, hi = sorted((a, b))
    kw = {"max_depth": md, "head_cost_gib": cost, "r_low": th[0], "r_high": th[1]}
    d_lo = memtp_depth(lo, r, **kw)
    d_hi = memtp_depth(hi, r, **kw)
    assert 1 <= d_lo <= d_hi <= md


@settings(max_examples=300, deadline=None)
@given(free=_free, r1=_coh, r2=_coh, cost=_cost, md=_max_depth, th=_thresholds())
def test_depth_monotone_in_coherence_and_bounded(free, r1, r2, cost, md, th):
    lo, hi = sorted((r1, r2))
    kw = {"max_depth": md, "head_cost_gib": cost, "r_low": th[0], "r_high": th[1]}
    d_lo = memtp_depth(free, lo, **kw)
    d_hi = memtp_depth(free, hi, **kw)
    assert 1 <= d_lo <= d_hi <= md
    assert 0.0 <= coherence_gate(lo, *th) <= coherence_gate(hi, *th) <= 1.0


# --------------------------------------------------------------------------------------------
# Formula: bad input
# --------------------------------------------------------------------------------------------


def test_r_low_not_below_r_high_is_rejected_naming_both():
    with pytest.raises(ValueError, match=r"r_low.*r_high"):
        memtp_depth(10.0, 1.0, r_low=0.9, r_high=0.9)
    with pytest.raises(ValueError, match=r"r_low.*r_high"):
        coherence_gate(0.5, 0.8, 0.2)


def test_thresholds_outside_unit_interval_are_rejected():
    with pytest.raises(ValueError, match="r_low"):
        memtp_depth(10.0, 1.0, r_low=-0.1)
    with pytest.raises(ValueError, match="r_high"):
        memtp_depth(10.0, 1.0, r_high=1.5)


@pytest.mark.parametrize("bad", [-1.0, -1e-12, math.nan, math.inf])
def test_bad_free_memory_is_rejected(bad):
    with pytest.raises(ValueError, match="free_gib"):
        memtp_depth(bad, 1.0)


@pytest.mark.parametrize("bad", [0.0, -4.0, math.nan, math.inf])
def test_bad_head_cost_is_rejected(bad):
    with pytest.raises(ValueError, match="head_cost_gib"):
        memtp_depth(10.0, 1.0, head_cost_gib=bad)


@pytest.mark.parametrize("bad", [-0.01, 1.01, math.nan])
def test_bad_coherence_is_rejected(bad):
    with pytest.raises(ValueError, match="coherence"):
        memtp_depth(10.0, bad)


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "4"])
def test_bad_max_depth_is_rejected(bad):
    with pytest.raises(ValueError, match="max_depth"):
        memtp_depth(10.0, 1.0, max_depth=bad)


# --------------------------------------------------------------------------------------------
# Live telemetry
# --------------------------------------------------------------------------------------------


def _write(path: Path, value: int | str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{value}\n")


def _fake_card(root: Path, card: str, vram_total, vram_used, gtt_total=None, gtt_used=None):
    dev = root / card / "device"
    _write(dev / "mem_info_vram_total", vram_total)
    _write(dev / "mem_info_vram_used", vram_used)
    if gtt_total is not None:
        _write(dev / "mem_info_gtt_total", gtt_total)
        _write(dev / "mem_info_gtt_used", gtt_used)


@pytest.fixture
def no_pynvml(monkeypatch):
    """Make ``import pynvml`` fail, whatever this machine has installed."""
    monkeypatch.setitem(sys.modules, "pynvml", None)


def _meminfo(path: Path, total_kib: int, avail_kib: int) -> Path:
    path.write_text(
        f"MemTotal:       {total_kib} kB\n"
        f"MemFree:        {avail_kib // 2} kB\n"
        f"MemAvailable:   {avail_kib} kB\n"
        "Buffers:          1024 kB\n"
        "HugePages_Total:       0\n"
    )
    return path


def test_live_depth_on_this_machine():
    depth, info = memtp_depth_live()
    assert 1 <= depth <= 16
    assert info["source"].startswith(KNOWN_TELEMETRY_SOURCES)
    assert info["depth"] == depth
    assert info["free_gib"] >= 0.0 and info["total_gib"] > 0.0
    assert set(info) == {
        "source",
        "free_gib",
        "total_gib",
        "used_gib",
        "reserve_gib",
        "head_cost_gib",
        "coherence",
        "r_low",
        "r_high",
        "max_depth",
        "depth",
    }


def test_amd_sysfs_unified_memory_reference_point(tmp_path, no_pynvml):
    sysfs = tmp_path / "drm"
    # Strix-Halo-like APU: 512 MiB VRAM carve-out, all used (0.5 GiB); GTT 120 GiB of which
    # 21.49 GiB free (bytes rounded to an integer). free = 0 + 21.49 -> 21.49 / 4 -> depth 5.
    gtt_total = 120 * GIB
    gtt_free = round(21.49 * GIB)
    _fake_card(sysfs, "card0", 512 * MIB, 512 * MIB, gtt_total, gtt_total - gtt_free)
    # A smaller discrete-looking card, and DRM entries that are not cards: all ignored.
    _fake_card(sysfs, "card1", 8 * GIB, 1 * GIB)
    (sysfs / "card0-DP-1").mkdir()
    (sysfs / "renderD128").mkdir()
    _write(sysfs / "version", "drm 1.1.0")

    reading = read_free_memory(
        sysfs_root=sysfs, proc_meminfo=tmp_path / "none", nvidia_smi=str(tmp_path / "none")
    )
    assert reading.source.startswith("amd-sysfs")
    assert reading.source == "amd-sysfs:card0 vram+gtt"
    assert reading.free_gib == pytest.approx(21.49, abs=1e-9)
    assert reading.total_gib == pytest.approx(120.5)
    assert reading.used_gib == pytest.approx(0.5 + 120 - 21.49, abs=1e-9)
    assert reading.details["vram_free_gib"] == 0.0

    depth, info = memtp_depth_live(sysfs_root=str(sysfs))
    assert depth == 5
    assert info["source"] == "amd-sysfs:card0 vram+gtt"
    # R = 0.3 -> gate 0 -> 1.
    assert memtp_depth_live(coherence=0.3, sysfs_root=str(sysfs))[0] == 1
    # reserve 5.49 GiB leaves 16 GiB -> 4 heads.
    assert memtp_depth_live(sysfs_root=str(sysfs), reserve_gib=5.49)[0] == 4


def test_amd_sysfs_picks_largest_card_and_handles_missing_gtt(tmp_path, no_pynvml):
    sysfs = tmp_path / "drm"
    # card0: 4 GiB VRAM, no GTT. card1: 24 GiB VRAM, 6 GiB used -> 18 GiB free, largest total.
    _fake_card(sysfs, "card0", 4 * GIB, 0)
    _fake_card(sysfs, "card1", 24 * GIB, 6 * GIB)
    # card2 has unreadable contents and is skipped.
    _fake_card(sysfs, "card2", "garbage", "x")
    reading = read_free_memory(sysfs_root=sysfs, proc_meminfo=tmp_path / "none")
    assert reading.source == "amd-sysfs:card1 vram"
    assert reading.free_gib == pytest.approx(18.0)
    # 18 / 4 = 4.5 -> 4.
    assert memtp_depth_live(sysfs_root=sysfs)[0] == 4


def test_meminfo_fallback(tmp_path, no_pynvml):
    empty = tmp_path / "drm"
    empty.mkdir()
    # 64 GiB total, 42 GiB available (KiB): 42 / 4 = 10.5 -> 10.
    meminfo = _meminfo(tmp_path / "meminfo", 64 * 1024 * 1024, 42 * 1024 * 1024)
    missing_smi = str(tmp_path / "bin" / "nvidia-smi")
    reading = read_free_memory(sysfs_root=empty, proc_meminfo=meminfo, nvidia_smi=missing_smi)
    assert reading.source == "system-meminfo"
    assert (reading.free_gib, reading.total_gib, reading.used_gib) == (42.0, 64.0, 22.0)
    assert any("nvidia-smi" in s for s in reading.details["skipped"])
    depth, info = memtp_depth_live(
        sysfs_root=str(empty), proc_meminfo=str(meminfo), nvidia_smi=missing_smi
    )
    assert depth == 10
    assert info["source"] == "system-meminfo"
    assert info["free_gib"] == 42.0


def test_missing_sysfs_root_falls_through(tmp_path, no_pynvml):
    meminfo = _meminfo(tmp_path / "meminfo", 8 * 1024 * 1024, 4 * 1024 * 1024)
    reading = read_free_memory(
        sysfs_root=tmp_path / "does-not-exist",
        proc_meminfo=meminfo,
        nvidia_smi=str(tmp_path / "nope"),
    )
    assert reading.source == "system-meminfo"
    assert reading.free_gib == 4.0


def test_nvidia_smi_is_used_when_present(tmp_path, no_pynvml):
    # A stand-in executable printing "total, used" in MiB: 81920 MiB total, 10240 MiB used
    # -> 70 GiB free -> 70 / 4 = 17.5 -> 17 (max_depth 32) or 16 (default clamp).
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '81920, 10240'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    empty = tmp_path / "drm"
    empty.mkdir()
    reading = read_free_memory(sysfs_root=empty, nvidia_smi=str(smi))
    assert reading.source == "nvidia-smi"
    assert (reading.total_gib, reading.used_gib, reading.free_gib) == (80.0, 10.0, 70.0)
    assert memtp_depth_live(32, sysfs_root=empty, nvidia_smi=str(smi))[0] == 17
    assert memtp_depth_live(sysfs_root=empty, nvidia_smi=str(smi))[0] == 16


def test_nvidia_smi_garbage_falls_through(tmp_path, no_pynvml):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'No devices were found'\nexit 6\n")
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    meminfo = _meminfo(tmp_path / "meminfo", 8 * 1024 * 1024, 6 * 1024 * 1024)
    empty = tmp_path / "drm"
    empty.mkdir()
    reading = read_free_memory(sysfs_root=empty, proc_meminfo=meminfo, nvidia_smi=str(smi))
    assert reading.source == "system-meminfo"


def test_pynvml_is_preferred_over_nvidia_smi(tmp_path, monkeypatch):
    calls = []
    info = types.SimpleNamespace(total=48 * GIB, used=12 * GIB, free=36 * GIB)
    fake = types.ModuleType("pynvml")
    fake.nvmlInit = lambda: calls.append("init")
    fake.nvmlShutdown = lambda: calls.append("shutdown")
    fake.nvmlDeviceGetHandleByIndex = lambda i: ("handle", i)
    fake.nvmlDeviceGetMemoryInfo = lambda h: info
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    empty = tmp_path / "drm"
    empty.mkdir()
    reading = read_free_memory(sysfs_root=empty, nvidia_smi=str(tmp_path / "none"))
    assert reading.source == "nvidia-nvml"
    assert (reading.total_gib, reading.used_gib, reading.free_gib) == (48.0, 12.0, 36.0)
    assert calls == ["init", "shutdown"]
    # 36 / 4 = 9.
    assert memtp_depth_live(sysfs_root=empty)[0] == 9


def test_nothing_readable_raises_runtime_error(tmp_path, no_pynvml):
    empty = tmp_path / "drm"
    empty.mkdir()
    with pytest.raises(RuntimeError, match="no memory telemetry"):
        read_free_memory(
            sysfs_root=empty,
            proc_meminfo=tmp_path / "missing",
            nvidia_smi=str(tmp_path / "missing-smi"),
        )


def test_live_rejects_unknown_keyword():
    with pytest.raises(TypeError, match="head_cost"):
        memtp_depth_live(head_cost=4.0)


def test_live_rejects_bad_formula_arguments(tmp_path):
    with pytest.raises(ValueError, match="reserve_gib"):
        memtp_depth_live(reserve_gib=-1.0)
    with pytest.raises(ValueError, match="head_cost_gib"):
        memtp_depth_live(head_cost_gib=0.0)
    with pytest.raises(ValueError, match=r"r_low.*r_high"):
        memtp_depth_live(r_low=0.5, r_high=0.4)


def test_memory_telemetry_is_frozen():
    t = MemoryTelemetry(1.0, 2.0, 1.0, "system-meminfo")
    with pytest.raises(AttributeError):
        t.free_gib = 3.0  # type: ignore[misc]
    assert t.to_dict()["source"] == "system-meminfo"


# --------------------------------------------------------------------------------------------
# Coherence estimator
# --------------------------------------------------------------------------------------------


def test_ewma_two_steps_by_hand():
    est = CoherenceEWMA(half_life_rounds=1, initial=1.0)
    assert est.alpha == 0.5  # 1 - 2**-1
    # 0.5 * 1.0 + 0.5 * (1/4) = 0.625
    assert est.update(1, 4) == pytest.approx(0.625)
    # 0.5 * 0.625 + 0.5 * (3/4) = 0.6875
    assert est.update(3, 4) == pytest.approx(0.6875)
    # No verified draft tokens: unchanged.
    assert est.update(0, 0) == pytest.approx(0.6875)
    assert est.value == pytest.approx(0.6875)
    assert est.num_updates == 2


def test_ewma_half_life_meaning():
    # half-life 2 rounds: alpha = 1 - 2**-0.5; after two rounds of ratio 0 from R = 1,
    # R = (2**-0.5)**2 = 0.5.
    est = CoherenceEWMA(half_life_rounds=2)
    est.update(0, 10)
    est.update(0, 3)
    assert est.value == pytest.approx(0.5)


def test_ewma_is_a_coherence_estimator_and_validates():
    assert isinstance(CoherenceEWMA(), CoherenceEstimator)
    with pytest.raises(ValueError, match="half_life_rounds"):
        CoherenceEWMA(half_life_rounds=0)
    with pytest.raises(ValueError, match="initial"):
        CoherenceEWMA(initial=1.5)
    est = CoherenceEWMA()
    with pytest.raises(ValueError, match="accepted_draft_tokens"):
        est.update(5, 4)
    with pytest.raises(ValueError, match="verified_draft_tokens"):
        est.update(0, -1)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 50), st.integers(0, 50)), max_size=50),
    st.floats(0.1, 100.0),
    _coh,
)
def test_ewma_stays_in_unit_interval(rounds, half_life, initial):
    est = CoherenceEWMA(half_life_rounds=half_life, initial=initial)
    for a, b in rounds:
        v = est.update(min(a, b), max(a, b))
        assert 0.0 <= v <= 1.0


# --------------------------------------------------------------------------------------------
# Depth controller
# --------------------------------------------------------------------------------------------


def test_controller_flicker_across_head_boundary_does_not_thrash():
    dwell = 32
    ctl = DepthController(min_dwell_rounds=dwell, initial_depth=5)
    n = 1000
    depths = []
    for t in range(n):
        # 20.1 GiB funds 5 heads, 19.9 GiB only 4: the boundary is crossed every round.
        free = 20.1 if t % 2 == 0 else 19.9
        depths.append(ctl.propose(free, 1.0, t))
    # Round 1 (19.9 GiB) needs the shrink at once; the target 5 never holds for 32 rounds in a
    # row afterwards, so the depth stays at 4.
    assert depths[0] == 5 and depths[1] == 4
    assert set(depths[1:]) == {4}
    assert ctl.num_changes <= n / dwell + 2
    assert ctl.num_changes == 1
    assert ctl.changes[0].reason == "memory"


def test_controller_slow_oscillation_is_rate_limited():
    # Free memory spends 40 rounds at 20.1 GiB then 40 at 19.9 GiB: the controller may follow,
    # but no faster than the dwell allows.
    dwell = 32
    ctl = DepthController(min_dwell_rounds=dwell, initial_depth=5)
    n = 2000
    for t in range(n):
        free = 20.1 if (t // 40) % 2 == 0 else 19.9
        d = ctl.propose(free, 1.0, t)
        assert d * 4.0 <= max(free, 4.0) + 1e-9  # never more heads than memory holds
    # Each 80-round period: one memory shrink, and one growth after 32 rounds of target 5.
    assert ctl.num_changes <= 2 * (n / dwell + 1)
    assert ctl.num_changes == 2 * (n // 80) - 1  # 25 shrinks, 24 regrowths


def test_controller_shrinks_immediately_on_memory_drop_and_grows_one_head_per_dwell():
    dwell = 8
    ctl = DepthController(min_dwell_rounds=dwell, initial_depth=1)
    t = 0
    # Plenty of memory (40 GiB -> target 10): growth of one head per 8 rounds.
    while ctl.depth < 5:
        ctl.propose(40.0, 1.0, t)
        t += 1
    # From depth 1, each growth needs 8 rounds of "target above": 4 growths -> 32 rounds.
    assert t == 4 * dwell
    assert [c.reason for c in ctl.changes] == ["grow"] * 4
    assert [c.new_depth for c in ctl.changes] == [2, 3, 4, 5]
    # Memory drops to 9 GiB (2 heads): shrink at once, in that very round, to exactly 2.
    assert ctl.propose(9.0, 1.0, t) == 2
    assert ctl.changes[-1].reason == "memory"
    assert ctl.changes[-1].round_index == t


def test_controller_coherence_shrink_waits_for_dwell():
    dwell = 4
    ctl = DepthController(min_dwell_rounds=dwell, initial_depth=5)
    # 40 GiB is plenty for 5 heads; R = 0.6 -> g = 0.5 -> target 5 (equal: no change).
    assert ctl.propose(40.0, 0.6, 0) == 5
    # R = 0.45 -> g = 0.25 -> target floor(2.5) = 2; then one round at R = 0.5 -> g = 1/3
    # -> floor(3.33) = 3. After 4 rounds below, shrink to the highest target seen: 3.
    assert ctl.propose(40.0, 0.45, 1) == 5
    assert ctl.propose(40.0, 0.5, 2) == 5
    assert ctl.propose(40.0, 0.45, 3) == 5
    assert ctl.propose(40.0, 0.45, 4) == 3
    assert ctl.changes[-1].reason == "coherence"
    # A coherence dip shorter than the dwell changes nothing.
    ctl2 = DepthController(min_dwell_rounds=dwell, initial_depth=5)
    for t in range(100):
        r = 0.3 if t % 4 == 3 else 1.0
        assert ctl2.propose(40.0, r, t) == 5
    assert ctl2.num_changes == 0


def test_controller_grow_margin_adds_hysteresis():
    ctl = DepthController(min_dwell_rounds=1, initial_depth=4, grow_margin_gib=0.5)
    # 20.2 GiB: target 5, but 20.2 - 0.5 = 19.7 GiB only holds 4 heads: no growth.
    for t in range(10):
        assert ctl.propose(20.2, 1.0, t) == 4
    # 20.6 - 0.5 = 20.1 GiB holds 5: grow.
    assert ctl.propose(20.6, 1.0, 10) == 5


@settings(max_examples=200, deadline=None)
@given(
    frees=st.lists(st.floats(0.0, 80.0), min_size=1, max_size=300),
    coh=st.lists(_coh, min_size=1, max_size=300),
    dwell=st.integers(1, 40),
    d0=st.integers(1, 16),
)
def test_controller_invariants(frees, coh, dwell, d0):
    ctl = DepthController(min_dwell_rounds=dwell, initial_depth=d0)
    n = len(frees)
    for t, free in enumerate(frees):
        d = ctl.propose(free, coh[t % len(coh)], t)
        assert 1 <= d <= 16
        # Memory first: never more heads than free memory holds (one head always kept).
        assert d == 1 or d * 4.0 <= free + 1e-6
    # Change-rate bound: non-memory changes <= n/dwell + 1; memory shrinks <= growths + 15.
    assert ctl.num_changes <= 2 * (n / dwell + 1) + 15
    grows = [c for c in ctl.changes if c.reason == "grow"]
    assert all(c.new_depth == c.old_depth + 1 for c in grows)
    others = [c for c in ctl.changes if c.reason != "memory"]
    for a, b in itertools.pairwise(others):
        assert b.round_index - a.round_index >= dwell


def test_controller_validates_input():
    with pytest.raises(ValueError, match=r"r_low.*r_high"):
        DepthController(r_low=0.9, r_high=0.3)
    with pytest.raises(ValueError, match="head_cost_gib"):
        DepthController(head_cost_gib=0.0)
    with pytest.raises(ValueError, match="min_dwell_rounds"):
        DepthController(min_dwell_rounds=0)
    with pytest.raises(ValueError, match="initial_depth"):
        DepthController(max_depth=4, initial_depth=5)
    ctl = DepthController()
    with pytest.raises(ValueError, match="free_gib"):
        ctl.propose(-1.0, 1.0, 0)
    ctl.propose(10.0, 1.0, 3)
    with pytest.raises(ValueError, match="round_index"):
        ctl.propose(10.0, 1.0, 3)

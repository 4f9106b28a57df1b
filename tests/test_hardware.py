"""Hardware profiles: the measured SPS(B) table, its lookup rule, drafter cost and KV memory.

Measured values are typed in from /work/shared/data/calibration/gfx1151_measurements.csv, rows
model = shisa-v2-llama3.1-8b.i1-Q4_K_M, backend_detail = Vulkan AMDVLK, flash_attn = 1,
llama.cpp build a4575513 (5863), "llama-bench pp, single forward pass", KV depth 0
(column derived_pass_ms).
"""

from __future__ import annotations

import numpy as np
import pytest

from memtp_sim import hardware_aware_prefix_scheduler, list_profiles, load_profile
from memtp_sim.errors import CalibrationError
from memtp_sim.hardware import DrafterCost, SPSTable

# derived_pass_ms of the shipped curve (B: ms)
MEASURED_MS = {1: 23.7809, 2: 26.6534, 4: 32.3816, 8: 47.2655, 16: 86.4674, 32: 89.3694, 512: 833.6069}


@pytest.fixture(scope="module")
def default_profile():
    return load_profile(None)


@pytest.mark.parametrize("b,ms", sorted(MEASURED_MS.items()))
def test_shipped_profile_reproduces_measured_points(default_profile, b, ms):
    assert default_profile.sps.pass_time_s(b) == pytest.approx(ms / 1000.0, rel=1e-12)
    assert default_profile.sps.sps(b) == pytest.approx(1000.0 / ms, rel=1e-12)


def test_lookup_is_linear_in_pass_time_between_measured_points(default_profile):
    t8, t16 = 47.2655, 86.4674
    # B = 12, halfway: (47.2655 + 86.4674) / 2 = 66.86645 ms
    assert default_profile.sps.pass_time_s(12) * 1e3 == pytest.approx(66.86645, rel=1e-12)
    # B = 10: 47.2655 + (86.4674 - 47.2655) * 2 / 8 = 57.065975 ms
    assert default_profile.sps.pass_time_s(10) * 1e3 == pytest.approx(57.065975, rel=1e-12)
    # constant step of (86.4674 - 47.2655) / 8 = 4.9002375 ms between B = 8 and 16
    steps = np.diff(np.asarray(default_profile.sps.pass_time_s(np.arange(8, 17))) * 1e3)
    assert steps == pytest.approx(np.full(8, (t16 - t8) / 8), rel=1e-9)
    # and it is the steps per second that is NOT linear: SPS(12) != (SPS(8) + SPS(16)) / 2
    assert default_profile.sps.sps(12) != pytest.approx((1000 / t8 + 1000 / t16) / 2, rel=1e-3)


def test_cliff_between_8_and_16_is_kept(default_profile):
    # measured: 8 -> 47.27 ms, 16 -> 86.47 ms, 32 -> 89.37 ms: nearly doubles then flat.
    t = default_profile.sps
    assert t.pass_time_s(16) / t.pass_time_s(8) > 1.8
    assert t.pass_time_s(32) / t.pass_time_s(16) < 1.04


@pytest.mark.parametrize("b", [0, 513, 1024])
def test_shipped_profile_refuses_batches_outside_measured_range(default_profile, b):
    with pytest.raises(ValueError):
        default_profile.sps.pass_time_s(b)


def test_scheduler_on_shipped_profile_refuses_scans_past_512():
    # 65 requests x 7 drafts with a global search: the scan needs B up to 65 + 455 = 520 > 512.
    conf = [[0.99] * 7] * 65
    with pytest.raises(ValueError, match="sps"):
        hardware_aware_prefix_scheduler(conf, None, early_stop=False)
    # capping B at the measured range makes it valid again
    r = hardware_aware_prefix_scheduler(conf, None, early_stop=False, max_batch_tokens=512)
    assert r.batch_tokens <= 512


def test_user_table_only_neighbours_matter():
    # pass times 10 ms (B=1), 100 ms (B=2), 20 ms (B=4): B=3 is between its neighbours 2 and 4
    # -> (100 + 20) / 2 = 60 ms whatever B=1 is.
    t = SPSTable(np.array([1, 2, 4]), np.array([10.0, 100.0, 20.0]))
    assert t.pass_time_s(3) == pytest.approx(0.060)
    t2 = SPSTable(np.array([1, 2, 4]), np.array([1.0, 100.0, 20.0]))
    assert t2.pass_time_s(3) == pytest.approx(0.060)


def test_from_mapping_is_steps_per_second():
    t = SPSTable.from_mapping({1: 100.0, 3: 50.0})  # 10 ms and 20 ms
    assert t.pass_time_s(1) == pytest.approx(0.010)
    assert t.pass_time_s(2) == pytest.approx(0.015)  # halfway in pass time, not in SPS
    assert t.sps(3) == pytest.approx(50.0)


@pytest.mark.parametrize("bad", [{}, {0: 1.0}, {1: 0.0}, {1: -2.0}, {1.5: 1.0}, {1: float("nan")}])
def test_from_mapping_rejects_bad_tables(bad):
    with pytest.raises(ValueError, match="sps"):
        SPSTable.from_mapping(bad)


def test_extrapolation_only_when_asked():
    # linear in pass time through the last two points: 10 ms at B=1, 20 ms at B=2 -> 40 ms at B=4
    t = SPSTable(np.array([1, 2]), np.array([10.0, 20.0]), beyond_max="extrapolate")
    assert t.pass_time_s(4) == pytest.approx(0.040)
    with pytest.raises(ValueError):
        SPSTable(np.array([1, 2]), np.array([10.0, 20.0])).pass_time_s(4)


def test_drafter_round_time_hand_values():
    # T = max(t_small, n * t_large / large_b) * scale + gamma * t_seq, n = R * gamma
    d = DrafterCost(t_small_s=0.005, large_b=512, t_large_s=0.100, time_scale=1.0, t_seq_s=0.001, weights_gib=1.0)
    # R=1, gamma=4: n = 4 -> 4 * 0.1 / 512 = 0.00078 < 0.005 -> 5 ms + 4 ms = 9 ms
    assert d.round_time_s(1, 4) == pytest.approx(0.009)
    # R=64, gamma=8: n = 512 -> 100 ms + 8 ms = 108 ms
    assert d.round_time_s(64, 8) == pytest.approx(0.108)
    assert d.round_time_s(5, 0) == 0.0
    assert d.round_time_s(0, 5) == 0.0


def test_shipped_kv_capacity_from_stated_figures(default_profile):
    # profile YAML: 120000 MiB allocatable, weights 4912898304 B = 4685.3125 MiB, reserve 2 GiB,
    # drafter 1 GiB, KV 131072 B/token x 16 tokens = 2 MiB per block.
    # speculative: (120000 - 4685.3125 - 2048 - 1024) / 2 = 56121.34 -> 56121 blocks
    # no drafter:  (120000 - 4685.3125 - 2048) / 2        = 56633.34 -> 56633 blocks
    mem = default_profile.memory
    assert mem.kv_capacity_blocks(speculative=True) == 56121
    assert mem.kv_capacity_blocks(speculative=False) == 56633


def test_unknown_profile_name_is_a_calibration_error():
    with pytest.raises(CalibrationError, match="no-such-profile"):
        load_profile("no-such-profile")


def test_every_listed_hardware_profile_loads():
    for name in list_profiles():
        load_profile(name)


def test_profiles_command_lists_the_default(capsys):
    from memtp_sim.cli import main

    rc = main(["profiles"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "gfx1151-llama31-8b-q4km-vulkan (default)" in out


def test_cliffs_are_jumps_the_measurements_localise():
    from memtp_sim.hardware.fidelity import find_cliffs

    # gfx1151-like powers of two: x1.83 from 8 to 16 is a jump; flat 16 -> 32 is not
    dense = find_cliffs([8, 16, 32, 64], [47.27, 86.47, 89.37, 95.0])
    assert dense[["b_from", "b_to", "kind"]].values.tolist() == [[8, 16, "pass_jump"]]
    # review: a sparse hand table (x8 in B, x5.9 in time) was reported as a cliff; its rate rises
    # (512 / 5.91 > 64 / 1), so nothing says the growth was not smooth
    assert find_cliffs([64, 512], [30.0, 30.0 * 5.91]).empty
    # a falling rate is a cliff at any span: x8 in B for x9 in time
    assert find_cliffs([64, 512], [30.0, 270.0])["kind"].tolist() == ["rate_drop"]

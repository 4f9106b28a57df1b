"""One-B context pricing on Python floats (``SPSTable._context_one_s``, the engine's per-round
path) against the array formula it replaces (``SPSTable._context_s`` over a slice of B).

The float path exists only for speed, so it must give the same bits: a one-ulp difference would
move a round's end time and, through the event order, every later draw. The oracle is the
array formula evaluated at the same context; every case is compared with ``==`` on the floats,
not with a tolerance.
"""

from __future__ import annotations

import numpy as np
import pytest

from memtp_sim.hardware import list_profiles, load_profile
from memtp_sim.hardware.cost import AttentionCost, SPSTable

H200 = sorted(name for name in list_profiles() if name.startswith("h200"))


def _tables() -> list[tuple[str, SPSTable]]:
    out = []
    for name in H200:
        prof = load_profile(name)
        out += [(f"{name} verify", prof.sps), (f"{name} decode", prof.decode_table)]
    # hand-made: several measured latency slopes (np.interp between them), graph padding with an
    # eager factor above the largest captured size, and a bandwidth-only term
    b = np.array([1, 8, 64, 256, 512])
    ms = np.array([7.0, 7.4, 9.9, 21.0, 40.5])
    att = AttentionCost(a_points=((1.0, 2e-4), (4.0, 6e-4), (16.0, 1.1e-3)), b_ms_per_kv_token=3e-5,
                        c_ms_per_pair=4e-6)
    out.append(("three slopes, graphs", SPSTable(b, ms, attention=att, ref_requests=np.full(5, 4.0),
                                                  ref_l_max=np.full(5, 900.0), ref_kv=np.full(5, 3000.0),
                                                  graph_sizes=(1, 2, 4, 8, 16, 32, 64, 128), eager_factor=1.3,
                                                  dense_limit=600)))
    out.append(("bandwidth only", SPSTable(b, ms, attention=AttentionCost(b_ms_per_kv_token=5e-5))))
    return out


@pytest.mark.parametrize("label,table", _tables(), ids=[t[0] for t in _tables()])
def test_float_path_gives_the_array_formulas_bits(label: str, table: SPSTable) -> None:
    assert table.has_context_term, label
    rng = np.random.default_rng(7)
    top = table._dense.zero_ms.size - 1
    checked = 0
    for _ in range(400):
        r = int(rng.integers(1, 300))
        l_max = int(rng.integers(0, 130_000))
        kv = int(rng.integers(l_max, l_max * r + 1)) if l_max else 0
        view = table.at_context(r, l_max, kv)
        bs = rng.integers(1, top + 1, size=6)
        for b in map(int, bs):
            want = view._context_s(slice(b, b + 1), *view.context)[0]
            got = view._context_one_s(b)
            if np.isnan(want):
                assert np.isnan(got), (label, r, l_max, kv, b)
                continue
            assert type(got) is float
            assert got == want, (label, r, l_max, kv, b, got, want)
            # and the public entry point gives the same value as a range that contains B
            assert view.pass_time_s(b) == view.pass_time_range_s(max(1, b - 2), b)[-1]
            checked += 1
    assert checked > 1000


def test_float_path_is_what_a_round_uses() -> None:
    # the engine asks a round's view for one B; that answer must come from the float path (else
    # the speed-up is gone and this file tests nothing the engine runs)
    table = load_profile(H200[0]).decode_table
    view = table.at_context(64, 3000, 64 * 1500)
    calls = []
    orig = SPSTable._context_one_s
    try:
        SPSTable._context_one_s = lambda self, b: calls.append(b) or orig(self, b)
        view.pass_time_s(64)
    finally:
        SPSTable._context_one_s = orig
    assert calls == [64]

"""The compiled kernels (``memtp_sim/_kernels.pyx``, issue 13) on hand-derived cases, against
closed forms, and whole runs against the numpy engine (``memtp_sim._compiled.ENABLED = False``) to the bit;
tests/test_plain_blocks.py also compares both against the round-by-round engine.

Oracles: block lengths, clocks and KV blocks worked out by hand for two requests; the anchor and
all-prefilled checks as plain Python loops; the numpy engine for whole runs.
"""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memtp_sim import _compiled, reliability_curve, run

from _sim_helpers import REPO, assert_same_state, scenario

kernels = _compiled.kernels


def test_the_extension_is_built():
    # CI installs with pip install -e . which compiles it; a missing build would halve the speed
    # silently (the engine falls back to numpy), so the suite fails instead
    assert kernels is not None, "memtp_sim._kernels is not built: run pip install -e ."


needs_kernels = pytest.mark.skipif(kernels is None, reason="memtp_sim._kernels is not built")


def _buffers(m=16):
    return np.zeros(m + 1), np.zeros(m), np.zeros(m), np.zeros(m, dtype=np.int64)


def _plan(tokens, left, *, capacity=100, next_event=math.inf, ahead=1 << 62, max_rounds=16, context=None,
          first_s=0.010, fixed_s=0.001, bt=16):
    n = len(tokens)
    dec = np.arange(n, dtype=np.int64)
    output = np.array(left, dtype=np.int64) + 5
    generated = np.full(n, 5, dtype=np.int64)
    ctx = (True, 0.0, *context) if context else (False, first_s, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0)
    bufs = _buffers(max_rounds)
    rounds, kv_read = kernels.plain_plan(dec, np.array(tokens, dtype=np.int64), output, generated, bt, capacity, 0.0,
                                         next_event, ahead, max_rounds, fixed_s, *ctx, *bufs)
    times, durations, verify_s, blocks = bufs
    return rounds, kv_read, times[: rounds + 1], durations[:rounds], verify_s[:rounds], blocks[:rounds]


@needs_kernels
def test_a_block_runs_until_the_first_request_finishes():
    # tokens 15 and 3 (16-token blocks), 4 and 9 tokens left: 4 rounds, the first request fills
    # its first block in round 0 (16 tokens) and needs a second from round 1 (17 tokens)
    rounds, kv_read, times, durations, verify_s, blocks = _plan([15, 3], [4, 9])
    assert rounds == 4 and kv_read == 18
    assert blocks.tolist() == [2, 3, 3, 3]
    assert verify_s.tolist() == [0.010] * 4 and durations.tolist() == [0.011] * 4
    assert times.tolist() == [0.0, 0.011, 0.011 + 0.011, 0.011 + 0.011 + 0.011, 0.011 + 0.011 + 0.011 + 0.011]


@needs_kernels
def test_a_block_stops_before_the_round_the_kv_cache_cannot_hold():
    assert _plan([15, 3], [4, 9], capacity=2)[0] == 1  # round 1 needs a third block
    assert _plan([15, 3], [4, 9], capacity=1)[0] == 0  # not even this round's anchors fit


@needs_kernels
def test_a_block_ends_with_the_round_that_reaches_the_next_event():
    assert _plan([15, 3], [4, 9], next_event=0.015)[0] == 2  # round 1 ends at 0.022 > 0.015: last
    assert _plan([15, 3], [4, 9], next_event=0.011)[0] == 1  # round 0 ends exactly at the event
    assert _plan([15, 3], [4, 9], ahead=3)[0] == 3 and _plan([15, 3], [4, 9], max_rounds=2)[0] == 2


@needs_kernels
def test_each_round_is_priced_at_its_own_context():
    # zero_ms 2, factor 1, a = 0.001 ms per context token at q = 1, b = 1e-4 ms per KV token, c = 0:
    # round j reads 18 + 2j KV tokens with longest context 15 + j
    coef = (2.0, 1.0, 0.001, 1.0, 1e-4, 0.0)
    rounds, _, times, durations, verify_s, _ = _plan([15, 3], [4, 9], context=coef)
    want = [(2.0 + max(max(0.001 * (15 + j), 1e-4 * (18 + 2 * j)), 0.0 * ((18 + 2 * j) * 1.0))) * 1.0 / 1000.0
            for j in range(4)]
    assert verify_s.tolist() == want
    # by hand: the latency term 0.001 * (15 + j) ms beats the bandwidth term 1e-4 * (18 + 2j) ms
    assert verify_s.tolist() == pytest.approx([0.002015, 0.002016, 0.002017, 0.002018], rel=1e-12)
    assert durations.tolist() == [0.001 + v for v in want]
    clock = [0.0]
    for d in durations.tolist():
        clock.append(clock[-1] + d)
    assert times.tolist() == clock


@needs_kernels
def test_apply_stores_tokens_grows_blocks_and_lists_the_finished():
    dec = np.array([2, 0], dtype=np.int64)
    generated = np.array([5, 0, 7], dtype=np.int64)
    num_rounds = np.zeros(3, dtype=np.int64)
    tokens = np.array([14, 0, 30], dtype=np.int64)
    blocks = np.array([1, 0, 2], dtype=np.int64)
    output = np.array([8, 4, 9], dtype=np.int64)
    finished = np.zeros(2, dtype=np.int64)
    added, num_fin = kernels.plain_apply(dec, 3, generated, num_rounds, tokens, blocks, output, 16, finished)
    assert generated.tolist() == [8, 0, 10] and num_rounds.tolist() == [3, 0, 3]
    assert tokens.tolist() == [17, 0, 33] and blocks.tolist() == [2, 0, 3] and added == 2
    assert num_fin == 2 and finished.tolist() == [2, 0]  # in dec order


_TEMPLATE = (0.0, 0.0, 0.0005, 0.0, 2, 0, 0, 2, 0, 0, 0, 2, 1, 2, 0, 0, math.nan, math.nan, 0, 0, 0, 1.0, 0.25, 100,
             0.0, 3, 0, 0.0005, 0)


def _block(tokens, left, *, capacity=100, next_event=math.inf, checks=(8192, 0.01, 10.0), template=_TEMPLATE,
           max_rows=64, max_rounds=16):
    """plain_block on two requests' state (copies), planned and applied in one call (code 2 where its
    last round reaches the event): (codes, rounds, kv_read, added, finished, rows, state)."""
    n = len(tokens)
    dec = np.arange(n, dtype=np.int64)
    tok = np.array(tokens, dtype=np.int64)
    state = (tok, -(-tok // 16), np.array(left, dtype=np.int64) + 5, np.full(n, 5, dtype=np.int64),
             np.zeros(n, dtype=np.int64))
    price = (False, 0.010, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0)
    bufs, finished, rows = _buffers(max_rounds), np.zeros(n, dtype=np.int64), []
    args = [dec, *state, 16, capacity, int(state[1].sum()), 0.0, next_event, 1 << 62, max_rounds, max_rows, price,
            checks, rows, template, *bufs, finished]
    codes = [kernels.plain_block(*args)]
    _, rounds, kv_read, added, num_fin, absorbed = codes[-1]
    assert absorbed is None  # (no absorb: the block stops at its first completions)
    return [c[0] for c in codes], rounds, kv_read, added, finished[:num_fin].tolist(), rows, state


@needs_kernels
def test_one_block_call_plans_applies_and_logs_as_the_separate_kernels_by_hand():
    # the hand-derived block of test_a_block_runs_until_the_first_request_finishes (fixed 0.001 s:
    # draft 0.0005 + host 0.0005), applied: 4 tokens each, the first request done, one block added
    codes, rounds, kv_read, added, fin, rows, (tok, blk, out, gen, nr) = _block([15, 3], [4, 9])
    assert codes == [3] and rounds == 4 and kv_read == 18
    assert tok.tolist() == [19, 7] and blk.tolist() == [2, 1] and added == 1 and fin == [0]
    assert gen.tolist() == [9, 9] and nr.tolist() == [4, 4]
    assert [r[0] for r in rows] == [0.0, 0.011, 0.011 + 0.011, 0.011 + 0.011 + 0.011]
    assert [(r[1], r[3]) for r in rows] == [(0.0005 + 0.0005 + 0.010, 0.010)] * 4
    assert [r[14] for r in rows] == [2, 3, 3, 3] and [r[15] for r in rows] == [2, 3, 3, 3]  # after: 2 + 1
    assert [r[26] for r in rows] == [18, 20, 22, 24]
    assert all(r[:14] == (r[0], r[1], *_TEMPLATE[2:3], r[3], *_TEMPLATE[4:14]) for r in rows)
    # the last round reaches the event: applied all the same (code 2: the engine waits for its end)
    codes, rounds, *_, rows, (tok, *_) = _block([15, 3], [4, 9], next_event=0.015)
    assert codes == [2] and rounds == 2 and tok.tolist() == [17, 5] and len(rows) == 2
    # a block longer than max_rows is applied without rows (the engine logs it as columns)
    codes, rounds, *_, rows, _ = _block([15, 3], [4, 9], max_rows=3)
    assert codes == [3] and rounds == 4 and rows == []


def _absorbing_block(kind, *, next_request=0, idle=0, prefill_s=0.05, max_rows=64, refused=(False, False, False),
                     max_rounds=64, bufs=None):
    """plain_block on two requests (tokens 15 and 3, 4 and 9 tokens left, as :func:`_block`) that
    goes on past the first one's completion (``absorb``): nothing waits, 3 in remote prefill, a
    third request whose remote prefill takes ``prefill_s``; 10 ms a pass at B=2, 20 ms at B=1."""
    tok = np.array([15, 3, 0], dtype=np.int64)
    state = (tok, -(-tok // 16), np.array([9, 14, 9], dtype=np.int64), np.array([5, 5, 0], dtype=np.int64),
             np.zeros(3, dtype=np.int64))
    template = _TEMPLATE[:12] + (0,) + _TEMPLATE[13:]
    prices = [False, (False, 0.020, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1), (False, 0.010, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0)]
    finished_at, status = np.full(3, np.nan), np.array([2, 2, 0], dtype=np.int8)
    codes, ids, at = np.zeros(20, dtype=np.int8), np.zeros(20, dtype=np.int64), np.zeros(20)
    absorb = (kind, finished_at, status, codes, ids, at, next_request, 3, idle, np.full(3, prefill_s), np.array(refused),
              0.0, None)
    bufs, finished, rows = bufs or _buffers(max_rounds), np.zeros(3, dtype=np.int64), []
    out = kernels.plain_block(np.arange(2, dtype=np.int64), *state, 16, 100, 2, 0.0, math.inf, 1 << 62, max_rounds, max_rows,
                              prices[2], (8192, 0.01, 10.0), rows, template, *bufs, finished, absorb, prices)
    return out, rows, state, finished, (finished_at, status, ids, at, codes)


@needs_kernels
def test_a_plain_block_goes_on_past_a_completion_where_nothing_waits():
    # hand-derived: 4 rounds of 11 ms (0.5 + 0.5 ms + the 10 ms pass) finish request 0 (its 4
    # tokens); it is freed then (2 blocks), and request 1 goes on alone at 21 ms a round (the
    # B=1 price) for its 5 tokens left: 9 rounds in all, request 1 finished in the last and freed
    # there too (the block stops with no request left)
    (code, rounds, kv_read, added, num_fin, absorbed), rows, (tok, blk, out, gen, nr), finished, ab = \
        _absorbing_block(1)
    t, fixed = [0.0], 0.0 + 0.0005 + 0.0005
    for d in [fixed + 0.010] * 4 + [fixed + 0.020] * 5:
        t.append(t[-1] + d)
    assert (code, rounds, kv_read, num_fin) == (3, 9, 18, 0)
    assert absorbed == (2, 0, 0, 3, 0, -1) and ab[2][:2].tolist() == [0, 1] and ab[3][:2].tolist() == [t[4], t[9]]
    assert ab[4][:2].tolist() == [0, 0]  # logged as completions
    assert ab[0][:2].tolist() == [t[4], t[9]] and ab[1].tolist() == [3, 3, 0] and blk.tolist() == [0, 0, 0]
    assert tok.tolist() == [19, 12, 0] and gen.tolist() == [9, 14, 0] and nr.tolist() == [4, 9, 0]
    assert added == -2  # both freed: less the two blocks the block started with
    assert [r[0] for r in rows] == t[:9] and [r[1] for r in rows] == [fixed + 0.010] * 4 + [fixed + 0.020] * 5
    assert [r[4] for r in rows] == [2] * 4 + [1] * 5 and [r[13] for r in rows] == [2] * 4 + [1] * 5
    assert [r[28] for r in rows] == [0] * 4 + [1] * 5  # the B=1 price is extrapolated
    # KV after: request 0 freed after its last round; peak and after as they stand then
    assert [r[14] for r in rows] == [2, 3, 3, 3, 1, 1, 1, 1, 1] and [r[15] for r in rows] == [2, 3, 3, 1, 1, 1, 1, 1, 0]
    assert [r[26] for r in rows] == [18, 20, 22, 24, 7, 8, 9, 10, 11]


@needs_kernels
def test_absorb_is_refused_where_requests_wait_or_its_fields_are_not_a_completion_path_s():
    # a waiting request would be admitted after a completion: the block must stop there
    tok = np.array([15, 3, 0], dtype=np.int64)
    n3 = np.zeros(3, dtype=np.int64)

    def call(kind=1, waiting=0, next_request=0, prices=[False, None, None]):
        template = _TEMPLATE[:12] + (waiting,) + _TEMPLATE[13:]
        absorb = (kind, np.full(3, np.nan), np.zeros(3, dtype=np.int8), np.zeros(20, dtype=np.int8),
                  np.zeros(20, dtype=np.int64), np.zeros(20), next_request, 3, 0, np.zeros(3), np.zeros(3, dtype=bool), 0.0,
                  None)
        kernels.plain_block(np.arange(2, dtype=np.int64), tok.copy(), -(-tok // 16), tok + 9, n3.copy(), n3.copy(),
                            16, 100, 2, 0.0, math.inf, 1 << 62, 64, 64, (False, 0.01, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0),
                            (8192, 0.01, 10.0), [], template, *_buffers(64), n3.copy(), absorb, prices)

    call()
    with pytest.raises(ValueError, match="wait for admission"):
        call(waiting=1)
    for bad in ({"kind": 4}, {"kind": 0}, {"next_request": 4}):
        with pytest.raises(ValueError, match="not a completion path's"):
            call(**bad)
    with pytest.raises(TypeError, match="prices"):
        call(prices=None)


@needs_kernels
def test_an_absorbed_completion_s_new_remote_prefill_ends_the_block_where_its_event_falls():
    # closed-loop users going on at once to remote prefill (kind 2): request 0's user submits
    # request 2, which a free prefill GPU takes at once; its end (0.044 + 0.05) falls in the
    # third round after it (0.044 + 3 * 0.021): that round is the block's last (code 2)
    (code, rounds, _, _, num_fin, absorbed), rows, *_ = _absorbing_block(2, next_request=2, idle=1)
    assert (code, rounds, num_fin) == (2, 7, 0) and absorbed == (1, 3, 0, 4, 0, -1)
    assert [r[25] for r in rows] == [3] * 4 + [4] * 3  # one more in remote prefill after the completion
    # request 2 refused as it arrives: it completes at once, its user finds nothing left to submit
    (code, rounds, *_, absorbed), rows, *_ = _absorbing_block(2, next_request=2, idle=1, refused=(False, False, True))
    assert (code, rounds, absorbed) == (3, 9, (2, 3, 1, 3, 0, -1)) and [r[25] for r in rows] == [3] * 9
    # no GPU free: it queues, no event, the block runs on to request 1's end
    (code, rounds, *_), _, *_ = _absorbing_block(2, next_request=2, idle=0)
    assert (code, rounds) == (3, 9)
    # a block goes on for at most max_rounds rounds, the plan buffers' length, whatever max_rows
    # (a reviewer's fault: the sub-blocks after a completion ran on to max_rows, past the buffers)
    room = _buffers(64)
    bufs = (room[0][:6], room[1][:5], room[2][:5], room[3][:5])
    (code, rounds, *_), rows, *_ = _absorbing_block(1, max_rows=64, max_rounds=5, bufs=bufs)
    assert (code, rounds, len(rows)) == (3, 5, 5)
    assert not room[0][6:].any() and not room[1][5:].any() and not room[2][5:].any() and not room[3][5:].any()
    # a block longer than max_rows does not go on (the engine logs it as columns)
    (code, rounds, _, _, num_fin, absorbed), rows, *_ = _absorbing_block(1, max_rows=3)
    assert (code, rounds, num_fin, absorbed[0], rows) == (3, 4, 1, 0, [])


@needs_kernels
def test_a_plain_block_goes_on_past_a_remote_prefill_s_end_and_admits_its_request():
    # hand-derived: requests 0 and 1 run (as in _absorbing_block); request 2 (20 prompt tokens, 5
    # output) is on the one remote prefill GPU until 0.015 s, inside round 2 (0.011..0.022). The
    # block waits for that pass (a SimPy key), runs the prefill's end (first token at 0.015), admits
    # request 2 at 0.022 (2 blocks for its transferred prompt) and goes on with three requests at
    # 16 ms a round (the B=3 price): request 0 finishes after 2 more, request 2 after 2 more at B=2
    # (11 ms), request 1 after 3 more alone (21 ms): 9 rounds, every completion run here
    tok = np.array([15, 3, 0], dtype=np.int64)
    out, gen = np.array([9, 14, 5], dtype=np.int64), np.array([5, 5, 0], dtype=np.int64)
    state = (tok, -(-tok // 16), out, gen, np.zeros(3, dtype=np.int64))
    template = _TEMPLATE[:12] + (0,) + _TEMPLATE[13:25] + (1,) + _TEMPLATE[26:]
    prices = [False, (False, 0.020, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1), (False, 0.010, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0),
              (False, 0.015, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0)]
    finished_at, status = np.full(3, np.nan), np.array([2, 2, 0], dtype=np.int8)
    codes, ids, at = np.zeros(20, dtype=np.int8), np.zeros(20, dtype=np.int64), np.zeros(20)
    prompt, transferred = np.array([10, 3, 20], dtype=np.int64), np.zeros(3, dtype=bool)
    ready_at, first_at, admitted_at = np.full(3, np.nan), np.full(3, np.nan), np.full(3, np.nan)
    target, prefilled = np.zeros(3, dtype=np.int64), np.zeros(3, dtype=np.int64)
    events = (np.array([0.015]), np.array([7]), np.array([2]), 1, math.inf, 3, 0, 0, 8, np.zeros(2, dtype=np.int64),
              prompt, transferred, ready_at, first_at, admitted_at, (target, prefilled))
    absorb = (2, finished_at, status, codes, ids, at, 3, 3, 0, np.full(3, 0.05), np.zeros(3, dtype=bool), 0.0, events)
    bufs, finished, rows = _buffers(64), np.zeros(3, dtype=np.int64), []
    code, rounds, _, added, num_fin, absorbed = kernels.plain_block(
        np.arange(2, dtype=np.int64), *state, 16, 100, 2, 0.0, 0.015, 1 << 62, 64, 64, prices[2], (8192, 0.01, 10.0),
        rows, template, *bufs, finished, absorb, prices)
    t, fixed = [0.0], 0.0 + 0.0005 + 0.0005
    for d in [fixed + 0.010] * 2 + [fixed + 0.015] * 2 + [fixed + 0.010] * 2 + [fixed + 0.020] * 3:
        t.append(t[-1] + d)
    assert (code, rounds, num_fin, added) == (3, 9, 0, -2) and absorbed == (6, 3, 1, 0, 0, 0)
    assert codes[:6].tolist() == [1, 2, 3, 0, 0, 0] and ids[1:6].tolist() == [2, 2, 0, 2, 1]
    assert at[1:6].tolist() == [0.015, t[2], t[4], t[6], t[9]]
    assert (first_at[2], ready_at[2], admitted_at[2], target[2], prefilled[2], bool(transferred[2])) == \
        (0.015, 0.015, t[2], 20, 20, True)
    assert gen.tolist() == [9, 14, 5] and status.tolist() == [3, 3, 3] and finished_at.tolist() == [t[4], t[9], t[6]]
    assert [r[0] for r in rows] == t[:9]
    assert [r[13] for r in rows] == [2, 2, 3, 3, 2, 2, 1, 1, 1] and [r[25] for r in rows] == [1, 1] + [0] * 7
    assert [r[12] for r in rows] == [0] * 9  # admitted as the round after the pass starts


@needs_kernels
@pytest.mark.parametrize("bad", ["batch", "memory", "draft", "overhead_nan", "head_load"])
def test_a_round_check_that_may_fail_leaves_the_planned_block_to_the_engine(bad):
    # Engine._check_pass's conditions on the block's extremes: where one may fail, nothing is
    # applied or logged (the engine's own check then decides, and raises)
    t = list(_TEMPLATE)
    checks = {"batch": (1, 0.01, 10.0), "memory": (8192, 0.01, 0.25 + 0.01 * 3 - 1e-3)}.get(bad, (8192, 0.01, 10.0))
    t[2], t[27], t[24] = {"draft": (-1e-3, t[27], 0.0), "overhead_nan": (t[2], math.nan, 0.0),
                          "head_load": (t[2], t[27], -1.0)}.get(bad, (t[2], t[27], 0.0))
    codes, rounds, _, added, fin, rows, (tok, *_) = _block([15, 3], [4, 9], checks=checks, template=tuple(t))
    assert codes == [1] and rounds >= 1 and rows == [] and tok.tolist() == [15, 3] and added == 0 and fin == []
    # the KV limit by hand: the peak of 3 blocks at 0.01 GiB and the drafter's 0.25 GiB fit 0.28 GiB
    if bad == "memory":
        assert _block([15, 3], [4, 9], checks=(8192, 0.01, 0.28))[0] == [3]


@needs_kernels
@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 200), st.integers(1, 40)), min_size=1, max_size=12),
       st.integers(1, 60), st.floats(0.005, 0.5), st.integers(1, 20))
def test_one_block_call_is_the_separate_kernels(reqs, capacity, next_event, max_rows):
    # oracle: plain_plan, plain_apply and plain_rows called one after the other on copies
    tokens, left = [t for t, _ in reqs], [n for _, n in reqs]
    codes, rounds, kv_read, added, fin, rows, state = _block(tokens, left, capacity=capacity,
                                                             next_event=next_event, max_rows=max_rows)
    n = len(reqs)
    dec, tok = np.arange(n, dtype=np.int64), np.array(tokens, dtype=np.int64)
    blk, out, gen, nr = -(-tok // 16), np.array(left, dtype=np.int64) + 5, np.full(n, 5, dtype=np.int64), np.zeros(n, dtype=np.int64)
    bufs = _buffers(16)
    want_rounds, want_read = kernels.plain_plan(dec, tok, out, gen, 16, capacity, 0.0, next_event, 1 << 62, 16,
                                                0.0 + 0.0005 + 0.0005, False, 0.010, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, *bufs)
    assert rounds == want_rounds and kv_read == want_read
    if want_rounds < 1:
        assert codes == [0]
        return
    assert codes == ([3] if bufs[0][want_rounds] < next_event else [2])
    used = int(blk.sum())
    want_fin = np.zeros(n, dtype=np.int64)
    want_added, num_fin = kernels.plain_apply(dec, want_rounds, gen, nr, tok, blk, out, 16, want_fin)
    want_rows = []
    if want_rounds <= max_rows:
        kernels.plain_rows(want_rows, _TEMPLATE, *bufs, want_rounds, used + want_added, want_read, n)
    assert added == want_added and fin == want_fin[:num_fin].tolist()
    assert all(np.array_equal(a, b) for a, b in zip(state, (tok, blk, out, gen, nr)))
    assert rows == want_rows


@needs_kernels
@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 5000), min_size=1, max_size=80), st.integers(1, 64), st.data())
def test_anchor_blocks_counts_full_last_blocks(tokens, block_tokens, data):
    tok = np.array(tokens, dtype=np.int64)
    ids = np.array(data.draw(st.lists(st.integers(0, len(tokens) - 1), max_size=80)), dtype=np.int64)
    want = sum(1 for i in ids.tolist() if tokens[i] % block_tokens == 0)
    assert kernels.anchor_blocks(ids, tok, block_tokens) == want


@needs_kernels
@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 300), st.integers(0, 300)), min_size=1, max_size=40), st.data())
def test_all_prefilled_is_every_request_at_its_target(pairs, data):
    done = np.array([p for p, _ in pairs], dtype=np.int64)
    want = np.array([t for _, t in pairs], dtype=np.int64)
    ids = np.array(data.draw(st.lists(st.integers(0, len(pairs) - 1), max_size=40)), dtype=np.int64)
    assert kernels.all_prefilled(ids, done, want) is all(pairs[i][0] >= pairs[i][1] for i in ids.tolist())


@needs_kernels
def test_bad_arrays_raise_one_line_errors():
    tok = np.zeros(4, dtype=np.int64)
    with pytest.raises(TypeError, match="reqs: a C-contiguous 1-D int64 array is required, got float64"):
        kernels.anchor_blocks(np.zeros(2), tok, 16)
    with pytest.raises(IndexError, match=r"request id 4 outside 0\.\.3"):
        kernels.anchor_blocks(np.array([4], dtype=np.int64), tok, 16)
    with pytest.raises(TypeError, match="tokens: .*int64"):
        kernels.anchor_blocks(np.array([0], dtype=np.int64), tok[::2], 16)  # not contiguous
    dec = np.array([0], dtype=np.int64)
    times, durations, verify_s, blocks = _buffers(4)
    with pytest.raises(ValueError, match="times: 9 elements needed, got 5"):
        kernels.plain_plan(dec, tok, tok, tok, 16, 10, 0.0, 1.0, 8, 8, 0.0, False, 0.01, 0, 1, 0, 0, 0, 0,
                           times, durations, verify_s, blocks)


def test_without_the_extension_the_engine_warns_once_and_gives_the_same_answers(monkeypatch):
    scen = scenario(policy={"name": "no_spec"}, workload={"concurrency": 4, "num_requests": 16})
    with_kernels = run(scen, seed=1).state
    monkeypatch.setattr(_compiled, "kernels", None)
    monkeypatch.setattr(_compiled, "unavailable", "memtp_sim._kernels is not built (... `pip install -e .` ...)")
    monkeypatch.setattr(_compiled, "_warned", False)
    with pytest.warns(RuntimeWarning, match="memtp_sim._kernels is not built .*pip install -e .*numpy code"):
        without = run(scen, seed=1).state
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run(scen, seed=1)  # once per process
    for f in ("finished_at_s", "first_token_at_s", "generated_tokens"):
        assert np.array_equal(getattr(with_kernels, f), getattr(without, f)), f
    assert np.array_equal(with_kernels.rounds["start_s"], without.rounds["start_s"])
    assert _compiled.ENABLED  # the switch is untouched: only the module was missing


WHOLE_RUNS = {
    "dspark-64-disaggregated": ({"name": "dspark"}, {"workload": {"concurrency": 64, "num_requests": 200},
                                                     "engine": {"prefill": "disaggregated", "prefill_gpus": 4}}),
    "dspark-8-colocated": ({"name": "dspark"}, {"workload": {"concurrency": 8, "num_requests": 40}}),
    "goodput-h200-context": ({"name": "goodput"}, {"hardware": {"profile": "h200-llama31-8b-bf16"},
                                                   "workload": {"concurrency": 16, "num_requests": 60}}),
    "dspark-kv-pressure": ({"name": "dspark", "gamma": 7}, {
        "workload": {"concurrency": 12, "num_requests": 36},
        "hardware": {"table": {1: 20.0, 64: 25.0, 512: 80.0},
                     "memory": {"gpu_allocatable_gib": 3.8, "weights_bytes": 1 << 30, "kv_bytes_per_token": 131072,
                                "max_model_len": 8192}}}),
    "no_spec-kv-pressure": ({"name": "no_spec"}, {
        "workload": {"concurrency": 12, "num_requests": 36},
        "hardware": {"table": {1: 20.0, 64: 25.0, 512: 80.0},
                     "memory": {"gpu_allocatable_gib": 4.0, "weights_bytes": 1 << 30, "kv_bytes_per_token": 131072,
                                "max_model_len": 8192}}}),
    # the drafted round's confidences (_kernels.draft_confidences) on every acceptance and head kind
    "dspark-oracle-drift": ({"name": "dspark"}, {
        "workload": {"concurrency": 16, "num_requests": 48}, "confidence": {"head": "oracle"},
        "acceptance": {"drift": {"time_phases": [{"start_s": 0.0, "shift": 0.3}, {"start_s": 2.0, "shift": -0.8}],
                                 "per_1k_output_tokens": -0.4, "per_1k_context_tokens": 0.2}}}),
    "threshold-per-position-noiseless": ({"name": "threshold"}, {
        "workload": {"concurrency": 12, "num_requests": 40}, "confidence": {"noise_sd": 0.0, "sts": [1.3, 0.8, 1.1]},
        "acceptance": {"per_position": [0.8, 0.6, 0.45, 0.3], "sigma_round": 0.0}}),
    "dspark-p-min-mtp": ({"name": "dspark"}, {"workload": {"concurrency": 10, "num_requests": 40},
                                              "drafter": {"kind": "mtp", "p_min": 0.35}}),
}


@needs_kernels
@pytest.mark.parametrize("name", sorted(WHOLE_RUNS))
def test_whole_runs_match_the_numpy_engine(name, monkeypatch):
    policy, sections = WHOLE_RUNS[name]
    scen = scenario(policy=policy, **sections)
    compiled = run(scen, seed=2).state
    monkeypatch.setattr(_compiled, "ENABLED", False)
    assert_same_state(run(scen, seed=2).state, compiled)
    if name == "dspark-kv-pressure":  # the draft lookahead preempts requests: that path ran
        assert compiled.rounds["num_preempted"].sum() > 0 and compiled.rounds["verify_tokens"].sum() > 0


def _scan_both(*args, **kwargs):
    """hardware_aware_prefix_scheduler with the compiled scan and with the numpy one: each result,
    or each error's message."""
    from memtp_sim import hardware_aware_prefix_scheduler

    out = []
    try:
        for enabled in (True, False):
            _compiled.ENABLED = enabled
            try:
                r = hardware_aware_prefix_scheduler(*args, **kwargs)
                out.append((r.lengths.tolist(), r.lengths.dtype, r.theta, r.tau, r.batch_tokens,
                            repr(r.theta_global), r.batch_tokens_global))
            except Exception as e:  # noqa: BLE001 - the same error both ways is what is compared
                out.append((type(e), str(e)))
    finally:
        _compiled.ENABLED = True
    return out


# confidences from a few values, so that ties (within and across requests) and zeros are common
_CONF = st.sampled_from([0.0, 0.25, 0.5, 0.5, 0.75, 0.9, 1.0]) | st.floats(0.0, 1.0)


@needs_kernels
@settings(max_examples=300, deadline=None)
@given(st.integers(1, 9).flatmap(lambda r: st.integers(1, 7).flatmap(lambda w: st.lists(
           st.lists(_CONF, min_size=w, max_size=w), min_size=r, max_size=r))),
       st.dictionaries(st.integers(1, 80), st.floats(1.0, 500.0), min_size=2, max_size=8),
       st.booleans(), st.integers(0, 6), st.none() | st.integers(0, 90), st.sampled_from([0.0, 0.001, 0.02]),
       st.none() | st.floats(0.001, 0.1) | st.sampled_from([float("nan"), 0.0, -0.01, float("inf")]),
       st.sampled_from(["error", "roofline"]))
def test_the_compiled_scan_matches_the_numpy_scan(conf, sps, early_stop, prefill, cap, overhead_s,
                                                  no_draft_pass_s, beyond_max):
    from memtp_sim import SPSTable

    table = SPSTable.from_mapping(sps)
    if beyond_max != "error":
        from dataclasses import replace

        table = replace(table, beyond_max=beyond_max)
    compiled, numpy_scan = _scan_both(np.array(conf), table, early_stop=early_stop,
                                      prefill_tokens=prefill, max_batch_tokens=cap, overhead_s=overhead_s,
                                      no_draft_pass_s=no_draft_pass_s)
    assert compiled == numpy_scan


@needs_kernels
def test_the_compiled_scan_keeps_ties_in_request_order():
    # four equal candidates; passes of 10 ms up to B = 6, then 100 ms: two are worth it, and they
    # are the first two requests' (row-major order), both ways
    table = {1: 100.0, 4: 100.0, 6: 100.0, 7: 10.0}
    compiled, numpy_scan = _scan_both(np.full((4, 1), 0.5), table, early_stop=False, max_batch_tokens=7)
    assert compiled == numpy_scan and compiled[0] == [1, 1, 0, 0]


@needs_kernels
def test_accept_keeps_the_leading_accepted_drafts_and_a_bonus():
    # request 1: drafts 1-2 accepted, 3 rejected (u = p: accepted only when u < p, probability p),
    # verifies 3 -> 2 accepted + bonus = 3 tokens
    # request 0: all 3 would be accepted but it verifies 1 -> 1 + bonus = 2, capped by 1 token left
    dec = np.array([1, 0], dtype=np.int64)
    u = np.array([[0.1, 0.2, 0.5], [0.0, 0.0, 0.0]])
    probs = np.array([[0.5, 0.5, 0.5], [0.5, 0.5, 0.5]])
    lengths = np.array([3, 1], dtype=np.int64)
    generated, output = np.array([9, 4], dtype=np.int64), np.array([10, 40], dtype=np.int64)
    num_rounds, verified, accepted = (np.zeros(2, dtype=np.int64) for _ in range(3))
    tokens, blocks = np.array([15, 30], dtype=np.int64), np.array([1, 2], dtype=np.int64)
    acc, would, finished = np.zeros(2, dtype=np.int64), np.zeros((2, 3), dtype=bool), np.zeros(2, dtype=np.int64)
    got = kernels.accept_apply(dec, u, probs, lengths, generated, output, num_rounds, verified, accepted, tokens,
                               blocks, 16, acc, would, finished)
    assert got == (3, 4, 1, 1)  # 2 + 1 accepted, 3 + 1 emitted, request 1 needs a third block, 0 finishes
    assert acc.tolist() == [2, 1] and would.tolist() == [[True, True, False], [True, True, True]]
    assert generated.tolist() == [10, 7] and tokens.tolist() == [16, 33] and blocks.tolist() == [1, 3]
    assert verified.tolist() == [1, 3] and accepted.tolist() == [1, 2] and num_rounds.tolist() == [1, 1]
    assert finished[:1].tolist() == [0]


@needs_kernels
@settings(max_examples=200, deadline=None)
@given(st.integers(1, 12), st.integers(1, 8), st.integers(0, 2**32 - 1), st.booleans())
def test_accept_matches_a_python_loop(num, width, seed, diag):
    rng = np.random.default_rng(seed)
    n = num + 3
    dec = rng.permutation(n)[:num].astype(np.int64)
    probs = rng.choice([0.0, 0.3, 0.7, 1.0], size=(num, width))
    # draws equal to the probabilities too: a draft is accepted only when u < p
    u = np.where(rng.random((num, width)) < 0.3, rng.choice([0.0, 0.3, 0.7], size=(num, width)),
                 rng.random((num, width)))
    lengths = rng.integers(0, width + 1, num)
    output = rng.integers(1, 30, n)
    generated = np.minimum(rng.integers(0, 30, n), output - 1)
    tokens = rng.integers(0, 100, n)
    blocks = -(-tokens // 8)
    blocks0 = blocks.copy()
    counters = [np.zeros(n, dtype=np.int64) for _ in range(3)]
    want_gen, want_tok = generated.copy(), tokens.copy()
    want_acc, want_fin, emitted = [], [], 0
    for k, i in enumerate(dec.tolist()):
        run = 0
        while run < width and u[k, run] < probs[k, run]:
            run += 1
        a = min(run, int(lengths[k]))
        e = min(a + 1, int(output[i] - want_gen[i]))
        want_gen[i] += e
        want_tok[i] += e
        emitted += e
        want_acc.append(a)
        if want_gen[i] >= output[i]:
            want_fin.append(i)
    acc, finished = np.zeros(num, dtype=np.int64), np.zeros(num, dtype=np.int64)
    would = np.zeros((num, width), dtype=bool) if diag else None
    got = kernels.accept_apply(dec, u, probs, lengths, generated, output, *counters, tokens, blocks, 8, acc, would,
                               finished)
    assert got[:2] == (sum(want_acc), emitted) and got[3] == len(want_fin)
    assert acc.tolist() == want_acc and finished[: got[3]].tolist() == want_fin
    assert generated.tolist() == want_gen.tolist() and tokens.tolist() == want_tok.tolist()
    want_blocks = -(-want_tok // 8)
    assert blocks.tolist() == want_blocks.tolist() and got[2] == int(want_blocks.sum() - blocks0.sum())
    if diag:
        assert would.tolist() == np.logical_and.accumulate(u < probs, axis=1).tolist()


@needs_kernels
@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 500), min_size=1, max_size=40), st.integers(1, 32), st.integers(0, 9), st.data())
def test_lookahead_total_sums_the_new_blocks(tokens, block_tokens, add, data):
    tok = np.array(tokens, dtype=np.int64)
    blk = -(-tok // block_tokens)
    ids = np.array(data.draw(st.lists(st.integers(0, len(tokens) - 1), max_size=40, unique=True)), dtype=np.int64)
    each = np.array(data.draw(st.lists(st.integers(0, 9), min_size=ids.size, max_size=ids.size)), dtype=np.int64)
    ceil = lambda t: -(-t // block_tokens)  # noqa: E731
    assert kernels.lookahead_total(ids, tok, blk, block_tokens, add, None) == \
        sum(ceil(tokens[i] + add) - ceil(tokens[i]) for i in ids.tolist())
    assert kernels.lookahead_total(ids, tok, blk, block_tokens, add, each) == \
        sum(ceil(tokens[i] + add + e) - ceil(tokens[i]) for i, e in zip(ids.tolist(), each.tolist()))


@pytest.mark.parametrize("with_kernels", [True, False], ids=["compiled", "numpy"])
def test_fit_lookahead_trims_the_longest_drafts_until_the_peak_fits(with_kernels):
    # 4-token blocks; requests hold 3 and 4 tokens (a block each) and want 3 and 2 drafts + an anchor:
    # 2 new blocks, 1 more than the 3-block capacity allows. Trimming the first longest, one token at
    # a time: [3,2] -> [2,2] -> [1,2] -> [1,1] -> [0,1], where request 0's anchor fits its block.
    from memtp_sim.kv_cache import KVCacheManager

    if with_kernels and kernels is None:
        pytest.skip("memtp_sim._kernels is not built")
    kv = KVCacheManager(2, block_tokens=4, capacity=3)
    kv.kernels = kernels if with_kernels else None
    kv.allocate(0, 3, 3)
    kv.allocate(1, 4, 4)
    lengths = np.array([3, 2], dtype=np.int64)
    assert kv.fit_lookahead(np.array([0, 1], dtype=np.int64), lengths) == (3, 4)
    assert lengths.tolist() == [0, 1]
    roomy = np.array([3, 2], dtype=np.int64)
    kv.capacity = 4
    assert kv.fit_lookahead(np.array([0, 1], dtype=np.int64), roomy) == (4, 0) and roomy.tolist() == [3, 2]


@needs_kernels
@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 600), st.integers(0, 600)), min_size=1, max_size=20), st.integers(0, 700))
def test_place_prefill_serves_the_first_admitted_first(pairs, limit):
    done = np.array([min(a, b) for a, b in pairs], dtype=np.int64)
    want = np.array([max(a, b) for a, b in pairs], dtype=np.int64)
    pre = np.arange(len(pairs), dtype=np.int64)[::-1].copy()  # admission order: last id first
    chunks = np.zeros(len(pairs), dtype=np.int64)
    total = kernels.place_prefill(pre, done, want, limit, chunks)
    room, expect = limit, []
    for i in pre.tolist():  # hand rule: each takes what it has left, within what is still free
        take = min(room, int(want[i] - done[i]))
        expect.append(take)
        room -= take
    assert chunks.tolist() == expect and total == sum(expect)


@needs_kernels
def test_prefill_apply_emits_a_first_token_when_the_prompt_is_done():
    # request 2 finishes its prompt (first token, output 1: done); request 0 finishes its prompt
    # again after a preemption (first token kept); request 1 is mid-prompt
    pre, chunks = np.array([2, 0, 1], dtype=np.int64), np.array([8, 4, 5], dtype=np.int64)
    prefilled = np.array([6, 0, 0], dtype=np.int64)
    target = np.array([10, 20, 8], dtype=np.int64)
    tokens, generated = prefilled.copy(), np.array([3, 0, 0], dtype=np.int64)
    output = np.array([9, 9, 1], dtype=np.int64)
    first = np.array([1.5, np.nan, np.nan])
    finished = np.zeros(3, dtype=np.int64)
    got = kernels.prefill_apply(pre, chunks, prefilled, target, tokens, generated, output, first, 7.0, finished)
    assert got == (3, 2, 1) and finished[:1].tolist() == [2]
    assert prefilled.tolist() == [10, 5, 8] and tokens.tolist() == [10, 5, 8]
    assert generated.tolist() == [4, 0, 1] and first[0] == 1.5 and np.isnan(first[1]) and first[2] == 7.0


@needs_kernels
@settings(max_examples=150, deadline=None)
@given(st.sampled_from(["h200-llama31-8b-bf16", "gfx1151-llama31-8b-q4km-vulkan-amdvlk-b5863"]), st.integers(1, 256),
       st.integers(0, 40000), st.integers(0, 2_000_000), st.integers(1, 511), st.integers(0, 300))
def test_context_pass_times_match_the_numpy_formula(profile, num_requests, l_max, kv, b_first, span):
    from memtp_sim.hardware import load_profile

    table = load_profile(profile).sps
    assert table.has_context_term and table.attention.a_points[1:] == ()  # the kernel's case
    b_last = min(b_first + span, table._dense.zero_ms.size - 1)
    view = table.at_context(num_requests, l_max, kv)
    want = view._context_s(slice(b_first, b_last + 1), *view.context)  # the numpy formula
    got = view._context_slice_s(b_first, b_last)
    assert got.tobytes() == want.tobytes()


@needs_kernels
@pytest.mark.parametrize("seed", range(10))
def test_random_runs_match_the_numpy_engine(seed, monkeypatch):
    # fuzz: random policy, load, prefill placement, profile (with and without a context term),
    # token budget and KV memory (tight enough to wait, trim and preempt); the compiled and the
    # numpy engine must agree on every array of the run
    rng = np.random.default_rng(1000 + seed)
    policy = {"name": str(rng.choice(["dspark", "dspark_async", "goodput", "mtp1", "no_spec", "static",
                                      "threshold"]))}
    engine = {"prefill": str(rng.choice(["colocated", "disaggregated"])),
              "max_batch_tokens": int(rng.choice([256, 512])), "max_num_seqs": int(rng.integers(2, 64))}
    engine["prefill_chunk_tokens"] = int(rng.integers(16, engine["max_batch_tokens"] // 2))
    hardware: dict = {"profile": str(rng.choice(["h200-llama31-8b-bf16", "gfx1151-llama31-8b-q4km-vulkan"]))}
    if rng.random() < 0.4:  # a small KV budget: admission waits, lookahead preempts
        hardware = {"table": {1: 20.0, 64: 25.0, 512: 80.0},
                    "memory": {"gpu_allocatable_gib": float(rng.uniform(3.4, 5.0)), "weights_bytes": 1 << 30,
                               "kv_bytes_per_token": 131072, "max_model_len": 8192}}
    workload = ({"concurrency": int(rng.integers(1, 48)), "num_requests": int(rng.integers(20, 80))}
                if rng.random() < 0.6 else
                {"mode": "poisson", "rate_per_s": float(rng.uniform(0.5, 8.0)), "num_requests": int(rng.integers(20, 80))})
    heads = {"model": {}, "oracle": {"head": "oracle"}, "noiseless": {"noise_sd": 0.0}}
    confidence = heads[str(rng.choice(list(heads)))]
    acceptance = {"per_position": [0.85, 0.6, 0.4]} if rng.random() < 0.3 else {}
    scen = scenario(policy=policy, engine=engine, hardware=hardware, workload=workload, confidence=confidence,
                    acceptance=acceptance)
    run_seed = int(rng.integers(0, 1000))
    compiled = run(scen, seed=run_seed)
    monkeypatch.setattr(_compiled, "ENABLED", False)
    numpy_run = run(scen, seed=run_seed)
    assert_same_state(numpy_run.state, compiled.state)
    assert json.dumps(numpy_run.metrics, sort_keys=True, default=str) == \
        json.dumps(compiled.metrics, sort_keys=True, default=str)


@pytest.mark.parametrize("bad", [float("nan"), 0.0, -0.01, float("inf"), "1", True, np.True_])
def test_a_bad_no_draft_pass_time_is_refused_both_ways(bad):
    # a fault report: NaN was the compiled scan's "not given" and the numpy scan's pass time
    compiled, numpy_scan = _scan_both([[0.9, 0.8, 0.5], [0.7, 0.6, 0.2]], {1: 100.0, 4: 90.0, 8: 80.0},
                                      early_stop=False, no_draft_pass_s=bad)
    assert compiled == numpy_scan
    assert "no_draft_pass_s: must be a finite number of seconds > 0 (or None)" in compiled[1]


@pytest.mark.parametrize("bad", [True, float("nan"), -1.0])
def test_a_bad_overhead_is_refused(bad):
    # True is an int to Python: a bool is not a number of seconds (the integer fields refused it already)
    compiled, numpy_scan = _scan_both([[0.9, 0.8]], {1: 100.0, 4: 90.0}, overhead_s=bad)
    assert compiled == numpy_scan and "overhead_s: must be a finite number of seconds >= 0" in compiled[1]


@needs_kernels
def test_the_built_extension_matches_its_source(tmp_path):
    # a fault report: an extension built before a pull that changed _kernels.pyx crashed (or would
    # silently run old code); the build records the source's sha256 and an old build is refused
    from pathlib import Path

    source = Path(_compiled.__file__).with_name("_kernels.pyx")
    assert not _compiled.built_from_other_source(kernels, source)
    other = tmp_path / "_kernels.pyx"
    other.write_bytes(source.read_bytes() + b"\n# changed\n")
    assert _compiled.built_from_other_source(kernels, other)
    assert not _compiled.built_from_other_source(kernels, tmp_path / "missing.pyx")

    class OldBuild:  # a build from before the digest existed
        pass

    assert _compiled.built_from_other_source(OldBuild, source)


@pytest.mark.parametrize("bad", [(float("nan"), 10.0, 100.0), (4, float("nan"), 100.0), (4, 10.0, float("inf")),
                                 (-1, 10.0, 100.0), (4, 10.0, -5.0), (4, "x", 100.0), (4, 10.0, None)])
def test_a_context_that_is_not_a_count_is_refused(bad):
    # NaN made the compiled and the numpy context pricing disagree (their maxima treat NaN apart):
    # a round's context is counts of tokens and requests, so such a context is refused
    from memtp_sim.errors import InvalidArgumentError
    from memtp_sim.hardware import load_profile

    with pytest.raises(InvalidArgumentError, match="at_context: num_requests, l_max and kv_tokens must be finite"):
        load_profile("h200-llama31-8b-bf16").sps.at_context(*bad)


@pytest.mark.parametrize("early_stop, conf, want", [
    (True, [[0.99] * 7] * 3, "sps: the scan needs B=7, beyond the measured range 1..6; give a larger table or "
                             "max_batch_tokens"),
    (False, [[0.99] * 7] * 3, "sps: the global search needs B up to 24, beyond the measured range 1..6; give a "
                              "larger table or max_batch_tokens"),
    (False, [[0.9]] * 10, "sps: no value for B=10 (the anchor batch); measured range 1..6"),
])
def test_a_table_too_short_for_the_scan_names_the_batch_both_ways(early_stop, conf, want):
    # 3 requests x 7 drafts need B = 3 + 21 = 24; every candidate raises Theta on this table, so
    # early stop asks for B = 7 first; 10 requests have no anchor batch on a table up to B = 6
    compiled, numpy_scan = _scan_both(conf, {1: 100.0, 4: 90.0, 6: 80.0}, early_stop=early_stop)
    assert compiled == numpy_scan and compiled[1] == want


def _expit(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


@needs_kernels
def test_draft_confidences_follow_the_formula_by_hand():
    # two requests of two domains, linear kind, a round offset, a drift shift and head noise:
    # every value worked out on Python floats from the docstring's formula
    dec = np.array([2, 0], dtype=np.int64)
    domain = np.array([1, 0, 0], dtype=np.int64)
    difficulty = np.array([0.1, 0.0, -0.3])
    offset, shift = np.array([0.05, -0.2]), np.array([0.5, -0.25])
    mu, slope = np.array([1.0, -0.5]), np.array([-0.25, 0.125])
    noise = np.array([[0.1, -0.2, 0.3], [0.0, 0.4, -0.1]])
    temps = np.array([1.0, 2.0, 0.5, 9.0])  # longer than the drafted width: the first three count
    probs, raw, conf = (np.empty((2, 3)) for _ in range(3))
    kernels.draft_confidences(dec, domain, difficulty, offset, mu, slope, None, shift, noise, False, 1.5, temps,
                              probs, raw, conf)
    for k, (i, d) in enumerate(((2, 0), (0, 1))):
        for j in range(3):
            logit = (((mu[d] + difficulty[i]) + offset[k]) + slope[d] * j) + shift[k]
            assert probs[k, j] == _expit(logit)
            assert raw[k, j] == 1.5 * (logit + noise[k, j])
            assert conf[k, j] == _expit(1.5 * (logit + noise[k, j]) / temps[j])
    # per-position kind and an oracle head: the base row plus the offsets; raw is the true logit
    base = np.array([[0.9, 0.2, -0.4], [0.3, 0.1, 0.0]])
    kernels.draft_confidences(dec, domain, difficulty, None, mu, slope, base, None, noise, True, 1.5, temps,
                              probs, raw, conf)
    assert raw[0].tolist() == [0.9 - 0.3, 0.2 - 0.3, -0.4 - 0.3]  # request 2: domain 0, difficulty -0.3
    assert raw[1].tolist() == [0.3 + 0.1, 0.1 + 0.1, 0.0 + 0.1]  # request 0: domain 1, difficulty 0.1
    assert conf[0, 1] == _expit((0.2 - 0.3) / 2.0) and probs[1, 0] == _expit(0.3 + 0.1)


@needs_kernels
@settings(max_examples=150, deadline=None)
@given(st.integers(1, 9), st.integers(1, 8), st.integers(1, 4), st.booleans(), st.sampled_from([0.0, 0.3]),
       st.sampled_from([0.0, 0.4]), st.booleans(), st.floats(0.5, 3.0), st.booleans(), st.integers(0, 2**32 - 1))
def test_draft_confidences_match_the_acceptance_model_and_head(num, gamma, num_dom, per_position, sigma_round,
                                                               noise_sd, oracle, overconfidence, drift, seed):
    # the kernel against AcceptanceModel.round_logits, the drift shift, ConfidenceHead.raw_logits
    # and scipy's expit, fed the same draws: equal to the bit
    from scipy.special import expit

    from memtp_sim.acceptance import AcceptanceModel
    from memtp_sim.confidence import ConfidenceHead

    rng = np.random.default_rng(seed)
    n = num + 3
    domain = rng.integers(0, num_dom, n).astype(np.int64)
    difficulty = rng.normal(0.0, 0.5, n)
    dec = rng.permutation(n)[:num].astype(np.int64)
    acc = AcceptanceModel(domains=tuple(f"d{i}" for i in range(num_dom)), mu=rng.normal(1.0, 1.0, num_dom),
                          slope=rng.normal(-0.2, 0.1, num_dom) if not per_position else np.zeros(num_dom),
                          sigma_round=sigma_round, base=rng.normal(0.5, 1.0, (num_dom, 3)) if per_position else None)
    head = ConfidenceHead(noise_sd=noise_sd, overconfidence=overconfidence, oracle=oracle)
    temps = rng.uniform(0.3, 3.0, gamma + 2)
    shift = rng.normal(0.0, 0.3, num) if drift else None

    want_logits = acc.round_logits(np.random.default_rng(seed + 1), domain[dec], difficulty[dec], gamma)
    if shift is not None:
        want_logits = want_logits + shift[:, None]
    want_raw = head.raw_logits(np.random.default_rng(seed + 2), want_logits)
    want = (expit(want_logits), want_raw, expit(want_raw / temps[:gamma]))

    draws, head_draws = np.random.default_rng(seed + 1), np.random.default_rng(seed + 2)
    offset = draws.normal(0.0, sigma_round, size=num) if sigma_round > 0.0 else None
    noise = head_draws.normal(0.0, noise_sd, size=(num, gamma)) if not oracle and noise_sd else None
    got = tuple(np.empty((num, gamma)) for _ in range(3))
    kernels.draft_confidences(dec, domain, difficulty, offset, acc.mu, acc.slope,
                              None if acc.base is None else acc.base_logits(gamma), shift, noise, oracle,
                              overconfidence, temps, *got)
    for g, w in zip(got, want):
        assert g.tobytes() == w.tobytes()


@needs_kernels
@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 5000), min_size=1, max_size=60), st.data())
def test_round_context_sums_decoding_and_chunked_requests(tokens, data):
    # oracle: a Python loop over the requests in the pass
    n = len(tokens)
    tok = np.array(tokens, dtype=np.int64)
    ids = data.draw(st.lists(st.integers(0, n - 1), max_size=n, unique=True))
    cut = data.draw(st.integers(0, len(ids)))
    dec, pre = np.array(ids[:cut], dtype=np.int64), np.array(ids[cut:], dtype=np.int64)
    chunks = np.array(data.draw(st.lists(st.integers(0, 3), min_size=pre.size, max_size=pre.size)), dtype=np.int64)
    in_pass = [int(i) for i in dec] + [int(i) for i, c in zip(pre, chunks) if c > 0]
    want = (sum(tokens[i] for i in in_pass), max((tokens[i] for i in in_pass), default=0), len(in_pass))
    assert kernels.round_context(dec, pre, chunks, tok) == want
    assert kernels.round_context(dec, None, None, tok) == (sum(tokens[i] for i in dec), max(
        (tokens[i] for i in dec), default=0), dec.size)
    with pytest.raises(ValueError, match="chunks"):
        kernels.round_context(dec, pre, chunks[:-1] if chunks.size else np.zeros(1, dtype=np.int64), tok)


@pytest.mark.parametrize("bad", [1.5, -0.1, float("nan")])
def test_a_policy_view_with_confidences_outside_0_1_gets_the_public_error_both_ways(bad):
    # the compiled scan checks the range itself (the engine path skips numpy's reductions); the
    # error is the public function's, compiled or not
    from memtp_sim.hardware.cost import SPSTable
    from memtp_sim.policies import make_policy
    from memtp_sim.policies.base import RoundView

    conf = np.array([[0.9, 0.8], [0.7, bad]])
    view = RoundView(confidences=conf, sps=SPSTable.from_mapping({1: 100.0, 8: 90.0}), prefill_tokens=0,
                     max_batch_tokens=8, draft_overhead_s=0.001, round_index=0)
    messages = []
    try:
        for enabled in (True, False):
            _compiled.ENABLED = enabled
            with pytest.raises(ValueError) as err:
                make_policy("dspark").plan(view)
            messages.append(str(err.value))
    finally:
        _compiled.ENABLED = True
    assert messages[0] == messages[1] and messages[0].startswith("confidences: values must lie in [0, 1]")


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("bad", ["negative", "deeper", "shape"])
def test_a_policy_that_plans_lengths_outside_its_drafts_stops_the_run(bad, compiled, monkeypatch):
    # the engine's invariant on every plan (compiled: one kernel call; numpy: two reductions)
    from memtp_sim.errors import EngineInvariantError
    from memtp_sim.policies import DSparkPolicy

    def plan_round(self, confidences, *args):  # noqa: ANN001, ANN002, ANN202 - the engine's call
        num, width = confidences.shape
        lengths = {"negative": np.full(num, -1), "deeper": np.full(num, width + 1),
                   "shape": np.zeros(num + 1, dtype=np.int64)}[bad]
        return lengths, float("nan"), float("nan")

    monkeypatch.setattr(DSparkPolicy, "plan_round", plan_round)
    monkeypatch.setattr(_compiled, "ENABLED", compiled)
    with pytest.raises(EngineInvariantError, match=r"policy dspark returned lengths .* drafted positions each"):
        run(scenario(policy={"name": "dspark"}, workload={"concurrency": 4, "num_requests": 8}), seed=0)


_ON_EDGES = [0.0, 1.0, 1 / 15, 2 / 15, 0.1, 0.2, 0.3, 14 / 15, 0.5, 7 / 15]
# an ulp either side of each edge, and values typed as an edge that round off it (3 * 0.1)
_NEAR_EDGES = [float(np.nextafter(e, t)) for e in _ON_EDGES for t in (0.0, 1.0)] + [3 * 0.1, 0.1 + 0.2, 7 * (1 / 15)]
_EDGES = st.sampled_from(_ON_EDGES) | st.sampled_from([e for e in _NEAR_EDGES if 0.0 <= e <= 1.0]) | st.floats(0.0, 1.0)
_SIGNED_EDGES = _EDGES | st.just(-0.0)  # -0.0 passes the [0, 1] check and ties 0.0


def _assert_binned_like_numpy(probs, outcomes, n_bins):
    """The kernels' binning of ``probs`` equals the numpy binning (kernels off) bit for bit."""
    from memtp_sim.confidence import _binned_rows

    got = _binned_rows(probs, outcomes, n_bins)
    try:
        _compiled.ENABLED = False
        want = _binned_rows(probs, outcomes, n_bins)
    finally:
        _compiled.ENABLED = True
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.tobytes() == w.tobytes()


@needs_kernels
@settings(max_examples=200, deadline=None)
@given(st.integers(1, 4), st.integers(1, 40), st.sampled_from([1, 2, 3, 10, 15]), st.booleans(), st.data())
def test_binned_rows_match_numpy_binning_on_edges_and_between(m, n, n_bins, shared, data):
    # oracle: the numpy binning (_bin_index and np.bincount), run with the kernels switched off;
    # values on the edges i / n_bins go to the lower bin, 0 to bin 0
    probs = np.array(data.draw(st.lists(_EDGES, min_size=m * n, max_size=m * n))).reshape(m, n)
    outcomes = np.array(data.draw(st.lists(st.booleans(), min_size=n if shared else m * n,
                                           max_size=n if shared else m * n)))
    if not shared:
        outcomes = outcomes.reshape(m, n)
    _assert_binned_like_numpy(probs, outcomes, n_bins)


@needs_kernels
@settings(max_examples=150, deadline=None)
@given(st.integers(1, 60), st.integers(1, 7), st.sampled_from([1, 4, 10, 15, 64, 65]), st.sampled_from([1, 10, 15, 80]),
       st.booleans(), st.data())
def test_survival_calibration_in_one_pass_is_the_numpy_metrics(n, gamma, n_bins, curve_bins, auc, data):
    # oracle: survival_metrics and reliability_rows on np.cumprod, run with the kernels off, and
    # the public one-position functions (ECE, Brier, AUC, reliability curve) on each position;
    # confidences on the bins' edges, 0 and 1 included, and all-accepted or all-rejected positions;
    # bins the kernel keeps in the stack (<= 64) and more (numpy's path then)
    from memtp_sim import auc_score, brier_score, expected_calibration_error
    from memtp_sim.confidence import survival_calibration

    conf = np.array(data.draw(st.lists(_SIGNED_EDGES, min_size=n * gamma, max_size=n * gamma))).reshape(n, gamma)
    ok = np.logical_and.accumulate(np.array(data.draw(st.lists(st.booleans(), min_size=n * gamma,
                                                               max_size=n * gamma))).reshape(n, gamma), axis=1)
    got_m, got_c = survival_calibration(conf, ok, n_bins=n_bins, curve_bins=curve_bins, auc=auc)
    try:
        _compiled.ENABLED = False
        want_m, want_c = survival_calibration(conf, ok, n_bins=n_bins, curve_bins=curve_bins, auc=auc)
    finally:
        _compiled.ENABLED = True
    for f in ("ece", "auc", "brier"):
        assert getattr(got_m, f).tobytes() == getattr(want_m, f).tobytes(), f
    assert len(got_c) == len(want_c) == gamma
    survival = np.cumprod(conf, axis=1)
    for k, (g, w) in enumerate(zip(got_c, want_c)):
        for got_a, want_a, one in zip(g, w, reliability_curve(survival[:, k], ok[:, k], n_bins=curve_bins)):
            assert np.asarray(got_a).tobytes() == np.asarray(want_a).tobytes() == np.asarray(one).tobytes()
        assert got_m.ece[k] == pytest.approx(expected_calibration_error(survival[:, k], ok[:, k], n_bins=n_bins),
                                             abs=1e-12)
        assert got_m.brier[k] == pytest.approx(brier_score(survival[:, k], ok[:, k]), abs=1e-12)
        if auc and 0 < ok[:, k].sum() < n:
            assert got_m.auc[k] == pytest.approx(auc_score(survival[:, k], ok[:, k]), abs=1e-12)
        else:
            assert np.isnan(got_m.auc[k])


@needs_kernels
@pytest.mark.parametrize("n_bins", [*range(1, 65), 100, 999, 4096])
def test_binned_rows_match_numpy_binning_around_every_edge(n_bins):
    # oracle: the numpy binning (_bin_index's exact comparisons against the edges), kernels off.
    # Every edge i / n_bins, the ulps around it and values a little further off, where the
    # kernel's fast path (v * n more than 1e-6 from a whole number) hands over to the comparisons
    edges = np.arange(n_bins + 1) / n_bins
    near = [edges, np.nextafter(edges, 0.0), np.nextafter(edges, 1.0),
            np.nextafter(np.nextafter(edges, 0.0), 0.0), np.nextafter(np.nextafter(edges, 1.0), 1.0)]
    near += [(np.arange(n_bins + 1) + d) / n_bins for d in (-3e-6, -1e-6, -5e-7, 5e-7, 1e-6, 3e-6)]
    probs = np.clip(np.concatenate(near), 0.0, 1.0)[:, None]  # a row each: every value's own bin compared
    outcomes = (np.arange(probs.size) % 3 == 0)[:, None]
    _assert_binned_like_numpy(probs, outcomes, n_bins)


@needs_kernels
def test_binned_rows_put_each_value_in_its_bin_by_hand():
    counts, sum_prob, sum_pos = (np.empty((1, 4), dtype=np.int64), np.empty((1, 4)), np.empty((1, 4)))
    probs = np.array([[0.0, 0.25, 0.2500001, 0.5, 0.75, 1.0, 0.9]])
    kernels.binned_rows(probs, np.array([True, False, True, True, False, True, True]), 4, counts, sum_prob, sum_pos)
    # bins (0, .25], (.25, .5], (.5, .75], (.75, 1]; 0 -> bin 0
    assert counts.tolist() == [[2, 2, 1, 2]]
    assert sum_prob.tolist() == [[0.0 + 0.25, 0.2500001 + 0.5, 0.75, 1.0 + 0.9]]
    assert sum_pos.tolist() == [[1.0, 2.0, 0.0, 2.0]]
    with pytest.raises(ValueError, match=r"probs: values must lie in \[0, 1\]"):
        kernels.binned_rows(np.array([[0.5, float("nan")]]), np.array([True, False]), 4, counts[:, :4],
                            sum_prob, sum_pos)


@needs_kernels
@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2**32 - 1), st.booleans(), st.sampled_from([None, 0.004, 0.02]))
def test_dspark_plan_round_equals_plan_on_its_view(seed, early_stop, no_draft_pass_s):
    # the engine's view-free call against plan(RoundView): the same lengths, rates and fallback
    # gate over a run of rounds (the gate learns from each), compiled and not
    from memtp_sim.hardware import SPSTable
    from memtp_sim.policies import RoundView, make_policy

    rng = np.random.default_rng(seed)
    table = SPSTable.from_mapping({1: 120.0, 16: 110.0, 64: 90.0, 256: 45.0, 512: 25.0})
    fast, slow = (make_policy("dspark", {"early_stop": early_stop, "probe_every": 2}) for _ in range(2))
    for round_index in range(12):
        num, width = int(rng.integers(1, 20)), int(rng.integers(1, 8))
        conf = np.round(rng.uniform(0.0, 1.0, (num, width)), 1)  # ties and zeros
        prefill = int(rng.integers(0, 40))
        draft_s = float(rng.choice([0.0, 0.002, 0.05]))
        got = fast.plan_round(conf, table, prefill, 512, draft_s, round_index, no_draft_pass_s)
        want = slow.plan(RoundView(confidences=conf, sps=table, prefill_tokens=prefill, max_batch_tokens=512,
                                   draft_overhead_s=draft_s, round_index=round_index, no_draft_pass_s=no_draft_pass_s))
        assert np.asarray(got[0]).tolist() == np.asarray(want.lengths).tolist()
        assert repr(got[1:]) == repr((want.theta, want.theta_global))
        assert fast._gate.__dict__ == slow._gate.__dict__


def test_a_dspark_subclass_with_its_own_plan_is_asked_through_plan():
    from memtp_sim.hardware import SPSTable
    from memtp_sim.policies import DSparkPolicy, RoundPlan

    class Mine(DSparkPolicy):
        def plan(self, view):  # noqa: ANN001, ANN202
            return RoundPlan(np.zeros(view.num_requests, dtype=np.int64), theta=1.0, theta_global=2.0)

    lengths, theta, theta_global = Mine(DSparkPolicy.Params()).plan_round(
        np.full((2, 3), 0.9), SPSTable.from_mapping({1: 100.0, 64: 90.0}), 0, 64, 0.001, 0, None)
    assert lengths.tolist() == [0, 0] and (theta, theta_global) == (1.0, 2.0)


@needs_kernels
@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 50), st.integers(0, 200)), min_size=1, max_size=40),
       st.integers(1, 16), st.data())
def test_split_decoding_keeps_running_order_and_counts_anchor_blocks(reqs, block_tokens, data):
    # oracle: a Python loop over the running requests
    prefilled, target, tokens = (np.array(col, dtype=np.int64) for col in zip(*reqs))
    run_ids = np.array(data.draw(st.lists(st.integers(0, len(reqs) - 1), max_size=len(reqs), unique=True)),
                       dtype=np.int64)
    dec, pre = np.empty(run_ids.size, dtype=np.int64), np.empty(run_ids.size, dtype=np.int64)
    num_dec, anchors = kernels.split_decoding(run_ids, prefilled, target, tokens, block_tokens, dec, pre)
    want_dec = [int(i) for i in run_ids if prefilled[i] >= target[i]]
    assert dec[:num_dec].tolist() == want_dec
    assert pre[:run_ids.size - num_dec].tolist() == [int(i) for i in run_ids if prefilled[i] < target[i]]
    assert anchors == sum(1 for i in want_dec if tokens[i] % block_tokens == 0)


_LOG_VALUE = (st.integers(-100, 100) | st.floats(-1e6, 1e6, allow_nan=False) | st.sampled_from([0.0, -0.0, 1.5, 99.99])
              | st.just(float("nan")) | st.integers(-2**70, 2**70)  # beyond 2**53 and 2**63: rounded as numpy
              | st.sampled_from([2**53 + 1, 2**62 + 1, 2**63, -2**63, -2**63 - 1, 2**64 + 1]))


@needs_kernels
@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**31 - 1), st.integers(-128, 127), _LOG_VALUE,
                          st.integers(0, 10**6).map(np.int64), st.floats(0.0, 100.0).map(np.float64)), max_size=30))
def test_pack_rows_writes_what_numpy_converts(rows):
    # oracle: np.array(column, dtype) per column, the numpy flush
    dtypes = (np.int32, np.int8, np.float64, np.int32, np.float64)
    cols = [np.empty(len(rows), dtype=d) for d in dtypes]
    kernels.pack_rows(rows, cols)
    for j, (col, dtype) in enumerate(zip(cols, dtypes)):
        want = np.array([r[j] for r in rows], dtype=dtype)
        assert col.tobytes() == want.tobytes()


@needs_kernels
def test_pack_rows_refuses_what_an_integer_column_cannot_hold():
    cols = [np.empty(1, dtype=np.int32), np.empty(1, dtype=np.int8)]
    for bad in ((float("nan"), 1), (2**31, 1), (1, 128), (1, float("inf")), (2**70, 1), (1, -2**64)):
        with pytest.raises(ValueError, match="does not fit an integer column"):
            kernels.pack_rows([bad], cols)
    with pytest.raises(TypeError, match="a tuple of 2 numbers"):
        kernels.pack_rows([(1, 2, 3)], cols)
    with pytest.raises(TypeError, match="float64, int32 or int8"):
        kernels.pack_rows([(1, 2)], [np.empty(1, dtype=np.int64), cols[1]])


@needs_kernels
@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(-2**63, 2**63 - 1), max_size=80))
def test_ids_array_is_fromiter(ids):
    got = kernels.ids_array(ids)
    assert got.dtype == np.int64 and got.tobytes() == np.fromiter(ids, dtype=np.int64, count=len(ids)).tobytes()
    with pytest.raises(OverflowError):
        kernels.ids_array(ids + [2**63])


@needs_kernels
@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0.0, 0.1, 0.25, 0.5, 1.0]) | st.floats(0.0, 1.0), st.booleans()),
                min_size=1, max_size=60))
def test_positive_rank_sum_is_the_tie_averaged_rank_sum(pairs):
    # oracle: scipy.stats.rankdata's average ranks, summed over the positives
    from scipy.stats import rankdata

    scores = np.array([p[0] for p in pairs])
    labels = np.array([p[1] for p in pairs])
    order = np.argsort(scores)
    got = kernels.positive_rank_sum(scores[order], labels[order])
    assert got == float(rankdata(scores)[labels].sum())


@needs_kernels
def test_positive_rank_sums_by_hand():
    # scores 0.2 (positive), 0.2 (negative), 0.5 (positive): ranks 1.5, 1.5 and 3, so the
    # positives sum to 4.5; a second row with no positive sums to 0
    def key(score, positive):
        return (int(np.float64(score).view(np.uint64)) << 1) | int(positive)

    keys = np.array(sorted([key(0.2, True), key(0.2, False), key(0.5, True)])
                    + [key(0.1, False), key(0.1, False), key(0.9, False)], dtype=np.uint64).reshape(2, 3)
    rank_sums, num_pos = np.empty(2), np.empty(2, dtype=np.int64)
    kernels.positive_rank_sums(keys, rank_sums, num_pos)
    assert rank_sums.tolist() == [4.5, 0.0] and num_pos.tolist() == [2, 0]


@needs_kernels
@settings(max_examples=200, deadline=None)
@given(st.integers(1, 60), st.integers(1, 7), st.data())
def test_survival_bins_keys_and_squared_errors(n, gamma, data):
    # oracles: np.cumprod for the survivals the keys carry; the outcomes in the low bit; the
    # squared errors added in row order; scipy.stats.rankdata's average ranks (-0.0 ties 0.0)
    # summed over each position's positives, after np.sort of the keys
    from scipy.stats import rankdata

    conf = np.array(data.draw(st.lists(_SIGNED_EDGES, min_size=n * gamma, max_size=n * gamma))).reshape(n, gamma)
    ok = np.array(data.draw(st.lists(st.booleans(), min_size=n * gamma, max_size=n * gamma))).reshape(n, gamma)
    keys, sq = np.empty((gamma, n), dtype=np.uint64), np.empty(gamma)
    sums = [np.empty((gamma, 3), dtype=np.int64), np.empty((gamma, 3)), np.empty((gamma, 3))]
    kernels.survival_bins(conf, ok, keys, sq, 3, *sums, 3, *[a.copy() for a in sums])
    survival = np.cumprod(conf, axis=1) + 0.0  # + 0.0: -0.0 as 0.0
    assert (keys >> np.uint64(1)).tobytes() == survival.T.copy().view(np.uint64).tobytes()
    assert ((keys & np.uint64(1)) == 1).tolist() == ok.T.tolist()
    want_sq = np.zeros(gamma)
    for i in range(n):
        want_sq = want_sq + (survival[i] - ok[i]) ** 2
    assert sq.tobytes() == want_sq.tobytes()
    keys.sort(axis=1)
    rank_sums, num_pos = np.empty(gamma), np.empty(gamma, dtype=np.int64)
    kernels.positive_rank_sums(keys, rank_sums, num_pos)
    for k in range(gamma):
        assert num_pos[k] == ok[:, k].sum()
        assert rank_sums[k] == float(rankdata(survival[:, k])[ok[:, k]].sum())


@needs_kernels
@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True, width=64), min_size=0, max_size=40),
       st.sampled_from(["1d", "2d", "strided"]))
def test_expit_is_scipys_to_the_bit(values, layout):
    # oracle: scipy.special.expit itself, on every float (huge, tiny, inf, NaN) and any layout
    from scipy.special import expit as scipy_expit

    x = np.array(values, dtype=np.float64)
    if layout == "2d" and len(x) % 2 == 0:
        x = x.reshape(2, -1)
    elif layout == "strided":
        x = x[::2]
    got = kernels.expit(x)
    want = scipy_expit(x)
    assert got.shape == want.shape and got.dtype == np.float64
    assert got.tobytes() == np.ascontiguousarray(want).tobytes()


@pytest.mark.parametrize("x", [np.array(0.3), np.array([0.3, -2.0]), np.array([[1.0], [2.0]]), 0.3, [0.3, 1.0],
                               np.array([1, 2]), np.float32(0.5)])
def test_lazy_expit_returns_what_scipy_returns(x):
    # the kernel takes float64 arrays of one dimension or more; everything else stays scipy's,
    # type and shape included (a 0-d array gives a scalar there)
    from scipy.special import expit as scipy_expit

    from memtp_sim._lazy import expit

    got, want = expit(x), scipy_expit(x)
    assert type(got) is type(want) and np.shape(got) == np.shape(want) and got.dtype == want.dtype
    assert np.asarray(got).tobytes() == np.asarray(want).tobytes()


@needs_kernels
def test_expit_by_hand_and_refuses_other_types():
    got = kernels.expit(np.array([0.0, math.log(3.0), -math.inf, math.inf]))
    assert got.tolist() == [0.5, pytest.approx(0.75, rel=1e-15), 0.0, 1.0]
    with pytest.raises(TypeError, match="float64"):
        kernels.expit(np.array([1, 2]))


@needs_kernels
def test_a_run_imports_no_scipy_special():
    """A what-if point from a cold process never imports ``scipy.special`` (about 0.2 s of the
    cold-start target of issue 13): every expit of a run goes to the kernel."""
    import subprocess
    import sys

    code = ("import sys\nfrom memtp_sim import run\nfrom memtp_sim.config import load_study\n"
            "s = load_study('studies/load.yaml')\n"
            "sc, seed = next((sc, sd) for lab, sc, sd in s.expand(source='studies/load.yaml') "
            "if lab.get('workload.concurrency') == 8 and sc.policy.name == 'dspark')\nrun(sc, seed=seed)\n"
            "print(sorted(m for m in sys.modules if m.startswith('scipy.special')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"


def _kernel_signatures() -> list[tuple[str, list[str], str]]:
    """(name, its ndarray parameters, its body) of every public kernel, read from the source."""
    import re

    src = (REPO / "memtp_sim" / "_kernels.pyx").read_text()
    defs = list(re.finditer(r"^def (\w+)\(((?:[^()]|\n)*?)\):", src, flags=re.M))
    out = []
    for k, m in enumerate(defs):
        body = src[m.end(): defs[k + 1].start() if k + 1 < len(defs) else len(src)]
        params = re.findall(r"cnp\.ndarray (\w+)( not None)?", m.group(2))
        out.append((m.group(1), params, body))
    return out


def test_every_kernel_checks_an_array_before_it_reads_its_shape():
    # the kind of a review's fault (three kernels read an argument's first dimension before its
    # checks, and a 0-d array crashed the interpreter): every ndarray parameter is declared
    # `not None` (Cython lets None through otherwise), and a dimension is read only after a
    # check that fixes the number of dimensions
    checks = ("_i64({p}", "_f64({p}", "_check_1d({p}", "_data_2d({p}", "_f64_2d({p}", "PyArray_NDIM({p})")
    sigs = _kernel_signatures()
    if kernels is not None:  # the parse found every public kernel
        public = {n for n in dir(kernels) if not n.startswith("_") and callable(getattr(kernels, n))}
        assert {name for name, _, _ in sigs} == public
    for name, params, body in sigs:
        body = body.replace("_w(", "")  # _i64(_w(a, ...), ...): the writeable check, then _i64's
        for p, not_none in params:
            assert not_none, f"{name}: ndarray parameter {p!r} must be declared `not None`"
            first_dim = body.find(f"PyArray_DIM({p},")
            if first_dim < 0:
                continue
            checked = [body.find(c.format(p=p)) for c in checks]
            assert any(0 <= at < first_dim for at in checked), f"{name}: reads {p}'s shape before checking it"


_I1, _F1 = "np.zeros(1, np.int64)", "np.zeros(1)"
_PRICE = "(False, np.ones(9), None, None, 0.0, 0.0, 0.0, 1, 8, 1, False)"
_ZERO_D_CALLS = {
    "plain_rows": "K.plain_rows([], (0,) * 29, {a}, np.zeros(2), np.zeros(2), np.zeros(2, np.int64), 1, 0, 0, 1)",
    # the bad array as `generated` (its size sizes the others), then as the diagnostics' rows
    "drafted_block": (f"K.drafted_block({_I1}, {_I1}, {_I1}, {_I1}, {_F1}, {{i}}, {_I1}, {_I1}, {_I1}, {_I1}, {_I1}, "
                      f"{_I1}, {_F1}, {_F1}, {_F1}, None, 0.0, True, 0.0, 1.0, np.ones(2), np.random.default_rng(), "
                      f"np.random.default_rng(), {_PRICE}, {_PRICE}, False, np.zeros(2), 2, 8, 8, 16, 8, 0, 0.0, 1.0, "
                      f"0.0, False, 0, 0, 0.0, 0, np.zeros((4, 2), np.int64), 0, 0.0, 0.0, 1.0, (True, 0.1, 0.0, -1, 0, 16, 0.0), (0.1, 1.0, 0, False), 0, 4, [], (0, 1, 0), "
                      f"{_I1}, {_I1}, np.empty((1, 2)), np.empty((1, 2)), np.empty((1, 2)), {_I1}, None, None, None, {_I1}, "
                      f"{_I1}, np.zeros(2))"),
    "drafted_block_diag": (f"K.drafted_block({_I1}, {_I1}, {_I1}, {_I1}, {_F1}, {_I1}, {_I1}, {_I1}, {_I1}, {_I1}, "
                           f"{_I1}, {_I1}, {_F1}, {_F1}, {_F1}, None, 0.0, True, 0.0, 1.0, np.ones(2), "
                           f"np.random.default_rng(), np.random.default_rng(), {_PRICE}, {_PRICE}, False, np.zeros(2), "
                           f"2, 8, 8, 16, 8, 0, 0.0, 1.0, 0.0, False, 0, 0, 0.0, 0, np.zeros((4, 2), np.int64), 0, 0.0, 0.0, 1.0, "
                           f"(True, 0.1, 0.0, -1, 0, 16, 0.0), "
                           f"(0.1, 1.0, 0, False), 0, 4, [], (0, 1, 0), {_I1}, {_I1}, np.empty((1, 2)), "
                           f"np.empty((1, 2)), np.empty((1, 2)), {_I1}, {{a}}, np.empty((1, 2)), "
                           f"np.empty((1, 2), bool), {_I1}, {_I1}, np.zeros(2))"),
    "plain_block": (f"K.plain_block({_I1}, {{i}}, {_I1}, {_I1}, {_I1}, {_I1}, 16, 8, 0, 0.0, 1.0, 1, 4, 64, "
                    f"(False, 0.01, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0), (8, 0.0, 1.0), [], (0.0,) * 29, np.zeros(5), "
                    f"np.zeros(4), np.zeros(4), np.zeros(4, np.int64), {_I1})"),
    "positive_rank_sum": "K.positive_rank_sum({a}, np.array([True]))",
    "split_decoding": "K.split_decoding(np.zeros(2, np.int64), {i}, np.zeros(3, np.int64), np.zeros(3, np.int64), "
                      "16, np.zeros(2, np.int64), np.zeros(2, np.int64))",
    "draft_confidences": "K.draft_confidences(np.zeros(1, np.int64), {i}, np.zeros(1), None, np.zeros(1), np.zeros(1), "
                         "None, None, None, True, 1.0, np.ones(2), np.empty((1, 2)), np.empty((1, 2)), "
                         "np.empty((1, 2)))",
    "context_pass_times": "K.context_pass_times({a}, np.zeros(3), np.ones(3), 1, 2, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0)",
    "sum_within": "K.sum_within({i}, 3)",
    "binned_rows": "K.binned_rows({a}, np.zeros(3, bool), 2, np.zeros((1, 2), np.int64), np.zeros((1, 2)), "
                   "np.zeros((1, 2)))",
    "survival_bins": "K.survival_bins({a}, np.zeros((1, 1), bool), np.zeros((1, 1), np.uint64), np.zeros(1), 2, "
                     "np.zeros((1, 2), np.int64), np.zeros((1, 2)), np.zeros((1, 2)), 2, np.zeros((1, 2), np.int64), "
                     "np.zeros((1, 2)), np.zeros((1, 2)))",
    "positive_rank_sums": "K.positive_rank_sums(np.zeros((1, 1), np.uint64), {a}, np.zeros(1, np.int64))",
    # the bad array as `prompt` (its size sizes the others)
    "admit": "K.admit(__import__('collections').deque([0]), [], 1, 0.0, {i}, np.zeros(1, np.int64), "
             "np.zeros(1, bool), np.zeros(1, np.int8), np.zeros(1), np.zeros(1, np.int64), np.zeros(1, np.int64), "
             "np.zeros(1, np.int64), np.zeros(1, np.int64), 16, 0, 10, 0)",
    "finish": "K.finish([0], 1.0, {a}, np.zeros(1, np.int8), np.zeros(1, np.int64))",
}


@needs_kernels
@pytest.mark.parametrize("name", sorted(_ZERO_D_CALLS))
@pytest.mark.parametrize("bad", ["zero_d", "none", "strided"])
def test_a_bad_array_gets_a_type_error_not_a_crash(name, bad):
    # in a subprocess, so that a crash is a failure of this test and not of the whole run
    import subprocess
    import sys

    arg = {"zero_d": ("np.array(1.0)", "np.array(5)"), "none": ("None", "None"),
           "strided": ("np.zeros(6)[::2]", "np.zeros(6, np.int64)[::2]")}[bad]
    call = _ZERO_D_CALLS[name].format(a=arg[0], i=arg[1])
    code = ("import numpy as np\nfrom memtp_sim import _kernels as K\ntry:\n    " + call
            + "\nexcept (TypeError, ValueError) as e:\n    print('refused:', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"{name} with a {bad} array: exit code {out.returncode}: {out.stderr[-300:]}"
    if name == "drafted_block_diag" and bad == "none":  # None is the kernel's "no diagnostics": it runs
        assert out.stdout == "" and out.stderr == ""
        return
    assert out.stdout.startswith("refused:"), out.stdout
    # refused for the bad array, not for a call the kernel's signature no longer takes (review: the
    # table went stale when drafted_block gained arguments, and the refusal still passed)
    assert "positional argument" not in out.stdout and "keyword argument" not in out.stdout, out.stdout
    if bad == "strided":
        assert "not C-contiguous" in out.stdout


@needs_kernels
@pytest.mark.parametrize("case", ["strided_mu", "one_temperature", "strided_temperatures"])
def test_inputs_numpy_takes_as_views_or_broadcasts_run_the_same_compiled(case, monkeypatch):
    # review: an acceptance model built from a column of a table kept strided mu/slope views, and
    # an engine given one temperature broadcast it; the compiled round refused both (TypeError,
    # ValueError) where the numpy code ran. Both are normalised where they are kept now.
    from _sim_helpers import flat_profile, workload

    from memtp_sim.acceptance import AcceptanceModel
    from memtp_sim.confidence import ConfidenceHead
    from memtp_sim.engine import Engine, EngineSettings
    from memtp_sim.policies import make_policy

    params = np.array([[1.2, -0.1], [0.4, -0.2], [2.0, 0.0]])
    acc = AcceptanceModel(("chat", "code", "math"), params[:, 0], params[:, 1], 0.3, 0.2) \
        if case == "strided_mu" else AcceptanceModel.fixed(0.7)
    temps = {"strided_mu": None, "one_temperature": np.array([1.3]),
             "strided_temperatures": np.full(40, 1.3)[::2]}[case]

    def go(enabled: bool):
        monkeypatch.setattr(_compiled, "ENABLED", enabled)
        eng = Engine(flat_profile(), acc, workload([40] * 6, [30] * 6), make_policy("dspark", {}),
                     EngineSettings(max_batch_tokens=64, prefill_chunk_tokens=32, kv_watermark_frac=0.0),
                     np.random.default_rng(0), head=ConfidenceHead(0.4, 1.35), temperatures=temps,
                     head_rng=np.random.default_rng(3))
        return eng.run()

    want = go(False)
    assert want.draft_tokens_verified.sum() > 0
    assert_same_state(go(True), want)


def test_every_list_or_tuple_parameter_refuses_none_and_every_tuple_read_by_position_is_sized():
    # the kind of a review's fault (drafted_block read gate[5], coherence[3], row_consts[2] unchecked:
    # the module reads without bounds checks, and a short tuple crashed the interpreter): typed
    # list/tuple parameters are `not None` (Cython lets None through otherwise: PyList_GET_SIZE(None)
    # reads garbage), and a tuple parameter indexed by position has its size checked first
    import re

    for name, _, body in _kernel_signatures():
        src = (REPO / "memtp_sim" / "_kernels.pyx").read_text()
        sig = re.search(rf"^def {name}\(((?:[^()]|\n)*?)\):", src, flags=re.M).group(1)
        for kind, p, not_none in re.findall(r"\b(list|tuple) (\w+)( not None)?", sig):
            assert not_none, f"{name}: {kind} parameter {p!r} must be declared `not None`"
            if kind == "tuple" and re.search(rf"\b{p}\[\d", body):
                sized = [f"_check_fields({p},", f"_read_pricer({p},", f"PyTuple_GET_SIZE({p})"]
                first = re.search(rf"\b{p}\[\d", body).start()
                assert any(0 <= body.find(c) < first for c in sized), f"{name}: reads {p}[...] before sizing it"


def _positional_names() -> dict[str, list[str]]:
    """Every public kernel's parameter names in order, read from the source."""
    import re

    src = (REPO / "memtp_sim" / "_kernels.pyx").read_text()
    out = {}
    for m in re.finditer(r"^def (\w+)\(((?:[^()]|\n)*?)\):", src, flags=re.M):
        parts = [p.split("=")[0].replace("not None", "").split() for p in m.group(2).split(",") if p.strip()]
        out[m.group(1)] = [p[-1] for p in parts]
    return out


@needs_kernels
def test_no_kernel_writes_into_an_array_it_was_given_read_only(monkeypatch):
    # the kind of a review's fault (plain_block, and the older kernels, wrote into a read-only
    # tokens array, where numpy's assignment raises): whole runs with every array any kernel gets
    # handed to it read-only. A kernel must refuse an array it writes ("NAME: the kernel writes
    # into this array, and it is read-only"), before any work; the wrapper then hands that one
    # over writeable and calls again. Every array still read-only must come back unchanged, and
    # the runs must equal runs without the wrapper.
    import re

    from memtp_sim.engine import Engine

    names = _positional_names()
    seen: dict[str, set[str]] = {}

    def strict(name, fn):  # noqa: ANN001, ANN202
        def call(*args):  # noqa: ANN002, ANN202
            args = list(args)
            params = names[name]
            ro = {}  # (argument, item of a list argument or None) -> (the view, the array, its bytes)

            def read_only(a, key):  # noqa: ANN001, ANN202
                view = a.view()
                view.flags.writeable = False
                ro[key] = (view, a, a.tobytes())
                return view

            for k, a in enumerate(args):
                if isinstance(a, np.ndarray):
                    args[k] = read_only(a, (k, None))
                elif isinstance(a, list) and a and all(isinstance(x, np.ndarray) for x in a):
                    args[k] = [read_only(x, (k, j)) for j, x in enumerate(a)]  # pack_rows' columns
            while True:
                try:
                    out = fn(*args)
                    break
                except ValueError as e:
                    m = re.match(r"(\w+)(?:\[(\d+)\])?: the kernel writes into this array, and it is read-only",
                                 str(e))
                    if m is None:
                        raise
                    key = (params.index(m.group(1)), None if m.group(2) is None else int(m.group(2)))
                    assert key in ro, f"{name} refused {m.group(0)} twice"
                    base = ro.pop(key)[1]
                    if key[1] is None:
                        args[key[0]] = base
                    else:
                        args[key[0]][key[1]] = base
                    seen.setdefault(name, set()).add(m.group(1))
            for (k, _), (_, base, before) in ro.items():
                assert base.tobytes() == before, f"{name} wrote into read-only {params[k]}"
            return out
        return call

    scenarios = [
        scenario(policy={"name": p}, workload={"concurrency": c, "num_requests": 40},
                 engine={"prefill": pre, "prefill_gpus": 2})
        for p, c, pre in (("dspark", 8, "disaggregated"), ("no_spec", 6, "colocated"), ("static", 4, "colocated"),
                          ("mtp1", 4, "disaggregated"))
    ] + [scenario(policy={"name": "dspark"}, hardware={"profile": "h200-llama31-8b-bf16"},
                  workload={"concurrency": 6, "num_requests": 30}, engine={"prefill": "colocated"})]
    for blocks in (True, False):  # drafted blocks, and the round path's kernels
        monkeypatch.setattr(Engine, "DRAFT_BLOCKS", blocks)
        want = [run(sc, seed=1).state for sc in scenarios]
        with monkeypatch.context() as mp:
            for name in names:
                mp.setattr(kernels, name, strict(name, getattr(kernels, name)))
            got = [run(sc, seed=1).state for sc in scenarios]
        for g, w in zip(got, want):
            assert_same_state(g, w)
    # the runs reached the kernels that write into arrays
    for name in ("split_decoding", "plain_block", "prefix_scan", "draft_confidences", "accept_apply",
                 "place_prefill", "prefill_apply", "survival_bins", "positive_rank_sums", "pack_rows", "drafted_block",
                 "admit", "finish"):
        assert name in seen, f"no run reached {name}"


@needs_kernels
def test_survival_bins_takes_the_bins_it_keeps_in_the_stack_and_refuses_more():
    # the kernel keeps each position's bins in stack arrays: more than MAX_BINS is refused (the
    # public survival_calibration then runs numpy: test_survival_calibration_in_one_pass...)
    conf, ok = np.full((2, 1), 0.5), np.array([[True], [False]])
    for bins, fine in ((kernels.MAX_BINS, True), (kernels.MAX_BINS + 1, False), (0, False)):
        sums = [np.empty((1, bins), dtype=np.int64), np.empty((1, bins)), np.empty((1, bins))]
        args = (conf, ok, None, np.empty(1), bins, *sums, 3, np.empty((1, 3), dtype=np.int64), np.empty((1, 3)),
                np.empty((1, 3)))
        if fine:
            kernels.survival_bins(*args)
            assert sums[0].sum() == 2 and sums[2].sum() == 1.0
        else:
            with pytest.raises(ValueError, match=f"n_bins: must be in 1..{kernels.MAX_BINS}"):
                kernels.survival_bins(*args)


@needs_kernels
def test_survival_bins_refuses_a_confidence_outside_0_1_wherever_it_stands():
    # the range is checked in the binning pass itself: a value below 0, above 1 or NaN, at any
    # row and position, must raise and never index outside the bins (a subprocess: a crash fails
    # this test, not the run)
    import subprocess
    import sys

    code = """
import numpy as np
from memtp_sim import _kernels as K
for bad in (-0.5, -1e300, 1.5, 1e300, float("nan"), -float("inf"), float("inf")):
    for row in (0, 3, 6):
        for pos in (0, 1, 2):
            conf = np.full((7, 3), 0.5)
            conf[row, pos] = bad
            sums = [np.zeros((3, 15), np.int64), np.zeros((3, 15)), np.zeros((3, 15)),
                    np.zeros((3, 10), np.int64), np.zeros((3, 10)), np.zeros((3, 10))]
            try:
                K.survival_bins(conf, np.zeros((7, 3), bool), np.zeros((3, 7), np.uint64), np.zeros(3), 15,
                                *sums[:3], 10, *sums[3:])
            except ValueError as err:
                assert str(err) == "conf: values must lie in [0, 1]", err
            else:
                raise SystemExit(f"no error for {bad} at ({row}, {pos})")
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0 and out.stdout.strip() == "ok", (out.returncode, out.stdout, out.stderr[-2000:])


def _admission_state(seed, n, block_tokens, capacity, watermark_frac, limit, num_running, compiled):
    # an engine's admission inputs, from a seed (the same both ways): who waits in which order, who
    # runs, how much KV each holds and needs, what was transferred, who was admitted before; now
    # and then a waiting request that holds blocks (an invariant broken: both ways must raise)
    from collections import deque
    from types import SimpleNamespace

    from memtp_sim.kv_cache import KVCacheManager

    rng = np.random.default_rng(seed)
    order = rng.permutation(n).tolist()
    running, waiting = order[:num_running], deque(order[num_running:])
    kv = KVCacheManager(n, block_tokens, capacity, watermark_frac)
    for i in running:
        kv.blocks[i] = rng.integers(1, 4)
    if waiting and rng.random() < 0.1:
        kv.blocks[waiting[int(rng.integers(len(waiting)))]] = 1
    kv.blocks_used = int(kv.blocks.sum())
    prompt = rng.integers(1, 300, n)
    return SimpleNamespace(
        waiting=waiting, running=running, _admit_limit=limit, kv=kv, kv_transferred=rng.random(n) < 0.6,
        prompt=prompt, _prompt_list=prompt.tolist(), generated=rng.integers(0, 50, n),
        status=np.ones(n, dtype=np.int8), admitted_at=np.where(rng.random(n) < 0.5, np.nan, rng.random(n)),
        prefill_target=np.zeros(n, dtype=np.int64), prefilled=np.zeros(n, dtype=np.int64), _run_ids=(None, None),
        env=SimpleNamespace(_now=12.5), _kv_kernels=kernels if compiled else None)


@needs_kernels
@settings(max_examples=400, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 12), block_tokens=st.sampled_from([1, 4, 16]),
       capacity=st.integers(1, 400), watermark_frac=st.sampled_from([0.0, 0.01, 0.3]), limit=st.integers(1, 13),
       data=st.data())
def test_admission_in_one_call_is_the_python_loop(seed, n, block_tokens, capacity, watermark_frac, limit, data):
    # the oracle: Engine._admit's own loop (the numpy engine's), on the same state
    from memtp_sim.engine import Engine

    num_running = data.draw(st.integers(0, n))
    states = []
    for compiled in (False, True):
        eng = _admission_state(seed, n, block_tokens, capacity, watermark_frac, limit, num_running, compiled)
        try:
            Engine._admit(eng)
            outcome = "ok"
        except Exception as err:  # noqa: BLE001 - both ways must raise the same
            outcome = f"{type(err).__name__}: {err}"
        kv = eng.kv
        states.append((outcome, list(eng.waiting), list(eng.running), kv.blocks_used, kv.blocks.tolist(),
                       kv.tokens.tolist(), eng.status.tolist(), np.nan_to_num(eng.admitted_at, nan=-1.0).tolist(),
                       eng.prefill_target.tolist(), eng.prefilled.tolist(), eng._run_ids is None))
    assert states[0] == states[1]


@needs_kernels
@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 12), data=st.data())
def test_finishing_in_one_call_is_the_python_loop(seed, n, data):
    # the oracle: Engine._finish's own loop (the numpy engine's): the same arrays, KV and running
    # list, and each request's completion in the same order with the same running list then
    from types import SimpleNamespace

    from memtp_sim.engine import Engine
    from memtp_sim.kv_cache import KVCacheManager

    rng = np.random.default_rng(seed)
    running = rng.permutation(n).tolist()
    finished = [running[k] for k in sorted(rng.choice(n, data.draw(st.integers(0, n)), replace=False).tolist())]
    blocks0, states = rng.integers(0, 5, n), []
    for compiled in (False, True):
        kv = KVCacheManager(n, 16, 1000, 0.0)
        kv.blocks[:] = blocks0
        kv.tokens[:] = np.arange(n) * 7
        kv.blocks_used = int(kv.blocks.sum())
        seen = []
        eng = SimpleNamespace(env=SimpleNamespace(_now=3.25), kv=kv, running=list(running), _run_ids=(1, 2),
                              finished_at=np.full(n, np.nan), status=np.full(n, 2, dtype=np.int8),
                              _kv_kernels=kernels if compiled else None)
        eng._complete = lambda i, eng=eng, seen=seen: seen.append((i, list(eng.running)))
        Engine._finish(eng, list(finished))
        states.append((seen, eng.running, kv.blocks_used, kv.blocks.tolist(), kv.tokens.tolist(),
                       np.nan_to_num(eng.finished_at, nan=-1.0).tolist(), eng.status.tolist(),
                       eng._run_ids is None or not finished))
    assert states[0] == states[1]


@needs_kernels
@pytest.mark.parametrize("name", ["allocate", "free", "can_allocate", "blocks_for"])
def test_a_replaced_kv_function_runs_in_admission_and_completions(monkeypatch, name):
    # _kernels.admit and finish do the work of these KVCacheManager functions: where one has been
    # replaced (here on the class, with a wrapper that counts its calls), the engine's Python loops
    # run and call it, and the run is the same as without the kernels
    from memtp_sim.kv_cache import KVCacheManager

    sc = scenario(policy={"name": "dspark"}, workload={"concurrency": 8, "num_requests": 40},
                  engine={"prefill": "disaggregated", "prefill_gpus": 2})
    want = run(sc, seed=2).state
    real, calls = getattr(KVCacheManager, name), []

    def counted(*a, **kw):  # noqa: ANN002, ANN003, ANN202
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(KVCacheManager, name, counted)
    got = run(sc, seed=2).state
    assert len(calls) >= 40  # each admission (or completion) called it
    assert_same_state(got, want)

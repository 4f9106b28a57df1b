# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The engine's hot steps compiled, bit for bit the numpy code they replace (``memtp_sim.engine``,
``memtp_sim.kv_cache``, ``policies.dspark._schedule``, ``hardware.cost.SPSTable``,
``memtp_sim.confidence``): plain blocks planned, checked, applied and logged, KV anchor and
lookahead sums, a pass's context, the drafted positions' confidences, Algorithm 1's scan,
acceptance, chunked prefill, context pass times, DSpark's drafted rounds run as blocks between
SimPy events, and the calibration bins of a run's diagnostics. ``memtp_sim._compiled.ENABLED = False`` runs the numpy code instead;
tests/test_kernels.py and tests/test_plain_blocks.py compare both.

At 64 decoding users a round's arrays hold ~64 elements, so a numpy call costs ~1 us of
interpreter and dispatch overhead around nanoseconds of arithmetic; here each step is one call.
Arrays are checked (int64 or float64, C-contiguous, ids in range; writeable where the kernel writes
into them, as numpy's assignment) on every call: the checks cost nanoseconds and a wrong array
raises instead of reading memory it does not own or writing memory its owner made read-only.

Float operations are the numpy code's, in the same order (IEEE double, no fused multiply-add: the
extension is built with ``-ffp-contract=off``), so pass times and clocks match to the bit; random
draws stay with the run's numpy generators: the callers pass them in, or the drafted-block kernel
draws from the same generators with numpy's own C distribution functions (``numpy/random/lib``,
numpy's documented route for Cython), the numbers the Python calls give in the same order.
"""

cimport numpy as cnp
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.string cimport memcpy
from libc.math cimport INFINITY, NAN, exp, floor, isfinite, log
from cpython.pycapsule cimport PyCapsule_GetPointer, PyCapsule_IsValid
from numpy.random cimport bitgen_t
from numpy.random.c_distributions cimport random_normal, random_standard_uniform_fill
from cpython.float cimport PyFloat_AsDouble
from cpython.ref cimport PyObject
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.long cimport PyLong_AsLongLong
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE, PyTuple_New, PyTuple_SET_ITEM
from cpython.ref cimport Py_INCREF
from libc.stdint cimport int8_t, int32_t

cnp.import_array()

cdef extern from "Python.h":
    void PyObject_GC_UnTrack(void* op)


cdef inline int _append_row(list rows, tuple row) except -1:
    # a round-log row holds numbers only, so it can be in no reference cycle: untracked by the
    # garbage collector at once (CPython untracks such tuples at their first collection, after
    # traversing them: most of a run's young-generation collections were these rows)
    PyObject_GC_UnTrack(<void*>row)
    rows.append(row)
    return 0

cdef extern from *:
    """
    #ifndef MEMTP_KERNELS_SHA256
    #define MEMTP_KERNELS_SHA256 ""
    #endif
    #ifndef MEMTP_NUMPY_BUILD_VERSION
    #define MEMTP_NUMPY_BUILD_VERSION ""
    #endif
    """
    const char* MEMTP_KERNELS_SHA256
    const char* MEMTP_NUMPY_BUILD_VERSION

#: sha256 of the _kernels.pyx this extension was built from (setup.py); memtp_sim._compiled
#: refuses a build whose digest differs from the source next to it
SOURCE_SHA256 = MEMTP_KERNELS_SHA256.decode("ascii")

#: the numpy whose C random library (numpy/random/lib, linked statically) drafted_block draws
#: with; the engine runs drafted blocks only under that same numpy (its draws are then the Python
#: calls' numbers: Generator streams may change between numpy releases)
NUMPY_BUILD_VERSION = MEMTP_NUMPY_BUILD_VERSION.decode("ascii")

ctypedef long long i64
ctypedef unsigned long long u64


cdef str _layout(cnp.ndarray a):
    # an array's dtype, dimensions and, when it is not, "not C-contiguous" (for the errors)
    return f"{a.dtype} {a.ndim}-D" + ("" if cnp.PyArray_IS_C_CONTIGUOUS(a) else ", not C-contiguous")


cdef inline int _check_1d(cnp.ndarray a, str name, int dtype, str kind, Py_ssize_t need, bint exact) except -1:
    # a C-contiguous 1-D array of the dtype, with ``need`` elements (or at least that many unless
    # ``exact``; need < 0: any length)
    if cnp.PyArray_TYPE(a) != dtype or not cnp.PyArray_IS_C_CONTIGUOUS(a) or cnp.PyArray_NDIM(a) != 1:
        raise TypeError(f"{name}: a C-contiguous 1-D {kind} array is required, got {_layout(a)}")
    cdef Py_ssize_t size = cnp.PyArray_DIM(a, 0)
    if need >= 0 and (size < need or (exact and size != need)):
        raise ValueError(f"{name}: {need} elements needed, got {size}")
    return 0


cdef inline i64* _i64(cnp.ndarray a, str name, Py_ssize_t need=-1, bint exact=True) except NULL:
    _check_1d(a, name, cnp.NPY_INT64, "int64", need, exact)
    return <i64*>cnp.PyArray_DATA(a)


cdef inline double* _f64(cnp.ndarray a, str name, Py_ssize_t need=-1, bint exact=True) except NULL:
    _check_1d(a, name, cnp.NPY_FLOAT64, "float64", need, exact)
    return <double*>cnp.PyArray_DATA(a)


cdef inline cnp.ndarray _w(cnp.ndarray a, str name):
    # an array the kernel writes into: refused where numpy would refuse the assignment
    if not cnp.PyArray_ISWRITEABLE(a):
        raise ValueError(f"{name}: the kernel writes into this array, and it is read-only")
    return a


cdef inline int _check_block_tokens(i64 block_tokens) except -1:
    if block_tokens < 1:
        raise ValueError(f"block_tokens: must be >= 1, got {block_tokens}")
    return 0


cdef inline int _check_ids(i64* ids, Py_ssize_t n, Py_ssize_t size) except -1:
    cdef Py_ssize_t k
    for k in range(n):
        if ids[k] < 0 or ids[k] >= size:
            raise IndexError(f"request id {ids[k]} outside 0..{size - 1}")
    return 0


cdef extern from *:
    int __builtin_ctzll(unsigned long long x) nogil  # trailing zero bits (GCC and Clang), x > 0


cdef inline i64 _blocks_for(i64 tokens, i64 block_tokens) noexcept nogil:
    # ceil(tokens / block_tokens) for tokens >= 0 (the engine's -(-t // bt)). Runs several times
    # per request per round: a block size that is a power of two (the usual 16) takes a shift, where
    # a 64-bit division costs tens of cycles (the floor either way: >> rounds down as // does)
    if block_tokens > 0 and (block_tokens & (block_tokens - 1)) == 0:
        return (tokens + block_tokens - 1) >> __builtin_ctzll(<unsigned long long>block_tokens)
    return (tokens + block_tokens - 1) // block_tokens


cdef inline bint _block_full(i64 tokens, i64 block_tokens) noexcept nogil:
    # tokens % block_tokens == 0 (the next token takes a new block), a mask for a power of two
    # (as _blocks_for: per request per round)
    if block_tokens > 0 and (block_tokens & (block_tokens - 1)) == 0:
        return (tokens & (block_tokens - 1)) == 0
    return tokens % block_tokens == 0


cdef inline double _dmax(double x, double y) noexcept nogil:
    # Python's max(x, y): x unless y is larger (numpy's maximum agrees on non-NaN values)
    return y if y > x else x


def anchor_blocks(cnp.ndarray reqs not None, cnp.ndarray tokens not None, i64 block_tokens):
    """New KV blocks the requests ``reqs`` need to store one more token each: the count of those
    whose stored tokens fill their last block (``KVCacheManager.anchor_blocks``).

    Args:
        reqs: ``(R,)`` int64 request ids.
        tokens: ``(n,)`` int64 stored tokens per request.
        block_tokens: tokens per KV block (>= 1).

    Returns:
        int in ``0..R``.

    Raises:
        TypeError, IndexError: an array of the wrong type, or an id outside ``tokens``.
    """
    cdef i64* ids = _i64(reqs, "reqs")
    cdef i64* tok = _i64(tokens, "tokens")
    cdef Py_ssize_t n = cnp.PyArray_DIM(reqs, 0), k
    cdef i64 count = 0
    _check_ids(ids, n, cnp.PyArray_DIM(tokens, 0))
    for k in range(n):
        if _block_full(tok[ids[k]], block_tokens):
            count += 1
    return count


def round_context(cnp.ndarray dec not None, object pre, object chunks, cnp.ndarray tokens not None):
    """A pass's context (``Engine._round_tables``): the KV tokens it reads, the longest context
    and the requests in it: every decoding request, and every prefilling request with a chunk
    this round (docs/model.md section 1 step 4).

    Args:
        dec: ``(R,)`` int64 decoding request ids.
        pre: None, or ``(P,)`` int64 prefilling request ids.
        chunks: None (no prefill), or ``(P,)`` int64 prefill tokens of each ``pre`` this round.
        tokens: ``(n,)`` int64 stored tokens per request.

    Returns:
        ``(kv_read, l_max, num_requests)``: the sum and the largest (0 for none) of the requests'
        stored tokens, and their count.

    Raises:
        TypeError, ValueError, IndexError: arrays of the wrong type or length, or bad ids.
    """
    cdef i64* ids = _i64(dec, "dec")
    cdef i64* tok = _i64(tokens, "tokens")
    cdef Py_ssize_t num = cnp.PyArray_DIM(dec, 0), size = cnp.PyArray_DIM(tokens, 0), num_pre = 0, k
    cdef i64* pids = NULL
    cdef i64* ch = NULL
    _check_ids(ids, num, size)
    if chunks is not None:
        pids = _i64(<cnp.ndarray?>pre, "pre")
        num_pre = cnp.PyArray_DIM(<cnp.ndarray>pre, 0)
        ch = _i64(<cnp.ndarray?>chunks, "chunks", num_pre)
        _check_ids(pids, num_pre, size)
    cdef i64 kv_read = 0, l_max = 0, t, num_req = num
    for k in range(num):
        t = tok[ids[k]]
        kv_read += t
        if t > l_max:
            l_max = t
    for k in range(num_pre):
        if ch[k] > 0:
            t = tok[pids[k]]
            kv_read += t
            if t > l_max:
                l_max = t
            num_req += 1
    return kv_read, l_max, num_req


def sum_within(cnp.ndarray counts not None, i64 high):
    """The sum of ``counts`` (``(R,)`` int64) when every element lies in ``0..high``, else -1 (a
    plan's verify lengths within the drafted positions, and the draft tokens it verifies:
    ``Engine._draft_and_plan``'s check)."""
    cdef i64* c = _i64(counts, "counts")
    cdef Py_ssize_t k
    cdef i64 total = 0
    for k in range(cnp.PyArray_DIM(counts, 0)):
        if c[k] < 0 or c[k] > high:
            return -1
        total += c[k]
    return total


cdef i64 _split_core(i64* ids, Py_ssize_t n, i64* done, i64* want, i64* tok, i64 block_tokens, i64* dec,
                     i64* pre, i64* more) noexcept nogil:
    # split_decoding's work on checked pointers: returns the decoding count; more out: the
    # prefilling count and the anchor blocks
    cdef Py_ssize_t k
    cdef i64 i, num_dec = 0, num_pre = 0, anchors = 0
    for k in range(n):
        i = ids[k]
        if done[i] >= want[i]:
            dec[num_dec] = i
            num_dec += 1
            if _block_full(tok[i], block_tokens):
                anchors += 1
        else:
            pre[num_pre] = i
            num_pre += 1
    more[0], more[1] = num_pre, anchors
    return num_dec


def split_decoding(cnp.ndarray run not None, cnp.ndarray prefilled not None, cnp.ndarray target not None,
                   cnp.ndarray tokens not None, i64 block_tokens, cnp.ndarray dec not None, cnp.ndarray pre not None):
    """Step 2's split of the running requests (``Engine._guarantee_anchors``): those whose prefill
    is done decode, the others prefill, each in running order; and the KV blocks the decoding
    requests' anchors need (``KVCacheManager.anchor_blocks``).

    Args:
        run: ``(N,)`` int64 running request ids, admission order.
        prefilled, target: ``(n,)`` int64 prefilled and to-prefill tokens per request.
        tokens: ``(n,)`` int64 stored tokens per request.
        block_tokens: tokens per KV block (>= 1).
        dec, pre: int64 out, ``(N,)`` or longer: the decoding ids, then the prefilling ids.

    Returns:
        ``(num_decoding, anchor_blocks)``; the prefilling count is ``N - num_decoding``.

    Raises:
        TypeError, ValueError, IndexError: arrays of the wrong type or length, or bad ids.
    """
    cdef i64* ids = _i64(run, "run")
    cdef i64* done = _i64(prefilled, "prefilled")
    cdef Py_ssize_t num = cnp.PyArray_DIM(run, 0), size = cnp.PyArray_DIM(prefilled, 0), k
    cdef i64* want = _i64(target, "target", size)
    cdef i64* tok = _i64(tokens, "tokens", size)
    cdef i64* d = _i64(_w(dec, "dec"), "dec", num, False)
    cdef i64* p = _i64(_w(pre, "pre"), "pre", num, False)
    _check_block_tokens(block_tokens)
    _check_ids(ids, num, size)
    cdef i64 more[2]
    cdef i64 num_dec = _split_core(ids, num, done, want, tok, block_tokens, d, p, more)
    return num_dec, more[1]


def ids_array(list ids not None):
    """The engine's running list (Python ints) as an int64 array (``np.fromiter``'s result, in a
    fifth of its time at 64 requests: the running set changes at every admission and completion).

    Raises:
        TypeError, OverflowError: an element that is not an int, or does not fit int64.
    """
    cdef Py_ssize_t n = PyList_GET_SIZE(ids), k
    cdef cnp.ndarray out = cnp.PyArray_EMPTY(1, [n], cnp.NPY_INT64, 0)
    cdef i64* o = <i64*>cnp.PyArray_DATA(out)
    for k in range(n):
        o[k] = PyLong_AsLongLong(<object>PyList_GET_ITEM(ids, k))
    return out


def admit(object waiting not None, list running not None, i64 limit, double now, cnp.ndarray prompt not None,
          cnp.ndarray generated not None, cnp.ndarray transferred not None, cnp.ndarray status not None,
          cnp.ndarray admitted_at not None, cnp.ndarray prefill_target not None, cnp.ndarray prefilled not None,
          cnp.ndarray tokens not None, cnp.ndarray blocks not None, i64 block_tokens, i64 watermark, i64 capacity,
          i64 blocks_used):
    """Step 1 of a round (``Engine._admit``): admit the waiting requests first-come-first-served
    while fewer than ``limit`` run and each one's blocks fit the KV cache, with ``watermark``
    blocks kept free while others run (``KVCacheManager.can_allocate``); each admitted request is
    moved from ``waiting`` (a deque) to the end of ``running``, marked running (status 2), its
    first admission time set, its prefill target set (its prompt where its KV was transferred
    from a prefill GPU, which covers it; else its prompt and the tokens it generated, recomputed)
    and its blocks allocated (``KVCacheManager.allocate``), in the Python code's order.

    Args:
        waiting: ``collections.deque`` of int request ids; running: list of int ids.
        limit: the most running requests; now: the clock, s.
        prompt, generated: ``(n,)`` int64 prompt tokens and tokens generated.
        transferred: ``(n,)`` bool, KV transferred; status: ``(n,)`` int8; admitted_at: ``(n,)``
            float64 (NaN: never admitted); prefill_target, prefilled, tokens, blocks: ``(n,)``
            int64, written.
        block_tokens: tokens per KV block (>= 1); watermark, capacity, blocks_used: the cache's.

    Returns:
        ``(admitted, blocks_used, stuck)``: the requests admitted, the blocks in use after them,
        and whether it stopped at a head-of-line request that already holds blocks (an invariant
        broken: the caller's Python path raises its error).

    Raises:
        TypeError, ValueError, IndexError: arrays of the wrong type or length, or an id outside them.

    Source:
        vLLM's v0 block manager ``can_allocate`` (the watermark) and ``allocate_slots``; docs/model.md
        section 1, step 1.
    """
    cdef i64* p = _i64(prompt, "prompt")
    cdef Py_ssize_t n = cnp.PyArray_DIM(prompt, 0)
    cdef i64* gen = _i64(generated, "generated", n)
    _check_1d(transferred, "transferred", cnp.NPY_BOOL, "bool", n, True)
    _check_1d(status, "status", cnp.NPY_INT8, "int8", n, True)
    cdef char* tr = <char*>cnp.PyArray_DATA(transferred)
    cdef int8_t* st = <int8_t*>cnp.PyArray_DATA(_w(status, "status"))
    cdef double* adm = _f64(_w(admitted_at, "admitted_at"), "admitted_at", n)
    cdef i64* tgt = _i64(_w(prefill_target, "prefill_target"), "prefill_target", n)
    cdef i64* done = _i64(_w(prefilled, "prefilled"), "prefilled", n)
    cdef i64* tok = _i64(_w(tokens, "tokens"), "tokens", n)
    cdef i64* blk = _i64(_w(blocks, "blocks"), "blocks", n)
    _check_block_tokens(block_tokens)
    cdef i64 i, target, need
    cdef Py_ssize_t admitted = 0
    cdef object head
    popleft = waiting.popleft
    while len(waiting) and PyList_GET_SIZE(running) < limit:
        head = waiting[0]
        i = head
        if i < 0 or i >= n:
            raise IndexError(f"request id {i} outside 0..{n - 1}")
        target = p[i] if tr[i] else p[i] + gen[i]
        need = _blocks_for(target, block_tokens)
        if blocks_used + need + (watermark if PyList_GET_SIZE(running) else 0) > capacity:
            break  # an empty engine always admits: oversize requests were refused at arrival
        if blk[i] != 0:
            return admitted, blocks_used, True
        popleft()
        st[i] = 2
        if adm[i] != adm[i]:  # NaN: admitted for the first time
            adm[i] = now
        tgt[i] = target
        done[i] = target if tr[i] else 0
        blk[i] = need
        tok[i] = target if tr[i] else 0
        blocks_used += need
        running.append(head)
        admitted += 1
    return admitted, blocks_used, False


def finish(list ids not None, double now, cnp.ndarray finished_at not None, cnp.ndarray status not None,
           cnp.ndarray blocks not None):
    """The array work of ``Engine._finish`` for the requests ``ids`` that finished now: each one's
    finish time, its status 3 (FINISHED) and its KV blocks freed, its stored tokens kept
    (``KVCacheManager.free(i, drop_tokens=False)``).

    Args:
        ids: list of int request ids.
        now: the clock, s.
        finished_at: ``(n,)`` float64; status: ``(n,)`` int8; blocks: ``(n,)`` int64; all written.

    Returns:
        The blocks freed (the caller takes them off the cache's blocks in use).

    Raises:
        TypeError, ValueError, IndexError: arrays of the wrong type or length, or an id outside them.
    """
    cdef double* fin = _f64(_w(finished_at, "finished_at"), "finished_at")
    cdef Py_ssize_t n = cnp.PyArray_DIM(finished_at, 0), k, num = PyList_GET_SIZE(ids)
    _check_1d(status, "status", cnp.NPY_INT8, "int8", n, True)
    cdef int8_t* st = <int8_t*>cnp.PyArray_DATA(_w(status, "status"))
    cdef i64* blk = _i64(_w(blocks, "blocks"), "blocks", n)
    cdef i64 i, freed = 0
    for k in range(num):
        i = PyLong_AsLongLong(<object>PyList_GET_ITEM(ids, k))
        if i < 0 or i >= n:
            raise IndexError(f"request id {i} outside 0..{n - 1}")
    for k in range(num):
        i = PyLong_AsLongLong(<object>PyList_GET_ITEM(ids, k))
        fin[i] = now
        st[i] = 3
        freed += blk[i]
        blk[i] = 0
    return freed


def all_prefilled(cnp.ndarray reqs not None, cnp.ndarray prefilled not None, cnp.ndarray target not None):
    """Whether every request in ``reqs`` has prefilled its target (all of them decode this round).

    Args:
        reqs: ``(R,)`` int64 request ids.
        prefilled, target: ``(n,)`` int64 prompt tokens computed so far and to compute.

    Returns:
        bool (True for no requests).

    Raises:
        TypeError, ValueError, IndexError: arrays of the wrong type or length, or bad ids.
    """
    cdef i64* ids = _i64(reqs, "reqs")
    cdef i64* done = _i64(prefilled, "prefilled")
    cdef Py_ssize_t n = cnp.PyArray_DIM(reqs, 0), size = cnp.PyArray_DIM(prefilled, 0), k
    cdef i64* want = _i64(target, "target", size)
    _check_ids(ids, n, size)
    for k in range(n):
        if done[ids[k]] < want[ids[k]]:
            return False
    return True


cdef struct _PlanBuffers:
    double* times
    double* durations
    double* verify_s
    i64* blocks


cdef _PlanBuffers _plan_buffers(cnp.ndarray times, cnp.ndarray durations, cnp.ndarray verify_s, cnp.ndarray blocks,
                                i64 max_rounds) except *:
    # a plan's out arrays (plain_plan, plain_block): writeable, float64 round starts (max_rounds + 1),
    # round and pass times and int64 KV blocks (max_rounds each), or longer
    cdef _PlanBuffers buf
    buf.times = _f64(_w(times, "times"), "times", max_rounds + 1, False)
    buf.durations = _f64(_w(durations, "durations"), "durations", max_rounds, False)
    buf.verify_s = _f64(_w(verify_s, "verify_s"), "verify_s", max_rounds, False)
    buf.blocks = _i64(_w(blocks, "blocks"), "blocks", max_rounds, False)
    return buf


def plain_plan(cnp.ndarray dec not None, cnp.ndarray tokens not None, cnp.ndarray output not None,
               cnp.ndarray generated not None, i64 block_tokens, i64 capacity, double now, double next_event, i64 ahead,
               i64 max_rounds, double fixed_s, bint context, double first_s, double zero_ms, double factor,
               double a_slope, double q, double b_ms_per_kv_token, double c_ms_per_pair, cnp.ndarray times not None,
               cnp.ndarray durations not None, cnp.ndarray verify_s not None, cnp.ndarray blocks not None):
    """Plan a block of plain rounds (``Engine._plan_plain_block``): how many rounds run before an
    event, a completion or a full KV cache, each priced at its own context.

    Every request in ``dec`` (R of them, all decoding) emits one token a round. Round j's pass
    reads ``sum(tokens) + R*j`` KV tokens, longest context ``max(tokens) + j``; its time is
    ``first_s`` without a context term, else ``(zero_ms + max(max(a*L, b*K), c*K*q)) * factor /
    1000`` (``SPSTable._context_s``; docs/model.md section 1 step 4), and the round lasts
    ``fixed_s`` more. The block stops at the first of: ``ahead`` or ``max_rounds`` rounds, the
    round where the first request finishes, the round whose end reaches ``next_event`` (included),
    the round whose anchors would exceed ``capacity`` KV blocks (excluded).

    Args:
        dec: ``(R,)`` int64 ids of the decoding requests (R >= 1).
        tokens, output, generated: ``(n,)`` int64 per-request stored KV tokens, output lengths and
            tokens generated so far.
        block_tokens, capacity: KV block size in tokens and capacity in blocks.
        now, next_event: the clock and SimPy's next event time, s.
        ahead, max_rounds: caps on the rounds (the policy's plain rounds ahead; the block limit).
        fixed_s: a round's time besides its pass (draft, host overhead), s.
        context: whether the pass time has a context term (else every pass takes ``first_s``).
        first_s: the pass time without a context term, s.
        zero_ms, factor, a_slope, q, b_ms_per_kv_token, c_ms_per_pair: the context pricing at
            B = R (pass time at context 0 at the padded size, eager factor, latency slope at q,
            query tokens per request, bandwidth and compute slopes).
        times: float64 out, ``(max_rounds + 1,)`` or longer: round starts and the last end.
        durations, verify_s: float64 out, ``(max_rounds,)``: round and pass times, s.
        blocks: int64 out, ``(max_rounds,)``: KV blocks after each round's token (its peak).

    Returns:
        ``(rounds, kv_read_tokens)``: rounds in the block (0: not even this round fits the KV
        cache) and the KV tokens the first pass reads.

    Raises:
        TypeError, ValueError, IndexError: arrays of the wrong type or length, or bad ids.
    """
    cdef i64* ids = _i64(dec, "dec")
    cdef i64* tok = _i64(tokens, "tokens")
    cdef Py_ssize_t num = cnp.PyArray_DIM(dec, 0), size = cnp.PyArray_DIM(tokens, 0)
    cdef i64* out = _i64(output, "output", size)
    cdef i64* gen = _i64(generated, "generated", size)
    if num < 1 or max_rounds < 1 or block_tokens < 1:
        raise ValueError(f"plain_plan: needs >= 1 request, round and block token (got {num}, {max_rounds}, "
                         f"{block_tokens})")
    _check_ids(ids, num, size)
    cdef _PlanBuffers buf = _plan_buffers(times, durations, verify_s, blocks, max_rounds)
    cdef i64 kv_read, rounds
    rounds = _plain_plan_core(ids, num, tok, out, gen, block_tokens, capacity, now, next_event, ahead, max_rounds,
                              fixed_s, context, first_s, zero_ms, factor, a_slope, q, b_ms_per_kv_token,
                              c_ms_per_pair, buf.times, buf.durations, buf.verify_s, buf.blocks, &kv_read)
    return rounds, kv_read


cdef i64 _plain_plan_core(i64* ids, Py_ssize_t num, i64* tok, i64* out, i64* gen, i64 block_tokens, i64 capacity,
                          double now, double next_event, i64 ahead, i64 max_rounds, double fixed_s, bint context,
                          double first_s, double zero_ms, double factor, double a_slope, double q,
                          double b_ms_per_kv_token, double c_ms_per_pair, double* t_out, double* d_out, double* v_out,
                          i64* b_out, i64* kv_read_out) noexcept nogil:
    # plain_plan's work on checked arrays (num >= 1, ids in range, outputs max_rounds long): the
    # rounds, and the KV tokens the first pass reads in kv_read_out
    cdef i64 kv_read = 0, l_max = 0, left, min_left = -1, t, j, rounds, total
    cdef Py_ssize_t k
    for k in range(num):
        t = tok[ids[k]]
        kv_read += t
        if t > l_max:
            l_max = t
        left = out[ids[k]] - gen[ids[k]]
        if min_left < 0 or left < min_left:
            min_left = left
    kv_read_out[0] = kv_read
    cdef double kv, verify
    # the first round, priced as the round path prices it (SPSTable._context_one_s)
    if context:
        kv = <double>kv_read
        verify = (zero_ms + _dmax(_dmax(a_slope * <double>l_max, b_ms_per_kv_token * kv),
                                  c_ms_per_pair * (kv * q))) * factor / 1000.0
    else:
        verify = first_s
    t_out[0] = now
    d_out[0] = fixed_s + verify
    v_out[0] = verify
    t_out[1] = now + d_out[0]
    if t_out[1] >= next_event:
        rounds = 1  # an event falls inside this very round
    else:
        rounds = min_left if min_left < ahead else ahead
        if rounds > max_rounds:
            rounds = max_rounds
        if rounds < 1:
            rounds = 1
    for j in range(rounds):
        if j > 0:
            if context:
                kv = <double>(kv_read + num * j)
                verify = (zero_ms + _dmax(_dmax(a_slope * <double>(l_max + j), b_ms_per_kv_token * kv),
                                          c_ms_per_pair * (kv * q))) * factor / 1000.0
            v_out[j] = verify
            d_out[j] = fixed_s + verify
            t_out[j + 1] = t_out[j] + d_out[j]
        total = 0
        for k in range(num):
            total += _blocks_for(tok[ids[k]] + j + 1, block_tokens)
        if total > capacity:
            return j  # the rounds before the first whose anchors would not fit
        b_out[j] = total
        if t_out[j + 1] >= next_event:
            return j + 1  # a round may reach the next event only as the block's last
    return rounds


def plain_rows(list rows not None, tuple template not None, cnp.ndarray times not None, cnp.ndarray durations not None,
               cnp.ndarray verify_s not None, cnp.ndarray blocks not None, i64 rounds, i64 after_last, i64 kv_read0,
               i64 num_dec):
    """Append a plain block's round-log rows (``Engine._plain_block``): ``template`` (one row, in
    the log's column order) with round j's start ``times[j]`` (field 0), duration (1), pass time
    (3), KV blocks at its peak and after it (14, 15; after the last round ``after_last``, once its
    finished requests freed theirs) and KV tokens read ``kv_read0 + num_dec * j`` (26), as the
    Python rows give them.

    Args:
        rows: the round log's rows (tuples appended).
        template: a 29-field row whose other fields every round shares.
        times: float64 ``(rounds + 1,)`` or longer; durations, verify_s: float64 ``(rounds,)`` or
            longer; blocks: int64 ``(rounds,)`` or longer.
        rounds, after_last, kv_read0, num_dec: the block's rounds, KV after its last round, KV
            tokens its first pass reads and its requests.

    Raises:
        TypeError, ValueError: arrays of the wrong type or length, or a template of another length.
    """
    if PyTuple_GET_SIZE(template) != 29:
        raise ValueError(f"template: 29 fields needed, got {PyTuple_GET_SIZE(template)}")
    if rounds < 0:
        raise ValueError(f"rounds: must be >= 0, got {rounds}")
    _plain_rows_core(rows, template, _f64(times, "times", rounds + 1, False), _f64(durations, "durations", rounds, False),
                     _f64(verify_s, "verify_s", rounds, False), _i64(blocks, "blocks", rounds, False), rounds,
                     after_last, kv_read0, num_dec)


cdef int _plain_rows_core(list rows, tuple template, double* t, double* d, double* v, i64* b, i64 rounds,
                          i64 after_last, i64 kv_read0, i64 num_dec) except -1:
    # plain_rows' work on a checked 29-field template and arrays of at least ``rounds`` elements
    cdef tuple row
    cdef object item
    cdef i64 j
    cdef Py_ssize_t f
    for j in range(rounds):
        row = PyTuple_New(29)  # the template's fields but the round's own (no list in between)
        for f in range(29):
            if f == 0:
                item = t[j]
            elif f == 1:
                item = d[j]
            elif f == 3:
                item = v[j]
            elif f == 14:
                item = b[j]
            elif f == 15:
                item = after_last if j == rounds - 1 else b[j]
            elif f == 26:
                item = kv_read0 + num_dec * j
            else:
                item = <object>PyTuple_GET_ITEM(template, f)
            Py_INCREF(item)  # PyTuple_SET_ITEM steals a reference
            PyTuple_SET_ITEM(row, f, item)
        _append_row(rows, row)
    return 0


def plain_apply(cnp.ndarray dec not None, i64 rounds, cnp.ndarray generated not None, cnp.ndarray num_rounds not None,
                cnp.ndarray tokens not None, cnp.ndarray blocks not None, cnp.ndarray output not None, i64 block_tokens,
                cnp.ndarray finished not None):
    """Apply a block of ``rounds`` plain rounds (``Engine._plain_block``): every request in ``dec``
    generates and stores ``rounds`` tokens (``KVCacheManager.append``), and those that reach their
    output length are listed.

    Args:
        dec: ``(R,)`` int64 request ids.
        rounds: rounds in the block (>= 1).
        generated, num_rounds, tokens, blocks: ``(n,)`` int64 per-request counters, updated in
            place (tokens generated, rounds taken part in, stored KV tokens, KV blocks held).
        output: ``(n,)`` int64 output lengths.
        block_tokens: tokens per KV block.
        finished: int64 out, ``(R,)`` or longer: the ids that finished, in ``dec`` order.

    Returns:
        ``(blocks_added, num_finished)``: the change in KV blocks held, and how many ids were
        written to ``finished``.

    Raises:
        TypeError, ValueError, IndexError: arrays of the wrong type or length, or bad ids.
    """
    cdef i64* ids = _i64(dec, "dec")
    cdef i64* gen = _i64(_w(generated, "generated"), "generated")
    cdef Py_ssize_t num = cnp.PyArray_DIM(dec, 0), size = cnp.PyArray_DIM(generated, 0)
    cdef i64* nr = _i64(_w(num_rounds, "num_rounds"), "num_rounds", size)
    cdef i64* tok = _i64(_w(tokens, "tokens"), "tokens", size)
    cdef i64* blk = _i64(_w(blocks, "blocks"), "blocks", size)
    cdef i64* out = _i64(output, "output", size)
    cdef i64* fin = _i64(_w(finished, "finished"), "finished", num, False)
    _check_block_tokens(block_tokens)
    _check_ids(ids, num, size)
    cdef Py_ssize_t nf = 0
    cdef i64 added = _plain_apply_core(ids, num, rounds, gen, nr, tok, blk, out, block_tokens, fin, &nf)
    return added, nf


cdef i64 _plain_apply_core(i64* ids, Py_ssize_t num, i64 rounds, i64* gen, i64* nr, i64* tok, i64* blk, i64* out,
                           i64 block_tokens, i64* fin, Py_ssize_t* num_fin) noexcept nogil:
    # plain_apply's work on checked arrays: the blocks added; the finished ids in fin, their count in num_fin
    cdef i64 added = 0, nb, i
    cdef Py_ssize_t k, nf = 0
    for k in range(num):
        i = ids[k]
        gen[i] += rounds
        nr[i] += rounds
        tok[i] += rounds
        nb = _blocks_for(tok[i], block_tokens)
        added += nb - blk[i]
        blk[i] = nb
        if gen[i] >= out[i]:
            fin[nf] = i
            nf += 1
    num_fin[0] = nf
    return added



cdef struct _Absorb:
    # what a block goes on past (a drafted or plain block's ``absorb``): completions, the kind of
    # what each sets off, Engine._finish's arrays, the log of it all for the caller (act: 0 a
    # completion, 1 a wait across events (Engine._advance's key for its end), 2 a remote prefill's
    # end, 3 an admission), their users' submissions as mirrored; and with ``events`` (kind 2:
    # plain blocks, and drafted ones at a fixed depth and k) the remote prefills' ends: the ones
    # in flight, the queue (the requests not refused from q_head on, q_len of them: submissions
    # are in id order), the next SimPy event besides them, and what a prefill's end and an
    # admission write
    i64 kind, next_req, n, idle, remote
    Py_ssize_t num, cap
    double think
    double* fin_at
    int8_t* status
    int8_t* act
    i64* ids
    double* at
    double* prefill
    char* refused
    bint events
    Py_ssize_t num_ev, cap_ev, num_wait
    double* ev_t
    i64* ev_eid
    i64* ev_id
    double other_next
    i64 q_head, q_len, next_eid, watermark, limit
    i64* wait
    i64* prompt
    char* transferred
    double* ready_at
    double* first_at
    double* admitted_at
    i64* target
    i64* prefilled


cdef int _read_absorb(object absorb, Py_ssize_t size, i64 waiting, i64 remote, _Absorb* ab) except -1:
    # a block's ``absorb`` argument (see drafted_block and plain_block), checked; kind 0 where None
    ab.kind, ab.num, ab.remote, ab.events, ab.num_wait, ab.num_ev, ab.q_len, ab.q_head = 0, 0, remote, False, 0, 0, 0, 0
    if absorb is None:
        return 0
    if type(absorb) is not tuple:
        raise TypeError(f"absorb: a tuple is required, got {type(absorb).__name__}")
    _check_fields(<tuple>absorb, "absorb", 13)
    ab.kind, ab.next_req, ab.n, ab.idle, ab.think = absorb[0], absorb[6], absorb[7], absorb[8], absorb[11]
    if not (1 <= ab.kind <= 3 and 0 <= ab.next_req <= ab.n == size and ab.idle >= 0 and 0.0 <= ab.think < INFINITY):
        raise ValueError(f"absorb: kind {ab.kind}, next request {ab.next_req} of {ab.n} ({size} requests), "
                         f"{ab.idle} idle prefill GPUs and think time {ab.think} are not a completion path's")
    if waiting != 0:
        raise ValueError(f"absorb: {waiting} requests wait for admission (completions are absorbed only where none "
                         "waits)")
    ab.fin_at = _f64(_w(<cnp.ndarray?>absorb[1], "finished_at"), "finished_at", size)
    _check_1d(<cnp.ndarray?>absorb[2], "status", cnp.NPY_INT8, "int8", size, True)
    ab.status = <int8_t*>cnp.PyArray_DATA(_w(<cnp.ndarray>absorb[2], "status"))
    _check_1d(<cnp.ndarray?>absorb[3], "actions", cnp.NPY_INT8, "int8", 4 * size + 8, True)
    ab.act = <int8_t*>cnp.PyArray_DATA(_w(<cnp.ndarray>absorb[3], "actions"))
    ab.cap = 4 * size + 8
    ab.ids = _i64(_w(<cnp.ndarray?>absorb[4], "action_ids"), "action_ids", ab.cap)
    ab.at = _f64(_w(<cnp.ndarray?>absorb[5], "action_at"), "action_at", ab.cap)
    ab.prefill = _f64(<cnp.ndarray?>absorb[9], "prefill_s", size)
    _check_1d(<cnp.ndarray?>absorb[10], "refused", cnp.NPY_BOOL, "bool", size, True)
    ab.refused = <char*>cnp.PyArray_DATA(<cnp.ndarray>absorb[10])
    cdef tuple ev = absorb[12]
    if ev is None:
        return 0
    if ab.kind != 2:
        raise ValueError(f"absorb: events with kind {ab.kind} (only closed-loop users going on at once to remote "
                         "prefill, kind 2)")
    _check_fields(ev, "events", 16)
    ab.events = True
    ab.num_ev, ab.other_next, ab.q_head, ab.q_len, ab.watermark, ab.limit = ev[3], ev[4], ev[5], ev[6], ev[7], ev[8]
    ab.cap_ev = cnp.PyArray_DIM(<cnp.ndarray?>ev[0], 0) if cnp.PyArray_NDIM(<cnp.ndarray?>ev[0]) == 1 else 0
    ab.ev_t = _f64(_w(<cnp.ndarray?>ev[0], "event_t"), "event_t", ab.cap_ev)
    ab.ev_eid = _i64(_w(<cnp.ndarray?>ev[1], "event_eid"), "event_eid", ab.cap_ev)
    ab.ev_id = _i64(_w(<cnp.ndarray?>ev[2], "event_id"), "event_id", ab.cap_ev)
    if not (0 <= ab.num_ev <= ab.cap_ev and ab.num_ev + ab.idle <= ab.cap_ev and ab.q_len >= 0 and ab.watermark >= 0
            and ab.limit >= 1 and not (ab.q_len and ab.idle) and 0 <= ab.q_head <= ab.next_req):
        raise ValueError(f"events: {ab.num_ev} in flight of {ab.cap_ev}, {ab.idle} idle, {ab.q_len} queued from "
                         f"{ab.q_head}, watermark {ab.watermark}, limit {ab.limit}: not a remote prefill pool's")
    cdef Py_ssize_t k
    cdef i64 queued = 0
    for k in range(ab.q_head, ab.next_req):
        queued += not ab.refused[k]
    if queued != ab.q_len or (ab.q_len and ab.refused[ab.q_head]):
        raise ValueError(f"events: {ab.q_len} queued from request {ab.q_head}, but {queued} not refused are "
                         f"submitted from there to {ab.next_req}")
    ab.next_eid = 0
    for k in range(ab.num_ev):
        if not (0 <= ab.ev_id[k] < size):
            raise IndexError(f"event_id: request id {ab.ev_id[k]} outside 0..{size - 1}")
        if ab.ev_eid[k] >= ab.next_eid:
            ab.next_eid = ab.ev_eid[k] + 1  # (a new event's id: after every one known, as SimPy's count)
    ab.wait = _i64(_w(<cnp.ndarray?>ev[9], "waiting"), "waiting", ab.cap_ev + 1, False)
    ab.prompt = _i64(<cnp.ndarray?>ev[10], "prompt", size)
    _check_1d(<cnp.ndarray?>ev[11], "transferred", cnp.NPY_BOOL, "bool", size, True)
    ab.transferred = <char*>cnp.PyArray_DATA(_w(<cnp.ndarray>ev[11], "transferred"))
    ab.ready_at = _f64(_w(<cnp.ndarray?>ev[12], "ready_at"), "ready_at", size)
    ab.first_at = _f64(_w(<cnp.ndarray?>ev[13], "first_token_at"), "first_token_at", size)
    ab.admitted_at = _f64(_w(<cnp.ndarray?>ev[14], "admitted_at"), "admitted_at", size)
    ab.target = _i64(_w(<cnp.ndarray?>ev[15][0], "prefill_target"), "prefill_target", size)
    ab.prefilled = _i64(_w(<cnp.ndarray?>ev[15][1], "prefilled"), "prefilled", size)
    return 0


cdef inline void _log_action(_Absorb* ab, int8_t code, i64 i, double t) noexcept nogil:
    ab.act[ab.num] = code
    ab.ids[ab.num] = i
    ab.at[ab.num] = t
    ab.num += 1


cdef inline double _next_known(_Absorb* ab, Py_ssize_t* at) noexcept nogil:
    # the first remote prefill end in flight, by (time, event id) as SimPy's queue orders them (at:
    # its slot; -1 and infinity for none)
    cdef Py_ssize_t k
    at[0] = -1
    for k in range(ab.num_ev):
        if at[0] < 0 or ab.ev_t[k] < ab.ev_t[at[0]] or (ab.ev_t[k] == ab.ev_t[at[0]] and ab.ev_eid[k] < ab.ev_eid[at[0]]):
            at[0] = k
    return INFINITY if at[0] < 0 else ab.ev_t[at[0]]


cdef inline void _start_prefill(_Absorb* ab, i64 j, double now, double* next_event) noexcept nogil:
    # Engine._start_remote_prefill: request j's prompt on a free GPU, its end an event
    cdef double t = now + ab.prefill[j]
    ab.idle -= 1
    if ab.events:
        ab.ev_t[ab.num_ev], ab.ev_eid[ab.num_ev], ab.ev_id[ab.num_ev] = t, ab.next_eid, j
        ab.num_ev += 1
        ab.next_eid += 1
    if t < next_event[0]:
        next_event[0] = t


cdef i64 _absorb_round(_Absorb* ab, i64* fin, Py_ssize_t nf, double now, i64* blk, i64* ids, Py_ssize_t* num_run,
                       double* next_event) noexcept nogil:
    # the completions fin[:nf] of a round that ended at now, absorbed: Engine._finish's array work
    # (finish time, status 3, KV blocks freed: returns how many), logged for the caller in order,
    # removed from the running ids (in order, as list.remove), and their users' submissions
    # mirrored (Engine._release_users): the next request not refused joins the remote prefill
    # queue, or a free GPU takes it and its end is an event; a think time's end is one
    cdef Py_ssize_t q, kept = 0
    cdef i64 i, j, freed = 0
    cdef double t
    for q in range(nf):
        i = fin[q]
        ab.fin_at[i] = now
        ab.status[i] = 3
        freed += blk[i]
        blk[i] = 0
        _log_action(ab, 0, i, now)
        if ab.kind == 2:
            while ab.next_req < ab.n:
                j = ab.next_req
                ab.next_req += 1
                if ab.refused[j]:
                    continue  # rejected as it arrives: it completes, and its user goes on
                ab.remote += 1
                if ab.idle > 0:
                    _start_prefill(ab, j, now, next_event)
                else:  # the queue's last
                    if ab.q_len == 0:
                        ab.q_head = j
                    ab.q_len += 1
                break
        elif ab.kind == 3:
            t = now + ab.think
            if t < next_event[0]:
                next_event[0] = t
    for q in range(num_run[0]):
        if ab.status[ids[q]] != 3:
            ids[kept] = ids[q]
            kept += 1
    num_run[0] = kept
    return freed


cdef bint _absorb_events(_Absorb* ab, double end, i64* out, i64* gen, double* next_event) noexcept nogil:
    # a pass that ended at end ran across events: where each is a remote prefill's end (Engine.
    # _remote_prefill_done) this mirror runs, run them in SimPy's order (the wait's key first):
    # its GPU takes the next queued prompt (an event: it must end after the pass) or goes idle,
    # and the request, its first token out, waits for admission. False, with nothing done, where
    # another event falls in the pass, a request would finish at its first token, or a prompt
    # started in the pass would end in it (SimPy's run of them is the caller's)
    cdef Py_ssize_t k, at, n_in = 0
    cdef i64 i, j, head
    cdef double t_ev
    if not ab.events or ab.other_next <= end or ab.num_wait + ab.num_ev > ab.cap_ev + 1:
        return False
    for k in range(ab.num_ev):
        if ab.ev_t[k] <= end:
            n_in += 1
            if out[ab.ev_id[k]] <= 1:
                return False
    # the prompts the GPUs take as they free up (the queue's first n_in) must end after the pass:
    # each starts at the pass's first event or later
    t_ev = _next_known(ab, &at)
    head = ab.q_head
    for k in range(n_in if n_in < ab.q_len else ab.q_len):
        while ab.refused[head]:
            head += 1
        if not (t_ev + ab.prefill[head] > end):
            return False
        head += 1
    _log_action(ab, 1, -1, end)
    while True:
        if _next_known(ab, &at) > end:
            break
        i, t_ev = ab.ev_id[at], ab.ev_t[at]
        ab.num_ev -= 1  # its slot takes the last one's
        ab.ev_t[at], ab.ev_eid[at], ab.ev_id[at] = ab.ev_t[ab.num_ev], ab.ev_eid[ab.num_ev], ab.ev_id[ab.num_ev]
        _log_action(ab, 2, i, t_ev)
        if ab.q_len > 0:  # this GPU takes the next prompt at once
            j = ab.q_head
            ab.q_len -= 1
            if ab.q_len:
                ab.q_head += 1
                while ab.refused[ab.q_head]:
                    ab.q_head += 1
            ab.idle += 1  # (_start_prefill takes it)
            _start_prefill(ab, j, t_ev, next_event)
        else:
            ab.idle += 1
        ab.remote -= 1
        ab.first_at[i] = t_ev
        gen[i] = 1
        ab.transferred[i] = 1
        ab.ready_at[i] = t_ev
        ab.status[i] = 1
        ab.wait[ab.num_wait] = i
        ab.num_wait += 1
    next_event[0] = ab.other_next
    if ab.num_ev:
        t_ev = _next_known(ab, &at)
        if t_ev < next_event[0]:
            next_event[0] = t_ev
    return True


cdef i64 _admit_waiting(_Absorb* ab, double now, i64* ids, Py_ssize_t* num_run, i64* tok, i64* blk, i64 block_tokens,
                        i64 capacity, i64* used) noexcept nogil:
    # Engine._admit (the kernels' admit) of the requests the absorbed prefill ends left waiting,
    # first come first served, while fewer than the limit run and each one's blocks fit with the
    # watermark kept free: their KV was transferred (the prompt's blocks, stored); returns how
    # many are left waiting (the caller stops there)
    cdef Py_ssize_t k, taken = 0
    cdef i64 i, need
    for k in range(ab.num_wait):
        i = ab.wait[k]
        need = _blocks_for(ab.prompt[i], block_tokens)
        if num_run[0] >= ab.limit or used[0] + need + (ab.watermark if num_run[0] else 0) > capacity or blk[i] != 0:
            break
        ab.status[i] = 2
        if ab.admitted_at[i] != ab.admitted_at[i]:
            ab.admitted_at[i] = now
        ab.target[i] = ab.prompt[i]
        ab.prefilled[i] = ab.prompt[i]
        blk[i] = need
        tok[i] = ab.prompt[i]
        used[0] += need
        ids[num_run[0]] = i
        num_run[0] += 1
        _log_action(ab, 3, i, now)
        taken += 1
    for k in range(taken, ab.num_wait):
        ab.wait[k - taken] = ab.wait[k]
    ab.num_wait -= taken
    return ab.num_wait


def plain_block(cnp.ndarray dec not None, cnp.ndarray tokens not None, cnp.ndarray kv_blocks not None,
                cnp.ndarray output not None, cnp.ndarray generated not None, cnp.ndarray num_rounds not None,
                i64 block_tokens, i64 capacity, i64 blocks_used, double now, double next_event, i64 ahead,
                i64 max_rounds, i64 max_rows, tuple price not None, tuple checks not None, list rows not None,
                tuple template not None, cnp.ndarray times not None, cnp.ndarray durations not None,
                cnp.ndarray verify_s not None, cnp.ndarray blocks not None, cnp.ndarray finished not None,
                object absorb=None, object prices=None):
    """A block of plain rounds in one call (``Engine._plain_run``): :func:`plain_plan`, the round
    checks of ``Engine._check_pass`` on the block's extremes, :func:`plain_apply` and
    :func:`plain_rows` (the rows only for blocks of at most ``max_rows`` rounds; longer ones the
    engine writes as columns). A block whose last round reaches ``next_event`` is applied too: the
    engine waits for that round's end in SimPy (the events inside its pass run then, and no
    callback reads the block's requests), then frees the requests it finished. Every value is the
    separate kernels', bit for bit.

    Args:
        dec: ``(R,)`` int64 ids of the decoding requests (R >= 1), all the running requests.
        tokens, kv_blocks, output, generated, num_rounds: ``(n,)`` int64 per-request stored KV
            tokens, KV blocks held, output lengths, tokens generated and rounds taken part in (the
            first two and the last two updated in place when the block is applied).
        block_tokens, capacity, blocks_used: KV block size in tokens, capacity and blocks in use.
        now, next_event: the clock and SimPy's next event time, s.
        ahead, max_rounds: caps on the rounds (the policy's plain rounds ahead; the block limit).
        max_rows: the longest block whose rows this call writes.
        price: ``Engine._plain_price``'s 9 fields (context term?, pass time without one, zero_ms,
            factor, a, q, b and c slopes, extrapolated flag).
        checks: ``(max_batch_tokens, block_gib, fixed_gib)``: the pass size limit, GiB a KV block,
            and GiB for KV and drafter after weights and reserve.
        rows: the round log's rows (tuples appended).
        template: a 29-field row (the log's column order) whose fields 2 (draft s), 22 (drafter
            GiB), 24 (head load s) and 27 (host overhead s) the round also costs or holds.
        times: float64 out, ``(max_rounds + 1,)`` or longer; durations, verify_s: float64 out and
            blocks: int64 out, ``(max_rounds,)`` or longer (:func:`plain_plan`'s).
        finished: int64 out, ``(R,)`` or longer: ids that finished, in ``dec`` order.
        absorb: None, or :func:`drafted_block`'s: a block of at most ``max_rows`` rounds that ends
            where requests finish (not at ``next_event``) goes on: the finished requests freed and
            logged (``absorb``'s arrays), the template's queues (fields 4, 7, 11, 12, 13, 25 and 28:
            decoding, batch, emitted, waiting, running, remote prefill, extrapolated) and pricing
            then those of the requests running, for at most ``max_rows`` (and ``max_rounds``) rounds
            in all (``ahead`` and the KV cache as above), while the KV blocks in use fit the
            capacity; ``finished`` and ``num_finished`` are then the last sub-block's. Its
            template's field 12 (waiting) must be 0. With
            ``events``, ``(event_t, event_eid, event_id, num_events, other_next, queue_head,
            queue_len, watermark, limit, waiting, prompt, transferred, ready_at, first_token_at,
            admitted_at, (prefill_target, prefilled))``: the remote prefills in flight (float64
            ends, int64 SimPy event ids and requests, the first ``num_events`` of arrays as long
            as the GPUs), the next other SimPy event, s, the prefill queue (every request not
            refused from ``queue_head`` to ``next_request``, ``queue_len`` of them), admission's
            watermark and limit, an int64 buffer of ``len(event_t) + 1`` for the requests waiting,
            and the per-request arrays a prefill's end and an admission write: a block whose last
            round's pass runs across events goes on where each is such an end this mirror runs
            (``Engine._remote_prefill_done``: the GPU takes the queue's first prompt, whose end must
            fall after the pass, or goes idle; the request's first token, one more to come), logged
            (code 1, the wait's key, then 2 for each end), then that round's completions, then at
            the round's end the waiting requests admitted as ``Engine._admit`` (code 3; one that
            does not fit stops the block there).
        prices: with ``absorb``, a list: ``Engine._plain_price``'s 9 fields at each batch size. A
            round whose batch size has no such tuple (not priced yet, or the list too short) is not
            run: the block stops before it, after the last round's completions are freed and logged
            (the caller prices that size and calls again).

    Returns:
        ``(code, rounds, kv_read_tokens, blocks_added, num_finished, absorbed)`` (the first pass's KV
        read, the KV blocks after the block less before it, ``absorbed`` as :func:`drafted_block`'s,
        or None without ``absorb``); code 0: not even one round
        fits the KV cache (nothing done); 1: planned, but a round check may fail (the engine runs
        ``Engine._check_pass``, which raises); 2 and 3: applied, its rows written if ``rounds <=
        max_rows``, the last with the KV after the block before finished requests free theirs; 3:
        the clock at its end is ``times[rounds]``; 2: its last round reaches ``next_event`` (the
        engine waits ``durations[rounds - 1]`` from ``times[rounds - 1]``).

    Raises:
        TypeError, ValueError, IndexError: arrays of the wrong type or length (or read-only where
            written), tuples of the wrong size, or bad ids.
        OverflowError: a pass size limit (the first of ``checks``) beyond a 64-bit integer.
    """
    if PyTuple_GET_SIZE(price) != 9 or PyTuple_GET_SIZE(checks) != 3 or PyTuple_GET_SIZE(template) != 29:
        raise ValueError(f"price, checks, template: 9, 3 and 29 fields needed, got {PyTuple_GET_SIZE(price)}, "
                         f"{PyTuple_GET_SIZE(checks)} and {PyTuple_GET_SIZE(template)}")
    cdef i64* ids = _i64(dec, "dec")
    cdef i64* tok = _i64(_w(tokens, "tokens"), "tokens")
    cdef Py_ssize_t num = cnp.PyArray_DIM(dec, 0), size = cnp.PyArray_DIM(tokens, 0), nf = 0
    cdef i64* blk = _i64(_w(kv_blocks, "kv_blocks"), "kv_blocks", size)
    cdef i64* out = _i64(output, "output", size)
    cdef i64* gen = _i64(_w(generated, "generated"), "generated", size)
    cdef i64* nr = _i64(_w(num_rounds, "num_rounds"), "num_rounds", size)
    if num < 1 or max_rounds < 1 or block_tokens < 1:
        raise ValueError(f"plain_block: needs >= 1 request, round and block token (got {num}, {max_rounds}, "
                         f"{block_tokens})")
    _check_ids(ids, num, size)
    cdef _PlanBuffers buf = _plan_buffers(times, durations, verify_s, blocks, max_rounds)
    cdef i64* fin = _i64(_w(finished, "finished"), "finished", num, False)
    cdef double draft_s = PyFloat_AsDouble(<object>PyTuple_GET_ITEM(template, 2))
    cdef double held_gib = PyFloat_AsDouble(<object>PyTuple_GET_ITEM(template, 22))
    cdef double head_load_s = PyFloat_AsDouble(<object>PyTuple_GET_ITEM(template, 24))
    cdef double overhead_s = PyFloat_AsDouble(<object>PyTuple_GET_ITEM(template, 27))
    cdef i64 max_b = PyLong_AsLongLong(<object>PyTuple_GET_ITEM(checks, 0))
    cdef double block_gib = PyFloat_AsDouble(<object>PyTuple_GET_ITEM(checks, 1))
    cdef double fixed_gib = PyFloat_AsDouble(<object>PyTuple_GET_ITEM(checks, 2))
    cdef _Absorb ab
    _read_absorb(absorb, size, PyLong_AsLongLong(<object>PyTuple_GET_ITEM(template, 12)),
                 PyLong_AsLongLong(<object>PyTuple_GET_ITEM(template, 25)), &ab)
    if ab.kind and type(prices) is not list:
        raise TypeError(f"prices: a list is required with absorb, got {type(prices).__name__}")
    cdef i64* own = NULL
    cdef Py_ssize_t room = num
    if ab.events and ab.limit > room:
        room = ab.limit if ab.limit < size else size  # (admissions: never more running than the limit, or requests)
    if ab.events:  # (checked before the copy below is allocated: a refusal leaks nothing)
        _check_1d(finished, "finished", cnp.NPY_INT64, "int64", room, False)
    if ab.kind:  # the running ids as the absorbed completions and admissions leave them (the caller's array stays)
        own = <i64*>PyMem_Malloc(room * sizeof(i64) + 1)
        if own == NULL:
            raise MemoryError()
        memcpy(own, ids, num * sizeof(i64))
        ids = own
    cdef i64 rounds, kv_read = 0, kv_read0 = 0, added, j, total = 0, used = blocks_used, sub_max = max_rounds
    cdef double now_s = now
    cdef int code = 3
    cdef bint go_on
    cdef Py_ssize_t rows_num
    cdef object tmpl = template, nxt
    cdef list fields
    try:
        while True:  # a sub-block: the block as without absorb, from the requests running now
            rounds = _plain_plan_core(
                ids, num, tok, out, gen, block_tokens, capacity, now_s, next_event, ahead - total, sub_max,
                0.0 + draft_s + overhead_s, <bint>price[0], PyFloat_AsDouble(<object>PyTuple_GET_ITEM(price, 1)),
                PyFloat_AsDouble(<object>PyTuple_GET_ITEM(price, 2)), PyFloat_AsDouble(<object>PyTuple_GET_ITEM(price, 3)),
                PyFloat_AsDouble(<object>PyTuple_GET_ITEM(price, 4)), PyFloat_AsDouble(<object>PyTuple_GET_ITEM(price, 5)),
                PyFloat_AsDouble(<object>PyTuple_GET_ITEM(price, 6)), PyFloat_AsDouble(<object>PyTuple_GET_ITEM(price, 7)),
                buf.times + total, buf.durations + total, buf.verify_s + total, buf.blocks + total, &kv_read)
            if total == 0:
                kv_read0 = kv_read
            if rounds < 1:
                if total == 0:
                    return 0, 0, kv_read, 0, 0, None
                break  # (after absorbed completions: the caller's next block finds the same)
            # Engine._check_pass on the extremes (the KV peak is the last round's): any doubt, and
            # that function decides (and raises) on the plan
            if (num > max_b or <double>buf.blocks[total + rounds - 1] * block_gib + held_gib > fixed_gib + 1e-9
                    or not (draft_s >= 0.0 and overhead_s >= 0.0 and head_load_s >= 0.0)):
                if total == 0:
                    return 1, rounds, kv_read, 0, 0, None
                break
            for j in range(total, total + rounds):
                if not (buf.verify_s[j] > 0.0 and buf.durations[j] < INFINITY):
                    if total == 0:
                        return 1, rounds, kv_read, 0, 0, None
                    rounds = 0
                    break
            if rounds == 0:
                break
            added = _plain_apply_core(ids, num, rounds, gen, nr, tok, blk, out, block_tokens, fin, &nf)
            used += added
            total += rounds
            code = 3 if next_event > buf.times[total] else 2
            # going on: a block of at most max_rows rounds (its rows written here) whose KV fits, past
            # its last round's completions, and past the events in that round's pass where they are
            # remote prefills' ends this mirror runs (the wait for the pass's end, then its completions)
            go_on = ab.kind and total <= max_rows and used <= capacity and (
                nf > 0 if code == 3 else _absorb_events(&ab, buf.times[total], out, gen, &next_event))
            rows_num = num
            if go_on and nf:  # freed before the sub-block's last row is written (its KV after)
                used -= _absorb_round(&ab, fin, nf, buf.times[total], blk, ids, &num, &next_event)
                nf = 0
            if total <= max_rows:
                _plain_rows_core(rows, tmpl, buf.times + total - rounds, buf.durations + total - rounds,
                                 buf.verify_s + total - rounds, buf.blocks + total - rounds, rounds, used,
                                 kv_read, rows_num)
            if not go_on:
                break
            code = 3  # (the events and completions are the caller's to replay: nothing left pending)
            now_s = buf.times[total]
            if ab.num_wait and _admit_waiting(&ab, now_s, ids, &num, tok, blk, block_tokens, capacity, &used):
                break  # one cannot be admitted: the round path's admission waits as well
            sub_max = (max_rows if max_rows < max_rounds else max_rounds) - total  # (the plan buffers' length)
            if num < 1 or sub_max < 1 or ahead - total < 1:
                break
            nxt = <object>PyList_GET_ITEM(prices, num) if num < PyList_GET_SIZE(prices) else None
            if not (type(nxt) is tuple and PyTuple_GET_SIZE(nxt) == 9):
                break  # not priced at this batch yet: the caller prices it
            price = <tuple>nxt
            fields = list(tmpl)  # the requests running now: their queues and pricing
            fields[4] = fields[7] = fields[11] = fields[13] = num
            fields[12] = 0
            fields[25] = ab.remote
            fields[28] = price[8]
            tmpl = tuple(fields)
    finally:
        PyMem_Free(own)
    return code, total, kv_read0, used - blocks_used, nf, (ab.num, ab.next_req, ab.idle, ab.remote, ab.num_wait,
                                                           ab.q_len if ab.events else -1) if ab.kind else None


cdef inline void _merge_front(double* sv, i64* sr, double* dv, i64* dr, Py_ssize_t i, Py_ssize_t ie,
                              Py_ssize_t j, Py_ssize_t je, Py_ssize_t o, Py_ssize_t stop) noexcept nogil:
    # the first outputs o..stop-1 of the stable descending merge of sv[i:ie] and sv[j:je]
    cdef Py_ssize_t m, right
    while i < ie and j < je and o < stop:
        # branch-free (an index select, not a jump: the order is data, so jumps mispredict);
        # strictly larger: ties keep the left (earlier) run first
        right = sv[j] > sv[i]
        m = j if right else i
        dv[o] = sv[m]
        dr[o] = sr[m]
        j += right
        i += 1 - right
        o += 1
    while i < ie and o < stop:
        dv[o] = sv[i]
        dr[o] = sr[i]
        i += 1
        o += 1
    while j < je and o < stop:
        dv[o] = sv[j]
        dr[o] = sr[j]
        j += 1
        o += 1


cdef inline void _merge_pair(double* sv, i64* sr, double* dv, i64* dr, Py_ssize_t i0, Py_ssize_t ie,
                             Py_ssize_t je) noexcept nogil:
    # the stable descending merge of sv[i0:ie] and sv[ie:je] into dv[i0:je], from both ends at once
    # (two independent chains of loads and selects): the front takes the larger, the left on ties;
    # the back takes the smaller, the right on ties (it comes later); each writes its own half
    # front: cursors i (left run), j (right run), output o; back: cursors a (left), b (right),
    # output p; right / left: whether the front takes from the right run / the back from the left
    cdef Py_ssize_t half = i0 + (je - i0) // 2, i = i0, j = ie, o = i0
    cdef Py_ssize_t a = ie - 1, b = je - 1, p = je - 1, m, right, left
    while i < ie and j < je and o < half and a >= i0 and b >= ie and p >= half:
        right = sv[j] > sv[i]
        m = j if right else i
        dv[o] = sv[m]
        dr[o] = sr[m]
        j += right
        i += 1 - right
        o += 1
        left = sv[a] < sv[b]  # strictly smaller: ties put the right run's last first
        m = a if left else b
        dv[p] = sv[m]
        dr[p] = sr[m]
        a -= left
        b -= 1 - left
        p -= 1
    _merge_front(sv, sr, dv, dr, i, ie, j, je, o, half)
    while a >= i0 and b >= ie and p >= half:
        left = sv[a] < sv[b]
        m = a if left else b
        dv[p] = sv[m]
        dr[p] = sr[m]
        a -= left
        b -= 1 - left
        p -= 1
    while a >= i0 and p >= half:
        dv[p] = sv[a]
        dr[p] = sr[a]
        a -= 1
        p -= 1
    while b >= ie and p >= half:
        dv[p] = sv[b]
        dr[p] = sr[b]
        b -= 1
        p -= 1


cdef Py_ssize_t _merge_runs(double* val, i64* row, double* val2, i64* row2, i64* bounds, Py_ssize_t runs,
                            Py_ssize_t need) noexcept nogil:
    # Sort the candidates val[0:bounds[runs]] (with their rows) by descending value, ties to the
    # earlier candidate, given runs that each descend: bottom-up merges of neighbouring runs, the
    # left run first on ties, so the order is a stable sort of -val (candidates are in row-major
    # order, so ties go to the lower row, and within a row to the lower position). The last merge
    # stops after ``need`` candidates. Returns 0 if the result is in val/row, 1 if in val2/row2.
    cdef Py_ssize_t k, i, ie, je, out_runs
    cdef int where = 0
    cdef double* sv
    cdef i64* sr
    cdef double* dv
    cdef i64* dr
    while runs > 1:
        sv, sr = (val, row) if where == 0 else (val2, row2)
        dv, dr = (val2, row2) if where == 0 else (val, row)
        out_runs = 0
        k = 0
        while k < runs:
            i, ie = bounds[k], bounds[k + 1]
            je = bounds[k + 2] if k + 1 < runs else ie
            if runs <= 2 and need < je:  # the last merge: only the candidates the scan reads
                _merge_front(sv, sr, dv, dr, i, ie, ie, je, i, need)
            else:
                _merge_pair(sv, sr, dv, dr, i, ie, je)
            bounds[out_runs] = bounds[k]
            out_runs += 1
            k += 2
        bounds[out_runs] = bounds[runs]
        runs = out_runs
        where = 1 - where
    return where


cdef Py_ssize_t _positive_candidates(double* v, Py_ssize_t num_req, Py_ssize_t width, double t, double* cand,
                                     i64* rows, i64* bounds, i64* out, Py_ssize_t* at_least_t) noexcept nogil:
    # the joint survivals (each row's running product, left to right, as np.cumprod) that are
    # positive, in row-major order with their rows, each row's run in [bounds[r], bounds[r + 1]),
    # and out[r] = 0; *at_least_t: how many are >= t. Returns their count, or -1 for a confidence
    # outside [0, 1] (NaN included). Only drafts with positive probability are candidates
    # (Algorithm 1), and a row's positive survivals are its prefix.
    cdef Py_ssize_t r, j, n = 0, above = 0
    cdef double s
    cdef bint in_range = True
    for r in range(num_req):
        s = 1.0
        bounds[r] = n
        for j in range(width):
            in_range = in_range and 0.0 <= v[r * width + j] <= 1.0
            s = s * v[r * width + j]
            if s > 0.0:
                cand[n] = s
                rows[n] = r
                n += 1
                above += s >= t
        out[r] = 0
    bounds[num_req] = n
    at_least_t[0] = above
    return n if in_range else -1


cdef struct _Scan:
    # prefix_scan's results (see there); in_range False: a confidence outside [0, 1], nothing scanned
    Py_ssize_t n_star, n_cov, n_max, best
    double theta_star, tau_star, theta_best
    bint in_range


cdef _Scan _scan_core(double* v, Py_ssize_t num_req, Py_ssize_t width, double* t, double overhead_s,
                      bint has_no_draft_pass, double no_draft_pass_s, i64 n_limit, i64 n_cov_limit, bint early_stop,
                      i64* out, double* a, i64* picked) noexcept nogil:
    # prefix_scan's work on checked pointers; a: 2*R*L doubles, picked: 2*R*L + R + 1 int64 scratch
    cdef _Scan res
    cdef Py_ssize_t total = num_req * width
    cdef Py_ssize_t n, n_max, n_cov, n_star, best, unused
    cdef double s, tau, theta, prev, theta_best, tau_best, theta_star, tau_star
    cdef bint found = False, nan_best
    cdef double* cand = a  # the positive survivals in row-major order, then merged (two buffers)
    cdef i64* rows = picked
    cdef i64* bounds = picked + 2 * total  # each row's run of candidates: [bounds[r], bounds[r + 1])
    n_max = _positive_candidates(v, num_req, width, INFINITY, cand, rows, bounds, out, &unused)
    res.in_range = n_max >= 0
    if not res.in_range:
        return res
    if n_max > n_limit:
        n_max = n_limit
    n_cov = n_max if n_max < n_cov_limit else n_cov_limit
    if _merge_runs(cand, rows, cand + total, rows + total, bounds, num_req, n_cov) == 1:
        cand, rows = cand + total, rows + total
    # the scan; n = 0 is the anchors alone
    tau = <double>num_req
    theta = tau / (overhead_s + (no_draft_pass_s if has_no_draft_pass else t[0]))
    theta_best, tau_best, best, nan_best = theta, tau, 0, theta != theta
    theta_star, tau_star, n_star = theta, tau, 0
    prev = theta
    s = 0.0
    for n in range(1, n_cov + 1):
        s = s + cand[n - 1]
        tau = s + <double>num_req
        theta = tau / (overhead_s + t[n])
        if not nan_best:  # np.argmax: the first maximum, or the first NaN
            if theta != theta:
                theta_best, tau_best, best, nan_best = theta, tau, n, True
            elif theta > theta_best:
                theta_best, tau_best, best = theta, tau, n
        if early_stop and not found:
            if theta <= prev:
                found = True  # the first candidate that does not raise theta: stop before it
            else:
                n_star, theta_star, tau_star = n, theta, tau
        prev = theta
    if not early_stop:
        n_star, theta_star, tau_star = best, theta_best, tau_best
    elif not found:
        n_star = n_cov  # no candidate among those priced failed to raise theta
    for n in range(n_star):
        out[rows[n]] += 1
    res.n_star, res.n_cov, res.n_max, res.best = n_star, n_cov, n_max, best
    res.theta_star, res.tau_star, res.theta_best = theta_star, tau_star, theta_best
    return res


def prefix_scan(cnp.ndarray vals not None, cnp.ndarray times not None, double overhead_s, bint has_no_draft_pass,
                double no_draft_pass_s, i64 n_limit, i64 n_cov_limit, bint early_stop, cnp.ndarray lengths not None):
    """DSpark's hardware-aware prefix scheduler (paper Algorithm 1) on one round's confidences,
    the engine's path of ``policies.dspark._schedule`` bit for bit.

    Candidates (r, j) are ranked by joint survival ``a[r, j] = prod(vals[r, :j+1])`` (descending,
    ties in row-major order) by branch-free bottom-up merges of the rows (each is non-increasing),
    the last of which stops after the candidates the scan reads. Admitting the first n gives
    ``tau_n = R + sum of their a`` and ``theta_n = tau_n / (overhead_s + times[n])``.

    Args:
        vals: ``(R, L)`` float64 C-contiguous confidences in [0, 1] (R >= 1, L >= 1; checked).
        times: float64 pass times of B = base .. base + ``n_cov_limit``, s (element n: n drafts).
        overhead_s: the round's fixed time besides the pass (drafting), s.
        has_no_draft_pass, no_draft_pass_s: whether the pass time with no drafts replaces
            ``times[0]``, and that time, s.
        n_limit: the most candidates the pass holds (max batch tokens minus the anchors and prefill).
        n_cov_limit: the most candidates the table prices (``times`` has ``n_cov_limit + 1``).
        early_stop: stop at the first candidate that does not raise theta (else the global best).
        lengths: int64 out ``(R,)``: drafts each request verifies.

    Returns:
        ``(n_star, n_cov, n_max, best, theta_star, tau_star, theta_best)``: candidates admitted,
        candidates priced, candidates with positive survival within ``n_limit``, the global
        search's count, and Theta (tok/s) and tau (tokens) at ``n_star`` and Theta at ``best``.
        The caller raises when ``n_cov < n_max`` and the scan needed more: the global search, or
        early stop with ``n_star == n_cov`` (no candidate failed to raise Theta).

    Raises:
        TypeError, ValueError: arrays of the wrong type or size, or a confidence outside [0, 1].

    Source:
        DSpark paper (Cheng et al. 2026) Algorithm 1; docs/model.md section 1 step 3.
    """
    if cnp.PyArray_TYPE(vals) != cnp.NPY_FLOAT64 or not cnp.PyArray_IS_C_CONTIGUOUS(vals) or cnp.PyArray_NDIM(vals) != 2:
        raise TypeError(f"vals: a C-contiguous 2-D float64 array is required, got {_layout(vals)}")
    cdef Py_ssize_t num_req = cnp.PyArray_DIM(vals, 0), width = cnp.PyArray_DIM(vals, 1), total = num_req * width
    if num_req < 1 or width < 1:
        raise ValueError(f"vals: at least one request and position needed, got shape ({num_req}, {width})")
    if n_cov_limit < 0:
        raise ValueError(f"n_cov_limit: must be >= 0, got {n_cov_limit}")
    cdef double* v = <double*>cnp.PyArray_DATA(vals)
    cdef double* t = _f64(times, "times", n_cov_limit + 1, False)
    cdef i64* out = _i64(_w(lengths, "lengths"), "lengths", num_req)

    # scratch: the candidates' survivals and rows, twice (the merge's two buffers), and the runs' bounds
    cdef double* a = <double*>PyMem_Malloc(2 * total * sizeof(double))
    cdef i64* picked = <i64*>PyMem_Malloc((2 * total + num_req + 1) * sizeof(i64))
    if a == NULL or picked == NULL:
        PyMem_Free(a)
        PyMem_Free(picked)
        raise MemoryError()
    cdef _Scan res
    with nogil:
        res = _scan_core(v, num_req, width, t, overhead_s, has_no_draft_pass, no_draft_pass_s, n_limit, n_cov_limit,
                         early_stop, out, a, picked)
    PyMem_Free(a)
    PyMem_Free(picked)
    if not res.in_range:
        raise ValueError("vals: confidences must lie in [0, 1]")
    return res.n_star, res.n_cov, res.n_max, res.best, res.theta_star, res.tau_star, res.theta_best


cdef inline void* _data_2d(cnp.ndarray a, str name, int dtype, str kind, Py_ssize_t rows, Py_ssize_t cols) except NULL:
    # a C-contiguous (rows, cols) array of the dtype (the 2-D counterpart of _check_1d)
    if cnp.PyArray_TYPE(a) != dtype or not cnp.PyArray_IS_C_CONTIGUOUS(a) or cnp.PyArray_NDIM(a) != 2:
        raise TypeError(f"{name}: a C-contiguous 2-D {kind} array is required, got {_layout(a)}")
    if cnp.PyArray_DIM(a, 0) != rows or cnp.PyArray_DIM(a, 1) != cols:
        raise ValueError(f"{name}: shape ({rows}, {cols}) needed, got ({cnp.PyArray_DIM(a, 0)}, {cnp.PyArray_DIM(a, 1)})")
    return cnp.PyArray_DATA(a)


cdef inline double* _f64_2d(cnp.ndarray a, str name, Py_ssize_t rows, Py_ssize_t cols) except NULL:
    return <double*>_data_2d(a, name, cnp.NPY_FLOAT64, "float64", rows, cols)


cdef inline double _expit(double x) noexcept nogil:
    # scipy.special.expit's formula, 1 / (1 + exp(-x)), on the same libm exp
    return 1.0 / (1.0 + exp(-x))


cdef inline double* _f64_or_null(object a, str name, Py_ssize_t need) except? NULL:
    # None -> NULL, else a float64 array of exactly ``need`` elements
    if a is None:
        return NULL
    return _f64(<cnp.ndarray?>a, name, need)


cdef void _confidences_core(i64* ids, Py_ssize_t num, Py_ssize_t width, i64* dom, double* diff, double* m,
                            double* sl, double* bs, double* ro, double* sh, double* z, bint oracle,
                            double overconfidence, double* t, double* p, double* rw, double* c) noexcept nogil:
    # draft_confidences' work on checked pointers (NULL for the absent optional arrays)
    cdef Py_ssize_t k, j
    cdef i64 i, d
    cdef double off, lg, r
    for k in range(num):
        i = ids[k]
        d = dom[i]
        if bs == NULL:
            off = m[d] + diff[i]
        else:
            off = diff[i]
        if ro != NULL:
            off = off + ro[k]
        for j in range(width):
            if bs == NULL:
                lg = off + sl[d] * <double>j
            else:
                lg = bs[d * width + j] + off
            if sh != NULL:
                lg = lg + sh[k]
            p[k * width + j] = _expit(lg)
            if oracle:
                r = lg
            elif z != NULL:
                r = overconfidence * (lg + z[k * width + j])
            else:
                r = overconfidence * lg
            rw[k * width + j] = r
            c[k * width + j] = _expit(r / t[j])


def draft_confidences(cnp.ndarray dec not None, cnp.ndarray domain not None, cnp.ndarray difficulty not None,
                      object round_offset, cnp.ndarray mu not None, cnp.ndarray slope not None, object base,
                      object shift, object noise, bint oracle, double overconfidence, cnp.ndarray temps not None,
                      cnp.ndarray probs not None, cnp.ndarray raw not None, cnp.ndarray conf not None):
    """Steps 4-5 of a drafted round before the plan (``Engine._draft_and_plan``): the true
    acceptance logits of every drafted position, their probabilities, the head's raw logits and
    the calibrated confidences, in one pass (``AcceptanceModel.round_logits``, the drift shift,
    ``ConfidenceHead.raw_logits`` and the two ``expit`` calls, the same operations in the same order).

    Logit of request ``i = dec[k]`` (domain ``d``) at position ``j`` (0-based):
    linear kind ``((mu[d] + difficulty[i]) + round_offset[k]) + slope[d] * j``; per-position kind
    ``base[d, j] + (difficulty[i] + round_offset[k])``; then ``+ shift[k]``. Probability
    ``expit(logit)``; raw ``logit`` (oracle) or ``overconfidence * (logit + noise[k, j])``;
    confidence ``expit(raw / temps[j])`` (docs/model.md section 1 steps 4-5; DSpark paper Fig. 6).

    Args:
        dec: ``(R,)`` int64 request ids.
        domain: ``(n,)`` int64 domain index of every request; difficulty: ``(n,)`` float64 offsets.
        round_offset: None or ``(R,)`` float64 this round's offsets (drawn by the caller).
        mu, slope: ``(D,)`` float64 per-domain base logit and slope (linear kind).
        base: None (linear kind) or ``(D, L)`` float64 per-position base logits.
        shift: None or ``(R,)`` float64 drift shift of each request's logits.
        noise: None or ``(R, L)`` float64 head noise (drawn by the caller); ignored when ``oracle``.
        oracle: the head reports the true logits.
        overconfidence: the head's logit gain.
        temps: ``(L,)`` or longer float64 per-position temperatures.
        probs, raw, conf: float64 out ``(R, L)``.

    Raises:
        TypeError, ValueError, IndexError: arrays of the wrong type or shape, bad ids or domains.
    """
    cdef i64* ids = _i64(dec, "dec")
    cdef i64* dom = _i64(domain, "domain")
    cdef double* m = _f64(mu, "mu")
    cdef Py_ssize_t num = cnp.PyArray_DIM(dec, 0), size = cnp.PyArray_DIM(domain, 0), k, j
    cdef Py_ssize_t num_dom = cnp.PyArray_DIM(mu, 0)
    if cnp.PyArray_NDIM(probs) != 2:
        raise TypeError(f"probs: a C-contiguous 2-D float64 array is required, got {_layout(probs)}")
    cdef Py_ssize_t width = cnp.PyArray_DIM(probs, 1)
    cdef double* p = _f64_2d(_w(probs, "probs"), "probs", num, width)
    cdef double* rw = _f64_2d(_w(raw, "raw"), "raw", num, width)
    cdef double* c = _f64_2d(_w(conf, "conf"), "conf", num, width)
    cdef double* diff = _f64(difficulty, "difficulty", size)
    cdef double* sl = _f64(slope, "slope", num_dom)
    cdef double* t = _f64(temps, "temps", width, False)
    cdef double* ro = _f64_or_null(round_offset, "round_offset", num)
    cdef double* sh = _f64_or_null(shift, "shift", num)
    cdef double* bs = NULL
    if base is not None:
        bs = _f64_2d(<cnp.ndarray?>base, "base", num_dom, width)
    cdef double* z = NULL
    if noise is not None and not oracle:
        z = _f64_2d(<cnp.ndarray?>noise, "noise", num, width)
    _check_ids(ids, num, size)
    for k in range(num):
        if dom[ids[k]] < 0 or dom[ids[k]] >= num_dom:
            raise IndexError(f"domain {dom[ids[k]]} of request {ids[k]} outside 0..{num_dom - 1}")
    with nogil:
        _confidences_core(ids, num, width, dom, diff, m, sl, bs, ro, sh, z, oracle, overconfidence, t, p, rw, c)

cdef void _accept_core(i64* ids, Py_ssize_t num, Py_ssize_t width, double* draw, double* p, i64* lens, i64* gen,
                       i64* out, i64* nr, i64* ver, i64* acd, i64* tok, i64* blk, i64 block_tokens, i64* a_out,
                       char* w, i64* fin, i64* totals) noexcept nogil:
    # accept_apply's work on checked pointers (w NULL: no diagnostics); totals out: accepted,
    # emitted, blocks added, finished
    cdef Py_ssize_t k, j
    cdef i64 i, run, emit, nb, accepted_total = 0, emitted_total = 0, added = 0
    cdef Py_ssize_t nf = 0
    cdef bint ok
    for k in range(num):
        run = 0
        ok = True
        for j in range(width):
            ok = ok and draw[k * width + j] < p[k * width + j]
            if ok:
                run += 1
            if w != NULL:
                w[k * width + j] = ok
            elif not ok:
                break
        if run > lens[k]:
            run = lens[k]  # the accepted run, within the verified drafts
        a_out[k] = run
        accepted_total += run
        i = ids[k]
        emit = run + 1
        if out[i] - gen[i] < emit:
            emit = out[i] - gen[i]
        emitted_total += emit
        gen[i] += emit
        tok[i] += emit
        nb = _blocks_for(tok[i], block_tokens)
        added += nb - blk[i]
        blk[i] = nb
        nr[i] += 1
        ver[i] += lens[k]
        acd[i] += run
        if gen[i] >= out[i]:
            fin[nf] = i
            nf += 1
    totals[0], totals[1], totals[2], totals[3] = accepted_total, emitted_total, added, nf


def accept_apply(cnp.ndarray dec not None, cnp.ndarray u not None, cnp.ndarray probs not None,
                 cnp.ndarray lengths not None, cnp.ndarray generated not None, cnp.ndarray output not None,
                 cnp.ndarray num_rounds not None, cnp.ndarray verified not None, cnp.ndarray accepted not None,
                 cnp.ndarray tokens not None, cnp.ndarray blocks not None, i64 block_tokens, cnp.ndarray acc not None,
                 object would, cnp.ndarray finished not None):
    """Step 7 of a drafted round for the decoding requests (``Engine._accept``): which drafts the
    target accepts, and the tokens each request keeps.

    Draft position j of request r is accepted when ``u[r, j] < probs[r, j]`` and every position
    before it was; a request keeps its leading accepted drafts among the ``lengths[r]`` verified
    plus one bonus token, capped at its remaining output (docs/model.md section 1 step 5), and
    stores them in its KV cache (``KVCacheManager.append``).

    Args:
        dec: ``(R,)`` int64 request ids.
        u: ``(R, L)`` float64 uniform draws in [0, 1) (the run's generator, drawn by the caller).
        probs: ``(R, L)`` float64 acceptance probability of each draft position.
        lengths: ``(R,)`` int64 drafts verified per request (``0..L``).
        generated, output, num_rounds, verified, accepted, tokens, blocks: ``(n,)`` int64
            per-request counters (output lengths read only), updated in place.
        block_tokens: tokens per KV block.
        acc: int64 out ``(R,)``: accepted drafts per request (verified and accepted).
        would: None, or bool out ``(R, L)``: whether each position would be accepted (every
            position up to it accepted), verified or not (calibration diagnostics).
        finished: int64 out, ``(R,)`` or longer: ids that reached their output, in ``dec`` order.

    Returns:
        ``(accepted_total, emitted_total, blocks_added, num_finished)``.

    Raises:
        TypeError, ValueError, IndexError: arrays of the wrong type or shape, or bad ids.
    """
    cdef i64* ids = _i64(dec, "dec")
    cdef i64* gen = _i64(_w(generated, "generated"), "generated")
    cdef Py_ssize_t num = cnp.PyArray_DIM(dec, 0), size = cnp.PyArray_DIM(generated, 0), k, j
    if cnp.PyArray_NDIM(u) != 2:
        raise TypeError(f"u: a C-contiguous 2-D float64 array is required, got {_layout(u)}")
    cdef Py_ssize_t width = cnp.PyArray_DIM(u, 1)
    cdef double* draw = _f64_2d(u, "u", num, width)
    cdef double* p = _f64_2d(probs, "probs", num, width)
    cdef i64* lens = _i64(lengths, "lengths", num)
    cdef i64* out = _i64(output, "output", size)
    cdef i64* nr = _i64(_w(num_rounds, "num_rounds"), "num_rounds", size)
    cdef i64* ver = _i64(_w(verified, "verified"), "verified", size)
    cdef i64* acd = _i64(_w(accepted, "accepted"), "accepted", size)
    cdef i64* tok = _i64(_w(tokens, "tokens"), "tokens", size)
    cdef i64* blk = _i64(_w(blocks, "blocks"), "blocks", size)
    cdef i64* a_out = _i64(_w(acc, "acc"), "acc", num)
    cdef i64* fin = _i64(_w(finished, "finished"), "finished", num, False)
    _check_block_tokens(block_tokens)
    cdef char* w = NULL
    if would is not None:
        w = <char*>_data_2d(_w(<cnp.ndarray?>would, "would"), "would", cnp.NPY_BOOL, "bool", num, width)
    _check_ids(ids, num, size)
    for k in range(num):
        if lens[k] < 0 or lens[k] > width:
            raise ValueError(f"lengths: {lens[k]} outside 0..{width}")
    cdef i64 totals[4]
    with nogil:
        _accept_core(ids, num, width, draw, p, lens, gen, out, nr, ver, acd, tok, blk, block_tokens, a_out, w, fin,
                     totals)
    return totals[0], totals[1], totals[2], totals[3]


def lookahead_total(cnp.ndarray reqs not None, cnp.ndarray tokens not None, cnp.ndarray blocks not None,
                    i64 block_tokens, i64 add, object add_each):
    """New KV blocks the requests ``reqs`` need in all to store ``add`` (plus ``add_each[k]``)
    more tokens each (``KVCacheManager.lookahead_blocks`` summed).

    Args:
        reqs: ``(R,)`` int64 request ids.
        tokens, blocks: ``(n,)`` int64 stored tokens and blocks held per request.
        block_tokens: tokens per KV block (>= 1).
        add: tokens every request adds.
        add_each: None, or ``(R,)`` int64 tokens each request adds besides ``add``.

    Returns:
        int, the sum over ``reqs`` of ``ceil((tokens + add + add_each) / block_tokens) - blocks``.

    Raises:
        TypeError, ValueError, IndexError: arrays of the wrong type or length, or bad ids.
    """
    cdef i64* ids = _i64(reqs, "reqs")
    cdef i64* tok = _i64(tokens, "tokens")
    cdef Py_ssize_t n = cnp.PyArray_DIM(reqs, 0), size = cnp.PyArray_DIM(tokens, 0), k
    cdef i64* blk = _i64(blocks, "blocks", size)
    _check_block_tokens(block_tokens)
    cdef i64* each = NULL
    if add_each is not None:
        each = _i64(<cnp.ndarray?>add_each, "add_each", n)
    _check_ids(ids, n, size)
    cdef i64 total = 0, more
    for k in range(n):
        more = add + (each[k] if each != NULL else 0)
        total += _blocks_for(tok[ids[k]] + more, block_tokens) - blk[ids[k]]
    return total


cdef i64 _place_core(i64* ids, Py_ssize_t n, i64* done, i64* want, i64 limit, i64* out) noexcept nogil:
    # place_prefill's work on checked pointers: the chunks' total
    cdef Py_ssize_t k
    cdef i64 before = 0, left, room, total = 0
    for k in range(n):
        left = want[ids[k]] - done[ids[k]]
        room = limit - before  # what the requests before it left over
        if room < 0:
            room = 0
        out[k] = room if room < left else left
        total += out[k]
        before += left
    return total


def place_prefill(cnp.ndarray pre not None, cnp.ndarray prefilled not None, cnp.ndarray target not None, i64 limit,
                  cnp.ndarray chunks not None):
    """Chunked prefill (``Engine._place_prefill``): the prefilling requests, first admitted first,
    share ``limit`` prompt tokens; each takes what it has left, up to what the ones before it left
    over (docs/model.md section 1 step 3).

    Args:
        pre: ``(P,)`` int64 ids of the prefilling requests, in admission order.
        prefilled, target: ``(n,)`` int64 prompt tokens computed so far and to compute.
        limit: prompt tokens this pass takes in all (>= 0).
        chunks: int64 out ``(P,)``: each request's chunk.

    Returns:
        int, the chunks' total.

    Raises:
        TypeError, ValueError, IndexError: arrays of the wrong type or length, or bad ids.
    """
    cdef i64* ids = _i64(pre, "pre")
    cdef i64* done = _i64(prefilled, "prefilled")
    cdef Py_ssize_t n = cnp.PyArray_DIM(pre, 0), size = cnp.PyArray_DIM(prefilled, 0), k
    cdef i64* want = _i64(target, "target", size)
    cdef i64* out = _i64(_w(chunks, "chunks"), "chunks", n)
    _check_ids(ids, n, size)
    return _place_core(ids, n, done, want, limit, out)


cdef Py_ssize_t _prefill_core(i64* ids, Py_ssize_t n, i64* ch, i64* done, i64* want, i64* tok, i64* gen, i64* out,
                              double* first, double now, i64* fin, Py_ssize_t nf, i64* counts) noexcept nogil:
    # prefill_apply's work on checked pointers: appends to fin from nf on and returns its new
    # length; counts out: requests that prefilled, prompts completed
    cdef Py_ssize_t k
    cdef i64 i, num_prefill = 0, completed = 0
    for k in range(n):
        i = ids[k]
        if ch[k] != 0:
            num_prefill += 1
        done[i] += ch[k]
        tok[i] += ch[k]
    for k in range(n):  # after every chunk is stored, as the numpy code does
        i = ids[k]
        if done[i] >= want[i]:
            completed += 1
            gen[i] += 1
            if first[i] != first[i]:
                first[i] = now
            if gen[i] >= out[i]:
                fin[nf] = i
                nf += 1
    counts[0], counts[1] = num_prefill, completed
    return nf


def prefill_apply(cnp.ndarray pre not None, cnp.ndarray chunks not None, cnp.ndarray prefilled not None,
                  cnp.ndarray target not None, cnp.ndarray tokens not None, cnp.ndarray generated not None,
                  cnp.ndarray output not None, cnp.ndarray first_token_at not None, double now,
                  cnp.ndarray finished not None):
    """Store a pass's prefill chunks (``Engine._advance_prefill``): a request whose prefill
    completes emits its first token (the pass's last logits), and is listed when that was its
    whole output.

    Args:
        pre: ``(P,)`` int64 ids of the prefilling requests.
        chunks: ``(P,)`` int64 prompt tokens each computed in this pass.
        prefilled, target, tokens, generated, output: ``(n,)`` int64 per-request counters
            (target and output read only), updated in place.
        first_token_at: ``(n,)`` float64 first-token times (NaN until then), updated in place.
        now: the clock, s.
        finished: int64 out, ``(P,)`` or longer: ids that finished, in ``pre`` order.

    Returns:
        ``(num_prefill, num_completed, num_finished)``: requests with a chunk, requests whose
        prefill completed (one token emitted each), ids written to ``finished``.

    Raises:
        TypeError, ValueError, IndexError: arrays of the wrong type or length, or bad ids.
    """
    cdef i64* ids = _i64(pre, "pre")
    cdef i64* done = _i64(_w(prefilled, "prefilled"), "prefilled")
    cdef Py_ssize_t n = cnp.PyArray_DIM(pre, 0), size = cnp.PyArray_DIM(prefilled, 0), k
    cdef i64* ch = _i64(chunks, "chunks", n)
    cdef i64* want = _i64(target, "target", size)
    cdef i64* tok = _i64(_w(tokens, "tokens"), "tokens", size)
    cdef i64* gen = _i64(_w(generated, "generated"), "generated", size)
    cdef i64* out = _i64(output, "output", size)
    cdef double* first = _f64(_w(first_token_at, "first_token_at"), "first_token_at", size)
    cdef i64* fin = _i64(_w(finished, "finished"), "finished", n, False)
    _check_ids(ids, n, size)
    cdef i64 counts[2]
    cdef Py_ssize_t nf
    with nogil:
        nf = _prefill_core(ids, n, ch, done, want, tok, gen, out, first, now, fin, 0, counts)
    return counts[0], counts[1], nf


# ------------------------------------------------------------------------------ pricing a pass
cdef struct _Pricer:
    # one cost table's one-B and range pricing where SPSTable reads its arrays (Engine._block_pricer)
    bint context  # the context formula (one latency slope), else the table's dense pass times
    double* d0  # dense: pass time per B, s (NaN where refused); context: padded size per B
    double* zap  # context: context-free ms at the padded size
    double* fac  # context: eager factor
    Py_ssize_t m  # values per array
    double a, bk, c  # context: latency slope, ms per KV token, ms per pair
    i64 min_b, max_b, bt0  # SPSTable.min_batch_tokens, max_batch_tokens, batch_tokens[0]
    bint beyond_ok  # beyond_max is not "error"


cdef int _read_pricer(tuple spec, _Pricer* p) except -1:
    # spec: (context, values, zero_at_pad or None, factor or None, a, b, c, min_b, max_b, bt0, beyond_ok)
    if PyTuple_GET_SIZE(spec) != 11:
        raise ValueError(f"pricer: 11 fields needed, got {PyTuple_GET_SIZE(spec)}")
    p.context = spec[0]
    p.d0 = _f64(<cnp.ndarray?>spec[1], "pricer values")
    p.m = cnp.PyArray_DIM(<cnp.ndarray>spec[1], 0)
    p.zap = p.fac = NULL
    if p.context:
        p.zap = _f64(<cnp.ndarray?>spec[2], "zero_at_pad", p.m)
        p.fac = _f64(<cnp.ndarray?>spec[3], "factor", p.m)
    p.a, p.bk, p.c = spec[4], spec[5], spec[6]
    p.min_b, p.max_b, p.bt0, p.beyond_ok = spec[7], spec[8], spec[9], spec[10]
    return 0


cdef int _check_fields(tuple fields, str name, Py_ssize_t need) except -1:
    # a tuple the kernel reads by position (unchecked: the module reads without bounds checks)
    if PyTuple_GET_SIZE(fields) != need:
        raise ValueError(f"{name}: {need} fields needed, got {PyTuple_GET_SIZE(fields)}")
    return 0


cdef inline bint _covers(_Pricer* p, i64 b) noexcept nogil:
    # SPSTable.covers
    return p.min_b <= b and (b <= p.max_b or p.beyond_ok)


cdef inline double _context_time(_Pricer* p, i64 b, double req, double l_max, double kv) noexcept nogil:
    # SPSTable._context_s at one B (req: max(R, 1)), the operations of context_pass_times
    cdef double q = p.d0[b] / req
    return (p.zap[b] + _dmax(_dmax(p.a * l_max, p.bk * kv), p.c * (kv * q))) * p.fac[b] / 1000.0


cdef inline double _price_one(_Pricer* p, i64 b, double req, double l_max, double kv) noexcept nogil:
    # SPSTable.pass_time_s(b) where its one-B fast path answers; NaN: the table's other rules decide
    if b <= 0 or b >= p.m:
        return NAN
    if p.context:
        if p.zap[b] != p.zap[b]:
            return NAN
        return _context_time(p, b, req, l_max, kv)
    return p.d0[b]


cdef inline bint _price_range(_Pricer* p, i64 b_first, i64 b_last, double req, double l_max, double kv,
                              double* out) noexcept nogil:
    # SPSTable.pass_time_range_s where it reads its arrays (False: its other rules must price)
    cdef i64 b
    if not (p.min_b <= b_first and (b_last <= p.max_b or p.beyond_ok)) or b_last >= p.m:
        return False
    for b in range(b_first, b_last + 1):
        out[b - b_first] = _context_time(p, b, req, l_max, kv) if p.context else p.d0[b]
    return True


def context_pass_times(cnp.ndarray pad_f not None, cnp.ndarray zero_at_pad not None, cnp.ndarray factor not None,
                       i64 b_first, i64 b_last, double num_requests, double a_slope, double l_max, double kv,
                       double b_ms_per_kv_token, double c_ms_per_pair):
    """Pass times for B in ``b_first..b_last`` at one round's context, s: ``(zero_at_pad[B] +
    max(max(a * l_max, b * kv), c * (kv * q))) * factor[B] / 1000`` with ``q = pad_f[B] /
    max(num_requests, 1)`` (``SPSTable._context_s`` for a table whose latency slope ``a`` is one
    value, the same operations in the same order; docs/model.md section 1 step 4).

    Args:
        pad_f, zero_at_pad, factor: ``(m,)`` float64 per-B padded size, context-free pass time
            at the padded size (ms) and eager factor.
        b_first, b_last: the range of B (``0 <= b_first <= b_last < m``).
        num_requests, a_slope, l_max, kv, b_ms_per_kv_token, c_ms_per_pair: the round's context
            and the table's attention slopes.

    Returns:
        ``(b_last - b_first + 1,)`` float64 seconds.

    Raises:
        TypeError, ValueError: arrays of the wrong type or a range outside them.
    """
    cdef double* pf = _f64(pad_f, "pad_f")
    cdef Py_ssize_t m = cnp.PyArray_DIM(pad_f, 0)
    if b_first < 0 or b_last < b_first or b_last >= m:
        raise ValueError(f"B range {b_first}..{b_last} outside 0..{m - 1}")
    cdef double* z = _f64(zero_at_pad, "zero_at_pad", m, False)
    cdef double* f = _f64(factor, "factor", m, False)
    cdef cnp.ndarray out = cnp.PyArray_EMPTY(1, [b_last - b_first + 1], cnp.NPY_FLOAT64, 0)
    cdef double* o = <double*>cnp.PyArray_DATA(out)
    cdef double req = num_requests if num_requests > 1.0 else 1.0
    cdef _Pricer p
    p.context, p.d0, p.zap, p.fac, p.m = True, pf, z, f, m
    p.a, p.bk, p.c = a_slope, b_ms_per_kv_token, c_ms_per_pair
    cdef i64 b
    with nogil:
        for b in range(b_first, b_last + 1):
            o[b - b_first] = _context_time(&p, b, req, l_max, kv)
    return out


def binned_rows(cnp.ndarray probs not None, cnp.ndarray outcomes not None, i64 n_bins, cnp.ndarray counts not None,
                cnp.ndarray sum_prob not None, cnp.ndarray sum_pos not None):
    """Equal-width calibration bins of every row of ``probs`` (``confidence._binned_rows``): per
    row and bin, the count, the sum of the probabilities and the sum of the outcomes, each bin's
    sums added in row order (as ``np.bincount``), so ECE and reliability curves match the numpy
    code bit for bit. Bin ``i`` holds ``p`` in ``(i/n, (i+1)/n]`` and 0 goes to bin 0, with the
    edges ``i / n`` correctly rounded (``confidence._bin_index``).

    Args:
        probs: ``(m, n)`` float64 C-contiguous probabilities in [0, 1].
        outcomes: bool C-contiguous, ``(n,)`` shared by every row or ``(m, n)``.
        n_bins: bins on [0, 1], >= 1.
        counts: int64 out ``(m, n_bins)``; sum_prob, sum_pos: float64 out ``(m, n_bins)``.

    Raises:
        TypeError, ValueError: arrays of the wrong type or shape, ``n_bins`` < 1, or a
            probability outside [0, 1] (NaN included).

    Source:
        Guo et al. (2017, ICML) section 2 (binned ECE); DeGroot and Fienberg (1983).
    """
    if n_bins < 1:
        raise ValueError(f"n_bins: must be >= 1, got {n_bins}")
    if cnp.PyArray_NDIM(probs) != 2:
        raise TypeError(f"probs: a C-contiguous 2-D float64 array is required, got {_layout(probs)}")
    cdef Py_ssize_t m = cnp.PyArray_DIM(probs, 0), n = cnp.PyArray_DIM(probs, 1), r, i
    cdef double* p = _f64_2d(probs, "probs", m, n)
    cdef bint shared = cnp.PyArray_NDIM(outcomes) == 1
    if shared:
        _check_1d(outcomes, "outcomes", cnp.NPY_BOOL, "bool", n, True)
    cdef char* y = <char*>(cnp.PyArray_DATA(outcomes) if shared else
                           _data_2d(outcomes, "outcomes", cnp.NPY_BOOL, "bool", m, n))
    cdef double* sp = _f64_2d(_w(sum_prob, "sum_prob"), "sum_prob", m, n_bins)
    cdef double* sy = _f64_2d(_w(sum_pos, "sum_pos"), "sum_pos", m, n_bins)
    cdef i64* cnt = <i64*>_data_2d(_w(counts, "counts"), "counts", cnp.NPY_INT64, "int64", m, n_bins)
    for i in range(m * n):
        if not (0.0 <= p[i] <= 1.0):
            raise ValueError("probs: values must lie in [0, 1]")
    cdef double v
    cdef i64 idx, base
    cdef double* edges = _bin_edges(n_bins)
    with nogil:
        for i in range(m * n_bins):
            cnt[i] = 0
            sp[i] = 0.0
            sy[i] = 0.0
        for r in range(m):
            base = r * n_bins
            for i in range(n):
                v = p[r * n + i]
                idx = base + _bin_of(v, n_bins, edges)
                cnt[idx] += 1
                sp[idx] += v
                sy[idx] += 1.0 if y[i if shared else r * n + i] else 0.0  # + 0.0: no branch to mispredict
    PyMem_Free(edges)


cdef double* _bin_edges(i64 n_bins) except NULL:
    # the bins' edges i / n_bins, i = 0..n_bins (np.arange(n + 1) / n), in memory the caller frees
    cdef double* edges = <double*>PyMem_Malloc((n_bins + 1) * sizeof(double))
    if edges == NULL:
        raise MemoryError()
    cdef i64 i
    for i in range(n_bins + 1):
        edges[i] = <double>i / <double>n_bins
    return edges


cdef inline i64 _bin_of(double v, i64 n_bins, double* edges) noexcept nogil:
    # v's bin, v in [0, 1]: bin i holds (edges[i], edges[i + 1]], 0 in bin 0 (confidence._bin_index).
    # Fast path: t = v * n more than 1e-6 from an integer is floor(t)'s bin, as the edges'
    # comparisons would say (t is off from v * n, and each edge * n from i, by under n * 2**-52:
    # below 1e-6 for n < 2**30); it skips the two dependent loads of the edges, which cost more
    # than the rest of a binning (survival_bins runs about twice as fast)
    cdef double t = v * <double>n_bins
    cdef i64 idx = <i64>t  # floor: v >= 0
    cdef double frac = t - <double>idx
    if frac > 1e-6 and frac < 1.0 - 1e-6 and idx < n_bins and n_bins < (1 << 30):  # all but values near an edge
        return idx
    # near an edge: a guess within one bin of the answer (v * n is off by at most an ulp), then
    # one exact correction each way against the edges; without jumps (& of the comparisons, not
    # "and"): whether a value sits in the first or last bin is data, and mispredicted jumps cost
    # more than the loads
    idx = n_bins - 1 if idx > n_bins - 1 else idx
    idx -= (idx > 0) & (v <= edges[idx])
    idx += (idx < n_bins - 1) & (v > edges[idx + 1])
    return idx


cdef enum:
    _LOCAL_BINS = 64  # bins survival_bins keeps in the stack (the shipped metrics use 15 and 10)

#: the most bins survival_bins takes (confidence.survival_calibration runs numpy beyond)
MAX_BINS = _LOCAL_BINS


def survival_bins(cnp.ndarray conf not None, cnp.ndarray outcomes not None, object keys,
                  cnp.ndarray sq_err_sums not None, i64 n_bins_a, cnp.ndarray counts_a not None,
                  cnp.ndarray sum_prob_a not None, cnp.ndarray sum_pos_a not None, i64 n_bins_b,
                  cnp.ndarray counts_b not None, cnp.ndarray sum_prob_b not None, cnp.ndarray sum_pos_b not None):
    """The calibration sums of the joint survivals of ``conf`` at every position in one pass
    (``confidence.survival_calibration``): the survivals ``a_k = prod_{j<=k} conf_j`` multiplied
    left to right (``np.cumprod(conf, axis=1)``), two equal-width binnings of them
    (:func:`binned_rows`' bins and sums, each bin's sums added in row order) and the Brier
    score's squared errors summed in row order (numpy's ``mean(axis=0)`` of more than one column),
    so every metric built from them matches the numpy code bit for bit.

    Args:
        conf: ``(n, g)`` float64 C-contiguous conditional confidences in [0, 1].
        outcomes: ``(n, g)`` bool C-contiguous outcomes.
        keys: None, or uint64 out ``(g, n)``, transposed: each survival's bits shifted left by one
            with its outcome in the low bit (``-0.0`` as ``0.0``), so that sorting a row of keys
            sorts the survivals and carries their outcomes along (:func:`positive_rank_sums`).
        sq_err_sums: float64 out ``(g,)``: per position, the sum of ``(a - outcome)**2``.
        n_bins_a, n_bins_b: the two binnings' bins on [0, 1], 1..64 (kept in the stack).
        counts_a, sum_prob_a, sum_pos_a: out ``(g, n_bins_a)``, int64, float64, float64: per
            position and bin, the count, the survivals' sum and the outcomes' sum; the same for b.

    Raises:
        TypeError, ValueError: arrays of the wrong type or shape, bins outside 1..64, or a confidence
            outside [0, 1] (NaN included).

    Source:
        Guo et al. (2017, ICML) section 2 (binned ECE); DSpark paper section 3.2
        (joint survival of the drafted positions).
    """
    if not (1 <= n_bins_a <= _LOCAL_BINS and 1 <= n_bins_b <= _LOCAL_BINS):
        raise ValueError(f"n_bins: must be in 1..{_LOCAL_BINS}, got {n_bins_a} and {n_bins_b}")
    if cnp.PyArray_NDIM(conf) != 2:
        raise TypeError(f"conf: a C-contiguous 2-D float64 array is required, got {_layout(conf)}")
    cdef Py_ssize_t n = cnp.PyArray_DIM(conf, 0), g = cnp.PyArray_DIM(conf, 1), i, k
    cdef double* c = _f64_2d(conf, "conf", n, g)
    cdef char* y = <char*>_data_2d(outcomes, "outcomes", cnp.NPY_BOOL, "bool", n, g)
    cdef u64* key = NULL if keys is None else <u64*>_data_2d(_w(keys, "keys"), "keys", cnp.NPY_UINT64, "uint64", g, n)
    cdef double* sq = _f64(_w(sq_err_sums, "sq_err_sums"), "sq_err_sums", g)
    cdef i64* cnt_a = <i64*>_data_2d(_w(counts_a, "counts_a"), "counts_a", cnp.NPY_INT64, "int64", g, n_bins_a)
    cdef double* sp_a = _f64_2d(_w(sum_prob_a, "sum_prob_a"), "sum_prob_a", g, n_bins_a)
    cdef double* sy_a = _f64_2d(_w(sum_pos_a, "sum_pos_a"), "sum_pos_a", g, n_bins_a)
    cdef i64* cnt_b = <i64*>_data_2d(_w(counts_b, "counts_b"), "counts_b", cnp.NPY_INT64, "int64", g, n_bins_b)
    cdef double* sp_b = _f64_2d(_w(sum_prob_b, "sum_prob_b"), "sum_prob_b", g, n_bins_b)
    cdef double* sy_b = _f64_2d(_w(sum_pos_b, "sum_pos_b"), "sum_pos_b", g, n_bins_b)
    cdef double* edges_a = _bin_edges(n_bins_a)
    cdef double* edges_b = _bin_edges(n_bins_b)
    cdef double* surv = <double*>PyMem_Malloc(n * sizeof(double) + 1)  # a_k of every row, position by position
    if surv == NULL:
        PyMem_Free(edges_a)
        PyMem_Free(edges_b)
        raise MemoryError()
    cdef bint in_range = True
    with nogil:
        for k in range(g):
            in_range &= _survival_bins_at(c, y, n, g, k, surv, NULL if key == NULL else key + k * n, sq + k,
                                          n_bins_a, edges_a, cnt_a + k * n_bins_a, sp_a + k * n_bins_a,
                                          sy_a + k * n_bins_a, n_bins_b, edges_b, cnt_b + k * n_bins_b,
                                          sp_b + k * n_bins_b, sy_b + k * n_bins_b)
    PyMem_Free(surv)
    PyMem_Free(edges_a)
    PyMem_Free(edges_b)
    if not in_range:  # (checked in the pass that reads them: the outputs are then not to be used)
        raise ValueError("conf: values must lie in [0, 1]")


cdef bint _survival_bins_at(double* c, char* y, Py_ssize_t n, Py_ssize_t g, Py_ssize_t k, double* surv, u64* key,
                            double* sq, i64 n_bins_a, double* edges_a, i64* cnt_a, double* sp_a, double* sy_a,
                            i64 n_bins_b, double* edges_b, i64* cnt_b, double* sp_b, double* sy_b) noexcept nogil:
    # survival_bins at position k: surv[i] becomes a_k (the running product, left to right), and
    # its sums go to bins in local arrays (no store to them can alias the inputs, so nothing is
    # reloaded), each bin's added in row order; a bin's outcomes are counted (a sum of 1.0s is
    # that count exactly) and written once. Returns whether every confidence at k is in [0, 1]
    # (NaN is not): where one is not, the bins are meaningless
    cdef double l_sp_a[_LOCAL_BINS]
    cdef double l_sp_b[_LOCAL_BINS]
    cdef i64 l_cnt_a[_LOCAL_BINS]
    cdef i64 l_cnt_b[_LOCAL_BINS]
    cdef i64 l_pos_a[_LOCAL_BINS]
    cdef i64 l_pos_b[_LOCAL_BINS]
    cdef double l_edges_a[_LOCAL_BINS + 1]
    cdef double l_edges_b[_LOCAL_BINS + 1]
    cdef Py_ssize_t i, j
    cdef double a, d, x, s = 0.0
    cdef i64 ia, ib, pos
    cdef bint in_range = True
    for j in range(n_bins_a):
        l_sp_a[j], l_cnt_a[j], l_pos_a[j] = 0.0, 0, 0
    for j in range(n_bins_b):
        l_sp_b[j], l_cnt_b[j], l_pos_b[j] = 0.0, 0, 0
    for j in range(n_bins_a + 1):
        l_edges_a[j] = edges_a[j]
    for j in range(n_bins_b + 1):
        l_edges_b[j] = edges_b[j]
    for i in range(n):
        x = c[i * g + k]
        if not (0.0 <= x <= 1.0):  # (never in valid input, so predicted) binned as 0 so no index leaves the bins
            in_range, x = False, 0.0
        a = x if k == 0 else surv[i] * x
        surv[i] = a
        pos = 1 if y[i * g + k] else 0
        if key != NULL:
            key[i] = ((_bits(a) if a != 0.0 else 0) << 1) | <u64>pos
        d = a - <double>pos
        s += d * d
        ia = _bin_of(a, n_bins_a, l_edges_a)
        ib = _bin_of(a, n_bins_b, l_edges_b)
        l_cnt_a[ia] += 1
        l_sp_a[ia] += a
        l_pos_a[ia] += pos
        l_cnt_b[ib] += 1
        l_sp_b[ib] += a
        l_pos_b[ib] += pos
    sq[0] = s
    for j in range(n_bins_a):
        cnt_a[j], sp_a[j], sy_a[j] = l_cnt_a[j], l_sp_a[j], <double>l_pos_a[j]
    for j in range(n_bins_b):
        cnt_b[j], sp_b[j], sy_b[j] = l_cnt_b[j], l_sp_b[j], <double>l_pos_b[j]
    return in_range


cdef inline u64 _bits(double x) noexcept nogil:
    # the IEEE 754 bits of x: for x >= 0 they order as x does
    cdef u64 b
    memcpy(&b, &x, sizeof(double))
    return b


def positive_rank_sums(cnp.ndarray keys not None, cnp.ndarray rank_sums not None, cnp.ndarray num_pos not None):
    """Per row of sorted keys (:func:`survival_bins`' keys after ``np.sort(axis=1)``), the sum of
    the 1-based ranks of the positive entries, ties (equal scores, whatever their outcomes) sharing
    their average rank, and the number of positives: :func:`positive_rank_sum` of every row
    without an argsort (numpy sorts uint64 keys about 3x faster than it argsorts the floats).
    Ranks are half-integers, so each sum is exact below 2**52.

    Args:
        keys: ``(m, n)`` uint64 C-contiguous, each row ascending: ``score_bits << 1 | outcome``.
        rank_sums: float64 out ``(m,)``; num_pos: int64 out ``(m,)``.

    Raises:
        TypeError, ValueError: arrays of the wrong type or shape.

    Source:
        Mann and Whitney (1947); ``scipy.stats.rankdata``'s ``average`` method.
    """
    if cnp.PyArray_NDIM(keys) != 2:
        raise TypeError(f"keys: a C-contiguous 2-D uint64 array is required, got {_layout(keys)}")
    cdef Py_ssize_t m = cnp.PyArray_DIM(keys, 0), n = cnp.PyArray_DIM(keys, 1), r, i, j
    cdef u64* k = <u64*>_data_2d(keys, "keys", cnp.NPY_UINT64, "uint64", m, n)
    cdef double* out = _f64(_w(rank_sums, "rank_sums"), "rank_sums", m)
    cdef i64* npos = _i64(_w(num_pos, "num_pos"), "num_pos", m)
    cdef double total
    cdef i64 c, c_all
    with nogil:
        for r in range(m):
            total, c_all, i = 0.0, 0, 0
            while i < n:
                j = i
                c = <i64>(k[r * n + i] & 1)
                while j + 1 < n and (k[r * n + j + 1] >> 1) == (k[r * n + i] >> 1):  # a tie group i..j
                    j += 1
                    c += <i64>(k[r * n + j] & 1)
                total += c * (0.5 * ((j + 1) + i + 1))  # every rank in the group: (i+1 + j+1) / 2
                c_all += c
                i = j + 1
            out[r] = total
            npos[r] = c_all


cdef extern from "Python.h":
    # the macros on borrowed pointers (Cython's object-typed declarations count references)
    PyObject* _list_item "PyList_GET_ITEM" (object, Py_ssize_t) nogil
    PyObject* _tuple_item "PyTuple_GET_ITEM" (PyObject*, Py_ssize_t) nogil
    bint _is_float "PyFloat_CheckExact" (PyObject*) nogil
    double _float_value "PyFloat_AS_DOUBLE" (PyObject*) nogil
    bint _is_int "PyLong_CheckExact" (PyObject*) nogil
    long long _int_value "PyLong_AsLongLongAndOverflow" (PyObject*, int*) except? -1


def pack_rows(list rows not None, list cols not None):
    """The engine's round-log rows, tuples of numbers, written into typed columns
    (``engine._RoundLog.flush``): element ``j`` of row ``i`` to ``cols[j][i]``, as
    ``np.array(column, dtype)`` converts it: a float64 column takes the number's value, an int32 or
    int8 column its value truncated toward zero (every value the engine logs there is whole).

    Args:
        rows: ``n`` tuples of ``m`` Python numbers (ints, floats or numpy scalars).
        cols: ``m`` C-contiguous 1-D arrays of ``n`` elements, float64, int32 or int8.

    Raises:
        TypeError, ValueError: a row that is not an ``m``-tuple, a column of another type or length,
            or a value an integer column cannot hold (NaN, infinite, out of range).
    """
    cdef Py_ssize_t n = len(rows), m = len(cols), i, j
    cdef int* kind = <int*>PyMem_Malloc(m * sizeof(int))
    cdef char** data = <char**>PyMem_Malloc(m * sizeof(char*))
    if kind == NULL or data == NULL:
        PyMem_Free(kind)
        PyMem_Free(data)
        raise MemoryError()
    cdef cnp.ndarray col
    cdef object row
    cdef PyObject* item_p
    cdef double v, lo, hi
    cdef Py_ssize_t i0, i1
    cdef long long iv
    cdef int overflow
    try:
        for j in range(m):
            col = _w(<cnp.ndarray?>cols[j], f"cols[{j}]")
            if cnp.PyArray_NDIM(col) != 1 or not cnp.PyArray_IS_C_CONTIGUOUS(col) or cnp.PyArray_DIM(col, 0) != n:
                raise ValueError(f"cols[{j}]: a C-contiguous 1-D array of {n} elements is required")
            kind[j] = {cnp.NPY_FLOAT64: 0, cnp.NPY_INT32: 1, cnp.NPY_INT8: 2}.get(cnp.PyArray_TYPE(col), -1)
            if kind[j] < 0:
                raise TypeError(f"cols[{j}]: float64, int32 or int8 required, got {col.dtype}")
            data[j] = <char*>cnp.PyArray_DATA(col)
        for i0 in range(0, n, 64):  # 64 rows at a time, a column at a time: one store stream per pass
            i1 = i0 + 64 if i0 + 64 < n else n
            for i in range(i0, i1):
                row = rows[i]
                if type(row) is not tuple or PyTuple_GET_SIZE(row) != m:
                    raise TypeError(f"rows[{i}]: a tuple of {m} numbers is required")
            for j in range(m):
                lo, hi = (-2147483648.0, 2147483647.0) if kind[j] == 1 else (-128.0, 127.0)
                for i in range(i0, i1):
                    # borrowed references (the list holds the rows, a row its items): no reference
                    # counting per item
                    item_p = _tuple_item(_list_item(rows, i), j)
                    if _is_float(item_p):
                        v = _float_value(item_p)
                    elif _is_int(item_p):  # rounded to nearest, as PyLong_AsDouble, below 2**63
                        iv = _int_value(item_p, &overflow)
                        v = PyFloat_AsDouble(<object>item_p) if overflow else <double>iv
                    else:
                        v = PyFloat_AsDouble(<object>item_p)
                    if kind[j] == 0:
                        (<double*>data[j])[i] = v
                        continue
                    if not isfinite(v) or v <= lo - 1.0 or v >= hi + 1.0:
                        raise ValueError(f"rows[{i}][{j}]: {v!r} does not fit an integer column")
                    if kind[j] == 1:
                        (<int32_t*>data[j])[i] = <int32_t>v  # truncation toward zero, as numpy's cast
                    else:
                        (<int8_t*>data[j])[i] = <int8_t>v
    finally:
        PyMem_Free(kind)
        PyMem_Free(data)


def positive_rank_sum(cnp.ndarray scores not None, cnp.ndarray labels not None):
    """Sum of the 1-based ranks of the positive entries, ties sharing their average rank, given
    the scores in ascending order and their labels in the same order (``confidence._positive_rank_sum``
    after its sort: the Mann-Whitney statistic of the AUC). Ranks are half-integers, so the sum
    is exact in any order below 2**52.

    Args:
        scores: ``(n,)`` float64, ascending.
        labels: ``(n,)`` bool, in the same order.

    Returns:
        The rank sum, a float.

    Raises:
        TypeError, ValueError: arrays of the wrong type or length.

    Source:
        Mann and Whitney (1947); ``scipy.stats.rankdata``'s ``average`` method.
    """
    cdef double* s = _f64(scores, "scores")
    cdef Py_ssize_t n = cnp.PyArray_DIM(scores, 0), i = 0, j, c
    _check_1d(labels, "labels", cnp.NPY_BOOL, "bool", n, True)
    cdef char* y = <char*>cnp.PyArray_DATA(labels)
    cdef double total = 0.0
    with nogil:
        while i < n:
            j = i
            c = 1 if y[i] else 0
            while j + 1 < n and s[j + 1] == s[i]:  # a tie group i..j (NaN ties nothing, as !=)
                j += 1
                if y[j]:
                    c += 1
            total += c * (0.5 * ((j + 1) + i + 1))  # every rank in the group: (i+1 + j+1) / 2
            i = j + 1
    return total


def expit(cnp.ndarray x not None):
    """``scipy.special.expit`` (``1 / (1 + exp(-x))``) of a float64 array of any shape, as a new
    C-contiguous array of the same shape: the same formula on the same libm ``exp``, so the same
    bits, without importing ``scipy.special`` (about 0.2 s of a cold process).

    Raises:
        TypeError: ``x`` not float64.

    Source:
        the logistic sigmoid; scipy's ``special/_logit.h``.
    """
    if cnp.PyArray_TYPE(x) != cnp.NPY_FLOAT64:
        raise TypeError(f"x must be a float64 array, not {x.dtype}")
    cdef cnp.ndarray src = cnp.PyArray_GETCONTIGUOUS(x)
    cdef cnp.ndarray out = cnp.PyArray_EMPTY(cnp.PyArray_NDIM(src), cnp.PyArray_DIMS(src), cnp.NPY_FLOAT64, 0)
    cdef Py_ssize_t n = cnp.PyArray_SIZE(src), i
    cdef double* s = <double*>cnp.PyArray_DATA(src)
    cdef double* o = <double*>cnp.PyArray_DATA(out)
    with nogil:
        for i in range(n):
            o[i] = _expit(s[i])
    return out


# ------------------------------------------------------------------------------ drafted blocks
cdef inline i64 _context_of(i64* dec, Py_ssize_t num, i64* tok, i64* l_max) noexcept nogil:
    # the KV tokens of the requests dec[:num] (a pass reads them) and, in l_max, the longest; in
    # locals of its own (drafted_block's variables live in memory: its loops added to the stack)
    cdef i64 total = 0, longest = 0, b
    cdef Py_ssize_t k
    for k in range(num):
        b = tok[dec[k]]
        total += b
        if b > longest:
            longest = b
    l_max[0] = longest
    return total


cdef inline i64 _blocks_to_hold(i64* dec, Py_ssize_t num, i64* tok, i64* blk, i64* more, i64 extra,
                                i64 block_tokens) noexcept nogil:
    # the KV blocks requests dec[:num] add to hold extra more tokens each (plus more[k], unless NULL)
    cdef i64 total = 0
    cdef Py_ssize_t k
    for k in range(num):
        total += _blocks_for(tok[dec[k]] + extra + (0 if more == NULL else more[k]), block_tokens) - blk[dec[k]]
    return total


# the plans drafted_block makes (its plan_kind)
cdef enum:
    _PLAN_DSPARK = 0
    _PLAN_STATIC = 1
    _PLAN_THRESHOLD = 2
    _PLAN_ASYNC = 3
    _PLAN_GOODPUT = 4
    _PLAN_NONE = 5


cdef double _pairwise_sum(double* a, Py_ssize_t n) noexcept nogil:
    # numpy's sum of a contiguous float64 array (np.add.reduce: pairwise summation, blocks of 128
    # summed with 8 accumulators), the same additions in the same order; -0.0 for n = 0
    cdef double r0, r1, r2, r3, r4, r5, r6, r7, res
    cdef Py_ssize_t i, n2
    if n < 8:
        res = -0.0
        for i in range(n):
            res += a[i]
        return res
    if n <= 128:
        r0, r1, r2, r3, r4, r5, r6, r7 = a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]
        i = 8
        while i < n - (n % 8):
            r0 += a[i]
            r1 += a[i + 1]
            r2 += a[i + 2]
            r3 += a[i + 3]
            r4 += a[i + 4]
            r5 += a[i + 5]
            r6 += a[i + 6]
            r7 += a[i + 7]
            i += 8
        res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
        while i < n:
            res += a[i]
            i += 1
        return res
    n2 = n // 2
    n2 -= n2 % 8
    return _pairwise_sum(a, n2) + _pairwise_sum(a + n2, n - n2)


cdef double _goodput_core(double* v, Py_ssize_t num_req, Py_ssize_t width, i64 prefill_tokens, i64 max_batch_tokens,
                          _Pricer* vp, double req, double l_max, double kv, double overhead_s, bint has_no_draft_pass,
                          double no_draft_pass_s, double* colsum, i64* k_best) noexcept nogil:
    # GoodputPolicy.plan on checked pointers: tau_k = R + the cumulative sum of the survivals'
    # column sums (a.sum(axis=0): row after row, or numpy's pairwise sum of a single column), the
    # rate of each k whose pass fits, the first best (a rise of more than 1e-12 relative wins).
    # Returns the best rate, *k_best the k; *k_best -1 where plan() raises or the table's other
    # rules price a pass (a confidence outside [0, 1], an uncovered or unpriced B). colsum: width doubles
    cdef Py_ssize_t r, j
    cdef double s, cum = 0.0, tau, pt, rate, best_rate = -INFINITY
    cdef bint in_range = True
    cdef i64 k, b, best = 0
    k_best[0] = -1
    for j in range(width):
        colsum[j] = 0.0
    for r in range(num_req):
        s = 1.0
        for j in range(width):
            in_range = in_range and 0.0 <= v[r * width + j] <= 1.0  # False for NaN too
            s = s * v[r * width + j]
            if width > 1:
                colsum[j] = colsum[j] + s
    if not in_range:
        return NAN
    if width == 1:  # one column: a contiguous reduction, summed pairwise (the survivals are the confidences)
        colsum[0] = 0.0 + _pairwise_sum(v, num_req)
    for k in range(width + 1):
        if k:
            cum = cum + colsum[k - 1]
        tau = <double>num_req + cum
        b = num_req * (1 + k) + prefill_tokens
        if b > max_batch_tokens:
            break  # B_k grows with k
        if not _covers(vp, b):
            return NAN  # plan() raises
        pt = no_draft_pass_s if k == 0 and has_no_draft_pass else _price_one(vp, b, req, l_max, kv)
        if pt != pt:
            return NAN
        rate = tau / (overhead_s + pt)
        if rate > best_rate * (1.0 + 1e-12):  # rates > 0; -inf * (1 + eps) = -inf
            best, best_rate = k, rate
    k_best[0] = best
    return best_rate


cdef inline double _ewma_step(double value, double alpha, double ratio) noexcept nogil:
    # memtp.CoherenceEWMA.update: (1 - alpha) R + alpha ratio, clamped to [0, 1] (min(1, max(0, .)))
    cdef double new = (1.0 - alpha) * value + alpha * ratio
    new = new if new > 0.0 else 0.0
    return new if new < 1.0 else 1.0


cdef inline i64 _heads_capped(double free_gib, double cost_gib, double gate, double eps, i64 max_depth) noexcept nogil:
    # memtp: max(1, min(max_depth, _heads_affordable(free_gib, cost_gib, gate))), a quotient beyond
    # float range counting as more than max_depth (and NaN, inf * a gate of 0, as no head)
    cdef double x = floor(free_gib / cost_gib * gate + eps)
    if x != x:
        return 1
    if x >= <double>max_depth:
        return max_depth
    return <i64>x if x > 1.0 else 1


cdef i64 _async_capacity(i64* hist, Py_ssize_t* h0, Py_ssize_t* h_len, i64 t, i64 lag, i64 k_now) noexcept nogil:
    # DSparkAsyncPolicy.plan's bookkeeping on its (round, K) pairs, rows h0..h_len of hist (room
    # for one more): a round before the last starts a new run (cleared); the K in force is the
    # latest from a round <= t - lag (0 while none is that old: warm-up), older pairs dropped
    # (_lagged_capacity); then K now is remembered for round t. Returns the K in force.
    cdef i64 k_lag = 0, limit = t - lag
    if h_len[0] > h0[0] and t < hist[2 * (h_len[0] - 1)]:
        h0[0] = h_len[0] = 0
    while h_len[0] > h0[0] and hist[2 * h0[0]] <= limit:
        if h_len[0] - h0[0] >= 2 and hist[2 * (h0[0] + 1)] <= limit:
            h0[0] += 1
            continue
        k_lag = hist[2 * h0[0] + 1]
        break
    if h_len[0] > h0[0] and hist[2 * (h_len[0] - 1)] == t:
        hist[2 * (h_len[0] - 1) + 1] = k_now
    else:
        hist[2 * h_len[0]] = t
        hist[2 * h_len[0] + 1] = k_now
        h_len[0] += 1
    return k_lag


cdef i64 _take_top_core(double* v, Py_ssize_t num_req, Py_ssize_t width, double t, i64 cap, i64* out,
                        double* a, i64* picked, double* sum_a) noexcept nogil:
    # take_top on checked pointers (ThresholdPolicy.plan, DSparkAsyncPolicy.plan with t = 0): the
    # drafts whose joint survival is positive and >= t, at most cap of them, the lowest dropped
    # first (the first of the stable order of -survival); *sum_a: their survivals' sum as
    # float(vals[:n].sum()) adds them. Returns the drafts verified, or -1 for a confidence
    # outside [0, 1] (nothing planned). cap >= 0 (the callers' budgets). a: 2*R*L doubles,
    # picked: 2*R*L + R + 1 int64 scratch (as _scan_core's)
    cdef Py_ssize_t total = num_req * width, j, n, selected
    cdef double* cand = a
    cdef i64* rows = picked
    cdef i64* bounds = picked + 2 * total
    if _positive_candidates(v, num_req, width, t, cand, rows, bounds, out, &selected) < 0:
        return -1
    n = selected if selected < cap else cap
    if _merge_runs(cand, rows, cand + total, rows + total, bounds, num_req, n) == 1:
        cand, rows = cand + total, rows + total
    for j in range(n):
        out[rows[j]] += 1
    sum_a[0] = 0.0 + _pairwise_sum(cand, n)
    return n


cdef bitgen_t* _bitgen(object generator) except NULL:
    # the C state of a numpy Generator's bit generator (numpy's "extending via Cython" route)
    capsule = generator.bit_generator.capsule
    if not PyCapsule_IsValid(capsule, "BitGenerator"):
        raise TypeError("a numpy.random.Generator is required")
    return <bitgen_t*>PyCapsule_GetPointer(capsule, "BitGenerator")


cdef inline double _round_overhead(i64 k, double drafted_s, i64 kind, double plain_s, bint spec_on,
                                   double switch_s) noexcept nogil:
    # Engine._pass_time's overhead: a drafted or a plain round's, and a dynamic controller's switch
    # where the round turns speculation on or off
    cdef double ov = drafted_s if k else plain_s
    if kind and (k > 0) != spec_on:
        ov = ov + switch_s
    return ov


cdef inline void _commit_control(i64 kind, i64 t_off, i64 t_since, bint t_probing, i64* off, i64* since,
                                 bint* probing) noexcept nogil:
    # a controller's answer stands once its round draws or is kept: AcceptanceTarget's off rounds,
    # Probing's rounds since the probe and whether this round probes
    if kind == 2:
        off[0] = t_off
    elif kind == 3:
        since[0], probing[0] = t_since, t_probing


cdef object _control_state(i64 kind, bint spec_on, i64 k, double ema, i64 off, i64 since, bint probing,
                           i64 measured):
    # drafted_block's last result: a dynamic controller's (spec_on, state) after the kept rounds
    if not kind:
        return None
    if kind == 1:
        return (spec_on, ())
    if kind == 2:
        return (spec_on, (k, ema, off))
    return (spec_on, (since, probing, measured))


def drafted_block(cnp.ndarray run not None, cnp.ndarray prefilled not None, cnp.ndarray target not None,
                  cnp.ndarray domain not None, cnp.ndarray difficulty not None, cnp.ndarray generated not None,
                  cnp.ndarray output not None, cnp.ndarray num_rounds not None, cnp.ndarray verified not None,
                  cnp.ndarray accepted not None, cnp.ndarray tokens not None, cnp.ndarray blocks not None,
                  cnp.ndarray first_token_at not None, cnp.ndarray mu not None, cnp.ndarray slope not None,
                  object base, double sigma_round, bint oracle, double noise_sd, double overconfidence,
                  cnp.ndarray temps not None, object rng, object head_rng, tuple verify_price not None,
                  tuple decode_price not None, bint separate_decode, cnp.ndarray draft_times not None, i64 gamma,
                  i64 max_batch_tokens, i64 prefill_chunk_tokens, i64 block_tokens, i64 capacity, i64 blocks_used,
                  double now, double next_event, double overhead_s, bint early_stop, i64 plan_kind, i64 fixed_k,
                  double threshold, i64 lag_rounds, cnp.ndarray history not None, i64 history_len, double block_gib,
                  double held_gib, double fixed_gib, tuple gate not None, tuple coherence not None, i64 round_index,
                  i64 max_rounds, list rows not None, tuple row_consts not None, cnp.ndarray dec_out not None,
                  cnp.ndarray pre_out not None, cnp.ndarray probs not None, cnp.ndarray raw not None,
                  cnp.ndarray conf not None, cnp.ndarray finished not None, object diag_raw, object diag_conf,
                  object diag_would, cnp.ndarray lengths_out not None, cnp.ndarray chunks_out not None,
                  cnp.ndarray crossing not None, object elastic=None, object tower=None, bint drafter_prefills=False,
                  object control=None, object absorb=None):
    """Run drafted rounds (``Engine._engine``'s round with ``policies.dspark.DSparkPolicy``, or one of
    the plans below; the ``always`` controller or a dynamic one, ``control``; the EWMA or tower
    coherence; a fixed depth or the elastic ensemble) one after another while nothing outside the
    engine happens: the same draws from the same generators, the same float operations, the same
    state and round-log rows as round by round (docs/model.md section 1 steps 2-7; DSpark paper
    Algorithm 1).

    With ``plan_kind`` 1 the rounds are those of ``policies.static.StaticPolicy`` (``Mtp1Policy``:
    ``fixed_k`` 1) instead: every decoding request verifies ``fixed_k`` of its ``gamma`` drafted
    positions; with 2, those of ``policies.threshold.ThresholdPolicy``: each request verifies its
    drafts whose joint survival is positive and at least ``threshold``, the lowest dropped first
    where they overfill the pass (``take_top``); with 3, those of ``policies.dspark.DSparkAsyncPolicy``:
    the global search (Algorithm 1 without early stop) gives this round's capacity K, remembered in
    ``history``, and the round verifies its own top K drafts with the K of ``lag_rounds`` rounds
    before (capped by the pass; 0 while none is that old); with 4, those of
    ``policies.goodput.GoodputPolicy``: one k for every request, the one of the best expected rate
    (SmartSpec's goodput). Only DSpark's and goodput's plans have a gate: while it falls back, its
    plain rounds (``draft_lengths`` answers 0) run here too, as rounds of k 0: nothing drawn, a
    pass of the decode table at a plain round's overhead, every request emits its bonus token.
    With 5, those of ``policies.static.NoSpecPolicy``: every round is such a round (``gamma`` is
    then only the buffers' width; ``fixed_k`` the drafter's depth the round log records).

    Each round, before it draws: the running requests split into decoding (at least one) and
    prefilling ones, the gate answers (DSpark's, goodput's), the decoding ones' anchors and
    ``1 + gamma`` lookahead slots fit the KV cache, chunked prefill takes the budget left and the
    cost tables price the round from their arrays. Then it drafts (``rng``: the
    round offsets; ``head_rng``: the head noise) and plans (Algorithm 1, ``fixed_k`` each, the
    threshold, the lagged top K or goodput's k), and keeps the round only if neither the KV cache nor
    ``fit_to_budget`` trims it (a plan's own trims, ``take_top``'s, are its plan) and the pass passes
    ``Engine._check_pass``: it then reports to the gate, moves the clock, draws acceptance
    (``rng``), applies it and the prefill chunks, updates the coherence and appends the round's
    row. A round whose pass reaches ``next_event`` is kept too, and is the block's last: the caller
    moves the clock to its end, running the events inside the pass in SimPy's order
    (``Engine._advance``), before it frees the requests the round finished. Drawing its acceptance before those events gives the round path's draws,
    which draws after them: no event's callback draws from the run's generators or reads the
    round's requests.

    Args:
        run: ``(N,)`` int64 ids of the running requests, in admission order (N >= 1).
        prefilled, target, domain, difficulty, generated, output, num_rounds, verified, accepted,
            tokens, blocks, first_token_at: ``(n,)`` per-request arrays (int64 but difficulty and
            first_token_at float64), updated in place.
        mu, slope, base, sigma_round: the acceptance model (``AcceptanceModel``).
        oracle, noise_sd, overconfidence, temps: the confidence head and its temperatures.
        rng, head_rng: the run's numpy Generators (acceptance, head noise).
        verify_price, decode_price: the verify and decode tables' pricing (``_Pricer``'s fields);
        separate_decode: the decode table is priced apart (the plan's no-draft pass time).
        draft_times: float64 ``(N + 1,)`` or longer: drafting time of a round of R decoding
            requests at R, s (the drafter's own prefill costs nothing; see ``drafter_prefills``).
        gamma: positions drafted (>= 1); max_batch_tokens, prefill_chunk_tokens, block_tokens,
            capacity, blocks_used: the pass and KV cache limits and state.
        now, next_event: the clock and SimPy's next event, s.
        overhead_s: a drafted round's host overhead, s.
        early_stop: Algorithm 1's early stop (DSpark's plan only).
        plan_kind, fixed_k, threshold: 0 for DSpark's plan; 1 for static k's (``fixed_k`` in
            ``1..gamma``); 2 for the threshold policy's (``threshold`` in [0, 1]); 3 for DSpark's
            asynchronous scheduler's; 4 for goodput's; 5 for no speculation's (``fixed_k``: the
            drafter's depth, 0..127). The gate is read only for DSpark's and goodput's.
        lag_rounds, history, history_len: plan 3's lag (>= 1) and its remembered ``(round, K)``
            pairs, the first ``history_len`` rows of the int64 ``(H, 2)`` array (``H`` > the
            live pairs; updated in place: the live pairs are rows ``h0..h_len`` of the result).
            Other plans read neither, but ``history`` must be such an array.
        block_gib, held_gib, fixed_gib: KV block size, drafter memory and the memory left after
            weights (the memory check).
        gate: ``(enabled, alpha, gain, last_round, skipped, probe_every, plain_overhead_s)``: the
            policy's ``FallbackGate`` (read for DSpark's and goodput's plans only) and a round's host
            overhead without drafts, s (``Engine._overhead_s(False)``: a gate's plain round's, and
            every round's of plan 5).
        coherence: ``(alpha, value, num_updates, per_tested)`` of the ``CoherenceEWMA``; with
            ``tower``, ``(alpha, value, 0, False)``: every level's alpha and the tower's ``R``.
        round_index, max_rounds: the first round's index and the most rounds to run.
        rows: the round log's rows (tuples appended); row_consts: ``(num_waiting, num_running,
            num_remote_prefill)``.
        dec_out, pre_out: int64 out ``(N,)``: the last round's decoding and prefilling ids (code 1).
        probs, raw, conf: float64 out, ``(N, gamma)``: the last round's drafts in their first rows
            when it was drafted but not kept (code 1).
        finished: int64 out ``(N,)``: ids that finished in the last round (codes 2 and 3).
        diag_raw, diag_conf, diag_would: None, or out ``(D, gamma)`` float64, float64 and bool: the
            calibration diagnostics' rows (raw logits, confidences, whether each position would be
            accepted) of the kept rounds' request-rounds, the first D of them (``Engine._record_diag``).
        lengths_out, chunks_out: int64 out ``(N,)``: the last round's verify lengths and prefill chunks.
        crossing: float64 out ``(2,)``: with code 3, the start and the duration of the last round's
            pass, s (it reaches ``next_event``).
        elastic: None for a drafter of fixed depth; for the elastic MEMTP ensemble at depth
            ``gamma``, ``(max_depth, head_cost_gib, r_low, r_high, min_dwell_rounds,
            grow_margin_gib, floor_epsilon, heads_base_gib, wait_blocks, last_round, last_target,
            above_since, below_since, below_max_target)``: the ``memtp.DepthController``'s settings
            and state (-1 for None), the memory left after weights and reserve, and the blocks the
            head-of-line waiting request holds back (its KV and the watermark; 0 when none waits).
            Every round but the call's first (the caller resized for it) first asks the controller
            (``Engine._resize_drafter``: ``_heads_free_gib`` and ``DepthController.propose``); a
            round whose depth would change stops the block before it, the controller as it was.
        tower: None for the EWMA coherence; for ``memtp.TowerCoherence``, ``(values, updates,
            depth)``: float64 and int64 ``(L,)`` arrays of its levels' ``R_i`` and update counts
            (updated in place) and the levels ``R`` multiplies, L >= ``gamma``. Each kept round
            folds in its per-position counts (``TowerCoherence.update_positions``: position j
            tested where verified with every earlier one accepted).
        drafter_prefills: the drafter prefills its own cache (a draft model: ``Drafter.prefill_time_s``
            prices the prompt tokens of a round's chunks); a round with prefill chunks then stops
            the block before it (nothing drawn for it), and the round path prices it.
        control: None for the ``always`` controller; for a dynamic draft-length controller
            (``policies.control``), ``(kind, depth, num_dec, tax_factor, spec_on, switch_s,
            plain_overhead_s, first_k, settings, state)``: kind 1 for ``batch_table`` and
            ``disable_by_batch_size`` (their k follows the batch), 2 for ``acceptance_target``, 3 for
            ``probing``; the drafter's depth (the round log's depth; ``gamma`` is the width the
            block drafts); the decoding requests the controller answered for; the pass's tax
            ``1 + tax_frac(num_dec)``; whether speculation is on, the switch cost, a plain round's
            overhead (``Engine._pass_time``); the call's first round's k (``gamma``, or 0 for a
            round without drafts: kinds 2 and 3), which the caller asked. ``settings`` and
            ``state``: kind 1 none; kind 2 ``(alpha, target - hysteresis, target + hysteresis,
            k_min, probe_every)`` and ``(k, ema, off_rounds)`` (NaN for None); kind 3
            ``(probe_every, fixed_s, draft_times_by_k, acceptance)``, float64 ``(depth + 1,)``
            (``Drafter.round_time_s(num_dec, k)``) and ``(depth,)`` (updated in place), and
            ``(since, probing, measured)`` (-1: no probe yet; 0: an empty measurement). Every
            round but the call's first asks the controller as ``Engine._draft_length`` does (``AcceptanceTarget.cap``,
            ``Probing.cap`` with ``DraftView.expected_rate`` at the round's context); a round whose
            batch is not ``num_dec`` or whose k is neither ``gamma`` nor 0 stops the block before
            it (the controller as it was: its answer stands once the round draws or is kept). A
            round of k 0 drafts nothing: a plain pass of the decode table, every request emits
            its bonus token. Each kept round that drafted updates the learning (``observe``).
        absorb: None, or ``(kind, finished_at, status, actions, action_ids, action_at, next_request,
            num_requests, prefill_idle, prefill_s, refused, think_s, events)``: a kept round (not
            crossing ``next_event``, its KV blocks within the capacity) that finishes requests goes
            on instead of stopping the block:
            their finish time, status 3 and KV blocks freed (``Engine._finish``'s array work:
            float64 and int8 ``(n,)``, written), each logged (code 0, its id and time) in the action
            log (``actions`` int8, ``action_ids`` int64, ``action_at`` float64, ``(4 n + 8,)`` out)
            for the caller to run each completion at its time (``Engine._complete``), and the rounds
            after it without them. Only where nothing waits for admission (a completion then changes
            no round but through its user's next submission): ``kind`` 1, an open loop (a completion
            submits nothing); 2, closed-loop users that go on at once to remote prefill GPUs: each
            completion submits request ``next_request`` (the next not ``refused``, bool ``(n,)``: a
            refused one completes at once, and its user goes on), which joins the remote prefill
            queue (``num_remote_prefill`` + 1), or starts on one of the ``prefill_idle`` free GPUs
            and ends ``prefill_s[j]`` (float64 ``(n,)``) later: a new event; 3, closed-loop users
            that think ``think_s`` s first: a new event that much later. ``events`` (kind 2 only, at
            a fixed depth and without a dynamic controller; else None): :func:`plain_block`'s, and
            a round whose pass runs across remote prefills' ends goes on past them as there (the
            wait's key, each end, the round's completions, then the admissions, logged with codes
            1, 2, 0 and 3); the out arrays then have the rows of the admission limit (the batch
            grows), and ``draft_times`` a NaN where not priced yet (the block stops before a round
            of that many requests).

    Returns:
        ``(code, rounds, now, blocks_used, gain, last_round, skipped, coherence, num_updates,
        num_finished, diag_rows, num_dec, num_pre, had_prefill, h0, h_len)``: code 0 stopped before a round (nothing
        drawn for it), 1 the round after the ``rounds`` kept is drafted (``num_dec`` decoding
        requests in ``dec_out``, ``num_pre`` prefilling ones in ``pre_out``) and the caller goes on
        from its plan, 2 the last round kept finished requests (``num_finished`` ids in ``finished``),
        3 the last round kept reaches ``next_event``: the caller waits ``crossing[1]`` s from its
        start ``crossing[0]`` (``now`` is its end), then frees the requests it finished (as code 2);
        then the state after the rounds kept, whether any of them prefilled, and the live
        history rows (plan 3); and the controller's ``(last_round, last_target, above_since,
        below_since, below_max_target)`` after them (-1 for None), or None without ``elastic``;
        and the tower's depth after them (None without ``tower``); and with ``control``,
        ``(spec_on, state)`` after them (``state`` as given, empty for kind 1), else None; and with
        ``absorb``, ``absorbed``: ``(num_actions, next_request, prefill_idle, num_remote_prefill,
        num_waiting, queue_len)`` after them (the actions logged; the next request to submit, the
        free prefill GPUs, the requests in remote prefill and those waiting for admission as the
        mirror left them; the remote prefill queue's length with ``events``, else -1), else None.

    Raises:
        TypeError, ValueError, IndexError: arrays of the wrong type or shape, or bad ids;
            OverflowError: an integer beyond int64.
    """
    cdef i64* ids = _i64(run, "run")
    cdef i64* gen = _i64(_w(generated, "generated"), "generated")
    cdef Py_ssize_t num_run = cnp.PyArray_DIM(run, 0), size = cnp.PyArray_DIM(generated, 0), k
    if num_run < 1 or gamma < 1 or block_tokens < 1:
        raise ValueError(f"drafted_block: needs >= 1 request, position and block token (got {num_run}, {gamma}, "
                         f"{block_tokens})")
    if not (plan_kind == _PLAN_DSPARK or (plan_kind == _PLAN_STATIC and 1 <= fixed_k <= gamma)
            or (plan_kind == _PLAN_THRESHOLD and 0.0 <= threshold <= 1.0)
            or (plan_kind == _PLAN_ASYNC and lag_rounds >= 1) or plan_kind == _PLAN_GOODPUT
            or (plan_kind == _PLAN_NONE and 0 <= fixed_k <= 127)):
        raise ValueError(f"drafted_block: plan {plan_kind} with k {fixed_k}, threshold {threshold} and lag "
                         f"{lag_rounds}: needs 0, 1 with k in 1..{gamma}, 2 with a threshold in [0, 1], 3 with a "
                         "lag >= 1, 4, or 5 with a depth in 0..127")
    if cnp.PyArray_NDIM(history) != 2 or cnp.PyArray_DIM(history, 1) != 2:
        raise TypeError(f"history: a C-contiguous (H, 2) int64 array is required, got {_layout(history)}")
    cdef Py_ssize_t h_cap = cnp.PyArray_DIM(history, 0), h0 = 0, h_len = history_len
    cdef i64* hist = <i64*>_data_2d(_w(history, "history"), "history", cnp.NPY_INT64, "int64", h_cap, 2)
    if not 0 <= history_len <= h_cap:
        raise ValueError(f"history_len: {history_len} outside 0..{h_cap}")
    cdef Py_ssize_t width = gamma
    cdef i64* done = _i64(_w(prefilled, "prefilled"), "prefilled", size)
    cdef i64* want = _i64(target, "target", size)
    cdef i64* dom = _i64(domain, "domain", size)
    cdef double* diff = _f64(difficulty, "difficulty", size)
    cdef i64* out = _i64(output, "output", size)
    cdef i64* nr = _i64(_w(num_rounds, "num_rounds"), "num_rounds", size)
    cdef i64* ver = _i64(_w(verified, "verified"), "verified", size)
    cdef i64* acd = _i64(_w(accepted, "accepted"), "accepted", size)
    cdef i64* tok = _i64(_w(tokens, "tokens"), "tokens", size)
    cdef i64* blk = _i64(_w(blocks, "blocks"), "blocks", size)
    cdef double* first = _f64(_w(first_token_at, "first_token_at"), "first_token_at", size)
    cdef double* m = _f64(mu, "mu")
    cdef Py_ssize_t num_dom = cnp.PyArray_DIM(mu, 0)
    cdef double* sl = _f64(slope, "slope", num_dom)
    cdef double* bs = NULL
    if base is not None:
        bs = _f64_2d(<cnp.ndarray?>base, "base", num_dom, width)
    cdef double* t = _f64(temps, "temps", width, False)
    # the most requests a round may hold: the running ones, or with remote prefills' ends absorbed
    # (admissions) the out arrays' rows (the caller's admission limit)
    cdef Py_ssize_t room = num_run, view_rows = num_run
    if type(absorb) is tuple and PyTuple_GET_SIZE(absorb) == 13 and <object>PyTuple_GET_ITEM(absorb, 12) is not None:
        _check_1d(dec_out, "dec_out", cnp.NPY_INT64, "int64", num_run, False)
        view_rows = cnp.PyArray_DIM(dec_out, 0)
        room = view_rows if view_rows < size else size
    cdef double* dts = _f64(draft_times, "draft_times", room + 1, False)  # (a round of up to room requests)
    cdef i64* dec = _i64(_w(dec_out, "dec_out"), "dec_out", view_rows)
    cdef i64* pre = _i64(_w(pre_out, "pre_out"), "pre_out", view_rows)
    cdef double* p = _f64_2d(_w(probs, "probs"), "probs", view_rows, width)
    cdef double* rw = _f64_2d(_w(raw, "raw"), "raw", view_rows, width)
    cdef double* c = _f64_2d(_w(conf, "conf"), "conf", view_rows, width)
    cdef i64* fin = _i64(_w(finished, "finished"), "finished", room, False)
    cdef i64* lengths = _i64(_w(lengths_out, "lengths_out"), "lengths_out", view_rows)
    cdef i64* chunks = _i64(_w(chunks_out, "chunks_out"), "chunks_out", view_rows)
    cdef double* pf = _f64(_w(crossing, "crossing"), "crossing", 2)
    cdef object consts = row_consts
    _check_fields(gate, "gate", 7)
    _check_fields(coherence, "coherence", 4)
    _check_fields(row_consts, "row_consts", 3)
    cdef double* dg_raw = NULL
    cdef double* dg_conf = NULL
    cdef char* dg_would = NULL
    cdef Py_ssize_t diag_left = 0, diag_rows = 0, take
    if diag_raw is not None:
        if cnp.PyArray_NDIM(<cnp.ndarray?>diag_raw) != 2:
            raise TypeError(f"diag_raw: a C-contiguous 2-D float64 array is required, got {_layout(diag_raw)}")
        diag_left = cnp.PyArray_DIM(<cnp.ndarray>diag_raw, 0)
        dg_raw = _f64_2d(_w(<cnp.ndarray?>diag_raw, "diag_raw"), "diag_raw", diag_left, width)
        dg_conf = _f64_2d(_w(<cnp.ndarray?>diag_conf, "diag_conf"), "diag_conf", diag_left, width)
        dg_would = <char*>_data_2d(_w(<cnp.ndarray?>diag_would, "diag_would"), "diag_would", cnp.NPY_BOOL, "bool", diag_left, width)
    _check_ids(ids, num_run, size)
    for k in range(num_run):
        if dom[ids[k]] < 0 or dom[ids[k]] >= num_dom:
            raise IndexError(f"domain {dom[ids[k]]} of request {ids[k]} outside 0..{num_dom - 1}")
    cdef _Pricer vp, dp
    _read_pricer(verify_price, &vp)
    _read_pricer(decode_price, &dp)
    cdef bitgen_t* acc_gen = _bitgen(rng)
    cdef bitgen_t* head_gen = _bitgen(head_rng)
    cdef bint enabled = gate[0]
    cdef double alpha = gate[1], gain = gate[2]
    cdef i64 last_round = gate[3], skipped = gate[4], probe_every = gate[5], t_skipped
    cdef double coh_alpha = coherence[0], coh = coherence[1]
    cdef i64 coh_updates = coherence[2]
    cdef bint per_tested = coherence[3]
    # the tower coherence's levels (TowerCoherence): R_i and update counts, in place; R's depth
    cdef double* tw_vals = NULL
    cdef i64* tw_upd = NULL
    cdef i64 tw_depth = 0, tw_levels = 0, n_pos, j, a_j, t_j
    cdef double tw_prod
    if tower is not None:
        _check_fields(<tuple?>tower, "tower", 3)
        tw_levels = cnp.PyArray_DIM(<cnp.ndarray?>tower[0], 0) if cnp.PyArray_NDIM(<cnp.ndarray?>tower[0]) == 1 else 0
        tw_vals = _f64(_w(<cnp.ndarray?>tower[0], "tower values"), "tower values", tw_levels)
        tw_upd = _i64(_w(<cnp.ndarray?>tower[1], "tower updates"), "tower updates", tw_levels)
        tw_depth = tower[2]
        if tw_levels < gamma or not 1 <= tw_depth <= tw_levels:
            raise ValueError(f"tower: {tw_levels} levels and depth {tw_depth} for {gamma} positions")
    cdef object py_overhead_s = overhead_s, py_held_gib = held_gib, py_gamma = gamma, py_capacity = capacity
    # the elastic ensemble's controller (DepthController): settings, and its state as of the last kept round
    cdef bint is_elastic = elastic is not None
    cdef i64 e_max_depth = 0, e_dwell = 0, e_wait = 0, e_last = -1, e_target = -1, e_above = -1, e_below = -1
    cdef i64 e_below_max = 0, t_last_r = -1, t_target = -1, t_above = -1, t_below = -1, t_below_max = 0
    cdef i64 e_mem_cap, e_margin_cap
    cdef double e_cost = 1.0, e_lo = 0.0, e_hi = 1.0, e_margin = 0.0, e_eps = 0.0, e_base = 0.0, e_free, e_gate, e_x
    cdef bint e_proposed = False
    if is_elastic:
        _check_fields(<tuple?>elastic, "elastic", 14)
        e_max_depth, e_cost, e_lo, e_hi, e_dwell, e_margin, e_eps, e_base, e_wait = elastic[:9]
        e_last, e_target, e_above, e_below, e_below_max = elastic[9:]
        if not (1 <= gamma <= e_max_depth and e_cost > 0.0 and 0.0 <= e_lo < e_hi <= 1.0 and e_dwell >= 1
                and e_margin >= 0.0 and e_wait >= 0):
            raise ValueError(f"elastic: depth {gamma} and settings {elastic!r} are not a valid DepthController's")

    # a dynamic draft-length controller (kind 1 the batch's k, 2 AcceptanceTarget, 3 Probing): the depth,
    # the k's batch, the tax, speculation on, the switch cost, a plain round's overhead, the first round's
    # k; AcceptanceTarget's and Probing's settings and state (committed once a round draws or is kept)
    cdef i64 c_kind = 0, c_depth = gamma, c_num = -1, c_first_k = gamma, c_k_min = 0, c_every = 1, c_k = 0
    cdef i64 c_off = 0, c_since = 0, c_acc_len = -1, t_off = 0, t_since = 0, k_r = gamma, kk, b_k, best_k
    cdef bint c_spec = True, c_probing = False, t_probing = False, c_asked = False
    cdef double c_tax = 1.0, c_switch = 0.0, c_plain_ov = gate[6], c_alpha = 0.0, c_lo = 0.0, c_hi = 0.0
    cdef double c_ema = NAN, c_fixed = 0.0, c_rate, c_best, c_cum, c_pt, c_nd, ov
    cdef double* c_dbk = NULL
    cdef double* c_acc = NULL
    cdef object py_depth = py_gamma if plan_kind != _PLAN_NONE else fixed_k
    if control is not None:
        _check_fields(<tuple?>control, "control", 10)
        c_kind, c_depth, c_num, c_tax, c_spec, c_switch, c_plain_ov, c_first_k = control[:8]
        py_depth = control[1]
        if not (1 <= c_kind <= 3 and c_depth >= gamma and c_num >= 1 and 1.0 <= c_tax < INFINITY
                and 0.0 <= c_switch < INFINITY and 0.0 <= c_plain_ov < INFINITY
                and (c_first_k == gamma or (c_first_k == 0 and c_kind != 1))):
            raise ValueError(f"control: {control[:8]!r} is not a dynamic controller's for {gamma} drafted positions")
        _check_fields(<tuple?>control[8], "control settings", (0, 5, 4)[c_kind - 1])
        _check_fields(<tuple?>control[9], "control state", (0, 3, 3)[c_kind - 1])
        if c_kind == 2:  # AcceptanceTarget: EMA factor, band, k_min, probe_every; k, EMA (NaN: None), off rounds
            c_alpha, c_lo, c_hi, c_k_min, c_every = control[8]
            c_k, c_ema, c_off = control[9]
            if not (0.0 <= c_alpha <= 1.0 and c_lo <= c_hi and c_k_min >= 0 and c_every >= 1 and c_k >= 0
                    and c_off >= 0 and (c_ema != c_ema or -INFINITY < c_ema < INFINITY)):
                raise ValueError(f"control: {control[8:]!r} is not an acceptance_target's")
        elif c_kind == 3:  # Probing: probe_every, fixed time, drafting time by k; since, probing, measured length
            c_every, c_fixed = control[8][0], control[8][1]
            c_dbk = _f64(<cnp.ndarray?>control[8][2], "control drafting times", c_depth + 1)
            c_acc = _f64(_w(<cnp.ndarray?>control[8][3], "control acceptance"), "control acceptance", c_depth)
            c_since, c_probing, c_acc_len = control[9]
            if not (c_every >= 1 and 0.0 <= c_fixed < INFINITY and c_since >= 0 and -1 <= c_acc_len <= c_depth):
                raise ValueError(f"control: {control[8][:2]!r} and {control[9]!r} are not a probing controller's")

    # completions absorbed (absorb): what each sets off, and the list of them
    cdef _Absorb ab
    _read_absorb(absorb, size, consts[0], consts[2], &ab)
    if ab.events:  # an admission writes the prefill target (the arrays given here, as the other kernels check them)
        _w(target, "target")
        ab.target, ab.prefilled, ab.first_at = want, done, first
    cdef bint ab_new = False

    # scratch: offsets (N), noise and draws (N*L each), scan candidates (2*N*L), times (N*L + 1);
    # accepted (N), the scan's candidate rows and runs (2*N*L + N + 1); would (N*L); with absorb the ids (N)
    if ab.events and (is_elastic or c_kind):
        raise ValueError("absorb: remote prefills' ends are absorbed only at a fixed depth and k (the batch grows)")
    if ab.events and (ab.limit if ab.limit < size else size) > room:
        raise ValueError(f"absorb: admissions may run {min(ab.limit, size)} requests, but the out arrays hold {room} "
                         "rows (give them the admission limit's rows)")
    cdef Py_ssize_t most = room * width
    cdef double* fbuf = <double*>PyMem_Malloc((5 * most + room + 1) * sizeof(double))
    cdef i64* ibuf = <i64*>PyMem_Malloc((2 * most + 3 * room + 1) * sizeof(i64))
    cdef char* would = <char*>PyMem_Malloc(most) if dg_would != NULL else NULL
    if fbuf == NULL or ibuf == NULL or (dg_would != NULL and would == NULL):
        PyMem_Free(fbuf)
        PyMem_Free(ibuf)
        PyMem_Free(would)
        raise MemoryError()
    cdef double* offsets = fbuf
    cdef double* noise = offsets + room
    cdef double* draws = noise + most
    cdef double* surv = draws + most
    cdef double* times = surv + 2 * most
    cdef i64* acc = ibuf
    cdef i64* picked = acc + room
    if ab.kind:  # the running ids as the absorbed completions and admissions leave them (the caller's array stays)
        memcpy(picked + 2 * most + room + 1, ids, num_run * sizeof(i64))
        ids = picked + 2 * most + room + 1

    cdef int code = 0
    cdef bint had_prefill = False, extrapolated, across = False, use_noise = not oracle and noise_sd != 0.0
    cdef bint gate_plain
    cdef Py_ssize_t num = 0, num_pre, cells, nf
    cdef i64 rounds = 0, ri, i, anchors, need, kv_read, l_max, num_req, budget, limit
    cdef i64 chunk_total, num_prefill, completed, n_limit, n_cov_limit, verify_tokens, peak, b, tested, base_b
    cdef i64 totals[4]
    cdef i64 more[2]
    totals[3] = 0
    cdef double req, d_l_max, d_kv, nd = 0.0, plain_t, vs, duration, end, start, low, plan_draft_s, draft_s
    cdef double theta, theta_g, best_rate, plain_rate, t_gain, sum_a, t_plan
    cdef i64 cap, k_lag, k_best
    cdef i64 t_last
    cdef _Scan res
    cdef _Pricer* table
    try:
        while rounds < max_rounds:
            ri = round_index + rounds
            num = _split_core(ids, num_run, done, want, tok, block_tokens, dec, pre, more)  # Engine._guarantee_anchors
            num_pre, anchors = more[0], more[1]
            need = 0
            kv_read = _context_of(dec, num, tok, &l_max)  # the decoding requests' context
            if num == 0 or blocks_used + anchors > capacity:
                break  # nothing to draft, or the round path preempts
            k_r, c_asked = gamma, False  # this round's drafted positions; whether the controller was asked
            if c_kind:  # Engine._draft_length asks the controller (the caller asked for the call's first round)
                k_r, c_asked = c_first_k, rounds > 0
                if num != c_num:
                    break  # its k and the tax were for another batch: the round path asks
                if c_asked:
                    if c_kind == 2:  # AcceptanceTarget.cap
                        c_k = c_k if c_k < c_depth else c_depth  # its clamp (idempotent)
                        t_off, k_r = c_off, c_k
                        if c_k == 0:  # off: one position every probe_every rounds
                            t_off += 1
                            k_r = 0
                            if t_off >= c_every:
                                t_off, k_r = 0, 1
                    elif c_kind == 3:  # Probing.cap
                        t_since = c_since + 1
                        if c_acc_len < 0 or t_since >= c_every:
                            t_since, t_probing, k_r = 0, True, c_depth
                        else:  # the best expected rate (DraftView.expected_rate at this round's context)
                            t_probing = False
                            c_nd = _price_one(&dp, num, <double>num, <double>l_max, <double>kv_read)
                            if c_nd != c_nd:
                                break  # the table's other rules price it: the round path
                            best_k, c_best, c_cum, c_pt = 0, <double>num / (c_nd + c_fixed), 0.0, 0.0
                            for kk in range(1, (c_acc_len if c_acc_len < c_depth else c_depth) + 1):
                                c_cum = c_acc[0] if kk == 1 else c_cum + c_acc[kk - 1]  # np.cumsum's order
                                b_k = num * (1 + kk)
                                c_rate = NAN
                                if b_k <= max_batch_tokens and _covers(&vp, b_k):
                                    c_pt = _price_one(&vp, b_k, <double>num, <double>l_max, <double>kv_read)
                                    if c_pt != c_pt:
                                        break
                                    c_rate = <double>num * (1.0 + c_cum) / ((c_dbk[kk] + c_pt) + c_fixed)
                                if c_rate == c_rate and c_rate > c_best * (1.0 + 1e-9):
                                    best_k, c_best = kk, c_rate
                            if c_pt != c_pt:
                                break  # the table's other rules price it: the round path
                            k_r = best_k
                    if k_r != 0 and k_r != gamma:
                        break  # another k than the block's: the round path drafts it
            gate_plain = False
            if plan_kind == _PLAN_NONE:  # no speculation: every round drafts nothing
                k_r = 0
            elif plan_kind == _PLAN_DSPARK or plan_kind == _PLAN_GOODPUT:
                # FallbackGate.draft_lengths, first (Engine._draft_length): while it falls back, a probe
                # every probe_every rounds and plain rounds between, run here as rounds of k 0; its
                # state is the round's once the round draws (a probe) or is kept (a plain round)
                t_gain, t_last, t_skipped = gain, last_round, skipped
                if ri < t_last:  # a new run
                    t_gain, t_last, t_skipped = 0.0, -1, 0
                if not enabled or t_gain > 0.0 or t_last < 0:
                    t_skipped = 0
                else:
                    t_skipped += 1
                    if t_skipped < probe_every:
                        k_r, gate_plain = 0, True
                    else:
                        t_skipped = 0
            if k_r:  # the lookahead (Engine._reserve_lookahead: only where the round drafts)
                need = _blocks_to_hold(dec, num, tok, blk, NULL, 1 + k_r, block_tokens)
                if blocks_used + need > capacity:
                    break  # the round path preempts
            if is_elastic and rounds > 0:  # Engine._resize_drafter (the caller resized for the call's first)
                # Engine._heads_free_gib: the memory left once the anchors and the waiting head have their KV
                e_free = e_base - <double>(blocks_used + (anchors + e_wait)) * block_gib
                e_free = e_free if e_free > 0.0 else 0.0
                if not (e_free < INFINITY and 0.0 <= coh <= 1.0) or ri <= e_last:
                    break  # DepthController.propose raises: the round path
                # DepthController.propose: memtp_depth's target (coherence_gate, _heads_affordable)
                e_gate = 0.0 if coh <= e_lo else (1.0 if coh >= e_hi else (coh - e_lo) / (e_hi - e_lo))
                t_target = _heads_capped(e_free, e_cost, e_gate, e_eps, e_max_depth)
                e_mem_cap = _heads_capped(e_free, e_cost, 1.0, e_eps, e_max_depth)  # _memory_cap
                if gamma > e_mem_cap:
                    break  # rule 1, memory: the heads shrink (the round path)
                t_above, t_below, t_below_max = e_above, e_below, e_below_max
                if t_target < gamma:  # rule 2: shrink to the run's highest target after the dwell
                    t_above = -1
                    if t_below < 0:
                        t_below, t_below_max = ri, t_target
                    elif t_target > t_below_max:
                        t_below_max = t_target
                    if ri - t_below + 1 >= e_dwell:
                        break
                elif t_target > gamma:  # rule 3: grow one head after the dwell, within the margin
                    t_below, t_below_max = -1, 0
                    if t_above < 0:
                        t_above = ri
                    if ri - t_above + 1 >= e_dwell:
                        e_x = e_free - e_margin
                        e_margin_cap = _heads_capped(e_x if e_x > 0.0 else 0.0, e_cost, 1.0, e_eps, e_max_depth)
                        if e_margin_cap >= gamma + 1:
                            break
                else:
                    t_above, t_below, t_below_max = -1, -1, 0
                t_last_r = ri
                e_proposed = True  # kept once the round draws (below)
            else:
                e_proposed = False
            cells = num * k_r
            # chunked prefill in the budget the drafts leave (Engine._place_prefill), first admitted first
            chunk_total = 0
            num_req = num
            budget = max_batch_tokens - num * (1 + k_r)
            if num_pre and budget > 0:
                limit = prefill_chunk_tokens if prefill_chunk_tokens < budget else budget
                chunk_total = _place_core(pre, num_pre, done, want, limit, chunks)
                for k in range(num_pre):
                    i = pre[k]
                    if chunks[k] > 0:  # a prefilling request in the pass reads its context too
                        num_req += 1
                        kv_read += tok[i]
                        if tok[i] > l_max:
                            l_max = tok[i]
            else:  # no room: every prefilling request's chunk is 0
                for k in range(num_pre):
                    chunks[k] = 0
            if drafter_prefills and chunk_total > 0:
                break  # a draft model's own prefill of the chunks: the round path prices it
            req = <double>num_req if <double>num_req > 1.0 else 1.0  # the pass's context
            d_l_max = <double>l_max
            d_kv = <double>kv_read
            if k_r == 0:  # a round without drafts (the controller's k 0): Engine._draft_and_plan's
                draft_s, verify_tokens, theta, theta_g = 0.0, 0, NAN, NAN  # answer, every length 0
                for k in range(num):
                    lengths[k] = 0
            else:
                plan_draft_s = dts[num]
                draft_s = plan_draft_s + 0.0  # + the drafter's prefill: 0 for heads, and without chunks
                base_b = num + chunk_total
                if not (0.0 <= plan_draft_s < INFINITY) or base_b > max_batch_tokens:
                    break  # DSparkPolicy.plan_round's view checks fail: the public path raises
                if plan_kind == _PLAN_STATIC or plan_kind == _PLAN_THRESHOLD or plan_kind == _PLAN_ASYNC:
                    # no gate (the survivals' range is checked below; their width is the engine's: depth <= gamma)
                    if separate_decode:  # Engine._draft_and_plan prices the no-draft pass
                        nd = _price_one(&dp, base_b, req, d_l_max, d_kv)
                        if not (0.0 < nd < INFINITY):
                            break
                    n_limit = n_cov_limit = 0
                elif separate_decode:  # the plan's no-draft pass
                    nd = _price_one(&dp, base_b, req, d_l_max, d_kv)
                    if not (0.0 < nd < INFINITY):
                        break
                    plain_t = nd
                elif _covers(&vp, base_b):
                    plain_t = _price_one(&vp, base_b, req, d_l_max, d_kv)
                    if plain_t != plain_t:
                        break
                else:
                    plain_t = NAN  # plain_rate_of: no value at this B
                if plan_kind == _PLAN_ASYNC and h_len == h_cap:  # the history is full: its live pairs to the front
                    if h0 == 0:
                        break  # no room (the caller gives more): the round path
                    for k in range(h_len - h0):
                        hist[2 * k], hist[2 * k + 1] = hist[2 * (h0 + k)], hist[2 * (h0 + k) + 1]
                    h_len -= h0
                    h0 = 0
                if plan_kind == _PLAN_DSPARK or plan_kind == _PLAN_ASYNC:  # the scan's view and table checks
                    if not _covers(&vp, base_b):
                        break
                    n_limit = cells if cells < max_batch_tokens - base_b else max_batch_tokens - base_b
                    n_cov_limit = n_limit if _covers(&vp, base_b + n_limit) else vp.max_b - base_b
                    if n_cov_limit < 0 or not _price_range(&vp, base_b, base_b + n_cov_limit, req, d_l_max, d_kv,
                                                           times):
                        break
                if plan_kind == _PLAN_DSPARK or plan_kind == _PLAN_GOODPUT:  # the gate's answer stands
                    gain, last_round, skipped = t_gain, t_last, t_skipped
                # draft (AcceptanceModel.round_logits, ConfidenceHead.raw_logits: the same draws in order)
                if sigma_round > 0.0:
                    for k in range(num):
                        offsets[k] = random_normal(acc_gen, 0.0, sigma_round)
                if use_noise:
                    for k in range(cells):
                        noise[k] = random_normal(head_gen, 0.0, noise_sd)
                _confidences_core(dec, num, width, dom, diff, m, sl, bs, offsets if sigma_round > 0.0 else NULL, NULL,
                                  noise if use_noise else NULL, oracle, overconfidence, t, p, rw, c)
                code = 1  # drafted: from here on a round not kept goes on in Python from its plan
                if c_asked:  # the controller's answer for this round stands (the round path does not ask again)
                    _commit_control(c_kind, t_off, t_since, t_probing, &c_off, &c_since, &c_probing)
                if e_proposed:  # the controller's answer for this round stands (the round path does not ask again)
                    e_last, e_target, e_above, e_below, e_below_max = t_last_r, t_target, t_above, t_below, t_below_max
                if plan_kind == _PLAN_STATIC:  # k each; where they overfill the pass the check below stops
                    for k in range(num):  # (fit_to_budget trims)
                        lengths[k] = fixed_k
                    theta = theta_g = NAN  # RoundPlan's defaults: a static plan computes no rate
                    verify_tokens = num * fixed_k
                elif plan_kind == _PLAN_GOODPUT:  # GoodputPolicy.plan: the one k of the best expected rate
                    theta = _goodput_core(c, num, width, chunk_total, max_batch_tokens, &vp, req, d_l_max, d_kv,
                                          plan_draft_s, separate_decode, nd, surv, &k_best)
                    if k_best < 0:
                        break  # a confidence outside [0, 1], or a B its table rules must price: the round path
                    for k in range(num):
                        lengths[k] = k_best
                    theta_g = NAN
                    verify_tokens = num * k_best
                elif plan_kind == _PLAN_THRESHOLD or plan_kind == _PLAN_ASYNC:  # ThresholdPolicy.plan, and
                    cap, t_plan, theta_g = max_batch_tokens - base_b, threshold, NAN  # DSparkAsyncPolicy.plan's:
                    if plan_kind == _PLAN_ASYNC:  # the global search's K now, the top K of lag_rounds before
                        res = _scan_core(c, num, width, times, plan_draft_s, separate_decode, nd, n_limit, n_cov_limit,
                                         False, lengths, surv, picked)
                        if not res.in_range or res.n_cov < res.n_max:
                            break  # a confidence outside [0, 1], or a search beyond the table: plan() raises
                        theta_g = res.theta_best
                        k_lag = _async_capacity(hist, &h0, &h_len, ri, lag_rounds, res.n_star)
                        cap, t_plan = (k_lag if k_lag < cap else cap), 0.0
                    verify_tokens = _take_top_core(c, num, width, t_plan, cap, lengths, surv, picked, &sum_a)
                    if verify_tokens < 0:
                        break  # a confidence outside [0, 1]: survival() raises
                    b = num + verify_tokens + chunk_total
                    if not _covers(&vp, b):  # expected_rate
                        theta = NAN
                    else:
                        vs = nd if verify_tokens == 0 and separate_decode else _price_one(&vp, b, req, d_l_max, d_kv)
                        if vs != vs:
                            break  # the table's other rules price it: the round path
                        theta = (<double>num + sum_a) / (plan_draft_s + vs)
                else:
                    res = _scan_core(c, num, width, times, plan_draft_s, separate_decode, nd, n_limit, n_cov_limit,
                                     early_stop, lengths, surv, picked)
                    if not res.in_range or (res.n_cov < res.n_max and (res.n_star == res.n_cov or not early_stop)):
                        break
                    theta = res.theta_star
                    theta_g = res.theta_best if res.n_cov == res.n_max else NAN
                    verify_tokens = res.n_star
            peak = blocks_used + _blocks_to_hold(dec, num, tok, blk, lengths, 1, block_tokens)
            if peak > capacity:
                break  # KVCacheManager.fit_lookahead trims
            b = num + verify_tokens + chunk_total
            table = &vp if verify_tokens else &dp
            vs = _price_one(table, b, req, d_l_max, d_kv)
            if c_kind:  # Engine._pass_time: a dynamic controller's tax on the pass
                vs = vs * c_tax
            ov = _round_overhead(k_r, overhead_s, c_kind, c_plain_ov, c_spec, c_switch)
            extrapolated = not (table.bt0 <= b <= table.max_b)
            duration = ((0.0 + draft_s) + ov) + vs
            start = now
            end = start + duration
            low = draft_s  # min(draft_s, overhead_s, head_load_s = 0.0), as Python's min compares
            if ov < low:
                low = ov
            if 0.0 < low:
                low = 0.0
            if (b > max_batch_tokens or <double>peak * block_gib + held_gib > fixed_gib + 1e-9
                    or not (vs > 0.0 and duration < INFINITY and low >= 0.0)):
                break  # Engine._check_pass raises
            if c_asked and k_r == 0:  # kept: the controller's answer for this round stands
                _commit_control(c_kind, t_off, t_since, t_probing, &c_off, &c_since, &c_probing)
            if gate_plain:  # kept: the gate's and the depth controller's answers for this round stand
                gain, last_round, skipped = t_gain, t_last, t_skipped
                if e_proposed:
                    e_last, e_target, e_above, e_below, e_below_max = t_last_r, t_target, t_above, t_below, t_below_max
            if k_r and (plan_kind == _PLAN_DSPARK or plan_kind == _PLAN_GOODPUT):  # planned: FallbackGate.report
                # (DSparkPolicy.plan_round and GoodputPolicy.plan report before the pass)
                best_rate = theta_g if isfinite(theta_g) else theta
                plain_rate = <double>num / plain_t
                if ri < last_round:  # a new run
                    gain, skipped = 0.0, 0
                last_round = ri
                if isfinite(best_rate) and isfinite(plain_rate) and best_rate > 0.0 and plain_rate > 0.0:
                    gain = gain + alpha * (log(best_rate / plain_rate) - gain)
            across = not (next_event > end)  # an event falls inside the pass: kept, the caller waits for its end
            if across:
                pf[0], pf[1] = start, duration
            # kept: the clock, acceptance, prefill, coherence, the row
            now = end
            if k_r:  # (a round without drafts draws nothing, and every request emits its bonus token)
                random_standard_uniform_fill(acc_gen, cells, draws)
            take = 0 if k_r == 0 else (diag_left - diag_rows if diag_left - diag_rows < num else num)
            _accept_core(dec, num, k_r, draws, p, lengths, gen, out, nr, ver, acd, tok, blk, block_tokens, acc,
                         would if take > 0 else NULL, fin, totals)
            if take > 0:  # the first request-rounds' diagnostics, row by row as the round path keeps them
                memcpy(dg_raw + diag_rows * width, rw, take * width * sizeof(double))
                memcpy(dg_conf + diag_rows * width, c, take * width * sizeof(double))
                memcpy(dg_would + diag_rows * width, would, take * width)
                diag_rows += take
            blocks_used += totals[2]
            nf = totals[3]
            num_prefill = completed = 0
            if chunk_total:  # Engine._advance_prefill: store the chunks, then the completed prompts' first tokens
                had_prefill = True
                nf = _prefill_core(pre, num_pre, chunks, done, want, tok, gen, out, first, now, fin, nf, more)
                num_prefill, completed = more[0], more[1]
            totals[3] = nf
            tested = verify_tokens
            if tw_vals != NULL:  # TowerCoherence.update_positions: every position's level, R their product
                tested = 0
                n_pos = 0
                for k in range(num):
                    if lengths[k] > n_pos:
                        n_pos = lengths[k]
                for j in range(n_pos):  # (Engine._update_coherence's counts)
                    a_j = t_j = 0
                    for k in range(num):
                        if lengths[k] > j:
                            a_j += acc[k] > j
                            t_j += acc[k] >= j
                    if t_j:  # CoherenceEWMA.update of level j
                        tw_vals[j] = _ewma_step(tw_vals[j], coh_alpha, <double>a_j / <double>t_j)
                        tw_upd[j] += 1
                if n_pos:
                    tw_depth = n_pos if n_pos < tw_levels else tw_levels
                    tw_prod = 1.0  # math.prod, left to right, clamped to [0, 1]
                    for j in range(tw_depth):
                        tw_prod = tw_prod * tw_vals[j]
                    tw_prod = tw_prod if tw_prod > 0.0 else 0.0
                    coh = tw_prod if tw_prod < 1.0 else 1.0
            elif per_tested:  # positions compared against the target: the accepted run and the first rejection
                tested = 0
                for k in range(num):
                    tested += lengths[k] if lengths[k] < acc[k] + 1 else acc[k] + 1
            if tested:  # CoherenceEWMA.update
                coh = _ewma_step(coh, coh_alpha, <double>totals[0] / <double>tested)
                coh_updates += 1
            if c_kind == 2 and verify_tokens:  # AcceptanceTarget.observe: accepted / verified drafts
                c_rate = <double>totals[0] / <double>verify_tokens
                c_ema = c_rate if c_ema != c_ema else c_ema + c_alpha * (c_rate - c_ema)
                if c_ema < c_lo:
                    c_k = c_k_min if c_k_min > c_k - 1 else c_k - 1
                elif c_ema > c_hi:
                    c_k = c_k + 1  # clamped to the depth by the next round's cap
                if c_k == 0:
                    c_ema = NAN  # re-learn from the probes
            elif c_kind == 3 and k_r and c_probing:  # Probing.observe after a probe: the joint acceptance
                c_acc_len = k_r  # by position, np.cumprod of accepted / tested (0 where none was tested)
                for j in range(k_r):
                    a_j = t_j = 0
                    for k in range(num):
                        if lengths[k] > j:
                            a_j += acc[k] > j
                            t_j += acc[k] >= j
                    c_rate = <double>a_j / <double>t_j if t_j > 0 else 0.0
                    c_acc[j] = c_rate if j == 0 else c_acc[j - 1] * c_rate
            if c_kind:
                c_spec = k_r > 0  # Engine._pass_time: speculation on after a round that drafted
            # going on: past the round's completions, and past the events in its pass where they are
            # remote prefills' ends the mirror runs (the wait for the pass's end, then its completions)
            if ab.kind and blocks_used <= capacity and (
                    (nf > 0 and not across) or (across and _absorb_events(&ab, now, out, gen, &next_event))):
                if nf:  # Engine._finish's array work now (the row's KV after is the freed cache, as there)
                    blocks_used -= _absorb_round(&ab, fin, nf, now, blk, ids, &num_run, &next_event)
                    totals[3] = nf = 0
                across = False
                ab_new = True
            _append_row(rows, (start, duration, draft_s, vs, num, num_prefill, chunk_total, b, k_r, verify_tokens,
                               totals[0], totals[1] + completed, consts[0], consts[1], peak, blocks_used, theta,
                               theta_g, 0, 0, py_depth, coh, py_held_gib, py_capacity, 0.0, consts[2], kv_read,
                               ov, 1 if extrapolated else 0))
            rounds += 1
            code = 0
            if across:
                code = 3  # the caller waits for the pass's end, then frees the finished requests
                break
            if nf or blocks_used > capacity:
                code = 2  # requests finished (or the KV check fails): the caller frees them
                break
            if ab.num_wait and _admit_waiting(&ab, now, ids, &num_run, tok, blk, block_tokens, capacity, &blocks_used):
                break  # one cannot be admitted: the round path's admission waits as well (code 0)
            if ab_new:  # the next rows' queues: fewer or more running, in remote prefill
                consts = (0, num_run, ab.remote)
                ab_new = False
    finally:
        PyMem_Free(fbuf)
        PyMem_Free(ibuf)
        PyMem_Free(would)
    return (code, rounds, now, blocks_used, gain, last_round, skipped, coh, coh_updates,
            totals[3] if code == 2 or code == 3 else 0, diag_rows, num, num_pre, had_prefill, h0, h_len,
            (e_last, e_target, e_above, e_below, e_below_max) if is_elastic else None,
            tw_depth if tw_vals != NULL else None,
            _control_state(c_kind, c_spec, c_k, c_ema, c_off, c_since, c_probing, c_acc_len),
            (ab.num, ab.next_req, ab.idle, ab.remote, ab.num_wait, ab.q_len if ab.events else -1)
            if ab.kind else None)

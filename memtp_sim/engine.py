"""The serving engine: one GPU, continuous batching, paged KV memory, speculative rounds.

SimPy drives time: requests are submitted by callbacks on SimPy events, a timeout to each
arrival (open loop) or each user's previous request completing (closed loop), and one engine
process runs rounds. A pass that other events fall inside runs them in place, in SimPy's order
(:meth:`Engine._advance`): the engine process yields only when it has nothing to run, and it is
the only process (every other event is a callback). Per-request state lives in numpy arrays
indexed by request id; each round is vectorised over the decoding requests.

One round (docs/model.md section 1), at time t:

1. **Admit** waiting requests first-come-first-served while ``max_num_seqs`` and the KV cache
   allow: a request is admitted when blocks for its whole prefill (prompt, plus the tokens already
   generated if it was preempted) fit with ``kv_watermark_frac`` of the cache kept free. Those
   blocks are allocated at admission.
2. **Guarantee anchors**: every decoding request needs room for one more token (its anchor); if
   the cache cannot hold them, the most recently admitted request is preempted (its blocks freed,
   recomputed later from scratch: vLLM's recompute preemption) until it can.
3. **Place prefill** (chunked, Sarathi-style): up to ``prefill_chunk_tokens`` prompt tokens of
   admitted requests, first-admitted first, in the budget left after one anchor per decoding
   request. Prefill tokens share the verify pass and count toward its B.
4. **Draft**: every decoding request drafts ``drafter.depth`` tokens (the one owner of the draft
   length, :class:`~memtp_sim.drafting.Drafter`); the drafter's time ``T_draft(R, gamma)`` comes
   from the profile. Acceptance probabilities of the drafted
   positions are drawn now; the (calibrated) confidence head reports them to the policy.
5. **Schedule**: the policy picks verify lengths; speculative tokens that would overflow the KV
   cache are trimmed (drafts are optional, anchors are not).
6. **Verify**: one forward pass of ``B = R + sum(lengths) + prefill tokens`` taking
   ``1 / SPS(B)``.
7. **Accept**: request r keeps its leading accepted drafts plus one bonus token (capped at its
   remaining output); rejected drafts' KV is dropped. A request whose prefill completes emits its
   first token at the end of the pass.

Rounds without drafts (a drafter of depth 0, e.g. ``no_spec``, or the rounds a policy announces
it will decode plainly, e.g. DSpark's fallback between probes) have a fixed outcome and run as
one block (:meth:`Engine._plain_block`, often of one round at high load): while every running
request decodes, no other event falls inside a round but the block's last, no request finishes
before that round and every anchor fits, each round emits one token per request, so the block moves the clock round by round (the same
float additions, each pass priced at its own context) and writes the same round-log rows as the
round-by-round loop, bit for bit (tests/test_plain_blocks.py compares the two).

The hot steps (planning and applying plain blocks, the anchor and lookahead KV sums, a pass's
context, the drafted positions' confidences, acceptance, chunked-prefill placement and
bookkeeping; Algorithm 1's scan and context pricing in their own
modules) run as compiled kernels (``memtp_sim/_kernels.pyx``) when the extension is built and
:data:`memtp_sim._compiled.ENABLED` is True: one call where the numpy code below them makes ~5-25
calls on small arrays. The numpy code stays as their oracle and fallback; both give the same
answers bit for bit (tests/test_kernels.py).

KV blocks are owned by :class:`~memtp_sim.kv_cache.KVCacheManager`. Invariants are checked every
round and a violation raises :class:`~memtp_sim.errors.EngineInvariantError` at once (never a bare
``assert``, which ``python -O`` strips): KV blocks in use never exceed capacity; KV plus draft
heads never exceed memory; a policy's plan stays within what was drafted and the token budget.
"""

from __future__ import annotations

import warnings
from collections import deque
from heapq import heappop
from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np
import simpy
from simpy.events import NORMAL as _NORMAL

from . import _compiled
from ._lazy import expit
from .acceptance import AcceptanceModel
from .confidence import ConfidenceHead
from .drafting import Drafter, DraftSpec, kv_memory_at_start
from .errors import CalibrationError, EngineInvariantError
from .hardware import HardwareProfile
from .hardware.cost import SPSTable
from .kv_cache import KVCacheManager
from . import memtp as _memtp_module
from .memtp import FLOOR_EPSILON, MEMTP_DEFAULTS, CoherenceEWMA, DepthController, TowerCoherence
from .policies._candidates import FallbackGate
from .policies.base import DraftView, Policy, RoundOutcome
from .policies import control as _control_module
from .policies.control import AcceptanceTarget, AlwaysDraft, BatchTable, DisableByBatchSize, DraftControl, Probing
from .policies import dspark as _dspark_module
from .policies.dspark import DSparkAsyncPolicy, DSparkPolicy
from .policies import goodput as _goodput_module
from .policies.goodput import GoodputPolicy
from .policies import _candidates as _candidates_module
from .policies import static as _static_module
from .policies import threshold as _threshold_module
from .policies.static import Mtp1Policy, NoSpecPolicy, StaticPolicy
from .policies.threshold import ThresholdPolicy
from .workload import Workload

__all__ = ["EngineSettings", "EngineState", "Engine", "REJECT_REASONS"]

# ufunc reductions called directly: ndarray.sum/max/any go through a Python frame each (a few us
# a round on the small per-round arrays); integer and bool results are the same
_sum, _min, _max = np.add.reduce, np.minimum.reduce, np.maximum.reduce
_any, _all_true = np.logical_or.reduce, np.logical_and.reduce
_cumsum, _and_accumulate = np.add.accumulate, np.logical_and.accumulate
_UNBOUNDED = 1 << 62  # "no limit" for a count of rounds
_INF = float("inf")
# the most rounds one plain block covers: its (requests x rounds) KV arrays stay a few MB however
# long the outputs (a longer stretch is several blocks in a row)
_MAX_BLOCK_ROUNDS = 4096
_NO_IDS = np.empty(0, dtype=np.int64)  # no prefilling requests (shared, read-only: a slice a round cost 1%)
_NO_IDS.flags.writeable = False

# request status codes
PENDING, WAITING, RUNNING, FINISHED, REJECTED = 0, 1, 2, 3, 4
REJECT_REASONS = ("exceeds_max_model_len", "exceeds_kv_capacity")

ROUND_FIELDS = (
    "start_s", "duration_s", "draft_s", "verify_s", "num_decode", "num_prefill", "prefill_tokens",
    "batch_tokens", "gamma", "verify_tokens", "accepted_tokens", "emitted_tokens", "num_waiting",
    "num_running", "kv_blocks_peak", "kv_blocks_after", "theta", "theta_global", "num_preempted",
    "num_trimmed", "depth", "coherence", "heads_gib", "kv_gib", "free_gib", "kv_capacity_blocks",
    "head_load_s", "num_remote_prefill", "kv_read_tokens", "overhead_s", "cost_extrapolated",
)


def _remote_prefill_memo(profile: HardwareProfile, settings: EngineSettings) -> dict[int, float]:
    """Remote prefill time by prompt length (``Engine._prefill_time_s``): a function of the
    prefill table and the pass size only, so kept on the table and shared by every run of the
    process (profiles load once per process)."""
    return profile.prefill_table.__dict__.setdefault("_remote_prefill_s", {}).setdefault(settings.max_batch_tokens, {})


def _per_position_temperatures(temperatures: np.ndarray | None, width: int) -> np.ndarray:
    """The head's per-position temperatures as the engine keeps them: a C-contiguous float64
    copy of at most ``width`` values (ones when None; one value stands for every position, as
    numpy's broadcasting of ``raw / temps`` would read it), so the compiled round can read them."""
    if temperatures is None:
        return np.ones(width)
    temps = np.array(temperatures, dtype=np.float64).reshape(-1)
    return np.full(width, temps[0]) if temps.size == 1 else temps[:width]


#: the dynamic draft-length controllers drafted blocks keep, and their kind in ``_kernels.drafted_block``
_CONTROL_KINDS = {BatchTable: 1, DisableByBatchSize: 1, AcceptanceTarget: 2, Probing: 3}


def _mirrored() -> dict[tuple[object, str], object]:
    # the functions whose work the drafted-block kernel does in their place, by class or module:
    # a run where one of them is another function (a subclass's, one set on an instance, a patch)
    # runs its rounds one by one, through that function
    names = {DSparkPolicy: ("plan_round", "plan", "_report", "draft_lengths", "plain_rounds_ahead"),
             StaticPolicy: ("plan_round", "plan", "draft_lengths", "plain_rounds_ahead"),
             Mtp1Policy: ("plan_round", "plan", "draft_lengths", "plain_rounds_ahead"),
             ThresholdPolicy: ("plan_round", "plan", "draft_lengths", "plain_rounds_ahead"),
             DSparkAsyncPolicy: ("plan_round", "plan", "draft_lengths", "plain_rounds_ahead", "reset",
                                 "_lagged_capacity"),
             GoodputPolicy: ("plan_round", "plan", "draft_lengths", "plain_rounds_ahead"),
             _goodput_module: ("survival", "draft_budget", "pass_time_s", "plain_rate"),
             _static_module: ("_every_request",),
             _threshold_module: ("survival", "draft_budget", "take_top", "expected_rate"),
             _candidates_module: ("survival", "draft_budget", "ranked_candidates", "take_top", "expected_rate",
                                  "pass_time_s", "plain_rate", "plain_rate_of"),
             FallbackGate: ("report", "draft_lengths", "plain_rounds_ahead", "_reset"), AlwaysDraft: ("cap",),
             # the dynamic draft-length controllers a block keeps asking (and AcceptanceTarget's learning)
             BatchTable: ("cap",), DisableByBatchSize: ("cap",), AcceptanceTarget: ("cap", "observe"),
             Probing: ("cap", "observe"), DraftView: ("expected_rate",), _control_module: ("dynamic_tax_frac", "_lookup"),
             CoherenceEWMA: ("update",), TowerCoherence: ("update_positions", "value_at", "value"),
             # the elastic ensemble's resize (Engine._resize_drafter) before each round but a block's first
             DepthController: ("propose", "_memory_cap", "_set_depth"),
             _memtp_module: ("memtp_depth", "coherence_gate", "_heads_affordable", "_check_free_gib", "_check_count",
                             "_check_unit_interval", "_check_thresholds", "_check_head_cost", "_check_positive_int",
                             "_as_real"),
             KVCacheManager: ("fit_lookahead", "lookahead_total", "anchor_blocks", "lookahead_blocks", "blocks_for"),
             SPSTable: ("at_context", "covers", "is_measured", "pass_time_s", "pass_time_range_s", "_context_one_s",
                        "_context_slice_s"),
             Drafter: ("prefill_time_s", "resize", "memory_at"),
             _dspark_module: ("plain_rate_of", "_compiled_scan", "_scan_compiled", "_plan_round", "_schedule",
                              "hardware_aware_prefix_scheduler", "survival", "draft_budget", "take_top",
                              "expected_rate"),
             Engine: ("_admit", "_guarantee_anchors", "_resize_drafter", "_heads_free_gib", "_waiting_head_blocks",
                      "_draft_length", "_reserve_lookahead", "_place_prefill", "_round_tables", "_tables_at",
                      "_draft_and_plan", "_draft_confidences_compiled", "_pass_time",
                      "_check_pass", "_accept", "_accept_compiled", "_advance_prefill", "_update_coherence",
                      "_record_diag", "_apply_round", "_observe", "_overhead_s")}
    return {(owner, name): getattr(owner, name) for owner, items in names.items() for name in items}


def _mirrored_replaced(engine: "Engine") -> bool:
    """Whether a function the drafted-block kernel mirrors is not the one it mirrors in ``engine``:
    on the engine, its KV manager, policy, gate, controller, coherence, drafter or cost tables (whose
    classes may be subclasses, whose instances may carry their own functions), or in the module."""
    pol = engine.policy
    owners = {DSparkPolicy: (), StaticPolicy: (), Mtp1Policy: (), ThresholdPolicy: (), DSparkAsyncPolicy: (),
              GoodputPolicy: (), FallbackGate: (),
              type(pol): (pol,),  # the policy's own class only: the others' functions are not its
              Engine: (engine,), KVCacheManager: (engine.kv,), AlwaysDraft: (), BatchTable: (), DisableByBatchSize: (),
              AcceptanceTarget: (), Probing: (), type(engine.control): (engine.control,),  # the controller's own class
              CoherenceEWMA: (engine.coherence,), TowerCoherence: (), Drafter: (engine.drafter,),
              SPSTable: (engine.profile.sps, engine.profile.decode_table)}
    if type(pol) in (DSparkPolicy, GoodputPolicy):  # the policies with a gate
        owners[FallbackGate] = (getattr(pol, "_gate", None),)
    controller = engine.drafter.controller
    owners[DepthController] = () if controller is None else (controller,)
    if type(engine.coherence) is TowerCoherence:  # the tower's own functions, and its levels' EWMA's
        owners[TowerCoherence], owners[CoherenceEWMA] = (engine.coherence,), tuple(engine.coherence._levels)
    for (owner, name), fn in _MIRRORED.items():
        objs = owners.get(owner)
        if objs is None:  # a module's function
            if getattr(owner, name) is not fn:
                return True
            continue
        if any(_replaced(obj, name, fn) for obj in objs):
            return True
    return False


def _replaced(obj: object, name: str, fn: object) -> bool:
    """Whether ``obj``'s function ``name`` is not ``fn``: set on the instance, or another on its class."""
    return name in getattr(obj, "__dict__", ()) or getattr(type(obj), name, None) is not fn


def _same_numpy(kernels) -> bool:  # noqa: ANN001 - the kernels module
    """Whether the kernels' drafted blocks draw with this process's numpy (their C random library
    is the one of the numpy they were built against); warns once per process where not."""
    global _numpy_warned
    built = getattr(kernels, "NUMPY_BUILD_VERSION", "")
    if built == np.__version__:
        return True
    if not _numpy_warned:
        _numpy_warned = True
        warnings.warn(f"memtp_sim._kernels was built against numpy {built or '(unknown)'} and this process runs "
                      f"numpy {np.__version__}: drafted rounds run one by one (the same results, slower); "
                      "reinstall memtp_sim (`pip install -e .`) to build against this numpy", RuntimeWarning,
                      stacklevel=4)
    return False


_numpy_warned = False
#: the functions a completion or a remote prefill's end runs (Engine._finish's Python part and what it
#: sets off): a block goes on past them (mirroring their effects) only where each is Engine's own
_COMPLETION_PATH = ("_finish", "_complete", "_release_users", "_user_next", "_user_done", "_submit", "_reject",
                    "_start_remote_prefill", "_prefill_time_s", "_price_prefill_s", "_count_in_system", "_enqueue",
                    "_remote_prefill_done", "_admit", "_advance")
#: the drafted-block kernel's gate fields for a policy without a gate (it reads none of them; the
#: seventh, a plain round's overhead, follows them)
_NO_GATE = (False, 0.0, 0.0, -1, 0, 1)


def _block_pricer(table: SPSTable) -> tuple | None:
    """A cost table's pricing for the drafted-block kernel (``_kernels._Pricer``'s fields): its
    dense pass times, or the arrays and slopes of its context formula; None where the table prices
    by rules the kernel does not read (a latency slope that varies with q)."""
    head = (table.min_batch_tokens, table.max_batch_tokens, int(table.batch_tokens[0]), table.beyond_max != "error")
    if not table.has_context_term:
        return (False, table._dense_pass_s, None, None, 0.0, 0.0, 0.0, *head)
    att = table.attention
    if att.one_slope is None:
        return None
    pad_f, zero_at_pad = table._dense.padded
    return (True, pad_f, zero_at_pad, table._dense.factor, float(att.one_slope), float(att.b_ms_per_kv_token),
            float(att.c_ms_per_pair), *head)


class _PricedOnReadDraftView(DraftView):
    """A :class:`DraftView` whose context fields (``context_tokens``, ``sps``, ``no_draft_pass_s``)
    are priced on their first read, by ``price()`` (which returns the three): most policies and
    draft-length controllers read only ``max_draft_len`` and ``round_index``, and pricing the
    round's tables costs more than the rest of the round's Python. ``price`` prices the context
    the engine saw when it built the view, whenever it is read; :func:`dataclasses.replace` gives
    a view with every field set."""

    _PRICED = frozenset(("context_tokens", "sps", "no_draft_pass_s"))

    def __init__(self, price: Callable[[], tuple[np.ndarray, SPSTable, float]] | None = None, **fields) -> None:
        state = self.__dict__  # the dataclass is frozen: fields go straight into the instance
        state.update(fields)
        state["_price"] = price

    def __getattr__(self, name: str):  # noqa: ANN204 - a field's value
        # only reached for a field not yet in the instance: one of the three priced on read
        price = self.__dict__.get("_price")
        if name not in self._PRICED or price is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        state = self.__dict__
        state["context_tokens"], state["sps"], state["no_draft_pass_s"] = price()
        state["_price"] = None
        return state[name]


class _PlainBlock(NamedTuple):
    """Plain rounds to run as one block (:meth:`Engine._plan_plain_block`): ``times`` (rounds + 1,)
    the clock at each round's start and at the last one's end; ``durations``, ``verify_s`` and
    ``blocks`` (KV blocks after each round's token) (rounds,); ``kv_read`` the KV tokens the first
    pass reads; the rest one value for every round."""

    rounds: int
    times: np.ndarray
    durations: np.ndarray
    verify_s: np.ndarray
    blocks: np.ndarray
    kv_read: int
    draft_s: float
    overhead_s: float
    extrapolated: int


@dataclass(frozen=True)
class EngineSettings:
    """Engine knobs (see :class:`memtp_sim.config.EngineConfig`)."""

    max_batch_tokens: int = 512
    prefill_chunk_tokens: int = 256
    max_num_seqs: int = 256
    kv_watermark_frac: float = 0.01
    prefill: str = "colocated"
    prefill_gpus: int = 1


#: Storage type of each round-log column: exact for the values the engine writes (counts are
#: whole numbers, depths and gamma <= 64), a third of float64's bytes for the counts.
ROUND_DTYPES: dict[str, type] = {f: np.int32 for f in ROUND_FIELDS} | {
    f: np.float64 for f in ("start_s", "duration_s", "draft_s", "verify_s", "theta", "theta_global", "coherence",
                            "heads_gib", "kv_gib", "free_gib", "head_load_s", "overhead_s")
} | {"gamma": np.int8, "depth": np.int8, "cost_extrapolated": np.int8}
# kv_gib and free_gib follow from other columns and the run's constants: computed once at the end
_LOGGED = tuple(f for f in ROUND_FIELDS if f not in ("kv_gib", "free_gib"))
_K_FIELD = _LOGGED.index("gamma")  # a row's k: the positions every decoding request drafted


class _RoundLog:
    """Per-round records as tuples in ``_LOGGED`` order, packed every ``FLUSH`` rounds into typed
    columns (:data:`ROUND_DTYPES`; a tuple costs several times its numbers in memory), about 150
    bytes a round."""

    FLUSH = 4096

    def __init__(self, block_gib: float, fixed_gib: float) -> None:
        self.block_gib, self.fixed_gib = block_gib, fixed_gib
        self.rows: list[tuple] = []
        self.cols: dict[str, list[np.ndarray]] = {f: [] for f in _LOGGED}
        self.append = self.rows.append
        self._pieces = 0  # block pieces appended since the last merge (append_block)
        self._kv_after: list[tuple[int, int]] = []  # (row, blocks): set_last_kv_after's, applied when packed

    #: blocks of at most this many rounds are written as tuples (:meth:`extend`), like single
    #: rounds: 31 typed arrays per block cost more than the rows themselves for the short blocks
    #: of a busy engine; longer ones as columns (:meth:`append_block`)
    SHORT_BLOCK = 64

    def append_block(self, cols: dict[str, np.ndarray | float | int], num_rows: int) -> None:
        """Append ``num_rows`` rounds at once as typed columns: each ``_LOGGED`` field an array of
        that length or one value for every row (after the rows appended so far, in order)."""
        self.flush()
        for f in _LOGGED:
            v = cols[f]
            self.cols[f].append(v.astype(ROUND_DTYPES[f]) if isinstance(v, np.ndarray)
                                else np.full(num_rows, v, dtype=ROUND_DTYPES[f]))
        self._added_piece()

    def set_last_kv_after(self, blocks: int) -> None:
        """Set the last tuple row's KV after its round (``kv_blocks_after``): a block's last round,
        once its finished requests freed their blocks.

        Raises:
            EngineInvariantError: no tuple row waits (the fix would land on a later row).
        """
        if not self.rows:
            raise EngineInvariantError("round log: no row to set the KV after on")
        self._kv_after.append((len(self.rows) - 1, blocks))  # (rebuilding the tuple cost more than the rest)

    def extend(self, rows: list[tuple]) -> None:
        """Append whole rows, tuples in ``_LOGGED`` order (after those appended so far)."""
        self.rows.extend(rows)
        self.flush_if_full()

    def flush_if_full(self) -> None:
        """Pack the rows once :data:`FLUSH` of them wait (after rows were appended to ``rows``)."""
        if len(self.rows) >= self.FLUSH:
            self.flush()

    def _added_piece(self) -> None:
        self._pieces += 1
        if self._pieces >= 256:  # many short pieces: merge those since the last merge (copies stay O(rows))
            for f in _LOGGED:
                keep = len(self.cols[f]) - self._pieces
                self.cols[f][keep:] = [np.concatenate(self.cols[f][keep:])]
            self._pieces = 0

    def flush(self) -> None:
        if self.rows:
            kernels = _compiled.active()
            if kernels is not None:  # one pass over the tuples, no column tuples in between
                cols = [np.empty(len(self.rows), dtype=ROUND_DTYPES[f]) for f in _LOGGED]
                kernels.pack_rows(self.rows, cols)
                for f, col in zip(_LOGGED, cols):
                    self.cols[f].append(col)
            else:  # column by column, straight to each column's type
                for f, col in zip(_LOGGED, zip(*self.rows)):
                    self.cols[f].append(np.array(col, dtype=ROUND_DTYPES[f]))
            kv_after = self.cols["kv_blocks_after"][-1]
            for row, blocks in self._kv_after:
                kv_after[row] = blocks
            self._kv_after.clear()
            self.rows.clear()
            self._added_piece()

    def arrays(self) -> dict[str, np.ndarray]:
        self.flush()
        cols = {f: (np.concatenate(b) if b else np.empty(0, dtype=ROUND_DTYPES[f])) for f, b in self.cols.items()}
        self.cols, self._pieces = {f: [] for f in _LOGGED}, 0
        cols["kv_gib"] = cols["kv_blocks_after"] * self.block_gib  # the same products the rounds used
        cols["free_gib"] = (self.fixed_gib - cols["heads_gib"]) - cols["kv_gib"]
        return {f: cols[f] for f in ROUND_FIELDS}


@dataclass
class EngineState:
    """Raw per-request arrays and counters after a run (input to :mod:`memtp_sim.metrics`).

    All ``*_at_s`` arrays have shape (n,) and are NaN where the event never happened.
    """

    arrival_at_s: np.ndarray
    ready_at_s: np.ndarray  # joined this GPU's admission queue (arrival, or remote prefill done)
    admitted_at_s: np.ndarray
    first_token_at_s: np.ndarray
    finished_at_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    generated_tokens: np.ndarray
    domain: np.ndarray
    difficulty: np.ndarray
    status: np.ndarray
    reject_reason: np.ndarray  # object array of str ("" when not rejected)
    num_preemptions: np.ndarray
    num_rounds: np.ndarray  # decode rounds each request took part in
    draft_tokens_verified: np.ndarray
    draft_tokens_accepted: np.ndarray
    rounds: dict[str, np.ndarray]
    kv_capacity_blocks: int
    end_s: float
    last_arrival_s: float
    confidence_raw: np.ndarray  # (n_diag, gamma) raw head confidences, first request-rounds
    confidence_used: np.ndarray  # (n_diag, gamma) after temperatures (what the policy saw)
    confidence_outcome: np.ndarray  # (n_diag, gamma) bool, positions 1..k all accepted
    confidence_width: np.ndarray  # (n_diag,) positions drafted in that round (rest is padding)
    in_system_area: float = 0.0  # integral over time of requests in the system, request-seconds
    num_depth_changes: int = 0
    num_not_arrived: int = 0  # requests asked for that never arrived (a rate schedule ended first)
    closed_loop: bool = False


class Engine:
    """One simulated GPU running ``policy`` on ``workload`` (see module docstring).

    Args:
        profile: hardware profile (SPS table, drafter cost, memory).
        acceptance: acceptance model of the drafter on this target.
        workload: requests (arrays).
        policy: verification-length policy.
        settings: engine knobs.
        rng: the run's random generator (the only source of randomness).
        progress: optional callback ``progress(num_done, num_total)`` called every ~2% of requests.
        head: confidence head (default: oracle, c = p).
        temperatures: per-position calibration temperatures applied to the head's logits,
            shape (>= drafter.max_draft_len,) (default: ones).
        head_rng: random generator of the head's noise (kept apart from ``rng`` so that head
            settings do not shift the acceptance draws).
        drafter: the drafter (draft length, memory, MEMTP depth); default: the classic drafter
            drafting ``policy.draft_len`` positions.
        control: the draft-length controller (default: always draft what the drafter offers).
        logit_shift: acceptance drift, ``logit_shift(now_s, generated (R,), context (R,)) -> (R,)``
            logits added to every drafted position (workload phases, output position, context).

    Raises:
        CalibrationError: no KV block fits next to the weights, reserve and drafter.
    """

    #: request-rounds of (confidence, outcome) kept for calibration diagnostics
    DIAG_ROUNDS = 20000

    def __init__(self, profile: HardwareProfile, acceptance: AcceptanceModel, workload: Workload,
                 policy: Policy, settings: EngineSettings, rng: np.random.Generator,
                 progress: Callable[[int, int], None] | None = None, head: ConfidenceHead | None = None,
                 temperatures: np.ndarray | None = None, head_rng: np.random.Generator | None = None,
                 drafter: Drafter | None = None, control: DraftControl | None = None,
                 logit_shift: Callable[[float, np.ndarray, np.ndarray], np.ndarray] | None = None) -> None:
        self.profile = profile
        self.control = control if control is not None else AlwaysDraft(AlwaysDraft.Params())
        self.logit_shift = logit_shift
        self._spec_on = True
        self._probe_buffers = {}  # probing in drafted blocks: drafting times by k and the acceptance's buffer, by batch
        self.drafter = drafter if drafter is not None else Drafter(
            DraftSpec(policy.name, policy.params.model_dump(), int(policy.draft_len)), profile)
        memtp = self.drafter.spec.memtp
        self.head = head if head is not None else ConfidenceHead(oracle=True)
        width = self.drafter.max_draft_len
        self.temps = _per_position_temperatures(temperatures, width)
        self.head_rng = head_rng if head_rng is not None else np.random.default_rng(0)
        self._diag_parts: list[tuple] = []  # see _record_diag and _kept_diag
        self._diag_width = width
        self.diag_n = 0
        self.acc = acceptance
        self.wl = workload
        self.policy = policy
        self.cfg = settings
        self.rng = rng
        self.progress = progress
        self.env = simpy.Environment()

        n = self.n = workload.num_requests
        self.prompt = workload.prompt_tokens.astype(np.int64)
        self.output = workload.output_tokens.astype(np.int64)
        self._prompt_list, self._output_list = self.prompt.tolist(), self.output.tolist()  # per-request reads
        self.domain = workload.domain.astype(np.int64)
        self.difficulty = acceptance.sample_difficulty(rng, n)
        nan = np.full(n, np.nan)
        self.arrival_at = workload.arrival_s.astype(np.float64).copy() if not workload.closed_loop else nan.copy()
        self.ready_at, self.admitted_at = nan.copy(), nan.copy()
        self.first_token_at = nan.copy()
        self.finished_at = nan.copy()
        self.status = np.zeros(n, dtype=np.int8)
        self.reject_reason = np.full(n, "", dtype=object)
        self.generated = np.zeros(n, dtype=np.int64)
        self.prefill_target = np.zeros(n, dtype=np.int64)  # tokens to (re)compute before decoding
        self.prefilled = np.zeros(n, dtype=np.int64)
        self.num_preemptions = np.zeros(n, dtype=np.int64)
        self.num_rounds = np.zeros(n, dtype=np.int64)
        self.verified = np.zeros(n, dtype=np.int64)
        self.kv_transferred = np.zeros(n, dtype=bool)
        self.accepted = np.zeros(n, dtype=np.int64)

        mem, capacity = kv_memory_at_start(profile, self.drafter)
        self.mem = mem
        self.block_gib = mem.kv_block_gib
        half_life = memtp.coherence_half_life_rounds if memtp is not None else MEMTP_DEFAULTS.coherence_half_life_rounds
        if memtp is not None and memtp.coherence == "tower":  # R = product of per-level EWMAs (issue 14)
            self.coherence = TowerCoherence(max_levels=max(1, self.drafter.max_draft_len), half_life_rounds=half_life)
        else:
            self.coherence = CoherenceEWMA(half_life, initial=1.0)
        if capacity <= 0:  # (scenario validation refuses it first: this is for hand-built engines)
            raise CalibrationError(
                f"{profile.path}: no KV memory left: {mem.gpu_allocatable_gib:.1f} GiB allocatable, weights "
                f"{mem.weights_gib:.1f}, reserve {mem.reserve_gib:.1f}, draft heads/drafter "
                f"{self.drafter.held_gib:.1f} GiB")
        self.kv = KVCacheManager(n, mem.kv_block_tokens, capacity, settings.kv_watermark_frac)
        # KV blocks with the fewest heads this engine can run (elastic: one head)
        self.max_capacity = mem.kv_capacity_blocks(speculative=False, other_gib=self.drafter.min_held_gib)
        self.waiting: deque[int] = deque()
        self.running: list[int] = []  # admission order
        self.num_done = 0
        self.num_remote_prefill = 0  # requests queued for or in a remote prefill GPU
        self.in_system, self.in_system_area, self._in_system_since = 0, 0.0, 0.0  # Little's law's L: _count_in_system
        self.last_arrival = 0.0
        self.log = _RoundLog(self.block_gib, mem.gpu_allocatable_gib - mem.weights_gib - mem.reserve_gib)
        self._tables = self._run_ids = None  # caches: see _round_tables and _guarantee_anchors
        self._wake: simpy.Event | None = None
        self._progress_step = max(1, n // 50)
        self._prefill_idle = settings.prefill_gpus  # remote prefill GPUs free now
        self._prefill_queue, self._prefill_memo = deque[int](), _remote_prefill_memo(profile, settings)  # FIFO
        # while a block's actions are replayed (_absorbed): the requests whose remote prefill ends in
        # them, and the end times of those whose prefill started there too (no SimPy event made)
        self._replay_ends: frozenset[int] | set[int] = frozenset()
        self._replay_started: dict[int, float] = {}
        self._init_users(workload, settings)
        self._use_kernels(n)
        self._init_request_paths(profile.memory.max_model_len, settings)

    def _init_request_paths(self, max_model_len: int, settings: EngineSettings) -> None:
        """What the per-request paths (submission, admission) read, decided once per run: the
        requests refused as they arrive, by reason (longer than the model takes, or more KV blocks
        than the cache holds with the fewest heads: their sizes and that capacity decide), the
        admission limit (every running request may need one anchor token in a pass: never more
        than the pass holds) and whether prompts go to remote prefill GPUs."""
        totals = self.prompt + self.output
        too_long, too_large = totals > max_model_len, self.kv.blocks_for(totals) > self.max_capacity
        self._refused = {int(i): "exceeds_max_model_len" if too_long[i] else "exceeds_kv_capacity"
                         for i in np.flatnonzero(too_long | too_large)}
        self._admit_limit = min(settings.max_num_seqs, settings.max_batch_tokens)
        self._disaggregated = settings.prefill == "disaggregated"

    def _init_users(self, workload: Workload, settings: EngineSettings) -> None:
        # closed-loop users: the next request to submit, and each request's completion event; where
        # a submission cannot join the queue at the instant it is made (it goes to a remote prefill
        # GPU, or waits out a think time) each completion lets its user go on at once instead
        # (_complete), without a SimPy event that would stop the engine's block of rounds there
        self._next_request = 0
        self._done_events: dict[int, simpy.Event] = {}
        self._resubmit_at_once = workload.closed_loop and (settings.prefill == "disaggregated"
                                                           or workload.think_time_s > 0)
        self._users_due, self._holding_users = 0, False
        # a completion's user goes on: _user_done's choice, made once (without a think time, at once)
        self._user_go_on = self._user_next if workload.think_time_s <= 0 else self._user_done

    def _use_kernels(self, n: int) -> None:
        # the compiled kernels (memtp_sim/_kernels.pyx) or None: plain pricing per batch size, and
        # scratch arrays the kernels write into (block times, durations, pass times, KV blocks; ids)
        self._kernels = _compiled.active()
        self.kv.kernels = self._kernels
        self._plain_prices: dict[int, tuple | None] = {}
        self._plain_prices_by_b: list = []  # the same as a list, for plain blocks' absorbed completions
        self._plain_fused: tuple | None = None  # _plain_block_inputs, set as the rounds start
        self._finished_after_wait: list[int] | None = None  # a drafted block's, freed after its last pass
        self._kv_kernels = None  # the kernels admission and completions use: _kv_kernels_if_own, as the rounds start
        self._scratch = None if self._kernels is None else (  # times, durations, verify_s, blocks, finished
            np.empty(_MAX_BLOCK_ROUNDS + 1), np.empty(_MAX_BLOCK_ROUNDS), np.empty(_MAX_BLOCK_ROUNDS),
            np.empty(_MAX_BLOCK_ROUNDS, dtype=np.int64), np.empty(n, dtype=np.int64))

    # ----------------------------------------------------------------- arrivals
    def _count_in_system(self, delta: int) -> None:
        # time integral of requests in the system (arrived, not yet finished or rejected): the
        # L of Little's law, kept from the engine's own state changes
        now = self.env._now  # (the now property is a call: ~3,000 a run read it here and below)
        self.in_system_area += self.in_system * (now - self._in_system_since)
        self._in_system_since = now
        self.in_system += delta

    def _submit(self, i: int) -> None:
        self._count_in_system(+1)
        now = self.env._now
        self.arrival_at[i] = now
        self.last_arrival = now
        if i in self._refused:
            self._reject(i, self._refused[i])
            return
        if self._disaggregated:
            self.num_remote_prefill += 1
            if self._prefill_idle:
                self._prefill_idle -= 1
                self._start_remote_prefill(i)
            else:
                self._prefill_queue.append(i)
            return
        self._enqueue(i)

    def _enqueue(self, i: int) -> None:
        self.ready_at[i] = self.env._now
        self.status[i] = WAITING
        self.waiting.append(i)
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    # Disaggregated serving (the DSpark paper's production setting, section 5.4): prefill_gpus
    # separate GPUs with the same profile compute prompts FIFO, one prompt each at a time, in passes
    # of up to max_batch_tokens tokens, and emit the first token; the KV then moves to this decode
    # GPU (transfer time not modelled). A FIFO multi-server queue kept by hand (an idle count and a
    # queue) with one SimPy timeout per prompt: a process and a Resource per request cost more
    # events than the rest of a request's life at high load.
    def _start_remote_prefill(self, i: int) -> None:
        delay = self._prefill_time_s(self._prompt_list[i])
        if i in self._replay_ends:  # it ends in the block being replayed too: no event, its id taken as SimPy takes one
            next(self.env._eid)
            self._replay_started[i] = self.env._now + delay  # (SimPy's time for it: the same sum)
            return
        # the request id as the timeout's value: one bound method for every prompt, no closure each
        self.env.timeout(delay, i).callbacks.append(self._remote_prefill_done)

    def _remote_prefill_done(self, done: simpy.Event) -> None:
        i = done.value
        if self._prefill_queue:  # this GPU takes the next prompt at once
            self._start_remote_prefill(self._prefill_queue.popleft())
        else:
            self._prefill_idle += 1
        self.num_remote_prefill -= 1
        self.first_token_at[i] = self.env._now
        self.generated[i] = 1
        self.kv_transferred[i] = True
        if 1 >= self._output_list[i]:  # the one token generated so far
            self.finished_at[i] = self.env._now
            self.status[i] = FINISHED
            self._complete(i)
            return
        self._enqueue(i)

    def _prefill_time_s(self, prompt: int) -> float:
        """A remote prefill GPU's time for one prompt: passes of max_batch_tokens, each attending
        to the prompt tokens before it (the profile's prefill table).

        A table with a context term prices that attention itself. A table without one was
        measured on whole prompts from an empty cache (llama-bench pp, the H200 prefill rows), so
        T(P) holds the attention of P tokens over each other but a chunk priced alone holds none
        over the chunks before it: a later chunk costs what it adds to the whole prompt,
        T(done + chunk) - T(done), and never less than the chunk alone, T(chunk). The chunks
        then sum to at least T(prompt) where the table prices it (one pass is never slower).
        """
        t = self._prefill_memo.get(prompt)
        if t is None:  # prompt lengths repeat across a trace: priced once each
            t = self._prefill_memo[prompt] = self._price_prefill_s(prompt)
        return t

    def _price_prefill_s(self, prompt: int) -> float:
        m = self.cfg.max_batch_tokens
        table = self.profile.prefill_table
        whole_prompts = not table.has_context_term
        t, done = 0.0, 0
        while done < prompt:
            chunk = min(m, prompt - done)
            t_chunk = float(table.at_context(1, done, done).pass_time_s(chunk))
            if done and whole_prompts and table.covers(done + chunk):
                t_chunk = max(t_chunk, float(table.pass_time_s(done + chunk)) - float(table.pass_time_s(done)))
            t += t_chunk
            done += chunk
        return t

    def _reject(self, i: int, reason: str) -> None:
        self.status[i] = REJECTED
        self.reject_reason[i] = reason
        self._complete(i)

    # Open loop: requests arrive at their trace times, each submitted by a callback on a timeout
    # to its arrival (a process resumption per arrival cost more); due ones at once, in order.
    def _open_loop_next(self, waited: simpy.Event | None = None) -> None:
        order, env = self._arrival_order, self.env
        if waited is not None:  # the timeout to the next arrival fired: it arrives now
            self._next_arrival += 1
            self._submit(order[self._next_arrival - 1])
        while self._next_arrival < len(order):
            i = order[self._next_arrival]
            delay = self.arrival_at[i] - env.now
            if delay > 0:
                env.timeout(delay).callbacks.append(self._open_loop_next)
                return
            self._next_arrival += 1
            self._submit(i)

    # A closed-loop user submits a request, waits for it to complete (and its think time), then
    # submits the next: callbacks on the completion event, where a SimPy process per user cost a
    # process resumption per request; the callbacks run at the same points of the event queue.
    def _user_next(self, _event: simpy.Event | None = None) -> None:
        if self._next_request >= self.n:
            return
        i = self._next_request
        self._next_request += 1
        if not self._resubmit_at_once:
            done = self.env.event()
            self._done_events[i] = done
            done.callbacks.append(self._user_done)
        self._submit(i)

    def _user_done(self, _event: simpy.Event | None) -> None:
        if self.wl.think_time_s > 0:
            self.env.timeout(self.wl.think_time_s).callbacks.append(self._user_next)
        else:
            self._user_next()

    def _complete(self, i: int) -> None:
        self._count_in_system(-1)
        self.num_done += 1
        if not self._resubmit_at_once:  # (users that go on at once wait on no event)
            ev = self._done_events.pop(i, None)
            if ev is not None:
                ev.succeed()
        # A request can end outside a round (rejected at arrival, or done at remote prefill)
        # while the engine sleeps: wake it so it can notice the run is over.
        wake = self._wake
        if wake is not None and not wake.triggered:
            wake.succeed()
        if self.progress is not None and (self.num_done % self._progress_step == 0 or self.num_done == self.n):
            self.progress(self.num_done, self.n)
        if self._resubmit_at_once:
            self._users_due += 1
            if not self._holding_users:
                self._release_users()

    def _release_users(self) -> None:
        """Let the users of completed requests go on: one loop, so that a submission rejected at
        once (which completes, and frees its user, inside it) queues behind instead of recursing.
        Requests are submitted in id order whichever user goes on first (users hold no state but
        their next submission), so the order is the event path's."""
        self._holding_users = True
        while self._users_due:
            self._users_due -= 1
            self._user_go_on(None)
        self._holding_users = False

    # ----------------------------------------------------------------- memory
    def _heads_free_gib(self) -> float:
        """Memory that can fund MEMTP heads: allocatable - weights - reserve - KV in use - the
        blocks the decoding requests' anchors take this round - the KV the head-of-line waiting
        request needs to be admitted (KV first: heads are released before KV would overflow or a
        request would wait for memory held by heads; a lone request's anchor cannot be made room
        for by preempting another)."""
        pending = 0
        if self.running:  # the running ids as _guarantee_anchors keeps them (valid until the set changes)
            run, all_decode = self._run_ids if self._run_ids is not None else (
                np.fromiter(self.running, dtype=np.int64, count=len(self.running)), None)
            pending = self.kv.anchor_blocks(run if all_decode else run[self.prefilled[run] >= self.prefill_target[run]])
        pending += self._waiting_head_blocks()
        kv_gib = (self.kv.blocks_used + pending) * self.block_gib
        return max(0.0, self.log.fixed_gib - kv_gib)  # fixed_gib: allocatable - weights - reserve

    def _waiting_head_blocks(self) -> int:
        """KV blocks the head-of-line waiting request needs to be admitted (its prompt, and the
        tokens it generated unless its KV was transferred), with the watermark; 0 when none waits."""
        if not self.waiting:
            return 0
        i = self.waiting[0]
        tokens = self.prompt[i] if self.kv_transferred[i] else self.prompt[i] + self.generated[i]
        return int(self.kv.blocks_for(tokens)) + self.kv.watermark

    def _resize_drafter(self, round_index: int) -> float:
        """Elastic MEMTP: resize the ensemble and the KV capacity; returns head-load stall seconds."""
        old = self.drafter.depth
        stall_s = self.drafter.resize(self._heads_free_gib(), self.coherence.value, round_index)
        if self.drafter.depth != old:
            self.kv.set_capacity(self.mem.kv_capacity_blocks(speculative=False,
                                                                        other_gib=self.drafter.held_gib))
        return stall_s

    def _preempt(self, i: int) -> None:
        # Recompute preemption: drop all KV; re-prefill prompt + generated tokens later.
        self.kv.free(i, drop_tokens=True)
        self.prefilled[i] = 0
        self.num_preemptions[i] += 1
        self.kv_transferred[i] = False
        self.status[i] = WAITING
        self.running.remove(i)
        self._run_ids = None
        self.waiting.appendleft(i)

    def _kv_kernels_if_own(self):  # noqa: ANN202 - the kernels module or None
        """The compiled kernels for admission and completions (``_kernels.admit``, ``finish``), or
        None where the KV manager is not :class:`KVCacheManager` itself or one of the functions
        whose work they do (``blocks_for``, ``can_allocate``, ``allocate``, ``free``) has been
        replaced on its class or instance: the Python loops then call it."""
        kv = self.kv
        if self._kernels is None or type(kv) is not KVCacheManager:
            return None
        if any(_replaced(kv, name, fn) for name, fn in _KV_OWN.items()):
            return None
        return self._kernels

    def _admit(self) -> None:
        if not self.waiting:  # most calls at high load: nothing arrived since the last round
            return
        kv, limit = self.kv, self._admit_limit
        if self._kv_kernels is not None:  # the loop below in one call (_kernels.admit), the same state
            num, kv.blocks_used, stuck = self._kv_kernels.admit(
                self.waiting, self.running, limit, self.env._now, self.prompt, self.generated, self.kv_transferred,
                self.status, self.admitted_at, self.prefill_target, self.prefilled, kv.tokens, kv.blocks,
                kv.block_tokens, kv.watermark, kv.capacity, kv.blocks_used)
            if num:
                self._run_ids = None
            if not stuck:
                return  # (stuck: the head-of-line request holds blocks: kv.allocate below raises)
        while self.waiting and len(self.running) < limit:
            i = self.waiting[0]
            # KV transferred from a prefill GPU covers the prompt (the first token is the anchor);
            # otherwise prompt + generated tokens are (re)computed here, emitting one token.
            transferred = bool(self.kv_transferred[i])
            target = self._prompt_list[i] if transferred else self._prompt_list[i] + int(self.generated[i])
            if not kv.can_allocate(int(kv.blocks_for(target)), keep_watermark=bool(self.running)):
                break  # an empty engine always admits: oversize requests were rejected at arrival
            self.waiting.popleft()
            self.status[i] = RUNNING
            if self.admitted_at[i] != self.admitted_at[i]:  # NaN: admitted for the first time
                self.admitted_at[i] = self.env._now
            self.prefill_target[i] = target
            self.prefilled[i] = target if transferred else 0
            kv.allocate(i, target, target if transferred else 0)
            self.running.append(i)
            self._run_ids = None

    # ----------------------------------------------------------------- rounds
    def _advance(self, duration: float) -> None:
        """Move the clock ``duration`` seconds on (a pass), running the events due before its end
        in place: what ``yield env.timeout(duration)`` does for the engine's process, without
        suspending and resuming it (its only process: every other event is a callback; the process
        resumption cost ~8,000 instructions a wait). Exact: the timeout's place in SimPy's queue,
        ``(end, NORMAL, eid)``, is taken (its event id as the timeout would take it), and the events
        before it run in the queue's order, as ``env.run`` would run them
        (SimPy 4.1: ``Environment._queue``, ``_eid`` and ``_now`` are private; a test checks them).

        Args:
            duration: seconds, >= 0 (the round checks have refused a negative pass time).
        """
        env = self.env
        end = env._now + duration  # as Environment.schedule adds a timeout's delay
        stop, queue, step = (end, _NORMAL, next(env._eid)), env._queue, env.step
        try:
            while queue and queue[0] < stop:  # (time, priority, eid, event): eids are unique, events never compared
                step()
        except BaseException:
            # an event's callback raised (a progress callback's cancel, Ctrl-C): raised here, inside
            # the engine's process, SimPy would fail the process at the back of this instant's
            # events, which would run first; with nothing left queued the failure is the next event,
            # and env.run raises it at once, as it raised it from its own step
            queue.clear()
            raise
        env._now = end

    def _engine(self):
        env, drafter = self.env, self.drafter
        listens, plain_ok = self._listens(), self._plain_blocks_possible()
        block, by_depth = self._drafted_setup()
        dynamic = by_depth is not None and self.control.dynamic  # a controller the kernel keeps (asked once a round)
        self._start_rounds(plain_ok)
        round_index = 0
        while self.num_done < self.n:
            busy = drafter.elastic and (self.running or self.waiting)
            head_load_s, gamma = (self._resize_drafter(round_index) if busy else 0.0), drafter.depth
            self._admit()
            if not self.running:
                if self.waiting:
                    raise EngineInvariantError("admission stalled on an idle engine: the head-of-line request "
                                               "fits no KV capacity")
                self._wake = env.event()
                yield self._wake
                self._wake = None
                continue
            dec, pre, num_preempted = self._guarantee_anchors()
            self._tables = None
            if plain_ok and not pre.size and not num_preempted:
                ahead = self.policy.plain_rounds_ahead(round_index) if gamma > 0 else _UNBOUNDED
                rounds = self._plain_run(dec, ahead, gamma, head_load_s, round_index) if ahead >= 1 else 0
                if rounds:
                    if gamma > 0:
                        self.policy.skip_plain_rounds(round_index, rounds)
                    round_index += rounds
                    continue
            drafted, k, width = None, gamma, gamma  # a round the block drew but did not keep: (probs, raw, conf)
            if by_depth is not None:  # the elastic ensemble's depth or a dynamic controller's k, and its inputs
                k, width, block = self._inputs_this_round(by_depth, dynamic, dec, gamma, round_index)
            if block is not None and dec.size and not num_preempted and not head_load_s:  # drafted rounds at once
                # (exact; a round that loads heads stalls for them, one of prefill alone stops the kernel: the round path)
                rounds, dec, pre, drafted, wait_s = self._drafted_block(dec, pre, width, round_index, block, k)
                round_index += rounds
                if wait_s:  # its last round's pass runs across the next event: wait for its end
                    self._advance(wait_s)
                    self._drafted_waited()
                if rounds and drafted is None:
                    continue
            k = width if drafted is not None else (k if dynamic else self._draft_length(dec, gamma, round_index))
            if k:  # each decoding request reserves 1 + k KV slots (vLLM allocate_slots lookahead)
                dec, pre, more = self._reserve_lookahead(dec, pre, k)
                num_preempted += more
            num_dec = dec.size
            chunks, chunk_total = self._place_prefill(pre, num_dec * (1 + k))
            kv_read, verify_table, decode_table = self._round_tables(dec, pre, chunks, chunk_total)
            draft_s, lengths, probs, raw, conf, theta, theta_g, planned_tokens = self._draft_and_plan(
                dec, k, chunk_total, round_index, verify_table, decode_table, drafted)
            draft_s += drafter.prefill_time_s(chunk_total)  # a draft model prefills its own cache too
            kv_peak, num_trimmed = self.kv.fit_lookahead(dec, lengths)
            verify_tokens = planned_tokens - num_trimmed  # fit_lookahead trims one token at a time
            batch_tokens = num_dec + verify_tokens + chunk_total
            verify_s, extrapolated, overhead_s = self._pass_time(
                verify_table if verify_tokens else decode_table, batch_tokens, num_dec, k, probs is not None)
            duration = head_load_s + draft_s + overhead_s + verify_s
            self._check_pass(round_index, batch_tokens, kv_peak, verify_s, draft_s, overhead_s, head_load_s, duration)
            start = env.now
            num_waiting, num_running, num_remote = len(self.waiting), len(self.running), self.num_remote_prefill
            end = start + duration
            if env.peek() > end:
                # nothing else happens before the pass ends: move the clock without a SimPy event
                # (the same time a timeout would reach; private to SimPy, but 10% of a round)
                env._now = end
            else:
                self._advance(duration)

            accepted_total, emitted_total, num_prefill = self._apply_round(
                dec, pre, lengths, probs, raw, conf, chunks, chunk_total, verify_tokens, listens)
            self.log.append((
                start, duration, draft_s, verify_s, num_dec, num_prefill, chunk_total, batch_tokens,
                k if num_dec else 0, verify_tokens, accepted_total, emitted_total, num_waiting,
                num_running, kv_peak, self.kv.blocks_used, theta, theta_g, num_preempted, num_trimmed,
                gamma, self.coherence.value, drafter.held_gib,
                self.kv.capacity, head_load_s, num_remote, kv_read, overhead_s, extrapolated,
            ))
            round_index += 1
            if round_index % _RoundLog.FLUSH == 0:
                self.log.flush()

    def _apply_round(self, dec: np.ndarray, pre: np.ndarray, lengths: np.ndarray, probs, raw, conf,  # noqa: ANN001
                     chunks: np.ndarray | None, chunk_total: int, verify_tokens: int, listens: bool) -> tuple[int, int, int]:
        """Step 7 after the pass: acceptance, the prefill chunks, completions, coherence and the
        learners. Returns (accepted drafts, tokens emitted, requests that prefilled)."""
        accepted_total, emitted_total, finished, acc = self._accept(dec, lengths, probs, raw, conf)
        num_prefill, emitted_pre = self._advance_prefill(pre, chunks, chunk_total, finished)
        if finished:
            self._finish(finished)
        if probs is not None:
            self._update_coherence(lengths, acc, accepted_total, verify_tokens)
            if listens:
                self._observe(lengths, acc, probs.shape[1])
        return accepted_total, emitted_total + emitted_pre, num_prefill

    # ----------------------------------------------------------------- plain blocks
    #: run rounds without drafts as blocks (exact: see _plain_block); tests switch it off to compare
    PLAIN_BLOCKS = True

    def _plain_blocks_possible(self) -> bool:
        """Whether rounds without drafts can ever run as blocks here: the drafter's depth is fixed
        (not elastic) and no dynamic controller decides or taxes the passes. Which rounds are
        plain: all of them at depth 0, else those the policy announces
        (:meth:`~memtp_sim.policies.base.Policy.plain_rounds_ahead`)."""
        return self.PLAIN_BLOCKS and not self.drafter.elastic and not self.control.dynamic

    def _plain_block_inputs(self) -> tuple | None:
        """The run's fixed inputs of ``_kernels.plain_block`` in :meth:`_plain_run`: a plain
        round's draft and host times, and the round checks' limits (``(max_batch_tokens,
        block_gib, fixed_gib)``); None where plain blocks are planned and run apart: without the
        kernels, or where :meth:`_check_pass` or the drafter's ``prefill_time_s`` has been replaced
        (on a subclass or the instance: those run, once per block)."""
        if (self._kernels is None or _replaced(self, "_check_pass", _MIRRORED[Engine, "_check_pass"])
                or _replaced(self.drafter, "prefill_time_s", _MIRRORED[Drafter, "prefill_time_s"])):
            return None
        # as _plan_plain_block prices them: fixed for a run whose rounds can run as plain blocks
        return (0.0 + self.drafter.prefill_time_s(0), self._overhead_s(False),
                (self.cfg.max_batch_tokens, self.block_gib, self.log.fixed_gib))

    def _plan_plain_block(self, dec: np.ndarray, ahead: int) -> _PlainBlock | None:
        """The plain rounds from now (all running requests decoding, nothing drafted) that can run as
        one block with the same outcome as round by round, priced (None: not even this round): at
        most ``ahead`` (>= 1, the plain rounds the policy announced) and :data:`_MAX_BLOCK_ROUNDS`,
        up to and including the round where the first request finishes, while no other SimPy event
        falls inside a round but the last (the round-by-round path's ``env.peek()`` check), and
        while every round's anchors fit the KV cache. Each pass is priced at its own context (every
        request one token longer a round) with the same float operations as the round path. A
        block of one round is this round alone (at high load most plain rounds: a request finishes
        or arrives every round), run by the same code.

        Admission stays as it was: it failed this round (or nothing waits), and within a block no
        request finishes before the last round, so no KV or batch slot frees up."""
        num_dec = dec.size
        if not num_dec or len(self.running) != num_dec:
            return None
        if self._kernels is not None:
            price = self._plain_prices.get(num_dec, False)
            if price is False:
                price = self._plain_price_at(num_dec)
            if price is not None:
                return self._plan_plain_block_compiled(dec, ahead, price)
        now, next_event = self.env.now, self.env.peek()
        kv_read, _, decode_table = self._round_tables(dec, dec[:0], None, 0)  # this round's, as the round path prices it
        first_s, extrapolated, overhead_s = self._pass_time(decode_table, num_dec, num_dec, 0, False)
        draft_s = 0.0 + self.drafter.prefill_time_s(0)
        fixed_s = 0.0 + draft_s + overhead_s  # head load 0 + draft + overhead, as the round path adds them
        tokens = self.kv.tokens[dec]
        bt = self.kv.block_tokens
        first_end = now + (fixed_s + first_s)
        if first_end >= next_event:  # an event falls inside this very round (at high load, most rounds)
            rounds = 1
        else:
            rounds = min(int(_min(self.output[dec] - self.generated[dec])), ahead, _MAX_BLOCK_ROUNDS)
        if rounds == 1:
            blocks = int(_sum(-(-(tokens + 1) // bt)))  # KV after this round's token, its peak
            if blocks > self.kv.capacity:
                return None
            return _PlainBlock(1, np.array((now, first_end)), np.array((fixed_s + first_s,)), np.array((first_s,)),
                               np.array((blocks,)), kv_read, draft_s, overhead_s, extrapolated)
        steps = np.arange(rounds)
        verify_s = self.profile.decode_table.pass_times_along_s(
            num_dec, num_dec, int(_max(tokens)) + steps, int(_sum(tokens)) + num_dec * steps)
        if verify_s is None or verify_s[0] != first_s:  # a rule this does not cover: round by round
            return None
        durations = fixed_s + verify_s
        times = _cumsum(np.concatenate(([now], durations)))
        late = times[1:] >= next_event
        if _any(late):
            rounds = int(late.argmax()) + 1  # a round may reach the next event only as the block's last
        # KV after round j's token, its peak: every request holds t + j + 1 tokens
        blocks = _sum(-(-(tokens[:, None] + steps[None, :rounds] + 1) // bt), axis=0)
        over = blocks > self.kv.capacity
        if _any(over):
            rounds = int(over.argmax())  # the rounds before the first that would preempt
        if rounds < 1:
            return None
        return _PlainBlock(rounds, times[: rounds + 1], durations[:rounds], verify_s[:rounds], blocks[:rounds],
                           kv_read, draft_s, overhead_s, extrapolated)

    def _plain_price_at(self, num_dec: int) -> tuple | None:
        """:meth:`_plain_price` at ``num_dec``, priced once a run: kept by batch size in
        ``_plain_prices`` and in the list ``_kernels.plain_block`` reads after a completion
        (``absorb``; an entry is False until priced)."""
        price = self._plain_prices[num_dec] = self._plain_price(num_dec)
        by_b = self._plain_prices_by_b
        if len(by_b) <= num_dec:
            by_b.extend([False] * (num_dec + 1 - len(by_b)))
        by_b[num_dec] = price
        return price

    def _plain_price(self, num_dec: int) -> tuple | None:
        """The plain pass's pricing at B = ``num_dec`` for the compiled planner: (context term?,
        pass time without one, zero_ms, factor, a, q, b and c slopes, extrapolated flag); None
        where the numpy planner must price (no finite value at B: it raises or refuses there)."""
        table = self.profile.decode_table
        extrapolated = 0 if table.is_measured(num_dec) else 1
        if table.has_context_term:
            coef = table.context_coefficients(num_dec, float(num_dec))
            if coef is None:
                return None
            att = table.attention
            return (True, 0.0, *coef, att.b_ms_per_kv_token, att.c_ms_per_pair, extrapolated)
        first_s = float(table.pass_time_s(num_dec))
        if not 0.0 < first_s < float("inf"):
            return None
        return (False, first_s, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, extrapolated)

    def _plan_plain_block_compiled(self, dec: np.ndarray, ahead: int, price: tuple) -> _PlainBlock | None:
        """:meth:`_plan_plain_block` by the compiled planner (``_kernels.plain_plan``): the same
        block, bit for bit. The plan's arrays are views of scratch arrays the next plan overwrites
        (the block runs before then)."""
        times, durations, verify_s, blocks, _ = self._scratch
        context, first_s, zero_ms, factor, a, q, b_slope, c_slope, extrapolated = price
        draft_s = 0.0 + self.drafter.prefill_time_s(0)
        overhead_s = self._overhead_s(False)
        fixed_s = 0.0 + draft_s + overhead_s  # head load 0 + draft + overhead, as the round path adds them
        kv = self.kv
        rounds, kv_read = self._kernels.plain_plan(
            dec, kv.tokens, self.output, self.generated, kv.block_tokens, kv.capacity, self.env.now,
            self.env.peek(), ahead, _MAX_BLOCK_ROUNDS, fixed_s, context, first_s, zero_ms, factor, a, q, b_slope,
            c_slope, times, durations, verify_s, blocks)
        if rounds < 1:
            return None
        return _PlainBlock(rounds, times[: rounds + 1], durations[:rounds], verify_s[:rounds], blocks[:rounds],
                           kv_read, draft_s, overhead_s, extrapolated)

    def _plain_run(self, dec: np.ndarray, ahead: int, gamma: int, head_load_s: float, round_index: int) -> int:
        """The plain rounds from now as one block (returns the rounds run, 0 where
        none can): planned by :meth:`_plan_plain_block` and run by :meth:`_plain_block`, or with
        the compiled kernels both in one call (``_kernels.plain_block``; where the block's last round
        runs across the next event, the requests it finished are freed after the wait for its end):
        the same block, bit for bit.
        The one call steps aside for :meth:`_plain_block` where a round check may fail (that
        function raises) or where :meth:`_check_pass` has been replaced (it then runs)."""
        fused, num_dec, price = self._plain_fused, dec.size, None
        if fused is not None and len(self.running) == num_dec:
            price = self._plain_prices.get(num_dec, False)
            if price is False:
                price = self._plain_price_at(num_dec)
        if price is None:  # the planner and the block apart (the numpy engine, or numpy pricing)
            plan = self._plan_plain_block(dec, ahead)
            if plan is None:
                return 0
            self._plain_block(dec, plan, gamma, head_load_s, round_index)
            return plan.rounds
        env, kv, log = self.env, self.kv, self.log
        draft_s, overhead_s, checks = fused
        times, durations, verify_s, blocks, finished = self._scratch
        template = self._plain_template(num_dec, gamma, draft_s, overhead_s, head_load_s, price[8])
        absorb = self._absorb_args(template[12:14] + template[25:26], events=True)
        code, rounds, kv_read, added, num_fin, absorbed = self._kernels.plain_block(
            dec, kv.tokens, kv.blocks, self.output, self.generated, self.num_rounds, kv.block_tokens, kv.capacity,
            kv.blocks_used, env._now, env.peek(), ahead, _MAX_BLOCK_ROUNDS, log.SHORT_BLOCK, price, checks, log.rows,
            template, times, durations, verify_s, blocks, finished, absorb, self._plain_prices_by_b)
        if absorbed is not None and absorbed[0]:  # completions it went on past, each at its time (before
            kv.blocks_used += added  # the wait for a last pass that crosses an event, which runs events after them)
            added = 0
            self._absorbed(absorbed)
        if code == 3:
            env._now = float(times[rounds])  # no event falls inside the block (SimPy's clock, as the round path moves it)
        elif code == 2:  # applied, its last round's pass runs across the next event: wait for its end
            env._now = float(times[rounds - 1])
            self._advance(float(durations[rounds - 1]))
        elif code == 1:  # a round check may fail: _check_pass decides (and raises) on the plan
            self._plain_block(dec, _PlainBlock(
                rounds, times[: rounds + 1], durations[:rounds], verify_s[:rounds], blocks[:rounds], kv_read, draft_s,
                overhead_s, price[8]), gamma, head_load_s, round_index)
            return rounds
        else:
            return 0
        self._plain_applied(added, finished[:num_fin])
        if rounds > log.SHORT_BLOCK:
            self._plain_columns(template, times, durations, verify_s, blocks, rounds, kv_read)
        elif num_fin:
            log.set_last_kv_after(kv.blocks_used)
        log.flush_if_full()
        return rounds

    def _plain_applied(self, added: int, finished: np.ndarray) -> None:
        """After a kernel applied a plain block: KVCacheManager.append's bookkeeping (``added``
        blocks) and the ids that finished."""
        kv = self.kv
        kv.blocks_used += added
        if kv.blocks_used > kv.capacity:
            kv.check("append")
        self._spec_on = False
        if finished.size:
            self._finish(finished.tolist())

    def _plain_template(self, num_dec: int, gamma: int, draft_s: float, overhead_s: float, head_load_s: float,
                        extrapolated: int) -> tuple:
        """A plain round's round-log row (``_LOGGED`` order) with its per-round fields (start,
        duration, pass time, KV peak and after, KV read) zero: ``num_dec`` requests decode one
        token each, nothing drafted; the queues as they stand at the block's start."""
        return (0.0, 0.0, draft_s, 0.0, num_dec, 0, 0, num_dec, 0, 0, 0, num_dec, len(self.waiting), len(self.running),
                0, 0, np.nan, np.nan, 0, 0, gamma, self.coherence.value, self.drafter.held_gib, self.kv.capacity,
                head_load_s, self.num_remote_prefill, 0, overhead_s, extrapolated)

    def _plain_columns(self, template: tuple, times: np.ndarray, durations: np.ndarray, verify_s: np.ndarray,
                       blocks: np.ndarray, rounds: int, kv_read0: int) -> None:
        """Log a long plain block's rounds as typed columns (:meth:`_RoundLog.append_block`): the
        template's fields for every round, and each round's start, duration, pass time, KV peak
        and after (after the last: KV once its finished requests freed theirs) and KV read."""
        cols = dict(zip(_LOGGED, template))
        after = blocks[:rounds].copy()
        after[-1] = self.kv.blocks_used
        cols.update(start_s=times[:rounds], duration_s=durations[:rounds], verify_s=verify_s[:rounds],
                    kv_blocks_peak=blocks[:rounds], kv_blocks_after=after,
                    kv_read_tokens=kv_read0 + template[4] * np.arange(rounds))
        self.log.append_block(cols, rounds)

    def _plain_block(self, dec: np.ndarray, plan: _PlainBlock, gamma: int, head_load_s: float, round_index: int) -> None:
        """Run the plain rounds of ``plan`` at once (see :meth:`_plan_plain_block`): every request
        emits one token a round; the clock moves round by round (the same float additions), and
        the round log gets the same rows, as the round-by-round path."""
        env, kv = self.env, self.kv
        num_dec, rounds, times, durations, blocks = dec.size, plan.rounds, plan.times, plan.durations, plan.blocks
        template = self._plain_template(num_dec, gamma, plan.draft_s, plan.overhead_s, head_load_s, plan.extrapolated)
        # the round checks, on the block's extremes (its largest KV, shortest pass, longest round)
        if rounds == 1:  # one round's values, without two reductions
            self._check_pass(round_index, num_dec, int(blocks[0]), float(plan.verify_s[0]), plan.draft_s,
                             plan.overhead_s, head_load_s, float(durations[0]))
        else:
            self._check_pass(round_index, num_dec, int(blocks[-1]), float(_min(plan.verify_s)), plan.draft_s,
                             plan.overhead_s, head_load_s, float(_max(durations)))
        if env.peek() > times[-1]:
            env._now = float(times[-1])
        else:
            env._now = float(times[-2])  # the rounds before the last end before any other event
            self._advance(float(durations[-1]))
        if self._kernels is not None:
            finished = self._scratch[4]
            added, num_fin = self._kernels.plain_apply(dec, rounds, self.generated, self.num_rounds, kv.tokens,
                                                       kv.blocks, self.output, kv.block_tokens, finished)
            self._plain_applied(added, finished[:num_fin])
        else:
            gen = self.generated[dec] + rounds
            self.generated[dec] = gen
            self.num_rounds[dec] += rounds
            kv.append(dec, rounds)
            self._spec_on = False
            fin = gen >= self.output[dec]
            if _any(fin):
                self._finish(dec[fin].tolist())
        log = self.log
        if rounds > log.SHORT_BLOCK:
            self._plain_columns(template, times, durations, plan.verify_s, blocks, rounds, plan.kv_read)
            return
        # rows as tuples (_LOGGED order), as the round path writes them; the last round's row is
        # written after its finished requests free their KV
        if self._kernels is not None:  # the rows built in C (a Python row per round cost most of a short block)
            self._kernels.plain_rows(log.rows, template, times, durations, plan.verify_s, blocks, rounds,
                                     kv.blocks_used, plan.kv_read, num_dec)
            log.flush_if_full()
            return
        rows = []
        for j, (start, duration, verify, peak) in enumerate(zip(times[:-1].tolist(), durations.tolist(),
                                                                plan.verify_s.tolist(), blocks.tolist())):
            row = list(template)
            row[0], row[1], row[3], row[14] = start, duration, verify, peak
            row[15] = kv.blocks_used if j == rounds - 1 else peak
            row[26] = plan.kv_read + num_dec * j
            rows.append(tuple(row))
        log.extend(rows)

    # ----------------------------------------------------------------- drafted blocks
    #: run drafted rounds (DSpark's, static k's, MTP-1's, threshold's, DSpark async's, goodput's) in blocks
    #: (exact: see _drafted_block); tests switch it off to compare
    DRAFT_BLOCKS = True

    def _drafted_setup(self) -> tuple[tuple | None, dict[int, tuple | None] | None]:
        """The run's drafted-block inputs at the drafter's depth now (None: round by round), and for
        the elastic ensemble the inputs by depth (:meth:`_inputs_at_depth`; else None). Drafted
        blocks run where plain ones may, for the elastic ensemble too, and with the dynamic
        controllers the kernel keeps (:meth:`_controls_in_blocks`): None and an empty dict, the
        inputs by the width each round's controller chooses."""
        if not self.PLAIN_BLOCKS:
            return None, None
        if self.control.dynamic:
            return None, ({} if self._controls_in_blocks() else None)
        block = self._drafted_block_inputs()
        return block, ({self.drafter.depth: block} if self.drafter.elastic else None)

    def _controls_in_blocks(self) -> bool:
        """Whether this run's dynamic draft-length controller runs inside drafted blocks: exactly
        ``batch_table``, ``disable_by_batch_size`` (their k follows the batch, which a block holds),
        ``acceptance_target`` or ``probing`` (their choice and learning mirrored), beside a policy
        without a gate (the controller is asked before the block's first round, the gate inside it)
        that learns nothing, at a fixed depth."""
        pol = self.policy
        return (type(self.control) in _CONTROL_KINDS and not self.drafter.elastic
                and type(pol) in (StaticPolicy, Mtp1Policy, ThresholdPolicy, DSparkAsyncPolicy)
                and type(pol).observe is Policy.observe)

    def _inputs_this_round(self, by_depth: dict[int, tuple | None], dynamic: bool, dec: np.ndarray, gamma: int,
                           round_index: int) -> tuple[int, int, tuple | None]:
        """A round's k, the width a block from it drafts and the block's inputs (None: the round
        path): with a dynamic controller, the k it answers (the round path's one
        :meth:`_draft_length` this round), and the block's width: k, or for k = 0 the next draft's
        (``acceptance_target``'s probe of 1, ``probing``'s probe of the depth; the batch's
        controllers then run round by round); for the elastic ensemble, its depth ``gamma`` (the
        block runs a gate's plain rounds too)."""
        if dynamic:
            k = self._draft_length(dec, gamma, round_index)
            probe = 1 if type(self.control) is AcceptanceTarget else gamma if type(self.control) is Probing else 0
            width = k or (probe if dec.size else 0)
            return k, width, (self._inputs_at_depth(by_depth, width) if width else None)
        return gamma, gamma, self._inputs_at_depth(by_depth, gamma)

    def _inputs_at_depth(self, by_depth: dict[int, tuple | None], gamma: int) -> tuple | None:
        """The drafted-block inputs at depth (or a controller's width) ``gamma``, made the first time."""
        block = by_depth.get(gamma, False)
        if block is False:
            block = by_depth[gamma] = self._drafted_block_inputs(gamma)
        return block

    def _drafted_block_inputs(self, width: int | None = None) -> tuple | None:
        """The run's fixed inputs of :meth:`_drafted_block` (the cost tables' pricing, whether the
        decode table is priced apart, the head's base logits, the gate, the plan), or None where
        drafted rounds run one by one: without the kernels, or unless the policy is ``dspark``
        itself with its fallback gate, or ``static``, ``mtp1``, ``threshold``, ``dspark_async``
        (with a lag) or ``goodput`` (with its gate) themselves, or ``no_spec`` (every round plain:
        blocks where prefill chunks share the passes), the controller ``always`` (or a
        dynamic one the kernel keeps, :meth:`_controls_in_blocks`), the EWMA or tower coherence,
        and nothing else decides or learns per round (no p_min, drift or observers but
        ``acceptance_target``'s and ``probing``'s) and both tables price from arrays. The elastic MEMTP
        ensemble's depth controller (``memtp.DepthController`` itself) resizes inside the block;
        its inputs are those of the drafter's depth now (the caller keeps them by depth). With a
        dynamic controller (:meth:`_controls_in_blocks`) they are those of ``width`` positions,
        the k it chose (default: the drafter's depth)."""
        pol, drafter = self.policy, self.drafter
        gate = None  # the kernel's plan: DSpark's (with its gate), k each, a threshold, the lagged top K, goodput's
        width = drafter.depth if width is None else width
        if type(pol) is DSparkPolicy:
            gate, plan = pol._gate, (0, 0, 0.0)
        elif type(pol) in (StaticPolicy, Mtp1Policy):  # their plan: min(k, drafted) each (_every_request)
            plan = (1, min(1 if type(pol) is Mtp1Policy else pol.params.k, width), 0.0)
        elif type(pol) is ThresholdPolicy and drafter.depth <= pol.params.gamma:  # (wider: survival() raises)
            plan = (2, 0, float(pol.params.threshold))
        elif (type(pol) is DSparkAsyncPolicy and pol.params.lag_rounds >= 1  # lag 0 keeps every K: round by round
              and drafter.depth <= pol.params.gamma):
            plan = (3, 0, 0.0)
        elif type(pol) is GoodputPolicy and drafter.depth <= pol.params.gamma:
            gate, plan = pol._gate, (4, 0, 0.0)
        elif type(pol) is NoSpecPolicy and not drafter.elastic and drafter.kind != "draft_model":  # nothing drafted:
            # buffers one position wide (a draft model prefills its own cache: the kernel stops at each chunk)
            plan, width = (5, drafter.depth, 0.0), 1
        else:
            return None
        no_drafts = plan[0] == 5
        if (self._kernels is None or not self.DRAFT_BLOCKS or not _same_numpy(self._kernels)
                or _mirrored_replaced(self)
                or (gate is not None and type(gate) is not FallbackGate)
                or not (type(self.control) is AlwaysDraft or self._controls_in_blocks())
                or (drafter.elastic and type(drafter.controller) is not DepthController)
                or drafter.spec.p_min > 0 or not (no_drafts or 1 <= width <= drafter.depth) or self.logit_shift is not None
                or (self._listens() and type(self.control) not in (AcceptanceTarget, Probing))
                or not self._coherence_mirrored()):
            return None
        sps, dec_table = self.profile.sps, self.profile.decode_table
        prices = (_block_pricer(sps), _block_pricer(dec_table))
        if prices[0] is None or prices[1] is None:
            return None
        separate = sps.has_context_term or dec_table.has_context_term or sps is not dec_table  # _tables_at's views
        acc, gamma = self.acc, width
        base = None if acc.base is None else np.ascontiguousarray(acc.base_logits(gamma), dtype=np.float64)
        memtp = drafter.spec.memtp
        per_tested = memtp is not None and memtp.coherence_estimator == "per_tested"
        diag = (np.empty((self.DIAG_ROUNDS, gamma)), np.empty((self.DIAG_ROUNDS, gamma)),
                np.empty((self.DIAG_ROUNDS, gamma), dtype=bool)) if self.diag_n < self.DIAG_ROUNDS and not no_drafts else None
        limit = min(self.cfg.max_num_seqs, self.cfg.max_batch_tokens)  # the most running requests
        # mutable: drafting times priced up to this many requests, the times, the diagnostics' next row,
        # and the buffers the kernel writes into: the drafts, the ids, lengths and chunks of a round,
        # the last round's start and pass when it runs across an event (by requests, views) ...
        buffers = (np.empty((3, limit, gamma)), np.empty((4, limit), dtype=np.int64), np.empty(2))
        # ... and the asynchronous scheduler's lag, and rows for its (round, K) history (live pairs: <= lag + 1)
        lag = pol.params.lag_rounds if plan[0] == 3 else 0
        state = [limit if no_drafts else 0, np.full(limit + 1, np.nan), 0, {}, buffers, lag,  # (no_drafts: no drafting time)
                 np.empty((2 * lag + 8, 2), dtype=np.int64)]
        head, kv = self.head, self.kv
        # the kernel's arguments that stay the same objects for the whole run (none is rebound)
        fixed = (self.prefilled, self.prefill_target, self.domain, self.difficulty, self.generated, self.output,
                 self.num_rounds, self.verified, self.accepted, kv.tokens, kv.blocks, self.first_token_at, acc.mu,
                 acc.slope, base, acc.sigma_round, head.oracle, float(head.noise_sd), float(head.overconfidence),
                 np.ones(1) if no_drafts else self.temps, self.rng, self.head_rng, prices[0], prices[1], separate, state[1])
        early_stop = bool(pol.params.early_stop) if type(pol) is DSparkPolicy else False
        return fixed, per_tested, (self._overhead_s(True), self._overhead_s(False)), diag, state, gate, plan, early_stop

    def _coherence_mirrored(self) -> bool:
        """Whether the kernel keeps this run's coherence: the EWMA, or the tower of EWMA levels
        (one alpha, as ``TowerCoherence`` builds them) at least as tall as the drafts are long."""
        coh = self.coherence
        if type(coh) is CoherenceEWMA:
            return True
        return (type(coh) is TowerCoherence and coh.max_levels >= self.drafter.depth
                and all(type(e) is CoherenceEWMA and e._alpha == coh._levels[0]._alpha for e in coh._levels))

    def _drafted_block(self, dec: np.ndarray, pre: np.ndarray, gamma: int, round_index: int, inputs: tuple,
                       first_k: int | None = None) -> tuple[int, np.ndarray, np.ndarray, tuple | None, float]:
        """Run the drafted rounds from now at once while nothing outside the engine happens
        (``_kernels.drafted_block``): the same draws, clock, state and round-log rows as round by
        round, bit for bit. Called where the round path has admitted, found the anchors fit
        without preempting and the policy not planning a plain block. A last round whose pass
        runs across the next event is kept as well: the clock is left at its start, and the
        caller waits ``wait_s`` for its end, then calls :meth:`_drafted_waited` (the requests it
        finished are freed then, as the round path frees them after the events inside the pass).
        ``gamma``: the positions its rounds draft; ``first_k``: with a dynamic controller, its
        answer for the first round (``gamma`` or 0).

        Returns:
            ``(rounds, dec, pre, drafted, wait_s)``: the rounds run; the next round's decoding and
            prefilling ids (``dec`` and ``pre`` as given if no round ran); its ``(probs, raw,
            conf)`` when the block drew it but left its plan to the round path (a KV trim, a check
            that raises), else None; and, when > 0, the seconds the last round's pass runs from
            the clock now, across the next event.
        """
        fixed, per_tested, (overhead_s, plain_overhead_s), diag, state, gate, plan, early_stop = inputs
        kv, drafter, log = self.kv, self.drafter, self.log
        consts = (len(self.waiting), len(self.running), self.num_remote_prefill)
        run, gamma = self._run_ids[0], 1 if plan[0] == 5 else gamma  # (no speculation: the buffers' width)
        num_run = run.size
        absorb = self._absorb_args(consts, events=self._drafted_events)
        rows = num_run if absorb is None or absorb[12] is None else state[4][1].shape[1]  # (admissions: all of them)
        views = state[3].get(rows)
        if views is None:  # the run's buffers as arrays of this many requests (the kernel's shapes)
            drafts, ids, crossing = state[4]
            views = state[3][rows] = (*(d[:rows] for d in drafts), *(i[:rows] for i in ids), crossing)
        probs, raw, conf, dec_ids, pre_ids, lengths, chunks, crossing = views
        draft_times = state[1]
        # drafting time by decoding requests, priced once per run (a few more where admissions may
        # grow the batch inside the block)
        upto = num_run if rows == num_run else min(rows, num_run + self.cfg.prefill_gpus)
        if upto > state[0]:
            for r in range(state[0] + 1, upto + 1):
                draft_times[r] = drafter.round_time_s(r, gamma)
            state[0] = upto
        finished = self._scratch[4]
        left, at = self.DIAG_ROUNDS - self.diag_n, state[2]
        d_raw, d_conf, d_would = (None, None, None) if diag is None or left <= 0 else \
            (diag[0][at: at + left], diag[1][at: at + left], diag[2][at: at + left])
        cfg, lag, history, pol = self.cfg, state[5], state[6], self.policy
        num_hist = len(pol._history) if lag else 0
        if num_hist:  # DSparkAsyncPolicy's remembered capacities, as the kernel reads them
            if num_hist + 2 > len(history):
                history = state[6] = np.empty((2 * num_hist + 8, 2), dtype=np.int64)
            history[:num_hist] = pol._history
        ctl = drafter.controller
        coh_args, tower = self._coherence_args(per_tested)
        control_args = (self._control_args(dec.size, gamma, gamma if first_k is None else first_k)
                        if self.control.dynamic else None)
        (code, rounds, now, blocks_used, gain, last_round, skipped, coh_value, coh_n, num_fin, diag_rows, num_dec,
         num_pre, had_prefill, h0, h_len, ctl_state, tower_depth, control, absorbed) = self._kernels.drafted_block(
            run, *fixed, gamma, cfg.max_batch_tokens,
            cfg.prefill_chunk_tokens, kv.block_tokens, kv.capacity, kv.blocks_used, self.env.now, self.env.peek(),
            overhead_s, early_stop, *plan, lag, history, num_hist, self.block_gib, drafter.held_gib, log.fixed_gib,
            (*(_NO_GATE if gate is None else (gate.enabled, gate._alpha, gate._gain, gate._last_round, gate._skipped,
                                              gate.probe_every)), plain_overhead_s),
            coh_args, round_index, _MAX_BLOCK_ROUNDS, log.rows, consts,
            dec_ids, pre_ids, probs, raw, conf, finished, d_raw, d_conf, d_would, lengths, chunks, crossing,
            None if ctl is None else self._elastic_args(ctl), tower, drafter.kind == "draft_model", control_args,
            absorb)
        if control is not None:
            self._kept_control(*control, control_args)
        if ctl_state is not None:
            self._kept_controller(ctl, ctl_state)
        if gate is not None:
            gate._gain, gate._last_round, gate._skipped = gain, last_round, skipped
        elif lag and (rounds or code):  # a round was planned: the history as the kernel left it, in place
            pol._history.clear()
            pol._history.extend(map(tuple, history[h0:h_len].tolist()))
        if diag_rows:
            self._kept_diag(diag, state, at, diag_rows)
        if rounds:
            kv.blocks_used = blocks_used
            last_drafted = log.rows[-1][_K_FIELD] > 0  # (a gate's plain round's k is 0)
            if absorbed is not None and absorbed[0]:
                self._absorbed(absorbed)
            # no event falls inside the rounds run but a crossing last one's pass: the clock at its
            # end, or at that round's start (SimPy's clock, as the round path moves it)
            self.env._now = now if code != 3 else float(crossing[0])
            self._kept_coherence(coh_value, coh_n, tower, tower_depth)
            if control is None:  # (a dynamic controller's: as its rounds left it)
                self._spec_on = last_drafted
            if had_prefill and self._run_ids is not None:  # (None: completions went out of the run)
                self._run_ids = (run, None)  # "all decode" may have become true
            if kv.blocks_used > kv.capacity:
                kv.check("append")
            if code == 3:  # the last round's pass runs across an event: its finished requests after the wait
                self._finished_after_wait = finished[:num_fin].tolist()
                return rounds, dec, pre, None, float(crossing[1])
            self._drafted_waited(finished[:num_fin].tolist() if num_fin else [])
        if code != 1:
            return rounds, dec, pre, None, 0.0
        # copies: the round path keeps them (diagnostics) and the next block reuses the buffers
        return rounds, dec_ids[:num_dec].copy(), pre_ids[:num_pre].copy(), (
            probs[:num_dec].copy(), raw[:num_dec].copy(), conf[:num_dec].copy()), 0.0

    def _start_rounds(self, plain_ok: bool) -> None:
        # what the rounds use, decided as they start (after any patch or subclass has been applied):
        # the plain blocks' fixed inputs, the admission and completion kernels, completions absorbed
        self._plain_fused = self._plain_block_inputs() if plain_ok else None
        self._kv_kernels = self._kv_kernels_if_own()
        self._absorb = self._absorb_setup()
        # drafted blocks go on past remote prefills' ends (their batch grows) at a fixed depth and k
        self._drafted_events = (self._absorb is not None and self._absorb[5] is not None and not self.drafter.elastic
                                and not self.control.dynamic)

    def _absorb_setup(self) -> tuple | None:
        """What blocks need to go on past completions (``_kernels.drafted_block``'s and
        ``plain_block``'s ``absorb``): the kind of what a completion sets off (1: nothing, an open
        loop; 2: its user submits the next request to the remote prefill GPUs; 3: its user thinks
        first), each request's remote prefill time and whether it is refused as it arrives, the
        think time, the action log the kernels write (codes, ids, times: see :meth:`_absorbed`) and,
        for kind 2, the buffers of the remote prefills in flight (times, SimPy event ids, requests)
        and of the requests waiting for admission (blocks also go on past those prefills' ends: plain
        ones, and drafted ones at a fixed depth and k).
        None where a completion sets off more (a colocated closed loop's user joins the admission
        queue at once), where the KV manager is not the kernels' (:meth:`_kv_kernels_if_own`), or
        where one of the functions a completion or a prefill's end runs is another than this class's:
        blocks then stop there, and Python runs it."""
        if self._kv_kernels is None or any(_replaced(self, name, fn) for name, fn in _COMPLETION_OWN.items()):
            return None
        if not self.wl.closed_loop:
            kind = 1
        elif not self._resubmit_at_once:
            return None
        elif self.wl.think_time_s > 0:
            kind = 3
        else:
            kind = 2
        n = self.n
        refused = np.zeros(n, dtype=bool)
        refused[list(self._refused)] = True
        prefill_s = np.zeros(n)  # (a refused request is never prefilled: its prompt is not priced, as before)
        if kind == 2:
            prefill_s[:] = [0.0 if j in self._refused else self._prefill_time_s(p) for j, p in enumerate(self._prompt_list)]
        gpus = self.cfg.prefill_gpus
        log = (np.empty(4 * n + 8, dtype=np.int8), np.empty(4 * n + 8, dtype=np.int64), np.empty(4 * n + 8))
        events = (np.empty(gpus), np.empty(gpus, dtype=np.int64), np.empty(gpus, dtype=np.int64),
                  np.empty(gpus + 1, dtype=np.int64)) if kind == 2 else None
        return kind, prefill_s, refused, float(self.wl.think_time_s), log, events

    def _absorb_args(self, consts: tuple, events: bool = False) -> tuple | None:
        """A block's ``absorb`` argument now (``consts``: the waiting, running and remote prefill
        counts): None while requests wait for admission (a completion would let the next one in);
        with ``events`` (plain blocks, and drafted ones at a fixed depth and k), the remote
        prefills' ends too (:meth:`_prefill_events`)."""
        ab = self._absorb
        if ab is None or consts[0]:
            return None
        return (ab[0], self.finished_at, self.status, *ab[4], self._next_request, self.n, self._prefill_idle,
                ab[1], ab[2], ab[3], self._prefill_events() if events and ab[5] is not None else None)

    def _prefill_events(self) -> tuple | None:
        """The blocks' ``events`` (``plain_block``'s and ``drafted_block``'s): the remote prefills
        in flight, from SimPy's queue (each one's end, event id and request), the earliest other
        event, the prefill queue (its first request and length: users submit in id order, so it
        holds every request not refused from that one on), admission's watermark and limit, and the
        arrays a prefill's end and an admission write. None where SimPy's queue holds more remote
        prefills than GPUs."""
        ev_t, ev_eid, ev_id, wait = self._absorb[5]
        done, k, other = self._remote_prefill_done, 0, _INF
        for t, _, eid, event in self.env._queue:
            callbacks = event.callbacks
            if callbacks is not None and len(callbacks) == 1 and callbacks[0] == done:
                if k == ev_t.size:
                    return None
                ev_t[k], ev_eid[k], ev_id[k] = t, eid, event._value
                k += 1
            elif t < other:
                other = t
        queue = self._prefill_queue
        return (ev_t, ev_eid, ev_id, k, other, queue[0] if queue else self._next_request, len(queue),
                self.kv.watermark, self._admit_limit, wait, self.prompt, self.kv_transferred, self.ready_at,
                self.first_token_at, self.admitted_at, (self.prefill_target, self.prefilled))

    def _absorbed(self, absorbed: tuple) -> None:
        """What a block went on past, in order, each at its own time: the Python part of what the
        kernel did the array work of. Codes: 0, a completion (:meth:`_finish`'s Python part, the
        clock at its time: its user's next submission, a SimPy event, is scheduled from there); 1,
        the wait for a pass across events (the key :meth:`_advance` takes in SimPy's queue); 2, a
        remote prefill's end (its event, SimPy's next, taken off the queue; :meth:`_remote_prefill_done`'s
        Python part: its GPU takes the next prompt, the request joins the admission queue); 3, an
        admission (:meth:`_admit`'s: from the admission queue to the running list).

        Raises:
            EngineInvariantError: the queues it left are not those the kernel mirrored.
        """
        num, next_request, prefill_idle, num_remote, num_waiting, queued = absorbed
        codes, ids, times = (a[:num].tolist() for a in self._absorb[4])
        env, running, waiting = self.env, self.running, self.waiting
        self._run_ids = None
        # a prefill that starts and ends in these actions makes no SimPy event (created, then taken
        # off the queue: most of what a replayed request cost); its end is checked against the kernel's
        started = self._replay_started
        if 2 in codes:
            self._replay_ends = {i for code, i in zip(codes, ids) if code == 2}
        for code, i, t in zip(codes, ids, times):
            if code == 0:
                env._now = t
                running.remove(i)
                self._complete(i)
            elif code == 1:
                next(env._eid)
            elif code == 2:
                if i in started:
                    if started.pop(i) != t:
                        raise EngineInvariantError(f"block: request {i}'s remote prefill ends at {t} s as the kernel "
                                                   "ran it, not when it started plus its prefill time")
                else:
                    t_queued, _, _, event = heappop(env._queue)
                    if t_queued != t or event._value != i:
                        raise EngineInvariantError(f"block: SimPy's next event is {event!r} at {t_queued} s, not "
                                                   f"request {i}'s remote prefill end at {t} s as the kernel ran it")
                    event.callbacks = None  # processed, as Environment.step leaves it
                    self._replay_ends.discard(i)  # (a later prefill of it would not end in these actions)
                env._now = t
                if self._prefill_queue:
                    self._start_remote_prefill(self._prefill_queue.popleft())
                else:
                    self._prefill_idle += 1
                self.num_remote_prefill -= 1
                waiting.append(i)
            else:
                if not waiting or waiting[0] != i:
                    raise EngineInvariantError(f"block: request {i} was admitted as the kernel ran it, but the "
                                               f"admission queue's head is {waiting[0] if waiting else None}")
                waiting.popleft()
                running.append(i)
        self._replay_ends = frozenset()
        if started:  # (only requests whose end is in the actions start without an event)
            raise EngineInvariantError(f"block: remote prefills of requests {sorted(started)} started in its actions "
                                       "without an event, and did not end there")
        self.kv.check("finish")
        mirrored = (next_request, prefill_idle, num_remote, num_waiting, queued)
        if (self._next_request, self._prefill_idle, self.num_remote_prefill, len(waiting),
                len(self._prefill_queue) if queued >= 0 else -1) != mirrored:  # (-1: the queue not mirrored)
            raise EngineInvariantError(
                f"block: what it went on past left request {self._next_request} next to submit, "
                f"{self._prefill_idle} prefill GPUs free, {self.num_remote_prefill} requests in remote prefill, "
                f"{len(waiting)} waiting and {len(self._prefill_queue)} queued for prefill, not {mirrored} as the "
                "kernel mirrored them")

    def _drafted_waited(self, finished: list[int] | None = None) -> None:
        """After a drafted block (and the wait for its last round's pass, if it ran across an
        event): free the requests it finished (``finished``, or those kept for after the wait), the
        last row's KV after them, and pack the rows once enough wait."""
        if finished is None:
            finished, self._finished_after_wait = self._finished_after_wait, None
        if finished:
            self._finish(finished)
            self.log.set_last_kv_after(self.kv.blocks_used)
        self.log.flush_if_full()

    def _kept_diag(self, diag: tuple, state: list, at: int, num: int) -> None:
        """A block's calibration diagnostics: its ``num`` request-rounds the kernel wrote into the
        ``diag`` buffers from row ``at``, kept as the part ``(diag, start, end)`` of them (the last
        part made longer where it is these buffers' and ends there: fewer to lay out), sliced in
        :meth:`_diag_arrays`."""
        parts = self._diag_parts
        last = parts[-1] if parts else None
        if last is not None and last[0] is diag and last[2] == at:
            parts[-1] = (diag, last[1], at + num)
        else:
            parts.append((diag, at, at + num))
        self.diag_n += num
        state[2] = at + num

    def _control_args(self, num_dec: int, width: int, first_k: int) -> tuple:
        """``_kernels.drafted_block``'s ``control`` for this run's dynamic controller, asked for the
        first round at ``num_dec`` decoding requests (``first_k``; a block of ``width``): its kind,
        the depth, the batch, the pass's tax and the overheads (``Engine._pass_time``), and
        ``acceptance_target``'s or ``probing``'s settings and state."""
        ctl, p, depth = self.control, self.control.params, self.drafter.depth
        head = (_CONTROL_KINDS[type(ctl)], depth, num_dec, 1.0 + _control_module.dynamic_tax_frac(p.tax, num_dec),
                self._spec_on, p.switch_s, self._overhead_s(False), first_k)
        if type(ctl) is AcceptanceTarget:
            return (*head, (ctl._alpha, p.target - p.hysteresis, p.target + p.hysteresis, p.k_min, p.probe_every),
                    (ctl._k, np.nan if ctl._ema is None else ctl._ema, ctl._off_rounds))
        if type(ctl) is Probing:
            buf = self._probe_buffers.get(num_dec)
            if buf is None:  # drafting times by k at this batch, and the measured acceptance's buffer
                buf = self._probe_buffers[num_dec] = (
                    np.array([self.drafter.round_time_s(num_dec, k) for k in range(depth + 1)]), np.empty(depth))
            measured = -1 if ctl._accept is None else min(ctl._accept.size, depth)
            if measured > 0:
                buf[1][:measured] = ctl._accept[:measured]
            return (*head, (p.probe_every, self.profile.overheads.host_s, buf[0], buf[1]),
                    (ctl._since, ctl._probing, measured))
        return (*head, (), ())

    def _kept_control(self, spec_on: bool, state: tuple, args: tuple) -> None:
        """The dynamic controller as a block's rounds left it (``_kernels.drafted_block``'s last
        result): whether speculation is on, and ``acceptance_target``'s or ``probing``'s state
        (its measured acceptance in the buffer of the call's ``args``, :meth:`_control_args`)."""
        ctl = self.control
        self._spec_on = spec_on
        if type(ctl) is AcceptanceTarget:
            ctl._k, ema, ctl._off_rounds = state
            ctl._ema = None if ema != ema else ema
        elif type(ctl) is Probing:
            ctl._since, ctl._probing, measured = state
            ctl._accept = None if measured < 0 else args[8][3][:measured].copy()

    def _coherence_args(self, per_tested: bool) -> tuple[tuple, tuple | None]:
        """``_kernels.drafted_block``'s ``coherence`` and ``tower`` for this run's coherence: the
        EWMA's fields, or the tower's levels as arrays (written back by :meth:`_kept_coherence`)."""
        coh = self.coherence
        if type(coh) is TowerCoherence:
            levels = coh._levels
            return (levels[0]._alpha, coh.value, 0, False), (
                np.array([e._value for e in levels]), np.array([e._num_updates for e in levels], dtype=np.int64),
                coh._depth)
        return (coh._alpha, coh._value, coh._num_updates, per_tested), None  # (CoherenceEWMA itself)

    def _kept_coherence(self, value: float, num_updates: int, tower: tuple | None, tower_depth: int | None) -> None:
        """The coherence after a block's kept rounds: the EWMA's value and count, or the tower's
        levels (the kernel updated ``tower``'s arrays in place) and its depth."""
        coh = self.coherence
        if tower is None:
            coh._value, coh._num_updates = value, num_updates
            return
        for e, v, n in zip(coh._levels, tower[0].tolist(), tower[1].tolist()):
            e._value, e._num_updates = v, n
        coh._depth = tower_depth

    @staticmethod
    def _kept_controller(ctl: DepthController, state: tuple) -> None:
        """The depth controller as a block's rounds left it: ``(last_round, last_target,
        above_since, below_since, below_max_target)``, -1 for None."""
        last, target, above, below, ctl._below_max_target = state
        ctl._last_round, ctl._last_target = (None if last < 0 else last), (None if target < 0 else target)
        ctl._above_since, ctl._below_since = (None if above < 0 else above), (None if below < 0 else below)

    def _elastic_args(self, ctl: DepthController) -> tuple:
        """``_kernels.drafted_block``'s ``elastic``: the depth controller's settings and state (-1
        for None), and what :meth:`_heads_free_gib` reads that stays fixed while a block runs: the
        memory left after weights and reserve, and the blocks the head-of-line waiting request
        holds back (nobody is admitted inside a block)."""
        none = -1
        return (ctl._max_depth, ctl._head_cost_gib, ctl._r_low, ctl._r_high, ctl._min_dwell_rounds,
                ctl._grow_margin_gib, FLOOR_EPSILON, self.log.fixed_gib, self._waiting_head_blocks(), none if ctl._last_round is None else ctl._last_round,
                none if ctl._last_target is None else ctl._last_target,
                none if ctl._above_since is None else ctl._above_since,
                none if ctl._below_since is None else ctl._below_since, ctl._below_max_target)

    def _check_pass(self, round_index: int, batch_tokens: int, kv_peak: int, verify_s: float, draft_s: float,
                    overhead_s: float, head_load_s: float, duration: float) -> None:
        """The round's invariants: the pass within max_batch_tokens, KV + drafter within memory, and
        finite, non-negative times (checked before the clock moves: it would accept any value).

        Raises:
            EngineInvariantError: one of them broke (the message names the values).
        """
        if batch_tokens > self.cfg.max_batch_tokens:
            raise EngineInvariantError(f"pass of {batch_tokens} tokens exceeds max_batch_tokens "
                                       f"{self.cfg.max_batch_tokens}")
        held_gib, fixed_gib = self.drafter.held_gib, self.log.fixed_gib
        if kv_peak * self.block_gib + held_gib > fixed_gib + 1e-9:
            raise EngineInvariantError(f"KV ({kv_peak} blocks) + drafter ({held_gib:.2f} GiB) exceed "
                                       f"the {fixed_gib:.2f} GiB left after weights and reserve")
        if not (verify_s > 0.0 and duration < float("inf") and min(draft_s, overhead_s, head_load_s) >= 0.0):
            raise EngineInvariantError(
                f"round {round_index}: pass of {batch_tokens} tokens priced verify {verify_s!r} s, draft "
                f"{draft_s!r} s, overhead {overhead_s!r} s, head load {head_load_s!r} s; each must be finite, "
                "the pass > 0 (check the hardware profile's tables)")

    def _listens(self) -> bool:
        """Whether the policy or the controller learns from round outcomes (else none is built)."""
        return type(self.policy).observe is not Policy.observe or type(self.control).observe is not DraftControl.observe

    def _pass_time(self, table, batch_tokens: int, num_dec: int, k: int, drafted: bool):  # noqa: ANN001 - SPSTable view
        """The pass's time, whether it was priced outside the measured range, and the round's
        overhead (host, planner, a dynamic controller's tax and switches)."""
        verify_s = float(table.pass_time_s(batch_tokens))
        extrapolated = 0 if table.is_measured(batch_tokens) else 1
        overhead_s = self._overhead_s(drafted)
        if self.control.dynamic and num_dec:  # the dynamic mechanism's tax, and its on/off switches
            # (the module's function: a patch of it applies here and sends drafted blocks round by round)
            verify_s *= 1.0 + _control_module.dynamic_tax_frac(self.control.params.tax, num_dec)
            if (k > 0) != self._spec_on:
                overhead_s += self.control.params.switch_s
        if num_dec:
            self._spec_on = k > 0
        return verify_s, extrapolated, overhead_s

    def _draft_length(self, dec: np.ndarray, gamma: int, round_index: int) -> int:
        """Positions every decoding request drafts this round: the drafter's depth, capped by the
        policy (e.g. DSpark's fallback to plain decoding) and the draft-length controller."""
        if not dec.size or gamma <= 0:
            return 0
        r = dec.size
        tokens = self.kv.tokens[dec]  # the context as of now, priced only if the policy or controller reads it

        def price() -> tuple[np.ndarray, SPSTable, float]:
            verify_table, decode_table = self._tables_at(r, int(_max(tokens)), int(_sum(tokens)))
            return tokens, verify_table, float(decode_table.pass_time_s(r))

        view = _PricedOnReadDraftView(price, num_requests=r, prefill_tokens=0,
                                      max_batch_tokens=self.cfg.max_batch_tokens, max_draft_len=gamma,
                                      draft_time_s=lambda k: self.drafter.round_time_s(r, k),
                                      fixed_s=self.profile.overheads.host_s, round_index=round_index)
        k = min(gamma, int(self.policy.draft_lengths(view)), int(self.control.cap(view)))
        return max(0, k)

    def _reserve_lookahead(self, dec: np.ndarray, pre: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, int]:
        """Preempt the newest admissions until every decoding request can store its anchor and k
        draft tokens (deeper drafts under KV pressure mean fewer requests: vLLM's lookahead slots).
        Returns (decoding ids, prefilling ids, number preempted)."""
        num = 0
        while dec.size > 1:
            need = self.kv.lookahead_total(dec, 1 + k)
            if self.kv.blocks_used + need <= self.kv.capacity:
                break
            victim = self.running[-1]
            self._preempt(victim)
            num += 1
            dec, pre = dec[dec != victim], pre[pre != victim]
        return dec, pre, num

    def _observe(self, lengths: np.ndarray, acc: np.ndarray, width: int) -> None:
        """Feed the round's outcome back to the policy and the draft-length controller."""
        pos = np.arange(width)[None, :]
        verified = pos < lengths[:, None]
        tested = verified & (pos <= acc[:, None])  # reached: positions 1..j-1 were accepted
        accepted = verified & (pos < acc[:, None])
        outcome = RoundOutcome(drafted=np.full(lengths.size, width), verified=lengths, accepted=acc,
                               accepted_by_position=accepted.sum(axis=0), tested_by_position=tested.sum(axis=0))
        self.policy.observe(outcome)
        self.control.observe(outcome)

    def _guarantee_anchors(self) -> tuple[np.ndarray, np.ndarray, int]:
        """Step 2: every decoding request's anchor needs a KV slot; preempt the newest admissions
        until the anchors fit. Returns (decoding ids, prefilling ids, number preempted)."""
        if self._run_ids is None or self._run_ids[1] is None:
            # (running ids, all decode), kept until admission, completion or preemption; after a
            # prefill pass (None) the ids stand and "all decode" is asked again
            if self._kernels is not None:
                run = self._kernels.ids_array(self.running) if self._run_ids is None else self._run_ids[0]
                self._run_ids = (run, self._kernels.all_prefilled(run, self.prefilled, self.prefill_target))
            else:
                run = (np.fromiter(self.running, dtype=np.int64, count=len(self.running)) if self._run_ids is None
                       else self._run_ids[0])
                self._run_ids = (run, bool(_all_true(self.prefilled[run] >= self.prefill_target[run])))
        run, all_decode = self._run_ids
        kv = self.kv
        if all_decode and kv.blocks_used + kv.anchor_blocks(run) <= kv.capacity:
            return run, _NO_IDS, 0  # the common round: everyone decodes and the anchors fit
        if self._kernels is not None:  # the split in one call; on to the loop below only to preempt
            dec, pre = np.empty(run.size, dtype=np.int64), np.empty(run.size, dtype=np.int64)
            num_dec, anchors = self._kernels.split_decoding(run, self.prefilled, self.prefill_target, kv.tokens,
                                                            kv.block_tokens, dec, pre)
            if kv.blocks_used + anchors <= kv.capacity or run.size <= 1:
                return dec[:num_dec], pre[:run.size - num_dec], 0
        decoding_mask = self.prefilled[run] >= self.prefill_target[run]
        num_preempted = 0
        while True:
            dec = run[decoding_mask]
            if self.kv.blocks_used + self.kv.anchor_blocks(dec) <= self.kv.capacity or run.size <= 1:
                break
            self._preempt(int(run[-1]))
            num_preempted += 1
            run, decoding_mask = run[:-1], decoding_mask[:-1]
        pre = run[~decoding_mask] if dec.size < run.size else run[:0]
        return dec, pre, num_preempted

    def _place_prefill(self, pre: np.ndarray, num_dec: int) -> tuple[np.ndarray | None, int]:
        """Step 3: chunked prefill, first-admitted first, in the budget left after the anchors.
        Returns (chunk per prefilling request or None, total prefill tokens)."""
        budget = self.cfg.max_batch_tokens - num_dec
        if not pre.size or budget <= 0:
            return None, 0
        limit = min(self.cfg.prefill_chunk_tokens, budget)
        if self._kernels is not None:
            chunks = np.empty(pre.size, dtype=np.int64)
            return chunks, self._kernels.place_prefill(pre, self.prefilled, self.prefill_target, limit, chunks)
        left = self.prefill_target[pre] - self.prefilled[pre]
        chunks = np.minimum(np.maximum(limit - (_cumsum(left) - left), 0), left)  # np.clip, without its wrapper
        return chunks, int(_sum(chunks))

    def _round_tables(self, dec: np.ndarray, pre: np.ndarray, chunks: np.ndarray | None, chunk_total: int):
        """The KV tokens this round's pass reads, and the verify and decode cost tables priced at
        this round's context (requests, longest context, KV read; docs/model.md section 1 step 4)."""
        no_prefill = not chunk_total
        if no_prefill and self._tables is not None and self._tables[0] is dec:
            return self._tables[1]  # priced already this round (the plain-block plan), same requests
        if self._kernels is not None:
            kv_read, l_max, num_req = self._kernels.round_context(dec, pre, None if no_prefill else chunks,
                                                                  self.kv.tokens)
        else:
            kv_dec = self.kv.tokens[dec]
            kv_read = int(_sum(kv_dec))
            l_max = int(_max(kv_dec)) if dec.size else 0
            num_req = dec.size
            if not no_prefill:
                active = pre[chunks > 0]
                kv_pre = self.kv.tokens[active]
                kv_read += int(_sum(kv_pre))
                l_max = max(l_max, int(_max(kv_pre)) if active.size else 0)
                num_req += active.size
        out = (kv_read, *self._tables_at(num_req, l_max, kv_read))
        if no_prefill:
            self._tables = (dec, out)
        return out

    def _tables_at(self, num_req: int, l_max: int, kv_read: int) -> tuple[SPSTable, SPSTable]:
        """The verify and decode cost tables at a pass's context: ``num_req`` requests, the longest
        context ``l_max`` and ``kv_read`` KV tokens read (docs/model.md section 1 step 4)."""
        prof = self.profile
        return prof.sps.at_context(num_req, l_max, kv_read), prof.decode_table.at_context(num_req, l_max, kv_read)

    def _overhead_s(self, drafted: bool) -> float:
        """Host time of a round, plus the planner's when the policy ranks confidences in the critical path."""
        ov = self.profile.overheads
        return ov.host_s + (ov.planner_s if drafted and self.policy.plans_in_critical_path else 0.0)

    def _draft_and_plan(self, dec: np.ndarray, gamma: int, chunk_total: int, round_index: int, verify_table,
                        decode_table, drafted: tuple | None = None):  # noqa: ANN001 - SPSTable views of this round
        # gamma: positions drafted this round (the drafter's depth after the policy and controller caps)
        """Steps 4-5: draft ``gamma`` positions per decoding request, draw their acceptance, show
        the (calibrated) confidences to the policy and take its verify lengths.

        ``drafted``: this round's (probs, raw, conf), drawn already (a drafted block's last round).

        Returns (draft_s, lengths (R,), probs, raw head logits, confidences, theta, theta_global,
        draft tokens the plan verifies); probs/raw/conf are None when nothing was drafted.

        Raises:
            EngineInvariantError: the plan is not one length per request in [0, gamma].
        """
        num_dec = dec.size
        if not num_dec or gamma <= 0:
            return 0.0, np.zeros(num_dec, dtype=np.int64), None, None, None, np.nan, np.nan, 0
        if drafted is not None:
            probs, raw, conf = drafted
        elif self._kernels is not None:
            probs, raw, conf = self._draft_confidences_compiled(dec, gamma)
        else:
            logits = self.acc.round_logits(self.rng, self.domain[dec], self.difficulty[dec], gamma)
            if self.logit_shift is not None:  # acceptance drift over time, output position and context
                logits = logits + self.logit_shift(self.env.now, self.generated[dec], self.kv.tokens[dec])[:, None]
            probs = expit(logits)
            raw = self.head.raw_logits(self.head_rng, logits)
            conf = expit(raw / self.temps[:gamma])
        p_min = self.drafter.spec.p_min
        if p_min > 0:  # a request stops drafting at its first position below p_min (llama.cpp --draft-p-min)
            keep = np.cumprod(conf >= p_min, axis=1).astype(bool)
            conf = np.where(keep, conf, 0.0)  # undrafted positions: zero survival, never verified
            draft_s = self.drafter.ragged_time_s(keep.sum(axis=1), gamma)
        else:
            draft_s = self.drafter.round_time_s(num_dec, gamma)
        no_draft_b = num_dec + chunk_total
        planned, theta, theta_global = self.policy.plan_round(
            conf, verify_table, chunk_total, self.cfg.max_batch_tokens, draft_s, round_index,
            float(decode_table.pass_time_s(no_draft_b)) if decode_table is not verify_table else None)
        lengths = np.array(planned, dtype=np.int64)  # a copy: the policy may keep its own
        verify_tokens = -1
        if lengths.shape == (num_dec,):  # the sum and the check in one call (two reductions and a sum without)
            verify_tokens = (self._kernels.sum_within(lengths, gamma) if self._kernels is not None else
                             int(_sum(lengths)) if _min(lengths) >= 0 and _max(lengths) <= gamma else -1)
        if verify_tokens < 0:
            raise EngineInvariantError(f"policy {self.policy.name} returned lengths {lengths.tolist()} for "
                                       f"{num_dec} requests with {gamma} drafted positions each")
        return draft_s, lengths, probs, raw, conf, theta, theta_global, verify_tokens

    def _draft_confidences_compiled(self, dec: np.ndarray, gamma: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The drafted positions' acceptance probabilities, raw head logits and confidences, each
        ``(R, gamma)`` float64, by the compiled kernel (``_kernels.draft_confidences``): the draws
        of :meth:`AcceptanceModel.round_logits` and :meth:`ConfidenceHead.raw_logits` from the same
        generators in the same order, and the same values bit for bit."""
        acc, head, num = self.acc, self.head, dec.size
        offset = self.rng.normal(0.0, acc.sigma_round, size=num) if acc.sigma_round > 0.0 else None
        shift = None
        if self.logit_shift is not None:  # acceptance drift over time, output position and context
            shift = np.ascontiguousarray(self.logit_shift(self.env.now, self.generated[dec], self.kv.tokens[dec]),
                                         dtype=np.float64)
        noise = None
        if not head.oracle and head.noise_sd:
            noise = self.head_rng.normal(0.0, head.noise_sd, size=(num, gamma))
        probs, raw, conf = np.empty((num, gamma)), np.empty((num, gamma)), np.empty((num, gamma))
        self._kernels.draft_confidences(dec, self.domain, self.difficulty, offset, acc.mu, acc.slope,
                                        None if acc.base is None else acc.base_logits(gamma), shift, noise,
                                        head.oracle, float(head.overconfidence), self.temps, probs, raw, conf)
        return probs, raw, conf

    def _accept(self, dec: np.ndarray, lengths: np.ndarray, probs, raw, conf):  # noqa: ANN001 - arrays or None
        """Step 7 for decoding requests: leading accepted drafts plus one bonus token, capped at the
        remaining output. Returns (accepted drafts, tokens emitted, finished ids, accepted per request)."""
        finished: list[int] = []
        if not dec.size:
            return 0, 0, finished, 0
        accepted_total = 0
        if self._kernels is not None:
            return self._accept_compiled(dec, lengths, probs, raw, conf)
        if probs is not None:
            would = _and_accumulate(self.rng.random(probs.shape) < probs, axis=1)
            if self.diag_n < self.DIAG_ROUNDS:
                self._record_diag(raw, conf, would)
            # would is a prefix (accepted run), so the verified part of it is the shorter of the two
            acc = np.minimum(_sum(would, axis=1), lengths)
            accepted_total = int(_sum(acc))
        else:
            acc = 0
        out, gen = self.output[dec], self.generated[dec]
        emit = np.minimum(acc + 1, out - gen)
        gen += emit
        self.generated[dec] = gen
        self.kv.append(dec, emit)  # anchor + accepted drafts stored; rejected drafts dropped
        self.num_rounds[dec] += 1
        if probs is not None:
            self.verified[dec] += lengths
            self.accepted[dec] += acc
        fin = gen >= out
        if _any(fin):
            finished.extend(dec[fin].tolist())
        return accepted_total, int(_sum(emit)), finished, acc

    def _accept_compiled(self, dec: np.ndarray, lengths: np.ndarray, probs: np.ndarray | None,
                         raw: np.ndarray | None, conf: np.ndarray | None) -> tuple[int, int, list[int], np.ndarray | int]:
        """:meth:`_accept` by the compiled kernel (``_kernels.accept_apply``): the same draws from the
        run's generator, the same outcome bit for bit. A round without drafts (``probs`` None) is a
        round of zero-width drafts: every request emits its bonus token."""
        kv = self.kv
        drafted = probs is not None
        if drafted:
            u = self.rng.random(probs.shape)
            would = np.empty(probs.shape, dtype=bool) if self.diag_n < self.DIAG_ROUNDS else None
        else:
            u = probs = np.empty((dec.size, 0))
            would = None
        acc = np.empty(dec.size, dtype=np.int64)
        fin = self._scratch[4]
        accepted_total, emitted_total, added, num_fin = self._kernels.accept_apply(
            dec, u, probs, lengths, self.generated, self.output, self.num_rounds, self.verified, self.accepted,
            kv.tokens, kv.blocks, kv.block_tokens, acc, would, fin)
        if would is not None:
            self._record_diag(raw, conf, would)
        kv.blocks_used += added  # KVCacheManager.append's bookkeeping, done in the kernel
        if kv.blocks_used > kv.capacity:
            kv.check("append")
        return accepted_total, emitted_total, fin[:num_fin].tolist(), acc if drafted else 0

    def _advance_prefill(self, pre: np.ndarray, chunks: np.ndarray | None, chunk_total: int,
                         finished: list[int]) -> tuple[int, int]:
        """Step 7 for prefilling requests: store the chunks; a request whose prefill completes emits
        its first token. Returns (requests that prefilled, tokens emitted)."""
        if not chunk_total:
            return 0, 0
        self._run_ids = (self._run_ids[0], None) if self._run_ids is not None else None  # "all decode" may have become true
        if self._kernels is not None:
            fin = self._scratch[4]
            num_prefill, completed, num_fin = self._kernels.prefill_apply(
                pre, chunks, self.prefilled, self.prefill_target, self.kv.tokens, self.generated, self.output,
                self.first_token_at, self.env.now, fin)
            if num_fin:
                finished.extend(fin[:num_fin].tolist())
            return num_prefill, completed
        self.prefilled[pre] += chunks
        self.kv.append_prefill(pre, chunks)
        done_pre = pre[self.prefilled[pre] >= self.prefill_target[pre]]
        if done_pre.size:
            self.generated[done_pre] += 1  # the prefill pass's last logits give a token
            first = done_pre[np.isnan(self.first_token_at[done_pre])]
            self.first_token_at[first] = self.env.now
            finished.extend(done_pre[self.generated[done_pre] >= self.output[done_pre]].tolist())
        return int(np.count_nonzero(chunks)), int(done_pre.size)

    def _finish(self, finished: list[int]) -> None:
        now, kv = self.env._now, self.kv
        if self._kv_kernels is not None and finished:
            # the array work of the loop below in one call (_kernels.finish), then each completion in
            # order: nothing a completion runs (its user's next submission) reads the others' state
            kv.blocks_used -= self._kv_kernels.finish(finished, now, self.finished_at, self.status, kv.blocks)
            running, self._run_ids = self.running, None
            for i in finished:
                running.remove(i)
                self._complete(i)
        else:
            for i in finished:
                self.finished_at[i] = now
                self.status[i] = FINISHED
                kv.free(i, drop_tokens=False)
                self.running.remove(i)
                self._run_ids = None
                self._complete(i)
        kv.check("finish")

    def _update_coherence(self, lengths: np.ndarray, acc: np.ndarray, accepted_total: int, verify_tokens: int) -> None:
        memtp = self.drafter.spec.memtp
        if isinstance(self.coherence, TowerCoherence):
            pos = np.arange(lengths.size and int(lengths.max()) or 0)[None, :]
            if pos.size:
                verified = pos < lengths[:, None]
                self.coherence.update_positions((verified & (pos < acc[:, None])).sum(axis=0).tolist(),
                                                (verified & (pos <= acc[:, None])).sum(axis=0).tolist(),
                                                depth=min(self.coherence.max_levels, pos.size))
        elif memtp is not None and memtp.coherence_estimator == "per_tested":
            # positions compared against the target: the accepted run plus the first rejection
            # (if it lies within the verified length)
            self.coherence.update(accepted_total, int(np.minimum(lengths, acc + 1).sum()))
        else:
            self.coherence.update(accepted_total, verify_tokens)

    def _record_diag(self, raw: np.ndarray, used: np.ndarray, would: np.ndarray) -> None:
        # raw: head logits; used: confidences the policy saw; would: acceptance of every position.
        # The round's own arrays are kept (nothing writes to them after the round) and laid out
        # once at the end of the run (_diag_arrays): a copy per round cost more than the rest of it.
        k = min(raw.shape[0], self.DIAG_ROUNDS - self.diag_n)
        if k > 0:
            self._diag_parts.append((raw[:k], used[:k], would[:k]))
            self.diag_n += k

    def _diag_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(raw confidences, confidences used, outcomes, widths) of the recorded request-rounds:
        ``(n_diag, width)`` each but the widths ``(n_diag,)``; a round that drafted fewer positions
        than the widest (elastic depth) is padded (0.5, 0.5, False) and keeps its width."""
        n, width = self.diag_n, self._diag_width
        # a drafted block's part (buffers, start, end) as its rows (_kept_diag)
        parts = [(p[0][0][p[1]: p[2]], p[0][1][p[1]: p[2]], p[0][2][p[1]: p[2]]) if type(p[1]) is int else p
                 for p in self._diag_parts]
        if parts and all(r.shape[1] == width for r, _, _ in parts):  # no padding: each array one copy
            return (expit(np.concatenate([r for r, _, _ in parts])), np.concatenate([u for _, u, _ in parts]),
                    np.concatenate([w for _, _, w in parts]), np.full(n, width, dtype=np.int64))
        raw, used = np.zeros((n, width)), np.full((n, width), 0.5)  # raw logit 0 is confidence 0.5
        ok, widths = np.zeros((n, width), dtype=bool), np.empty(n, dtype=np.int64)
        row = 0
        for r, u, w in parts:
            k, cols = r.shape
            raw[row: row + k, :cols], used[row: row + k, :cols], ok[row: row + k, :cols] = r, u, w
            widths[row: row + k] = cols
            row += k
        return expit(raw), used, ok, widths

    # ----------------------------------------------------------------- run
    def run(self) -> EngineState:
        """Simulate until every request has completed or been rejected.

        Raises:
            EngineInvariantError: an invariant broke (see the module docstring).
        """
        env = self.env
        if self.wl.closed_loop:
            for _ in range(min(self.wl.concurrency or 1, self.n)):
                self._user_next()
        else:
            self._arrival_order, self._next_arrival = np.argsort(self.arrival_at, kind="stable").tolist(), 0
            self._open_loop_next()
        proc = env.process(self._engine())
        env.run(until=proc)
        if not np.all((self.status == FINISHED) | (self.status == REJECTED)):
            raise EngineInvariantError("engine stopped with requests neither finished nor rejected")
        diag_raw, diag_used, diag_ok, diag_width = self._diag_arrays()
        return EngineState(
            arrival_at_s=self.arrival_at, ready_at_s=self.ready_at, admitted_at_s=self.admitted_at,
            first_token_at_s=self.first_token_at, finished_at_s=self.finished_at,
            prompt_tokens=self.prompt, output_tokens=self.output, generated_tokens=self.generated,
            domain=self.domain, difficulty=self.difficulty, status=self.status,
            reject_reason=self.reject_reason, num_preemptions=self.num_preemptions,
            num_rounds=self.num_rounds, draft_tokens_verified=self.verified,
            draft_tokens_accepted=self.accepted, rounds=self.log.arrays(),
            kv_capacity_blocks=self.kv.capacity, end_s=float(env.now), last_arrival_s=self.last_arrival,
            in_system_area=self.in_system_area,
            confidence_raw=diag_raw, confidence_used=diag_used, confidence_outcome=diag_ok, confidence_width=diag_width,
            num_depth_changes=self.drafter.num_depth_changes,
            num_not_arrived=self.wl.num_not_arrived, closed_loop=self.wl.closed_loop,
        )


_MIRRORED = _mirrored()  # as defined here, before anything could replace them
# the KV manager's functions whose work _kernels.admit and finish do (Engine._kv_kernels_if_own)
_KV_OWN = {name: getattr(KVCacheManager, name) for name in ("blocks_for", "can_allocate", "allocate", "free")}
# the functions a completion runs, as defined here (Engine._absorb_setup)
_COMPLETION_OWN = {name: getattr(Engine, name) for name in _COMPLETION_PATH}

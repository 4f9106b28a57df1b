"""The serving engine: one GPU, continuous batching, paged KV memory, speculative rounds.

SimPy drives time: an arrival process (open loop) or one process per user (closed loop) submits
requests, and one engine process runs rounds. Per-request state lives in numpy arrays indexed by
request id; each round is vectorised over the decoding requests.

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
4. **Draft**: every decoding request drafts ``policy.draft_len`` tokens; the drafter's time
   ``T_draft(R, gamma)`` comes from the profile. Acceptance probabilities of the drafted
   positions are drawn now; the (calibrated) confidence head reports them to the policy.
5. **Schedule**: the policy picks verify lengths; speculative tokens that would overflow the KV
   cache are trimmed (drafts are optional, anchors are not).
6. **Verify**: one forward pass of ``B = R + sum(lengths) + prefill tokens`` taking
   ``1 / SPS(B)``.
7. **Accept**: request r keeps its leading accepted drafts plus one bonus token (capped at its
   remaining output); rejected drafts' KV is dropped. A request whose prefill completes emits its
   first token at the end of the pass.

Invariants checked every round (a violation raises ``AssertionError`` at once): KV blocks in use
never exceed capacity; tokens emitted never exceed a request's output.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable

import numpy as np
import simpy

from scipy.special import expit

from .acceptance import AcceptanceModel
from .confidence import ConfidenceHead
from .hardware import GIB, HardwareProfile
from .memtp import CoherenceEWMA, DepthController, MemtpSettings, memtp_depth
from .policies.base import Policy, RoundView
from .workload import Workload

__all__ = ["EngineSettings", "EngineState", "Engine", "REJECT_REASONS"]

# request status codes
PENDING, WAITING, RUNNING, FINISHED, REJECTED = 0, 1, 2, 3, 4
REJECT_REASONS = ("exceeds_max_model_len", "exceeds_kv_capacity")

ROUND_FIELDS = (
    "start_s", "duration_s", "draft_s", "verify_s", "num_decode", "num_prefill", "prefill_tokens",
    "batch_tokens", "gamma", "verify_tokens", "accepted_tokens", "emitted_tokens", "num_waiting",
    "num_running", "kv_blocks_peak", "kv_blocks_after", "theta", "theta_global", "num_preempted",
    "num_trimmed", "depth", "coherence", "heads_gib", "kv_gib", "free_gib", "kv_capacity_blocks",
    "head_load_s", "num_remote_prefill",
)


@dataclass(frozen=True)
class EngineSettings:
    """Engine knobs (see :class:`memtp_sim.config.EngineConfig`)."""

    max_batch_tokens: int = 512
    prefill_chunk_tokens: int = 256
    max_num_seqs: int = 256
    kv_watermark_frac: float = 0.01
    prefill: str = "colocated"
    prefill_gpus: int = 1


class _RoundLog:
    """Per-round records as tuples in ``ROUND_FIELDS`` order, packed into float64 blocks every
    ``FLUSH`` rounds (a tuple costs several times its numbers in memory)."""

    FLUSH = 1 << 15

    def __init__(self) -> None:
        self.rows: list[tuple] = []
        self.blocks: list[np.ndarray] = []
        self.append = self.rows.append

    def flush(self) -> None:
        if self.rows:
            self.blocks.append(np.array(self.rows, dtype=np.float64))
            self.rows.clear()

    def arrays(self) -> dict[str, np.ndarray]:
        self.flush()
        if not self.blocks:
            return {f: np.empty(0) for f in ROUND_FIELDS}
        table = np.concatenate(self.blocks)
        return {f: table[:, i].copy() for i, f in enumerate(ROUND_FIELDS)}


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
            shape (>= draft_len,) (default: ones).
        head_rng: random generator of the head's noise (kept apart from ``rng`` so that head
            settings do not shift the acceptance draws).
    """

    #: request-rounds of (confidence, outcome) kept for calibration diagnostics
    DIAG_ROUNDS = 20000

    def __init__(self, profile: HardwareProfile, acceptance: AcceptanceModel, workload: Workload,
                 policy: Policy, settings: EngineSettings, rng: np.random.Generator,
                 progress: Callable[[int, int], None] | None = None, head: ConfidenceHead | None = None,
                 temperatures: np.ndarray | None = None, head_rng: np.random.Generator | None = None,
                 memtp: MemtpSettings | None = None) -> None:
        self.profile = profile
        self.memtp = memtp
        self.head = head if head is not None else ConfidenceHead(oracle=True)
        gamma = int(memtp.max_depth if memtp is not None else policy.draft_len)
        self.temps = np.ones(gamma) if temperatures is None else np.asarray(temperatures, dtype=np.float64)[:gamma]
        self.head_rng = head_rng if head_rng is not None else np.random.default_rng(0)
        self.diag_raw = np.empty((self.DIAG_ROUNDS, gamma))
        self.diag_used = np.empty((self.DIAG_ROUNDS, gamma))
        self.diag_ok = np.empty((self.DIAG_ROUNDS, gamma), dtype=bool)
        self.diag_width = np.empty(self.DIAG_ROUNDS, dtype=np.int64)
        self.diag_n = 0
        self.acc = acceptance
        self.wl = workload
        self.policy = policy
        self.cfg = settings
        self.rng = rng
        self.progress = progress
        self.env = simpy.Environment()

        n = workload.num_requests
        self.n = n
        self.prompt = workload.prompt_tokens.astype(np.int64)
        self.output = workload.output_tokens.astype(np.int64)
        self.domain = workload.domain.astype(np.int64)
        self.difficulty = acceptance.sample_difficulty(rng, n)
        nan = np.full(n, np.nan)
        self.arrival_at = workload.arrival_s.astype(np.float64).copy() if not workload.closed_loop else nan.copy()
        self.ready_at = nan.copy()
        self.admitted_at = nan.copy()
        self.first_token_at = nan.copy()
        self.finished_at = nan.copy()
        self.status = np.zeros(n, dtype=np.int8)
        self.reject_reason = np.full(n, "", dtype=object)
        self.generated = np.zeros(n, dtype=np.int64)
        self.prefill_target = np.zeros(n, dtype=np.int64)  # tokens to (re)compute before decoding
        self.prefilled = np.zeros(n, dtype=np.int64)
        self.kv_tokens = np.zeros(n, dtype=np.int64)  # tokens whose KV is stored
        self.kv_blocks = np.zeros(n, dtype=np.int64)  # blocks held
        self.num_preemptions = np.zeros(n, dtype=np.int64)
        self.num_rounds = np.zeros(n, dtype=np.int64)
        self.verified = np.zeros(n, dtype=np.int64)
        self.kv_transferred = np.zeros(n, dtype=bool)
        self.accepted = np.zeros(n, dtype=np.int64)

        mem = profile.memory
        self.block = mem.kv_block_tokens
        self.block_gib = mem.kv_block_gib
        self.coherence = CoherenceEWMA(memtp.coherence_half_life_rounds if memtp is not None else 8.0, initial=1.0)
        self.controller: DepthController | None = None
        if memtp is None:
            # classic drafter: fixed weights, draft length = the policy's
            self.depth = int(policy.draft_len)
            self.heads_gib = mem.drafter_weights_gib if self.depth > 0 else 0.0
        else:
            # the ensemble's heads replace the drafter's weights; depth = draft length
            if memtp.elastic:
                free0 = mem.gpu_allocatable_gib - mem.weights_gib - mem.reserve_gib
                depth0 = memtp.initial_depth or memtp_depth(
                    max(0.0, free0), 1.0, max_depth=memtp.max_depth, head_cost_gib=memtp.head_cost_gib,
                    r_low=memtp.r_low, r_high=memtp.r_high)
                self.controller = DepthController(
                    max_depth=memtp.max_depth, head_cost_gib=memtp.head_cost_gib, r_low=memtp.r_low,
                    r_high=memtp.r_high, min_dwell_rounds=memtp.min_dwell_rounds, initial_depth=int(depth0))
                self.depth = self.controller.depth
            else:
                self.depth = int(memtp.depth)
            self.heads_gib = self.depth * memtp.head_cost_gib
        self.capacity = mem.kv_capacity_blocks(speculative=False, other_gib=self.heads_gib)
        if self.capacity <= 0:
            raise ValueError(
                f"no KV memory left: {mem.gpu_allocatable_gib:.1f} GiB allocatable, weights {mem.weights_gib:.1f}, "
                f"reserve {mem.reserve_gib:.1f}, draft heads/drafter {self.heads_gib:.1f} GiB")
        self.watermark = int(np.ceil(settings.kv_watermark_frac * self.capacity))
        self.blocks_used = 0
        self.waiting: deque[int] = deque()
        self.running: list[int] = []  # admission order
        self.num_done = 0
        self.num_remote_prefill = 0  # requests queued for or in a remote prefill GPU
        self.in_system = 0
        self.in_system_area = 0.0
        self._in_system_since = 0.0
        self.last_arrival = 0.0
        self.log = _RoundLog()
        self._wake: simpy.Event | None = None
        self._done_events: dict[int, simpy.Event] = {}
        self._next_request = 0
        self._progress_step = max(1, n // 50)
        self._prefill_gpu = simpy.Resource(self.env, capacity=settings.prefill_gpus)

    # ----------------------------------------------------------------- arrivals
    def _count_in_system(self, delta: int) -> None:
        # time integral of requests in the system (arrived, not yet finished or rejected): the
        # L of Little's law, kept from the engine's own state changes
        now = self.env.now
        self.in_system_area += self.in_system * (now - self._in_system_since)
        self._in_system_since = now
        self.in_system += delta

    def _submit(self, i: int) -> None:
        self._count_in_system(+1)
        now = self.env.now
        self.arrival_at[i] = now
        self.last_arrival = now
        if self.prompt[i] + self.output[i] > self.profile.memory.max_model_len:
            self._reject(i, "exceeds_max_model_len")
            return
        if self._blocks_for(self.prompt[i] + self.output[i]) > self._max_capacity():
            self._reject(i, "exceeds_kv_capacity")
            return
        if self.cfg.prefill == "disaggregated":
            self.num_remote_prefill += 1
            self.env.process(self._remote_prefill(i))
            return
        self._enqueue(i)

    def _enqueue(self, i: int) -> None:
        self.ready_at[i] = self.env.now
        self.status[i] = WAITING
        self.waiting.append(i)
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def _remote_prefill(self, i: int):
        # Disaggregated serving (the DSpark paper's production setting, section 5.4): prefill_gpus
        # separate GPUs with the same profile compute prompts FIFO, one prompt each at a time, in passes of up to
        # max_batch_tokens tokens, and emits the first token; its KV then moves to this decode GPU
        # (transfer time not modelled).
        with self._prefill_gpu.request() as slot:
            yield slot
            yield self.env.timeout(self._prefill_time_s(int(self.prompt[i])))
        self.num_remote_prefill -= 1
        self.first_token_at[i] = self.env.now
        self.generated[i] = 1
        self.kv_transferred[i] = True
        if self.generated[i] >= self.output[i]:
            self.finished_at[i] = self.env.now
            self.status[i] = FINISHED
            self._complete(i)
            return
        self._enqueue(i)

    def _prefill_time_s(self, prompt: int) -> float:
        m = self.cfg.max_batch_tokens
        full, rest = divmod(prompt, m)
        t = full * float(self.profile.sps.pass_time_s(m))
        return t + (float(self.profile.sps.pass_time_s(rest)) if rest else 0.0)

    def _reject(self, i: int, reason: str) -> None:
        self.status[i] = REJECTED
        self.reject_reason[i] = reason
        self._complete(i)

    def _open_loop(self):
        env = self.env
        for i in np.argsort(self.arrival_at, kind="stable"):
            delay = self.arrival_at[i] - env.now
            if delay > 0:
                yield env.timeout(delay)
            self._submit(int(i))

    def _user(self):
        env = self.env
        while self._next_request < self.n:
            i = self._next_request
            self._next_request += 1
            done = env.event()
            self._done_events[i] = done
            self._submit(i)
            yield done
            if self.wl.think_time_s > 0:
                yield env.timeout(self.wl.think_time_s)

    def _complete(self, i: int) -> None:
        self._count_in_system(-1)
        self.num_done += 1
        ev = self._done_events.pop(i, None)
        if ev is not None:
            ev.succeed()
        # A request can end outside a round (rejected at arrival, or done at remote prefill)
        # while the engine sleeps: wake it so it can notice the run is over.
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()
        if self.progress is not None and (self.num_done % self._progress_step == 0 or self.num_done == self.n):
            self.progress(self.num_done, self.n)

    # ----------------------------------------------------------------- memory
    def _max_capacity(self) -> int:
        """KV blocks with the fewest heads this engine can run (elastic: one head)."""
        if self.controller is None:
            return self.capacity
        return self.profile.memory.kv_capacity_blocks(speculative=False, other_gib=self.memtp.head_cost_gib)

    def _update_depth(self, round_index: int) -> float:
        """Elastic MEMTP: let the controller resize the ensemble; returns head-load stall seconds.

        Memory that can fund heads = allocatable - weights - reserve - KV in use - the KV the
        head-of-line waiting request needs to be admitted (KV first: heads are released before KV
        would overflow or a request would wait for memory held by heads).
        """
        mem = self.profile.memory
        pending = 0
        if self.waiting:
            i = self.waiting[0]
            tokens = self.prompt[i] if self.kv_transferred[i] else self.prompt[i] + self.generated[i]
            pending = int(self._blocks_for(tokens)) + self.watermark
        kv_gib = (self.blocks_used + pending) * self.block_gib
        free = max(0.0, mem.gpu_allocatable_gib - mem.weights_gib - mem.reserve_gib - kv_gib)
        old = self.depth
        new = self.controller.propose(free, self.coherence.value, round_index)
        if new == old:
            return 0.0
        self.depth = new
        self.heads_gib = new * self.memtp.head_cost_gib
        self.capacity = mem.kv_capacity_blocks(speculative=False, other_gib=self.heads_gib)
        assert self.blocks_used <= self.capacity, "heads grew into KV in use"
        if new > old:  # loading new heads stalls the engine
            return (new - old) * self.memtp.head_cost_gib * GIB / (self.memtp.head_load_gb_per_s * 1e9)
        return 0.0

    def _blocks_for(self, tokens):
        return -(-tokens // self.block)

    def _preempt(self, i: int) -> None:
        # Recompute preemption: drop all KV; re-prefill prompt + generated tokens later.
        self.blocks_used -= int(self.kv_blocks[i])
        self.kv_blocks[i] = 0
        self.kv_tokens[i] = 0
        self.prefilled[i] = 0
        self.num_preemptions[i] += 1
        self.kv_transferred[i] = False
        self.status[i] = WAITING
        self.running.remove(i)
        self.waiting.appendleft(i)

    def _admit(self) -> None:
        cfg = self.cfg
        while self.waiting and len(self.running) < cfg.max_num_seqs:
            i = self.waiting[0]
            # KV transferred from a prefill GPU covers the prompt (the first token is the anchor);
            # otherwise prompt + generated tokens are (re)computed here, emitting one token.
            transferred = bool(self.kv_transferred[i])
            target = int(self.prompt[i]) if transferred else int(self.prompt[i] + self.generated[i])
            need = int(self._blocks_for(target))
            if self.blocks_used + need + self.watermark > self.capacity and self.running:
                break
            if self.blocks_used + need > self.capacity:
                break  # cannot happen for an empty engine: oversize requests were rejected
            self.waiting.popleft()
            self.status[i] = RUNNING
            if np.isnan(self.admitted_at[i]):
                self.admitted_at[i] = self.env.now
            self.prefill_target[i] = target
            self.prefilled[i] = self.kv_tokens[i] = target if transferred else 0
            self.kv_blocks[i] = need
            self.blocks_used += need
            self.running.append(i)

    # ----------------------------------------------------------------- rounds
    def _engine(self):
        env = self.env
        cfg = self.cfg
        sps = self.profile.sps
        drafter = self.profile.drafter
        block = self.block
        positions_all = np.arange(max(1, self.temps.size))[None, :]
        kv_tokens, kv_blocks = self.kv_tokens, self.kv_blocks
        mem = self.profile.memory
        fixed_gib = mem.gpu_allocatable_gib - mem.weights_gib - mem.reserve_gib
        round_index = 0
        while self.num_done < self.n:
            busy = bool(self.running or self.waiting)
            head_load_s = self._update_depth(round_index) if self.controller is not None and busy else 0.0
            gamma = self.depth
            positions = positions_all[:, :gamma]
            self._admit()
            if not self.running:
                assert not self.waiting, "admission stalled on an idle engine"
                self._wake = env.event()
                yield self._wake
                self._wake = None
                continue

            run = np.fromiter(self.running, dtype=np.int64, count=len(self.running))
            decoding_mask = self.prefilled[run] >= self.prefill_target[run]
            # 2. every decoding request's anchor needs a KV slot; a request whose stored tokens
            # fill its last block needs a new block. Preempt the newest admissions until they fit.
            num_preempted = 0
            while True:
                dec = run[decoding_mask]
                need = self.blocks_used + int(np.count_nonzero(kv_tokens[dec] % block == 0))
                if need <= self.capacity or run.size <= 1:
                    break
                self._preempt(int(run[-1]))
                num_preempted += 1
                run, decoding_mask = run[:-1], decoding_mask[:-1]
            pre = run[~decoding_mask] if dec.size < run.size else run[:0]
            num_dec = dec.size

            # 3. chunked prefill, first-admitted first
            budget = cfg.max_batch_tokens - num_dec
            chunk_total = 0
            chunks = None
            if pre.size and budget > 0:
                left = self.prefill_target[pre] - self.prefilled[pre]
                limit = min(cfg.prefill_chunk_tokens, budget)
                chunks = np.clip(limit - (np.cumsum(left) - left), 0, left)
                chunk_total = int(chunks.sum())

            # 4. draft + 5. schedule
            draft_s = 0.0
            lengths = np.zeros(num_dec, dtype=np.int64)
            theta = theta_g = np.nan
            probs = None
            if num_dec and gamma > 0:
                draft_s = drafter.round_time_s(num_dec, gamma)
                logits = self.acc.round_logits(self.rng, self.domain[dec], self.difficulty[dec], gamma)
                probs = expit(logits)
                raw = self.head.raw_logits(self.head_rng, logits)
                conf = expit(raw / self.temps[:gamma])
                plan = self.policy.plan(RoundView(
                    confidences=conf, sps=sps, prefill_tokens=chunk_total, max_batch_tokens=cfg.max_batch_tokens,
                    draft_overhead_s=draft_s, round_index=round_index))
                lengths = np.asarray(plan.lengths, dtype=np.int64)
                if self.memtp is not None:
                    lengths = np.minimum(lengths, gamma)  # a static k verifies at most what was drafted
                theta, theta_g = plan.theta, plan.theta_global
                if lengths.shape != (num_dec,) or lengths.min() < 0 or lengths.max() > gamma:
                    raise AssertionError(f"policy {self.policy.name} returned invalid lengths {lengths}")
            # KV at the pass's peak: stored tokens + anchor + verified drafts. Drafts that would
            # overflow the cache are trimmed, longest first (drafts are optional, anchors are not).
            num_trimmed = 0
            extra = -(-(kv_tokens[dec] + 1 + lengths) // block) - kv_blocks[dec]
            kv_peak = self.blocks_used + int(extra.sum())
            while kv_peak > self.capacity and lengths.any():
                j = int(np.argmax(lengths))
                lengths[j] -= 1
                num_trimmed += 1
                kv_peak -= int(extra[j])
                extra[j] = -(-(kv_tokens[dec[j]] + 1 + lengths[j]) // block) - kv_blocks[dec[j]]
                kv_peak += int(extra[j])
            assert kv_peak <= self.capacity, "KV cache over capacity"

            verify_tokens = int(lengths.sum())
            batch_tokens = num_dec + verify_tokens + chunk_total
            assert batch_tokens <= cfg.max_batch_tokens
            verify_s = float(sps.pass_time_s(batch_tokens))
            duration = head_load_s + draft_s + verify_s
            assert kv_peak * self.block_gib + self.heads_gib <= fixed_gib + 1e-9, "KV + heads exceed memory"
            start = env.now
            num_waiting = len(self.waiting)
            num_running = len(self.running)
            num_remote = self.num_remote_prefill
            yield env.timeout(duration)
            now = env.now

            # 7. accept: leading accepted drafts + one bonus token, capped at the remaining output
            accepted_total = emitted_total = 0
            finished: list[int] = []
            if num_dec:
                if probs is not None:
                    would = np.cumprod(self.rng.random(probs.shape) < probs, axis=1).astype(bool)
                    self._record_diag(raw, conf, would)
                    acc = (would & (positions < lengths[:, None])).sum(axis=1)
                    accepted_total = int(acc.sum())
                else:
                    acc = 0
                emit = np.minimum(acc + 1, self.output[dec] - self.generated[dec])
                gen = self.generated[dec] + emit
                self.generated[dec] = gen
                new_kv = kv_tokens[dec] + emit  # anchor + accepted drafts stored; rejected dropped
                kv_tokens[dec] = new_kv
                new_blocks = -(-new_kv // block)
                self.blocks_used += int((new_blocks - kv_blocks[dec]).sum())
                kv_blocks[dec] = new_blocks
                self.num_rounds[dec] += 1
                if probs is not None:
                    self.verified[dec] += lengths
                    self.accepted[dec] += acc
                emitted_total = int(emit.sum())
                fin = gen >= self.output[dec]
                if fin.any():
                    finished.extend(dec[fin].tolist())
            num_prefill = 0
            if chunk_total:
                self.prefilled[pre] += chunks
                kv_tokens[pre] += chunks
                num_prefill = int(np.count_nonzero(chunks))
                done_pre = pre[self.prefilled[pre] >= self.prefill_target[pre]]
                if done_pre.size:
                    self.generated[done_pre] += 1  # the prefill pass's last logits give a token
                    emitted_total += int(done_pre.size)
                    first = done_pre[np.isnan(self.first_token_at[done_pre])]
                    self.first_token_at[first] = now
                    finished.extend(done_pre[self.generated[done_pre] >= self.output[done_pre]].tolist())
            for i in finished:
                self.finished_at[i] = now
                self.status[i] = FINISHED
                self.blocks_used -= int(kv_blocks[i])
                kv_blocks[i] = 0
                self.running.remove(i)
                self._complete(i)
            assert self.blocks_used <= self.capacity
            if probs is not None:
                if self.memtp is not None and self.memtp.coherence_estimator == "per_tested":
                    # positions compared against the target: the accepted run plus the first
                    # rejection (if it lies within the verified length)
                    self.coherence.update(accepted_total, int(np.minimum(lengths, acc + 1).sum()))
                else:
                    self.coherence.update(accepted_total, verify_tokens)

            kv_gib = self.blocks_used * self.block_gib
            self.log.append((
                start, duration, draft_s, verify_s, num_dec, num_prefill, chunk_total, batch_tokens,
                gamma if num_dec else 0, verify_tokens, accepted_total, emitted_total, num_waiting,
                num_running, kv_peak, self.blocks_used, theta, theta_g, num_preempted, num_trimmed,
                gamma, self.coherence.value, self.heads_gib, kv_gib, fixed_gib - self.heads_gib - kv_gib,
                self.capacity, head_load_s, num_remote,
            ))
            round_index += 1
            if round_index % _RoundLog.FLUSH == 0:
                self.log.flush()

    def _record_diag(self, raw: np.ndarray, used: np.ndarray, would: np.ndarray) -> None:
        # raw: head logits; used: confidences the policy saw; would: acceptance of every position.
        # Rounds may draft fewer positions than the widest (elastic depth): pad and keep the width.
        k = min(raw.shape[0], self.DIAG_ROUNDS - self.diag_n)
        if k > 0:
            sl = slice(self.diag_n, self.diag_n + k)
            w = raw.shape[1]
            self.diag_raw[sl, :w], self.diag_used[sl, :w], self.diag_ok[sl, :w] = expit(raw[:k]), used[:k], would[:k]
            self.diag_raw[sl, w:], self.diag_used[sl, w:], self.diag_ok[sl, w:] = 0.5, 0.5, False
            self.diag_width[sl] = w
            self.diag_n += k

    # ----------------------------------------------------------------- run
    def run(self) -> EngineState:
        """Simulate until every request has completed or been rejected."""
        env = self.env
        if self.wl.closed_loop:
            for _ in range(min(self.wl.concurrency or 1, self.n)):
                env.process(self._user())
        else:
            env.process(self._open_loop())
        proc = env.process(self._engine())
        env.run(until=proc)
        if not np.all((self.status == FINISHED) | (self.status == REJECTED)):
            raise AssertionError("engine stopped with requests neither finished nor rejected")
        return EngineState(
            arrival_at_s=self.arrival_at, ready_at_s=self.ready_at, admitted_at_s=self.admitted_at,
            first_token_at_s=self.first_token_at, finished_at_s=self.finished_at,
            prompt_tokens=self.prompt, output_tokens=self.output, generated_tokens=self.generated,
            domain=self.domain, difficulty=self.difficulty, status=self.status,
            reject_reason=self.reject_reason, num_preemptions=self.num_preemptions,
            num_rounds=self.num_rounds, draft_tokens_verified=self.verified,
            draft_tokens_accepted=self.accepted, rounds=self.log.arrays(),
            kv_capacity_blocks=self.capacity, end_s=float(env.now), last_arrival_s=self.last_arrival,
            in_system_area=self.in_system_area,
            confidence_raw=self.diag_raw[: self.diag_n], confidence_used=self.diag_used[: self.diag_n],
            confidence_outcome=self.diag_ok[: self.diag_n], confidence_width=self.diag_width[: self.diag_n],
            num_depth_changes=self.controller.num_changes if self.controller is not None else 0,
        )

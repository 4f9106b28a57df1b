"""Paged KV cache bookkeeping: the one owner of KV blocks in the engine.

The cache is ``capacity`` blocks of ``block_tokens`` tokens each. Every request holds a whole
number of blocks; the tokens whose KV is stored are counted per request. Operations follow
vLLM's ``kv_cache_manager.py`` (allocate slots, with lookahead for speculative tokens; free) and
Vidur's replica scheduler (``allocate`` / ``free``):

* :meth:`KVCacheManager.allocate` at admission (blocks for the whole prefill target),
* :meth:`KVCacheManager.anchor_blocks` / :meth:`KVCacheManager.fit_lookahead` before a pass
  (one anchor token per decoding request, then draft tokens while blocks last),
* :meth:`KVCacheManager.append` after a pass (accepted tokens are stored, rejected ones dropped),
* :meth:`KVCacheManager.free` at completion or preemption (recompute preemption drops all KV),
* :meth:`KVCacheManager.set_capacity` when the memory left for KV changes (MEMTP heads).

Invariant: ``blocks_used == blocks.sum() <= capacity`` after every operation; a violation raises
:class:`~memtp_sim.errors.EngineInvariantError` naming the operation and the numbers.

Arrays are indexed by request id, shape (num_requests,), int64.
"""

from __future__ import annotations

import numpy as np

from .errors import EngineInvariantError, InvalidArgumentError

__all__ = ["KVCacheManager"]

_sum = np.add.reduce  # ndarray.sum goes through a Python frame: a few us on every round's small arrays


class KVCacheManager:
    """Paged KV blocks of one GPU (see module docstring).

    Args:
        num_requests: requests of the run (array length).
        block_tokens: tokens per block, >= 1.
        capacity: blocks that fit in memory, >= 1.
        watermark_frac: fraction of the capacity kept free when admitting while others run.

    Attributes:
        tokens: ``(num_requests,)`` int64 tokens whose KV is stored, per request.
        blocks: ``(num_requests,)`` int64 blocks held, per request.
        blocks_used: ``blocks.sum()``, in blocks.
        capacity: blocks that fit, >= 1.
        watermark: ``ceil(watermark_frac * capacity)`` blocks.

    Raises:
        InvalidArgumentError: ``block_tokens`` or ``capacity`` below 1, or a watermark outside [0, 1).

    Source:
        vLLM ``vllm/v1/core/kv_cache_manager.py`` (``allocate_slots`` with
        ``num_lookahead_tokens``; ``free``); Vidur's base replica scheduler (``allocate`` /
        ``free``, capacity asserted); the admission watermark of vLLM's v0 block manager
        (``watermark`` blocks kept free).
    """

    def __init__(self, num_requests: int, block_tokens: int, capacity: int, watermark_frac: float = 0.0) -> None:
        if block_tokens < 1:
            raise InvalidArgumentError(f"block_tokens: must be >= 1, got {block_tokens}")
        if capacity < 1:
            raise InvalidArgumentError(f"capacity: no KV block fits (capacity {capacity})")
        if not 0.0 <= watermark_frac < 1.0:
            raise InvalidArgumentError(f"watermark_frac: must lie in [0, 1), got {watermark_frac}")
        self.block_tokens = int(block_tokens)
        self.watermark_frac = float(watermark_frac)
        self.tokens = np.zeros(num_requests, dtype=np.int64)  # tokens whose KV is stored
        self.blocks = np.zeros(num_requests, dtype=np.int64)  # blocks held
        self.blocks_used = 0
        self.capacity = int(capacity)
        self.watermark = int(np.ceil(self.watermark_frac * self.capacity))
        self.kernels = None  # the compiled kernels module, when the engine uses them (anchor_blocks)

    # ------------------------------------------------------------------ queries
    def blocks_for(self, tokens):  # noqa: ANN001, ANN201 - int or int array in, same out
        """Blocks that hold ``tokens`` tokens: ``ceil(tokens / block_tokens)``.

        Args:
            tokens: an int, or an int64 array of any shape, in tokens (>= 0).

        Returns:
            Blocks, of the same type and shape as ``tokens``.
        """
        return -(-tokens // self.block_tokens)

    @property
    def free_blocks(self) -> int:
        """Blocks not held by any request: ``capacity - blocks_used`` (< 0 never survives a check)."""
        return self.capacity - self.blocks_used

    def can_allocate(self, num_blocks: int, *, keep_watermark: bool) -> bool:
        """Whether ``num_blocks`` more fit, keeping the watermark free if asked.

        Args:
            num_blocks: blocks wanted, >= 0.
            keep_watermark: keep :attr:`watermark` blocks free as well (admission while other
                requests run).

        Returns:
            ``blocks_used + num_blocks (+ watermark) <= capacity``.

        Source:
            vLLM's v0 block manager ``can_allocate`` (free blocks minus the request's must stay
            at or above the watermark).
        """
        reserve = self.watermark if keep_watermark else 0
        return self.blocks_used + num_blocks + reserve <= self.capacity

    def anchor_blocks(self, reqs: np.ndarray) -> int:
        """New blocks the decoding requests ``reqs`` need to store one more token (their anchor):
        one for each request whose stored tokens fill its last block.

        Args:
            reqs: ``(R,)`` int64 request ids.

        Returns:
            Blocks, in ``0..R``.

        Source:
            docs/model.md section 1, step 3 (one anchor/bonus slot per request).
        """
        if self.kernels is not None:
            return self.kernels.anchor_blocks(reqs, self.tokens, self.block_tokens)
        return int(np.count_nonzero(self.tokens[reqs] % self.block_tokens == 0))

    def lookahead_blocks(self, reqs: np.ndarray, num_tokens: np.ndarray) -> np.ndarray:
        """Extra blocks each request in ``reqs`` needs to store ``num_tokens`` more tokens.

        Args:
            reqs: ``(R,)`` int64 request ids.
            num_tokens: ``(R,)`` int64 tokens to add per request (or a scalar).

        Returns:
            ``(R,)`` int64 blocks (0 where the last block has room).

        Source:
            vLLM ``kv_cache_manager.allocate_slots(..., num_lookahead_tokens)``.
        """
        return self.blocks_for(self.tokens[reqs] + num_tokens) - self.blocks[reqs]

    def lookahead_total(self, reqs: np.ndarray, num_tokens: int) -> int:
        """:meth:`lookahead_blocks` summed over ``reqs``, for the same ``num_tokens`` each.

        Args:
            reqs: ``(R,)`` int64 request ids.
            num_tokens: tokens every request adds.

        Returns:
            Blocks, >= 0.
        """
        if self.kernels is not None:
            return self.kernels.lookahead_total(reqs, self.tokens, self.blocks, self.block_tokens, num_tokens, None)
        return int(_sum(self.lookahead_blocks(reqs, num_tokens)))

    # ------------------------------------------------------------------ changes
    def allocate(self, i: int, target_tokens: int, stored_tokens: int) -> int:
        """Admit request ``i``: reserve blocks for ``target_tokens`` tokens, of which
        ``stored_tokens`` are already stored (KV transferred from a prefill GPU; 0 otherwise).

        Args:
            i: request id.
            target_tokens: tokens the reservation must hold (the prefill target), in tokens.
            stored_tokens: tokens whose KV is already present, in tokens.

        Returns:
            The blocks allocated.

        Raises:
            EngineInvariantError: the blocks do not fit, or ``i`` already holds blocks.

        Source:
            vLLM ``kv_cache_manager.allocate_slots``; Vidur's base replica scheduler ``allocate``
            (capacity asserted; here a named error).
        """
        need = int(self.blocks_for(target_tokens))
        if self.blocks[i] != 0:
            raise EngineInvariantError(f"kv_cache.allocate: request {i} already holds {self.blocks[i]} blocks")
        if self.blocks_used + need > self.capacity:
            raise EngineInvariantError(f"kv_cache.allocate: request {i} needs {need} blocks, "
                                       f"{self.free_blocks} of {self.capacity} free")
        self.blocks[i] = need
        self.tokens[i] = stored_tokens
        self.blocks_used += need
        return need

    def free(self, i: int, *, drop_tokens: bool) -> int:
        """Release request ``i``'s blocks (completion, or recompute preemption with
        ``drop_tokens=True``, which also forgets its stored tokens).

        Args:
            i: request id.
            drop_tokens: also set its stored tokens to 0.

        Returns:
            The blocks freed.

        Source:
            vLLM ``kv_cache_manager.free``; Vidur's replica scheduler ``free``.
        """
        freed = int(self.blocks[i])
        self.blocks_used -= freed
        self.blocks[i] = 0
        if drop_tokens:
            self.tokens[i] = 0
        return freed

    def fit_lookahead(self, reqs: np.ndarray, lengths: np.ndarray) -> tuple[int, int]:
        """Trim speculative tokens so that every request in ``reqs`` can store its anchor plus
        ``lengths`` draft tokens at the pass's peak (drafts are optional, anchors are not).

        ``lengths`` (shape (len(reqs),), int64) is trimmed in place, one token at a time from the
        longest (the first longest on ties), until the peak fits.

        Args:
            reqs: ``(R,)`` int64 request ids.
            lengths: ``(R,)`` int64 draft tokens per request (bonus excluded); changed in place.

        Returns:
            ``(peak_blocks, num_trimmed)``: blocks in use at the pass's peak, and tokens trimmed.

        Raises:
            EngineInvariantError: even the anchors alone do not fit.

        Source:
            vLLM ``kv_cache_manager.allocate_slots(..., num_lookahead_tokens)``: speculative
            slots are taken only while blocks last.
        """
        num_trimmed = 0
        if self.kernels is not None:  # the common round: everything fits, nothing to trim
            peak = self.blocks_used + self.kernels.lookahead_total(reqs, self.tokens, self.blocks, self.block_tokens,
                                                                   1, lengths)
            if peak <= self.capacity:
                return peak, 0
        extra = self.lookahead_blocks(reqs, 1 + lengths)
        peak = self.blocks_used + int(_sum(extra))
        while peak > self.capacity and lengths.any():
            j = int(np.argmax(lengths))
            lengths[j] -= 1
            num_trimmed += 1
            peak -= int(extra[j])
            extra[j] = self.blocks_for(self.tokens[reqs[j]] + 1 + lengths[j]) - self.blocks[reqs[j]]
            peak += int(extra[j])
        if peak > self.capacity:
            raise EngineInvariantError(f"kv_cache.fit_lookahead: anchors need {peak} blocks, capacity {self.capacity}")
        return peak, num_trimmed

    def append(self, reqs: np.ndarray, num_tokens: np.ndarray) -> None:
        """Store ``num_tokens`` more tokens for each request in ``reqs`` (decode: anchor + accepted
        drafts), growing their blocks as needed.

        Args:
            reqs: ``(R,)`` int64 request ids.
            num_tokens: ``(R,)`` int64 tokens to store per request.

        Raises:
            EngineInvariantError: the cache would exceed its capacity.

        Source:
            docs/model.md section 1 step 5 (anchor/bonus plus accepted drafts are kept) and
            section 4 (KV in use never exceeds capacity).
        """
        new_tokens = self.tokens[reqs] + num_tokens
        self.tokens[reqs] = new_tokens
        new_blocks = -(-new_tokens // self.block_tokens)  # blocks_for, inline: every round
        self.blocks_used += int(_sum(new_blocks - self.blocks[reqs]))
        self.blocks[reqs] = new_blocks
        if self.blocks_used > self.capacity:
            self.check("append")

    def append_prefill(self, reqs: np.ndarray, num_tokens: np.ndarray) -> None:
        """Store prefill chunks; their blocks were reserved at admission (:meth:`allocate`).

        Args:
            reqs: ``(R,)`` int64 request ids.
            num_tokens: ``(R,)`` int64 prompt tokens of this pass's chunk, per request.
        """
        self.tokens[reqs] += num_tokens

    def set_capacity(self, capacity: int) -> None:
        """The memory left for KV changed (e.g. MEMTP heads loaded or released).

        Args:
            capacity: the new capacity, in blocks.

        Raises:
            EngineInvariantError: blocks in use exceed the new capacity.

        Source:
            docs/model.md section 2 (heads hold memory while alive, so KV gets less) and section
            4 (KV + heads + weights + reserve never exceed the GPU's memory).
        """
        self.capacity = int(capacity)
        self.check("set_capacity")

    def check(self, where: str) -> None:
        """Check the invariant ``blocks_used <= capacity``.

        Args:
            where: the operation's name, for the message (``kv_cache.<where>: ...``).

        Raises:
            EngineInvariantError: blocks in use exceed the capacity.

        Source:
            docs/model.md section 4 (KV memory in use never exceeds capacity); raising at once
            follows SimPy's ``resources/base.py`` (STYLE.md section 7).
        """
        if self.blocks_used > self.capacity:
            raise EngineInvariantError(f"kv_cache.{where}: {self.blocks_used} blocks in use exceed the capacity "
                                       f"{self.capacity}")

"""Memory of one GPU serving one model: weights, reserve, paged KV cache geometry."""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["MemorySpec", "GIB"]

#: Bytes per GiB.
GIB = float(1 << 30)


@dataclass(frozen=True)
class MemorySpec:
    """Memory of one GPU serving one model (all sizes in GiB unless named otherwise).

    Attributes:
        gpu_allocatable_gib: memory the GPU may allocate.
        weights_gib: target model weights.
        drafter_weights_gib: drafter weights (resident whenever a speculative policy runs).
        reserve_gib: runtime context, compute buffers, logits.
        kv_bytes_per_token: KV cache bytes per token of context (all layers, K and V).
        kv_block_tokens: tokens per paged-KV block.
        max_model_len: longest context (prompt + output) the model accepts, tokens.

    Source:
        docs/model.md section 2 (weights, the KV cache in use and a reserve share the GPU's
        memory) and section 4 (KV + heads + weights + reserve never exceed it); paged KV blocks
        as in vLLM (``block_size`` tokens per block).
    """

    gpu_allocatable_gib: float
    weights_gib: float
    drafter_weights_gib: float
    reserve_gib: float
    kv_bytes_per_token: int
    kv_block_tokens: int
    max_model_len: int

    @property
    def kv_block_gib(self) -> float:
        """GiB of one KV block: ``kv_bytes_per_token * kv_block_tokens / 2**30``."""
        return self.kv_bytes_per_token * self.kv_block_tokens / GIB

    @property
    def least_allocatable_gib(self) -> float:
        """The smallest allocatable memory a profile may state: weights, reserve and drafter, plus
        room for one KV block (below it the profile is refused at load), GiB."""
        return self.weights_gib + self.reserve_gib + self.drafter_weights_gib + self.kv_block_gib

    def kv_capacity_blocks(self, *, speculative: bool, other_gib: float = 0.0) -> int:
        """Paged-KV blocks that fit next to weights, drafter, reserve and ``other_gib``.

        ``floor((allocatable - weights - reserve - other [- drafter]) / kv_block_gib)``, at least 0.

        Args:
            speculative: the drafter's weights are resident (a speculative policy runs).
            other_gib: further memory held, GiB (e.g. MEMTP heads).

        Returns:
            Blocks (>= 0).

        Source:
            docs/model.md section 2 (memory left after weights, KV and a reserve funds the heads;
            here: what is left after weights, reserve and heads funds KV).
        """
        free = self.gpu_allocatable_gib - self.weights_gib - self.reserve_gib - other_gib
        if speculative:
            free -= self.drafter_weights_gib
        return max(0, int(math.floor(free / self.kv_block_gib)))

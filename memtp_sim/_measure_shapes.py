"""Model shapes and timing helpers of :mod:`memtp_sim.measure` (no PyTorch here).

Shared by :mod:`memtp_sim.measure` (the command line, importable without torch) and
:mod:`memtp_sim._measure_torch` (the timed passes).

Source: model shapes from calibration/h200/SOURCES.md (the configs of the shared H200
measurements); context lengths from the model cards named in each shape's ``source``.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence

__all__ = ["Shape", "SHAPES", "percentile", "summarize", "time_eager", "shape_meta"]


@dataclass(frozen=True)
class Shape:
    """A decoder-only transformer's shape (what timing depends on; weights are random).

    Attributes:
        name: label written to the CSV's ``model`` column.
        hidden: model width H.
        layers: decoder layers.
        heads: query heads.
        kv_heads: key/value heads (grouped-query attention).
        head_dim: per-head width.
        ffn: MLP intermediate width (gated SiLU: gate, up, down).
        vocab: vocabulary (embedding and LM head rows).
        tied: LM head shares the embedding matrix.
        qk_norm: per-head RMSNorm of queries and keys (Qwen3 has it, Llama does not).
        max_model_len: the model's context length, tokens (for the profile's memory section).
        source: where the numbers come from.
    """

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    tied: bool
    max_model_len: int
    source: str
    qk_norm: bool = True

    def layer_params(self) -> int:
        """Parameters of one decoder layer: q, k, v, o projections, gated MLP, two norms (and
        Qwen3's q/k norms of ``head_dim`` each)."""
        attn = self.hidden * self.heads * self.head_dim * 2 + self.hidden * self.kv_heads * self.head_dim * 2
        return attn + 3 * self.hidden * self.ffn + 2 * self.hidden + (2 * self.head_dim if self.qk_norm else 0)

    def params(self) -> int:
        """All parameters: layers, embedding, LM head (unless tied), final norm."""
        emb = self.vocab * self.hidden
        return self.layers * self.layer_params() + emb * (1 if self.tied else 2) + self.hidden

    def kv_bytes_per_token(self, nbytes: int) -> int:
        """KV cache bytes per token: layers x KV heads x head dim x 2 (K and V) x bytes."""
        return self.layers * self.kv_heads * self.head_dim * 2 * nbytes


_H200 = "calibration/h200/SOURCES.md (shapes of the shared H200 measurements)"
SHAPES: dict[str, Shape] = {
    "llama31-8b": Shape("llama31-8b", 4096, 32, 32, 8, 128, 14336, 128256, False, 131072,
                        _H200 + "; Llama-3.1 context 131072", qk_norm=False),
    "qwen3-8b": Shape("qwen3-8b", 4096, 36, 32, 8, 128, 12288, 151936, False, 32768,
                      _H200 + "; Qwen3 model card: 32768 tokens natively"),
    "qwen3-32b": Shape("qwen3-32b", 5120, 64, 64, 8, 128, 25600, 151936, False, 32768,
                       _H200 + "; Qwen3 model card: 32768 tokens natively"),
    "qwen3-0.6b": Shape("qwen3-0.6b", 1024, 28, 16, 8, 128, 3072, 151936, True, 32768,
                        _H200 + "; tied embeddings (Qwen3-0.6B model card)"),
    "tiny": Shape("tiny", 64, 2, 4, 2, 16, 128, 256, False, 4096, "a toy shape for tests"),
}


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) of ``values`` by linear interpolation between order statistics.

    Pure Python on purpose: the measure script runs on GPU machines without numpy guarantees.

    Args:
        values: the sample, any order.
        q: the quantile, 0..1.

    Returns:
        The quantile, in the values' units.

    Raises:
        ValueError: ``values`` is empty.

    Source: the "linear" (type 7) definition, numpy's default.
    """
    xs = sorted(values)
    if not xs:
        raise ValueError("percentile of no values")
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(times_ms: Sequence[float]) -> dict[str, float]:
    """median / p10 / p90 of per-replay times, ms (4 decimals)."""
    return {"median_ms": round(statistics.median(times_ms), 4), "p10_ms": round(percentile(times_ms, 0.1), 4),
            "p90_ms": round(percentile(times_ms, 0.9), 4)}


def time_eager(fn: Callable[[], Any], reps: int, warmup: int, sync: Callable[[], None]) -> list[float]:
    """Per-call wall times (ms) of ``fn`` after ``warmup`` untimed calls (CPU fallback)."""
    for _ in range(warmup):
        fn()
    sync()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def shape_meta(shape: Shape, nbytes: int) -> dict[str, Any]:
    """The shape's facts for the ``.meta.json`` (parameters, weights and KV bytes, each sourced)."""
    params = shape.params()
    return {
        "shape": asdict(shape), "params": params,
        "weights_bytes": params * nbytes,
        "weights_bytes_source": f"{params:,} parameters computed from the {shape.name} shape x {nbytes} bytes",
        "kv_bytes_per_token": shape.kv_bytes_per_token(nbytes),
        "kv_bytes_per_token_source": f"{shape.layers} layers x {shape.kv_heads} KV heads x {shape.head_dim} head dim "
                                     f"x 2 (K and V) x {nbytes} bytes",
        "max_model_len": shape.max_model_len, "max_model_len_source": shape.source,
    }

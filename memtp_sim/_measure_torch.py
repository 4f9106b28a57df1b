"""The PyTorch half of :mod:`memtp_sim.measure`: random-weight layers of a shape, timed passes.

Imported only by ``memtp_sim.measure.main`` after it checked that torch is installed (this
module imports torch at the top). See :mod:`memtp_sim.measure` for the method and its source.
"""

from __future__ import annotations

import argparse
import platform
from typing import Any, Callable

import torch
import torch.nn.functional as F

from ._measure_shapes import Shape, shape_meta, summarize, time_eager

__all__ = ["run", "Model"]

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


class Layer:
    """One decoder layer's weights (random, scaled so activations stay finite) and its forward."""

    def __init__(self, s: Shape, dev: torch.device, dt: torch.dtype, gen: torch.Generator) -> None:
        def w(*shape: int) -> torch.Tensor:
            return (torch.randn(*shape, generator=gen, device="cpu") / math_sqrt(shape[-1])).to(dev, dt)

        self.s = s
        self.wq, self.wk = w(s.heads * s.head_dim, s.hidden), w(s.kv_heads * s.head_dim, s.hidden)
        self.wv, self.wo = w(s.kv_heads * s.head_dim, s.hidden), w(s.hidden, s.heads * s.head_dim)
        self.wg, self.wu, self.wd = w(s.ffn, s.hidden), w(s.ffn, s.hidden), w(s.hidden, s.ffn)
        self.n1 = torch.ones(s.hidden, device=dev, dtype=dt)
        self.n2 = torch.ones(s.hidden, device=dev, dtype=dt)

    def forward(self, x: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, ctx: int,
                mask: torch.Tensor | None) -> torch.Tensor:
        """x: [R, v, H]; caches [R, kv_heads, ctx + v, head_dim] (the new tokens written at ctx)."""
        s, (r, v, _) = self.s, x.shape
        h = _rms(x, self.n1)
        q = F.linear(h, self.wq).view(r, v, s.kv_heads, s.heads // s.kv_heads, s.head_dim)
        k_cache[:, :, ctx:ctx + v] = F.linear(h, self.wk).view(r, v, s.kv_heads, s.head_dim).transpose(1, 2)
        v_cache[:, :, ctx:ctx + v] = F.linear(h, self.wv).view(r, v, s.kv_heads, s.head_dim).transpose(1, 2)
        # grouped-query heads folded into the query axis: [R, kv_heads, groups * v, head_dim]
        q = q.permute(0, 2, 3, 1, 4).reshape(r, s.kv_heads, -1, s.head_dim)
        a = F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=mask)
        a = a.view(r, s.kv_heads, s.heads // s.kv_heads, v, s.head_dim).permute(0, 3, 1, 2, 4).reshape(r, v, -1)
        x = x + F.linear(a, self.wo)
        h = _rms(x, self.n2)
        return x + F.linear(F.silu(F.linear(h, self.wg)) * F.linear(h, self.wu), self.wd)


def math_sqrt(n: int) -> float:
    """``sqrt(n)`` as a float (init scale of a random weight matrix, 1/sqrt(fan_in))."""
    return float(n) ** 0.5


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm (torch.nn.functional.rms_norm exists only from torch 2.4; the extra allows 2.3)."""
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps).to(x.dtype) * w


class Model:
    """A shape's decoder stack, embedding and LM head (random weights) with per-layer KV caches."""

    def __init__(self, s: Shape, dev: torch.device, dt: torch.dtype, layers: int | None = None) -> None:
        gen = torch.Generator().manual_seed(0)
        self.s, self.dev, self.dt = s, dev, dt
        self.layers = [Layer(s, dev, dt, gen) for _ in range(layers or s.layers)]
        self.emb = (torch.randn(s.vocab, s.hidden, generator=gen) * 0.02).to(dev, dt)
        self.head = self.emb if s.tied else (torch.randn(s.vocab, s.hidden, generator=gen) / math_sqrt(s.hidden)).to(dev, dt)
        self.norm = torch.ones(s.hidden, device=dev, dtype=dt)
        self.proj = (torch.randn(s.hidden, 2 * s.hidden, generator=gen) / math_sqrt(2 * s.hidden)).to(dev, dt)

    def caches(self, r: int, total: int, n_layers: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Random K and V caches per layer, each shape (r, kv_heads, total, head_dim)."""
        shape = (r, self.s.kv_heads, total, self.s.head_dim)
        return [(torch.randn(shape, device=self.dev, dtype=self.dt), torch.randn(shape, device=self.dev, dtype=self.dt))
                for _ in range(n_layers)]

    def mask(self, v: int, ctx: int) -> torch.Tensor | None:
        """Causal mask of v new tokens over ctx cached + v new keys, query axis repeated per group."""
        if v == 1:
            return None
        groups = self.s.heads // self.s.kv_heads
        pos = torch.arange(v, device=self.dev).repeat(groups)  # query i is new token i % v
        keys = torch.arange(ctx + v, device=self.dev)
        return keys[None, :] <= (ctx + pos)[:, None]

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """LM-head logits of hidden states ``x`` (..., hidden) -> (..., vocab), after the final norm."""
        return F.linear(_rms(x, self.norm), self.head)


def _pass_fn(m: Model, draft: Model | None, kind: str, r: int, v: int, ctx: int) -> Callable[[], Any]:
    """A closure running one pass of ``kind`` for R x v tokens at context ctx (buffers preallocated)."""
    tokens = torch.randint(0, m.s.vocab, (r, v), device=m.dev)
    if kind == "draft_model":
        assert draft is not None
        dm, dc, dmask = draft, draft.caches(r, ctx + v, len(draft.layers)), draft.mask(v, ctx)

        def run_draft() -> Any:
            x = dm.emb[tokens]
            for layer, (kc, vc) in zip(dm.layers, dc):
                x = layer.forward(x, kc, vc, ctx, dmask)
            return torch.softmax(dm.logits(x[:, -1:]).float(), -1).max(-1)

        return run_draft
    if kind in ("draft_mtp", "draft_block"):  # one module: projection + one layer of the target's shape
        hidden = torch.randn(r, v, m.s.hidden, device=m.dev, dtype=m.dt)
        (kc, vc), mask, layer = m.caches(r, ctx + v, 1)[0], m.mask(v, ctx), m.layers[0]

        def run_module() -> Any:
            x = F.linear(torch.cat([m.emb[tokens], hidden], -1), m.proj)
            return torch.softmax(m.logits(layer.forward(x, kc, vc, ctx, mask)).float(), -1).max(-1)

        return run_module
    caches, mask = m.caches(r, ctx + v, len(m.layers)), m.mask(v, ctx)
    last_only = kind == "prefill"

    def run_target() -> Any:
        x = m.emb[tokens]
        for layer, (kc, vc) in zip(m.layers, caches):
            x = layer.forward(x, kc, vc, ctx, mask)
        return m.logits(x[:, -1:] if last_only else x).argmax(-1)

    return run_target


def _time_cuda_graph(fn: Callable[[], Any], reps: int, warmup: int) -> list[float]:
    """Capture ``fn`` in one CUDA graph (after warmup on a side stream) and time each replay with
    CUDA events, ms."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(max(1, warmup)):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end))
    del graph
    return out


def run(args: argparse.Namespace, plan: list[tuple[str, int, int, int]], shapes: dict[str, Shape],
        progress: Callable[[str], None]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Time every pass of ``plan``; return the CSV rows and the ``.meta.json`` mapping.

    Raises:
        RuntimeError: the device is unusable (no CUDA, out of memory...), from torch.
    """
    dev = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cuda = dev.type == "cuda"
    if not cuda:
        torch.set_num_threads(1)  # CPU runs are for tests: one thread times far more steadily
    dt = _DTYPES[args.dtype] if cuda else torch.float32
    nbytes = torch.finfo(dt).bits // 8
    shape = shapes[args.model_shape]
    target = Model(shape, dev, dt, args.layers)
    label = shape.name if not args.layers else f"{shape.name}-{len(target.layers)}l"
    needs_draft = any(k == "draft_model" for k, *_ in plan)
    draft = Model(shapes[args.draft_shape], dev, dt) if needs_draft else None
    rows = []
    with torch.inference_mode():
        for i, (kind, r, v, ctx) in enumerate(plan, start=1):
            fn = _pass_fn(target, draft, kind, r, v, ctx)
            times = (_time_cuda_graph(fn, args.reps, args.warmup) if cuda else
                     time_eager(fn, args.reps, args.warmup, lambda: None))
            model = args.draft_shape if kind == "draft_model" else label
            rows.append({"run": args.run, "model": model, "kind": kind, "requests": r, "tokens_per_request": v,
                         "batch_tokens": r * v, "context": ctx, "mode": "graph" if cuda else "eager",
                         "reps": args.reps, **summarize(times)})
            progress(f"[{i}/{len(plan)}] {kind} R={r} v={v} L={ctx}: {rows[-1]['median_ms']} ms")
            del fn
            if cuda:
                torch.cuda.empty_cache()
    return rows, _meta(args, shape, target, nbytes, dev, label)


def _meta(args: argparse.Namespace, shape: Shape, target: Model, nbytes: int, dev: torch.device,
          label: str) -> dict[str, Any]:
    built = Shape(**{**shape.__dict__, "layers": len(target.layers), "name": label})
    meta = shape_meta(built, nbytes)
    module = built.layer_params() + 2 * built.hidden * built.hidden
    meta.update({
        "model_label": label, "dtype": str(target.dt).replace("torch.", ""),
        "drafter_weights_gib": round(module * nbytes / 2**30, 4),
        "drafter_weights_gib_source": f"MTP / block module: one decoder layer + a 2H x H projection = {module:,} "
                                      f"parameters x {nbytes} bytes (LM head shared with the target)",
        "engine": "PyTorch SDPA over a contiguous KV cache, "
                  + ("CUDA graphs (memtp_sim.measure)" if dev.type == "cuda" else "eager on the CPU (memtp_sim.measure)"),
        "build": f"torch {torch.__version__}" + (f", CUDA {torch.version.cuda}" if torch.version.cuda else ""),
        "draft_shape": args.draft_shape,
    })
    if dev.type == "cuda":
        free, total = torch.cuda.mem_get_info(dev)
        name = torch.cuda.get_device_name(dev)
        meta.update({"chip": f"{name} ({total / 2**30:.1f} GiB)",
                     "gpu_allocatable_gib": round(0.9 * total / 2**30, 2),
                     "gpu_allocatable_gib_source": f"assumption: vLLM's default gpu_memory_utilization 0.9 x "
                                                   f"{total / 2**30:.2f} GiB total (torch.cuda.mem_get_info on {name})"})
    else:
        meta["chip"] = f"CPU ({platform.processor() or platform.machine()})"
    return meta

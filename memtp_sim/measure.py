"""Time a model shape's passes on this machine's GPU and write the CSV ``calibrate import`` reads.

``python -m memtp_sim.measure --model-shape llama31-8b --out my_costs.csv`` builds a decoder of
the shape with random weights (timing does not depend on the values), then times, for every
shape of the sweep:

* ``verify``: one target pass over R requests x v new tokens each at context L (decode when
  v = 1), logits at every new position plus argmax (a verify pass needs them all);
* ``prefill``: one request's prompt of P tokens, empty cache, logits of the last position;
* ``draft_mtp``: one MTP-module step for R tokens (embedding and hidden concatenated ->
  projection -> one decoder layer of the target's shape -> the shared LM head -> softmax max);
* ``draft_block``: one semi-autoregressive block pass drafting gamma tokens for R requests
  (R x gamma tokens through the same module), as DSpark's drafter does;
* ``draft_model``: one step of a separate small draft model (another shape, e.g. qwen3-0.6b).

Method: each pass is warmed up, then (on CUDA) captured in one CUDA graph, as serving engines do,
and replayed ``--reps`` times; each replay is timed with CUDA events and the CSV gets the median,
p10 and p90. Attention is PyTorch SDPA over a contiguous KV cache per layer (grouped-query heads
folded into the query axis, a causal mask over the new tokens); no paging, no RoPE. On the CPU
(for tests) passes run eagerly and are timed with ``time.perf_counter``.

Output: the ``gpu-costs`` CSV (``run, model, kind, requests, tokens_per_request, batch_tokens,
context, mode, median_ms, p10_ms, p90_ms, reps``) and ``<out stem>.meta.json`` (the shape,
parameter count, weight and KV bytes, GPU name and memory, versions), which
``python -m memtp_sim calibrate import my_costs.csv --format gpu-costs -o ...`` turns into a
profile without further input.

PyTorch is an optional extra: ``pip install -e ".[measure]"``. This module imports without it;
``main`` imports torch and says what to install when it is missing.

Source: the method of data/calibration/h200/SOURCES.md (the shared H200 measurements), written
anew here; model shapes from calibration/h200/SOURCES.md (Llama-3.1-8B, Qwen3-8B, Qwen3-32B,
Qwen3-0.6B configs).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from pathlib import Path
from typing import Any, Sequence

from ._io import atomic_write_text
from ._measure_shapes import SHAPES, Shape, percentile, shape_meta, summarize, time_eager

__all__ = ["Shape", "SHAPES", "main", "build_parser", "sweep_plan", "percentile", "summarize", "time_eager",
           "shape_meta", "write_csv"]

CSV_COLUMNS = ("run", "model", "kind", "requests", "tokens_per_request", "batch_tokens", "context", "mode",
               "median_ms", "p10_ms", "p90_ms", "reps")
INSTALL_HINT = 'PyTorch is not installed: pip install -e ".[measure]"'


def _ints(text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated whole numbers") from None
    if not vals or min(vals) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected whole numbers >= 0")
    return vals


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m memtp_sim.measure``."""
    p = argparse.ArgumentParser(prog="python -m memtp_sim.measure",
                                description="Time verify, prefill and drafter passes of a model shape on this GPU "
                                            "and write the gpu-costs CSV that `calibrate import` reads.")
    p.add_argument("--model-shape", default="llama31-8b", choices=sorted(SHAPES), help="target shape (default llama31-8b)")
    p.add_argument("--draft-shape", default="qwen3-0.6b", choices=sorted(SHAPES),
                   help="shape of the separate draft model (default qwen3-0.6b)")
    p.add_argument("--out", required=True, help="CSV to write, e.g. my_costs.csv (a .meta.json is written beside it)")
    p.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda when available)")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"], help="weights and KV (default bf16; "
                   "fp32 on cpu)")
    p.add_argument("--requests", type=_ints, default=[1, 2, 4, 8, 16, 32, 64, 128, 256], help="R values")
    p.add_argument("--tokens-per-request", type=_ints, default=[1, 2, 4, 8], help="v values (1 = decode)")
    p.add_argument("--contexts", type=_ints, default=[1024, 4096], help="context L values (tokens already cached)")
    p.add_argument("--prefill", type=_ints, default=[128, 256, 512, 1024, 2048, 4096], help="prompt lengths P")
    p.add_argument("--drafters", default="mtp,block,model", help="drafter kinds to time: mtp, block, model "
                   "(comma-separated, or none)")
    p.add_argument("--block-gamma", type=int, default=7, help="tokens a block drafter drafts per request (default 7)")
    p.add_argument("--max-batch-tokens", type=int, default=2048, help="skip verify shapes with R x v above this")
    p.add_argument("--layers", type=int, default=None, help="build only this many target layers (for a GPU too "
                   "small for the model; the CSV then describes the smaller model)")
    p.add_argument("--reps", type=int, default=15, help="timed replays per pass (default 15)")
    p.add_argument("--warmup", type=int, default=3, help="untimed runs before capture/timing (default 3)")
    p.add_argument("--run", default="1", help="value of the CSV's run column (default 1)")
    p.add_argument("--quick", action="store_true", help="a small sweep (R 1,4,16; v 1,4; one context; P 128,512)")
    return p


def sweep_plan(args: argparse.Namespace) -> list[tuple[str, int, int, int]]:
    """The passes to time as ``(kind, R, v, L)``: verify R x v at each context (B <= the cap),
    prefill (1, P, 0), and per drafter kind its step shapes at the first context.

    Args:
        args: parsed arguments of :func:`build_parser`.

    Returns:
        The list in the order it will be timed.

    Raises:
        SystemExit: ``--drafters`` names a kind other than mtp, block, model (a one-line error).
    """
    reqs, vs, ctxs, pre = args.requests, args.tokens_per_request, args.contexts, args.prefill
    if args.quick:
        reqs, vs, ctxs, pre = [r for r in (1, 4, 16)], [1, 4], ctxs[:1], [128, 512]
    plan = [("verify", r, v, L) for L in ctxs for v in vs for r in reqs if r >= 1 and v >= 1
            and r * v <= args.max_batch_tokens]
    plan += [("prefill", 1, p, 0) for p in pre if p >= 1]
    kinds = [k.strip() for k in args.drafters.split(",") if k.strip() and k.strip() != "none"]
    for k in kinds:
        if k not in ("mtp", "block", "model"):
            raise SystemExit(f"error: --drafters {args.drafters!r}: kinds are mtp, block, model")
        L = ctxs[0] if ctxs else 0
        v = args.block_gamma if k == "block" else 1
        plan += [(f"draft_{k}", r, v, L) for r in reqs if r >= 1 and r * v <= args.max_batch_tokens]
    return plan


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: parse, import torch (or say what to install), time the sweep, write the files.

    Returns:
        0 on success, 2 when PyTorch is missing or the device is unusable.
    """
    args = build_parser().parse_args(argv)
    try:
        import torch  # noqa: F401  -- the optional extra; this module must import without it
    except ImportError:
        print(f"error: {INSTALL_HINT}", file=sys.stderr)
        return 2
    from . import _measure_torch  # function-level: imports torch at module level, so only after the check above

    plan = sweep_plan(args)
    try:
        rows, meta = _measure_torch.run(args, plan, SHAPES, progress=lambda msg: print(msg, file=sys.stderr))
    except RuntimeError as e:  # device errors (CUDA missing, out of memory) are one line for the user
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    out = Path(args.out)
    write_csv(out, rows)
    side = out.with_name(out.stem + ".meta.json")
    atomic_write_text(side, json.dumps(meta, indent=2) + "\n")
    print(f"wrote {out} ({len(rows)} passes)")
    print(f"wrote {side}")
    print(f"next: python -m memtp_sim calibrate import {out} --format gpu-costs -o calibration/<chip>/<name>.yaml")
    return 0


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    """Write the gpu-costs CSV (columns :data:`CSV_COLUMNS`)."""
    buf = io.StringIO(newline="")
    w = csv.DictWriter(buf, fieldnames=list(CSV_COLUMNS))
    w.writeheader()
    for r in rows:
        w.writerow({k: r[k] for k in CSV_COLUMNS})
    atomic_write_text(path, buf.getvalue())  # a measurement run is long: never a half-written table


if __name__ == "__main__":
    raise SystemExit(main())

"""Importers: measurements in the forms people publish -> the memtp cost table (hardware.tables).

Each importer reads one format and returns a :class:`pandas.DataFrame` with the columns of
:data:`memtp_sim.hardware.tables.COST_COLUMNS`, plus the source's own columns (so ``--select``
can filter on them: a llama-bench ``backends`` or ``n_ubatch``, a collection's
``llama_cpp_build``). Facts about the file that are not per-pass (weights bytes, build, chip)
ride in ``df.attrs["meta"]``; rows the importer could not use are counted in
``df.attrs["notes"]``. :func:`import_measurements` dispatches by format name, and
:func:`write_cost_table` writes the cost-table columns only.

Formats (docs/calibration.md has a worked example of each):

===================== ===========================================================================
``table``             CSV ``batch_tokens,pass_ms[,context_tokens][,num_requests]`` or a YAML
                      mapping ``{B: ms}``: one pass per row (one request of B tokens unless
                      ``num_requests`` says otherwise)
``llama-bench``       ``llama-bench -o json|jsonl|csv|md`` output, any build, ``-d`` depth sweeps
                      included; the lhl/strix-halo-testing ``results.jsonl`` wrapper (the
                      llama-bench object under ``bench_raw``) too
``batched-bench``     ``llama-batched-bench`` table (or its ``-oj`` JSONL): decode passes of B
                      sequences, one token each
``gpu-costs``         the per-pass GPU cost CSV of ``memtp_sim.measure`` and of the shared H200
                      data (verify, prefill and drafter kinds)
``sglang-sps``        SGLang's DSpark SPS cost table (``python -m sglang.benchmark.dspark_sps_profiler``
                      output, ``SpsCostTable`` JSON)
``measurements``      this project's measurement collection CSV (``calibration/gfx1151/measurements.csv``)
===================== ===========================================================================

Rules that turn a benchmark row into passes (one documented choice each):

* llama-bench ``pp`` rows are one request's prompt: ``ub = min(n_ubatch, n_batch)`` tokens per
  pass (llama.cpp caps the micro-batch at the batch), ``passes = ceil(n_prompt / ub)``. One pass:
  ``B = n_prompt`` at context ``n_depth``. Several: ``B = ub``, time per pass = total / passes, at
  the mean context the passes start from, ``n_depth + ub * (passes - 1) // 2``.
* llama-bench ``tg`` rows are ``n_gen`` one-token passes (``B = 1``) whose context grows from
  ``n_depth`` to ``n_depth + n_gen - 1``: time per pass = total / n_gen at the mean context
  ``n_depth + (n_gen - 1) // 2``. ``pg`` rows (prompt then generation in one number) are skipped.
* llama-batched-bench rows: ``TG`` decode passes of ``B`` sequences (R = B, v = 1), time per pass
  ``T_TG / TG``, at the mean context ``PP + (TG - 1) // 2``. The prompt phase (``T_PP``) is not
  imported: it runs ``B x PP`` tokens in batches whose split the table does not print.

``python -m memtp_sim calibrate import`` (:func:`cli_import`) writes the cost table next to the
profile YAML and a format-2 profile whose every number names its source or a stated assumption,
and whose curves and drafters read every pass it wrote (a llama-bench run's ``tg`` passes are the
B = 1 point of its one curve; a pass nothing reads is warned about, :attr:`ImportResult.unused`);
:func:`import_profile` is the same import as a library call, and :func:`inline_table_profile` imports a
Scenario's inline ``hardware: {table: {B: ms}, memory: {...}}`` the same way, into the disk cache.

Sources: llama-bench field names from ggml-org/llama.cpp ``tools/llama-bench/README.md`` (JSON /
CSV schema: ``n_prompt``, ``n_gen``, ``n_depth``, ``n_batch``, ``n_ubatch``, ``avg_ns``,
``stddev_ns``, ``avg_ts``, ``model_size``, ``model_n_params``, ``build_commit``,
``build_number``, ``backends``, ``gpu_info``); llama-batched-bench columns from
``tools/batched-bench/batched-bench.cpp`` (``PP, TG, B, N_KV, T_PP s, S_PP t/s, T_TG s, S_TG t/s,
T s, S t/s``; JSONL keys ``pp, tg, pl, n_kv, t_pp, speed_pp, t_tg, speed_tg``); the SGLang SPS
table from sgl-project/sglang ``python/sglang/srt/speculative/dspark_components/dspark_sps.py``
(``SpsCostTable``: ``sample_batch_tokens``, ``sample_steps_per_sec``, ``max_batch_tokens``) and
``python/sglang/benchmark/dspark_sps_profiler.py`` (``batch_tokens = num_running_reqs *
verify_num_draft_tokens``, static verify mode).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import numpy as np
import pandas as pd
import yaml

from .._io import atomic_write_bytes, atomic_write_text, cache_dir, load_yaml, not_a_file, yaml_error_text
from .._version import __version__
from ..errors import CalibrationError
from .memory import GIB
from . import profile as _profile
from .profile import check_curve, load_profile
from .tables import COST_COLUMNS

__all__ = ["FORMATS", "import_measurements", "write_cost_table", "from_gpu_costs_csv", "from_table",
           "from_llama_bench", "from_batched_bench", "from_sglang_sps", "from_measurements_csv",
           "select", "cli_import", "import_profile", "ImportResult", "inline_table_profile", "MEMORY_FIELDS",
           "ASSUMED_DRAFTER_FRACTION"]

#: Memory figures a profile needs, with what each means (the ``--memory FIELD=VALUE`` names).
MEMORY_FIELDS = {
    "gpu_allocatable_gib": "memory the GPU may allocate, GiB",
    "weights_bytes": "target weights, bytes",
    "kv_bytes_per_token": "KV cache bytes per token: layers x KV heads x head dim x 2 (K, V) x bytes per element",
    "max_model_len": "longest context the model accepts, tokens",
    "reserve_gib": "activations, logits, graphs and allocator slack, GiB",
    "kv_block_tokens": "tokens per paged-KV block",
    "drafter_weights_gib": "weights of the measured drafter, GiB",
}
_REQUIRED_MEMORY = ("gpu_allocatable_gib", "weights_bytes", "kv_bytes_per_token", "max_model_len")
#: Stated defaults for the figures no measurement file gives and that are assumptions anyway.
_MEMORY_DEFAULTS = {
    "reserve_gib": (2.0, "assumption (calibrate import default): activations, logits, graphs and allocator "
                         "slack; set memory.reserve_gib to your engine's figure"),
    "kv_block_tokens": (16, "vLLM's default block size (16 tokens per block)"),
}
#: Without measured drafter passes, the drafter is costed as this fraction of the target's own measured
#: pass over the same tokens (and holds this fraction of its weights): a 5-layer DSpark drafter on a
#: 32-layer target is 5/32 = 0.16 of its layers (DSpark paper, Cheng et al. 2026: 5-layer backbone).
ASSUMED_DRAFTER_FRACTION = 0.15

_NUM_RE = re.compile(r"^\s*([-+]?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)")


# --------------------------------------------------------------------------------------- helpers
def _num(value: Any, path: Path, row: Any, column: str, *, integer: bool = False, minimum: float = 0.0,
         strict: bool = True) -> float:
    """One numeric cell of a source file; anything else is one error line naming file, row, column."""
    try:
        v = float(value)
        ok = math.isfinite(v) and (v > minimum if strict else v >= minimum)
        if integer and ok:
            ok = v == int(v)
    except (TypeError, ValueError):
        ok = False
    if not ok:
        what = "a whole number" if integer else "a number"
        raise CalibrationError(f"{path}: row {row}, column {column}: {value!r} is not {what} "
                               f"{'>' if strict else '>='} {minimum:g}")
    return int(v) if integer else v


def _row(kind: str, model: str, b: int, r: int, v: int, ctx: int, ms: float, source: str,
         p10: Any = "", p90: Any = "", **native: Any) -> dict[str, Any]:
    if not (math.isfinite(ms) and ms > 0):  # a time derived from valid cells can still overflow (1e-320 t/s)
        raise CalibrationError(f"{source}: the pass time it gives, {ms!r} ms, is not a finite number > 0")
    return {"kind": kind, "model": model, "batch_tokens": int(b), "num_requests": int(r),
            "tokens_per_request": int(v), "context_tokens": int(ctx), "pass_ms": float(ms),
            "p10_ms": p10, "p90_ms": p90, "source": source, **native}


def _frame(rows: list[dict], meta: Mapping[str, Any] | None = None, notes: Iterable[str] = ()) -> pd.DataFrame:
    extra = [c for r in rows for c in r if c not in COST_COLUMNS]
    cols = list(COST_COLUMNS) + list(dict.fromkeys(extra))
    df = pd.DataFrame(rows, columns=cols)
    df.attrs["meta"] = dict(meta or {})
    df.attrs["notes"] = list(notes)
    return df


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise CalibrationError(f"{path}: not a UTF-8 text file") from None


def _csv_rows(path: Path, need: Iterable[str], fmt: str) -> list[dict[str, str]]:
    """Rows of a CSV (each with ``_row``, its line in the file); a missing column is one error line."""
    text = _read_text(path)
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in need if c not in (reader.fieldnames or [])]
    if missing:
        raise CalibrationError(f"{path}: row 1, column {missing[0]}: missing (format {fmt} needs "
                               f"{', '.join(need)}; found {', '.join(reader.fieldnames or []) or 'no header'})")
    rows = []
    for i, r in enumerate(reader, start=2):
        if None in r or any(v is None for v in r.values()):
            raise CalibrationError(f"{path}: row {i}, column {list(r)[-1] if r else '?'}: the row has "
                                   f"{len([v for v in r.values() if v is not None])} cells, the header "
                                   f"{len(reader.fieldnames or [])}")
        r["_row"] = str(i)
        rows.append(r)
    return rows


# ------------------------------------------------------------------------------------ gpu-costs
def from_gpu_costs_csv(path: Path) -> pd.DataFrame:
    """The per-pass GPU cost CSV of ``measure_gpu_costs.py`` and of :mod:`memtp_sim.measure`.

    Columns: run, model, kind, requests, tokens_per_request, batch_tokens, context, mode,
    median_ms, p10_ms, p90_ms, reps. Kinds ``verify``, ``prefill``, ``draft_mtp``,
    ``draft_block``, ``draft_model`` map one to one; a prefill row is one request whose prompt is
    the pass (B = P, v = P, context 0). A sidecar ``<file stem>.meta.json`` (written by
    :mod:`memtp_sim.measure`) supplies the model shape and GPU for the profile's memory section.

    Raises:
        CalibrationError: a missing column, an unknown kind, or a bad cell (file, row, column).

    Source: data/calibration/h200/SOURCES.md (columns and kinds of the shared H200 CSV).
    """
    need = ("model", "kind", "requests", "tokens_per_request", "batch_tokens", "context", "median_ms")
    kinds = ("verify", "decode", "prefill", "draft_block", "draft_mtp", "draft_model", "draft_per_sequence")
    out = []
    for r in _csv_rows(path, need, "gpu-costs"):
        i = r["_row"]
        if r["kind"] not in kinds:
            raise CalibrationError(f"{path}: row {i}, column kind: {r['kind']!r}; allowed: {', '.join(kinds)}")
        req = _num(r["requests"], path, i, "requests", integer=True)
        v = _num(r["tokens_per_request"], path, i, "tokens_per_request", integer=True)
        b = _num(r["batch_tokens"], path, i, "batch_tokens", integer=True)
        if b != req * v:
            raise CalibrationError(f"{path}: row {i}, column batch_tokens: {b} is not requests x tokens_per_request")
        ctx = _num(r["context"], path, i, "context", integer=True, strict=False)
        ms = _num(r["median_ms"], path, i, "median_ms")
        spread = [r.get(c, "") for c in ("p10_ms", "p90_ms")]
        for c, val in zip(("p10_ms", "p90_ms"), spread):
            if val not in ("", None):
                _num(val, path, i, c)
        src = f"{path.name} row {i} (run {r.get('run', '?')}, {r.get('mode', '')}, {r.get('reps', '?')} reps)"
        out.append(_row(r["kind"], r["model"], b, req, v, ctx, ms, src, spread[0] or "", spread[1] or "",
                        run=r.get("run", ""), mode=r.get("mode", "")))
    meta = _sidecar_meta(path)
    meta.setdefault("format_note", "measured with CUDA-graph replays (host work excluded)")
    return _frame(out, meta)


def _sidecar_meta(path: Path) -> dict[str, Any]:
    """``<stem>.meta.json`` next to a gpu-costs CSV (memtp_sim.measure writes it), or {}."""
    side = path.with_name(path.stem + ".meta.json")
    if not side.is_file():
        return {}
    try:
        doc = json.loads(_read_text(side))
    except json.JSONDecodeError as e:
        raise CalibrationError(f"{side}: row {e.lineno}, column {e.colno}: not valid JSON ({e.msg})") from None
    if not isinstance(doc, dict):
        raise CalibrationError(f"{side}: expected a JSON object")
    doc["meta_file"] = side.name
    return doc


# ---------------------------------------------------------------------------------------- table
def from_table(path: Path) -> pd.DataFrame:
    """A plain table of pass times: CSV ``batch_tokens,pass_ms[,context_tokens][,num_requests]``
    or a YAML mapping ``{B: ms}`` (optionally ``{pass_ms: {B: ms}, context_tokens: L}``).

    Each row is one measured pass of B tokens: one request of B tokens (``num_requests`` R splits
    it into R requests of B / R tokens) at ``context_tokens`` (default 0) tokens of context.

    Raises:
        CalibrationError: a missing column, a bad cell, a B that R does not divide (file, row,
            column; for YAML the key).
    """
    if path.suffix in (".yaml", ".yml"):
        return _table_from_yaml(path)
    out = []
    seen: dict[tuple[int, int, int], tuple[Any, float]] = {}
    for r in _csv_rows(path, ("batch_tokens", "pass_ms"), "table"):
        i = r["_row"]
        b = _num(r["batch_tokens"], path, i, "batch_tokens", integer=True)
        ms = _num(r["pass_ms"], path, i, "pass_ms")
        ctx = _num(r.get("context_tokens") or 0, path, i, "context_tokens", integer=True, strict=False)
        req = _num(r.get("num_requests") or 1, path, i, "num_requests", integer=True)
        if b % req:
            raise CalibrationError(f"{path}: row {i}, column num_requests: {req} does not divide batch_tokens {b}")
        first = seen.setdefault((b, req, ctx), (i, ms))
        if first[1] != ms:  # a hand table states each pass once; two values are a typo, not a mean
            raise CalibrationError(f"{path}: rows {first[0]} and {i} both give batch_tokens {b} (num_requests {req}, "
                                   f"context_tokens {ctx}): {first[1]:g} and {ms:g} ms; give each pass once")
        out.append(_row("verify", path.stem, b, req, b // req, ctx, ms, f"{path.name} row {i}"))
    return _frame(out, {"format_note": "a hand-made table of pass times"})


def _table_from_yaml(path: Path) -> pd.DataFrame:
    try:
        doc = load_yaml(_read_text(path))
    except yaml.YAMLError as e:
        raise CalibrationError(f"{path}: {yaml_error_text(e)}") from None
    ctx = 0
    if isinstance(doc, dict) and "pass_ms" in doc:
        ctx = _num(doc.get("context_tokens", 0), path, "context_tokens", "context_tokens", integer=True, strict=False)
        doc = doc["pass_ms"]
    if not isinstance(doc, dict) or not doc:
        raise CalibrationError(f"{path}: expected a mapping {{batch_tokens: pass_ms}}")
    out = []
    for k, v in doc.items():
        b = _num(k, path, f"key {k}", "batch_tokens", integer=True)
        ms = _num(v, path, f"key {k}", "pass_ms")
        out.append(_row("verify", path.stem, b, 1, b, ctx, ms, f"{path.name} key {k}"))
    return _frame(out, {"format_note": "a hand-made table of pass times"})


# ---------------------------------------------------------------------------------- llama-bench
_LB_NATIVE = ("build_commit", "build_number", "backends", "gpu_info", "cpu_info", "model_filename", "model_type",
              "model_size", "model_n_params", "n_batch", "n_ubatch", "flash_attn", "type_k", "type_v",
              "n_gpu_layers", "n_threads", "test_time", "n_prompt", "n_gen", "n_depth")


def from_llama_bench(path: Path) -> pd.DataFrame:
    """``llama-bench`` output in any of its forms (detected from the content): JSON array, JSONL
    (also lines wrapping the object under ``bench_raw``, as lhl/strix-halo-testing records them;
    a ``null`` ``bench_raw`` is a failed run and is skipped), CSV, or the markdown table.

    Rows become passes by the rules of the module docstring. ``--select`` can filter on every
    llama-bench field (``backends``, ``n_ubatch``, ``flash_attn``, ``build_commit``...) and on
    the wrapper's fields.

    Raises:
        CalibrationError: an unreadable file or a bad field (file, row, column).

    Source: llama.cpp tools/llama-bench/README.md (output formats and fields).
    """
    text = _read_text(path)
    head = text.lstrip()[:1]
    if head == "[":
        records = _lb_json(path, text)
    elif head == "{":
        records = _lb_jsonl(path, text)
    elif head == "|" or "\n|" in text[:2000]:
        return _lb_markdown(path, text)
    else:
        records = [(r["_row"], {k: v for k, v in r.items() if k != "_row"}, {})
                   for r in _csv_rows(path, ("n_prompt", "n_gen", "avg_ns"), "llama-bench (csv)")]
    rows, notes = [], []
    for where, rec, wrapper in records:
        row = _lb_record(path, where, rec, wrapper, notes)
        if row is not None:
            rows.append(row)
    return _frame(rows, _lb_meta(rows, path), notes)


def _lb_json(path: Path, text: str) -> list[tuple[Any, dict, dict]]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise CalibrationError(f"{path}: row {e.lineno}, column {e.colno}: not valid JSON ({e.msg})") from None
    if not isinstance(doc, list) or not all(isinstance(d, dict) for d in doc):
        raise CalibrationError(f"{path}: row 1, column 1: expected a JSON array of llama-bench objects")
    return [(f"{i + 1} (array entry)", d, {}) for i, d in enumerate(doc)]


def _lb_jsonl(path: Path, text: str) -> list[tuple[Any, dict, dict]]:
    out = []
    for i, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError as e:
            raise CalibrationError(f"{path}: row {i}, column {e.colno}: not valid JSON ({e.msg})") from None
        if not isinstance(d, dict):
            raise CalibrationError(f"{path}: row {i}, column 1: expected one JSON object per line")
        if "bench_raw" in d:  # lhl/strix-halo-testing wrapper: the llama-bench object is bench_raw
            wrapper = {k: v for k, v in d.items() if k != "bench_raw" and not isinstance(v, (dict, list))}
            out.append((i, d["bench_raw"], wrapper))
        else:
            out.append((i, d, {}))
    return out


def _lb_record(path: Path, where: Any, rec: Any, wrapper: dict, notes: list[str]) -> dict | None:
    """One llama-bench result -> one cost-table row (None: a failed or mixed pp+tg run, noted)."""
    if rec is None:
        notes.append(f"row {where}: failed run (no result), skipped")
        return None
    for col in ("n_prompt", "n_gen"):
        if col not in rec:
            raise CalibrationError(f"{path}: row {where}, column {col}: missing")
    n_prompt = _num(rec["n_prompt"], path, where, "n_prompt", integer=True, strict=False)
    n_gen = _num(rec["n_gen"], path, where, "n_gen", integer=True, strict=False)
    depth = _num(rec.get("n_depth", 0), path, where, "n_depth", integer=True, strict=False)
    if "avg_ns" in rec:
        total_ms = _num(rec["avg_ns"], path, where, "avg_ns") / 1e6
    elif "avg_ts" in rec:
        total_ms = (n_prompt + n_gen) / _num(rec["avg_ts"], path, where, "avg_ts") * 1e3
    else:
        raise CalibrationError(f"{path}: row {where}, column avg_ns: missing (and no avg_ts)")
    if (n_prompt > 0) == (n_gen > 0):
        notes.append(f"row {where}: pp{n_prompt}+tg{n_gen} mixes prompt and generation in one number, skipped")
        return None
    n_batch = _num(rec.get("n_batch", 2048), path, where, "n_batch", integer=True)
    n_ubatch = _num(rec.get("n_ubatch", 512), path, where, "n_ubatch", integer=True)
    model = _lb_model(rec)
    native = {k: rec.get(k, "") for k in _LB_NATIVE}
    native.update({f"run_{k}": v for k, v in wrapper.items()})
    b, req, v, ctx, ms, src = _lb_pass(n_prompt, n_gen, depth, min(n_batch, n_ubatch), total_ms)
    stddev = rec.get("stddev_ns")
    spread = ("", "")
    if stddev not in (None, "") and n_prompt > 0 and _lb_passes(n_prompt, min(n_batch, n_ubatch)) == 1:
        sd = _num(stddev, path, where, "stddev_ns", strict=False) / 1e6
        spread = (round(max(ms - 1.2816 * sd, 1e-6), 6), round(ms + 1.2816 * sd, 6))  # normal p10 / p90
    kind = "verify" if n_prompt > 0 else "decode"
    return _row(kind, model, b, req, v, ctx, ms, f"{path.name} row {where} ({src})", *spread, **native)


def _lb_passes(n_prompt: int, ub: int) -> int:
    return -(-n_prompt // ub)


def _lb_pass(n_prompt: int, n_gen: int, depth: int, ub: int, total_ms: float) -> tuple:
    """(B, R, v, context, ms per pass, how) of a pp or tg result, by the module docstring's rules."""
    if n_gen > 0:
        return 1, 1, 1, depth + (n_gen - 1) // 2, total_ms / n_gen, f"tg{n_gen}@d{depth}: mean of {n_gen} one-token passes"
    passes = _lb_passes(n_prompt, ub)
    if passes == 1:
        return n_prompt, 1, n_prompt, depth, total_ms, f"pp{n_prompt}@d{depth}: one pass"
    short = f"; last pass {n_prompt % ub} tokens" if n_prompt % ub else ""
    return (ub, 1, ub, depth + ub * (passes - 1) // 2, total_ms / passes,
            f"pp{n_prompt}@d{depth}: {passes} passes of ub={ub}{short}")


def _lb_model(rec: Mapping[str, Any]) -> str:
    name = str(rec.get("model_filename") or "").replace("\\", "/").rsplit("/", 1)[-1]
    name = re.sub(r"(-\d{5}-of-\d{5})?\.gguf$", "", name)
    return name or str(rec.get("model_type") or rec.get("model") or "model")


def _lb_meta(rows: list[dict], path: Path) -> dict[str, Any]:
    """File-level facts of llama-bench rows (only where every row agrees)."""
    def one(col: str) -> Any:
        vals = {str(r.get(col, "")) for r in rows} - {""}
        return vals.pop() if len(vals) == 1 else None

    meta: dict[str, Any] = {"format_note": "llama-bench times whole llama_decode calls (host work included)"}
    size = one("model_size")
    if size is not None:
        meta["weights_bytes"] = int(float(size))
        meta["weights_bytes_source"] = f"llama-bench model_size ({path.name})"
    if one("model_n_params") is not None:
        meta["params"] = int(float(one("model_n_params")))
    commit, number = one("build_commit"), one("build_number")
    if commit:
        meta["build"] = f"llama.cpp {commit}" + (f" ({number})" if number else "")
    if one("backends"):
        meta["engine"] = f"llama.cpp {one('backends')} (llama-bench)"
    chip = one("gpu_info") or one("cpu_info")
    if chip:
        meta["chip"] = chip
    return meta


def _lb_markdown(path: Path, text: str) -> pd.DataFrame:
    """The markdown table llama-bench prints by default (``-o md``); ``build: <commit> (<n>)``
    below it. Columns other than ``test`` and ``t/s`` are kept for ``--select``; ``n_batch`` /
    ``n_ubatch`` default to llama-bench's 2048 / 512 when the table omits them (it prints only
    the fields that differ from the defaults)."""
    lines = [(i, ln) for i, ln in enumerate(text.splitlines(), start=1) if ln.strip().startswith("|")]
    if len(lines) < 2:
        raise CalibrationError(f"{path}: row 1, column 1: no markdown table found")
    header = [c.strip() for c in lines[0][1].strip().strip("|").split("|")]
    for col in ("test", "t/s"):
        if col not in header:
            raise CalibrationError(f"{path}: row {lines[0][0]}, column {col}: missing from the table header")
    build = re.search(r"build:\s*([0-9a-f]+)\s*\((\d+)\)", text)
    rows, notes = [], []
    for i, ln in lines[1:]:
        cells = [c.strip() for c in ln.strip().strip("|").split("|")]
        if set("".join(cells)) <= set("-: "):
            continue  # the |---|---| rule
        if len(cells) != len(header):
            raise CalibrationError(f"{path}: row {i}, column {header[-1]}: {len(cells)} cells, the header has {len(header)}")
        rec = dict(zip(header, cells))
        row = _lb_md_row(path, i, rec, notes)
        if row is not None:
            rows.append(row)
    meta = {"format_note": "llama-bench times whole llama_decode calls (host work included)"}
    if build:
        meta["build"] = f"llama.cpp {build.group(1)} ({build.group(2)})"
    backends = {r.get("backend") for r in rows} - {None, ""}
    if len(backends) == 1:
        meta["engine"] = f"llama.cpp {backends.pop()} (llama-bench)"
    return _frame(rows, meta, notes)


def _lb_md_row(path: Path, i: int, rec: dict[str, str], notes: list[str]) -> dict | None:
    test = rec["test"].replace(" ", "")
    m = re.fullmatch(r"(pp|tg)(\d+)(?:@d(\d+))?", test)
    if not m:
        notes.append(f"row {i}: test {rec['test']!r} is not ppN or tgN (pg rows mix both), skipped")
        return None
    n = int(m.group(2))
    depth = int(m.group(3) or 0)
    ts_m = _NUM_RE.match(rec["t/s"])
    ts = _num(ts_m.group(1) if ts_m else rec["t/s"], path, i, "t/s")
    n_batch = _num(rec.get("n_batch", 2048), path, i, "n_batch", integer=True)
    n_ubatch = _num(rec.get("n_ubatch", 512), path, i, "n_ubatch", integer=True)
    n_prompt, n_gen = (n, 0) if m.group(1) == "pp" else (0, n)
    b, req, v, ctx, ms, src = _lb_pass(n_prompt, n_gen, depth, min(n_batch, n_ubatch), n / ts * 1e3)
    model = rec.get("model", path.stem)
    native = {("model_type" if k == "model" else k): v for k, v in rec.items() if k != "t/s"}
    return _row("verify" if n_prompt else "decode", model, b, req, v, ctx, ms, f"{path.name} row {i} ({src})",
                **native)


# ---------------------------------------------------------------------------- llama-batched-bench
_BB_HEAD = ("PP", "TG", "B", "N_KV", "T_PP s", "S_PP t/s", "T_TG s", "S_TG t/s")


def from_batched_bench(path: Path) -> pd.DataFrame:
    """``llama-batched-bench`` output: its markdown table (``|PP | TG | B | N_KV | T_PP s | S_PP t/s
    | T_TG s | S_TG t/s | T s | S t/s |``, lines around it ignored) or its JSONL (``-oj``: keys
    ``pp, tg, pl, n_kv, t_pp, t_tg``...). Each row gives ``TG`` decode passes of ``B`` sequences
    (R = B, v = 1) by the module docstring's rule; rows with ``TG = 0`` are skipped.

    Raises:
        CalibrationError: no table, or a bad cell (file, row, column).

    Source: llama.cpp tools/batched-bench/batched-bench.cpp (the printed columns and keys).
    """
    text = _read_text(path)
    model = path.stem
    hdr = re.search(r"n_batch = (\d+), n_ubatch = (\d+), flash_attn = (-?\d+)", text)
    native_file = {"n_batch": hdr.group(1), "n_ubatch": hdr.group(2), "flash_attn": hdr.group(3)} if hdr else {}
    if text.lstrip().startswith("{"):
        recs = []
        for i, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    d = json.loads(line)
                except json.JSONDecodeError as e:
                    raise CalibrationError(f"{path}: row {i}, column {e.colno}: not valid JSON ({e.msg})") from None
                recs.append((i, {"PP": d.get("pp"), "TG": d.get("tg"), "B": d.get("pl"), "T_TG s": d.get("t_tg"),
                                 "S_TG t/s": d.get("speed_tg"), **{k: d.get(k) for k in ("n_batch", "n_ubatch",
                                                                                          "flash_attn")}}))
    else:
        recs = _bb_table(path, text)
    rows, notes = [], []
    for i, rec in recs:
        pp = _num(rec.get("PP"), path, i, "PP", integer=True, strict=False)
        tg = _num(rec.get("TG"), path, i, "TG", integer=True, strict=False)
        b = _num(rec.get("B"), path, i, "B", integer=True)
        if tg == 0:
            notes.append(f"row {i}: TG = 0 (prompt only), skipped")
            continue
        if rec.get("T_TG s") not in (None, ""):
            t_tg = _num(rec["T_TG s"], path, i, "T_TG s")
        else:
            t_tg = b * tg / _num(rec.get("S_TG t/s"), path, i, "S_TG t/s")
        ms = t_tg / tg * 1e3
        native = {**native_file, **{k: v for k, v in rec.items() if k not in _BB_HEAD}}
        rows.append(_row("decode", model, b, b, 1, pp + (tg - 1) // 2, ms,
                         f"{path.name} row {i} (PP {pp}, TG {tg}, B {b}: T_TG / TG)", **native))
    return _frame(rows, {"format_note": "llama-batched-bench times whole llama_decode calls (host work included)"},
                  notes)


def _bb_table(path: Path, text: str) -> list[tuple[int, dict]]:
    lines = [(i, ln) for i, ln in enumerate(text.splitlines(), start=1) if ln.strip().startswith("|")]
    if not lines:
        raise CalibrationError(f"{path}: row 1, column PP: no llama-batched-bench table found")
    header = [c.strip() for c in lines[0][1].strip().strip("|").split("|")]
    for col in ("PP", "TG", "B"):
        if col not in header:
            raise CalibrationError(f"{path}: row {lines[0][0]}, column {col}: missing from the table header")
    if "T_TG s" not in header and "S_TG t/s" not in header:
        raise CalibrationError(f"{path}: row {lines[0][0]}, column T_TG s: missing (and no S_TG t/s)")
    out = []
    for i, ln in lines[1:]:
        cells = [c.strip() for c in ln.strip().strip("|").split("|")]
        if set("".join(cells)) <= set("-: "):
            continue
        if len(cells) != len(header):
            raise CalibrationError(f"{path}: row {i}, column {header[-1]}: {len(cells)} cells, the header has {len(header)}")
        out.append((i, dict(zip(header, cells))))
    return out


# ----------------------------------------------------------------------------------- sglang-sps
def from_sglang_sps(path: Path) -> pd.DataFrame:
    """SGLang's DSpark SPS cost table (``SpsCostTable`` JSON: ``sample_batch_tokens``,
    ``sample_steps_per_sec``, ``max_batch_tokens``), as ``dspark_sps_profiler`` writes it.

    Each probe is one server-side DSpark step in static verify mode: ``B = R x (gamma + 1)``
    (``batch_tokens = num_running_reqs * verify_num_draft_tokens``), time ``1000 / SPS`` ms. The
    verify window ``gamma + 1`` comes from the profiler's manifest next to the table
    (``<table>.manifest.json``, key ``verify_num_draft_tokens`` anywhere in it) when present, else
    from the greatest common divisor of the probes' B (the profiler sweeps R = 1, 2, 4...). The
    step time is the whole step (drafting, verify, host work): a profile built from it states so.
    The additive table (``bias_seconds``...) is a fitted model, not measurements: refused.

    Raises:
        CalibrationError: not that JSON, an additive table, or a bad probe (file, row, column).

    Source: sgl-project/sglang dspark_sps.py and dspark_sps_profiler.py (module docstring).
    """
    text = _read_text(path)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise CalibrationError(f"{path}: row {e.lineno}, column {e.colno}: not valid JSON ({e.msg})") from None
    if isinstance(doc, dict) and "bias_seconds" in doc:
        raise CalibrationError(f"{path}: row 1, column bias_seconds: an SpsAdditiveCostTable is a fitted model, "
                               "not measured passes; import the static-mode SpsCostTable instead")
    for col in ("sample_batch_tokens", "sample_steps_per_sec"):
        if not isinstance(doc, dict) or not isinstance(doc.get(col), list):
            raise CalibrationError(f"{path}: row 1, column {col}: missing (an SGLang SpsCostTable has "
                                   "sample_batch_tokens, sample_steps_per_sec, max_batch_tokens)")
    bs, sps = doc["sample_batch_tokens"], doc["sample_steps_per_sec"]
    if len(bs) != len(sps):
        raise CalibrationError(f"{path}: row 1, column sample_steps_per_sec: {len(sps)} values for {len(bs)} "
                               "sample_batch_tokens")
    bs = [_num(b, path, f"probe {k + 1}", "sample_batch_tokens", integer=True) for k, b in enumerate(bs)]
    window, how = _sglang_window(path, bs)
    rows = []
    for k, (b, s) in enumerate(zip(bs, sps)):
        s = _num(s, path, f"probe {k + 1}", "sample_steps_per_sec")
        if b % window:
            raise CalibrationError(f"{path}: row probe {k + 1}, column sample_batch_tokens: {b} is not a multiple "
                                   f"of the verify window {window} ({how})")
        rows.append(_row("verify", path.stem, b, b // window, window, 0, 1000.0 / s,
                         f"{path.name} probe {k + 1} (SGLang DSpark static step, window {window}: {how})"))
    return _frame(rows, {"format_note": "SGLang server-side DSpark step (drafting, verify and host work in one "
                                        "number)", "whole_step": True})


def _sglang_window(path: Path, bs: list[int]) -> tuple[int, str]:
    man = path.with_name(path.name + ".manifest.json")
    if man.is_file():
        try:
            found = _find_key(json.loads(_read_text(man)), "verify_num_draft_tokens")
        except json.JSONDecodeError as e:
            raise CalibrationError(f"{man}: row {e.lineno}, column {e.colno}: not valid JSON ({e.msg})") from None
        if found is not None:
            return _num(found, man, 1, "verify_num_draft_tokens", integer=True), f"{man.name}"
    return int(np.gcd.reduce(np.array(bs, dtype=np.int64))), "gcd of the probes' B"


def _find_key(doc: Any, key: str) -> Any:
    if isinstance(doc, dict):
        if key in doc:
            return doc[key]
        doc = list(doc.values())
    if isinstance(doc, list):
        for v in doc:
            got = _find_key(v, key)
            if got is not None:
                return got
    return None


# --------------------------------------------------------------------------- measurements (collection)
def from_measurements_csv(path: Path) -> pd.DataFrame:
    """This project's measurement collection CSV (``calibration/gfx1151/measurements.csv``, the
    shared ``gfx1151_measurements.csv``): one row per published number, ``tokens_per_pass_B`` and
    ``derived_pass_ms`` already per pass (see that folder's SOURCES.md).

    ``measurement_kind`` decides the shape: single forward passes (llama-bench pp) are one request
    of B tokens at ``kv_depth``; multi-pass rows at the mean context their passes start from
    (``kv_depth + B * (n_passes - 1) // 2``); ``tgN`` rows one-token passes at
    ``kv_depth + (N - 1) // 2``; llama-batched-bench rows B sequences of one token at
    ``kv_depth``. Rows of an undocumented harness are skipped (noted). Every column of the
    collection stays available to ``--select``.

    Raises:
        CalibrationError: a missing column or a bad cell (file, row, column).
    """
    need = ("source_url_or_repo_path", "model", "test", "tokens_per_pass_B", "derived_pass_ms", "kv_depth",
            "n_passes", "measurement_kind")
    rows, notes = [], []
    for r in _csv_rows(path, need, "measurements"):
        i, kind_text = r["_row"], r["measurement_kind"]
        b = _num(r["tokens_per_pass_B"], path, i, "tokens_per_pass_B", integer=True)
        ms = _num(r["derived_pass_ms"], path, i, "derived_pass_ms")
        depth = _num(r["kv_depth"] or 0, path, i, "kv_depth", integer=True, strict=False)
        passes = _num(r["n_passes"] or 1, path, i, "n_passes", integer=True)
        native = {k: v for k, v in r.items() if k not in ("_row", "model")}
        src = f"{r['source_url_or_repo_path']} ({path.name} row {i}, {r['test']})"
        if "batched-bench" in kind_text:  # n_passes = TG one-token passes of B sequences
            rows.append(_row("decode", r["model"], b, b, 1, depth + (passes - 1) // 2, ms, src, **native))
        elif " tg" in kind_text or kind_text.startswith("decode"):  # n_passes = N of tgN
            rows.append(_row("decode", r["model"], 1, 1, 1, depth + (passes - 1) // 2, ms, src, **native))
        elif kind_text.startswith("llama-bench pp"):
            rows.append(_row("verify", r["model"], b, 1, b, depth + b * (passes - 1) // 2, ms, src, **native))
        else:
            notes.append(f"row {i}: measurement_kind {kind_text!r} has no documented pass shape, skipped")
    return _frame(rows, {"format_note": "numbers copied from public sources (SOURCES.md of the collection)"}, notes)


#: format name -> importer(path) -> cost-table frame
FORMATS: dict[str, Callable[[Path], pd.DataFrame]] = {
    "table": from_table,
    "llama-bench": from_llama_bench,
    "batched-bench": from_batched_bench,
    "gpu-costs": from_gpu_costs_csv,
    "sglang-sps": from_sglang_sps,
    "measurements": from_measurements_csv,
}


def import_measurements(path: str | Path, fmt: str) -> pd.DataFrame:
    """Read ``path`` in format ``fmt`` as a cost table (see :data:`FORMATS`).

    Returns:
        The cost-table columns plus the source's own columns; ``attrs["meta"]`` (file facts)
        and ``attrs["notes"]`` (rows skipped and why).

    Raises:
        CalibrationError: unknown format, missing file, no usable row, or a malformed file (one
            line: file, row, column where it applies).
    """
    p = Path(path)
    if fmt not in FORMATS:
        raise CalibrationError(f"--format {fmt!r}: unknown; allowed: {', '.join(sorted(FORMATS))}")
    why = not_a_file(p, "measurements file")
    if why is not None:
        raise CalibrationError(why)
    df = FORMATS[fmt](p)
    if df.empty:
        why = f" ({'; '.join(df.attrs.get('notes', [])[:3])})" if df.attrs.get("notes") else ""
        raise CalibrationError(f"{p}: no usable pass in this {fmt} file{why}")
    return df


def write_cost_table(df: pd.DataFrame, path: str | Path) -> None:
    """Write a cost table (atomically) in the column order of :data:`COST_COLUMNS`."""
    buf = io.StringIO()
    df[list(COST_COLUMNS)].to_csv(buf, index=False)
    atomic_write_text(Path(path), buf.getvalue())


def select(df: pd.DataFrame, pairs: Iterable[str], where: str) -> pd.DataFrame:
    """Keep the rows where every ``COLUMN=VALUE`` holds (numbers compare as numbers).

    Raises:
        CalibrationError: a pair without ``=``, a column the file lacks, or nothing left.
    """
    out = df
    for pair in pairs:
        col, sep, want = pair.partition("=")
        col = col.strip()
        if not sep or not col:
            raise CalibrationError(f"--select {pair!r}: expected COLUMN=VALUE")
        if col not in df.columns or col.startswith("_"):
            cols = [c for c in df.columns if not c.startswith("_")]
            raise CalibrationError(f"--select {pair!r}: {where} has no column {col!r}; columns: {', '.join(cols)}")
        text = out[col].astype(str).str.strip()
        hit = text == want.strip()
        try:
            hit |= pd.to_numeric(out[col], errors="coerce").to_numpy() == float(want)
        except ValueError:
            pass
        if want.strip().lower() in ("true", "false"):
            hit |= text.str.lower() == want.strip().lower()
        out = out[np.asarray(hit)]
    if out.empty:
        raise CalibrationError(f"--select {' '.join(pairs)}: no row of {where} matches")
    out.attrs = df.attrs
    return out


# =========================================================================== profile from a table
# ================================================================================ calibrate import
@dataclass(frozen=True)
class ImportResult:
    """What :func:`import_profile` wrote.

    Attributes:
        costs: the cost table CSV.
        profile: the profile YAML.
        name: the profile's name.
        num_passes: measured passes in the cost table.
        batch_range: smallest and largest measured B of the target's batched passes (None: only
            prefill passes).
        assumed: the assumptions the profile states, one line each.
        notes: rows of the measurement file that were skipped, and why.
        unused: sources of the passes written to the cost table that no curve or drafter of the
            profile reads (each as its ``source`` cell: file and row of the measurement file).
    """

    costs: Path
    profile: Path
    name: str
    num_passes: int
    batch_range: tuple[int, int] | None
    assumed: tuple[str, ...]
    notes: tuple[str, ...]
    unused: tuple[str, ...] = ()


def import_profile(src: str | Path, fmt: str, out: str | Path, *, select: Iterable[str] = (),
                   name: str | None = None, memory: Iterable[str] | None = None) -> ImportResult:
    """Build a format-2 hardware profile from a measurement file (``calibrate import``'s work).

    Writes ``<OUT stem>.costs.csv`` (the memtp cost table of the selected passes) next to
    ``OUT.yaml`` (a format-2 profile selecting them) and checks that the profile loads. A
    re-import over an existing ``OUT.yaml`` keeps its ``memory``, ``drafters``,
    ``default_drafter``, ``overheads`` and ``caveats`` sections (edit them once, refresh the
    measurements any time); every other section is rewritten.

    Memory figures a measurement file cannot give (GPU-allocatable memory, KV bytes per token,
    context length; weights where the file has no size) come from ``memory`` (``FIELD=VALUE``
    strings; ``kv_shape=LAYERS,KV_HEADS,HEAD_DIM[,BYTES]`` computes ``kv_bytes_per_token``), the
    existing ``OUT.yaml``, or the measurement file (llama-bench's ``model_size``,
    memtp_sim.measure's ``.meta.json``).

    Args:
        src: the measurement file.
        fmt: its format (see :func:`import_measurements`).
        out: the profile YAML to write (``.yaml`` / ``.yml``).
        select: ``COL=VAL`` filters on the target's passes.
        name: the profile's name (default: the existing YAML's, else ``out``'s stem).
        memory: ``FIELD=VALUE`` memory figures; None when the caller has no way to give them
            (the refusal then does not suggest ``--memory``).

    Returns:
        An :class:`ImportResult`.

    Raises:
        CalibrationError: a malformed measurement file, a selection that leaves nothing or
            several target models, a missing memory figure, or a profile that does not load.
    """
    return _import(src, fmt, out, select=select, name=name, memory=memory, inline=False)


def _import(src: str | Path, fmt: str, out: str | Path, *, select: Iterable[str], name: str | None,
            memory: Iterable[str] | None, inline: bool) -> ImportResult:
    """:func:`import_profile`; ``inline``: the table and memory came from a scenario's YAML
    (``hardware.table`` / ``hardware.memory``), so the profile's provenance names them, not the CLI."""
    src, out = Path(src), Path(out)
    if out.suffix not in (".yaml", ".yml"):
        raise CalibrationError(f"-o {out}: the profile is a YAML file (e.g. calibration/<chip>/<name>.yaml)")
    select = list(select)
    df = import_measurements(src, fmt)
    if inline:  # the rows came from the scenario YAML, not from the cache file they pass through
        df["source"] = df["source"].str.replace(f"{src.name} key ", "scenario YAML hardware.table key ", regex=False)
    meta, notes = dict(df.attrs.get("meta", {})), list(df.attrs.get("notes", []))
    df = _select_target(df, select, src)
    existing = _existing_doc(out)
    name = name or (existing.get("name") if existing else None) or out.stem
    _refuse_name_taken(str(name), out)
    memory_section = _memory_section(meta, list(memory or []), existing, out, src, has_option=memory is not None,
                                     drafter_rows=_drafter_kinds(df), inline=inline)
    costs = out.with_name(f"{out.stem}.costs.csv")
    doc, assumed = _profile_doc(df, meta, memory_section, existing, name=str(name), src=src, fmt=fmt,
                                select=select, costs=costs.name, inline=inline)
    _write_checked(df, doc, costs, out, inline=inline, src=src)
    # row i of the cost table (line 1: the header) is df's row i - 2 (write_cost_table keeps the order)
    unused = tuple(str(df["source"].iloc[i - 2]) for i in _profile.unused_cost_rows(out))
    b = sorted(set(df.loc[df["kind"] != "prefill", "batch_tokens"]))
    return ImportResult(costs=costs, profile=out, name=str(name), num_passes=len(df),
                        batch_range=(int(b[0]), int(b[-1])) if b else None, assumed=tuple(assumed),
                        notes=tuple(notes), unused=unused)


def _refuse_name_taken(name: str, out: Path) -> None:
    """A profile written among the shipped ones must not take another's name: the name would then
    stand for two tables (a study naming it would run on whichever file was found last)."""
    try:
        inside = out.resolve().is_relative_to(_profile.calibration_dir().resolve())
    except CalibrationError:
        return
    if not inside:
        return  # named by its path; a shipped profile keeps its name
    profiles, clashes, _ = _profile.profile_catalog()
    others = [p for p in clashes.get(name, [profiles[name]] if name in profiles else [])
              if p.resolve() != out.resolve()]
    if others:
        raise CalibrationError(f"-o {out}: the profile name {name!r} is already {others[0]}; give --name NAME "
                               "(or another -o file name) so each name stands for one profile")


def cli_import(args: Any) -> int:
    """``python -m memtp_sim calibrate import FILE --format F [--select COL=VAL ...] -o OUT.yaml``:
    :func:`import_profile`, then print both paths, the assumptions and the skipped rows.

    Args:
        args: ``file``, ``fmt``, ``select`` (list of ``COL=VAL``), ``output``, ``name``; optional
            ``memory`` (list of ``FIELD=VALUE``).

    Returns:
        0.

    Raises:
        CalibrationError: as :func:`import_profile`.
    """
    r = import_profile(args.file, args.fmt, args.output, select=args.select or (), name=args.name,
                       memory=(list(args.memory or []) if hasattr(args, "memory") else None))
    b = f", B {r.batch_range[0]}..{r.batch_range[1]}" if r.batch_range else ""
    print(f"wrote {r.costs} ({r.num_passes} passes{b})")
    print(f"wrote {r.profile} (profile {r.name})")
    for line in r.assumed:
        print(f"assumed: {line}")
    if r.notes:
        print(f"skipped {len(r.notes)} row(s) of {Path(args.file).name}: {r.notes[0]}" + (" ..." if len(r.notes) > 1 else ""))
    if r.unused:
        print(f"warning: {len(r.unused)} of the {r.num_passes} passes in {r.costs} are read by no curve or drafter "
              f"of {r.profile}, so they price nothing: {r.unused[0]}" + (" ..." if len(r.unused) > 1 else "")
              + "; edit the profile's sections to select them (docs/calibration.md)", file=sys.stderr)
    return 0


#: Folder (under the disk cache) of the profiles built from Scenarios' inline ``hardware.table``.
INLINE_DIR = "inline-profiles"


def inline_table_profile(table: Mapping[Any, Any], memory: Mapping[str, Any], name: str = "inline-table") -> Path:
    """The profile YAML of a Scenario's inline ``hardware: {table: {B: ms}, memory: {...}}``.

    The table is imported exactly as ``calibrate import --format table`` would import a file
    holding it (one request of B tokens per measured pass, no context term; the drafter, overheads
    and memory defaults stated as that import states them), into a folder of the disk cache named
    by a hash of the table, the memory figures, the name and the package version, so every
    scenario with the same section shares one profile and worker processes find it by path.

    Args:
        table: ``{B: pass ms}`` (whole B >= 1, ms > 0); any subset of B.
        memory: the memory figures (keys of :data:`MEMORY_FIELDS` or ``kv_shape``), e.g.
            ``{gpu_allocatable_gib: 117, weights_bytes: 4912898304, kv_bytes_per_token: 131072,
            max_model_len: 131072}``.
        name: the profile's name in reports.

    Returns:
        The profile YAML path (loadable by :func:`memtp_sim.hardware.load_profile`).

    Raises:
        CalibrationError: an empty table, a key or value that is not allowed, a missing memory
            figure, or a budget without room for one KV block (one line naming the key).
    """
    if not isinstance(table, Mapping) or not table:
        raise CalibrationError("hardware.table: expected a non-empty mapping {batch_tokens: pass_ms}")
    if not isinstance(memory, Mapping):
        raise CalibrationError("hardware.memory: expected a mapping of memory figures "
                               f"({', '.join(MEMORY_FIELDS)}, or kv_shape)")
    allowed = (*MEMORY_FIELDS, "kv_shape")
    for k in memory:
        if k not in allowed:
            raise CalibrationError(f"hardware.memory.{k}: unknown figure; allowed: {', '.join(allowed)}")
    missing = [k for k in _REQUIRED_MEMORY if k not in memory and not (k == "kv_bytes_per_token" and "kv_shape" in memory)]
    if missing:
        raise CalibrationError(f"hardware.memory: missing {', '.join(missing)} ("
                               + "; ".join(f"{m} = {MEMORY_FIELDS[m]}" for m in missing) + ")")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise CalibrationError(f"hardware.name: {name!r}; allowed: letters, digits, '_', '.', '-'")
    # "origin": profiles cached before their provenance named the scenario YAML are not reused
    doc = {"table": {str(k): v for k, v in table.items()}, "memory": dict(memory), "name": name, "version": __version__,
           "origin": "scenario"}
    key = hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:16]
    folder = (cache_dir() or Path(tempfile.gettempdir()) / "memtp_sim") / INLINE_DIR / key
    out = folder / f"{name}.yaml"
    if out.is_file() and out.with_name(f"{name}.costs.csv").is_file():
        return out
    points = sorted((int(k), float(v)) for k, v in table.items()
                    if isinstance(k, (int, np.integer)) and isinstance(v, (int, float)) and not isinstance(v, bool))
    # a key or value the import refuses (B < 1, ms not finite > 0) is named by the import, in the YAML's terms
    if len(points) == len(table) and all(b >= 1 and 0 < ms < math.inf for b, ms in points):
        # the plausibility rules a profile's curve passes, checked here so that the message names the
        # YAML's keys (when the cached profile loads, it would name the cache's CSV rows)
        check_curve(np.array([b for b, _ in points]), np.array([ms for _, ms in points]), where="hardware.table")
    folder.mkdir(parents=True, exist_ok=True)
    src = folder / f"{name}.table.yaml"
    atomic_write_text(src, yaml.safe_dump({int(k) if isinstance(k, (int, np.integer)) else k: v
                                           for k, v in table.items()}, sort_keys=True))
    pairs = [f"{k}={','.join(map(str, v)) if isinstance(v, (list, tuple)) else v}" for k, v in memory.items()]
    try:
        _import(src, "table", out, select=(), name=name, memory=pairs, inline=True)
    except CalibrationError as e:  # name the Scenario's section, not the cache file
        msg = str(e).replace(f"{src}: ", "").replace(f"{out}: ", "").replace("--memory", "memory")
        raise CalibrationError(f"hardware.table: {msg}") from None
    return out


def _select_target(df: pd.DataFrame, pairs: list[str], src: Path) -> pd.DataFrame:
    """Apply ``--select`` to the target's passes; keep drafter passes of that model and draft-model
    passes. Refuse when several target models remain."""
    target = df[~df["kind"].str.startswith("draft_")]
    if target.empty:
        raise CalibrationError(f"{src}: no target pass (verify, decode or prefill) in the file")
    target = select(target, pairs, str(src)) if pairs else target
    models = sorted(set(target["model"]))
    if len(models) > 1:
        raise CalibrationError(f"{src}: {len(models)} target models ({', '.join(models[:4])}); choose one with "
                               f"--select model=NAME")
    if (target["kind"] == "prefill").all():  # every profile prices its rounds on a verify curve
        raise CalibrationError(f"{src}: only prefill passes; a profile needs the target's verify or decode passes "
                               "for its verify curve")
    drafts = df[df["kind"].str.startswith("draft_")]
    drafts = drafts[(drafts["model"] == models[0]) | (drafts["kind"] == "draft_model")]
    out = pd.concat([target, drafts])
    out.attrs = df.attrs
    return out


def _drafter_kinds(df: pd.DataFrame) -> list[str]:
    return sorted(set(k for k in df["kind"] if k.startswith("draft_")))


def _existing_doc(out: Path) -> dict[str, Any]:
    if not out.is_file():
        return {}
    try:
        doc = load_yaml(out.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise CalibrationError(f"{out}: exists but is not a readable YAML profile ({e.__class__.__name__}); "
                               "move it away or fix it") from None
    return doc if isinstance(doc, dict) else {}


def _given_where(key: str, inline: bool) -> str:
    """Where a ``FIELD=VALUE`` memory figure was given: the command line, or a scenario's YAML."""
    return f"given in the scenario YAML (hardware.memory.{key})" if inline else "given on the command line (--memory)"


def _parse_memory_pairs(pairs: list[str], inline: bool = False) -> dict[str, Any]:
    """``FIELD=VALUE`` pairs -> {field: (value, source)}; ``kv_shape`` becomes ``kv_bytes_per_token``."""
    got: dict[str, Any] = {}
    for pair in pairs:
        key, sep, val = pair.partition("=")
        key = key.strip()
        if key == "kv_shape":
            parts = val.split(",")
            try:
                nums = [int(x) for x in parts]
            except ValueError:
                nums = []
            if len(nums) not in (3, 4) or min(nums, default=0) < 1:
                raise CalibrationError(f"--memory {pair!r}: kv_shape is LAYERS,KV_HEADS,HEAD_DIM[,BYTES], whole numbers")
            layers, heads, dim, nbytes = (nums + [2])[:4]
            got["kv_bytes_per_token"] = (layers * heads * dim * 2 * nbytes,
                                         f"{layers} layers x {heads} KV heads x {dim} head dim x 2 (K and V) x "
                                         f"{nbytes} bytes ({'hardware.memory.' if inline else '--memory '}kv_shape)")
            continue
        if not sep or key not in MEMORY_FIELDS:
            raise CalibrationError(f"--memory {pair!r}: expected FIELD=VALUE with FIELD one of "
                                   f"{', '.join(list(MEMORY_FIELDS) + ['kv_shape'])}")
        integer = key in ("weights_bytes", "kv_bytes_per_token", "max_model_len", "kv_block_tokens")
        got[key] = (_num(val, Path("--memory"), key, key, integer=integer,
                         strict=key not in ("reserve_gib", "drafter_weights_gib")), _given_where(key, inline))
    return got


def _memory_section(meta: dict, pairs: list[str], existing: dict, out: Path, src: Path, *, has_option: bool,
                    drafter_rows: list[str], inline: bool = False) -> dict[str, Any]:
    """The profile's memory section: --memory, then the existing YAML, then the file's own facts,
    then stated defaults; one refusal line naming what is still missing."""
    given = _parse_memory_pairs(pairs, inline)
    old = existing.get("memory") if isinstance(existing.get("memory"), dict) else {}
    facts = {k: (meta[k], meta.get(f"{k}_source", f"{src.name} ({meta.get('meta_file', 'the measurement file')})"))
             for k in ("gpu_allocatable_gib", "weights_bytes", "kv_bytes_per_token", "max_model_len",
                       "drafter_weights_gib") if k in meta}
    sec: dict[str, Any] = {}
    for key in MEMORY_FIELDS:
        if key == "drafter_weights_gib":
            continue
        src_key = {"gpu_allocatable_gib": "gpu_allocatable_source", "weights_bytes": "weights_source",
                   "kv_bytes_per_token": "kv_source", "reserve_gib": "reserve_source",
                   "max_model_len": "max_model_len_source", "kv_block_tokens": "kv_block_tokens_source"}[key]
        if key in given:
            sec[key], sec[src_key] = given[key]
        elif key in old:
            sec[key], sec[src_key] = old[key], old.get(src_key, f"kept from the existing {out.name}")
        elif key in facts:
            sec[key], sec[src_key] = facts[key]
        elif key in _MEMORY_DEFAULTS:
            val, why = _MEMORY_DEFAULTS[key]
            sec[key], sec[src_key] = val, why.replace(" memory.", " hardware.memory.") if inline else why
    if "drafter_weights_gib" in given:
        sec["_drafter_weights"] = given["drafter_weights_gib"]
    elif "drafter_weights_gib" in facts:
        sec["_drafter_weights"] = facts["drafter_weights_gib"]
    missing = [k for k in _REQUIRED_MEMORY if k not in sec]
    if drafter_rows and "_drafter_weights" not in sec and not existing.get("drafters"):
        missing.append("drafter_weights_gib")
    if missing:
        how = "pass --memory FIELD=VALUE for each (kv_shape=LAYERS,KV_HEADS,HEAD_DIM sets kv_bytes_per_token)" \
            if has_option else "give them"
        # only point at the YAML's memory section when the YAML exists (a first import writes nothing on error)
        edit = f", or write them in the memory section of {out} (a re-import keeps it)" if existing else ""
        raise CalibrationError(f"{out}: memory figures not in {src.name}: {', '.join(missing)}; {how}{edit}: "
                               + "; ".join(f"{m} = {MEMORY_FIELDS[m]}" for m in missing))
    return sec


def _profile_doc(df: pd.DataFrame, meta: dict, memory: dict, existing: dict, *, name: str, src: Path, fmt: str,
                 select: list[str], costs: str, inline: bool = False) -> tuple[dict[str, Any], list[str]]:
    """The format-2 profile mapping and the assumptions it states (one line each)."""
    model = str(df.loc[~df["kind"].str.startswith("draft_"), "model"].iloc[0])
    curves, assumed = _curve_sections(df)
    sel = f" --select {' '.join(select)}" if select else ""
    b = sorted(set(df.loc[df["kind"] != "prefill", "batch_tokens"]))
    doc: dict[str, Any] = {
        "format": 2, "name": name,
        "description": (("Imported from the scenario YAML's hardware.table" if inline
                         else f"Imported by calibrate import from {src.name}")
                        + f" (format {fmt}{sel}): {len(df)} measured passes, B {b[0]}..{b[-1]}. "
                          f"{meta.get('format_note', '')}").strip(),
        "chip": str(meta.get("chip", existing.get("chip", "not given in the measurement file"))),
        "model": str(meta.get("model_label", model)),
        "engine": str(meta.get("engine", existing.get("engine", f"as measured ({fmt})"))),
        "build": str(meta.get("build", existing.get("build", "not given in the measurement file"))),
        "costs": costs, "select": {"model": model},
    }
    doc.update(curves)
    doc["caveats"] = existing.get("caveats") or _caveats(fmt, meta)
    drafters, default, d_assumed = _drafter_sections(df, memory, existing, model)
    doc["drafters"], doc["default_drafter"] = drafters, default
    assumed += d_assumed
    doc["overheads"] = existing.get("overheads") or _overheads(fmt, meta)
    ov = doc["overheads"]
    assumed += [f"overheads.{k}: {ov[k]} ({ov[s]})" for k, s in (("host_ms_per_round", "host_source"),
                                                                 ("planner_ms_per_round", "planner_source"))
                if str(ov.get(s, "")).startswith("assumption")]
    mem = {k: v for k, v in memory.items() if not k.startswith("_")}
    doc["memory"] = mem
    assumed += [f"memory.{k}: {mem[k]} ({mem[s]})" for k, s in (("reserve_gib", "reserve_source"),
                                                               ("kv_block_tokens", "kv_block_tokens_source"))
                if str(mem.get(s, "")).startswith(("assumption", "vLLM"))]
    return doc, assumed


def _curve_sections(df: pd.DataFrame) -> tuple[dict[str, Any], list[str]]:
    """verify / decode / prefill sections from what the rows measured (module docstring of tables).

    Every target pass is on a curve: decode-shaped passes (v = 1, kinds ``decode`` and ``verify``)
    make their own curve only when measured at several R beside verify passes of several tokens
    per request (the H200 data, ``measure`` output); otherwise one curve holds every pass (a
    llama-bench ``pp`` + ``tg`` run: the ``tg`` passes are its B = 1 point)."""
    target = df[~df["kind"].str.startswith("draft_") & (df["kind"] != "prefill")]
    v1 = target[target["tokens_per_request"] == 1]
    multi = target[(target["kind"] == "verify") & (target["tokens_per_request"] > 1)]
    batched_decode = v1["num_requests"].nunique() >= 2
    rules = {"below_min": "flat", "beyond_max": "roofline"}
    out: dict[str, Any] = {}

    def ctx_rule(rows: pd.DataFrame) -> str:
        # a shape measured by one procedure (kind) at two contexts; a pp1 pass beside tg passes is not one
        shapes = rows.groupby(["kind", "num_requests", "tokens_per_request"])["context_tokens"].nunique()
        return "fit" if (shapes >= 2).any() else "none"

    def ref(rows: pd.DataFrame) -> int:
        return int(rows["context_tokens"].mode().iloc[0])

    if batched_decode and not multi.empty:
        out["verify"] = {"tokens_per_request": ">1", "reference_context": ref(multi), **rules,
                         "context": ctx_rule(multi)}
        out["decode"] = {"tokens_per_request": "1", "reference_context": ref(v1), "below_min": "error",
                         "beyond_max": "roofline", "context": ctx_rule(v1)}
    else:  # one curve over every target pass (the verify section reads kind verify unless it selects)
        kinds = sorted(set(target["kind"]))
        out["verify"] = {**({"select": {"kind": kinds}} if kinds != ["verify"] else {}), "tokens_per_request": "any",
                         "reference_context": ref(target), **rules, "context": ctx_rule(target)}
    if (df["kind"] == "prefill").any():
        out["prefill"] = {"reference_context": 0, "below_min": "flat", "beyond_max": "roofline", "context": "none"}
    assumed = ["verify.below_min: flat (below the smallest measured B a pass costs the smallest measured pass: "
               "memory-bound floor)",
               "verify.beyond_max: roofline (above the largest measured B, linear through the last two points)"]
    return out, assumed


def _drafter_sections(df: pd.DataFrame, memory: dict, existing: dict, model: str) -> tuple[dict, str, list[str]]:
    if existing.get("drafters"):
        return existing["drafters"], existing.get("default_drafter", next(iter(existing["drafters"]))), []
    weights = memory.get("_drafter_weights")
    kinds = {"draft_block": ("dspark_block", "block"), "draft_mtp": ("mtp", "mtp"),
             "draft_model": ("draft_model", "model"), "draft_per_sequence": ("per_sequence", "per_sequence")}
    out: dict[str, Any] = {}
    notes: list[str] = []
    for k in _drafter_kinds(df):
        key, kind = kinds[k]
        sel: dict[str, Any] = {"kind": k}
        if k == "draft_model":
            sel["model"] = str(df.loc[df["kind"] == k, "model"].iloc[0])
        out[key] = {"kind": kind, "select": sel, "note": f"measured {k} passes", "weights_gib": float(weights[0]),
                    "weights_source": weights[1]}
        rows = df[df["kind"] == k]
        rows = rows[rows["model"] == sel["model"]] if "model" in sel else rows
        axis = "batch_tokens" if kind in ("block", "per_sequence") else "num_requests"
        xs = sorted(set(int(x) for x in rows[axis]))
        if len(xs) == 1:  # a single point: MeasuredDrafterCost holds it flat at every batch
            flat = (f"measured at one {axis} only ({xs[0]}): its cost is taken as the same at every {axis} "
                    "(a lower bound when more requests draft at once)")
            notes.append(f"drafters.{key}: {flat}")
            out[key]["note"] += f"; {flat}"  # the profile says it too, not only the import's output
    if out:
        return out, next(iter(out)), notes
    w_gib = float(memory["weights_bytes"]) / GIB * ASSUMED_DRAFTER_FRACTION
    # the target's passes over B tokens, one-token (tg, decode) passes included: its B = 1 point
    target_kinds = sorted(set(df["kind"]) & {"verify", "decode"})
    out["assumed_block"] = {
        "kind": "block", "select": {"kind": target_kinds[0] if len(target_kinds) == 1 else target_kinds},
        "time_scale": ASSUMED_DRAFTER_FRACTION,
        "note": f"assumption (no drafter passes measured): a DSpark block drafter costing "
                f"{ASSUMED_DRAFTER_FRACTION:g} x the target's measured pass over the same R x gamma tokens "
                "(a 5-layer backbone on a ~32-layer target); replace with measured drafter passes when you have them",
        "weights_gib": round(w_gib, 4),
        "weights_source": f"assumption: {ASSUMED_DRAFTER_FRACTION:g} x the target's weights",
    }
    return out, "assumed_block", [f"drafter: {out['assumed_block']['note']}"]


def _caveats(fmt: str, meta: dict) -> list[str]:
    return {
        "llama-bench": ["llama-bench pp computes logits for the last token only; a verify pass needs logits at every "
                        "draft position, so the LM-head cost is understated for B > 1.",
                        "pp rows are single-request passes: B tokens of one sequence, not R requests."],
        "batched-bench": ["decode passes of B sequences (one token each): verify passes of several tokens per "
                          "request are priced from the same B-curve."],
        "sglang-sps": ["The SGLang step time is a whole DSpark step (drafting, verify and host work); the profile's "
                       "drafter and overheads add to it, so set them to the extra work only."],
        "table": ["A hand-made table: shapes (requests x tokens) and context as the table states."],
        "measurements": ["Numbers copied from public sources; see the collection's SOURCES.md for each row's caveats."],
        "gpu-costs": ["Passes timed as CUDA-graph replays of random-weight layers of the model's shapes (PyTorch SDPA, "
                      "contiguous KV cache): fused serving kernels are somewhat faster; the curve's shape is what a "
                      "profile needs."],
    }.get(fmt, [f"Measured: {meta.get('format_note', 'passes')}."])


def _overheads(fmt: str, meta: dict) -> dict[str, Any]:
    host_zero = fmt in ("llama-bench", "batched-bench", "sglang-sps", "measurements")
    return {
        "host_ms_per_round": 0.0 if host_zero else 0.5,
        "host_source": ("the measured times include the engine's host work per pass (whole llama_decode calls / "
                        "server steps)" if host_zero else
                        "assumption (calibrate import default): per-step CPU work not hidden behind the GPU, "
                        + ("which a hand-made table's pass times are taken not to include (set 0 if yours do)"
                           if fmt == "table" else "which CUDA-graph replays of the passes exclude")
                        + " (vLLM's v0.6.0 performance post, blog.vllm.ai 2024-09-05, found scheduling at 29% of "
                          "execution time before overlapping it)"),
        "planner_ms_per_round": 0.05,
        "planner_source": "assumption (calibrate import default): a confidence-ranking policy planning on the CPU "
                          "in the critical path; numpy Algorithm 1 takes tens of microseconds at 64 requests "
                          "(benchmarks/bench_engine.py)",
    }


def _write_checked(df: pd.DataFrame, doc: dict, costs: Path, out: Path, inline: bool = False,
                   src: Path | None = None) -> None:
    """Write the cost table and the YAML, then load the profile; undo both if it does not load."""
    by = "from a scenario YAML's inline hardware.table" if inline else "by `python -m memtp_sim calibrate import`"
    header = (f"# Hardware profile written {by} (format 2).\n"
              "# Every number names its source or a stated assumption; the memory, drafters,\n"
              "# overheads and caveats sections survive a re-import (edit them here).\n")
    old = {p: p.read_bytes() for p in (costs, out) if p.is_file()}
    made = [d for d in (out.parent, *out.parent.parents) if not d.exists()]  # folders the writes create
    write_cost_table(df, costs)
    atomic_write_text(out, header + yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=110))
    try:
        load_profile(out)
    except CalibrationError as e:
        err = _in_source_terms(str(e), costs, df, src)
        for p in (costs, out):
            if p in old:
                atomic_write_bytes(p, old[p])
            else:
                p.unlink(missing_ok=True)
        for d in made:  # innermost first; nothing else was written there
            d.rmdir()
        raise CalibrationError(err) from None


def _in_source_terms(message: str, costs: Path, df: pd.DataFrame, src: Path | None) -> str:
    """A check's message about a row of the cost table just written (and now removed again) in the
    user's terms: the input's own row, as the table's source column records it."""
    m = re.match(rf"^{re.escape(str(costs))} \((\w+)\): row (\d+), column (\w+): (.*)$", message)
    if m is None or not 0 <= int(m.group(2)) - 2 < len(df):
        return message
    curve, row, column, rest = m.group(1), int(m.group(2)), m.group(3), m.group(4)
    where = str(df["source"].iloc[row - 2])
    if src is not None and where.startswith(src.name):
        where = str(src.parent / where)  # the file as the user gave it, then its row
    return f"{where} ({curve}), {column}: {rest}; nothing was written"

"""Importers: measurements in the forms people publish -> the memtp cost table (hardware.tables).

Each importer reads one format and returns a :class:`pandas.DataFrame` with the columns of
:data:`memtp_sim.hardware.tables.COST_COLUMNS`; :func:`import_measurements` dispatches by format
name and :func:`write_cost_table` writes it. ``python -m memtp_sim calibrate import`` calls these.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Callable

import pandas as pd

from .._io import atomic_write_text
from ..errors import CalibrationError
from .tables import COST_COLUMNS

__all__ = ["FORMATS", "import_measurements", "write_cost_table", "from_gpu_costs_csv"]


def _frame(rows: list[dict]) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=list(COST_COLUMNS))
    return df


def from_gpu_costs_csv(path: Path) -> pd.DataFrame:
    """The per-pass GPU cost CSV of ``measure_gpu_costs.py`` (and this package's measurement script).

    Columns: run, model, kind, requests, tokens_per_request, batch_tokens, context, mode,
    median_ms, p10_ms, p90_ms, reps. Kinds ``verify``, ``prefill``, ``draft_mtp``, ``draft_block``,
    ``draft_model`` map one to one; a prefill row is one request whose prompt is the pass
    (B = P, v = P, context 0).

    Raises:
        CalibrationError: a missing column or a bad cell (file, row, column).
    """
    need = ("model", "kind", "requests", "tokens_per_request", "batch_tokens", "context", "median_ms")
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in need if c not in (reader.fieldnames or [])]
        if missing:
            raise CalibrationError(f"{path}: missing column(s) {missing} for format gpu-costs")
        out = []
        for i, r in enumerate(reader, start=2):
            out.append({
                "kind": r["kind"], "model": r["model"], "batch_tokens": r["batch_tokens"],
                "num_requests": r["requests"], "tokens_per_request": r["tokens_per_request"],
                "context_tokens": r["context"], "pass_ms": r["median_ms"], "p10_ms": r.get("p10_ms", ""),
                "p90_ms": r.get("p90_ms", ""), "source": f"{path.name} row {i} (run {r.get('run', '?')}, "
                                                         f"{r.get('mode', '')}, {r.get('reps', '?')} reps)",
            })
    return _frame(out)


#: format name -> importer(path) -> cost-table frame
FORMATS: dict[str, Callable[[Path], pd.DataFrame]] = {
    "gpu-costs": from_gpu_costs_csv,
}


def import_measurements(path: str | Path, fmt: str) -> pd.DataFrame:
    """Read ``path`` in format ``fmt`` as a cost table (see :data:`FORMATS`).

    Raises:
        CalibrationError: unknown format, missing file, or a malformed file (one line: file, row,
            column where it applies).
    """
    p = Path(path)
    if fmt not in FORMATS:
        raise CalibrationError(f"--format {fmt!r}: unknown; allowed: {', '.join(sorted(FORMATS))}")
    if not p.is_file():
        raise CalibrationError(f"{p}: file not found")
    return FORMATS[fmt](p)


def write_cost_table(df: pd.DataFrame, path: str | Path) -> None:
    """Write a cost table (atomically) in the column order of :data:`COST_COLUMNS`."""
    buf = io.StringIO()
    df[list(COST_COLUMNS)].to_csv(buf, index=False)
    atomic_write_text(Path(path), buf.getvalue())

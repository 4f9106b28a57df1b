"""The memtp cost table: one normalized CSV of measured pass times, and the curves built from it.

Every importer (``python -m memtp_sim calibrate import``) writes this one format, and a profile
(format 2) selects its rows. Columns (one row per measured pass):

==================== ======================================================================
``kind``             ``verify`` (target pass over R requests x v tokens; decode when v = 1),
                     ``decode`` (only v = 1 passes), ``prefill`` (one request's prompt, empty
                     cache), ``draft_block``, ``draft_mtp``, ``draft_model``,
                     ``draft_per_sequence`` (drafter passes)
``model``            model label (free text, used by ``select``)
``batch_tokens``     B = R x v, tokens in the pass
``num_requests``     R
``tokens_per_request`` v
``context_tokens``   L, tokens already in each request's KV cache (the pass reads R x L of them)
``pass_ms``          the measured time of one pass (median or mean), ms
``p10_ms``/``p90_ms`` spread (optional; empty when the source gives none)
``source``           URL or file the number comes from
==================== ======================================================================

Curves (:func:`verify_curve`): shapes (R x v) measured at two contexts fit the attention roofline
(:func:`fit_attention`); every shape the profile selects contributes its rows at the context nearest
the reference context, each brought to context 0 by removing its own attention term, and they form
the B-curve (rows at one B averaged). A shape measured by two procedures (``kind``: a llama-bench
``pp1`` pass and the ``tg`` one-token passes) counts as two shapes, so the difference between the
procedures is never read as a context slope.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

from .._io import MAX_EXACT_COUNT, not_a_file
from ..errors import CalibrationError
from .cost import AttentionCost, MeasuredDrafterCost, SPSTable

__all__ = ["COST_COLUMNS", "COST_KINDS", "read_cost_table", "select_rows", "verify_curve", "drafter_cost",
           "fit_attention", "CurveFit"]

COST_COLUMNS = ("kind", "model", "batch_tokens", "num_requests", "tokens_per_request", "context_tokens",
                "pass_ms", "p10_ms", "p90_ms", "source")
COST_KINDS = ("verify", "decode", "prefill", "draft_block", "draft_mtp", "draft_model", "draft_per_sequence")
_INT_COLUMNS = ("batch_tokens", "num_requests", "tokens_per_request", "context_tokens")


def read_cost_table(path: str | Path) -> pd.DataFrame:
    """Read and check a memtp cost table (cached by path, modification time and size).

    Returns:
        One row per measured pass, the columns of :data:`COST_COLUMNS` plus ``_row`` (the line in
        the file) and ``kv_read`` (R x L, KV tokens the pass read).

    Raises:
        CalibrationError: a missing column, an unknown kind, a cell that is not a number of the
            right kind (whole counts, positive times), or B != R x v; naming file, row and column.
    """
    p = Path(path)
    why = not_a_file(p, "cost table")
    if why is not None:
        raise CalibrationError(why)
    st = p.stat()
    return _read_cost_table(str(p.resolve()), st.st_mtime_ns, st.st_size).copy()


@lru_cache(maxsize=32)
def _read_cost_table(path: str, mtime_ns: int, size: int) -> pd.DataFrame:  # stat in the key: edits reload
    import pandas as pd  # lazy: pandas costs a third of `import memtp_sim`
    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (OSError, pd.errors.ParserError, UnicodeDecodeError, pd.errors.EmptyDataError) as e:
        raise CalibrationError(f"{path}: not a readable CSV cost table ({e.__class__.__name__})") from None
    missing = [c for c in COST_COLUMNS if c not in df.columns]
    if missing:
        raise CalibrationError(f"{path}: missing column(s) {missing}; a memtp cost table has {list(COST_COLUMNS)}")
    df["_row"] = np.arange(len(df)) + 2
    bad_kind = ~df["kind"].isin(COST_KINDS)
    if bad_kind.any():
        i = int(bad_kind.to_numpy().argmax())
        raise CalibrationError(f"{path}: row {i + 2}, column kind: {df['kind'].iloc[i]!r}; allowed: "
                               f"{', '.join(COST_KINDS)}")
    for col in _INT_COLUMNS + ("pass_ms", "p10_ms", "p90_ms"):
        optional = col in ("p10_ms", "p90_ms")
        text = df[col]
        num = pd.to_numeric(text.where(text != "", np.nan), errors="coerce")
        bad = num.isna() & ((text != "") | (not optional))
        if col in _INT_COLUMNS:
            bad |= num.notna() & ((num < (0 if col == "context_tokens" else 1)) | (num != num.round())
                                  | (num > MAX_EXACT_COUNT))  # beyond: no exact count, and int64 would wrap
        else:
            bad |= num.notna() & ~((num > 0) & np.isfinite(num))
        if bad.any():
            i = int(bad.to_numpy().argmax())
            what = "a whole number" if col in _INT_COLUMNS else "a finite positive number of ms"
            raise CalibrationError(f"{path}: row {i + 2}, column {col}: {text.iloc[i]!r} is not {what}")
        df[col] = num
    prod = df["num_requests"] * df["tokens_per_request"] != df["batch_tokens"]
    if prod.any():
        i = int(prod.to_numpy().argmax())
        raise CalibrationError(f"{path}: row {i + 2}, column batch_tokens: {int(df['batch_tokens'].iloc[i])} is not "
                               "num_requests x tokens_per_request")
    for col in _INT_COLUMNS:
        df[col] = df[col].astype(np.int64)
    df["kv_read"] = df["num_requests"] * df["context_tokens"]
    return df


def select_rows(df: pd.DataFrame, select: Mapping[str, Any], where: str) -> pd.DataFrame:
    """The rows matching every ``column: value`` of ``select`` (a list value matches any of it).

    Raises:
        CalibrationError: ``select`` names a column the table lacks.
    """
    import pandas as pd  # lazy: pandas costs a third of `import memtp_sim`
    mask = np.ones(len(df), dtype=bool)
    for col, want in select.items():
        if col not in df.columns:
            raise CalibrationError(f"{where}: select: unknown cost-table column {col!r}; allowed: "
                                   f"{', '.join(COST_COLUMNS)}")
        wants = want if isinstance(want, list) else [want]
        hit = np.zeros(len(df), dtype=bool)
        for w in wants:
            if isinstance(w, (int, float)) and not isinstance(w, bool):
                hit |= pd.to_numeric(df[col], errors="coerce").to_numpy() == float(w)
            else:
                hit |= (df[col].astype(str) == str(w)).to_numpy()
        mask &= hit
    return df[mask]


@dataclass(frozen=True)
class CurveFit:
    """What :func:`verify_curve` built, for provenance and the fidelity report.

    Attributes:
        table: the curve (points brought to context 0 when it has an attention term).
        pairs: ``(R, v, L1, t1_ms, L2, t2_ms)`` of every shape measured at two contexts.
        rows: file rows behind each point (one tuple per point).
        pair_rows: file rows behind the fitted context pairs (empty without a fitted term).
    """

    table: SPSTable
    pairs: tuple[tuple[int, int, int, float, int, float], ...]
    rows: tuple[tuple[int, ...], ...]
    pair_rows: tuple[int, ...] = ()

    @property
    def used_rows(self) -> frozenset[int]:
        """File rows this curve reads: its points' and its context pairs'."""
        return frozenset(x for point in self.rows for x in point) | frozenset(self.pair_rows)

    def pair_errors(self) -> list[tuple[int, int, float, float]]:
        """For each context pair: ``(R, v, measured delta ms, modelled delta ms)``."""
        att = self.table.attention
        out = []
        for req, v, l1, t1, l2, t2 in self.pairs:
            def term(ll: int) -> float:
                return float(att.ms(v, ll, req * ll, v * req * ll)) if att is not None else 0.0
            out.append((req, v, t2 - t1, term(l2) - term(l1)))
        return out


def verify_curve(rows: pd.DataFrame, *, where: str, reference_context: int | None = None,
                 tokens_per_request: str = "any", below_min: str = "error", beyond_max: str = "error",
                 context: Any = "fit", graph_sizes: tuple[int, ...] = (), eager_factor: float = 1.0,
                 source: str = "") -> CurveFit:
    """Build a pass-time curve over B (with its attention term) from cost-table rows.

    Every shape (R requests x v tokens, per ``kind``) contributes its rows at the context nearest
    the reference context (ties: the smaller context), so a shape measured only elsewhere (the
    llama-bench ``tg`` passes, whose mean context is ``n_depth + (n_gen - 1) / 2``, beside ``pp``
    passes at ``n_depth``) is on the curve too. Each such row is brought to context 0 by removing
    the attention term of its own context (so passes of different shapes at one B, e.g. R = 8,
    v = 1 and R = 1, v = 8, are comparable) and rows at one B are averaged.

    Args:
        rows: selected rows of one kind.
        where: the profile, for messages.
        reference_context: the context the B-curve is read at (default: the most common L); at
            least one selected row must be measured there.
        tokens_per_request: ``any``, ``1`` (decode-shaped passes only) or ``>1`` (verify passes of
            several tokens per request only).
        below_min, beyond_max: rules outside the measured range (see :class:`SPSTable`).
        context: ``fit`` (the attention roofline fitted on shapes measured at two contexts, see
            :func:`fit_attention`; none found: no context term), ``none``, or
            ``{ms_per_kv_token: x, source: ...}`` (a stated bandwidth slope).
        graph_sizes, eager_factor: CUDA-graph padding (see :class:`SPSTable`).
        source: text for the table's provenance.

    Raises:
        CalibrationError: no row at the reference context, or a bad ``tokens_per_request`` or
            ``context`` value.
    """
    if tokens_per_request not in ("any", "1", ">1", 1):
        raise CalibrationError(f"{where}: tokens_per_request: {tokens_per_request!r}; allowed: any, 1, >1")
    r = rows
    if str(tokens_per_request) == "1":
        r = r[r["tokens_per_request"] == 1]
    elif tokens_per_request == ">1":
        r = r[r["tokens_per_request"] > 1]
    if r.empty:
        raise CalibrationError(f"{where}: no selected row with tokens_per_request {tokens_per_request}")
    ref = int(r["context_tokens"].mode().iloc[0]) if reference_context is None else int(reference_context)
    if not (r["context_tokens"] == ref).any():
        raise CalibrationError(f"{where}: no selected row at reference_context {ref}; contexts present: "
                               f"{sorted(set(r['context_tokens']))}")
    at_ref = _nearest_context(r, ref).copy()
    attention, pairs, pair_rows = _attention(r, context, where)
    if attention is not None:
        v, ll = at_ref["tokens_per_request"].to_numpy(float), at_ref["context_tokens"].to_numpy(float)
        kv = at_ref["kv_read"].to_numpy(float)
        at_ref["pass_ms"] = np.maximum(at_ref["pass_ms"] - attention.ms(v, ll, kv, kv * v), 1e-6)
    g = at_ref.groupby("batch_tokens", sort=True)
    bs = np.array(list(g.groups), dtype=np.int64)
    row_ids = tuple(tuple(int(x) for x in grp["_row"]) for _, grp in g)
    table = SPSTable(bs, g["pass_ms"].mean().to_numpy(), source=source, beyond_max=beyond_max, below_min=below_min,
                     attention=attention, graph_sizes=tuple(graph_sizes), eager_factor=eager_factor)
    return CurveFit(table, pairs, row_ids, pair_rows)


def _shape_keys(r: pd.DataFrame) -> list[str]:
    """Columns that make one measured shape: R, v and, where the rows have it, the kind (one
    measuring procedure: a ``pp1`` pass and ``tg`` passes are both R = 1, v = 1)."""
    return ["num_requests", "tokens_per_request"] + (["kind"] if "kind" in r.columns else [])


def _nearest_context(r: pd.DataFrame, ref: int) -> pd.DataFrame:
    """Each shape's rows at its measured context nearest ``ref`` (ties: the smaller context)."""
    import pandas as pd  # lazy: pandas costs a third of `import memtp_sim`
    ctx = r["context_tokens"].to_numpy(np.int64)
    key = pd.Series(2 * np.abs(ctx - ref) + (ctx > ref), index=r.index)  # 2|d| + 1 above: ties go below
    best = key.groupby([r[c] for c in _shape_keys(r)]).transform("min")
    return r[(key == best).to_numpy()]


def fit_attention(pairs: list[tuple[int, int, int, float, int, float]], source: str = "", *,
                  prices_one_token: bool = False) -> AttentionCost:
    """Fit the attention roofline ``max(a(q) * L_max, b * K, c * W)`` on context pairs.

    Each pair is one shape (R requests x v tokens) measured at contexts L1 < L2 (times t1, t2):
    ``a(v)`` from the pair with the fewest requests at each v (latency-bound: ``dt / dL``); ``b``
    from the decode pair (v = 1, else the smallest v) with the most requests (bandwidth-bound:
    ``dt / (R dL)``); ``c`` from the pair with the most query-key pairs among v > 1
    (compute-bound: ``dt / (v R dL)``). The other pairs validate the fit
    (:meth:`CurveFit.pair_errors`). Negative slopes are clipped to 0.

    A curve that prices one-token passes (``prices_one_token``) without a decode pair (a
    llama-bench file with ``pp`` at two depths and ``tg`` at one) has no measured context cost
    for them: there ``b`` is 0 and ``a`` falls in proportion to the tokens per request below the
    smallest measured v (a point ``(1, a(v) / v)``: attention over the context is compute-bound,
    per query), instead of charging a decode step the slope of a 512-token pass (3x the measured
    tg time at a 575-token context).

    Args:
        pairs: ``(R, v, L1, t1_ms, L2, t2_ms)``.
        source: where the pairs come from, for the term's provenance.
        prices_one_token: the curve holds one-token (v = 1) passes.

    Source: the roofline reading of the H200 context pairs (calibration/h200/SOURCES.md).
    """
    def slope(p: tuple, per: float) -> float:
        req, v, l1, t1, l2, t2 = p
        return max(0.0, (t2 - t1) / (per * (l2 - l1)))

    a_pts = []
    for v in sorted({p[1] for p in pairs}):
        few = min((p for p in pairs if p[1] == v), key=lambda p: p[0])
        a_pts.append((float(v), slope(few, 1.0)))
    v_min = min(p[1] for p in pairs)
    if prices_one_token and v_min > 1:  # one-token passes, none at two contexts: a(q) per query below v_min
        b = 0.0
        a_pts.insert(0, (1.0, a_pts[0][1] / v_min))
    else:
        many = max((p for p in pairs if p[1] == v_min), key=lambda p: p[0])
        b = slope(many, many[0])
    multi = [p for p in pairs if p[1] > 1]
    c = 0.0
    if multi:
        top = max(multi, key=lambda p: p[0] * p[1])
        c = slope(top, top[0] * top[1])
    return AttentionCost(tuple(a_pts), b, c, source=source)


def _attention(r: pd.DataFrame, context: Any, where: str):  # noqa: ANN202
    """The table's attention term, the context pairs behind it and their file rows."""
    if context in ("none", None):
        return None, (), ()
    if isinstance(context, Mapping):
        v = context.get("ms_per_kv_token")
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not v >= 0:
            raise CalibrationError(f"{where}: context.ms_per_kv_token: {v!r} is not a number >= 0")
        return AttentionCost(b_ms_per_kv_token=float(v), source=str(context.get("source", "stated"))), (), ()
    if context != "fit":
        raise CalibrationError(f"{where}: context: {context!r}; allowed: fit, none, or "
                               "{ms_per_kv_token: x, source: ...}")
    pairs, rows = [], []
    for key, grp in r.groupby(_shape_keys(r)):
        by_l = grp.groupby("context_tokens")["pass_ms"].mean()
        if by_l.size >= 2:
            l1, l2 = int(by_l.index.min()), int(by_l.index.max())
            pairs.append((int(key[0]), int(key[1]), l1, float(by_l[l1]), l2, float(by_l[l2])))
            rows += [int(x) for x in grp.loc[grp["context_tokens"].isin((l1, l2)), "_row"]]
    if not pairs:
        return None, (), ()
    return (fit_attention(pairs, source=f"fitted on {len(pairs)} shapes measured at two contexts",
                          prices_one_token=bool((r["tokens_per_request"] == 1).any())), tuple(pairs),
            tuple(sorted(rows)))


def drafter_cost(rows: pd.DataFrame, *, kind: str, where: str, t_seq_s: float = 0.0, weights_gib: float = 0.0,
                 time_scale: float = 1.0, source: str = "", kv_bytes_per_token: int = 0) -> MeasuredDrafterCost:
    """A measured drafter cost from rows of one drafter kind.

    ``block`` and ``per_sequence`` use tokens in the pass (B) as the work axis, ``mtp`` and
    ``model`` the requests per step (R); several rows at one x are averaged.

    Raises:
        CalibrationError: no rows.
    """
    if rows.empty:
        raise CalibrationError(f"{where}: the drafter's select matches no row")
    axis = "batch_tokens" if kind in ("block", "per_sequence") else "num_requests"
    g = rows.groupby(axis, sort=True)["pass_ms"].mean()
    return MeasuredDrafterCost(kind, g.index.to_numpy(dtype=np.float64), g.to_numpy(), t_seq_s=t_seq_s,
                               weights_gib=weights_gib, time_scale=time_scale, source=source,
                               kv_bytes_per_token=kv_bytes_per_token)

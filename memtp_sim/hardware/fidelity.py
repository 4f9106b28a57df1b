"""How much to trust a profile's cost lookup: the numbers behind ``calibrate check``.

Three questions, each answered by a pure function that returns a frame:

* **Leave-one-out (LOO)** (:func:`leave_one_out`): drop one measured point of a curve (verify,
  decode, prefill), rebuild the table from the rest with the same edge rules, predict the dropped
  B, and report the relative error. A point the rules refuse to price without it (the first point
  under ``below_min: error``, the last under ``beyond_max: error``) is reported as refused, not as
  an error. This is how Vidur's maintainers checked their interpolation (they cut it from +12% to
  +3%): an interpolation that is only exact at the points it was built from says nothing about the
  B in between.
* **Cliffs** (:func:`find_cliffs`, :func:`cliff_errors`): where verify tokens per second falls by
  more than 5% from one measured point to the next, or the pass time jumps more than 1.6x (the
  study report's :func:`memtp_sim.report.numbers.cliffs` calls the same function), with the LOO
  error on each side: a cliff is where a missing point costs most.
* **Context pairs** (:func:`context_pairs`): for format-2 profiles, each shape measured at two
  contexts against the attention roofline fitted on them (:meth:`.tables.CurveFit.pair_errors`).

And the inputs of a sensitivity run: :func:`write_variant` writes a copy of a profile whose pass
curves are scaled by a factor, or flat (every pass at the smallest measured pass time), so that
:func:`memtp_sim.api.run` prices the same scenario under a biased or a flat cost table through
the ordinary profile path. The run itself lives at the report floor
(:mod:`memtp_sim.report.fidelity`), since this floor may not import the engine.

Source: docs/model.md section 1 step 4 (SPS(B) is a measured, jagged table with a stated lookup
rule); Vidur (Agrawal et al., MLSys 2024) for validating a profile-driven simulator point by point.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping, NamedTuple

import numpy as np
import pandas as pd
import yaml

from .._io import atomic_write_text, read_yaml
from ..errors import CalibrationError, InvalidArgumentError
from . import tables
from .cost import SPSTable
from .profile import HardwareProfile, _curve, _select_rows

__all__ = [
    "CURVES",
    "CLIFF_RATE_DROP",
    "CLIFF_PASS_JUMP",
    "CLIFF_MAX_SPAN",
    "PASS_KINDS",
    "Fidelity",
    "profile_curves",
    "leave_one_out",
    "loo_summary",
    "find_cliffs",
    "cliff_errors",
    "context_pairs",
    "check_profile",
    "flat_pass_ms",
    "variant_tag",
    "write_variant",
]

#: The pass curves a profile may hold, in report order.
CURVES = ("verify", "decode", "prefill")
#: A cliff: verify tokens per second (B / pass time) falls below this fraction of the previous point's.
CLIFF_RATE_DROP = 0.95
#: A cliff: the pass time grows by more than this factor from one measured point to the next...
CLIFF_PASS_JUMP = 1.6
#: ...at most this factor of B further on: between sparser points (B = 64 and 512) a pass that grows
#: x5.9 may grow smoothly, so the measurements cannot call it a jump (a rate drop is a cliff at any span).
CLIFF_MAX_SPAN = 2.0
#: Cost-table kinds whose rows form the pass curves (drafter kinds are left alone by variants).
PASS_KINDS = ("verify", "decode", "prefill")

_LOO_COLUMNS = ["curve", "batch_tokens", "measured_ms", "predicted_ms", "rel_error", "how"]
_CLIFF_COLUMNS = ["curve", "cliff", "kind", "b_from", "b_to", "pass_ms_from", "pass_ms_to", "jump",
                  "loo_error_from", "loo_error_to", "worst_abs_error"]
_PAIR_COLUMNS = ["curve", "num_requests", "tokens_per_request", "context_from", "context_to",
                 "measured_delta_ms", "modelled_delta_ms", "error_ms", "rel_error"]


class Fidelity(NamedTuple):
    """Everything :func:`check_profile` computes for one profile.

    Attributes:
        name: the profile's name.
        path: its YAML.
        loo: :func:`leave_one_out` of every curve, one row per measured point.
        summary: :func:`loo_summary`, one row per curve.
        cliffs: :func:`cliff_errors`, one row per cliff.
        pairs: :func:`context_pairs`, one row per shape measured at two contexts (may be empty).
        notes: plain-words remarks (curves shared with verify, curves with too few points).
    """

    name: str
    path: str
    loo: pd.DataFrame
    summary: pd.DataFrame
    cliffs: pd.DataFrame
    pairs: pd.DataFrame
    notes: list[str]


def profile_curves(profile: HardwareProfile) -> dict[str, SPSTable]:
    """The profile's distinct pass curves by name (decode and prefill only when measured apart).

    Args:
        profile: a loaded profile.

    Returns:
        ``{"verify": ..., "decode": ..., "prefill": ...}``, the last two only when the profile has
        them (a format-1 profile prices every pass with its verify table).
    """
    out = {"verify": profile.sps}
    for name in ("decode", "prefill"):
        t = getattr(profile, name)
        if t is not None and t is not profile.sps:
            out[name] = t
    return out


def _bare(table: SPSTable, keep: np.ndarray) -> SPSTable:
    """The table's measured points ``keep`` with its edge rules, at their own context, unpadded."""
    ref = {k: (getattr(table, k)[keep] if getattr(table, k) is not None else None)
           for k in ("ref_requests", "ref_l_max", "ref_kv")}
    return replace(table, batch_tokens=table.batch_tokens[keep], pass_ms=table.pass_ms[keep], context=None,
                   graph_sizes=(), eager_factor=1.0, dense_limit=0, **ref)


def leave_one_out(table: SPSTable, curve: str = "verify") -> pd.DataFrame:
    """Leave-one-out error of the lookup rule at every measured point of one curve.

    For each measured point i, the table is rebuilt from the other points with the same
    ``below_min`` / ``beyond_max`` rules (points as the table stores them: a format-2 curve holds
    them brought to context 0; no graph padding, which would move B itself) and asked for the
    pass time at ``B_i``.

    Args:
        table: the curve.
        curve: its name, for the ``curve`` column.

    Returns:
        One row per measured point: ``curve``, ``batch_tokens``, ``measured_ms``,
        ``predicted_ms`` (NaN when refused), ``rel_error`` = (predicted - measured) / measured
        (NaN when refused), ``how`` (``interpolated``, ``below_min flat``, ``beyond_max
        roofline``, or ``refused (...)``).

    Source:
        The ``linear_pass_time`` rule and edge rules of :class:`memtp_sim.hardware.cost.SPSTable`;
        leave-one-out validation as in Vidur (Agrawal et al., MLSys 2024).
    """
    b, t = table.batch_tokens, table.pass_ms
    rows = []
    for i in range(b.size):
        keep = np.arange(b.size) != i
        if i == 0:
            how = "below_min flat" if table.below_min == "flat" else "refused (below_min: error)"
        elif i == b.size - 1:
            how = "beyond_max roofline" if table.beyond_max != "error" else "refused (beyond_max: error)"
        else:
            how = "interpolated"
        pred = float("nan")
        if keep.sum() == 0:
            how = "refused (only point)"
        elif not how.startswith("refused"):
            try:
                pred = float(_bare(table, keep).pass_time_s(int(b[i]))) * 1000.0
            except InvalidArgumentError as e:  # a rule the loop above does not know about
                how = f"refused ({e})"
        err = (pred - t[i]) / t[i] if math.isfinite(pred) else float("nan")
        rows.append((curve, int(b[i]), float(t[i]), pred, err, how))
    return pd.DataFrame(rows, columns=_LOO_COLUMNS)


def loo_summary(loo: pd.DataFrame) -> pd.DataFrame:
    """Per curve: how many points, how many predicted, mean and worst absolute LOO error.

    Args:
        loo: :func:`leave_one_out` rows (any number of curves).

    Returns:
        One row per curve (in order of appearance): ``curve``, ``num_points``, ``num_predicted``,
        ``num_refused``, ``mean_abs_error``, ``interior_mean_abs_error`` (interpolated points
        only, no edge rule), ``max_abs_error``, ``b_at_max`` (B of the worst point; NaN when none
        was predicted). Errors are fractions (0.12 = 12%).
    """
    out = []
    for curve, d in loo.groupby("curve", sort=False):
        e = d["rel_error"].abs()
        pred = e.notna()
        inner = e[d["how"] == "interpolated"]
        worst = e.idxmax() if pred.any() else None
        out.append({"curve": curve, "num_points": len(d), "num_predicted": int(pred.sum()),
                    "num_refused": int((~pred).sum()),
                    "mean_abs_error": float(e[pred].mean()) if pred.any() else float("nan"),
                    "interior_mean_abs_error": float(inner.mean()) if inner.notna().any() else float("nan"),
                    "max_abs_error": float(e[pred].max()) if pred.any() else float("nan"),
                    "b_at_max": int(d.loc[worst, "batch_tokens"]) if worst is not None else float("nan")})
    return pd.DataFrame(out, columns=["curve", "num_points", "num_predicted", "num_refused", "mean_abs_error",
                                      "interior_mean_abs_error", "max_abs_error", "b_at_max"])


def find_cliffs(batch_tokens: Any, pass_ms: Any) -> pd.DataFrame:
    """Cliffs between neighbouring measured points of a pass-time curve.

    A ``rate_drop``: B / pass time (verify tokens per second) falls below
    :data:`CLIFF_RATE_DROP` of the previous point's; else a ``pass_jump``: the pass time grows by
    more than :data:`CLIFF_PASS_JUMP` while B grows by at most :data:`CLIFF_MAX_SPAN`. The study report's cliffs (:func:`memtp_sim.report.numbers.cliffs`)
    are these.

    Args:
        batch_tokens: measured B, increasing.
        pass_ms: pass time at each B, ms.

    Returns:
        One row per cliff: ``b_from``, ``b_to``, ``pass_ms_from``, ``pass_ms_to``, ``kind``.

    Source:
        docs/model.md section 1 step 4 (SPS(B) is jagged, with cliffs); the thresholds are the
        study report's (memtp_sim.report.numbers.cliffs).
    """
    b = np.asarray(batch_tokens, dtype=np.float64)
    t = np.asarray(pass_ms, dtype=np.float64)
    t = np.where(t > 0, t, np.nan)  # a pass time not above 0 (a broken summary) makes no cliff
    rows = []
    for i in range(1, b.size):
        kind = ("rate_drop" if b[i] / t[i] < b[i - 1] / t[i - 1] * CLIFF_RATE_DROP
                else "pass_jump" if t[i] / t[i - 1] > CLIFF_PASS_JUMP and b[i] <= b[i - 1] * CLIFF_MAX_SPAN
                else None)
        if kind:
            rows.append((int(b[i - 1]), int(b[i]), float(t[i - 1]), float(t[i]), kind))
    return pd.DataFrame(rows, columns=["b_from", "b_to", "pass_ms_from", "pass_ms_to", "kind"])


def cliff_errors(tables_by_curve: Mapping[str, SPSTable], loo: pd.DataFrame) -> pd.DataFrame:
    """Every measured cliff of every curve, named, with the LOO error of the points on each side.

    Args:
        tables_by_curve: :func:`profile_curves`.
        loo: :func:`leave_one_out` of those curves.

    Returns:
        One row per cliff: ``curve``, ``cliff`` (e.g. ``"verify B=8->16"``), ``kind``,
        ``b_from``, ``b_to``, ``pass_ms_from``, ``pass_ms_to``, ``jump`` (pass-time ratio),
        ``loo_error_from``, ``loo_error_to`` (signed fractions; NaN when refused),
        ``worst_abs_error``.
    """
    rows = []
    for curve, table in tables_by_curve.items():
        err = loo[loo["curve"] == curve].set_index("batch_tokens")["rel_error"]
        for c in find_cliffs(table.batch_tokens, table.pass_ms).itertuples():
            e0, e1 = float(err.get(c.b_from, np.nan)), float(err.get(c.b_to, np.nan))
            worst = np.nanmax(np.abs([e0, e1])) if np.isfinite([e0, e1]).any() else float("nan")
            rows.append((curve, f"{curve} B={c.b_from}->{c.b_to}", c.kind, c.b_from, c.b_to, c.pass_ms_from,
                         c.pass_ms_to, c.pass_ms_to / c.pass_ms_from, e0, e1, float(worst)))
    return pd.DataFrame(rows, columns=_CLIFF_COLUMNS)


def _read_doc(profile: HardwareProfile) -> dict[str, Any]:
    return read_yaml(profile.path, error=CalibrationError, what="a profile mapping")


def context_pairs(profile: HardwareProfile) -> pd.DataFrame:
    """Measured vs modelled context deltas of a format-2 profile, per shape and curve.

    Rebuilds each curve from the cost table exactly as the profile loader does
    (:func:`memtp_sim.hardware.profile._curve`) to get its :class:`~.tables.CurveFit`.

    Args:
        profile: a loaded profile.

    Returns:
        One row per shape (R requests x v tokens) measured at two contexts: ``curve``,
        ``num_requests``, ``tokens_per_request``, ``context_from``, ``context_to`` (tokens),
        ``measured_delta_ms``, ``modelled_delta_ms`` (the attention roofline's), ``error_ms``
        (modelled - measured), ``rel_error`` (over the measured delta; NaN when it is 0). Empty
        for a format-1 profile (no context is measured) or a curve without pairs.

    Source:
        :meth:`memtp_sim.hardware.tables.CurveFit.pair_errors` (issue 10 item 2: cost grows with the
        KV context read).
    """
    doc = _read_doc(profile)
    if "costs" not in doc:
        return pd.DataFrame(columns=_PAIR_COLUMNS)
    csv_path = Path(profile.path).parent / str(doc["costs"])
    base = tables.select_rows(tables.read_cost_table(csv_path), doc.get("select") or {}, profile.path)
    rows = []
    for name in CURVES:
        if doc.get(name) is None:
            continue
        fit = _curve(base, doc[name], name, profile.path, (), 1.0)  # the loader's own rules: same curve
        for (req, v, dm, mm), pair in zip(fit.pair_errors(), fit.pairs):
            rows.append((name, req, v, pair[2], pair[4], dm, mm, mm - dm, (mm - dm) / dm if dm else float("nan")))
    return pd.DataFrame(rows, columns=_PAIR_COLUMNS)


def check_profile(profile: HardwareProfile) -> Fidelity:
    """LOO, cliffs and context pairs of one profile (the numbers of ``calibrate check``).

    Args:
        profile: a loaded profile.

    Returns:
        :class:`Fidelity`.

    Raises:
        CalibrationError: the profile's YAML or cost table cannot be read again.
    """
    curves = profile_curves(profile)
    notes = []
    if len(curves) == 1:
        notes.append("This profile prices every pass (verify, decode, prefill chunks) with one measured curve; "
                     "only that curve is checked.")
    loo = pd.concat([leave_one_out(t, name) for name, t in curves.items()], ignore_index=True)
    for name, t in curves.items():
        if t.batch_tokens.size < 3:
            notes.append(f"{name}: {t.batch_tokens.size} measured point(s); leave-one-out needs at least 3 to "
                         "predict an interior point.")
    return Fidelity(profile.name, profile.path, loo, loo_summary(loo), cliff_errors(curves, loo),
                    context_pairs(profile), notes)


# ------------------------------------------------------------------------------ cost-table variants

def flat_pass_ms(profile: HardwareProfile) -> float:
    """The pass time a flat table prices every pass at: the smallest measured decode pass.

    That is the decode curve's (the verify curve's when decode is not measured apart) first
    point as the table stores it: the measured B=1 pass at context 0 for the shipped profiles.
    Pricing every B at B=1's time is the back-of-envelope assumption that verifying k draft tokens
    costs one decode step; it keeps single-stream decode right, so what a flat table changes is
    only how cost grows with B (a median-priced table would also slow every decode step several
    fold: 113 ms against 23.8 ms on the gfx1151 Llama curve).

    Args:
        profile: a loaded profile.

    Returns:
        Milliseconds.
    """
    return float(profile.decode_table.pass_ms[0])


def variant_tag(factor: float | None) -> str:
    """``"flat"`` for None, else ``"x1.10"``-style (two decimals)."""
    return "flat" if factor is None else f"x{factor:.2f}"


def _csv_text(fieldnames: list[str], rows: list[dict[str, str]]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fieldnames, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def _new_ms(text: str, factor: float | None, flat_ms: float) -> str:
    if text == "":
        return text
    return repr(flat_ms) if factor is None else repr(float(text) * factor)


def _read_csv_rows(csv_path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with csv_path.open(newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


def _format2_rows(csv_path: Path, doc: Mapping[str, Any], factor: float | None, flat_ms: float, label: str,
                  where: str) -> tuple[str, dict[str, Any]]:
    """A format-2 cost table with every pass row (verify, decode, prefill) scaled or flattened, and
    the profile's drafters frozen: each drafter's rows, as the original profile selects them, copied
    unchanged under ``kind: draft_<kind>`` and a model label of their own, and the drafter's select
    pointed at the copies. (An imported profile without measured drafter passes prices its
    drafter from the verify rows; scaling those would move the drafter too.) Returns the CSV text
    and the new ``drafters`` section."""
    fields, rows = _read_csv_rows(csv_path)
    table = tables.read_cost_table(csv_path)  # df row i is CSV row i (read_cost_table keeps the order)
    common = doc.get("select") or {}
    copies: list[dict[str, str]] = []
    drafters: dict[str, Any] = {}
    for key, sec in (doc.get("drafters") or {}).items():
        picked = tables.select_rows(table, {**common, **(sec.get("select") or {})}, f"{where}: drafters.{key}")
        kind, model = f"draft_{sec['kind']}", f"{label}~drafter~{key}"
        copies += [{**rows[i], "kind": kind, "model": model} for i in picked.index]
        drafters[key] = {**sec, "select": {"kind": kind, "model": model}}
    for r in rows:
        if r.get("kind") in PASS_KINDS:
            for col in ("pass_ms", "p10_ms", "p90_ms"):
                if col in r:
                    r[col] = _new_ms(r[col], factor, flat_ms)
    return _csv_text(fields, rows + copies), drafters


#: Format-1 variants: a column that keeps the drafter's frozen copies out of ``verify.select``.
ROLE_COLUMN = "memtp_variant_role"


def _format1_rows(csv_path: Path, doc: Mapping[str, Any], factor: float | None, flat_ms: float,
                  where: str) -> tuple[str, dict[str, Any]]:
    """A format-1 measurements CSV with the verify rows scaled or flattened and the drafter frozen.

    The drafter's ``parallel_select`` rows are copied unchanged with :data:`ROLE_COLUMN` set to
    ``frozen_drafter`` (every other row has it empty), and the returned ``verify`` and
    ``drafter`` sections select by that column, so a drafter measured on rows the verify curve
    also uses keeps its original cost. Returns the CSV text and the changed sections."""
    fields, rows = _read_csv_rows(csv_path)
    verify, drafter = dict(doc.get("verify") or {}), dict(doc.get("drafter") or {})
    copies: list[dict[str, str]] = []
    if ROLE_COLUMN not in fields:  # a variant of a variant has its frozen copies already
        fields.append(ROLE_COLUMN)
        for r in rows:
            r[ROLE_COLUMN] = ""
        copies = [{**r, ROLE_COLUMN: "frozen_drafter"}
                  for r in _select_rows(rows, drafter.get("parallel_select") or {}, where)]
        verify["select"] = {**(verify.get("select") or {}), ROLE_COLUMN: ""}
        drafter["parallel_select"] = {**(drafter.get("parallel_select") or {}), ROLE_COLUMN: "frozen_drafter"}
    for i, r in enumerate(rows):
        r["_row"] = str(i)
    picked = {r["_row"] for r in _select_rows(rows, verify.get("select") or {}, where)}
    for r in rows:
        if r["_row"] in picked:
            r["derived_pass_ms"] = _new_ms(r["derived_pass_ms"], factor, flat_ms)
            b = float(r["tokens_per_pass_B"])
            r["tokens_per_s"] = repr(b * 1000.0 / float(r["derived_pass_ms"]))
        del r["_row"]
    return _csv_text(fields, rows + copies), {"verify": verify, "drafter": drafter}


def _variant_context(section: Mapping[str, Any], factor: float | None) -> dict[str, Any]:
    """A curve section whose stated context slope (``context: {ms_per_kv_token: x}``) follows the
    variant: scaled by ``factor``, or dropped (``context: none``) for the flat table. A fitted
    context (``fit``) needs nothing: it is fitted on the rows, which the variant already changed."""
    ctx = section.get("context")
    if not isinstance(ctx, Mapping):
        return dict(section)
    if factor is None:
        return {**section, "context": "none"}
    slope = ctx.get("ms_per_kv_token")
    scaled = slope * factor if isinstance(slope, (int, float)) and not isinstance(slope, bool) else slope
    return {**section, "context": {**ctx, "ms_per_kv_token": scaled}}


def write_variant(profile: HardwareProfile, out_dir: str | Path, *, factor: float | None) -> Path:
    """Write a copy of ``profile`` whose pass curves are scaled by ``factor`` (None: flat).

    Format 2 (``costs:``): every ``verify``, ``decode`` and ``prefill`` row of the cost table
    has ``pass_ms`` (and ``p10_ms``/``p90_ms``) multiplied by ``factor``; the attention roofline is
    fitted on differences of those rows, so it scales too and every pass, at every B and context,
    costs exactly ``factor`` times as much (a stated slope, ``context: {ms_per_kv_token: x}``, is
    scaled with them). Flat: every such row is set to :func:`flat_pass_ms` and the context term is
    dropped (a fit on equal rows is zero; a stated slope becomes ``context: none``), so every pass
    costs the same. Format 1 (``measurements:``): the
    rows ``verify.select`` picks get the same treatment. Drafter costs are frozen (their rows
    copied unchanged and re-selected, see :func:`_format2_rows` and :func:`_format1_rows`: an
    imported profile prices an assumed drafter from the verify rows), and host and planner
    overheads, memory and graph padding are kept, so only the pass curves differ.

    Args:
        profile: a loaded profile.
        out_dir: folder to write ``<stem>.yaml`` and its CSV into (created; files replaced
            atomically).
        factor: pass-time multiplier (> 0), or None for the flat table.

    Returns:
        The written profile YAML; :func:`memtp_sim.hardware.load_profile` reads it by path, and a
        Scenario's ``hardware.profile`` may name it.

    Raises:
        CalibrationError: a profile that is neither format 1 nor format 2, or unreadable files.
        InvalidArgumentError: ``factor`` not a finite number > 0.
    """
    if factor is not None and not (math.isfinite(factor) and factor > 0):
        raise InvalidArgumentError(f"factor: {factor!r} is not a finite number > 0")
    doc = _read_doc(profile)
    src = Path(profile.path)
    tag = variant_tag(factor)
    flat_ms = flat_pass_ms(profile)
    out = Path(out_dir)
    if "costs" in doc:
        key, name = "costs", f"costs-{tag}.csv"
        text, drafters = _format2_rows(src.parent / str(doc["costs"]), doc, factor, flat_ms,
                                       f"{profile.name}~{tag}", profile.path)
        doc = {**doc, "drafters": drafters} if drafters else doc
    elif "measurements" in doc:
        key, name = "measurements", f"measurements-{tag}.csv"
        text, sections = _format1_rows(src.parent / str(doc["measurements"]), doc, factor, flat_ms, profile.path)
        doc = {**doc, **sections}
    else:
        raise CalibrationError(f"{profile.path}: neither 'costs' (format 2) nor 'measurements' (format 1); "
                               "cannot write a cost-table variant")
    atomic_write_text(out / name, text)
    curves = {c: _variant_context(doc[c], factor) for c in CURVES if isinstance(doc.get(c), Mapping)}
    what = (f"every pass at {flat_ms:.4g} ms (the smallest measured pass)" if factor is None
            else f"every pass curve x{factor:g}")
    new = {**doc, **curves, key: name, "name": f"{profile.name}~{tag}",
           "description": f"calibrate check variant of {profile.name} ({profile.path}): {what}."}
    yml = out / f"{src.stem}-{tag}.yaml"
    atomic_write_text(yml, f"# written by memtp_sim calibrate check: {what}\n" +
                      yaml.safe_dump(new, sort_keys=False, allow_unicode=True))
    return yml

"""Hardware profiles: load a named, sourced profile (verify cost, drafter cost, memory).

A profile is a YAML file under ``calibration/<chip>/`` that selects rows of a measurements CSV
(copied from public llama-bench results, each row naming its source URL) and states the memory
figures of the machine and model, each with its source. Nothing in a profile is fitted or smoothed:
SPS(B) is the measured table, and values between measured batch sizes follow one documented rule.

The lookup rule between measured points is documented in :mod:`memtp_sim.hardware.cost`.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import yaml

from .._io import ANY_KEY, check_keys, load_yaml, not_a_file, yaml_error_text
from ..errors import CalibrationError
from .cost import BELOW_MIN_RULES, BEYOND_MAX_RULES, DrafterCost, Overheads, SPSTable
from . import tables
from .memory import GIB, MemorySpec

__all__ = [
    "HardwareProfile",
    "DEFAULT_PROFILE",
    "calibration_dir",
    "list_profiles",
    "load_profile",
    "profile_catalog",
    "profile_files",
]

DEFAULT_PROFILE = "gfx1151-llama31-8b-q4km-vulkan"


@dataclass(frozen=True)
class HardwareProfile:
    """A named, sourced hardware profile (see module docstring)."""

    name: str
    description: str
    chip: str
    sps: SPSTable
    drafter: DrafterCost
    memory: MemorySpec
    path: str
    sources: dict[str, str] = field(default_factory=dict)
    caveats: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()  # plausibility notes on the measurements (hardware.profile.check_curve)
    decode: SPSTable | None = None  # passes with no draft token (v = 1), when measured apart from verify
    prefill: SPSTable | None = None  # prompt passes (one request), when measured apart from verify
    overheads: Overheads = field(default_factory=Overheads)
    drafters: dict[str, Any] = field(default_factory=dict)  # drafter kind -> cost (the default is `drafter`)
    model: str = ""
    engine: str = ""
    build: str = ""

    @property
    def decode_table(self) -> SPSTable:
        """Pass time when no draft token is verified (the verify table when not measured apart)."""
        return self.decode if self.decode is not None else self.sps

    @property
    def prefill_table(self) -> SPSTable:
        """Pass time of a prompt chunk (the verify table when not measured apart)."""
        return self.prefill if self.prefill is not None else self.sps

    def summary(self) -> dict[str, Any]:
        """JSON-ready description for run outputs."""
        return {
            "name": self.name,
            "path": self.path,
            "chip": self.chip,
            "model": self.model,
            "engine": self.engine,
            "build": self.build,
            "sps": self.sps.as_dict(),
            "decode": self.decode.as_dict() if self.decode is not None else None,
            "prefill": self.prefill.as_dict() if self.prefill is not None else None,
            "overheads": {"host_ms": self.overheads.host_s * 1e3, "planner_ms": self.overheads.planner_s * 1e3,
                          "sources": self.overheads.sources or {}},
            "memory": {
                "gpu_allocatable_gib": self.memory.gpu_allocatable_gib,
                "weights_gib": round(self.memory.weights_gib, 4),
                "drafter_weights_gib": self.memory.drafter_weights_gib,
                "reserve_gib": self.memory.reserve_gib,
                "kv_bytes_per_token": self.memory.kv_bytes_per_token,
                "kv_block_tokens": self.memory.kv_block_tokens,
                "max_model_len": self.memory.max_model_len,
            },
            "drafter": _drafter_summary(self.drafter),
            "drafters": {k: _drafter_summary(v) for k, v in self.drafters.items()},
            "sources": self.sources,
            "caveats": list(self.caveats),
            "warnings": list(self.warnings),
        }


def _drafter_summary(d: Any) -> dict[str, Any]:
    if isinstance(d, DrafterCost):
        return {"kind": "roofline", "t_small_ms": d.t_small_s * 1e3, "large_b": d.large_b,
                "t_large_ms": d.t_large_s * 1e3, "time_scale": d.time_scale, "t_seq_ms": d.t_seq_s * 1e3,
                "weights_gib": d.weights_gib, "source": d.source}
    return {"kind": d.kind, "x": d.x.tolist(), "ms": [round(float(v), 4) for v in d.ms], "t_seq_ms": d.t_seq_s * 1e3,
            "time_scale": d.time_scale, "weights_gib": d.weights_gib, "source": d.source}


def calibration_dir() -> Path:
    """Folder holding the shipped calibration profiles.

    Looks in the installed wheel first (``memtp_sim/_calibration``), then in the source tree
    (``<repo>/calibration``) for editable installs; found once per process (every run's acceptance
    profile is looked up under it, and finding it costs a few file system calls).

    Raises:
        CalibrationError: neither exists.
    """
    return _calibration_dir()


@lru_cache(maxsize=1)  # an error is not cached: raised again on the next call
def _calibration_dir() -> Path:
    try:
        packaged = Path(str(resources.files("memtp_sim") / "_calibration"))
        if packaged.is_dir():
            return packaged
    except (ModuleNotFoundError, TypeError):  # pragma: no cover - odd loaders
        pass
    repo = Path(__file__).resolve().parent.parent.parent / "calibration"
    if repo.is_dir():
        return repo
    raise CalibrationError("calibration folder not found (neither memtp_sim/_calibration nor <repo>/calibration)")


def list_profiles() -> dict[str, Path]:
    """Shipped profiles by name -> YAML path (cached by the files' paths, modification times and
    sizes). A name that two files give is left out: :func:`profile_catalog` lists those, and
    loading the name says which files clash."""
    return profile_catalog()[0]


def profile_catalog() -> tuple[dict[str, Path], dict[str, list[Path]], dict[Path, str]]:
    """Every profile under :func:`calibration_dir`, and what keeps a file from being one.

    Returns:
        ``(profiles, clashes, unreadable)``: name -> YAML path for names exactly one file gives;
        name -> the files for a name two or more files give (none of them is used by that name:
        the order files are found in must not pick the table a study runs on); path -> why a YAML
        there could not be read (not valid YAML, not text).
    """
    files = sorted(calibration_dir().glob("*/*.yaml"))
    found, unreadable = _list_profiles(tuple((str(p), *_stat_key(p)) for p in files))
    by_name: dict[str, list[Path]] = {}
    for name, path in found:
        by_name.setdefault(name, []).append(path)
    profiles = {n: ps[0] for n, ps in by_name.items() if len(ps) == 1}
    clashes = {n: ps for n, ps in by_name.items() if len(ps) > 1}
    return profiles, clashes, dict(unreadable)


@lru_cache(maxsize=4)
def _list_profiles(files: tuple) -> tuple[tuple[tuple[str, Path], ...], tuple[tuple[Path, str], ...]]:
    # a study validates hundreds of scenarios: resolving and matching every file each time cost 2 ms
    out: list[tuple[str, Path]] = []
    unreadable: list[tuple[Path, str]] = []
    for p in (Path(f[0]) for f in files):
        try:
            doc = _read_profile_doc(str(p.resolve()), *_stat_key(p))
        except (OSError, CalibrationError, UnicodeDecodeError) as e:
            unreadable.append((p, str(e)))
            continue
        if isinstance(doc, dict) and "name" in doc and "verify" in doc and ("measurements" in doc or "costs" in doc):
            try:
                _check_profile_keys(doc, str(p))
            except CalibrationError as e:
                unreadable.append((p, str(e)))
                continue
            out.append((str(doc["name"]), p))
    return tuple(out), tuple(unreadable)


def _select_rows(rows: list[dict[str, str]], select: Mapping[str, Any], where: str) -> list[dict[str, str]]:
    def match(row: dict[str, str], key: str, want: Any) -> bool:
        if key not in row:
            raise CalibrationError(f"{where}: unknown measurements column {key!r}")
        have = row[key]
        if isinstance(want, (int, float)) and not isinstance(want, bool):
            try:
                return float(have) == float(want)
            except ValueError:
                return False
        return have == str(want)

    return [r for r in rows if all(match(r, k, v) for k, v in select.items())]


def _read_measurements(path: Path) -> list[dict[str, str]]:
    """Rows of a measurements CSV; each row also carries ``_row``, its line number in the file."""
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    for i, r in enumerate(rows):
        r["_row"] = str(i + 2)  # line 1 is the header
    return rows


def _cell(row: dict[str, str], column: str, csv_path: Path, *, kind: type = float, positive: bool = True) -> Any:
    """One numeric cell; a bad one is an error naming the file, row and column."""
    text = row.get(column)
    try:
        value = kind(float(text)) if kind is int else float(text)  # type: ignore[arg-type]
        ok = math.isfinite(value) and (value > 0 if positive else value >= 0)
        if kind is int and float(text) != int(float(text)):  # type: ignore[arg-type]
            ok = False
    except (TypeError, ValueError):
        ok, value = False, None
    if not ok:
        what = "a whole number" if kind is int else "a number"
        raise CalibrationError(f"{csv_path}: row {row.get('_row', '?')}, column {column}: {text!r} is not "
                               f"{what} {'> 0' if positive else '>= 0'}")
    return value


def _field(d: Mapping[str, Any], key: str, where: str, *, kind: type = float, minimum: float = 0.0,
           strict: bool = True, default: Any = None) -> Any:
    """A numeric YAML field, checked: the right kind (no bool, no text, no fraction for counts) and
    above ``minimum`` (``>`` if ``strict`` else ``>=``)."""
    if key not in d:
        if default is None:
            raise CalibrationError(f"{where}: missing field {key!r}")
        return default
    v = d[key]
    good = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if good and kind is int:
        good = float(v) == int(v)
    if good:
        good = v > minimum if strict else v >= minimum
    if not good:
        what = "a whole number" if kind is int else "a number"
        raise CalibrationError(f"{where}.{key}: {v!r} is not {what} {'>' if strict else '>='} {minimum:g}")
    return kind(v)


#: A measured pass may be at most this many times faster than the slowest at any smaller measured
#: B (not only the next one: 2x faster at each of four doublings is 16x, as implausible as one 16x
#: step). Real curves do fall (a kernel switch): the largest fall in the shipped gfx1151 collection is
#: 2.4x (Hunyuan-A13B, llama.cpp HIP, B = 32 -> 64); a 10x fall is a typo.
MAX_PASS_TIME_FALL = 3.0
#: Falls above this are kept but reported as a warning in every run's report.
WARN_PASS_TIME_FALL = 1.5
#: A pass may be at most this factor times ``B_next / B_prev`` slower than the one before (compute
#: bound growth is ~linear in B; measured cliffs, e.g. 5x for 2x B on HIP, stay below 8x).
MAX_PASS_TIME_RISE_PER_B = 4.0


def check_curve(batch_tokens: np.ndarray, pass_ms: np.ndarray, *, where: str,
                rows: list[str] | None = None, column: str = "derived_pass_ms") -> list[str]:
    """Physical plausibility of a measured pass-time curve (sorted by B).

    Args:
        batch_tokens: measured B, shape (n,), increasing.
        pass_ms: pass time at each B, shape (n,), ms.
        where: the file, for messages.
        rows: the file row of each point (for messages), or None.
        column: the column the times came from.

    Returns:
        Warnings (one line each) for falls above :data:`WARN_PASS_TIME_FALL`.

    Raises:
        CalibrationError: a B that is not a whole number >= 1 above the one before, a pass time
            that is not a finite number > 0, a fall above :data:`MAX_PASS_TIME_FALL` or a rise
            above :data:`MAX_PASS_TIME_RISE_PER_B` times the growth of B, naming file, row and column.
    """
    # Python floats: the ratios below overflow to inf on absurd input (1e-320 ms) without numpy's warning
    b = np.asarray(batch_tokens, dtype=np.float64).ravel().tolist()
    t = np.asarray(pass_ms, dtype=np.float64).ravel().tolist()
    if len(b) != len(t):
        raise CalibrationError(f"{where}: {len(b)} batch sizes for {len(t)} pass times")

    def loc(i: int, col: str) -> str:
        return f"{where}: row {rows[i]}, column {col}" if rows else f"{where}: B={b[i]:g}"

    for i, (bi, ti) in enumerate(zip(b, t)):  # validated before any ratio is taken
        if not (math.isfinite(bi) and bi >= 1 and bi == int(bi)):
            raise CalibrationError(f"{loc(i, 'batch_tokens')}: batch size {bi:g} is not a whole number >= 1")
        if i and bi <= b[i - 1]:
            raise CalibrationError(f"{loc(i, 'batch_tokens')}: batch size {bi:g} does not follow {b[i - 1]:g} "
                                   "(the curve's B increase)")
        if not (math.isfinite(ti) and ti > 0):
            raise CalibrationError(f"{loc(i, column)}: pass time {ti!r} ms is not a finite number > 0")
    warnings: list[str] = []
    slowest = 0  # index of the slowest pass so far: falls are measured from it
    for i in range(1, len(b)):
        loc_i = loc(i, column) if rows else f"{where}: B={int(b[i])}"
        if t[i - 1] > t[slowest]:
            slowest = i - 1
        fall, rise = t[slowest] / t[i], t[i] / t[i - 1]
        if fall > MAX_PASS_TIME_FALL:
            raise CalibrationError(
                f"{loc_i}: {t[i]:g} ms at B={int(b[i])} is {fall:.1f}x faster than {t[slowest]:g} ms at "
                f"B={int(b[slowest])}; a larger batch is at most {MAX_PASS_TIME_FALL:g}x faster in real curves "
                "(check for a typo)")
        if rise > MAX_PASS_TIME_RISE_PER_B * b[i] / b[i - 1]:
            raise CalibrationError(
                f"{loc_i}: {t[i]:g} ms at B={int(b[i])} is {rise:.1f}x slower than {t[i - 1]:g} ms at B={int(b[i - 1])}; "
                f"at most {MAX_PASS_TIME_RISE_PER_B:g} x the growth of B is plausible (check for a typo)")
        if fall > WARN_PASS_TIME_FALL:
            warnings.append(f"{loc_i}: pass time falls {fall:.1f}x from B={int(b[slowest])} to B={int(b[i])} "
                            f"({t[slowest]:g} -> {t[i]:g} ms); kept as measured")
    return warnings


#: The most KV blocks a profile's memory may hold: runs log block counts as int32
#: (:data:`memtp_sim.engine.ROUND_DTYPES`); 2^31 blocks of 16 tokens are 34 billion tokens of context.
MAX_KV_BLOCKS = 2**31 - 1


def _require(d: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in d:
        raise CalibrationError(f"{where}: missing field {key!r}")
    return d[key]


# profile name -> (its YAML, that file's stat key when the name was resolved); a changed file
# (edited, perhaps renamed inside) sends the name through list_profiles again
_PROFILE_BY_NAME: dict[str, tuple[Path, tuple[int, int]]] = {}


def _resolve_profile_path(name_or_path: str | Path | None) -> Path:
    key = DEFAULT_PROFILE if name_or_path is None else str(name_or_path)
    path = Path(key)
    if not (path.suffix in (".yaml", ".yml") or path.exists()):
        hit = _PROFILE_BY_NAME.get(key)
        try:
            fresh = hit is not None and _stat_key(hit[0]) == hit[1]
        except OSError:
            fresh = False
        if fresh:
            path = hit[0]  # the file the name led to, unchanged since (a study resolves a name per scenario)
        else:
            profiles, clashes, _ = profile_catalog()
            if key in clashes:
                raise CalibrationError(f"hardware profile {key!r} is the name of {len(clashes[key])} files: "
                                       f"{', '.join(map(str, clashes[key]))}; rename all but one (their name: "
                                       "field) or give the profile by its path")
            if key not in profiles:
                raise CalibrationError(
                    f"hardware profile {key!r} not found; shipped profiles: {', '.join(sorted(profiles))} "
                    "(or give a path to a profile YAML)"
                )
            path = profiles[key]
            _PROFILE_BY_NAME[key] = (path, _stat_key(path))
    why = not_a_file(path, "hardware profile file")
    if why is not None:
        raise CalibrationError(why)
    return path


def load_profile(name_or_path: str | Path | None = None) -> HardwareProfile:
    """Load a hardware profile by shipped name or YAML path (``None`` = the default profile).

    Profiles are cached by path and by the modification time and size of the YAML and its
    measurements file, so a study that validates hundreds of scenarios parses each file once and
    an edited file is read again.

    Raises:
        CalibrationError: unknown name, missing file, missing or malformed field, an implausible
            measured curve, or a memory budget that leaves no room for KV (one line: file, field,
            and for measurement cells row and column).
    """
    path, csv_path, format2 = _profile_source(name_or_path)
    build = _build_profile_v2 if format2 else _build_profile  # format 2: a memtp cost table
    return build(str(path), _stat_key(path), str(csv_path), _stat_key(csv_path))


def profile_files(name_or_path: str | Path | None = None) -> tuple[Path, Path]:
    """The files a hardware profile is read from: its YAML and the measured data behind it (the
    ``costs:`` cost table of format 2, the ``measurements:`` CSV of format 1). Every reader of a
    profile's inputs (the loader, a study's resume fingerprint) asks here, so none misses one.

    Args:
        name_or_path: a shipped profile name or a YAML path (``None`` = the default profile).

    Returns:
        (the profile YAML, its data CSV), both resolved.

    Raises:
        CalibrationError: unknown name, a missing or unreadable YAML, or a data file that is not
            there (naming the YAML and its field).
    """
    path, csv_path, _ = _profile_source(name_or_path)
    return path, csv_path


def _profile_source(name_or_path: str | Path | None) -> tuple[Path, Path, bool]:
    """:func:`profile_files`, and whether the profile is format 2 (a ``costs:`` table)."""
    path = _resolve_profile_path(name_or_path).resolve()
    doc = _checked_profile_doc(str(path), *_stat_key(path))
    format2 = "costs" in doc
    key, what = ("costs", "cost table") if format2 else ("measurements", "measurements file")
    csv_path = path.parent / str(_require(doc, key, str(path)))
    why = not_a_file(csv_path, what)
    if why is not None:
        raise CalibrationError(f"{path}: {key}: {why}")
    return path, csv_path, format2


def _stat_key(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_mtime_ns, st.st_size


#: The keys a profile may hold, by section (:func:`memtp_sim._io.check_keys`): what the readers
#: below read, and the ``*_source`` and note fields that document them. A ``select`` filters the
#: measured rows by column (each reader checks the columns).
_FREE = {ANY_KEY: None}
_MEMORY_KEYS: dict[str, Any] = dict.fromkeys(
    ("gpu_allocatable_gib", "gpu_allocatable_source", "weights_bytes", "weights_source", "reserve_gib",
     "reserve_source", "kv_bytes_per_token", "kv_source", "kv_block_tokens", "kv_block_tokens_source", "max_model_len",
     "max_model_len_source"))
_PROFILE_KEYS_V1: dict[str, Any] = {
    **dict.fromkeys(("name", "description", "chip", "model", "engine", "build", "format", "measurements")),
    "verify": {"select": _FREE, "lookup": None, "beyond_max": None, "below_min": None, "caveats": None},
    "memory": _MEMORY_KEYS,
    "drafter": {"parallel_select": _FREE, "parallel_tests": dict.fromkeys(("small", "large")),
                **dict.fromkeys(("parallel_time_scale", "parallel_mapping_note", "seq_head_rank", "seq_head_vocab",
                                 "seq_head_bytes_per_param", "mem_bandwidth_gb_s", "mem_bandwidth_source",
                                 "weights_gib", "weights_source", "kv_bytes_per_token", "kv_source"))},
}
_CURVE_KEYS: dict[str, Any] = {"select": _FREE, "context": {"ms_per_kv_token": None, "source": None},
                               **dict.fromkeys(("reference_context", "tokens_per_request", "below_min", "beyond_max"))}
_PROFILE_KEYS_V2: dict[str, Any] = {
    **dict.fromkeys(("name", "description", "chip", "model", "engine", "build", "format", "costs", "caveats",
                     "default_drafter")),
    "select": _FREE, "verify": _CURVE_KEYS, "decode": _CURVE_KEYS, "prefill": _CURVE_KEYS, "memory": _MEMORY_KEYS,
    "drafters": {ANY_KEY: {"select": _FREE, "sequential_head": dict.fromkeys(("rank", "vocab", "bytes_per_param",
                                                                              "mem_bandwidth_gb_s")),
                           **dict.fromkeys(("kind", "sequential_head_source", "weights_gib", "weights_source",
                                            "time_scale", "kv_bytes_per_token", "kv_source", "note"))}},
    "overheads": dict.fromkeys(("host_ms_per_round", "host_source", "planner_ms_per_round", "planner_source",
                                "graph_sizes", "graph_source", "eager_factor")),
}


@lru_cache(maxsize=64)
def _read_profile_doc(path_s: str, mtime_ns: int, size: int) -> dict[str, Any]:  # stat in the key: edits reload
    try:
        doc = load_yaml(Path(path_s).read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise CalibrationError(f"{path_s}: {yaml_error_text(e)}") from None
    except UnicodeDecodeError:
        raise CalibrationError(f"{path_s}: not a UTF-8 text file (a hardware profile is YAML text)") from None
    if not isinstance(doc, dict):
        raise CalibrationError(f"{path_s}: expected a mapping at the top level")
    return doc


def _check_profile_keys(doc: dict[str, Any], path_s: str) -> None:
    """Refuse a key a profile of its format does not know (a misspelled optional key would be read
    as absent and its default used): one line naming the file, the key's path and what is allowed."""
    check_keys(doc, _PROFILE_KEYS_V2 if "costs" in doc else _PROFILE_KEYS_V1, path_s, error=CalibrationError)


@lru_cache(maxsize=64)
def _checked_profile_doc(path_s: str, mtime_ns: int, size: int) -> dict[str, Any]:
    """:func:`_read_profile_doc` of a file that must be a profile, its keys checked once a version."""
    doc = _read_profile_doc(path_s, mtime_ns, size)
    _check_profile_keys(doc, path_s)
    return doc


@lru_cache(maxsize=32)
def _build_profile(path_s: str, yaml_stat: tuple[int, int], csv_s: str, csv_stat: tuple[int, int]) -> HardwareProfile:
    path, csv_path = Path(path_s), Path(csv_s)
    where = path_s
    doc = _read_profile_doc(path_s, *yaml_stat)
    rows = _read_measurements(csv_path)
    verify = _require(doc, "verify", where)
    sps, warnings = _load_verify(rows, verify, csv_path, where)
    mem = _require(doc, "memory", where)
    memory = _load_memory(mem, _require(doc, "drafter", where), where)
    dr = _require(doc, "drafter", where)
    drafter = _load_drafter(rows, dr, memory, csv_path, where)
    sources = {
        "verify": sps.source,
        "gpu_allocatable": str(mem.get("gpu_allocatable_source", "")),
        "weights": str(mem.get("weights_source", "")),
        "kv": str(mem.get("kv_source", "")),
        "reserve": str(mem.get("reserve_source", "")),
        "drafter_parallel": drafter.source + "; " + " ".join(str(dr.get("parallel_mapping_note", "")).split()),
        "drafter_seq": str(dr.get("mem_bandwidth_source", "")),
    }
    return HardwareProfile(
        name=str(_require(doc, "name", where)),
        description=" ".join(str(doc.get("description", "")).split()),
        chip=str(doc.get("chip", "")),
        sps=sps,
        drafter=drafter,
        memory=memory,
        path=str(path),
        sources=sources,
        caveats=tuple(verify.get("caveats", ())),
        warnings=tuple(warnings),
    )


def _load_verify(rows: list[dict[str, str]], verify: Mapping[str, Any], csv_path: Path,
                 where: str) -> tuple[SPSTable, list[str]]:
    """The verify-cost table from the rows ``verify.select`` picks (one complete measured curve)."""
    sel = _select_rows(rows, _require(verify, "select", f"{where}: verify"), f"{where}: verify.select")
    if not sel:
        raise CalibrationError(f"{where}: verify.select matches no row of {csv_path.name}")
    by_b: dict[int, dict[str, str]] = {}
    for r in sel:
        b = _cell(r, "tokens_per_pass_B", csv_path, kind=int)
        if b in by_b:
            raise CalibrationError(f"{where}: verify.select matches two rows for B={b}; narrow the selection")
        by_b[b] = r
    if verify.get("lookup", "linear_pass_time") != "linear_pass_time":
        raise CalibrationError(f"{where}: verify.lookup: only 'linear_pass_time' is supported")
    bs = sorted(by_b)
    src_urls = sorted({by_b[b]["source_url_or_repo_path"] for b in bs})
    times = np.array([_cell(by_b[b], "derived_pass_ms", csv_path) for b in bs])
    warnings = check_curve(np.array(bs), times, where=str(csv_path), rows=[by_b[b]["_row"] for b in bs])
    table = SPSTable(
        np.array(bs),
        times,
        source=f"{csv_path.name} rows {verify['select'].get('model', '')} ({'; '.join(src_urls)})",
        beyond_max=_rule(verify, "beyond_max", BEYOND_MAX_RULES, where),
        below_min=_rule(verify, "below_min", BELOW_MIN_RULES, where),
    )
    return table, warnings


def _rule(section: Mapping[str, Any], key: str, allowed: tuple[str, ...], where: str) -> str:
    v = section.get(key, "error")
    if v not in allowed:
        raise CalibrationError(f"{where}: {key}: {v!r}; allowed: {', '.join(allowed)}")
    return str(v)


def _load_memory(mem: Mapping[str, Any], dr: Mapping[str, Any], where: str) -> MemorySpec:
    """The memory budget; every figure checked, and the budget must leave room for KV."""
    w = f"{where}: memory"
    spec = MemorySpec(
        gpu_allocatable_gib=_field(mem, "gpu_allocatable_gib", w),
        weights_gib=_field(mem, "weights_bytes", w, kind=int) / GIB,
        drafter_weights_gib=_field(dr, "weights_gib", f"{where}: drafter", strict=False),
        reserve_gib=_field(mem, "reserve_gib", w, strict=False),
        kv_bytes_per_token=_field(mem, "kv_bytes_per_token", w, kind=int),
        kv_block_tokens=_field(mem, "kv_block_tokens", w, kind=int, default=16),
        max_model_len=_field(mem, "max_model_len", w, kind=int),
    )
    if spec.gpu_allocatable_gib / spec.kv_block_gib > MAX_KV_BLOCKS:  # Python floats: inf, no overflow
        raise CalibrationError(
            f"{w}: gpu_allocatable_gib {spec.gpu_allocatable_gib:g} holds more than {MAX_KV_BLOCKS:,} KV blocks of "
            f"kv_bytes_per_token {spec.kv_bytes_per_token} x kv_block_tokens {spec.kv_block_tokens} bytes; one "
            "of them is not the machine's (GiB, bytes per token of context)")
    if spec.least_allocatable_gib > spec.gpu_allocatable_gib:
        raise CalibrationError(
            f"{w}: the budget does not add up: weights {spec.weights_gib:.2f} + reserve {spec.reserve_gib:.2f} + "
            f"drafter {spec.drafter_weights_gib:.2f} GiB leave no room for one KV block in "
            f"gpu_allocatable_gib {spec.gpu_allocatable_gib:.2f}")
    return spec


def _load_drafter(rows: list[dict[str, str]], dr: Mapping[str, Any], memory: MemorySpec, csv_path: Path,
                  where: str) -> DrafterCost:
    """The DSpark drafter's two-point roofline over the measured small model, plus the Markov head
    step ``rank * vocab * bytes / bandwidth`` (docs/model.md section 1 step 1)."""
    dsel = _select_rows(rows, _require(dr, "parallel_select", f"{where}: drafter"), f"{where}: drafter.parallel_select")
    tests = _require(dr, "parallel_tests", f"{where}: drafter")
    by_test = {r["test"]: r for r in dsel}
    for role in ("small", "large"):
        if tests.get(role) not in by_test:
            raise CalibrationError(f"{where}: drafter.parallel_tests.{role}={tests.get(role)!r} matches no selected row")
    small, large = by_test[tests["small"]], by_test[tests["large"]]
    w = f"{where}: drafter"
    t_seq = (
        _field(dr, "seq_head_rank", w, kind=int) * _field(dr, "seq_head_vocab", w, kind=int)
        * _field(dr, "seq_head_bytes_per_param", w) / (_field(dr, "mem_bandwidth_gb_s", w) * 1e9)
    )
    return DrafterCost(
        t_small_s=_cell(small, "derived_pass_ms", csv_path) / 1000.0,
        large_b=_cell(large, "tokens_per_pass_B", csv_path, kind=int),
        t_large_s=_cell(large, "derived_pass_ms", csv_path) / 1000.0,
        time_scale=_field(dr, "parallel_time_scale", w, default=1.0),
        t_seq_s=t_seq,
        weights_gib=memory.drafter_weights_gib,
        kv_bytes_per_token=_field(dr, "kv_bytes_per_token", f"{where}: drafter", kind=int, strict=False, default=0),
        source=f"{small['source_url_or_repo_path']} ({tests['small']}, {tests['large']})",
    )


# ------------------------------------------------------------------------------ format 2
#: vLLM's default CUDA-graph capture sizes up to 512 tokens: 1, 2, 4, then multiples of 8
#: (vllm/worker/model_runner.py _BATCH_SIZES_TO_CAPTURE, vllm-project/vllm PR #7894).
VLLM_GRAPH_SIZES = (1, 2, 4) + tuple(range(8, 513, 8))


@lru_cache(maxsize=32)
def _build_profile_v2(path_s: str, yaml_stat: tuple[int, int], csv_s: str,
                      csv_stat: tuple[int, int]) -> HardwareProfile:
    """A format-2 profile: curves and drafters built from a memtp cost table (hardware.tables)."""
    where = path_s
    doc = _read_profile_doc(path_s, *yaml_stat)
    table = tables.read_cost_table(csv_s)
    base = tables.select_rows(table, doc.get("select") or {}, where)
    graph, eager, graph_src = _graph(doc.get("overheads") or {}, where)
    curves: dict[str, Any] = {}
    warnings: list[str] = []
    for name in ("verify", "decode", "prefill"):
        sec = doc.get(name)
        if sec is None:
            if name == "verify":
                raise CalibrationError(f"{where}: missing field 'verify'")
            continue
        fit = _curve(base, sec, name, where, graph if name != "prefill" else (), eager if name != "prefill" else 1.0)
        warnings += check_curve(fit.table.batch_tokens, fit.table.pass_ms, where=f"{csv_s} ({name})",
                                rows=[str(r[0]) for r in fit.rows], column="pass_ms")
        warnings += [f"{csv_s} ({name}): context pair R={req}, v={v}: measured +{dm:.2f} ms, the attention "
                     f"roofline gives +{mm:.2f} ms" for req, v, dm, mm in fit.pair_errors()
                     if abs(mm - dm) > max(0.15 * abs(dm), 0.05)]
        curves[name] = fit
    memory = _load_memory(_require(doc, "memory", where), _default_drafter_doc(doc), where)
    common = doc.get("select") or {}
    drafters = {k: _drafter_v2(tables.select_rows(table, {**common, **(v.get("select") or {})}, where), v, k, where)
                for k, v in (doc.get("drafters") or {}).items()}
    default = str(doc.get("default_drafter", next(iter(drafters), "")))
    if default not in drafters:
        raise CalibrationError(f"{where}: default_drafter: {default!r}; the profile's drafters are "
                               f"{', '.join(drafters) or 'none'}")
    ov = doc.get("overheads") or {}
    overheads = Overheads(host_s=_field(ov, "host_ms_per_round", f"{where}: overheads", strict=False,
                                        default=0.0) / 1000.0,
                          planner_s=_field(ov, "planner_ms_per_round", f"{where}: overheads", strict=False,
                                           default=0.0) / 1000.0,
                          sources={"host": str(ov.get("host_source", "")),
                                   "planner": str(ov.get("planner_source", "")), "graph": graph_src})
    mem = doc["memory"]
    sources = {"verify": curves["verify"].table.source, "costs": csv_s,
               "gpu_allocatable": str(mem.get("gpu_allocatable_source", "")),
               "weights": str(mem.get("weights_source", "")), "kv": str(mem.get("kv_source", "")),
               "reserve": str(mem.get("reserve_source", ""))}
    sources.update({f"drafter_{k}": d.source for k, d in drafters.items()})
    return HardwareProfile(
        name=str(_require(doc, "name", where)), description=" ".join(str(doc.get("description", "")).split()),
        chip=str(doc.get("chip", "")), sps=curves["verify"].table, drafter=drafters[default], memory=memory,
        path=path_s, sources=sources, caveats=tuple(doc.get("caveats", ())), warnings=tuple(warnings),
        decode=curves["decode"].table if "decode" in curves else None,
        prefill=curves["prefill"].table if "prefill" in curves else None,
        overheads=overheads, drafters=drafters, model=str(doc.get("model", "")), engine=str(doc.get("engine", "")),
        build=str(doc.get("build", "")))


def _graph(ov: Mapping[str, Any], where: str) -> tuple[tuple[int, ...], float, str]:
    g = ov.get("graph_sizes")
    if g is None:
        return (), 1.0, ""
    sizes = VLLM_GRAPH_SIZES if g == "vllm" else g
    if not isinstance(sizes, (list, tuple)) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 1
                                                        for x in sizes):
        raise CalibrationError(f"{where}: overheads.graph_sizes: {g!r}; allowed: vllm, or a list of batch sizes")
    eager = _field(ov, "eager_factor", f"{where}: overheads", minimum=1.0, strict=False, default=1.0)
    return tuple(sorted(sizes)), eager, str(ov.get("graph_source", ""))


def _curve(base: Any, sec: Mapping[str, Any], name: str, where: str, graph: tuple[int, ...],
           eager: float) -> tables.CurveFit:
    w = f"{where}: {name}"
    if not isinstance(sec, Mapping):
        raise CalibrationError(f"{w}: expected a mapping (select, reference_context, rules)")
    rows = tables.select_rows(base, {"kind": name if name != "decode" else ["decode", "verify"],
                                     **(sec.get("select") or {})}, w)
    if rows.empty:
        raise CalibrationError(f"{w}: select matches no row of the cost table")
    ctx = sec.get("context", "fit")
    src = ", ".join(sorted(set(rows["source"])))
    return tables.verify_curve(
        rows, where=w, reference_context=sec.get("reference_context"),
        tokens_per_request=str(sec.get("tokens_per_request", "1" if name == "decode" else "any")),
        below_min=_rule(sec, "below_min", BELOW_MIN_RULES, w), beyond_max=_rule(sec, "beyond_max", BEYOND_MAX_RULES, w),
        context=ctx, graph_sizes=graph, eager_factor=eager, source=src)


def unused_cost_rows(name_or_path: str | Path) -> list[int]:
    """Rows of a format-2 profile's cost table that none of its curves or drafters reads.

    A curve reads the rows behind its points and its fitted context pairs (:class:`.tables.CurveFit`,
    rebuilt by the loader's own rules); a drafter reads every row its select matches. A measured
    pass that nothing reads prices nothing: ``calibrate import`` warns about such rows.

    Args:
        name_or_path: a shipped profile name or a YAML path.

    Returns:
        The unread rows' line numbers in the cost table (line 1 is the header), increasing; empty
        for a format-1 profile.

    Raises:
        CalibrationError: the profile or its cost table cannot be read (as :func:`load_profile`).
    """
    path, csv_path, format2 = _profile_source(name_or_path)
    if not format2:
        return []
    where = str(path)
    doc = _read_profile_doc(where, *_stat_key(path))
    table = tables.read_cost_table(csv_path)
    common = doc.get("select") or {}
    base = tables.select_rows(table, common, where)
    used: set[int] = set()
    for name in ("verify", "decode", "prefill"):
        if doc.get(name) is not None:
            used |= _curve(base, doc[name], name, where, (), 1.0).used_rows
    for v in (doc.get("drafters") or {}).values():
        if isinstance(v, Mapping):
            used |= {int(x) for x in tables.select_rows(table, {**common, **(v.get("select") or {})}, where)["_row"]}
    return sorted(int(x) for x in table["_row"] if int(x) not in used)


def _default_drafter_doc(doc: Mapping[str, Any]) -> Mapping[str, Any]:
    drafters = doc.get("drafters") or {}
    key = doc.get("default_drafter", next(iter(drafters), None))
    return drafters.get(key, {"weights_gib": 0.0})


def _drafter_v2(rows: Any, sec: Mapping[str, Any], key: str, where: str) -> Any:
    """A measured drafter (its select applies over the profile's common select)."""
    w = f"{where}: drafters.{key}"
    kind = sec.get("kind")
    if kind not in ("block", "mtp", "model", "per_sequence"):
        raise CalibrationError(f"{w}.kind: {kind!r}; allowed: block, mtp, model, per_sequence")
    t_seq = 0.0
    head = sec.get("sequential_head")
    if head is not None:
        hw = f"{w}.sequential_head"
        t_seq = (_field(head, "rank", hw, kind=int) * _field(head, "vocab", hw, kind=int)
                 * _field(head, "bytes_per_param", hw) / (_field(head, "mem_bandwidth_gb_s", hw) * 1e9))
    cost = tables.drafter_cost(rows, kind=str(kind), where=w, t_seq_s=t_seq,
                               weights_gib=_field(sec, "weights_gib", w, strict=False),
                               time_scale=_field(sec, "time_scale", w, default=1.0),
                               kv_bytes_per_token=_field(sec, "kv_bytes_per_token", w, kind=int, strict=False, default=0),
                               source=f"{', '.join(sorted(set(rows['source'])))}; " + " ".join(
                                   str(sec.get("note", "")).split()))
    return cost

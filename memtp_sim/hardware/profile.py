"""Hardware profiles: load a named, sourced profile (verify cost, drafter cost, memory).

A profile is a YAML file under ``calibration/<chip>/`` that selects rows of a measurements CSV
(copied from public llama-bench results, each row naming its source URL) and states the memory
figures of the machine and model, each with its source. Nothing in a profile is fitted or smoothed:
SPS(B) is the measured table, and values between measured batch sizes follow one documented rule.

The lookup rule between measured points is documented in :mod:`memtp_sim.hardware.cost`.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import yaml

from ..errors import CalibrationError
from .cost import DrafterCost, SPSTable
from .memory import GIB, MemorySpec

__all__ = [
    "HardwareProfile",
    "DEFAULT_PROFILE",
    "calibration_dir",
    "list_profiles",
    "load_profile",
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

    def summary(self) -> dict[str, Any]:
        """JSON-ready description for run outputs."""
        return {
            "name": self.name,
            "path": self.path,
            "chip": self.chip,
            "sps": self.sps.as_dict(),
            "memory": {
                "gpu_allocatable_gib": self.memory.gpu_allocatable_gib,
                "weights_gib": round(self.memory.weights_gib, 4),
                "drafter_weights_gib": self.memory.drafter_weights_gib,
                "reserve_gib": self.memory.reserve_gib,
                "kv_bytes_per_token": self.memory.kv_bytes_per_token,
                "kv_block_tokens": self.memory.kv_block_tokens,
                "max_model_len": self.memory.max_model_len,
            },
            "drafter": {
                "t_small_ms": self.drafter.t_small_s * 1e3,
                "large_b": self.drafter.large_b,
                "t_large_ms": self.drafter.t_large_s * 1e3,
                "time_scale": self.drafter.time_scale,
                "t_seq_ms": self.drafter.t_seq_s * 1e3,
            },
            "sources": self.sources,
            "caveats": list(self.caveats),
        }


def calibration_dir() -> Path:
    """Folder holding the shipped calibration profiles.

    Looks in the installed wheel first (``memtp_sim/_calibration``), then in the source tree
    (``<repo>/calibration``) for editable installs.

    Raises:
        CalibrationError: neither exists.
    """
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
    """Shipped profiles by name -> YAML path."""
    out: dict[str, Path] = {}
    for p in sorted(calibration_dir().glob("*/*.yaml")):
        try:
            doc = yaml.safe_load(p.read_text())
        except (OSError, yaml.YAMLError, UnicodeDecodeError):
            continue  # a broken file is reported when loaded by path
        if isinstance(doc, dict) and "name" in doc and "verify" in doc and "measurements" in doc:
            out[str(doc["name"])] = p
    return out


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
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _require(d: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in d:
        raise CalibrationError(f"{where}: missing field {key!r}")
    return d[key]


def _resolve_profile_path(name_or_path: str | Path | None) -> Path:
    key = DEFAULT_PROFILE if name_or_path is None else str(name_or_path)
    path = Path(key)
    if not (path.suffix in (".yaml", ".yml") or path.exists()):
        profiles = list_profiles()
        if key not in profiles:
            raise CalibrationError(
                f"hardware profile {key!r} not found; shipped profiles: {', '.join(sorted(profiles))} "
                "(or give a path to a profile YAML)"
            )
        path = profiles[key]
    if not path.is_file():
        raise CalibrationError(f"{path}: hardware profile file not found")
    return path


def load_profile(name_or_path: str | Path | None = None) -> HardwareProfile:
    """Load a hardware profile by shipped name or YAML path (``None`` = the default profile).

    Profiles are cached by path and by the modification time and size of the YAML and its
    measurements file, so a study that validates hundreds of scenarios parses each file once and
    an edited file is read again.

    Raises:
        CalibrationError: unknown name, missing file, missing field, or a verify curve that is not
            one complete measured curve (every power of two from 1 to 512, one row each).
    """
    path = _resolve_profile_path(name_or_path).resolve()
    doc = _read_profile_doc(str(path), *_stat_key(path))
    csv_path = path.parent / str(_require(doc, "measurements", str(path)))
    if not csv_path.is_file():
        raise CalibrationError(f"{path}: measurements: file {csv_path} not found")
    return _build_profile(str(path), _stat_key(path), str(csv_path), _stat_key(csv_path))


def _stat_key(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_mtime_ns, st.st_size


@lru_cache(maxsize=64)
def _read_profile_doc(path_s: str, mtime_ns: int, size: int) -> dict[str, Any]:  # stat in the key: edits reload
    try:
        doc = yaml.load(Path(path_s).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506
    except yaml.YAMLError as e:
        raise CalibrationError(f"{path_s}: not valid YAML ({e.__class__.__name__})") from None
    if not isinstance(doc, dict):
        raise CalibrationError(f"{path_s}: expected a mapping at the top level")
    return doc


@lru_cache(maxsize=32)
def _build_profile(path_s: str, yaml_stat: tuple[int, int], csv_s: str, csv_stat: tuple[int, int]) -> HardwareProfile:
    path, csv_path = Path(path_s), Path(csv_s)
    where = path_s
    doc = _read_profile_doc(path_s, *yaml_stat)
    rows = _read_measurements(csv_path)
    verify = _require(doc, "verify", where)
    sps = _load_verify(rows, verify, csv_path, where)
    mem = _require(doc, "memory", where)
    memory = _load_memory(mem, _require(doc, "drafter", where), where)
    dr = _require(doc, "drafter", where)
    drafter = _load_drafter(rows, dr, memory, where)
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
    )


def _load_verify(rows: list[dict[str, str]], verify: Mapping[str, Any], csv_path: Path, where: str) -> SPSTable:
    """The verify-cost table from the rows ``verify.select`` picks (one complete measured curve)."""
    sel = _select_rows(rows, _require(verify, "select", f"{where}: verify"), f"{where}: verify.select")
    if not sel:
        raise CalibrationError(f"{where}: verify.select matches no row of {csv_path.name}")
    by_b: dict[int, dict[str, str]] = {}
    for r in sel:
        b = int(r["tokens_per_pass_B"])
        if b in by_b:
            raise CalibrationError(f"{where}: verify.select matches two rows for B={b}; narrow the selection")
        by_b[b] = r
    missing = [b for b in (1 << i for i in range(10)) if b not in by_b]
    if missing:
        raise CalibrationError(f"{where}: verify curve lacks measured B={missing} (need every power of two 1..512)")
    if verify.get("lookup", "linear_pass_time") != "linear_pass_time":
        raise CalibrationError(f"{where}: verify.lookup: only 'linear_pass_time' is supported")
    bs = sorted(by_b)
    src_urls = sorted({by_b[b]["source_url_or_repo_path"] for b in bs})
    return SPSTable(
        np.array(bs),
        np.array([float(by_b[b]["derived_pass_ms"]) for b in bs]),
        source=f"{csv_path.name} rows {verify['select'].get('model', '')} ({'; '.join(src_urls)})",
        beyond_max=str(verify.get("beyond_max", "error")),
    )


def _load_memory(mem: Mapping[str, Any], dr: Mapping[str, Any], where: str) -> MemorySpec:
    return MemorySpec(
        gpu_allocatable_gib=float(_require(mem, "gpu_allocatable_gib", f"{where}: memory")),
        weights_gib=float(_require(mem, "weights_bytes", f"{where}: memory")) / GIB,
        drafter_weights_gib=float(_require(dr, "weights_gib", f"{where}: drafter")),
        reserve_gib=float(_require(mem, "reserve_gib", f"{where}: memory")),
        kv_bytes_per_token=int(_require(mem, "kv_bytes_per_token", f"{where}: memory")),
        kv_block_tokens=int(mem.get("kv_block_tokens", 16)),
        max_model_len=int(_require(mem, "max_model_len", f"{where}: memory")),
    )


def _load_drafter(rows: list[dict[str, str]], dr: Mapping[str, Any], memory: MemorySpec, where: str) -> DrafterCost:
    """The DSpark drafter's two-point roofline over the measured small model, plus the Markov head
    step ``rank * vocab * bytes / bandwidth`` (docs/model.md section 1 step 1)."""
    dsel = _select_rows(rows, _require(dr, "parallel_select", f"{where}: drafter"), f"{where}: drafter.parallel_select")
    tests = _require(dr, "parallel_tests", f"{where}: drafter")
    by_test = {r["test"]: r for r in dsel}
    for role in ("small", "large"):
        if tests.get(role) not in by_test:
            raise CalibrationError(f"{where}: drafter.parallel_tests.{role}={tests.get(role)!r} matches no selected row")
    small, large = by_test[tests["small"]], by_test[tests["large"]]
    t_seq = (
        float(dr["seq_head_rank"]) * float(dr["seq_head_vocab"]) * float(dr["seq_head_bytes_per_param"])
        / (float(dr["mem_bandwidth_gb_s"]) * 1e9)
    )
    return DrafterCost(
        t_small_s=float(small["derived_pass_ms"]) / 1000.0,
        large_b=int(large["tokens_per_pass_B"]),
        t_large_s=float(large["derived_pass_ms"]) / 1000.0,
        time_scale=float(dr.get("parallel_time_scale", 1.0)),
        t_seq_s=t_seq,
        weights_gib=memory.drafter_weights_gib,
        source=f"{small['source_url_or_repo_path']} ({tests['small']}, {tests['large']})",
    )

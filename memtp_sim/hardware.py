"""Hardware profiles: measured verify cost SPS(B), drafter cost and memory.

A profile is a YAML file under ``calibration/<chip>/`` that selects rows of a measurements CSV
(copied from public llama-bench results, each row naming its source URL) and states the memory
figures of the machine and model, each with its source. Nothing in a profile is fitted or smoothed:
SPS(B) is the measured table, and values between measured batch sizes follow one documented rule.

Lookup rule (``linear_pass_time``): for a token batch B between two measured sizes
``B_lo < B < B_hi`` the pass time is linear in B between the two measured pass times. Every
measured point is reproduced exactly and only the two neighbours influence a value, so a measured
cliff (a jump between neighbours) stays a cliff. Below the smallest or above the largest measured B
there is no rule: the lookup raises, unless the profile asks for ``beyond_max: extrapolate`` (linear
in pass time through the last two points), which the run then reports.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import yaml

from .errors import CalibrationError

__all__ = [
    "SPSTable",
    "DrafterCost",
    "MemorySpec",
    "HardwareProfile",
    "DEFAULT_PROFILE",
    "calibration_dir",
    "list_profiles",
    "load_profile",
]

DEFAULT_PROFILE = "gfx1151-llama31-8b-q4km-vulkan"
GIB = float(1 << 30)


@dataclass(frozen=True)
class SPSTable:
    """Verifier steps per second as a function of the token batch B of one forward pass.

    Attributes:
        batch_tokens: measured B values, shape (n,), strictly increasing ints >= 1.
        pass_ms: measured pass time at each B, shape (n,), milliseconds, > 0.
        source: where the points come from (URL / file and selection).
        beyond_max: ``"error"`` (refuse B above the largest measured B) or ``"extrapolate"``
            (linear in pass time through the last two measured points).

    Source: docs/model.md section 1 step 4 (SPS(B) is a measured, jagged table).
    """

    batch_tokens: np.ndarray
    pass_ms: np.ndarray
    source: str = "user table"
    beyond_max: str = "error"

    def __post_init__(self) -> None:
        b = np.asarray(self.batch_tokens, dtype=np.int64)
        t = np.asarray(self.pass_ms, dtype=np.float64)
        if b.ndim != 1 or b.shape != t.shape or b.size == 0:
            raise ValueError("sps: need matching 1-D batch sizes and pass times, at least one point")
        if np.any(b < 1):
            raise ValueError(f"sps: batch sizes must be >= 1, got {b.min()}")
        if np.any(np.diff(b) <= 0):
            raise ValueError("sps: batch sizes must be strictly increasing (no duplicates)")
        if not np.all(np.isfinite(t)) or np.any(t <= 0):
            raise ValueError("sps: pass times / steps per second must be finite and > 0")
        if self.beyond_max not in ("error", "extrapolate"):
            raise ValueError(f"sps: beyond_max must be 'error' or 'extrapolate', got {self.beyond_max!r}")
        object.__setattr__(self, "batch_tokens", b)
        object.__setattr__(self, "pass_ms", t)

    @classmethod
    def from_mapping(cls, sps: Mapping[int, float], *, source: str = "user table") -> "SPSTable":
        """Build a table from ``{B: steps per second}``.

        Raises:
            ValueError: a key is not a positive integer or a value is not a positive number.
        """
        if not isinstance(sps, Mapping) or not sps:
            raise ValueError("sps: expected a non-empty mapping {B: steps per second}")
        items = []
        for k, v in sps.items():
            if isinstance(k, bool) or int(k) != k or int(k) < 1:
                raise ValueError(f"sps: keys must be integer batch sizes >= 1, got {k!r}")
            v = float(v)
            if not math.isfinite(v) or v <= 0:
                raise ValueError(f"sps: SPS({k}) must be a positive number, got {v!r}")
            items.append((int(k), 1000.0 / v))
        items.sort()
        return cls(np.array([i[0] for i in items]), np.array([i[1] for i in items]), source=source)

    @property
    def min_batch_tokens(self) -> int:
        return int(self.batch_tokens[0])

    @property
    def max_batch_tokens(self) -> int:
        """Largest measured B (the end of the lookup rule's domain)."""
        return int(self.batch_tokens[-1])

    @cached_property
    def _dense_pass_s(self) -> np.ndarray:
        # pass time in seconds for every integer B in [0, max]; index 0 unused (NaN).
        bs = np.arange(self.max_batch_tokens + 1, dtype=np.float64)
        out = np.interp(bs, self.batch_tokens, self.pass_ms) / 1000.0
        out[: self.min_batch_tokens] = np.nan
        return out

    def covers(self, b: int) -> bool:
        """Whether B has a value under the lookup rule."""
        return self.min_batch_tokens <= b and (b <= self.max_batch_tokens or self.beyond_max == "extrapolate")

    def pass_time_s(self, b: Any) -> Any:
        """Forward-pass time in seconds at token batch ``b`` (int or int array).

        Raises:
            ValueError: some ``b`` lies outside the measured range and the table does not
                extrapolate.
        """
        if isinstance(b, (int, np.integer)) and self.min_batch_tokens <= b <= self.max_batch_tokens:
            return float(self._dense_pass_s[b])  # fast path: one scalar inside the measured range
        arr = np.asarray(b, dtype=np.int64)
        lo, hi = self.min_batch_tokens, self.max_batch_tokens
        if arr.size and (arr.min() < lo or (arr.max() > hi and self.beyond_max != "extrapolate")):
            bad = int(arr.min()) if arr.min() < lo else int(arr.max())
            raise ValueError(
                f"sps: no value for B={bad}: measured range is {lo}..{hi} and the lookup rule "
                "(linear in pass time between measured neighbours) does not extend past it"
            )
        if arr.size and arr.max() > hi:
            out = np.empty(arr.shape, dtype=np.float64)
            inside = arr <= hi
            out[inside] = self._dense_pass_s[arr[inside]]
            out[~inside] = self._extrapolate_s(arr[~inside])
        else:
            out = self._dense_pass_s[arr]
        return float(out) if np.ndim(b) == 0 else out

    def pass_time_range_s(self, b_first: int, b_last: int) -> np.ndarray:
        """Pass times for every B in ``b_first..b_last`` (inclusive), shape (b_last - b_first + 1,)."""
        if self.min_batch_tokens <= b_first and b_last <= self.max_batch_tokens:
            return self._dense_pass_s[b_first: b_last + 1]
        return self.pass_time_s(np.arange(b_first, b_last + 1))

    def _extrapolate_s(self, b: np.ndarray) -> np.ndarray:
        if self.batch_tokens.size < 2:
            return np.full(b.shape, self.pass_ms[-1] / 1000.0) * (b / self.batch_tokens[-1])
        b0, b1 = self.batch_tokens[-2:]
        t0, t1 = self.pass_ms[-2:]
        return (t1 + (b - b1) * (t1 - t0) / (b1 - b0)) / 1000.0

    def sps(self, b: Any) -> Any:
        """Steps per second ``1 / pass_time_s(b)``."""
        return 1.0 / self.pass_time_s(b)

    def as_dict(self) -> dict[str, Any]:
        return {
            "batch_tokens": self.batch_tokens.tolist(),
            "pass_ms": [round(float(x), 4) for x in self.pass_ms],
            "source": self.source,
            "lookup": "linear_pass_time",
            "beyond_max": self.beyond_max,
        }


@dataclass(frozen=True)
class DrafterCost:
    """Cost of one drafting round of DSpark's semi-autoregressive drafter.

    ``T_draft(R, gamma) = t_parallel(R * gamma) + gamma * t_seq`` (docs/model.md section 1 step 1),
    with ``t_parallel(n) = scale * max(t_small, n * t_large / large_b)``: flat while the small
    model's pass is memory-bound, then the compute-bound line through its measured large-B point.
    ``t_seq`` is one step of the Markov head: ``rank * vocab * bytes / bandwidth``.

    Attributes:
        t_small_s: measured pass time of the reference model at B=1, seconds.
        large_b: B of the measured large pass (e.g. 512).
        t_large_s: measured pass time at ``large_b``, seconds.
        time_scale: documented ratio drafter / reference model.
        t_seq_s: one sequential-head step, seconds.
        weights_gib: drafter memory, GiB.
        source: text naming the measurements and mapping.
    """

    t_small_s: float
    large_b: int
    t_large_s: float
    time_scale: float
    t_seq_s: float
    weights_gib: float
    source: str = ""

    def round_time_s(self, num_requests: int, gamma: int) -> float:
        """Drafting time of one round for ``num_requests`` requests drafting ``gamma`` tokens."""
        if gamma <= 0 or num_requests <= 0:
            return 0.0
        n = num_requests * gamma
        t_par = self.time_scale * max(self.t_small_s, n * self.t_large_s / self.large_b)
        return t_par + gamma * self.t_seq_s


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
        return self.kv_bytes_per_token * self.kv_block_tokens / GIB

    def kv_capacity_blocks(self, *, speculative: bool, other_gib: float = 0.0) -> int:
        """Paged-KV blocks that fit next to weights, drafter, reserve and ``other_gib``."""
        free = self.gpu_allocatable_gib - self.weights_gib - self.reserve_gib - other_gib
        if speculative:
            free -= self.drafter_weights_gib
        return max(0, int(math.floor(free / self.kv_block_gib)))


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
    repo = Path(__file__).resolve().parent.parent / "calibration"
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


def load_profile(name_or_path: str | Path | None = None) -> HardwareProfile:
    """Load a hardware profile by shipped name or YAML path (``None`` = the default profile).

    Raises:
        CalibrationError: unknown name, missing file, missing field, or a verify curve that is not
            one complete measured curve (every power of two from 1 to 512, one row each).
    """
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
    where = str(path)
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise CalibrationError(f"{where}: not valid YAML ({e.__class__.__name__})") from None
    if not isinstance(doc, dict):
        raise CalibrationError(f"{where}: expected a mapping at the top level")

    csv_path = path.parent / str(_require(doc, "measurements", where))
    if not csv_path.is_file():
        raise CalibrationError(f"{where}: measurements: file {csv_path} not found")
    rows = _read_measurements(csv_path)

    verify = _require(doc, "verify", where)
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
    sps = SPSTable(
        np.array(bs),
        np.array([float(by_b[b]["derived_pass_ms"]) for b in bs]),
        source=f"{csv_path.name} rows {verify['select'].get('model', '')} ({'; '.join(src_urls)})",
        beyond_max=str(verify.get("beyond_max", "error")),
    )

    mem = _require(doc, "memory", where)
    memory = MemorySpec(
        gpu_allocatable_gib=float(_require(mem, "gpu_allocatable_gib", f"{where}: memory")),
        weights_gib=float(_require(mem, "weights_bytes", f"{where}: memory")) / GIB,
        drafter_weights_gib=float(_require(doc["drafter"], "weights_gib", f"{where}: drafter")),
        reserve_gib=float(_require(mem, "reserve_gib", f"{where}: memory")),
        kv_bytes_per_token=int(_require(mem, "kv_bytes_per_token", f"{where}: memory")),
        kv_block_tokens=int(mem.get("kv_block_tokens", 16)),
        max_model_len=int(_require(mem, "max_model_len", f"{where}: memory")),
    )

    dr = _require(doc, "drafter", where)
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
    drafter = DrafterCost(
        t_small_s=float(small["derived_pass_ms"]) / 1000.0,
        large_b=int(large["tokens_per_pass_B"]),
        t_large_s=float(large["derived_pass_ms"]) / 1000.0,
        time_scale=float(dr.get("parallel_time_scale", 1.0)),
        t_seq_s=t_seq,
        weights_gib=memory.drafter_weights_gib,
        source=f"{small['source_url_or_repo_path']} ({tests['small']}, {tests['large']})",
    )
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

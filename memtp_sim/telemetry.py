"""Live memory telemetry: how much memory this machine's accelerator has free right now.

:func:`read_free_memory` reads, in order, AMD sysfs (``mem_info_vram_*`` and ``mem_info_gtt_*``),
NVIDIA NVML, ``nvidia-smi``, and ``/proc/meminfo``, and says which one answered.
:func:`memtp_depth_live` feeds that reading to the MEMTP depth formula
(:func:`memtp_sim.memtp.memtp_depth`): ``python -m memtp_sim depth --live``.

Kept apart from :mod:`memtp_sim.memtp`, which is pure: this module touches the operating system.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from .errors import TelemetryUnavailableError
from .memtp import MEMTP_DEFAULTS, _check_free_gib, memtp_depth

__all__ = [
    "KNOWN_TELEMETRY_SOURCES",
    "MemoryTelemetry",
    "TelemetryUnavailableError",
    "memtp_depth_live",
    "read_free_memory",
]

#: Bytes per GiB.
_BYTES_PER_GIB = float(1 << 30)
#: MiB per GiB (``nvidia-smi`` reports MiB).
_MIB_PER_GIB = 1024.0
#: KiB per GiB (``/proc/meminfo`` reports "kB", which the kernel means as KiB).
_KIB_PER_GIB = float(1 << 20)

#: Prefixes of :attr:`MemoryTelemetry.source` values :func:`read_free_memory` can return.
KNOWN_TELEMETRY_SOURCES = ("amd-sysfs:", "nvidia-nvml", "nvidia-smi", "system-meminfo")

#: Timeout for one ``nvidia-smi`` call, in seconds.
_NVIDIA_SMI_TIMEOUT_S = 5.0

#: Keyword arguments :func:`memtp_depth_live` accepts besides ``max_depth`` and ``coherence``.
_LIVE_TELEMETRY_KW = ("sysfs_root", "proc_meminfo", "nvidia_smi")
_LIVE_FORMULA_KW = ("head_cost_gib", "r_low", "r_high", "reserve_gib")


@dataclasses.dataclass(frozen=True)
class MemoryTelemetry:
    """One reading of the accelerator's (or host's) memory.

    Attributes:
        free_gib: Memory free for new allocations, in GiB (``total_gib - used_gib``, floored at 0).
        total_gib: Capacity of the pool that was read, in GiB.
        used_gib: Memory in use in that pool, in GiB.
        source: Where the numbers came from: ``"amd-sysfs:<card> vram+gtt"`` (or ``vram`` when
            the card exposes no GTT files), ``"nvidia-nvml"``, ``"nvidia-smi"`` or
            ``"system-meminfo"``. Every value starts with one of
            :data:`KNOWN_TELEMETRY_SOURCES`.
        details: Source-specific extras (paths, per-pool figures, sources skipped and why).

    Source:
        The units of each interface, converted to GiB (2**30 bytes): see :func:`read_free_memory`.
    """

    free_gib: float
    total_gib: float
    used_gib: float
    source: str
    details: dict[str, Any] = dataclasses.field(default_factory=dict, hash=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """Return the reading as a plain dict (``details`` copied shallowly).

        Returns:
            ``{"free_gib", "total_gib", "used_gib"`` (GiB), ``"source", "details"}``, ready for
            ``json.dumps``.
        """
        return {
            "free_gib": self.free_gib,
            "total_gib": self.total_gib,
            "used_gib": self.used_gib,
            "source": self.source,
            "details": dict(self.details),
        }


def _read_int_file(path: Path) -> int:
    """Read a sysfs file holding one integer (bytes)."""
    return int(path.read_text(encoding="ascii").strip())


_CARD_RE = re.compile(r"card(\d+)")


def _read_amd_sysfs(
    sysfs_root: str | os.PathLike[str], skipped: list[str]
) -> MemoryTelemetry | None:
    """Read amdgpu ``mem_info_*`` files under ``sysfs_root``; pick the card with the most memory.

    On a unified-memory APU (e.g. Strix Halo, gfx1151) the VRAM "carve-out" is small and most of
    what the GPU can allocate comes through GTT (system RAM mapped for the GPU), so the pool that
    funds draft heads is VRAM + GTT: ``free = (vram_total - vram_used) + (gtt_total - gtt_used)``.
    On a discrete card GTT is host memory across the bus, so there the figure is an upper bound;
    ``details`` keeps the VRAM and GTT parts apart for a caller that wants only VRAM.
    """
    root = Path(sysfs_root)
    try:
        entries = sorted(
            (int(m.group(1)), p.name)
            for p in root.iterdir()
            if (m := _CARD_RE.fullmatch(p.name)) is not None
        )
    except OSError as exc:
        skipped.append(f"amd-sysfs: cannot list {root}: {exc.__class__.__name__}")
        return None
    if not entries:
        skipped.append(f"amd-sysfs: no card* entries under {root}")
        return None

    best: tuple[int, str, dict[str, int]] | None = None
    for _, card in entries:
        device = root / card / "device"
        try:
            values = {
                "vram_total": _read_int_file(device / "mem_info_vram_total"),
                "vram_used": _read_int_file(device / "mem_info_vram_used"),
            }
        except (OSError, ValueError):
            continue  # not an amdgpu card, or unreadable: try the next one
        try:
            values["gtt_total"] = _read_int_file(device / "mem_info_gtt_total")
            values["gtt_used"] = _read_int_file(device / "mem_info_gtt_used")
        except (OSError, ValueError):
            values.pop("gtt_total", None)
        total = values["vram_total"] + values.get("gtt_total", 0)
        if best is None or total > best[0]:
            best = (total, card, values)
    if best is None:
        skipped.append(f"amd-sysfs: no readable mem_info_vram_* files under {root}")
        return None

    total_b, card, v = best
    vram_free_b = max(0, v["vram_total"] - v["vram_used"])
    has_gtt = "gtt_total" in v
    gtt_free_b = max(0, v["gtt_total"] - v["gtt_used"]) if has_gtt else 0
    used_b = v["vram_used"] + (v["gtt_used"] if has_gtt else 0)
    details: dict[str, Any] = {
        "card": card,
        "device_path": str(root / card / "device"),
        "vram_total_gib": v["vram_total"] / _BYTES_PER_GIB,
        "vram_used_gib": v["vram_used"] / _BYTES_PER_GIB,
        "vram_free_gib": vram_free_b / _BYTES_PER_GIB,
    }
    if has_gtt:
        details.update(
            gtt_total_gib=v["gtt_total"] / _BYTES_PER_GIB,
            gtt_used_gib=v["gtt_used"] / _BYTES_PER_GIB,
            gtt_free_gib=gtt_free_b / _BYTES_PER_GIB,
        )
    return MemoryTelemetry(
        free_gib=(vram_free_b + gtt_free_b) / _BYTES_PER_GIB,
        total_gib=total_b / _BYTES_PER_GIB,
        used_gib=used_b / _BYTES_PER_GIB,
        source=f"amd-sysfs:{card} {'vram+gtt' if has_gtt else 'vram'}",
        details=details,
    )


def _read_nvml(skipped: list[str]) -> MemoryTelemetry | None:
    """Read device 0 through ``pynvml`` when it is importable."""
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        skipped.append("nvidia-nvml: pynvml not importable")
        return None
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - any NVML failure means "source unavailable"
        skipped.append(f"nvidia-nvml: nvmlInit failed: {exc.__class__.__name__}")
        return None
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        info = pynvml.nvmlDeviceGetMemoryInfo(handle)
        total_b, used_b = int(info.total), int(info.used)
    except Exception as exc:  # noqa: BLE001
        skipped.append(f"nvidia-nvml: query failed: {exc.__class__.__name__}")
        return None
    finally:
        with contextlib.suppress(Exception):  # a failed shutdown changes nothing we report
            pynvml.nvmlShutdown()
    return MemoryTelemetry(
        free_gib=max(0, total_b - used_b) / _BYTES_PER_GIB,
        total_gib=total_b / _BYTES_PER_GIB,
        used_gib=used_b / _BYTES_PER_GIB,
        source="nvidia-nvml",
        details={"device_index": 0},
    )


def _read_nvidia_smi(nvidia_smi: str, skipped: list[str]) -> MemoryTelemetry | None:
    """Run ``nvidia-smi`` (if found on PATH or at the given path) and read GPU 0, in MiB."""
    exe = shutil.which(nvidia_smi)
    if exe is None:
        skipped.append(f"nvidia-smi: {nvidia_smi!r} not found")
        return None
    try:
        proc = subprocess.run(
            [exe, "--query-gpu=memory.total,memory.used", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=_NVIDIA_SMI_TIMEOUT_S,
            check=True,
        )
        first = next(line for line in proc.stdout.splitlines() if line.strip())
        total_s, used_s = (field.strip() for field in first.split(","))
        total_mib, used_mib = float(total_s), float(used_s)
        if not (math.isfinite(total_mib) and math.isfinite(used_mib)) or total_mib <= 0:
            raise ValueError("non-finite or zero memory figures")
    except (OSError, subprocess.SubprocessError, StopIteration, ValueError) as exc:
        skipped.append(f"nvidia-smi: unusable output: {exc.__class__.__name__}")
        return None
    return MemoryTelemetry(
        free_gib=max(0.0, total_mib - used_mib) / _MIB_PER_GIB,
        total_gib=total_mib / _MIB_PER_GIB,
        used_gib=used_mib / _MIB_PER_GIB,
        source="nvidia-smi",
        details={"device_index": 0, "executable": exe},
    )


def _read_meminfo(
    proc_meminfo: str | os.PathLike[str], skipped: list[str]
) -> MemoryTelemetry | None:
    """Read ``MemTotal`` and ``MemAvailable`` (KiB) from a ``/proc/meminfo``-format file."""
    path = Path(proc_meminfo)
    fields: dict[str, float] = {}
    try:
        for line in path.read_text(encoding="ascii", errors="replace").splitlines():
            key, sep, rest = line.partition(":")
            if not sep:
                continue
            parts = rest.split()
            if parts:
                try:
                    fields[key.strip()] = float(parts[0])
                except ValueError:
                    continue
    except OSError as exc:
        skipped.append(f"system-meminfo: cannot read {path}: {exc.__class__.__name__}")
        return None
    if "MemTotal" not in fields or "MemAvailable" not in fields:
        skipped.append(f"system-meminfo: {path} lacks MemTotal or MemAvailable")
        return None
    total_kib, avail_kib = fields["MemTotal"], fields["MemAvailable"]
    avail_kib = min(max(avail_kib, 0.0), total_kib)
    return MemoryTelemetry(
        free_gib=avail_kib / _KIB_PER_GIB,
        total_gib=total_kib / _KIB_PER_GIB,
        used_gib=(total_kib - avail_kib) / _KIB_PER_GIB,
        source="system-meminfo",
        details={"path": str(path)},
    )


def read_free_memory(
    *,
    sysfs_root: str | os.PathLike[str] = "/sys/class/drm",
    proc_meminfo: str | os.PathLike[str] = "/proc/meminfo",
    nvidia_smi: str = "nvidia-smi",
) -> MemoryTelemetry:
    """Read the machine's free accelerator memory, trying sources in a fixed order.

    Order (the first source that yields numbers wins; a missing or broken source is skipped):

    1. AMD sysfs: every ``card<N>/device/`` under ``sysfs_root`` with ``mem_info_vram_total`` and
       ``mem_info_vram_used`` (bytes), plus ``mem_info_gtt_total``/``mem_info_gtt_used`` when
       present. The pool is VRAM + GTT, because on a unified-memory APU such as Strix Halo
       (gfx1151) what the GPU can allocate is the VRAM carve-out plus GTT:
       ``free = (vram_total - vram_used) + (gtt_total - gtt_used)``. The card with the largest
       total wins. (On a discrete card this counts host memory reachable through GTT, so it is an
       upper bound; ``details`` reports the VRAM part alone as ``vram_free_gib``.)
    2. NVIDIA: ``pynvml`` (device 0) if importable; otherwise ``nvidia-smi`` (GPU 0, MiB) if
       the executable is found, with a short timeout.
    3. Host memory: ``MemAvailable`` / ``MemTotal`` (KiB) from ``proc_meminfo``.

    ``details["skipped"]`` lists the sources tried before the winner and why each was skipped.

    Args:
        sysfs_root: Directory holding the DRM ``card<N>`` entries (default ``/sys/class/drm``).
        proc_meminfo: Path of a ``/proc/meminfo``-format file.
        nvidia_smi: Name or path of the ``nvidia-smi`` executable.

    Returns:
        The reading, in GiB, with its source.

    Raises:
        TelemetryUnavailableError: (a ``RuntimeError``) if no source could be read; the message
            lists what was tried.

    Source:
        docs/model.md section 2 (``depth --live``); Linux amdgpu driver sysfs documentation
        (``mem_info_vram_*``, ``mem_info_gtt_*``, in bytes); NVML ``nvmlDeviceGetMemoryInfo``
        (bytes); ``nvidia-smi --query-gpu`` (MiB with ``nounits``); proc(5) ``/proc/meminfo`` (kB).
    """
    skipped: list[str] = []
    reading = (
        _read_amd_sysfs(sysfs_root, skipped)
        or _read_nvml(skipped)
        or _read_nvidia_smi(nvidia_smi, skipped)
        or _read_meminfo(proc_meminfo, skipped)
    )
    if reading is None:
        raise TelemetryUnavailableError(
            "no memory telemetry source could be read; tried: " + "; ".join(skipped)
        )
    if skipped:
        reading.details["skipped"] = list(skipped)
    return reading


def memtp_depth_live(
    max_depth: int = MEMTP_DEFAULTS.max_depth, coherence: float = 1.0, **kw: Any
) -> tuple[int, dict[str, Any]]:
    """Depth from the machine's real free memory (``memtp_sim depth --live``).

    Reads :func:`read_free_memory`, subtracts the reserve
    (``free_for_heads = max(0, free_gib - reserve_gib)``) and applies :func:`memtp_depth`.

    Args:
        max_depth: Upper clamp on the depth, in heads.
        coherence: Coherence ``R`` in [0, 1] (default 1.0: assume a coherent drafter).
        **kw: Optional. Telemetry: ``sysfs_root``, ``proc_meminfo``, ``nvidia_smi`` (see
            :func:`read_free_memory`). Formula: ``head_cost_gib`` (GiB, default 4.0),
            ``r_low`` (0.3), ``r_high`` (0.9), ``reserve_gib`` (GiB kept back, default 0.0).

    Returns:
        ``(depth, info)`` where ``info`` has the keys ``source``, ``free_gib``, ``total_gib``,
        ``used_gib`` (the reading, GiB), ``reserve_gib``, ``head_cost_gib``, ``coherence``,
        ``r_low``, ``r_high``, ``max_depth`` (the inputs) and ``depth``.

    Raises:
        TypeError: for an unknown keyword argument (named in the message).
        InvalidArgumentError: (a ``ValueError``) for an invalid formula argument, or a negative, NaN or
            infinite ``reserve_gib``.
        TelemetryUnavailableError: (a ``RuntimeError``) if no telemetry source could be read.

    Source:
        docs/model.md section 2 (MEMTP formula; "``depth --live`` reads the machine's real free memory").
    """
    for name in kw:
        if name not in _LIVE_TELEMETRY_KW and name not in _LIVE_FORMULA_KW:
            allowed = ", ".join(_LIVE_TELEMETRY_KW + _LIVE_FORMULA_KW)
            raise TypeError(
                f"memtp_depth_live() got an unexpected keyword argument {name!r} "
                f"(allowed: {allowed})"
            )
    head_cost_gib = kw.get("head_cost_gib", MEMTP_DEFAULTS.head_cost_gib)
    r_low = kw.get("r_low", MEMTP_DEFAULTS.r_low)
    r_high = kw.get("r_high", MEMTP_DEFAULTS.r_high)
    reserve_gib = _check_free_gib("reserve_gib", kw.get("reserve_gib", 0.0))
    # Validate the formula's inputs before touching the machine.
    memtp_depth(
        0.0, coherence, max_depth=max_depth, head_cost_gib=head_cost_gib, r_low=r_low, r_high=r_high
    )
    reading = read_free_memory(**{k: kw[k] for k in _LIVE_TELEMETRY_KW if k in kw})
    free_for_heads = max(0.0, reading.free_gib - reserve_gib)
    depth = memtp_depth(
        free_for_heads,
        coherence,
        max_depth=max_depth,
        head_cost_gib=head_cost_gib,
        r_low=r_low,
        r_high=r_high,
    )
    info: dict[str, Any] = {
        "source": reading.source,
        "free_gib": reading.free_gib,
        "total_gib": reading.total_gib,
        "used_gib": reading.used_gib,
        "reserve_gib": reserve_gib,
        "head_cost_gib": float(head_cost_gib),
        "coherence": float(coherence),
        "r_low": float(r_low),
        "r_high": float(r_high),
        "max_depth": int(max_depth),
        "depth": depth,
    }
    return depth, info

"""The compiled kernels (``memtp_sim/_kernels.pyx``, built by ``pip install``): the engine's hot
steps, Algorithm 1's scan and context pricing. :func:`active` gives the module, or None when
:data:`ENABLED` is False (tests and the benchmark compare with the numpy code that way: the same
answers bit for bit), when the extension is not built, or when it was built from another version
of ``_kernels.pyx`` than the one beside it (an old build after a pull); the numpy code then runs,
2 to 13 times slower (bench_engine), with a one-time warning per process saying how to rebuild."""

from __future__ import annotations

import hashlib
import warnings
from pathlib import Path
from types import ModuleType

__all__ = ["ENABLED", "active", "built_from_other_source", "kernels", "unavailable"]

#: use the kernels when built; False runs the numpy code they replace (same answers)
ENABLED = True

_REINSTALL = "reinstall: `pip install -e .` in a clone, or `pip install` again"
_REBUILD = f"building it needs a C compiler and the Python headers, e.g. Debian's gcc python3-dev; then {_REINSTALL}"


def _load() -> tuple[ModuleType | None, str]:
    try:
        from . import _kernels as mod  # optional: a build without a compiler has no extension
    except ImportError:  # not built: no compiler at install time, or a source tree never installed
        return None, f"memtp_sim._kernels is not built ({_REBUILD})"
    source = Path(__file__).with_name("_kernels.pyx")
    if built_from_other_source(mod, source):
        return None, (f"memtp_sim._kernels was built from another version of {source.name} than the one "
                      f"beside it (to rebuild, {_REINSTALL})")
    return mod, ""


def built_from_other_source(mod: ModuleType, source: Path) -> bool:
    """Whether the extension ``mod`` was built from another ``_kernels.pyx`` than ``source``
    (compared by sha256; an installed wheel ships the source too, and a missing source is not
    checked)."""
    if not source.exists():
        return False
    return getattr(mod, "SOURCE_SHA256", "") != hashlib.sha256(source.read_bytes()).hexdigest()


kernels, unavailable = _load()  # the module or None, and why not (a sentence)

_warned = False


def active() -> ModuleType | None:
    """The kernels module when enabled and usable; None otherwise (the first time because it is
    not usable, with a RuntimeWarning saying why and how to rebuild)."""
    global _warned
    if not ENABLED:
        return None
    if kernels is None and not _warned:
        _warned = True
        warnings.warn(f"{unavailable}: memtp_sim runs its numpy code instead, the same results several "
                      "times slower", RuntimeWarning, stacklevel=3)
    return kernels

"""The compiled kernels (``memtp_sim/_kernels.pyx``, built by ``pip install``): the engine's plain
rounds and Algorithm 1's scan. :func:`active` gives the module, or None when :data:`ENABLED` is
False (tests and the benchmark compare with the numpy code that way: the same answers bit for
bit) or when the extension is not built (the numpy code runs, about half as fast at high load,
with a one-time warning)."""

from __future__ import annotations

import warnings
from types import ModuleType

__all__ = ["ENABLED", "active", "kernels"]

try:
    from . import _kernels as kernels
except ImportError:  # a source tree run without `pip install -e .`
    kernels: ModuleType | None = None  # type: ignore[no-redef]

#: use the kernels when built; False runs the numpy code they replace (same answers)
ENABLED = True

_warned = False


def active() -> ModuleType | None:
    """The kernels module when enabled and built; None otherwise (the first time because the
    extension is missing, with a RuntimeWarning saying how to build it)."""
    global _warned
    if not ENABLED:
        return None
    if kernels is None and not _warned:
        _warned = True
        warnings.warn("memtp_sim._kernels is not built (run `pip install -e .` in the repository): the engine "
                      "runs its numpy code, the same results about half as fast", RuntimeWarning, stacklevel=3)
    return kernels

"""The engine's compiled kernels (``memtp_sim/_kernels.pyx``, built by ``pip install``), or None
when the extension is not built: the engine then runs its numpy code, the same answers bit for
bit, about half as fast at high load, and warns once (:func:`kernels_or_warn`)."""

from __future__ import annotations

import warnings
from types import ModuleType

__all__ = ["kernels", "kernels_or_warn"]

try:
    from . import _kernels as kernels
except ImportError:  # a source tree run without `pip install -e .`
    kernels: ModuleType | None = None  # type: ignore[no-redef]

_warned = False


def kernels_or_warn() -> ModuleType | None:
    """The kernels module; None, with a one-time RuntimeWarning saying how to build it, when missing."""
    global _warned
    if kernels is None and not _warned:
        _warned = True
        warnings.warn("memtp_sim._kernels is not built (run `pip install -e .` in the repository): the engine "
                      "runs its numpy code, the same results about half as fast", RuntimeWarning, stacklevel=3)
    return kernels

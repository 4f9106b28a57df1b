"""Third-party functions imported on first use: scipy alone costs more than the rest of
``import memtp_sim``, and most entry points (``--help``, config checks) never need it."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _compiled

__all__ = ["brentq", "expit", "logit"]


_LOADED: dict[str, Any] = {}  # functions imported already (an import statement costs ~1 us a call)


def expit(x: Any) -> Any:
    """``scipy.special.expit`` (the logistic sigmoid ``1 / (1 + exp(-x))``), elementwise. A float64
    array goes to the compiled kernel when built (the same bits, and a run then never imports
    ``scipy.special``: about 0.2 s of a cold what-if point)."""
    if type(x) is np.ndarray and x.dtype == np.float64 and x.ndim:  # scipy gives a 0-d array a scalar
        k = _compiled.active()
        if k is not None:
            return k.expit(x)
    f = _LOADED.get("expit")
    if f is None:
        from scipy.special import expit as f

        _LOADED["expit"] = f
    return f(x)


def logit(p: Any) -> Any:
    """``scipy.special.logit`` (``log(p / (1 - p))``), elementwise."""
    from scipy.special import logit as f

    return f(p)


def brentq(*args: Any, **kwargs: Any) -> float:
    """``scipy.optimize.brentq``: a root of a scalar function in a sign-changing bracket."""
    from scipy.optimize import brentq as f

    return f(*args, **kwargs)


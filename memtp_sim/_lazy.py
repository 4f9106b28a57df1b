"""Third-party functions imported on first use: scipy alone costs more than the rest of
``import memtp_sim``, and most entry points (``--help``, config checks) never need it."""

from __future__ import annotations

from typing import Any

__all__ = ["brentq", "expit", "logit"]


_LOADED: dict[str, Any] = {}  # functions imported already (an import statement costs ~1 us a call)


def expit(x: Any) -> Any:
    """``scipy.special.expit`` (the logistic sigmoid ``1 / (1 + exp(-x))``), elementwise."""
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


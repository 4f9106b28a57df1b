"""Policy registry: YAML name -> class. Duplicate names raise; unknown names list the choices."""

from __future__ import annotations

from typing import Any, Callable, Mapping

from ..errors import InvalidArgumentError
from .base import Policy

__all__ = ["register", "policy_class", "make_policy", "available_policies"]

_REGISTRY: dict[str, type[Policy]] = {}


def register(name: str) -> Callable[[type[Policy]], type[Policy]]:
    """Class decorator registering a policy under ``name``.

    Raises:
        InvalidArgumentError: ``name`` is already registered.
    """

    def deco(cls: type[Policy]) -> type[Policy]:
        if name in _REGISTRY:
            raise InvalidArgumentError(f"policy {name!r} is already registered by {_REGISTRY[name].__qualname__}")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def available_policies() -> list[str]:
    return sorted(_REGISTRY)


def policy_class(name: str) -> type[Policy]:
    """Look up a policy class.

    Raises:
        InvalidArgumentError: unknown name (the message lists the registered names).
    """
    try:
        return _REGISTRY[name]
    except KeyError:
        raise InvalidArgumentError(f"unknown policy {name!r}; choose one of: {', '.join(available_policies())}") from None


def make_policy(name: str, params: Mapping[str, Any] | None = None) -> Policy:
    """Build a policy from its name and parameter mapping (validated by its Params model)."""
    cls = policy_class(name)
    return cls(cls.Params(**dict(params or {})))

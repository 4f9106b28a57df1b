"""Policy registry: YAML name -> class. Duplicate names raise; unknown names list the choices.

Policies of your own register with :func:`register` when their module is imported. For a command
(``run``, ``tune``, the dashboard) name the modules in ``$MEMTP_SIM_PLUGINS`` (comma-separated,
importable from ``sys.path``/``PYTHONPATH``): every process imports them the first time it meets a
policy name it does not know, so ``tune``'s spawned workers and Dask workers started with the same
environment know the same policies.
"""

from __future__ import annotations

import os
from importlib import import_module
from typing import Any, Callable, Mapping

from ..errors import InvalidArgumentError
from .base import Policy

__all__ = ["register", "policy_class", "make_policy", "available_policies", "load_plugins", "PLUGINS_ENV"]

_REGISTRY: dict[str, type[Policy]] = {}

#: environment variable naming the modules that register policies of your own (comma-separated)
PLUGINS_ENV = "MEMTP_SIM_PLUGINS"
_loaded: dict[str, str] = {}  # module -> "" once imported, or why its import failed


def load_plugins() -> None:
    """Import the modules named in ``$MEMTP_SIM_PLUGINS`` not imported yet (their ``@register``
    classes join the registry). A module whose import failed is not imported again (it may have
    registered some of its policies before it failed; they are taken out again): every later
    call raises the same error.

    Raises:
        InvalidArgumentError: a module that cannot be imported, or that raised while imported (the
            message names it, the error and the variable).
    """
    for mod in (m.strip() for m in os.environ.get(PLUGINS_ENV, "").split(",")):
        if not mod:
            continue
        if mod not in _loaded:
            try:
                import_module(mod)
                _loaded[mod] = ""
            except Exception as exc:  # noqa: BLE001 - any failure of a user's module, said in one line
                why = str(exc).splitlines()[0] if str(exc) else ""
                _loaded[mod] = f"{type(exc).__name__}: {why}" if why else type(exc).__name__
                for name in [n for n, cls in _REGISTRY.items() if cls.__module__ == mod]:
                    del _REGISTRY[name]  # what the half-imported module registered is not handed out
        if _loaded[mod]:
            raise InvalidArgumentError(f"${PLUGINS_ENV}: cannot import {mod!r} ({_loaded[mod]}); name modules "
                                       "importable from PYTHONPATH, separated by commas")


def register(name: str) -> Callable[[type[Policy]], type[Policy]]:
    """Class decorator registering a policy under ``name``.

    Args:
        name: the YAML name (snake_case, e.g. ``"dspark_async"``); set as the class's ``name``.

    Returns:
        The decorator; it returns the class unchanged.

    Raises:
        InvalidArgumentError: (by the decorator) ``name`` is already registered.

    Source:
        STYLE.md sections 3 and 4: unlike Vidur's registry, a duplicate raises; like vLLM's
        request-queue policy factory, an unknown name is refused with the choices.
    """

    def deco(cls: type[Policy]) -> type[Policy]:
        if name in _REGISTRY:
            raise InvalidArgumentError(f"policy {name!r} is already registered by {_REGISTRY[name].__qualname__}")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def available_policies() -> list[str]:
    """The registered policy names (the plugins' too), sorted."""
    load_plugins()
    return sorted(_REGISTRY)


def policy_class(name: str) -> type[Policy]:
    """Look up a policy class.

    Args:
        name: a registered YAML name.

    Returns:
        The :class:`~memtp_sim.policies.base.Policy` subclass.

    Raises:
        InvalidArgumentError: unknown name (the message lists the registered names), or a
            ``$MEMTP_SIM_PLUGINS`` module that cannot be imported.

    Source:
        STYLE.md section 4 (vLLM's policy factory rejects unknown values, listing the choices).
    """
    cls = _REGISTRY.get(name)
    if cls is not None:
        return cls
    load_plugins()  # a plugin's policy, named before its module was imported
    try:
        return _REGISTRY[name]
    except KeyError:
        raise InvalidArgumentError(f"unknown policy {name!r}; choose one of: {', '.join(available_policies())}") from None


def make_policy(name: str, params: Mapping[str, Any] | None = None) -> Policy:
    """Build a policy from its name and parameter mapping (validated by its Params model).

    Args:
        name: a registered YAML name.
        params: the policy's parameters (None: its defaults).

    Returns:
        A new policy instance (one per run: some policies keep state).

    Raises:
        InvalidArgumentError: unknown name (from :func:`policy_class`).
        pydantic.ValidationError: parameters the policy's ``Params`` model refuses.
    """
    cls = policy_class(name)
    return cls(cls.Params(**dict(params or {})))

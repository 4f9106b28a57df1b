"""Exceptions raised by memtp_sim: one contract for the whole package.

Every error the package raises on purpose derives from :class:`MemtpSimError`, so a caller can
catch one type. Messages are one line: where (file and field, or argument), what was wrong, and
what is allowed.

Which class:

* :class:`ConfigError`: a study, scenario or tune input (a YAML file, a sweep value) is invalid.
* :class:`CalibrationError`: a hardware, acceptance or measurement file is missing, malformed or
  physically implausible.
* :class:`InvalidArgumentError`: a public function was called with an invalid argument (runtime
  misuse by a caller, not a file).
* :class:`EngineInvariantError`: a simulation invariant broke during a run (KV over capacity,
  tokens beyond a request's output, a policy plan out of range). Raised explicitly, never by a
  bare ``assert`` (which ``python -O`` strips).
* :class:`TelemetryUnavailableError`: no memory-telemetry source of this machine could be read.
* :class:`ExecutorUnavailableError`: a study's runs cannot be sent where they were asked to go
  (``--executor dask``: Dask is not installed, the scheduler cannot be reached in time, or it has
  no workers).

The first three are also :class:`ValueError` and the last three :class:`RuntimeError`, so callers
that catch the built-in types keep working. Inside pydantic validators the package raises plain
``ValueError`` (pydantic's own contract); loaders turn those into :class:`ConfigError`.
"""

from __future__ import annotations

__all__ = [
    "MemtpSimError",
    "ConfigError",
    "CalibrationError",
    "InvalidArgumentError",
    "EngineInvariantError",
    "TelemetryUnavailableError",
    "ExecutorUnavailableError",
    "ExperimentalWarning",
]


class MemtpSimError(Exception):
    """Base class of every error memtp_sim raises on purpose."""


class ConfigError(MemtpSimError, ValueError):
    """A study, scenario or tune config is invalid (unknown key, wrong type, missing file...)."""


class CalibrationError(MemtpSimError, ValueError):
    """A hardware or acceptance profile, or a measurement file, is missing, incomplete or inconsistent."""


class InvalidArgumentError(MemtpSimError, ValueError):
    """A public function received an argument outside what it accepts."""


class EngineInvariantError(MemtpSimError, RuntimeError):
    """A simulation invariant broke (the message names the invariant and the values)."""


class TelemetryUnavailableError(MemtpSimError, RuntimeError):
    """No memory-telemetry source (AMD sysfs, NVIDIA, /proc/meminfo) could be read."""


class ExecutorUnavailableError(MemtpSimError, RuntimeError):
    """A study's executor cannot be used (the message says why and what to install or start)."""


class ExperimentalWarning(UserWarning):
    """A feature whose behaviour may still change between minor versions."""

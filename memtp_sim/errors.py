"""Exceptions raised by memtp_sim.

Every error the package raises on purpose derives from :class:`MemtpSimError`, so a
caller can catch one type. Messages are one line: where (file and field), what was
wrong, and what is allowed.
"""

from __future__ import annotations

__all__ = ["MemtpSimError", "ConfigError", "CalibrationError", "ExperimentalWarning"]


class MemtpSimError(Exception):
    """Base class of every error memtp_sim raises on purpose."""


class ConfigError(MemtpSimError, ValueError):
    """A study or scenario config is invalid (unknown key, wrong type, missing file...)."""


class CalibrationError(MemtpSimError, ValueError):
    """A hardware or acceptance profile is missing, incomplete or inconsistent."""


class ExperimentalWarning(UserWarning):
    """A feature whose behaviour may still change between minor versions."""

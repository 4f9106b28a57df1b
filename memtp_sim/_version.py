"""The package version (one place; read by the package root, run results and exports)."""

__version__ = "0.1.0"

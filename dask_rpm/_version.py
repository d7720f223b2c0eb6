"""The package version: one source, read by pyproject.toml (setuptools dynamic version)."""

__version__ = "0.1.0.dev0"

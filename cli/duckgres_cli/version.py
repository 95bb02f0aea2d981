"""The client's version: ``duckgres --version`` and the distribution's (``cli/pyproject.toml``
reads it from here)."""

__version__ = "0.1.0"

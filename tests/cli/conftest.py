"""The CLI tests' fixture: ``cli`` runs the installed console script against the live API
(tests/fixtures/cli.py)."""

from tests.fixtures.cli import cli

__all__ = ["cli"]

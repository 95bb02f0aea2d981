"""The CLI's one failure type and its exit codes (docs/cli.md "Exit codes")."""

from __future__ import annotations

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_TRANSPORT = 3
EXIT_OP_NOT_SUCCEEDED = 4
EXIT_NOT_OFFERED = 5
EXIT_DEADLINE = 6


class CliError(Exception):
    def __init__(self, message: str, exit_code: int, *, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
        self.status = status

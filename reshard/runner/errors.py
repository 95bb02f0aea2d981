"""The runner's control-flow exceptions.

``Fenced`` ends the runner's involvement at once (no rollback, no terminal write). The others
end the step machine and lead to rollback and a terminal write (spec reshard §4.3).
"""

from __future__ import annotations


class Fenced(Exception):
    """A fenced write matched zero rows, or the runner fenced itself: stop all side effects."""

    def __init__(
        self,
        message: str = "operation fenced: another runner took over; this runner abandons it",
    ) -> None:
        super().__init__(message)


class StepError(Exception):
    """A step failed; the message is the operator-facing error (scrubbed before it is stored)."""


class StepUnavailable(StepError):
    """The step exists in the spec's sequence but is not built into this version."""

    def __init__(self, step: str) -> None:
        super().__init__(f"step {step} is not available in this build of Duckgres Admin")
        self.step = step


class Cancelled(Exception):
    """The operator's cancel flag was observed before the cutoff."""


class Interrupted(Exception):
    """``stop`` was set (SIGTERM or fencing) while a step was working or waiting."""


class RollForwardUnavailable(Exception):
    """A commit point has passed but this build cannot roll forward; never roll back then."""

"""The one refusal type of every layer: API views, reshard services, Trino placement, auth.

A :class:`ServiceError` carries what the API answers: the HTTP status, the message (scrubbed by
the API before it is sent, spec reshard §2.7), an optional machine-readable ``code``, response
headers, and extra body fields (Trino placement's ``"assigned": true``).
"""

from __future__ import annotations

from typing import Any

from duckgres_admin.base.scrub import Scrubber


class ServiceError(Exception):
    """A refusal with its HTTP status, message and optional machine-readable code."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.headers = headers or {}
        self.extra = extra

    def body(self) -> dict[str, Any]:
        """``{"error", "code"?}`` plus the extra fields (unscrubbed: the API scrubs ``error``)."""
        body: dict[str, Any] = {"error": self.message}
        if self.code:
            body["code"] = self.code
        if self.extra:
            body.update(self.extra)
        return body

    def scrubbed(self, scrubber: Scrubber) -> ServiceError:
        return ServiceError(
            self.status,
            scrubber.scrub(self.message),
            code=self.code,
            headers=self.headers,
            extra=self.extra,
        )

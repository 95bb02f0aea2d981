"""RFC 3339 timestamps as every face writes them: the API's JSON, webhook events, the admin's
progress page, lease answers, the backup listing, ``reshard_recover``'s printout, pod
annotations, Trino evidence and the op log's S3-session line. One rule each, so two faces never
disagree on the same instant.

- :func:`rfc3339`: ``datetime.isoformat()`` with ``+00:00`` written ``Z`` (microseconds kept when
  the value has them). The value is written in its own offset; callers pass UTC values (the
  config store's, Django's with ``USE_TZ``).
- :func:`rfc3339_seconds`: converted to UTC, whole seconds, ``Z`` (Kubernetes' own format, and
  the one Trino's evidence and the S3 session's expiry use).
"""

from __future__ import annotations

from datetime import UTC, datetime


def rfc3339(value: datetime) -> str:
    return value.isoformat().replace("+00:00", "Z")


def rfc3339_seconds(value: datetime) -> str:
    return value.astimezone(UTC).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")

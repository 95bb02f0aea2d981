"""Webhook signatures: ``X-Duckgres-Signature: v1=<hex HMAC-SHA256(secret, "<ts>." + body)>``.

The timestamp (``X-Duckgres-Timestamp``, Unix seconds) is inside the signed bytes, so a
receiver that refuses old timestamps (5 minutes is the documented tolerance) also refuses
replays. ``verify`` is the receiver's side, used by the tests and shown in
docs/notifications.md.
"""

from __future__ import annotations

import hashlib
import hmac

VERSION = "v1"
TIMESTAMP_HEADER = "X-Duckgres-Timestamp"
SIGNATURE_HEADER = "X-Duckgres-Signature"
DEFAULT_TOLERANCE_SECONDS = 300


def signature(secret: str, timestamp: int, body: bytes) -> str:
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"{VERSION}={mac.hexdigest()}"


def verify(
    secret: str,
    timestamp_header: str,
    signature_header: str,
    body: bytes,
    *,
    now: float,
    tolerance_seconds: int = DEFAULT_TOLERANCE_SECONDS,
) -> bool:
    """True when the signature matches ``body`` and the timestamp is within the tolerance."""
    try:
        timestamp = int(timestamp_header)
    except ValueError:
        return False
    if abs(now - timestamp) > tolerance_seconds:
        return False
    return hmac.compare_digest(signature(secret, timestamp, body), signature_header.strip())

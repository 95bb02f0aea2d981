"""The one RFC 3339 rule per form (duckgres_admin/base/times.py), as the faces print it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from duckgres_admin.base.times import rfc3339, rfc3339_seconds


def test_rfc3339_writes_utc_as_z_and_keeps_microseconds() -> None:
    assert rfc3339(datetime(2026, 12, 6, 15, 4, 5, 123456, tzinfo=UTC)) == (
        "2026-12-06T15:04:05.123456Z"
    )
    assert rfc3339(datetime(2026, 12, 6, 15, 4, 5, tzinfo=UTC)) == "2026-12-06T15:04:05Z"


def test_rfc3339_seconds_converts_to_utc_and_drops_the_fraction() -> None:
    east = timezone(timedelta(hours=2))
    assert rfc3339_seconds(datetime(2026, 12, 6, 17, 4, 5, 999999, tzinfo=east)) == (
        "2026-12-06T15:04:05Z"
    )

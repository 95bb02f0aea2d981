"""Unit tests of the duration parser (pure logic)."""

import pytest

from duckgres_admin.platform.config import parse_duration_seconds


@pytest.mark.parametrize(
    ("raw", "seconds"),
    [("90s", 90), ("15m", 900), ("1h30m", 5400), ("120", 120), ("-5", -5), ("2h", 7200)],
)
def test_durations_parse(raw, seconds):
    assert parse_duration_seconds(raw) == seconds


@pytest.mark.parametrize("raw", ["", "soon", "15 m", "1.5m", "m", "1d"])
def test_invalid_durations_are_none(raw):
    assert parse_duration_seconds(raw) is None

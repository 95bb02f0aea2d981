"""Rate-limited "Trino pool member is waiting." lines (spec trino-pools §4.6, safeguard 35)."""

from __future__ import annotations

import logging

import pytest

from trino_pools.waitlog import MESSAGE, WaitLog


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


OBLIGATIONS = {
    "pending_requests": 0,
    "open_transactions": 1,
    "active_queries": 2,
    "ready_to_seal": False,
    "drained": False,
}


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def waits(clock, caplog) -> WaitLog:
    caplog.set_level(logging.INFO, logger="duckgres.trino.operator")
    return WaitLog(clock=clock)


def lines(caplog) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "duckgres.trino.operator" and r.getMessage() == MESSAGE
    ]


def poll(
    waits: WaitLog, instance: str = "cell-00000001", reason: str = "gateway_obligations", **kw
):
    fields = dict(OBLIGATIONS) if reason == "gateway_obligations" else {}
    fields.update(kw)
    return waits.waiting("pool-a", instance, 7, "DRAINING", 12.5, reason, **fields)


@pytest.mark.safeguard("trino-35")
def test_hundred_drain_polls_in_a_minute_log_once_then_a_five_minute_heartbeat(
    waits, clock, caplog
):
    logged = []
    for _ in range(100):
        logged.append(poll(waits))
        clock.now += 0.6  # 100 polls in 60 s
    assert logged.count(True) == 1
    assert logged[0]
    assert len(lines(caplog)) == 1

    # Unchanged reason: the next line is the heartbeat, 5 minutes after the first line.
    start = 1000.0
    while clock.now < start + 299.9:
        assert not poll(waits)
        clock.now += 5
    clock.now = start + 300
    assert poll(waits)
    assert len(lines(caplog)) == 2
    clock.now += 5
    assert not poll(waits)


@pytest.mark.safeguard("trino-35")
def test_departed_instances_leave_the_cache(waits, clock):
    poll(waits, "cell-00000001")
    poll(waits, "cell-00000002")
    waits.waiting("pool-b", "cell-00000009", 3, "CREATING", 1.0, "kubernetes_resources")
    assert waits.cached() == {"cell-00000001", "cell-00000002", "cell-00000009"}

    waits.retain(["cell-00000002"], pool="pool-a")  # only pool-a's snapshot is authoritative here
    assert waits.cached() == {"cell-00000002", "cell-00000009"}
    waits.retain([])
    assert waits.cached() == frozenset()
    # A forgotten instance logs again at once.
    assert poll(waits, "cell-00000002")


def test_reason_change_logs_at_most_once_per_30_seconds(waits, clock, caplog):
    assert poll(waits)
    clock.now += 10
    assert not poll(waits, reason="kubernetes_resources")  # changed, but within 30 s
    clock.now += 20  # 30 s after the first line
    assert poll(waits, reason="kubernetes_resources")
    clock.now += 1
    assert not poll(waits)  # changed back within 30 s
    clock.now += 29
    assert poll(waits)
    assert [r.__dict__["reason"] for r in lines(caplog)] == [
        "gateway_obligations",
        "kubernetes_resources",
        "gateway_obligations",
    ]


def test_instances_are_limited_independently(waits, caplog):
    assert poll(waits, "cell-00000001")
    assert poll(waits, "cell-00000002")
    assert not poll(waits, "cell-00000001")
    assert len(lines(caplog)) == 2


def test_obligation_fields_on_the_line(waits, caplog):
    poll(waits)
    (record,) = lines(caplog)
    assert record.__dict__["pool"] == "pool-a"
    assert record.__dict__["instance"] == "cell-00000001"
    assert record.__dict__["epoch"] == 7
    assert record.__dict__["phase"] == "DRAINING"
    assert record.__dict__["phase_age_seconds"] == 12.5
    assert record.__dict__["reason"] == "gateway_obligations"
    for name, val in OBLIGATIONS.items():
        assert getattr(record, name) == val


def test_kubernetes_resources_never_invents_obligation_fields(waits, caplog):
    waits.waiting(
        "pool-a", "cell-00000001", 7, "CREATING", 3.0, "kubernetes_resources", active_queries=5
    )
    (record,) = lines(caplog)
    assert record.__dict__["reason"] == "kubernetes_resources"
    for name in OBLIGATIONS:
        assert not hasattr(record, name)


def test_gateway_obligations_needs_every_obligation_field(waits):
    with pytest.raises(TypeError, match="open_transactions"):
        waits.waiting(
            "pool-a",
            "cell-00000001",
            7,
            "DRAINING",
            3.0,
            "gateway_obligations",
            pending_requests=0,
            active_queries=0,
            ready_to_seal=True,
            drained=True,
        )


def test_reserved_field_names_are_refused(waits):
    with pytest.raises(ValueError, match="reserved"):
        waits.waiting("pool-a", "cell-00000001", 7, "CREATING", 3.0, "x", message="hi")


def test_the_json_log_line_carries_the_fields(clock):
    """With the ExtraAdder the project's JSON formatter uses (duckgres_admin.platform.logs), the
    extras
    become JSON keys."""
    import io
    import json

    import structlog

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[structlog.stdlib.ExtraAdder()],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.JSONRenderer(),
            ],
        )
    )
    logger = logging.getLogger("duckgres.trino.operator.test-json")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        WaitLog(clock=clock, logger=logger).waiting(
            "pool-a", "cell-00000001", 7, "DRAINING", 1.0, "gateway_obligations", **OBLIGATIONS
        )
    finally:
        logger.removeHandler(handler)
    doc = json.loads(stream.getvalue())
    assert doc["event"] == MESSAGE
    assert doc["instance"] == "cell-00000001"
    assert doc["open_transactions"] == 1

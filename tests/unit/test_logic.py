"""The pure logic of the engine and the storage layer: retries, outages, plans, queries.

No Postgres here (``pytest tests/unit``)."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Generator
from typing import Any

import psycopg
import pytest

from dbos_agent._engine.runtime.notifications import Waiter
from dbos_agent._engine.runtime.plans import Io, Wait, run_plan, run_plan_async
from dbos_agent._engine.runtime.registry import RetryPolicy
from dbos_agent._processes import known_gone, process_key
from dbos_agent._storage.dsn import redact_url, scrub
from dbos_agent._storage.outages import OutageMonitor, Retrier, is_transient, is_value_error
from dbos_agent._storage.sql_files import migrations, parse_named_queries, queries
from dbos_agent.errors import DatabaseUnavailableError, DbosAgentError


def test_retry_policy_backs_off_within_bounds_and_never_retries_engine_signals() -> None:
    policy = RetryPolicy(retries=3, interval=1.0, backoff=2.0, max_interval=3.0, jitter=0.0)
    assert [policy.delay_before_retry(n, OSError()) for n in (1, 2, 3, 4)] == [1.0, 2.0, 3.0, None]
    assert policy.delay_before_retry(1, DbosAgentError()) is None
    only = RetryPolicy(retries=5, retry_on=(TimeoutError,))
    assert only.delay_before_retry(1, ValueError()) is None
    with pytest.raises(ValueError, match="jitter"):
        RetryPolicy(jitter=2)


@pytest.mark.parametrize(
    ("error", "transient", "value"),
    [
        (psycopg.OperationalError("connection refused"), True, False),
        (psycopg.errors.AdminShutdown(), True, False),
        (psycopg.errors.ReadOnlySqlTransaction(), True, False),
        (psycopg.InterfaceError("the connection is closed"), True, False),
        (psycopg.errors.UntranslatableCharacter(), False, True),
        (psycopg.errors.NumericValueOutOfRange(), False, True),
        (psycopg.errors.ProgramLimitExceeded(), False, True),
        (psycopg.errors.UndefinedTable(), False, False),
    ],
)
def test_outages_and_refused_values_are_told_apart(
    error: Exception, transient: bool, value: bool
) -> None:
    assert is_transient(error) is transient and is_value_error(error) is value


def test_the_retrier_rides_out_failures_and_logs_the_outage_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    attempts = iter([psycopg.OperationalError("down")] * 3 + [None])

    def flaky() -> str:
        failure = next(attempts)
        if failure is not None:
            raise failure
        return "ok"

    retrier = Retrier(OutageMonitor("db"), timeout=5)
    with caplog.at_level(logging.INFO, logger="dbos_agent._storage.outages"):
        assert retrier.call(flaky, "do it") == "ok"
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2 and "unavailable" in messages[0] and "again" in messages[1]


def test_past_the_bound_the_retrier_raises_database_unavailable() -> None:
    def down() -> None:
        raise psycopg.OperationalError("refused")

    with pytest.raises(DatabaseUnavailableError, match=r"could not do it: .* for 0\.2s"):
        Retrier(OutageMonitor("db"), timeout=0.2).call(down, "do it")
    with pytest.raises(psycopg.errors.UndefinedTable):  # not an outage: at once
        Retrier(OutageMonitor("db"), timeout=5).call(
            lambda: (_ for _ in ()).throw(psycopg.errors.UndefinedTable()), "do it"
        )


def _plan(log: list[str]) -> Generator[Io | Wait, Any, str]:
    first = yield Io(lambda: "one")
    log.append(first)
    yield Wait(None, 0.0)
    try:
        yield Io(lambda: 1 / 0)
    except ZeroDivisionError:
        log.append("caught")
    return "done"


def test_a_plan_runs_the_same_sync_and_async() -> None:
    sync_log: list[str] = []
    async_log: list[str] = []
    assert run_plan(_plan(sync_log)) == "done"
    assert asyncio.run(run_plan_async(_plan(async_log))) == "done"
    assert sync_log == async_log == ["one", "caught"]


def test_a_waiter_wakes_sync_and_async_waits() -> None:
    closed = threading.Event()
    waiter = Waiter(closed)
    threading.Timer(0.05, waiter.wake).start()
    waiter.wait(5)  # returns early: woken

    async def waits() -> None:
        asyncio.get_running_loop().call_later(0.05, waiter.wake)
        await waiter.wait_async(5)

    asyncio.run(asyncio.wait_for(waits(), 2))


def test_every_named_query_parses_and_every_migration_is_numbered() -> None:
    found = queries()
    assert {"append_step", "record_step", "claim_workflows", "insert_workflow"} <= set(found)
    assert all(sql.strip() and not sql.rstrip().endswith(";") for sql in found.values())
    versions = [v for v, _, _ in migrations()]
    assert versions[0] == 1 and versions == sorted(set(versions))
    with pytest.raises(ValueError, match="twice"):
        parse_named_queries("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;")


def test_passwords_never_survive_scrubbing() -> None:
    url = "postgresql://app:s3cr%40t@db.example:5432/prod?sslmode=require"
    assert "s3cr" not in redact_url(url)
    message = f"connection to {url} failed; also password=hunter2 and {url.replace('app', 'x')}"
    cleaned = scrub(message, url)
    assert "s3cr" not in cleaned and "hunter2" not in cleaned


def test_this_process_is_alive_and_a_made_up_one_is_known_gone() -> None:
    key = process_key()
    if key is None:
        pytest.skip("no /proc here")
    assert not known_gone(key)
    namespace, _, _ = key.rpartition("/")
    namespace = namespace.rsplit("/", 1)[0]
    assert known_gone(f"{namespace}/999999999/1")
    assert not known_gone("another-host/ns/1/1")  # another namespace: nobody can tell


def test_a_quiet_outage_monitor_logs_at_debug_only(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="dbos_agent._storage.outages")
    for warn, levels in ((True, {logging.WARNING, logging.INFO}), (False, {logging.DEBUG})):
        caplog.clear()
        monitor = OutageMonitor("db", warn=warn)
        monitor.failed(OSError("connection refused"))
        monitor.succeeded()
        assert {r.levelno for r in caplog.records} == levels


def test_an_outage_right_after_another_is_not_announced_either_way(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="dbos_agent._storage.outages")
    monitor = OutageMonitor("db")
    monitor.failed(OSError("restart"))
    monitor.succeeded()
    caplog.clear()
    monitor.failed(OSError("a stale pooled connection"))  # within the quiet window
    monitor.succeeded()
    assert {r.levelno for r in caplog.records} == {logging.DEBUG}

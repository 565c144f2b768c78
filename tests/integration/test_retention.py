"""Retention: finished workflows past an age go with their steps, messages and events;
younger ones and those that may still run (or wait for a person) stay, at any age.

Workflows are run for real, then made old (or put in a status) with SQL.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest

import dbos_agent as da
from dbos_agent._durations import format_duration, parse_duration
from dbos_agent._engine.runtime.current import current_engine
from dbos_agent.testing import fresh_database
from tests.helpers import cli, new_id, ok, refused, wait_until
from tests.processes import output

DAY = timedelta(days=1)
#: Rows of one workflow of :func:`job`: itself, 2 steps + set_event, 1 message, 1 event.
FULL = (1, 3, 1, 1)
GONE = (0, 0, 0, 0)


@pytest.fixture
def dbos_agent_database_url(dbos_agent_postgres_url: str) -> Iterator[str]:
    """A database of this test alone: retention deletes by age across the whole
    database, so its counts are exact only where no other test's workflows live."""
    with fresh_database(dbos_agent_postgres_url) as url:
        yield url


@da.step
def work(i: int) -> int:
    return i


@da.durable_workflow
def job(fail: bool) -> int:
    work(0)
    work(1)
    da.set_event("progress", "done")
    if fail:
        raise RuntimeError("the job failed")
    return 2


def finished(*, fail: bool = False) -> str:
    """A workflow run to its end (SUCCESS, or ERROR), with a message sent to it after."""
    wid = new_id()
    with da.workflow_id(wid):
        if fail:
            with pytest.raises(RuntimeError):
                job(True)
        else:
            job(False)
    da.send(wid, "too late")
    return wid


def rows(rt: da.Runtime, wid: str) -> tuple[int, int, int, int]:
    """(workflows, steps, messages, events) rows of one workflow id."""
    counts = current_engine().db.inspection.rows_of(wid)
    return counts.workflows, counts.steps, counts.messages, counts.events


def age(rt: da.Runtime, wid: str, days: float) -> None:
    """Make a workflow look created and finished ``days`` ago."""
    with current_engine().db.connection() as conn:
        conn.execute(
            "UPDATE dbos_agent.workflows SET"
            " created_at = now() - make_interval(secs => %(s)s + 1),"
            " finished_at = now() - make_interval(secs => %(s)s)"
            " WHERE workflow_id = %(w)s",
            {"s": days * 86400, "w": wid},
        )


def put(rt: da.Runtime, wid: str, status: da.WorkflowStatus) -> None:
    """Give a finished workflow another status (of a function no process here has, so
    nothing here recovers or takes it over), keeping its finished_at: only the status can
    protect it then."""
    with current_engine().db.connection() as conn:
        conn.execute(
            "UPDATE dbos_agent.workflows SET status = %s, output = NULL, error = NULL,"
            " executor_id = 'elsewhere', owner_key = NULL, name = 'registered-elsewhere'"
            " WHERE workflow_id = %s",
            (status, wid),
        )


def counts(report: da.operations.GcReport) -> tuple[int, int, int, int]:
    return report.workflows, report.steps, report.messages, report.events


def test_old_finished_workflows_go_with_their_rows_and_nothing_else(runtime: da.Runtime) -> None:
    old = {"success": finished(), "error": finished(fail=True)}
    for status in (da.WorkflowStatus.CANCELLED, da.WorkflowStatus.MAX_RECOVERY_ATTEMPTS_EXCEEDED):
        old[status] = finished()
        put(runtime, old[status], status)
    kept = {"young": finished()}
    for status in (
        da.WorkflowStatus.PENDING,
        da.WorkflowStatus.ENQUEUED,
        da.WorkflowStatus.IN_DOUBT,
    ):
        kept[status] = finished()
        put(runtime, kept[status], status)
        age(runtime, kept[status], 3650)
    age(runtime, kept["young"], 0.9)
    for wid in old.values():
        age(runtime, wid, 2)
    assert da.retrieve(old["error"]).status() == da.WorkflowStatus.ERROR
    assert all(rows(runtime, wid) == FULL for wid in [*old.values(), *kept.values()])

    report = da.operations.garbage_collect(DAY)

    assert counts(report) == (4, 12, 4, 4)
    assert (report.batches, report.dry_run) == (1, False)
    assert report.seconds > 0
    assert {name: rows(runtime, wid) for name, wid in old.items()} == dict.fromkeys(old, GONE)
    assert {name: rows(runtime, wid) for name, wid in kept.items()} == dict.fromkeys(kept, FULL)
    assert counts(da.operations.garbage_collect(DAY)) == GONE, "a second pass finds nothing"


def test_statuses_choose_what_goes(runtime: da.Runtime) -> None:
    success, error = finished(), finished(fail=True)
    age(runtime, success, 2)
    age(runtime, error, 2)
    assert counts(da.operations.garbage_collect(DAY, statuses="ERROR")) == FULL
    assert (rows(runtime, success), rows(runtime, error)) == (FULL, GONE)


def test_a_dry_run_deletes_nothing_and_counts_what_a_real_run_deletes(
    runtime: da.Runtime,
) -> None:
    old = [finished(), finished(fail=True), finished()]
    young = finished()
    for wid in old:
        age(runtime, wid, 30)

    dry = da.operations.garbage_collect(DAY, dry_run=True, batch_size=2)

    assert (counts(dry), dry.batches, dry.dry_run) == ((3, 9, 3, 3), 2, True)
    assert all(rows(runtime, wid) == FULL for wid in [*old, young])
    real = da.operations.garbage_collect(DAY, batch_size=2)
    assert (counts(real), real.batches, real.dry_run) == (counts(dry), dry.batches, False)
    assert [rows(runtime, wid) for wid in [*old, young]] == [GONE, GONE, GONE, FULL]


def test_batches_take_the_oldest_first_until_one_comes_back_short(runtime: da.Runtime) -> None:
    wids = [finished() for _ in range(5)]
    for days, wid in enumerate(wids):
        age(runtime, wid, 10 - days)  # wids[0] is the oldest
    seen: list[tuple[int, int, list[str]]] = []

    def progress(so_far: da.operations.GcReport) -> None:
        left = [wid for wid in wids if rows(runtime, wid) == FULL]
        seen.append((so_far.batches, so_far.workflows, left))

    report = da.operations.garbage_collect(DAY, batch_size=2, progress=progress)

    assert (report.batches, counts(report)) == (3, (5, 15, 5, 5))
    assert seen == [(1, 2, wids[2:]), (2, 4, wids[4:]), (3, 5, [])]


def test_bad_arguments_are_refused_before_anything_is_deleted(
    runtime: da.Runtime, dbos_agent_database_url: str
) -> None:
    wid = finished()
    age(runtime, wid, 2)
    for status in ("PENDING", "ENQUEUED", "IN_DOUBT", "DONE"):
        with pytest.raises(ValueError, match=status):
            da.operations.garbage_collect(DAY, statuses=["SUCCESS", status])
    with pytest.raises(ValueError, match="at least one"):
        da.operations.garbage_collect(DAY, statuses=[])
    for bad_age in (timedelta(0), timedelta(seconds=-5)):
        with pytest.raises(ValueError, match="positive"):
            da.operations.garbage_collect(bad_age)
        with pytest.raises(ValueError, match="positive"):  # before "already launched"
            da.launch(dbos_agent_database_url, retention=bad_age)
    with pytest.raises(ValueError, match="batch_size must be at least 1, got 0"):
        da.operations.garbage_collect(DAY, batch_size=0)
    assert rows(runtime, wid) == FULL


def test_durations_read_as_people_type_them() -> None:
    for text, seconds in [
        ("45s", 45),
        ("90m", 5400),
        ("12h", 43200),
        ("30d", 2592000),
        ("2w", 1209600),
        ("3600", 3600),
        (" 1.5H ", 5400),
    ]:
        assert parse_duration(text) == timedelta(seconds=seconds), text
    for text in ("nonsense", "", "0", "0s", "-1h", "5y", "1e3s", "9" * 30 + "w"):
        with pytest.raises(ValueError, match=repr(text)):
            parse_duration(text)
    with pytest.raises(ValueError):
        parse_duration("3600", unit_required=True)
    for text in ("45s", "90m", "12h", "30d", "2w", "2.5s"):
        assert format_duration(parse_duration(text)) == text


def test_the_gc_command(runtime: da.Runtime, dbos_agent_database_url: str) -> None:
    url = dbos_agent_database_url
    old, young = [finished(), finished(fail=True)], finished()
    for wid in old:
        age(runtime, wid, 2)

    dry = json.loads(ok(cli(url, "gc", "--older-than", "1d", "--dry-run", "--json")))
    assert {k: dry[k] for k in ("workflows", "steps", "messages", "events", "dry_run")} == {
        "workflows": 2,
        "steps": 6,
        "messages": 2,
        "events": 2,
        "dry_run": True,
    }
    assert [rows(runtime, wid) for wid in [*old, young]] == [FULL, FULL, FULL]
    done = json.loads(ok(cli(url, "gc", "--older-than", "1d", "--json", "--batch-size", "1")))
    assert {k: done[k] for k in ("workflows", "steps", "messages", "events", "batches")} == {
        "workflows": 2,
        "steps": 6,
        "messages": 2,
        "events": 2,
        "batches": 3,
    }
    assert (done["dry_run"], done["older_than_seconds"]) == (False, 86400)
    assert [rows(runtime, wid) for wid in [*old, young]] == [GONE, GONE, FULL]
    summary = ok(cli(url, "gc", "--older-than", "24h", "--status", "success", "error"))
    assert summary.startswith("deleted 0 workflow(s) finished more than 1d ago (SUCCESS, ERROR)")

    refused(cli(url, "gc", "--older-than", "nonsense"), 2, "'nonsense' is not a duration")
    refused(cli(url, "gc", "--older-than", "1d", "--status", "PENDING"), 2, "PENDING workflows")
    refused(cli(url, "gc"), 2, "--older-than")
    assert rows(runtime, young) == FULL


def test_the_worker_reads_retention_with_the_same_parser(dbos_agent_database_url: str) -> None:
    result = cli(
        dbos_agent_database_url, "worker", "--app", "tests.apps.worker_app", "--retention", "1y"
    )
    assert result.returncode == 2, output(result)
    assert "argument --retention: '1y' is not a duration" in result.stderr


def test_launch_with_retention_deletes_by_itself(
    dbos_agent_database_url: str, executor_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dbos_agent._engine.runtime.retention")
    rt = da.launch(dbos_agent_database_url, executor_id=executor_id, retention=timedelta(seconds=2))
    try:
        old, pending = finished(), finished()
        put(rt, pending, da.WorkflowStatus.PENDING)
        with current_engine().db.connection() as conn:  # break it: the runner logs, carries on
            conn.execute("ALTER TABLE dbos_agent.events RENAME TO events_away")
        for wid in (old, pending):
            age(rt, wid, 1)
        wait_until(lambda: "retention failed" in caplog.text, 10, "the failure logged")
        assert current_engine().db.workflows.get(old) is not None
        with current_engine().db.connection() as conn:
            conn.execute("ALTER TABLE dbos_agent.events_away RENAME TO events")
        wait_until(lambda: rows(rt, old) == GONE, 10, "the old workflow deleted")

        recent = finished()
        finished_at = time.monotonic()
        wait_until(lambda: rows(rt, recent) == GONE, 10, "the recent workflow deleted")
        assert time.monotonic() - finished_at > 1.5, "not before it was 2 s old"
        assert rows(rt, pending) == FULL
        assert "retention: deleted 1 workflow(s) finished more than 2s ago" in caplog.text
    finally:
        rt.shutdown(grace=5)


def test_a_long_retention_interval_does_not_hold_up_shutdown(
    dbos_agent_database_url: str, executor_id: str
) -> None:
    rt = da.launch(dbos_agent_database_url, executor_id=executor_id, retention=timedelta(days=30))
    runner = next(t for t in threading.enumerate() if t.name == "dbos-agent-retention")
    started = time.monotonic()
    rt.shutdown(grace=10)
    assert not runner.is_alive()
    assert time.monotonic() - started < 120, "the runner waits on shutdown, not on its hour"

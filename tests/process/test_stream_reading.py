"""A workflow body that reads a stream: each item it reads is a step, so a replay reads the
same items whatever the stream holds then; a cancel ends its wait for the next item."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

import dbos_agent as da
from dbos_agent.testing import Inspector
from tests.helpers import new_id, wait_until
from tests.processes import output
from tests.support import zygote

ROOT = Path(__file__).resolve().parents[2]


@da.durable_workflow(name="stream_reading_source")
def source(items: list[int]) -> None:
    for item in items:
        da.write_stream("s", item)
    if da.recv("close", timeout=None) == "close":
        da.close_stream("s")


@da.durable_workflow(name="stream_reading_reader")
def reader(source_id: str) -> list[object]:
    return [item.value for item in da.read_stream(source_id, "s")]


@da.durable_workflow(name="stream_reading_reader_async")
async def reader_async(source_id: str) -> list[object]:
    return [item.value async for item in da.aio.read_stream(source_id, "s")]


def read_steps(workflow_id: str) -> int:
    return sum(
        1 for s in da.operations.list_steps(workflow_id) if s.name == "dbos_agent.read_stream"
    )


@pytest.mark.parametrize("workflow", [reader, reader_async])
def test_a_workflow_waiting_in_read_stream_is_cancelled(
    runtime: da.Runtime, inspector: Inspector, workflow: object
) -> None:
    sid = new_id("source")
    da.start(source, [7], workflow_id=sid)
    handle = da.start(workflow, sid)  # type: ignore[call-overload]
    wid = handle.workflow_id
    wait_until(lambda: read_steps(wid) == 1, 15, "the reader read the first item")
    da.operations.cancel(wid)  # it waits for a second item, which never comes
    with pytest.raises(da.WorkflowCancelledError):
        handle.result(timeout=30)
    assert inspector.status(wid) == "CANCELLED"
    assert read_steps(wid) == 1
    da.send(sid, "close", topic="close")
    assert da.retrieve(sid).result(timeout=30) is None


def closed_source(items: list[int]) -> str:
    """A finished source workflow whose stream holds ``items`` and is closed."""
    sid = new_id("source")
    da.start(source, items, workflow_id=sid)
    da.send(sid, "close", topic="close")
    assert da.retrieve(sid).result(timeout=30) is None
    return sid


def test_a_replay_reads_what_the_run_read_not_the_stream(
    runtime: da.Runtime, dbos_agent_database_url: str
) -> None:
    sid = closed_source([1, 2])
    rid = new_id("reader")
    with da.workflow_id(rid):
        assert reader(sid) == [1, 2]
    assert read_steps(rid) == 3  # two items and the end
    with psycopg.connect(dbos_agent_database_url, autocommit=True) as conn:
        conn.execute(
            "UPDATE dbos_agent.streams SET value = '99' WHERE workflow_id = %s AND kind = 'value'",
            (sid,),
        )
    assert da.operations.fork(rid, 3).result(timeout=30) == [1, 2]  # every read replayed
    assert da.operations.fork(rid, 1).result(timeout=30) == [1, 99]  # the first replayed, then live


def test_a_reader_killed_and_recovered_replays_what_it_read_before(
    runtime: da.Runtime, dbos_agent_database_url: str
) -> None:
    """The stream changes under the killed reader; its recovery still has what it read."""
    url, rid, sid = dbos_agent_database_url, new_id("reader"), new_id("source")
    da.start(source, [1, 2], workflow_id=sid)  # open: it waits for "close"
    env = {**os.environ, "DBOS_AGENT_DATABASE_URL": url, "PYTHONPATH": str(ROOT)}

    def run_reader() -> subprocess.Popen[str]:
        return zygote.popen(
            [sys.executable, "-m", "tests.apps.stream_reader_app", rid, sid],
            env=env,
            cwd=ROOT,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

    first = run_reader()
    try:
        wait_until(lambda: read_steps(rid) == 2, 30, "the reader read two items")
    finally:
        first.send_signal(signal.SIGKILL)
        first.communicate(timeout=30)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "UPDATE dbos_agent.streams SET value = '99' WHERE workflow_id = %s AND kind = 'value'",
            (sid,),
        )
    da.send(sid, "close", topic="close")
    assert da.retrieve(sid).result(timeout=30) is None
    second = run_reader()
    out, err = second.communicate(timeout=60)
    assert second.returncode == 0, output(second, out, err)
    assert json.loads(out) == [1, 2]
    assert read_steps(rid) == 3


@da.durable_workflow(name="stream_reading_impatient")
def impatient(source_id: str) -> str:
    try:
        return str([item.value for item in da.read_stream(source_id, "s", timeout=0.1)])
    except TimeoutError:
        return "timed out"


def test_a_timeout_is_recorded_and_replayed(runtime: da.Runtime) -> None:
    sid = new_id("source")
    da.start(source, [], workflow_id=sid)  # nothing written: the read times out
    rid = new_id("impatient")
    with da.workflow_id(rid):
        assert impatient(sid) == "timed out"
    da.send(sid, "close", topic="close")
    assert da.retrieve(sid).result(timeout=30) is None
    assert da.operations.fork(rid, 1).result(timeout=30) == "timed out"  # replayed, not read again
    assert da.operations.fork(rid, 0).result(timeout=30) == "[]"  # read live: the stream is closed


@da.step
def count(values: list[object]) -> int:
    return len(values)


@da.durable_workflow(name="stream_reading_then_counted")
def read_then_counted(source_id: str) -> tuple[list[object], int]:
    values = [item.value for item in da.read_stream(source_id, "s")]
    return values, count(values)


def test_a_log_of_a_version_that_did_not_record_reads_still_replays(
    runtime: da.Runtime, dbos_agent_database_url: str
) -> None:
    """Before, a read was no step: the step after it has the read's position."""
    sid = closed_source([1, 2])
    rid = new_id("reader")
    with da.workflow_id(rid):
        assert read_then_counted(sid) == ([1, 2], 2)
    with psycopg.connect(dbos_agent_database_url, autocommit=True) as conn:
        conn.execute(
            "DELETE FROM dbos_agent.steps WHERE workflow_id = %s AND name = %s",
            (rid, "dbos_agent.read_stream"),
        )
        conn.execute("UPDATE dbos_agent.steps SET seq = seq - 3 WHERE workflow_id = %s", (rid,))
    fork = da.operations.fork(rid, 1)  # replays the count at position 0, after reading unrecorded
    assert fork.result(timeout=30) == ([1, 2], 2)
    assert [s.name for s in fork.steps()] == [da.operations.list_steps(rid)[0].name]

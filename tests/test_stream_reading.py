"""A workflow body that reads a stream: each item it reads is a step, so a replay reads the
same items whatever the stream holds then; a cancel ends its wait for the next item."""

from __future__ import annotations

import psycopg
import pytest

import dbos_agent as da
from dbos_agent.testing import Inspector
from tests.helpers import new_id, wait_until


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
    return [item.value async for item in da.read_stream_async(source_id, "s")]


def read_steps(workflow_id: str) -> int:
    return sum(1 for s in da.list_steps(workflow_id) if s.name == "dbos_agent.read_stream")


@pytest.mark.parametrize("workflow", [reader, reader_async])
def test_a_workflow_waiting_in_read_stream_is_cancelled(
    runtime: da.Runtime, inspector: Inspector, workflow: object
) -> None:
    sid = new_id("source")
    da.start(source, [7], workflow_id=sid)
    handle = da.start(workflow, sid)  # type: ignore[call-overload]
    wid = handle.workflow_id
    wait_until(lambda: read_steps(wid) == 1, 15, "the reader read the first item")
    da.cancel(wid)  # it waits for a second item, which never comes
    with pytest.raises(da.WorkflowCancelledError):
        handle.result(timeout=30)
    assert inspector.status(wid) == "CANCELLED"
    assert read_steps(wid) == 1
    da.send(sid, "close", topic="close")
    assert da.retrieve(sid).result(timeout=30) is None


def test_a_replay_reads_what_the_run_read_not_the_stream(
    runtime: da.Runtime, dbos_agent_database_url: str
) -> None:
    sid = new_id("source")
    da.start(source, [1, 2], workflow_id=sid)
    da.send(sid, "close", topic="close")
    assert da.retrieve(sid).result(timeout=30) is None
    rid = new_id("reader")
    with da.workflow_id(rid):
        assert reader(sid) == [1, 2]
    assert read_steps(rid) == 3  # two items and the end
    with psycopg.connect(dbos_agent_database_url, autocommit=True) as conn:
        conn.execute(
            "UPDATE dbos_agent.streams SET value = '99' WHERE workflow_id = %s AND kind = 'value'",
            (sid,),
        )
    assert da.fork(rid, 3).result(timeout=30) == [1, 2]  # every read replayed
    assert da.fork(rid, 1).result(timeout=30) == [1, 99]  # the first replayed, then live

"""A fork has what its original published before the fork point (events, stream items),
and publishes the rest once; also from a log written before steps recorded what they
published."""

from __future__ import annotations

from collections import Counter

import psycopg

import dbos_agent as da
from dbos_agent._engine.runtime.core import Engine
from tests.helpers import new_id

SPOKEN: Counter[str] = Counter()


@da.step()
def speaker(wid: str) -> str:
    SPOKEN[wid] += 1
    da.write_stream("t", "a")
    da.write_stream("t", "b")
    return "spoken"


@da.durable_workflow(name="fork_publisher")
def publisher(wid: str) -> str:
    da.write_stream("s", 0)  # step 0
    speaker(wid)  # step 1: items from inside a step
    da.set_event("e", "u")  # step 2
    da.recv("go", timeout=None)  # step 3
    da.write_stream("s", 1)  # step 4
    da.set_event("e", "v")  # step 5
    da.close_stream("s")  # step 6
    return "done"


def stream(engine: Engine, wid: str, key: str) -> list[tuple[int, str, object]]:
    """The stored items now (without following: a test must not wait on an open stream)."""
    rows, _ = engine.db.streams.read(wid, key, 0)
    return [(r.offset, r.kind, r.value) for r in rows]


def run_original(wid: str) -> da.WorkflowHandle[str]:
    handle = da.start(publisher, wid, workflow_id=wid)
    da.send(wid, "now", topic="go")
    assert handle.result(timeout=30) == "done"
    return handle


def test_a_fork_after_the_last_step_has_the_stream_and_the_event(
    runtime: da.Runtime, engine: Engine
) -> None:
    wid = new_id("pub")
    run_original(wid)
    fork = da.operations.fork(wid, 7)
    assert fork.from_step == 7
    assert fork.result(timeout=30) == "done"
    assert [i.value for i in da.read_stream(fork.workflow_id, "s")] == [0, 1]  # ends: closed
    assert [i.value for i in da.read_stream(fork.workflow_id, "t")] == ["a", "b"]
    assert da.get_event(fork.workflow_id, "e", timeout=0) == "v"
    assert SPOKEN[wid] == 1  # the step was replayed, and its items copied


def test_a_fork_in_the_middle_has_what_was_published_before_and_publishes_the_rest_once(
    runtime: da.Runtime, engine: Engine
) -> None:
    wid = new_id("pub")
    run_original(wid)
    fork = da.operations.fork(wid, 3)  # waits at its recv: what it has now is what it was given
    fid = fork.workflow_id
    assert stream(engine, fid, "s") == [(0, "value", "0")]
    assert stream(engine, fid, "t") == [(0, "value", '"a"'), (1, "value", '"b"')]
    assert da.get_event(fid, "e", timeout=0) == "u"
    da.send(fid, "now", topic="go")
    assert fork.result(timeout=30) == "done"
    assert stream(engine, fid, "s") == [(0, "value", "0"), (1, "value", "1"), (2, "close", None)]
    assert da.get_event(fid, "e", timeout=0) == "v"
    # forked again from its own log (offsets renumbered, the outputs name them)
    again = da.operations.fork(fid, 7)
    assert again.result(timeout=30) == "done"
    assert stream(engine, again.workflow_id, "s") == stream(engine, fid, "s")

    early = da.operations.fork(wid, 1)  # before the speaking step: it speaks again, once
    eid = early.workflow_id
    da.send(eid, "now", topic="go")
    assert early.result(timeout=30) == "done"
    assert SPOKEN[wid] == 2
    assert [i.value for i in da.read_stream(eid, "t")] == ["a", "b"]
    assert [i.value for i in da.read_stream(eid, "s")] == [0, 1]
    assert da.get_event(eid, "e", timeout=0) == "v"


def test_a_log_of_the_older_shape_still_replays_and_forks(
    runtime: da.Runtime, engine: Engine, dbos_agent_database_url: str
) -> None:
    """Before, a set_event step kept only its key and a stream step only its offset (no
    key in its inputs)."""
    wid = new_id("old")
    run_original(wid)
    with psycopg.connect(dbos_agent_database_url, autocommit=True) as conn:
        conn.execute(
            "UPDATE dbos_agent.steps SET inputs = inputs - 'value' "
            "WHERE workflow_id = %s AND name = 'dbos_agent.set_event'",
            (wid,),
        )
        conn.execute(
            "UPDATE dbos_agent.steps SET inputs = NULL "
            "WHERE workflow_id = %s AND name LIKE 'dbos_agent.%%_stream'",
            (wid,),
        )
        outputs = conn.execute(
            "SELECT output::text FROM dbos_agent.steps WHERE workflow_id = %s "
            "AND name LIKE 'dbos_agent.%%_stream' ORDER BY seq",
            (wid,),
        ).fetchall()
    assert [o for (o,) in outputs] == ["0", "1", "2"]
    fork = da.operations.fork(wid, 7)  # replays every step of the old log
    assert fork.result(timeout=30) == "done"
    assert [i.value for i in da.read_stream(fork.workflow_id, "s")] == [0, 1]
    assert da.get_event(fork.workflow_id, "e", timeout=0) == "v"
    middle = da.operations.fork(wid, 3)
    assert stream(engine, middle.workflow_id, "s") == [(0, "value", "0")]
    da.send(middle.workflow_id, "now", topic="go")
    assert middle.result(timeout=30) == "done"
    assert [i.value for i in da.read_stream(middle.workflow_id, "s")] == [0, 1]


def test_a_stream_step_records_the_offset_older_versions_read(
    runtime: da.Runtime, dbos_agent_database_url: str
) -> None:
    """The output of a stream step stays the bare offset every version reads back (a
    rollback, or an older process in a rolling deploy, replays it); the key is in its
    inputs."""
    wid = new_id("shape")
    run_original(wid)
    with psycopg.connect(dbos_agent_database_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT output::text, inputs ->> 'key' FROM dbos_agent.steps "
            "WHERE workflow_id = %s AND name LIKE 'dbos_agent.%%_stream' ORDER BY seq",
            (wid,),
        ).fetchall()
    assert rows == [("0", "s"), ("1", "s"), ("2", "s")]

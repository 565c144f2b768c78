"""Durable messages and events: send/recv exactly once, topics, dedup, LISTEN/NOTIFY, crashes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pydantic import BaseModel

import dbos_agent as da
from dbos_agent._engine.runtime.core import Engine
from dbos_agent.testing import Inspector
from tests.helpers import SimulatedCrash, direct_and_pooled, new_id, wait_until
from tests.processes import output
from tests.support import zygote

CRASH: set[str] = set()


def _maybe_crash() -> None:
    wid = da.current_workflow_id()
    if wid in CRASH:
        CRASH.discard(wid)
        raise SimulatedCrash(wid)


def _mailbox(url: str, wid: str) -> list[tuple[str, Any, int | None]]:
    """(topic, message, consumed_seq) of every message sent to ``wid``, oldest first."""
    with Inspector(url) as db:
        return [(m.topic or "", m.message, m.consumed_seq) for m in db.messages(wid)]


def _wait_for_step(wid: str, name: str, timeout: float = 10.0) -> None:
    """Until ``wid`` has a step row named ``name`` (a waiting recv writes its deadline)."""
    wait_until(
        lambda: any(s.name == name for s in da.operations.list_steps(wid)),
        timeout,
        f"{wid} reaches {name}",
    )


class Approval(BaseModel):
    approved: bool
    by: str


#: Longer than any test: a wait that only the mechanism under test can end.
NEVER = 3600.0


@da.durable_workflow
def inbox(n: int, topic: str | None, timeout: float) -> list[Any]:
    return [da.recv(topic, timeout=timeout) for _ in range(n)]


@da.durable_workflow
def approval_flow() -> Approval:
    da.set_event("stage", "waiting")
    decision = da.recv("approval", timeout=30, as_type=Approval)
    da.set_event("stage", "approved" if decision.approved else "rejected")
    da.set_event("decided_by", decision.by)
    return decision


@direct_and_pooled
def test_send_and_recv_across_threads_in_order_and_by_topic(
    runtime: da.Runtime, engine: Engine
) -> None:
    wid = new_id("inbox")
    handle = da.start(inbox, 3, "work", 10.0, workflow_id=wid)
    da.send(wid, "ignored: another topic", topic="other")
    senders = [threading.Thread(target=da.send, args=(wid, {"n": i}, "work")) for i in range(3)]
    for sender in senders:
        sender.start()
        sender.join()  # in order, from other threads
    assert handle.result(timeout=15) == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert [s.name for s in handle.steps()] == ["dbos_agent.recv"] * 3
    mailbox = _mailbox(engine.db.url, wid)
    assert mailbox[0] == ("other", "ignored: another topic", None)  # still there
    assert [seq for topic, _, seq in mailbox if topic == "work"] == [0, 1, 2]  # FIFO


def test_typed_messages_and_events_round_trip(runtime: da.Runtime) -> None:
    wid = new_id("approval")
    handle = da.start(approval_flow, workflow_id=wid)
    assert da.get_event(wid, "stage", timeout=10) == "waiting"
    da.send(wid, Approval(approved=True, by="ada"), topic="approval")
    assert handle.result(timeout=15) == Approval(approved=True, by="ada")
    assert da.get_event(wid, "stage", timeout=0) == "approved"  # the last value wins
    assert da.get_event(wid, "never-set", timeout=0.2) is None


def test_get_event_waits_for_a_value_set_later(runtime: da.Runtime) -> None:
    wid = new_id("approval")
    handle = da.start(approval_flow, workflow_id=wid)
    got: list[Any] = []
    reader = threading.Thread(target=lambda: got.append(da.get_event(wid, "decided_by", 10)))
    reader.start()
    _wait_for_step(wid, "dbos_agent.recv")  # the workflow waits: nothing is set under that key
    assert not got and reader.is_alive()
    da.send(wid, {"approved": False, "by": "bob"}, topic="approval")
    reader.join(15)
    assert got == ["bob"]
    assert da.get_event(wid, "stage", timeout=0) == "rejected"
    assert handle.result(timeout=15).approved is False


@da.durable_workflow
def recv_then_step() -> list[Any]:
    first = da.recv(timeout=0.2)
    _maybe_crash()
    return [first, da.recv(timeout=0.2)]


def test_recv_timeout_returns_none_and_replays_none(runtime: da.Runtime, engine: Engine) -> None:
    wid = new_id("timeout")
    CRASH.add(wid)
    with pytest.raises(SimulatedCrash), da.workflow_id(wid):
        recv_then_step()
    [step] = da.operations.list_steps(wid)
    assert (step.name, step.status, step.output) == ("dbos_agent.recv", "SUCCESS", None)
    da.send(wid, "late")  # arrives after the timeout was recorded
    with da.workflow_id(wid):
        assert recv_then_step() == [None, "late"]  # step 0 replayed as None, step 1 took it
    assert _mailbox(engine.db.url, wid) == [("", "late", 1)]


def test_idempotency_key_sends_once_even_after_the_message_was_consumed(
    runtime: da.Runtime,
    engine: Engine,
) -> None:
    wid = new_id("dedup")
    handle = da.start(inbox, 3, None, 1.0, workflow_id=wid)
    da.send(wid, "a", idempotency_key="k1")
    da.send(wid, "a again", idempotency_key="k1")
    da.send(wid, "b", idempotency_key="k2")
    assert handle.result(timeout=15) == ["a", "b", None]
    da.send(wid, "a once more", idempotency_key="k1")  # consumed long ago: still deduplicated
    assert [m for _, m, _ in _mailbox(engine.db.url, wid)] == ["a", "b"]
    with pytest.raises(da.WorkflowNotFoundError):
        da.send(new_id("nobody"), "hello")


@da.durable_workflow
def sender(target: str) -> str:
    da.send(target, "ping", topic="t")
    _maybe_crash()
    try:
        da.send(target + "-missing", "lost")
    except da.WorkflowNotFoundError:
        return "sent"
    return "unexpected"


def test_send_from_a_workflow_is_a_step_and_is_not_repeated_on_replay(
    runtime: da.Runtime, inspector: Inspector
) -> None:
    target = new_id("target")
    da.start(inbox, 1, "t", 10.0, workflow_id=target)
    wid = new_id("sender")
    CRASH.add(wid)
    with pytest.raises(SimulatedCrash), da.workflow_id(wid):
        sender(target)
    with da.workflow_id(wid):
        assert sender(target) == "sent"
    steps = da.operations.list_steps(wid)
    assert [(s.name, s.status) for s in steps] == [
        ("dbos_agent.send", "SUCCESS"),
        ("dbos_agent.send", "ERROR"),  # errors are results: replay raises it again
    ]
    assert da.retrieve(target).result(timeout=10) == ["ping"]
    keys = [m.idempotency_key for m in inspector.messages(target)]
    assert keys == [f"{wid}:0"]  # one message, keyed by the send's position


def test_a_recv_that_loses_its_position_consumes_nothing(
    runtime: da.Runtime, engine: Engine
) -> None:
    """The guard that makes recv exactly-once: no step row written, no message consumed."""
    wid = new_id("race")
    CRASH.add(wid)
    with pytest.raises(SimulatedCrash), da.workflow_id(wid):
        recv_then_step()  # step 0 is recorded (a timeout)
    da.send(wid, "m")
    write, message = engine.db.messages.receive(
        workflow_id=wid,
        seq=0,  # taken: as if another run of the workflow got there first
        name="dbos_agent.recv",
        topic="",
        inputs="{}",
        started_at=da.operations.list_steps(wid)[0].started_at,
        owner_key=engine.session_key,
    )
    assert not write.written and message is None
    assert write.existing is not None and write.existing.output == "null"
    assert _mailbox(engine.db.url, wid) == [("", "m", None)]
    with da.workflow_id(wid):
        assert recv_then_step() == [None, "m"]


def test_recv_is_woken_by_notify_well_before_the_poll_interval(
    runtime: da.Runtime, engine: Engine
) -> None:
    # no poll and no deadline within the test: only LISTEN/NOTIFY can wake the recv
    engine.notifications.poll_interval = NEVER
    assert engine.notifications.listening.wait(60)
    wid = new_id("notify")
    handle = da.start(inbox, 1, None, NEVER, workflow_id=wid)
    _wait_for_step(wid, "dbos_agent.recv")  # the deadline intent: it is waiting now
    da.send(wid, "wake up")
    assert handle.result(timeout=120) == ["wake up"]


def test_the_listener_reconnects_after_its_connection_is_killed(
    runtime: da.Runtime, engine: Engine
) -> None:
    engine.notifications.poll_interval = NEVER  # only NOTIFY on a new connection wakes it
    assert engine.notifications.listening.wait(60)
    with psycopg.connect(engine.db.url, autocommit=True) as conn:
        killed = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name = 'dbos_agent_listener' AND datname = current_database()"
        ).fetchall()
    assert killed
    wid = new_id("reconnect")
    handle = da.start(inbox, 1, None, NEVER, workflow_id=wid)
    _wait_for_step(wid, "dbos_agent.recv")
    assert engine.notifications.listening.wait(60)
    da.send(wid, "still heard")
    assert handle.result(timeout=120) == ["still heard"]


def test_polling_finds_a_message_whose_notify_was_lost(runtime: da.Runtime, engine: Engine) -> None:
    engine.notifications.poll_interval = 0.3
    wid = new_id("poll")
    handle = da.start(inbox, 1, None, NEVER, workflow_id=wid)  # no deadline to wake it
    _wait_for_step(wid, "dbos_agent.recv")
    with psycopg.connect(engine.db.url, autocommit=True) as conn:
        try:  # triggers off for this session only: the insert sends no NOTIFY
            conn.execute("SET session_replication_role = replica")
        except psycopg.errors.InsufficientPrivilege:
            pytest.skip("the test database role cannot switch off triggers")
        conn.execute(
            "INSERT INTO dbos_agent.messages (destination_id, message) VALUES (%s, %s)",
            (wid, json.dumps("silent")),
        )
    assert handle.result(timeout=120) == ["silent"]


def test_subscribe_delivers_notifications_of_other_channels(
    runtime: da.Runtime, engine: Engine
) -> None:
    got: list[str] = []
    arrived = threading.Event()

    def on_cancel(payload: str) -> None:
        got.append(payload)
        arrived.set()

    unsubscribe = engine.notifications.subscribe("dbos_agent_cancel", on_cancel)
    with psycopg.connect(engine.db.url, autocommit=True) as conn:

        def notified() -> bool:  # LISTEN starts shortly: notify until it is heard
            conn.execute("SELECT pg_notify('dbos_agent_cancel', 'wf-1')")
            return arrived.wait(0.1)

        wait_until(notified, 10, "the subscriber to hear a NOTIFY")
    unsubscribe()
    assert got and set(got) == {"wf-1"}


@da.durable_workflow
async def async_conversation(peer: str) -> list[Any]:
    await da.aio.set_event("ready", True)
    question = await da.aio.recv("q", timeout=10)
    await da.aio.send(peer, f"answer to {question}", topic="a")
    seen = await da.aio.get_event(da.current_workflow_id() or "", "ready", timeout=10)
    return [question, seen]


def test_async_workflows_send_recv_and_events(runtime: da.Runtime) -> None:
    peer = new_id("peer")
    peer_handle = da.start(inbox, 1, "a", 10.0, workflow_id=peer)
    wid = new_id("async")
    handle = da.start(async_conversation, peer, workflow_id=wid)

    async def outside() -> None:
        assert await da.aio.get_event(wid, "ready", timeout=10) is True
        await da.aio.send(wid, "why?", topic="q")

    asyncio.run(outside())
    assert handle.result(timeout=15) == ["why?", True]
    assert peer_handle.result(timeout=15) == ["answer to why?"]
    assert [s.name for s in handle.steps()] == [
        "dbos_agent.set_event",
        "dbos_agent.recv",
        "dbos_agent.send",
        "dbos_agent.get_event",
    ]


@da.step
def inside_a_step() -> None:
    da.recv(timeout=0)


@da.durable_workflow
def misuse() -> None:
    inside_a_step()


def test_recv_and_set_event_only_in_a_workflow(runtime: da.Runtime) -> None:
    with pytest.raises(da.DbosAgentError, match="inside a durable workflow"):
        da.recv(timeout=0)
    with pytest.raises(da.DbosAgentError, match="inside a durable workflow"):
        da.set_event("k", 1)
    with pytest.raises(da.DbosAgentError, match="inside a step"):
        misuse()  # set_event is made with the step's checkpoint (test_step_effects.py)
    with pytest.raises(ValueError):
        da.get_event("x", "k", timeout=-1)


# -- a real crash between receiving and the next step --------------------------------------

APP = Path(__file__).parents[1] / "apps" / "messaging_app.py"


def app_env(url: str, workdir: Path, executor: str, kill: str = "") -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DBOS_AGENT_DATABASE_URL=url,
        MSG_DIR=str(workdir),
        MSG_EXECUTOR=executor,
        MSG_KILL=kill,
        PYTHONPATH=str(APP.parents[2]),
    )
    return env


@pytest.mark.parametrize(
    ("kill", "database_url"),
    [("after-recv-0", "direct"), ("after-recv-1", "direct"), ("after-recv-1", "pooled")],
    indirect=["database_url"],
)
def test_a_message_is_received_once_across_a_crash(
    kill: str, runtime: da.Runtime, engine: Engine, tmp_path: Path
) -> None:
    url, wid, executor = engine.db.url, new_id("crash-recv"), new_id("executor")
    app = zygote.popen(
        [sys.executable, str(APP), "recv", wid],
        env=app_env(url, tmp_path, executor, kill),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(
            lambda: engine.db.workflows.get(wid) is not None or app.poll() is not None,
            30,
            "the app to record its workflow",
        )
        assert app.poll() is None, app.communicate()
        da.send(wid, "first", topic="inbox")
        da.send(wid, "second", topic="inbox")
        _, err = app.communicate(timeout=60)
    finally:
        app.kill()
    assert app.returncode == -signal.SIGKILL, output(app, None, err)
    consumed = [seq for _, _, seq in _mailbox(url, wid)]
    assert consumed == ([0, None] if kill == "after-recv-0" else [0, 2])

    recovered = zygote.run(
        [sys.executable, str(APP), "recover", wid],
        env=app_env(url, tmp_path, executor),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert recovered.returncode == 0, output(recovered)
    assert json.loads(recovered.stdout) == ["FIRST", "SECOND"]
    # each message was received once (from the log after the crash) and handled once
    assert (tmp_path / "effects.log").read_text().split() == ["first", "second"]
    assert _mailbox(url, wid) == [("inbox", "first", 0), ("inbox", "second", 2)]
    assert [s.name for s in da.operations.list_steps(wid)] == ["dbos_agent.recv", "handle"] * 2

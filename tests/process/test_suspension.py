"""Waiting costs nothing: background workflows that wait are SUSPENDED, not threads.

A thousand workflows waiting in ``recv`` or ``sleep`` hold no thread and no session;
they wake on a message, an event or their time, in this process or another one, and
each finishes exactly once. Direct calls still wait in their caller's thread.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

import dbos_agent as da
from dbos_agent._engine.runtime.current import current_engine
from dbos_agent._engine.runtime.notifications import Waiter
from dbos_agent._engine.runtime.registry import code_version
from dbos_agent._storage.rows import Runner
from dbos_agent.testing import Inspector
from tests.helpers import blocked_in, new_id, wait_until
from tests.processes import ROOT, output
from tests.support import zygote

pytestmark = pytest.mark.long  # a minute or more in the suite: started first

SUSPENDED = da.WorkflowStatus.SUSPENDED
HANDLED: Counter[str] = Counter()
BODY_RUNS: Counter[str] = Counter()


@da.step
def handle(message: str) -> str:
    HANDLED[da.current_workflow_id() or ""] += 1
    return message.upper()


@da.step
def clock() -> float:
    return time.time()


@da.durable_workflow
def mailbox(topic: str) -> str:
    BODY_RUNS[da.current_workflow_id() or ""] += 1
    return handle(da.recv(topic, timeout=None))


@da.durable_workflow
async def async_mailbox(topic: str) -> str:
    BODY_RUNS[da.current_workflow_id() or ""] += 1
    message = await da.aio.recv(topic, timeout=None)
    await da.aio.sleep(1.5)  # a second wait, suspended too
    return str(message)


@da.durable_workflow
def long_nap(seconds: float) -> list[float]:
    fell_asleep = clock()
    da.sleep(seconds)
    return [fell_asleep, clock()]


@da.durable_workflow
def one_step(x: int) -> int:
    return int(handle(str(x)))


@da.durable_workflow
def publisher(value: str) -> None:
    da.sleep(1.5)
    da.set_event("result", value)


@da.durable_workflow
def subscriber(publisher_id: str) -> str:
    return str(da.get_event(publisher_id, "result", timeout=None))


@da.durable_workflow
def grandparent() -> str:
    da.start(one_step, 1).result()  # a child that finishes before the cancel
    da.start(family_waiter, True)  # a child that starts a grandchild, both waiting
    return str(da.recv("never", timeout=None))


@da.durable_workflow
def family_waiter(with_child: bool) -> str:
    if with_child:
        da.start(family_waiter, False)
    return str(da.recv("never", timeout=None))


@da.durable_workflow
def waits_for_child() -> str:
    parent = da.current_workflow_id() or ""
    BODY_RUNS[parent] += 1
    child = da.start(mailbox, "go", workflow_id=f"{parent}-child")
    return child.result()  # the child waits for a message: the parent suspends on it


def _all(db: Inspector, ids: list[str], status: da.WorkflowStatus) -> bool:
    return set(db.statuses(ids).values()) == {status}


def test_a_thousand_waiting_workflows_hold_no_threads_and_each_runs_once(
    runtime: da.Runtime, inspector: Inspector
) -> None:
    ids = [new_id("mail") for _ in range(1000)]
    threads_before = threading.active_count()
    handles = [da.start(mailbox, "go", workflow_id=wid) for wid in ids]
    wait_until(lambda: _all(inspector, ids, SUSPENDED), 120, "a thousand suspended waiters")
    assert threading.active_count() <= threads_before + 12  # the pool, not one per waiter
    assert one_step(7) == 7  # a new workflow starts and finishes beside them
    assert da.start(one_step, 8).result(timeout=60) == 8
    info = inspector.workflow(ids[0])
    assert info is not None and info.waiting_for is not None
    assert (info.waiting_for.kind, info.waiting_for.name) == ("recv", "go")
    for wid in ids:
        da.send(wid, f"hello {wid}", topic="go")
    results = [h.result(timeout=120) for h in handles]
    assert results == [f"HELLO {wid}".upper() for wid in ids]
    assert all(HANDLED[wid] == 1 for wid in ids)  # woken once, handled once
    assert all(BODY_RUNS[wid] == 2 for wid in ids)  # the first run, then the woken one
    assert all(inspector.step_names(wid) == ["dbos_agent.recv", "handle"] for wid in ids[:20])


def test_a_thousand_sleeps_end_together_not_in_batches(
    runtime: da.Runtime, inspector: Inspector
) -> None:
    ids = [new_id("nap") for _ in range(1000)]
    handles = [da.start(long_nap, 3.0, workflow_id=wid) for wid in ids]
    spans = [h.result(timeout=180) for h in handles]
    slept = [woke - fell for fell, woke in spans]
    assert min(slept) >= 3.0
    # 1000 sleeps of 3 s on 8 threads would take over 6 minutes in batches: bounds far
    # below that and far above what a loaded 2-core machine needs to wake them all
    assert max(slept) < 60.0, max(slept)
    assert max(woke for _, woke in spans) - min(fell for fell, _ in spans) < 120.0


def test_an_async_workflow_suspends_and_wakes_like_a_sync_one(
    runtime: da.Runtime, inspector: Inspector
) -> None:
    wid = new_id("async-mail")
    handle = da.start(async_mailbox, "a", workflow_id=wid)
    wait_until(lambda: inspector.status(wid) == SUSPENDED, 10, "suspended in recv_async")
    da.send(wid, "async hello", topic="a")
    wait_until(
        lambda: (
            (info := inspector.workflow(wid)) is not None
            and info.waiting_for is not None
            and info.waiting_for.kind == "sleep"
        ),
        10,
        "suspended again, in sleep_async",
    )
    assert handle.result(timeout=10) == "async hello"
    assert BODY_RUNS[wid] == 3  # the first run, woken by the message, woken by the time


def test_an_event_wakes_its_waiter(runtime: da.Runtime, inspector: Inspector) -> None:
    pub, sub = new_id("pub"), new_id("sub")
    waiting = da.start(subscriber, pub, workflow_id=sub)
    wait_until(lambda: inspector.status(sub) == SUSPENDED, 10, "the subscriber suspended")
    info = inspector.workflow(sub)
    assert info is not None and info.waiting_for is not None
    assert (info.waiting_for.kind, info.waiting_for.target) == ("event", pub)
    da.start(publisher, "ready", workflow_id=pub)
    assert waiting.result(timeout=20) == "ready"


def test_a_client_with_only_the_url_wakes_a_suspended_workflow(
    runtime: da.Runtime, inspector: Inspector, dbos_agent_database_url: str
) -> None:
    wid = new_id("client-send")
    handle = da.start(mailbox, "web", workflow_id=wid)
    wait_until(lambda: inspector.status(wid) == SUSPENDED, 10, "suspended")
    with da.Client(dbos_agent_database_url) as client:
        client.send(wid, "from a web handler", topic="web")
        with pytest.raises(da.WorkflowNotFoundError):
            client.send(new_id("nobody"), "lost")
    assert handle.result(timeout=10) == "FROM A WEB HANDLER"


def test_the_cli_tells_suspended_workflows_and_what_they_wait_for(
    runtime: da.Runtime, inspector: Inspector, dbos_agent_database_url: str
) -> None:
    wid = new_id("cli-suspended")
    handle = da.start(mailbox, "approval", workflow_id=wid)
    wait_until(lambda: inspector.status(wid) == SUSPENDED, 10, "suspended")
    env = dict(os.environ, DBOS_AGENT_DATABASE_URL=dbos_agent_database_url)

    def cli(*args: str) -> str:
        done = zygote.run(
            [sys.executable, "-m", "dbos_agent", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, output(done)
        return done.stdout

    listed = cli("workflows", "list", "--status", "SUSPENDED", "--limit", "1000")
    assert "WAITING FOR" in listed
    waits = "message: a message on topic 'approval'"
    assert any(wid in line and waits in line for line in listed.splitlines())
    shown = cli("workflows", "show", wid)
    assert f"Waiting for  {waits}" in shown
    document = json.loads(cli("workflows", "show", wid, "--json"))
    assert document["status"] == "SUSPENDED"
    assert (
        document["waiting_for"]["kind"] == "recv" and document["waiting_for"]["name"] == "approval"
    )
    assert document["waiting"]["kind"] == "message" and document["waiting"]["step"] == 0
    da.send(wid, "yes", topic="approval")
    assert handle.result(timeout=10) == "YES"


def test_a_cancel_ends_a_suspended_workflow_without_running_it(
    runtime: da.Runtime, inspector: Inspector
) -> None:
    wid = new_id("cancel-suspended")
    handle = da.start(mailbox, "never", workflow_id=wid)
    wait_until(lambda: inspector.status(wid) == SUSPENDED, 10, "suspended")
    da.operations.cancel(wid)
    with pytest.raises(da.WorkflowCancelledError):
        handle.result(timeout=10)
    da.send(wid, "too late", topic="never")
    assert inspector.status(wid) == da.WorkflowStatus.CANCELLED
    assert BODY_RUNS[wid] == 1 and HANDLED[wid] == 0  # never woken, never run again
    info = inspector.workflow(wid)
    assert info is not None and info.waiting_for is None


def test_a_workflow_waiting_for_its_childs_result_suspends_until_it_finishes(
    runtime: da.Runtime, inspector: Inspector
) -> None:
    ids = [new_id("parent") for _ in range(100)]
    threads_before = threading.active_count()
    handles = [da.start(waits_for_child, workflow_id=wid) for wid in ids]
    # each parent as it was read when all were suspended (one read); the children wait
    # until the test sends them a message, so however slowly all start, all are seen
    seen: dict[str, da.WorkflowInfo] = {}

    def all_suspended() -> bool:
        found = {w.workflow_id: w for w in inspector.workflows(name="waits_for_child")}
        if not all(wid in found and found[wid].status is SUSPENDED for wid in ids):
            return False
        seen.update(found)
        return True

    wait_until(all_suspended, 30, "100 parents suspended")
    assert threading.active_count() <= threads_before + 12
    info = seen[ids[0]]
    assert info.waiting_for is not None
    assert info.waiting_for.kind == "child"
    assert info.waiting_for.describe().startswith(f"the result of {ids[0]}-child")
    for wid in ids:
        da.send(f"{wid}-child", wid, topic="go")
    assert [h.result(timeout=60) for h in handles] == [wid.upper() for wid in ids]
    assert all(BODY_RUNS[wid] == 2 for wid in ids)  # suspended once, woken once


def test_cancelling_a_workflow_cancels_the_workflows_it_started(
    runtime: da.Runtime, inspector: Inspector
) -> None:
    root = new_id("family")
    handle = da.start(grandparent, workflow_id=root)

    def family() -> list[da.WorkflowInfo]:
        return [w for w in inspector.workflows() if w.workflow_id.startswith(root)]

    wait_until(
        lambda: (
            sorted(str(w.status) for w in family())
            == ["SUCCESS", "SUSPENDED", "SUSPENDED", "SUSPENDED"]
        ),
        20,
        "the root, a child and a grandchild suspended; the other child done",
    )
    da.operations.cancel(root)
    with pytest.raises(da.WorkflowCancelledError):
        handle.result(timeout=10)
    statuses = {w.workflow_id: w.status for w in family()}
    assert sorted(str(s) for s in statuses.values()) == [
        "CANCELLED",
        "CANCELLED",
        "CANCELLED",
        "SUCCESS",
    ]  # the finished child keeps its outcome
    for wid, status in statuses.items():
        info = inspector.workflow(wid)
        assert info is not None
        if wid != root and status == da.WorkflowStatus.CANCELLED:
            assert (
                info.error is not None and f"with {root}, which started it" in info.error["message"]
            )


def test_a_process_launched_without_waking_leaves_suspended_workflows_to_others(
    dbos_agent_database_url: str, executor_id: str, inspector: Inspector
) -> None:
    rt = da.launch(dbos_agent_database_url, executor_id=executor_id, wake_suspended=False)
    try:
        wid = new_id("no-waker")
        handle = da.start(mailbox, "w", workflow_id=wid)
        wait_until(lambda: inspector.status(wid) == SUSPENDED, 10, "suspended")
        da.send(wid, "nobody here wakes it", topic="w")
        # nothing here would wake it: no waker thread (it alone wakes suspended workflows)
        assert "dbos-agent-waker" not in {thread.name for thread in threading.enumerate()}
        assert inspector.status(wid) == SUSPENDED
    finally:
        rt.shutdown()
    with da.launch(dbos_agent_database_url, executor_id=executor_id):  # a waker: it runs
        assert da.retrieve(wid).result(timeout=10) == "NOBODY HERE WAKES IT"
    assert handle.workflow_id == wid


def test_the_wake_of_a_recv_delivers_the_oldest_message_in_the_same_statement(
    dbos_agent_database_url: str, executor_id: str, inspector: Inspector
) -> None:
    """Waking a workflow for a message also receives it: the oldest message on its topic
    becomes the result of the recv it waits in and is consumed by the wake's statement,
    before any run; the run then replays that recv and takes the next message itself."""
    rt = da.launch(dbos_agent_database_url, executor_id=executor_id, wake_suspended=False)
    try:
        wid = new_id("delivered")
        da.start(mailbox, "w", workflow_id=wid)
        wait_until(lambda: inspector.status(wid) == SUSPENDED, 10, "suspended")
        da.send(wid, "first", topic="w")
        da.send(wid, "second", topic="w")
        da.send(wid, "elsewhere", topic="other")
        engine = current_engine()
        assert engine.session_key is not None
        woken = engine.db.suspension.wake(
            owner_key=engine.session_key,
            executor_id=executor_id,
            runner=Runner(["mailbox"], engine.app_version, code_version()),
            targets=[wid],
            limit=10,
        )
        assert [w.workflow_id for w in woken] == [wid]
        recv = inspector.steps(wid)[0]
        assert (recv.name, recv.status, recv.output) == ("dbos_agent.recv", "SUCCESS", "first")
        assert [(m.message, m.consumed_seq) for m in inspector.messages(wid)] == [
            ("first", 0),
            ("second", None),
            ("elsewhere", None),
        ]
    finally:
        rt.shutdown()
    with da.launch(dbos_agent_database_url, executor_id=executor_id):  # its owner is gone
        assert da.retrieve(wid).result(timeout=20) == "FIRST"
    assert [m.consumed_seq for m in inspector.messages(wid)] == [0, None, None]


def test_a_direct_call_waits_in_its_caller_and_is_never_suspended(
    runtime: da.Runtime, inspector: Inspector
) -> None:
    wid = new_id("direct")
    seen: list[da.WorkflowStatus | None] = []

    caller = threading.current_thread()

    def watch_and_send() -> None:
        # blocked on its waiter: past the point where a background run suspends (recv
        # decides before its first wait)
        try:
            wait_until(lambda: blocked_in(caller, Waiter.wait), 10, "the direct call waiting")
            seen.append(inspector.status(wid))
        finally:  # never leave the caller waiting: a failure shows in ``seen``
            da.send(wid, "direct", topic="d")

    sender = threading.Thread(target=watch_and_send)
    sender.start()
    with da.workflow_id(wid):
        assert mailbox("d") == "DIRECT"
    sender.join()
    assert seen == [da.WorkflowStatus.PENDING]


def _app(url: str, log: Path, *args: str) -> subprocess.Popen[str]:
    env = dict(os.environ, DBOS_AGENT_DATABASE_URL=url, SUSP_LOG=str(log), PYTHONPATH=str(ROOT))
    return zygote.popen(
        [sys.executable, "-m", "tests.apps.suspension_app", *args],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_restart_wakes_sleepers_at_their_time_and_replays_none_before(
    dbos_agent_database_url: str, tmp_path: Path
) -> None:
    """200 workflows sleep 6 s; their process is killed -9 once all are suspended; a
    new process launched at once replays none of them before its time, and each wakes
    at the time it set before the kill, not 6 s after the restart."""
    url, log, prefix, n = dbos_agent_database_url, tmp_path / "runs.log", new_id("sleep"), 200
    first = _app(url, log, "start", prefix, str(n), "6")
    try:
        assert first.stdout is not None and first.stderr is not None
        assert first.stdout.readline().strip() == "suspended", first.stderr.read()
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    finally:
        if first.poll() is None:
            first.kill()
    restarted_at = time.time()
    second = _app(url, log, "wait", prefix, str(n))
    out, err = second.communicate(timeout=120)
    assert second.returncode == 0, output(second, out, err)
    results: dict[str, list[float]] = json.loads(out.strip().splitlines()[-1])
    runs = [line.split() for line in log.read_text().splitlines()]
    first_runs = [r for r in runs if int(r[1]) == first.pid]
    later_runs = [r for r in runs if int(r[1]) == second.pid]
    assert len(first_runs) == n and len(later_runs) == n  # each replayed once, when woken
    for _, _, wid, at in later_runs:
        fell_asleep, woke = results[wid]
        assert float(at) >= fell_asleep + 6.0 - 0.5, "replayed before its time"
        assert fell_asleep + 6.0 <= woke < fell_asleep + 6.0 + 10.0
    assert max(float(at) for *_, at in later_runs) < restarted_at + 20.0

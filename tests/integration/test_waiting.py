"""What a workflow waits for, one classification everywhere: ``WorkflowInfo.waiting``, the
CLI's ``workflows list`` column, ``workflows show`` and ``--json``, and the web API's
workflow document (``"waiting": {"kind", "text", "step", "until"}``), for every kind:
message, approval, timer, child, event, dependency, divergence, orphan, queue; whether
the workflow waits SUSPENDED or in the process that runs it (PENDING)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

import httpx

import dbos_agent as da
from dbos_agent.records import WAITING_KINDS, Waiting, WorkflowStatus
from tests.apps.diverging import hold_diverged
from tests.helpers import cli, new_id, ok, per_test, wait_until

PENDING, SUSPENDED = WorkflowStatus.PENDING, WorkflowStatus.SUSPENDED
DOWN: set[str] = per_test(set())


@da.step
def prepare(key: str) -> str:
    return key


@da.durable_workflow(name="waiting_receiver")
def receiver(key: str) -> str:
    prepare(key)
    return str(da.recv("go", timeout=3600))


@da.durable_workflow(name="waiting_approver")
def approver(key: str) -> bool:
    prepare(key)
    return da.request_approval("run_bash", {"command": f"echo {key} >> CHANGELOG.md"}).approved


@da.durable_workflow(name="waiting_sleeper")
def sleeper(key: str) -> str:
    da.sleep(3600)
    return key


@da.durable_workflow(name="waiting_parent")
def parent(key: str) -> str:
    child = da.start(receiver, key, workflow_id=f"{key}-child")
    return child.result()


@da.durable_workflow(name="waiting_watcher")
def watcher(other: str) -> str:
    return str(da.get_event(other, "progress", timeout=3600))


@da.step(
    retry_on=(ConnectionError,),
    give_up_after=3600,
    interval=600,  # its next attempt is well past the test's reads
    jitter=0,
    waits_for="the payments API",
)
def charge(key: str) -> str:
    if key in DOWN:
        raise ConnectionError("payments API refused the connection")
    return key


@da.durable_workflow(name="waiting_payer")
def payer(key: str) -> str:
    return charge(key)


def _waits(wid: str, kind: str, status: WorkflowStatus | None = None) -> Callable[[], bool]:
    def check() -> bool:
        try:
            info = da.retrieve(wid).get_info()
        except da.WorkflowNotFoundError:  # not started yet
            return False
        found = info.waiting
        return found is not None and found.kind == kind and status in (None, info.status)

    return check


@contextmanager
def in_process(body: Callable[[], object]) -> Iterator[list[object]]:
    """``body()`` (a direct call, which never suspends: its caller waits) in a thread;
    yields the list that gets what it returned or raised (a cancel ends it)."""
    ended: list[object] = []

    def run() -> None:
        try:
            ended.append(body())
        except BaseException as exc:  # the test reads it
            ended.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield ended
    finally:
        thread.join(30)


def _direct(fn: Callable[..., object], wid: str, *args: object) -> Callable[[], object]:
    def call() -> object:
        with da.workflow_id(wid):
            return fn(*args)

    return call


def _utc(when: datetime) -> str:
    return f"{when.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"


def _until(found: Waiting) -> str:
    assert found.until is not None, found
    return f" until {_utc(found.until)}"


def _seen(url: str, api: httpx.Client, wid: str, kind: str) -> Waiting:
    """What every tool says ``wid`` waits for: the same kind and text in each (the lists
    read by its name: the session's database holds every earlier test's workflows)."""
    info = da.retrieve(wid).get_info()
    found = info.waiting
    assert found is not None and found.kind == kind, found
    assert kind in WAITING_KINDS
    expected = {
        "kind": found.kind,
        "text": found.text,
        "step": found.step,
        "until": None if found.until is None else found.until.isoformat(),
    }
    document = api.get(f"/api/workflows/{wid}").json()
    assert document["waiting"] == expected
    by_name: dict[str, str | int] = {"name": info.name, "limit": 1000}
    [listed] = [
        w for w in api.get("/api/workflows", params=by_name).json() if w["workflow_id"] == wid
    ]
    assert listed["waiting"] == expected
    assert json.loads(ok(cli(url, "workflows", "show", wid, "--json")))["waiting"] == expected
    shown = ok(cli(url, "workflows", "show", wid))
    assert f"Waiting for  {kind}: {found.text}" in shown, shown
    table = ok(cli(url, "workflows", "list", "--name", info.name, "--limit", "1000")).splitlines()
    assert "WAITING FOR" in table[0]
    [row] = [line for line in table if line.startswith(wid + " ")]
    assert row.endswith(f"{kind}: {found.text}"), row
    return found


def _both_ways(
    url: str, api: httpx.Client, fn: Callable[[str], object], kind: str
) -> tuple[str, Waiting, str, Waiting]:
    """``fn`` waiting in the process that runs it (a direct call: PENDING), then in the
    background (SUSPENDED): each workflow's id and what every tool says it waits for
    (both cancelled after)."""
    direct, background = new_id(kind), new_id(kind)
    with in_process(_direct(fn, direct, direct)):
        wait_until(_waits(direct, kind, PENDING), 30, f"a {kind} wait in its process")
        in_process_wait = _seen(url, api, direct, kind)
        da.operations.cancel(direct)
    da.start(fn, background, workflow_id=background)
    wait_until(_waits(background, kind, SUSPENDED), 30, f"a {kind} wait to suspend")
    suspended_wait = _seen(url, api, background, kind)
    da.operations.cancel(background)
    return direct, in_process_wait, background, suspended_wait


def test_a_message(api: httpx.Client, dbos_agent_database_url: str) -> None:
    _, in_process_wait, _, suspended_wait = _both_ways(
        dbos_agent_database_url, api, receiver, "message"
    )
    for found in (in_process_wait, suspended_wait):
        assert found.step == 1 and found.text == f"a message on topic 'go'{_until(found)}"


def test_an_approval_names_the_tool_and_the_step_that_waits(
    api: httpx.Client, dbos_agent_database_url: str
) -> None:
    wid = new_id("approval")
    handle = da.start(approver, wid, workflow_id=wid)
    wait_until(_waits(wid, "approval", SUSPENDED), 30, "the approval to wait")
    found = _seen(dbos_agent_database_url, api, wid, "approval")
    # step 0 prepare, step 1 the request, step 2 the recv that waits for the decision
    assert found.step == 2 and found.until is None
    assert found.text == "a human's approval of 'run_bash' (requested at step 1, waiting at step 2)"
    [request] = da.operations.list_approvals(wid)
    da.operations.approve(wid, request.seq, request.digest)
    assert handle.result(timeout=30) is True


def test_a_timer_and_a_delayed_start(api: httpx.Client, dbos_agent_database_url: str) -> None:
    url = dbos_agent_database_url
    _, in_process_wait, _, suspended_wait = _both_ways(url, api, sleeper, "timer")
    for found in (in_process_wait, suspended_wait):
        assert found.step == 0 and found.text == f"a timer{_until(found)}"

    delayed = new_id("delayed")
    da.start(sleeper, delayed, workflow_id=delayed, delay=3600)
    found = _seen(url, api, delayed, "timer")
    assert found.step is None and found.text == f"its delayed start{_until(found)}"
    da.operations.cancel(delayed)


def test_a_child(api: httpx.Client, dbos_agent_database_url: str) -> None:
    direct, in_process_wait, background, suspended_wait = _both_ways(
        dbos_agent_database_url, api, parent, "child"
    )
    for wid, found in ((direct, in_process_wait), (background, suspended_wait)):
        assert found == Waiting("child", f"child workflow '{wid}-child' to finish", 0, None)


def test_an_event_of_another_workflow(api: httpx.Client, dbos_agent_database_url: str) -> None:
    publisher, wid = new_id("publisher"), new_id("watching")
    da.start(watcher, publisher, workflow_id=wid)
    wait_until(_waits(wid, "event", SUSPENDED), 30, "the get_event to suspend")
    found = _seen(dbos_agent_database_url, api, wid, "event")
    assert found.step == 0 and found.until is not None
    assert found.text.startswith(f"event 'progress' of workflow {publisher!r} until ")
    da.operations.cancel(wid)


def test_a_dependency_waited_out(api: httpx.Client, dbos_agent_database_url: str) -> None:
    wid = new_id("payer")
    DOWN.add(wid)
    da.start(payer, wid, workflow_id=wid)
    wait_until(_waits(wid, "dependency"), 30, "the charge to wait for its next attempt")
    found = _seen(dbos_agent_database_url, api, wid, "dependency")
    info = da.retrieve(wid).get_info()
    assert info.retrying is not None and found.step == 0
    assert found.text == info.retrying.describe() and found.until == info.retrying.next_at
    assert found.text.startswith("the payments API since ")
    da.operations.cancel(wid)


def test_a_held_divergence(api: httpx.Client, dbos_agent_database_url: str) -> None:
    wid = new_id("diverged")
    hold_diverged(wid)
    found = _seen(dbos_agent_database_url, api, wid, "divergence")
    assert found == Waiting(
        "divergence", "code that fits its log (step 0: log 'prepare', code 'audit')", 0, None
    )
    da.operations.cancel(wid)


def test_an_orphan_without_an_owner_and_a_queued_workflow(
    api: httpx.Client, dbos_agent_database_url: str
) -> None:
    """Nobody here runs ``waiting_nobody``: enqueued, it waits its turn on its queue;
    forked from a client (which cannot run it), it is PENDING without an owner: an
    orphan until a process with its function takes it."""
    url = dbos_agent_database_url
    with da.Client(url) as client:
        queued = client.enqueue("waiting_queue", "waiting_nobody", 1).workflow_id
        delayed = client.enqueue("waiting_queue", "waiting_nobody", 2, delay=3600).workflow_id
        found = _seen(url, api, queued, "queue")
        assert found == Waiting("queue", "its turn on queue 'waiting_queue'", None, None)
        found = _seen(url, api, delayed, "queue")
        assert found.until is not None
        assert found.text == f"its turn on queue 'waiting_queue', not before {_utc(found.until)}"

        orphan = client.fork(queued, 0).workflow_id
        assert client.retrieve(orphan).status() is PENDING
        found = _seen(url, api, orphan, "orphan")
        assert found == Waiting(
            "orphan", "a live process with its function to take it over: it has no owner"
        )
        shown = ok(cli(url, "workflows", "show", orphan))
        assert "What now     run a process with its function (dbos-agent worker" in shown
        for wid in (queued, delayed, orphan):
            client.cancel(wid)


def test_nothing_is_waited_for_once_finished(
    api: httpx.Client, dbos_agent_database_url: str
) -> None:
    done, cancelled = new_id("finished"), new_id("cancelled")
    with da.workflow_id(done):
        assert payer(done) == done
    da.start(sleeper, cancelled, workflow_id=cancelled, delay=3600)
    da.operations.cancel(cancelled)
    for wid in (done, cancelled):
        assert da.retrieve(wid).get_info().waiting is None
        assert api.get(f"/api/workflows/{wid}").json()["waiting"] is None
        shown = json.loads(ok(cli(dbos_agent_database_url, "workflows", "show", wid, "--json")))
        assert shown["waiting"] is None

"""``da.Client``, the operator's surface from a process with only the URL: list, retrieve,
steps, cancel, resume, fork, garbage-collect; the CLI's workflow commands go through it."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

import dbos_agent as da
from dbos_agent._storage.database import SystemDatabase
from dbos_agent._storage.rows import ForkResult, ResumeResult
from tests.helpers import cli, new_id, ok


@da.step
def double(x: int) -> int:
    return 2 * x


@da.durable_workflow
def two_steps(x: int) -> int:
    return double(double(x))


@da.durable_workflow
def waits_for_go() -> str:
    message = da.recv("go", timeout=120)
    return f"got {message}"


@pytest.fixture
def client(runtime: da.Runtime, dbos_agent_database_url: str) -> Iterator[da.Client]:
    with da.Client(dbos_agent_database_url) as c:
        yield c


def test_list_filters_retrieve_and_steps(client: da.Client) -> None:
    before = datetime.now(UTC) - timedelta(seconds=1)
    wid = new_id()
    with da.workflow_id(wid):
        assert two_steps(3) == 12
    queue = da.Queue(new_id("q"))
    queued = queue.enqueue(two_steps, 1)
    assert queued.result(30) == 4

    info = client.get_workflow(wid)
    assert info.status == da.WorkflowStatus.SUCCESS and info.output == 12
    assert client.retrieve(wid).result(5) == 12
    assert [s.output for s in client.list_steps(wid)] == [6, 12]

    mine = client.list_workflows(name="two_steps", created_after=before, limit=1000)
    assert {wid, queued.workflow_id} <= {i.workflow_id for i in mine}
    assert [i.workflow_id for i in client.list_workflows(queue=queue.name)] == [queued.workflow_id]
    older = client.list_workflows(created_before=before, limit=1000)
    assert wid not in {i.workflow_id for i in older}
    assert all(i.created_at < before for i in older)
    assert all(
        i.status == da.WorkflowStatus.SUCCESS
        for i in client.list_workflows(status="SUCCESS", created_after=before)
    )
    assert len(client.list_workflows(created_after=before, limit=1)) == 1
    with pytest.raises(ValueError):
        client.list_workflows(status="FINE")

    # as in DBOS: a listing may leave the inputs and the output unread (None)
    def listed(load_input: bool = True, load_output: bool = True) -> tuple[object, object]:
        [found] = client.list_workflows(
            name="two_steps",
            created_after=before,
            limit=1,
            load_input=load_input,
            load_output=load_output,
        )
        assert found.workflow_id == queued.workflow_id and found.status is da.WorkflowStatus.SUCCESS
        return found.inputs, found.output

    loaded = listed()
    assert loaded[0] is not None and loaded[1] == 4
    assert listed(load_input=False) == (None, 4)
    assert listed(load_output=False) == (loaded[0], None)
    assert listed(load_input=False, load_output=False) == (None, None)
    here = da.operations.list_workflows(name="two_steps", limit=1, load_output=False)
    assert [(i.workflow_id, i.output) for i in here] == [(queued.workflow_id, None)]

    unknown = new_id()
    for call in (client.get_workflow, client.retrieve, client.list_steps):
        with pytest.raises(da.WorkflowNotFoundError):
            call(unknown)


def test_cancel_then_resume_continue_the_workflow(client: da.Client) -> None:
    handle = da.start(waits_for_go)
    previous = client.cancel(handle.workflow_id)
    assert previous in (da.WorkflowStatus.PENDING, da.WorkflowStatus.SUSPENDED)
    with pytest.raises(da.WorkflowCancelledError):
        client.retrieve(handle.workflow_id).result(30)
    assert client.cancel(handle.workflow_id) == da.WorkflowStatus.CANCELLED  # a no-op

    resumed = client.resume(handle.workflow_id)
    assert isinstance(resumed.report, ResumeResult)
    assert resumed.report.previous == da.WorkflowStatus.CANCELLED
    client.send(handle.workflow_id, "it", topic="go")
    assert resumed.result(60) == "got it"  # this process has the function: it continued

    with pytest.raises(da.errors.WorkflowStatusError):
        client.cancel(handle.workflow_id)  # finished: its outcome stays
    assert client.resume(handle.workflow_id).result(30) == "got it"  # as DBOS: a no-op


def test_fork_reuses_the_steps_below(client: da.Client) -> None:
    wid = new_id()
    with da.workflow_id(wid):
        two_steps(5)
    forked = client.fork(wid, 1, new_workflow_id=new_id("fork"))
    assert isinstance(forked.report, ForkResult) and forked.report.copied_steps == 1
    assert forked.result(60) == 20
    assert len(client.list_steps(forked.workflow_id)) == 2
    past_the_end = client.fork(wid, 7)  # from the end of the log, as DBOS does
    assert isinstance(past_the_end.report, ForkResult) and past_the_end.report.from_step == 2


def test_garbage_collect_counts_and_deletes(client: da.Client) -> None:
    wid = new_id()
    with da.workflow_id(wid):
        two_steps(1)
    report = client.garbage_collect(timedelta(seconds=0.001), dry_run=True)
    assert report.dry_run and report.workflows >= 1
    assert client.get_workflow(wid).status == da.WorkflowStatus.SUCCESS
    with pytest.raises(ValueError):
        client.garbage_collect(timedelta(days=1), statuses=[])


def test_a_client_over_an_open_database_leaves_it_open(dbos_agent_database_url: str) -> None:
    db = SystemDatabase(dbos_agent_database_url, pool_size=1)
    db.open()
    try:
        with da.Client.over(db) as client:
            client.list_workflows(limit=1)
        assert db.workflows.list(limit=1) is not None  # still usable
    finally:
        db.close()


def test_the_cli_acts_through_the_client(runtime: da.Runtime, dbos_agent_database_url: str) -> None:
    handle = da.start(waits_for_go)
    out = ok(cli(dbos_agent_database_url, "workflows", "cancel", handle.workflow_id, "--json"))
    assert '"changed": true' in out
    with da.Client(dbos_agent_database_url) as client:
        assert client.get_workflow(handle.workflow_id).status == da.WorkflowStatus.CANCELLED
    missing = cli(dbos_agent_database_url, "workflows", "steps", new_id())
    assert missing.returncode == 1 and "no workflow with id" in missing.stderr


@da.durable_workflow
def publishes(value: str) -> str:
    da.set_event("progress", {"at": value})
    return str(da.recv("go", timeout=120))


def test_send_get_event_and_fork_origin(client: da.Client) -> None:
    wid = new_id("client-event")
    handle = da.start(publishes, "half", workflow_id=wid)
    assert client.get_event(wid, "progress", timeout=30) == {"at": "half"}
    assert client.get_event(wid, "never", "none yet", timeout=0.2) == "none yet"
    assert client.send(wid, "a", "go", idempotency_key="k1") is True
    assert client.send(wid, "a", "go", idempotency_key="k1") is False  # delivered once
    assert handle.result(timeout=30) == "a"
    assert client.fork_origin(wid) is None
    fork = client.fork(wid, 1)
    assert client.fork_origin(fork.workflow_id) == (wid, 1)
    assert client.get_event(fork.workflow_id, "progress") == {"at": "half"}  # copied
    # an id that does not exist (yet) is waited for, as da.get_event and DBOS do
    assert client.get_event("nobody", "progress", "none", timeout=0.1) == "none"
    client.cancel(fork.workflow_id)

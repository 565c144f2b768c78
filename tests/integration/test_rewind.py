"""Rewind in place and edited forks: what a rewind undoes (messages, events, streams), what
it refuses, and edits checked against the code and the log before anything is written."""

from __future__ import annotations

import json
import threading
from collections import Counter
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

import dbos_agent as da
from dbos_agent._engine.runtime.core import Engine
from dbos_agent._storage.rows import RewindResult
from dbos_agent.errors import ForkEditError, WorkflowStatusError
from tests.helpers import cli, new_id, per_test
from tests.support.web import NEEDS_CHROMIUM, Server, dashboard

RUNS: Counter[str] = per_test(Counter())
#: key -> the re-run waits for it after its recv; REACHED[key] is set when it does
GATES: dict[str, threading.Event] = per_test({})
REACHED: dict[str, threading.Event] = per_test({})


def _wait(event: threading.Event) -> None:
    assert event.wait(15), "the test gate was never opened"


@da.step
def count(key: str, i: int) -> int:
    RUNS[f"{key}:{i}"] += 1
    return i


@da.durable_workflow(name="rewind_mailbox")
def mailbox(key: str) -> list[Any]:
    first = count(key, 0)  # 0
    da.set_event("stage", "one")  # 1
    message = da.recv("in", timeout=15)  # 2
    if (gate := GATES.get(key)) is not None:
        REACHED[key].set()
        _wait(gate)
    da.set_event("stage", "two")  # 3
    da.write_stream("out", message)  # 4
    da.close_stream("out")  # 5
    return [first, message, count(key, 1)]  # 6


class Plan(BaseModel):
    n: int


@da.step
def plan(key: str) -> Plan:
    RUNS[f"{key}:plan"] += 1
    return Plan(n=2)


@da.step
def act(key: str, n: int) -> int:
    RUNS[f"{key}:act"] += 1
    return n


@da.durable_workflow
def planner(key: str, factor: int) -> int:
    return act(key, plan(key).n * factor)


def _finished_mailbox(client: da.Client) -> str:
    wid = new_id()
    handle = da.start(mailbox, wid, workflow_id=wid)
    client.send(wid, "hello", topic="in")
    assert handle.result(timeout=30) == [0, "hello", 1]
    return wid


def test_rewind_reruns_from_the_step_with_its_messages_unconsumed(engine: Engine) -> None:
    client = da.Client.over(engine.db)
    wid = _finished_mailbox(client)
    GATES[wid], REACHED[wid] = threading.Event(), threading.Event()
    handle = da.operations.rewind(wid, 2, by="tester")
    _wait(REACHED[wid])  # the re-run took the message back and stops before step 3
    assert [s.seq for s in client.list_steps(wid)] == [0, 1, 2]
    assert client.list_steps(wid)[2].output == "hello", "the message came back to recv"
    assert client.get_event(wid, "stage") == "one", "the deleted set_event is undone"
    assert [k.key for k in client.stream_keys(wid)] == [], "the deleted writes are gone"
    GATES[wid].set()
    assert handle.result(timeout=30) == [0, "hello", 1]
    assert RUNS[f"{wid}:0"] == 1, "a kept step is replayed, not run"
    assert RUNS[f"{wid}:1"] == 2, "a deleted step runs again"
    assert [i.value for i in client.read_stream(wid, "out", timeout=5)] == ["hello"]
    (edit,) = client.edits(wid)
    assert edit["kind"] == "rewind" and edit["to_step"] == 2 and edit["by"] == "tester"
    assert edit["deleted_steps"] == 5 and edit["status"] == "SUCCESS" and edit["at"]


def test_rewind_from_a_client_is_run_by_a_live_process(engine: Engine) -> None:
    client = da.Client.over(engine.db)
    wid = _finished_mailbox(client)
    handle = client.rewind(wid, 6)
    report = handle.report
    assert isinstance(report, RewindResult) and report.deleted_steps == 1
    assert handle.result(timeout=30) == [0, "hello", 1]
    assert RUNS[f"{wid}:1"] == 2 and RUNS[f"{wid}:0"] == 1


def test_rewind_refusals_write_nothing(engine: Engine) -> None:
    client = da.Client.over(engine.db)
    wid = _finished_mailbox(client)
    with pytest.raises(WorkflowStatusError, match="its log ends at step 7"):
        client.rewind(wid, 8)
    running = new_id()
    GATES[running], REACHED[running] = threading.Event(), threading.Event()
    handle = da.start(mailbox, running, workflow_id=running)
    client.send(running, "hi", topic="in")
    _wait(REACHED[running])
    with pytest.raises(WorkflowStatusError, match="cancel it first"):
        client.rewind(running, 0)
    GATES[running].set()
    assert handle.result(timeout=30) == [0, "hi", 1]
    assert client.edits(wid) == [] and client.edits(running) == []
    assert len(client.list_steps(wid)) == 7


def test_edited_fork_replays_the_replaced_output_with_the_edited_inputs(
    engine: Engine,
) -> None:
    wid = new_id()
    assert da.start(planner, wid, 10, workflow_id=wid).result(timeout=30) == 20
    fork = da.operations.fork(wid, 1, inputs={"factor": 3}, replace={"0:plan": {"n": 5}}, by="me")
    assert fork.result(timeout=30) == 15
    assert RUNS[f"{wid}:plan"] == 1 and RUNS[f"{wid}:act"] == 2
    client = da.Client.over(engine.db)
    assert client.get_workflow(fork.workflow_id).inputs == {"key": wid, "factor": 3}
    assert client.list_steps(fork.workflow_id)[0].output == {"n": 5}
    inputs, output = client.edits(fork.workflow_id)
    assert inputs["kind"] == "inputs" and inputs["names"] == ["factor"] and inputs["checked"]
    assert (output["kind"], output["seq"], output["name"], output["by"]) == (
        "output",
        0,
        "plan",
        "me",
    )


@pytest.mark.parametrize(
    ("edits", "where", "text"),
    [
        ({"replace": {0: {"n": "many"}}}, "step 0", "return type"),
        ({"replace": {"0:act": {"n": 1}}}, "step 0", "it is 'plan', not 'act'"),
        ({"replace": {1: 3}}, "step 1", "not below the fork point"),
        ({"replace": {"x": 3}}, None, "is not a step"),
        ({"inputs": {"factor": "ten"}}, "inputs.factor", "factor"),
        ({"inputs": {"nope": 1}}, "inputs", "nope"),
    ],
)
def test_bad_edits_are_refused_by_name_and_write_nothing(
    engine: Engine, edits: dict[str, Any], where: str | None, text: str
) -> None:
    wid, new = new_id(), new_id("fork")
    assert da.start(planner, wid, 10, workflow_id=wid).result(timeout=30) == 20
    client = da.Client.over(engine.db)
    error: type[Exception] = ForkEditError if where else ValueError
    with pytest.raises(error, match=text) as caught:
        client.fork(wid, 1, new_workflow_id=new, **edits)
    if where is not None:
        assert isinstance(caught.value, ForkEditError) and caught.value.where == where
    with pytest.raises(da.WorkflowNotFoundError):
        client.get_workflow(new)


def test_bookkeeping_steps_cannot_be_replaced(engine: Engine) -> None:
    client = da.Client.over(engine.db)
    wid = _finished_mailbox(client)
    with pytest.raises(ForkEditError, match="bookkeeping") as caught:
        client.fork(wid, 6, replace={1: None})
    assert caught.value.where == "step 1"
    fork = client.fork(wid, 3, replace={"2:dbos_agent.recv": "edited"})
    assert fork.result(timeout=30) == [0, "edited", 1]


def test_cli_forks_with_edits_rewinds_and_shows_the_edits(
    engine: Engine, dbos_agent_database_url: str
) -> None:
    url, wid = dbos_agent_database_url, new_id()
    assert da.start(planner, wid, 10, workflow_id=wid).result(timeout=30) == 20
    fork = ["workflows", "fork", wid, "--from-step", "1", "--json", "--by", "ops"]
    bad = cli(url, *fork, "--replace", '0={"n": "x"}')
    assert bad.returncode != 0 and "step 0" in bad.stderr and "return type" in bad.stderr, bad
    done = cli(url, *fork, "--inputs", '{"factor": 3}', "--replace", '0:plan={"n": 5}')
    assert done.returncode == 0, done
    new = json.loads(done.stdout)["workflow_id"]
    client = da.Client.over(engine.db)
    assert client.retrieve(new).result(timeout=30) == 15
    shown = json.loads(cli(url, "workflows", "show", new, "--json").stdout)
    assert [e["kind"] for e in shown["edits"]] == ["inputs", "output"]
    assert [s["edited"] for s in shown["steps"]] == [True, False]
    rewound = cli(url, "workflows", "rewind", wid, "--to-step", "1", "--json")
    assert rewound.returncode == 0, rewound
    assert json.loads(rewound.stdout)["deleted_steps"] == 1
    assert client.retrieve(wid).result(timeout=30) == 20
    text = cli(url, "workflows", "show", wid).stdout
    assert "rewound to step 1 from SUCCESS" in text, text


def test_api_rewinds_and_forks_with_edits(engine: Engine, api: httpx.Client) -> None:
    wid = new_id()
    assert da.start(planner, wid, 10, workflow_id=wid).result(timeout=30) == 20
    bad = api.post(f"/api/workflows/{wid}/fork", json={"from_step": 1, "replace": {"0": "x"}})
    assert bad.status_code == 400 and bad.json()["type"] == "ForkEditError", bad.text
    forked = api.post(
        f"/api/workflows/{wid}/fork",
        json={"from_step": 1, "inputs": {"factor": 4}, "replace": {"0": {"n": 1}}},
    )
    assert forked.status_code == 200, forked.text
    client = da.Client.over(engine.db)
    assert client.retrieve(forked.json()["workflow_id"]).result(timeout=30) == 4
    shown = api.get(f"/api/workflows/{forked.json()['workflow_id']}").json()
    assert shown["edits"][0]["by"] == "api" and shown["actions"]["rewind"]
    rewound = api.post(f"/api/workflows/{wid}/rewind", json={"to_step": 0})
    assert rewound.status_code == 200 and rewound.json()["deleted_steps"] == 2, rewound.text
    assert client.retrieve(wid).result(timeout=30) == 20
    assert RUNS[f"{wid}:plan"] == 2


@NEEDS_CHROMIUM
def test_the_dashboard_rewinds_and_shows_the_edit(engine: Engine, server: Server) -> None:
    from playwright.sync_api import expect, sync_playwright

    wid = _finished_mailbox(da.Client.over(engine.db))
    with sync_playwright() as pw, dashboard(pw, server) as page:
        page.locator(f'tr[data-id="{wid}"]').click()
        expect(page.locator("#detail h2.id")).to_have_text(wid, timeout=15_000)
        page.locator("#fork-step").fill("6")
        page.get_by_test_id("rewind").click()
        expect(page.get_by_test_id("ack")).to_contain_text("Rewound to step 6", timeout=15_000)
        expect(page.get_by_test_id("edits")).to_contain_text(
            "rewound to step 6 from SUCCESS", timeout=15_000
        )
    assert da.retrieve(wid).result(timeout=30) == [0, "hello", 1]
    assert RUNS[f"{wid}:1"] == 2

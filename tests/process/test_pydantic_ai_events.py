"""A Pydantic AI run's events as a durable stream: ``Durability(events=...)``.

The crash test runs the agent (tests/apps/pydantic_ai_events_app.py) as a subprocess against
the scripted Messages API server, which streams its replies over real HTTP; the CLI
(``dbos-agent stream ID KEY --follow --json``) follows the stream from another process;
the app is killed -9 in the middle of a streamed reply, and a third process recovers the
workflow. What the reader printed and what the server was asked are counted from outside.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai.messages import FunctionToolResultEvent, PartDeltaEvent

import dbos_agent as da
from dbos_agent.agent.scripted_server import Reply, ScriptedServer, ScriptItem, text, tool_use
from dbos_agent.integrations.pydantic_ai import DEFAULT_EVENTS_KEY, AgentRunEnd, agent_event
from dbos_agent.integrations.pydantic_ai.events import EventPublisher
from dbos_agent.testing import Inspector
from tests.apps import pydantic_ai_app as app
from tests.apps.pydantic_ai_events_app import narrate, narrator
from tests.helpers import new_id, wait_until
from tests.processes import output
from tests.support import zygote

ROOT = Path(__file__).resolve().parents[2]
MODEL = "narrator__model.request_stream"
ADD = "narrator__function_toolset__math.call_tool:add"
WRITE = "dbos_agent.write_stream"
#: The marker before the item that ends a run's events, the item's write, the stream's close.
RUN_END = ["dbos_agent.patch:pydantic_ai.run_result_event", WRITE, "dbos_agent.close_stream"]
#: The second reply: ten deltas of three words (the scripted server's chunking).
STORY = " ".join(f"word{i}" for i in range(30))


@pytest.fixture(autouse=True)
def side_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The tools' side-effect log (tests/apps/pydantic_ai_app.py), here and in the app."""
    log = tmp_path / "side.log"
    monkeypatch.setenv("SIDE_LOG", str(log))
    return log


def turn_of(body: dict[str, Any]) -> int:
    return sum(1 for m in body["messages"] if m["role"] == "assistant")


def storyteller(slow_first_story: bool) -> Callable[[dict[str, Any]], ScriptItem]:
    """The model: ``add(1, 2)``, then the story (its first telling slow enough to kill
    the client in the middle of it)."""
    told = Counter[int]()

    def answer(body: dict[str, Any]) -> ScriptItem:
        turn = turn_of(body)
        told[turn] += 1
        if turn == 0:
            return Reply((tool_use("add", {"a": 1, "b": 2}),))
        slow = slow_first_story and told[turn] == 1
        return Reply((text(STORY),), chunk_delay=0.25 if slow else 0.0)

    return answer


def essence(value: dict[str, Any]) -> dict[str, Any]:
    """An event without its origin and run id (which name the attempt and the workflow
    that produced it)."""
    return {k: v for k, v in value.items() if k not in ("origin", "run_id")}


def story_told(items: list[dict[str, Any]]) -> str:
    """The text of the story events: the start part's content and every delta."""
    told = ""
    for item in items:
        event = item["value"]
        if event["event_kind"] == "part_start":
            told += event["part"].get("content") or ""
        elif event["event_kind"] == "part_delta":
            told += event["delta"].get("content_delta") or ""
    return told


def run_app(url: str, wid: str, model_url: str) -> subprocess.Popen[str]:
    return zygote.popen(
        [sys.executable, "-m", "tests.apps.pydantic_ai_events_app", wid, "tell"],
        env={**os.environ, "DBOS_AGENT_DATABASE_URL": url, "MODEL_URL": model_url},
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


class Follower:
    """``dbos-agent stream ID KEY --follow --json`` in a subprocess, its lines collected."""

    def __init__(self, url: str, wid: str) -> None:
        self.items: list[dict[str, Any]] = []
        command = ["stream", wid, DEFAULT_EVENTS_KEY, "--follow", "--json"]
        self.process = zygote.popen(
            [sys.executable, "-m", "dbos_agent", *command],
            env={**os.environ, "DBOS_AGENT_DATABASE_URL": url},
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._reading = threading.Thread(target=self._read)
        self._reading.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.items.append(json.loads(line))

    def story_deltas(self) -> int:
        """How many deltas of the story (after the tool's result) it has read."""
        kinds = [item["value"]["event_kind"] for item in list(self.items) if not item["reset"]]
        if "function_tool_result" not in kinds:
            return 0
        return kinds[kinds.index("function_tool_result") :].count("part_delta")

    def finish(self) -> tuple[int, str]:
        code = self.process.wait(timeout=60)
        self._reading.join(30)
        assert self.process.stderr is not None
        return code, self.process.stderr.read()


@pytest.fixture
def follower_cleanup() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
            process.communicate()


def test_the_event_stream_followed_by_a_second_process_across_a_kill_has_no_gap_no_duplicate_one_reset(  # noqa: E501
    dbos_agent_database_url: str,
    dbos_agent_inspector: Inspector,
    follower_cleanup: list[subprocess.Popen[str]],
    side_log: Path,
) -> None:
    url, inspector, wid = dbos_agent_database_url, dbos_agent_inspector, new_id("pai-events")
    with ScriptedServer(storyteller(slow_first_story=True)) as server:
        first = run_app(url, wid, server.url)
        follower_cleanup.append(first)
        wait_until(lambda: len(server.requests) > 0, 30, "the first request of the workflow")
        reader = Follower(url, wid)
        follower_cleanup.append(reader.process)
        try:
            wait_until(
                lambda: first.poll() is not None or reader.story_deltas() >= 3,
                30,
                "three deltas of the story read",
                every=0.02,
            )
            assert first.poll() is None, first.communicate()[1]
        finally:
            first.send_signal(signal.SIGKILL)
            first.communicate(timeout=30)
        recovering = run_app(url, wid, server.url)
        follower_cleanup.append(recovering)
        out, err = recovering.communicate(timeout=60)
        assert recovering.returncode == 0, output(recovering, out, err)
        assert json.loads(out.strip().splitlines()[-1]) == STORY
        code, err = reader.finish()
        assert code == 0, err
        requests = list(server.requests)

    items = reader.items
    # no gap, no duplicate: every offset once, in order
    assert [item["offset"] for item in items] == list(range(len(items)))
    steps = inspector.steps(wid)
    assert [s.name for s in steps] == [MODEL, ADD, WRITE, WRITE, MODEL, *RUN_END]
    story_step = steps[4].seq
    *items, ending = items  # the run's last item says it ended, with its output
    assert ending["step"] is None and ending["value"]["event_kind"] == "agent_run_result"
    assert ending["value"]["output"] == STORY
    end = agent_event(ending["value"])
    assert isinstance(end, AgentRunEnd) and end.run_id == f"{wid}:0"
    # one reset: the killed attempt of the story's request
    resets = [n for n, item in enumerate(items) if item["reset"]]
    assert len(resets) == 1 and items[resets[0]]["step"] == story_step, resets
    before, after = items[: resets[0]], items[resets[0] + 1 :]
    killed = [item for item in before if item["step"] == story_step]
    assert {item["attempt"] for item in killed} == {1} and len(killed) >= 4
    # after it, the full re-run of the request, and nothing else (the recovered run
    # numbers its attempts afresh: the reset is what sets the two apart)
    assert {item["step"] for item in after} == {story_step}
    assert story_told(after) == STORY
    assert [item["value"]["event_kind"] for item in after] == [
        "part_start",
        "final_result",
        *["part_delta"] * 9,
        "part_end",
    ]
    # what the killed attempt wrote is the start of what the re-run wrote
    assert [essence(i["value"]) for i in killed] == [
        essence(i["value"]) for i in after[: len(killed)]
    ]
    # before the story: the first request's events once, the tool's call and result once
    earlier = [item for item in before if item["step"] != story_step]
    assert {item["attempt"] for item in earlier if item["step"] is not None} == {1}
    workflow_side = [item["value"]["event_kind"] for item in earlier if item["step"] is None]
    assert workflow_side == ["function_tool_call", "function_tool_result"]
    result = agent_event(earlier[-1]["value"])
    assert isinstance(result, FunctionToolResultEvent) and result.part.content == 3
    assert isinstance(agent_event(killed[-1]["value"]), PartDeltaEvent)
    # the server: the killed request once more (it was not finished), every other once
    assert [(turn_of(r.body), r.stream) for r in requests] == [(0, True), (1, True), (1, True)]
    assert requests[1].body == requests[2].body
    assert side_log.read_text().count("add 1 2 start") == 1  # recorded before the kill


# ------------------------------------------------------------------ in-process runs


def stream_items(wid: str) -> list[da.StreamItem]:
    """The stream of a finished workflow (a reader stops at its end)."""
    return list(da.read_stream(wid, DEFAULT_EVENTS_KEY, timeout=10))


def test_replaying_a_finished_run_writes_no_event_again(
    runtime: da.Runtime, inspector: Inspector
) -> None:
    """A fork from the story's request replays the first request, the tool call and the
    two event writes from the log: it has the events they wrote (copied by the fork) and
    writes only the story's again; the same id started again writes nothing."""
    server = ScriptedServer(storyteller(slow_first_story=False)).start()
    previous = app.use_server(server.url)
    try:
        wid = new_id("pai-events-replay")
        handle = da.start(narrate, "tell", workflow_id=wid)
        assert handle.result(timeout=30) == STORY
        original = stream_items(wid)
        steps = inspector.steps(wid)
        assert [s.name for s in steps][:5] == [MODEL, ADD, WRITE, WRITE, MODEL]
        assert not any(item.reset for item in original)

        again = da.start(narrate, "tell", workflow_id=wid)
        assert again.result(timeout=30) == STORY
        assert [(i.offset, i.value) for i in stream_items(wid)] == [
            (i.offset, i.value) for i in original
        ]

        fork = da.operations.fork(wid, from_step=steps[4].seq)
        assert fork.result(timeout=30) == STORY
        forked = stream_items(fork.workflow_id)
        assert [i.offset for i in forked] == list(range(len(forked)))
        assert [essence(i.value) for i in forked] == [essence(i.value) for i in original]
        assert [(i.step, i.attempt) for i in forked] == [(i.step, i.attempt) for i in original]
        assert len(server.requests) == 3  # the two of the run, the story again for the fork
    finally:
        app.use_server(previous)
        server.stop()


def test_a_log_recorded_before_the_run_end_item_replays_without_it(
    runtime: da.Runtime, inspector: Inspector, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Across a deploy: a run recorded by code that wrote no item at its end (emulated by
    turning the write off) is replayed whole by today's code (a fork past its last step)
    without diverging and without writing the item; a new run writes it."""
    server = ScriptedServer(storyteller(slow_first_story=False)).start()
    previous = app.use_server(server.url)
    try:
        with monkeypatch.context() as old_code:
            old_code.setattr(EventPublisher, "write_run_result", _wrote_nothing)
            old = da.start(narrate, "tell")
            assert old.result(timeout=30) == STORY
        steps = inspector.steps(old.workflow_id)
        assert [s.name for s in steps] == [
            MODEL,
            ADD,
            WRITE,
            WRITE,
            MODEL,
            "dbos_agent.close_stream",
        ]
        fork = da.operations.fork(old.workflow_id, from_step=len(steps))
        assert fork.result(timeout=30) == STORY
        assert inspector.status(fork.workflow_id) == da.WorkflowStatus.SUCCESS
        assert [s.name for s in inspector.steps(fork.workflow_id)] == [s.name for s in steps]
        kinds = [i.value["event_kind"] for i in stream_items(fork.workflow_id)]
        assert "agent_run_result" not in kinds
        assert len(server.requests) == 2  # the fork replayed both requests
    finally:
        app.use_server(previous)
        server.stop()


async def _wrote_nothing(self: EventPublisher, run_id: str | None, output: object) -> None:
    """``EventPublisher.write_run_result`` before it existed."""


def test_without_events_the_run_writes_no_stream(runtime: da.Runtime, inspector: Inspector) -> None:
    """The option is off by default: the requests are not streamed steps, and nothing
    is written."""
    server = ScriptedServer(storyteller(slow_first_story=False)).start()
    previous = app.use_server(server.url)
    try:
        handle = da.start(app.solve, "compute")
        assert handle.result(timeout=30) == STORY
        names = inspector.step_names(handle.workflow_id)
        request, add = "calc__model.request", "calc__function_toolset__math.call_tool:add"
        assert names == [request, add, request]
        assert stream_items(handle.workflow_id) == []
    finally:
        app.use_server(previous)
        server.stop()


def test_tool_results_take_the_positions_their_calls_reserved_whichever_finishes_first(
    runtime: da.Runtime, inspector: Inspector, side_log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two calls of one reply run at once and the second finishes first: its result is
    the first in the stream (live), but each result's write is at the position reserved
    with its call's event, so a replay finds each where the run wrote it."""
    monkeypatch.setenv("HANG_AT", "slow:1-after-2")
    slow = "narrator__function_toolset__math.call_tool:slow"
    both = Reply((tool_use("slow", {"i": 1}), tool_use("slow", {"i": 2})))
    server = ScriptedServer([both, Reply((text("done"),)), Reply((text("done"),))]).start()
    previous = app.use_server(server.url)
    try:
        handle = da.start(narrate, "parallel")
        assert handle.result(timeout=30) == "done"
        steps = inspector.steps(handle.workflow_id)
        calls = [slow, WRITE, WRITE] * 2  # each call, its call event, its result event
        assert [s.name for s in steps] == [MODEL, *calls, MODEL, *RUN_END]
        items = stream_items(handle.workflow_id)
        told = [agent_event(item.value) for item in items if item.step is None]
        kinds = [event.event_kind for event in told]
        calls_then_results = ["function_tool_call"] * 2 + ["function_tool_result"] * 2
        assert kinds == [*calls_then_results, "agent_run_result"]
        results = [e.part.content for e in told if isinstance(e, FunctionToolResultEvent)]
        assert results == [20, 10]  # slow(2) finished first
        # the writes' records are their offsets: the first call's result was written last
        first_result, second_result = steps[3].output, steps[6].output
        assert first_result > second_result

        fork = da.operations.fork(handle.workflow_id, from_step=steps[7].seq)
        assert fork.result(timeout=30) == "done"
        forked = stream_items(fork.workflow_id)
        assert [essence(i.value) for i in forked] == [essence(i.value) for i in items]
        assert len(server.requests) == 3
        ran = [line.rsplit(" ", 1)[0] for line in side_log.read_text().splitlines()]
        assert sorted(ran) == ["slow 1 end", "slow 1 start", "slow 2 end", "slow 2 start"]
    finally:
        app.use_server(previous)
        server.stop()


def test_outside_a_workflow_an_agent_with_events_runs_as_usual() -> None:
    """No workflow, no stream: the run neither streams for the option nor writes."""
    server = ScriptedServer(storyteller(slow_first_story=False)).start()
    previous = app.use_server(server.url)
    try:
        assert asyncio.run(narrator.run("tell")).output == STORY
        assert len(server.requests) == 2
    finally:
        app.use_server(previous)
        server.stop()

"""Steps: checkpoint before moving on, numbering, typed replay, errors, retries, JSON."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import anthropic.types
import pytest
from pydantic import BaseModel
from typing_extensions import TypedDict

import dbos_agent as da
from dbos_agent._engine.runtime.core import Engine
from dbos_agent._storage import jsonb
from dbos_agent._storage.rows import NewWorkflow
from dbos_agent.testing import Inspector
from tests.helpers import SimulatedCrash, new_id, per_test

CALLS: Counter[str] = per_test(Counter())
CRASH_AFTER: dict[str, int] = per_test({})


class Page(BaseModel):
    url: str
    size: int


@dataclasses.dataclass
class Point:
    x: int
    y: int


class Meta(TypedDict):
    tag: str
    score: float


def _maybe_crash(label: str) -> None:
    wid = da.current_workflow_id()
    assert wid is not None
    if CRASH_AFTER.get(wid) == CALLS[label]:
        raise SimulatedCrash(label)


@da.step
def fetch(url: str) -> Page:
    CALLS["fetch"] += 1
    return Page(url=url, size=len(url))


@da.step
def point(i: int) -> Point:
    CALLS["point"] += 1
    return Point(i, -i)


@da.step
def meta(tag: str) -> dict[str, list[Meta]]:
    CALLS["meta"] += 1
    return {tag: [Meta(tag=tag, score=0.5)]}


@da.step
def message() -> anthropic.types.Message:
    CALLS["message"] += 1
    return anthropic.types.Message.model_validate(
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-test",
            "content": [{"type": "text", "text": "hello"}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 3, "output_tokens": 1},
        }
    )


@da.durable_workflow
def typed_workflow(url: str) -> list[str]:
    page = fetch(url)
    pt = point(3)
    m = meta("t")
    msg = message()
    _maybe_crash("message")
    # On replay these must be the annotated types, not dicts.
    assert isinstance(page, Page), type(page)
    assert isinstance(pt, Point), type(pt)
    assert m == {"t": [{"tag": "t", "score": 0.5}]}
    assert isinstance(msg, anthropic.types.Message), type(msg)
    return [page.url, str(pt.x), msg.content[0].text]  # type: ignore[union-attr]


def test_replay_returns_the_annotated_types(runtime: da.Runtime) -> None:
    wid = new_id()
    CRASH_AFTER[wid] = 1
    with pytest.raises(SimulatedCrash), da.workflow_id(wid):
        typed_workflow("https://a")
    assert da.retrieve(wid).status() == da.WorkflowStatus.PENDING
    assert [s.seq for s in da.operations.list_steps(wid)] == [0, 1, 2, 3]
    CRASH_AFTER.clear()
    with da.workflow_id(wid):
        assert typed_workflow("https://a") == ["https://a", "3", "hello"]
    # every step ran exactly once: the second run replayed all four
    assert CALLS == Counter(fetch=1, point=1, meta=1, message=1)


def _count_steps(url: str, wid: str) -> int:
    with Inspector(url) as db:
        return db.rows_of(wid).steps


SEEN_IN_DB: list[int] = []


@da.step
def observe(url: str, i: int) -> int:
    wid = da.current_workflow_id()
    assert wid is not None
    SEEN_IN_DB.append(_count_steps(url, wid))
    return i


@da.durable_workflow
def observing(url: str, n: int) -> int:
    return sum(observe(url, i) for i in range(n))


def test_each_step_is_committed_before_the_next_runs(
    runtime: da.Runtime, dbos_agent_database_url: str
) -> None:
    SEEN_IN_DB.clear()
    wid = new_id()
    with da.workflow_id(wid):
        assert observing(dbos_agent_database_url, 5) == 10
    # step i sees exactly i committed steps, from another connection
    assert SEEN_IN_DB == [0, 1, 2, 3, 4]
    steps = da.operations.list_steps(wid)
    assert [s.seq for s in steps] == [0, 1, 2, 3, 4]
    assert all(s.name == "observe" and s.status == "SUCCESS" for s in steps)


@da.step
async def aadd(a: int, b: int) -> int:
    CALLS["aadd"] += 1
    await asyncio.sleep(0)
    return a + b


@da.durable_workflow
async def async_workflow(n: int) -> int:
    total = 0
    for i in range(n):
        total = await aadd(total, i)
    _maybe_crash("aadd")
    return total


def test_async_workflows_and_steps(runtime: da.Runtime) -> None:
    wid = new_id()
    CRASH_AFTER[wid] = 4
    with pytest.raises(SimulatedCrash), da.workflow_id(wid):
        asyncio.run(async_workflow(4))
    CRASH_AFTER.clear()
    with da.workflow_id(wid):
        assert asyncio.run(async_workflow(4)) == 6
    assert CALLS["aadd"] == 4
    handle = da.start(async_workflow, 3)
    assert handle.result(timeout=10) == 3


@da.step
def always_fails(msg: str) -> int:
    CALLS["always_fails"] += 1
    raise KeyError(msg)


@da.durable_workflow
def catches_step_error() -> str:
    try:
        always_fails("nope")
    except KeyError as exc:
        caught = f"caught {exc!r}"
    _maybe_crash("always_fails")
    return caught


def test_step_errors_are_recorded_and_replayed_without_running(runtime: da.Runtime) -> None:
    wid = new_id()
    CRASH_AFTER[wid] = 1
    with pytest.raises(SimulatedCrash), da.workflow_id(wid):
        catches_step_error()
    (step,) = da.operations.list_steps(wid)
    assert step.status == "ERROR" and step.error is not None
    assert step.error["type"] == "builtins.KeyError"
    CRASH_AFTER.clear()
    with da.workflow_id(wid):
        assert catches_step_error() == "caught KeyError('nope')"
    assert CALLS["always_fails"] == 1


class PaymentDeclined(Exception):
    def __init__(self, amount: int, reason: str) -> None:
        super().__init__(f"declined {amount}: {reason}")
        self.amount = amount


@da.durable_workflow
def failing_workflow(amount: int) -> None:
    raise PaymentDeclined(amount, "card expired")


def test_workflow_error_is_recorded_and_raised_again(runtime: da.Runtime) -> None:
    wid = new_id()
    with pytest.raises(PaymentDeclined), da.workflow_id(wid):
        failing_workflow(5)
    info = da.retrieve(wid).get_info()
    assert info.status == da.WorkflowStatus.ERROR
    assert info.error is not None and info.error["message"] == "declined 5: card expired"
    with pytest.raises(PaymentDeclined, match="declined 5: card expired"):
        da.retrieve(wid).result()
    # calling again with the id returns the recorded error, it does not run again
    with pytest.raises(PaymentDeclined), da.workflow_id(wid):
        failing_workflow(5)


ATTEMPTS: Counter[str] = Counter()


@da.step(retries=3, interval=0.001, backoff=2.0, retry_on=(ConnectionError,))
def flaky(key: str, failures: int) -> str:
    ATTEMPTS[key] += 1
    if ATTEMPTS[key] <= failures:
        raise ConnectionError(f"attempt {ATTEMPTS[key]} failed")
    return f"ok after {ATTEMPTS[key]}"


@da.step(retries=3, interval=0.001, retry_on=(ConnectionError,))
def wrong_kind(key: str) -> str:
    ATTEMPTS[key] += 1
    raise ValueError("not retryable")


@da.durable_workflow
def retrying(key: str, failures: int) -> str:
    return flaky(key, failures)


@da.durable_workflow
def not_retrying(key: str) -> str:
    return wrong_kind(key)


def test_retries_count_attempts_and_raise_the_original_error(runtime: da.Runtime) -> None:
    ok_id, bad_id, other_id = new_id(), new_id(), new_id()
    with da.workflow_id(ok_id):
        assert retrying(ok_id, 2) == "ok after 3"
    assert da.operations.list_steps(ok_id)[0].attempts == 3

    with pytest.raises(ConnectionError, match="attempt 4 failed"), da.workflow_id(bad_id):
        retrying(bad_id, 10)
    (step,) = da.operations.list_steps(bad_id)
    assert ATTEMPTS[bad_id] == 4 and step.attempts == 4
    assert step.error is not None and step.error["type"] == "builtins.ConnectionError"

    with pytest.raises(ValueError), da.workflow_id(other_id):
        not_retrying(other_id)
    assert ATTEMPTS[other_id] == 1


def test_retry_policy_backoff_is_bounded() -> None:
    policy = da.RetryPolicy(retries=10, interval=1.0, backoff=2.0, max_interval=5.0, jitter=0.0)
    delays = [policy.delay_before_retry(n, RuntimeError()) for n in range(1, 12)]
    assert delays[:4] == [1.0, 2.0, 4.0, 5.0]
    assert delays[10] is None


class Unserializable:
    pass


@da.step
def returns_object() -> Unserializable:
    return Unserializable()


@da.durable_workflow
def bad_output() -> None:
    returns_object()


def test_unserializable_step_output_names_the_step_and_writes_nothing(
    runtime: da.Runtime,
) -> None:
    wid = new_id()
    with pytest.raises(da.errors.SerializationError) as info, da.workflow_id(wid):
        bad_output()
    text = str(info.value)
    assert wid in text and "step 0" in text and "returns_object" in text
    assert "Unserializable" in text
    assert da.operations.list_steps(wid) == []
    assert da.retrieve(wid).status() == da.WorkflowStatus.ERROR


@da.durable_workflow
def takes_anything(x: object) -> None:
    pass


def test_unserializable_workflow_input_writes_no_row(runtime: da.Runtime) -> None:
    wid = new_id()
    with pytest.raises(da.errors.SerializationError, match="argument 'x'"), da.workflow_id(wid):
        takes_anything(Unserializable())
    with pytest.raises(da.WorkflowNotFoundError):
        da.retrieve(wid)


@da.step
def inner(x: int) -> int:
    CALLS["inner"] += 1
    return x + 1


@da.step
def outer(x: int) -> int:
    CALLS["outer"] += 1
    return inner(x) * 10


KEYS: list[str] = []


@da.step
def keyed() -> str:
    KEYS.append(da.step_key())
    _maybe_crash("keyed")
    return da.step_key()


@da.durable_workflow
def nesting() -> tuple[int, str]:
    return outer(1), keyed()


def test_steps_outside_a_workflow_and_nested_steps_are_plain_calls(runtime: da.Runtime) -> None:
    assert outer(1) == 20
    wid = new_id()
    with da.workflow_id(wid):
        assert nesting() == (20, f"{wid}:1")
    # the nested call was not a step of its own
    assert [s.name for s in da.operations.list_steps(wid)] == ["outer", "keyed"]
    with pytest.raises(da.DbosAgentError):
        da.step_key()


def test_step_key_is_stable_across_a_rerun_of_the_step(runtime: da.Runtime) -> None:
    KEYS.clear()
    wid = new_id()
    CALLS["keyed"] = 0
    CRASH_AFTER[wid] = 0  # crash inside the step, before its checkpoint
    with pytest.raises(SimulatedCrash), da.workflow_id(wid):
        nesting()
    CRASH_AFTER.clear()
    with da.workflow_id(wid):
        nesting()
    assert KEYS == [f"{wid}:1", f"{wid}:1"]


TIMED_ATTEMPTS: Counter[str] = Counter()


@da.step(timeout=0.2, retries=1, interval=0.01)
async def slow_call(key: str, seconds: float) -> str:
    TIMED_ATTEMPTS[key] += 1
    await asyncio.sleep(seconds)
    return "done"


@da.durable_workflow
async def calls_slowly(key: str, seconds: float) -> str:
    try:
        return await slow_call(key, seconds)
    except TimeoutError as exc:
        return f"gave up: {exc}"


def test_an_async_step_attempt_past_its_timeout_is_cancelled_retried_and_recorded(
    runtime: da.Runtime,
) -> None:
    wid = new_id("timeout")
    started = asyncio.run(_timed(calls_slowly, wid, 60.0))
    answer, seconds = started
    assert answer == "gave up: step 'slow_call' did not finish within 0.2s"
    assert seconds < 30  # two attempts of 0.2 s, not 60 s each
    assert TIMED_ATTEMPTS[wid] == 2
    [step] = da.operations.list_steps(wid)
    assert (step.name, step.status, step.attempts) == ("slow_call", "ERROR", 2)
    assert step.error is not None and step.error["type"] == "builtins.TimeoutError"
    replayed, _ = asyncio.run(_timed(calls_slowly, wid, 60.0))
    assert replayed == answer and TIMED_ATTEMPTS[wid] == 2  # replay raises it again, runs nothing
    fast = new_id("in-time")
    assert asyncio.run(_timed(calls_slowly, fast, 0.01))[0] == "done"


async def _timed(workflow: Any, wid: str, seconds: float) -> tuple[str, float]:
    started = time.monotonic()
    with da.workflow_id(wid):
        answer = await workflow(wid, seconds)
    return answer, time.monotonic() - started


def test_a_timeout_on_a_sync_step_is_refused() -> None:
    def blocking() -> None: ...

    with pytest.raises(ValueError, match="timeout= needs an async step"):
        da.step(timeout=1.0)(blocking)
    with pytest.raises(ValueError, match="timeout must be > 0"):
        da.step(timeout=0)(slow_call.__wrapped__)  # type: ignore[attr-defined]


def test_a_group_commit_batch_stores_every_value_as_given_and_says_which_it_wrote(
    engine: Engine,
) -> None:
    """The batched checkpoint (several steps and workflows' outcomes in one statement, see
    log_writes.py) keeps awkward text intact (quotes, backslashes, non-ASCII, NUL,
    errors), writes only rows whose guard holds and whose position is free, and says so
    row by row."""
    db = engine.db
    mine, foreign, ending, taken = new_id(), new_id(), new_id(), new_id()
    for wid, owner in ((mine, engine.session_key), (foreign, -1), (ending, engine.session_key)):
        db.workflows.insert(
            NewWorkflow(
                workflow_id=wid,
                name="batch",
                inputs="{}",
                executor_id=engine.executor_id,
                app_version=None,
                max_recovery_attempts=3,
                owner_key=owner,
            )
        )
    values: list[Any] = [
        'he said "hi" \\ back',
        "café ☃ 😀 \u2028",
        "a\x00b",
        {"nested": ["x", 1.5, None, True]},
    ]
    started = datetime.now(UTC)

    def row(wid: str, seq: int, output: str | None, error: str | None = None) -> dict[str, Any]:
        status = da.records.StepStatus.SUCCESS if error is None else da.records.StepStatus.ERROR
        return {
            "owner_key": engine.session_key,
            "workflow_id": wid,
            "seq": seq,
            "name": f"s{seq}",
            "status": status,
            "output": None if output is None else db.json_in(output, "test"),
            "error": error,
            "attempts": 2,
            "started_at": started,
        }

    def outcome(wid: str, output: str) -> dict[str, Any]:
        return {
            "workflow_id": wid,
            "status": da.WorkflowStatus.SUCCESS,
            "output": db.json_in(output, "test"),
            "error": None,
            "owner_key": engine.session_key,
        }

    write = db.log_writes.write
    first = write([("step", row(mine, 0, "0"))])  # one row: the plain statement
    steps: list[tuple[Any, dict[str, Any]]] = [
        ("step", row(mine, i + 1, json.dumps(v))) for i, v in enumerate(values)
    ]
    error = json.dumps({"type": "builtins.ValueError", "message": 'bad "x"', "args": []})
    steps += [
        ("step", row(mine, 5, None, error)),
        ("step", row(mine, 0, "1")),  # the position is taken
        ("step", row(foreign, 0, "2")),  # the guard refuses: another session owns it
    ]
    assert first == [True]
    assert write(steps[:3]) == [True] * 3  # steps alone: append_steps
    batch = [
        *steps[3:],
        ("finish", outcome(ending, json.dumps(values[2]))),  # with outcomes: one statement
        ("finish", outcome(foreign, "1")),  # not ours: left as it is
        ("finish", outcome(taken, "1")),  # no such workflow
    ]
    fresh = NewWorkflow(
        workflow_id=new_id(),
        name="batch",
        inputs='{"args": [ "x" ],  "kwargs": {}}',  # as written: json, not jsonb
        executor_id=engine.executor_id,
        app_version="v1",
        max_recovery_attempts=3,
        owner_key=engine.session_key,
        timeout=3600.0,
    )
    start = fresh.insert_params(db.json_in(fresh.inputs, "test"))
    batch += [
        ("start", start),
        ("start", start),  # the same row twice: the first is sent, the second is not
        ("start", {**start, "workflow_id": mine}),  # the id is taken
    ]
    assert write(batch) == [True, True, False, False, True, False, False, True, False, False]
    # alone, each kind of write is its own plain statement, and says the same
    assert write([("finish", outcome(foreign, "1"))]) == [False]
    assert write([("start", {**start, "workflow_id": mine})]) == [False]
    begun = db.workflows.get(fresh.workflow_id)
    assert begun is not None and begun.status is da.WorkflowStatus.PENDING
    assert begun.app_version == "v1" and begun.inputs == json.loads(fresh.inputs)
    # its inputs as written, owned by this session
    call = db.one("find_workflow_call", "test", workflow_id=fresh.workflow_id)
    assert call is not None and call["inputs"] == fresh.inputs
    assert call["owner_key"] == engine.session_key
    log = db.steps.load(mine)
    assert [json.loads(jsonb.from_db(log[i + 1].output) or "") for i in range(4)] == values
    assert log[0].output == "0"  # the first write stands
    assert log[5].status is da.records.StepStatus.ERROR and log[5].output is None
    assert json.loads(log[5].error or "")["message"] == 'bad "x"'
    assert {r.attempts for r in log.values()} == {2}
    assert db.steps.load(foreign) == {}
    ended, other = db.workflows.get(ending), db.workflows.get(foreign)
    assert ended is not None and ended.status is da.WorkflowStatus.SUCCESS
    assert ended.output == values[2]
    assert other is not None and other.status is da.WorkflowStatus.PENDING
    assert db.workflows.get(taken) is None

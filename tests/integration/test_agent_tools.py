"""Tools: schema from type hints, dispatch of tool_use blocks as steps, errors given back to
the model as is_error results, positions fixed by reply order, guarded side effects."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from typing import Annotated, Any

import psycopg
import pytest
from anthropic.types import ToolResultBlockParam, ToolUseBlock
from pydantic import BaseModel, Field

import dbos_agent as da
from dbos_agent import NotDone
from dbos_agent.agent import Tool, ToolRegistry, tool
from tests.helpers import SimulatedCrash, new_id, per_test

RUNS: Counter[str] = per_test(Counter())
CRASH_IN: set[str] = per_test(set())
FILES: dict[str, Path] = per_test({})
#: calls of `slow` sleeping now, and the most at once
IN_SLOW: Counter[str] = per_test(Counter())
_in_slow_lock = threading.Lock()


# --------------------------------------------------------------------------- schema


class Point(BaseModel):
    x: int
    y: int = 0


@tool
def search(
    query: str,
    limit: int = 10,
    tags: list[str] | None = None,
    near: Point | None = None,
    exact: Annotated[bool, Field(description="Match whole words only.")] = False,
) -> list[str]:
    """Search the notes for matching lines.

    Args:
        query: Words to look for.
        limit: At most this many results,
            best first.
    """
    return [query] * min(limit, 1)


def test_schema_is_derived_from_the_signature_and_docstring() -> None:
    param = search.param()
    assert param["name"] == "search"
    assert param["description"] == "Search the notes for matching lines."
    schema: dict[str, Any] = dict(param["input_schema"])
    assert schema["type"] == "object"
    assert schema["required"] == ["query"]
    assert schema["additionalProperties"] is False
    props = schema["properties"]
    assert props["query"] == {"type": "string", "description": "Words to look for."}
    assert props["limit"] == {
        "type": "integer",
        "default": 10,
        "description": "At most this many results, best first.",
    }
    assert props["tags"]["anyOf"][0] == {"type": "array", "items": {"type": "string"}}
    assert props["exact"]["description"] == "Match whole words only."
    assert "$defs" in schema and "Point" in schema["$defs"]
    assert "title" not in schema and "title" not in props["query"]
    # outside a workflow a tool is a plain function call
    assert search("a") == ["a"]


def test_tool_options_and_validation() -> None:
    @tool(name="lookup-v2", description="Custom text.")
    def lookup(key: str, n: int) -> str:
        return key * n

    assert isinstance(lookup, Tool) and lookup.name == "lookup-v2"
    assert lookup.param()["description"] == "Custom text."
    assert lookup.validate({"key": "a", "n": "3"}) == {"key": "a", "n": 3}
    with pytest.raises(Exception, match="n: Field required"):
        lookup.validate({"key": "a"})
    with pytest.raises(Exception, match="Extra inputs are not permitted"):
        lookup.validate({"key": "a", "n": 1, "other": 2})
    with pytest.raises(TypeError):

        @tool
        def varargs(*args: int) -> int:
            return 0

    with pytest.raises(ValueError):
        tool(name="bad name!")(lambda: None)


def test_tool_options_are_said_once_and_the_step_ones_default_as_a_step_does() -> None:
    from dbos_agent.agent import ToolOptions

    assert set(ToolOptions.__optional_keys__) == {
        "name",
        "description",
        "requires_approval",
        "idempotent",
        "guard",
        "retries",
        "interval",
        "backoff",
        "max_interval",
        "jitter",
        "retry_on",
        "retry_if",
        "retry_policy",
        "timeout",
        "give_up_after",
        "waits_for",
    }

    def plain(x: int) -> int:
        return x

    bare, stepped = tool(plain), da.step(name="plain_as_a_step")(plain)
    assert bare._step.__dbos_agent_step__.retry == stepped.__dbos_agent_step__.retry  # type: ignore[attr-defined]
    assert (bare.idempotent, bare.guard, bare.requires_approval) == (True, None, False)

    def guard(x: int) -> object:
        return da.NotDone

    tuned = tool(retries=2, interval=0.5, idempotent=False, guard=guard, requires_approval=True)
    made = tuned(plain)
    definition = made._step.__dbos_agent_step__  # type: ignore[attr-defined]
    assert (definition.retry.retries, definition.retry.interval) == (2, 0.5)
    assert (made.idempotent, made.guard, made.requires_approval) == (False, guard, True)
    with pytest.raises(TypeError, match=r"tool 'plain': unknown options \['retires'\]"):
        tool(retires=3)(plain)  # type: ignore[call-overload]


# --------------------------------------------------------------------------- dispatch


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    RUNS["add"] += 1
    return a + b


@tool
def explode(message: str) -> str:
    """Always fails."""
    RUNS["explode"] += 1
    raise ValueError(message)


@tool
def slow(i: int, delay: float) -> int:
    """Sleep, then return i (counting how many sleep at once)."""
    with _in_slow_lock:
        IN_SLOW["now"] += 1
        IN_SLOW["max"] = max(IN_SLOW["max"], IN_SLOW["now"])
    time.sleep(delay)
    with _in_slow_lock:
        IN_SLOW["now"] -= 1
    RUNS[f"slow{i}"] += 1
    if f"slow{i}" in CRASH_IN:
        CRASH_IN.discard(f"slow{i}")
        raise SimulatedCrash(f"in slow({i})")
    return i


#: Where in_turn looks for the steps that finish before it (the test's database).
TURN_DATABASE: list[str] = per_test([])


@tool
def in_turn(i: int, wid: str) -> int:
    """Return i once the call after it (i + 1, up to 3) has been checkpointed: the calls
    finish in the reverse of their order, however busy the machine."""
    with _in_slow_lock:
        IN_SLOW["now"] += 1
        IN_SLOW["max"] = max(IN_SLOW["max"], IN_SLOW["now"])
    with psycopg.connect(TURN_DATABASE[0], autocommit=True) as conn:
        while (
            i < 3
            and not conn.execute(
                "SELECT 1 FROM dbos_agent.steps WHERE workflow_id = %s AND seq = %s", (wid, i + 1)
            ).fetchone()
        ):
            time.sleep(0.01)
    with _in_slow_lock:
        IN_SLOW["now"] -= 1
    return i


REGISTRY = ToolRegistry([add, explode, slow, in_turn])


def block(name: str, tool_input: Any, n: int) -> ToolUseBlock:
    return ToolUseBlock(type="tool_use", id=f"toolu_{n:02d}", name=name, input=tool_input)


@da.durable_workflow(name="agent_test_dispatch")
def dispatch(blocks: list[ToolUseBlock], parallel: bool) -> list[ToolResultBlockParam]:
    results = REGISTRY.call_all(blocks, parallel=parallel)
    if "after" in CRASH_IN:
        CRASH_IN.discard("after")
        raise SimulatedCrash("after the tools")
    return results


def test_registry_dispatch_turns_every_failure_into_an_is_error_result(
    runtime: da.Runtime,
) -> None:
    blocks = [
        block("add", {"a": 2, "b": 3}, 0),
        block("nope", {"x": 1}, 1),
        block("add", {"a": "two", "b": 3}, 2),
        block("add", {"a": 1}, 3),
        block("explode", {"message": "boom"}, 4),
    ]
    wid = new_id()
    CRASH_IN.add("after")
    with pytest.raises(SimulatedCrash), da.workflow_id(wid):
        dispatch(blocks, False)

    steps = da.operations.list_steps(wid)
    assert [s.name for s in steps] == [
        "tool:add",
        "tool_call_rejected",
        "tool_call_rejected",
        "tool_call_rejected",
        "tool:explode",
    ]
    assert [s.status for s in steps] == ["SUCCESS", "ERROR", "ERROR", "ERROR", "ERROR"]
    assert steps[4].error is not None and steps[4].error["type"] == "builtins.ValueError"
    assert steps[1].error is not None and "unknown tool 'nope'" in steps[1].error["message"]

    with da.workflow_id(wid):
        results = dispatch(blocks, False)  # replayed: the same results, nothing runs again
    assert RUNS == Counter(add=1, explode=1)
    assert results[0] == {"type": "tool_result", "tool_use_id": "toolu_00", "content": "5"}
    assert all(r.get("is_error") for r in results[1:])
    contents = [str(r["content"]) for r in results]
    assert contents[1] == "unknown tool 'nope'; available tools: add, explode, in_turn, slow"
    assert contents[2].startswith("invalid input for tool 'add': a: Input should be a valid int")
    assert contents[3] == "invalid input for tool 'add': b: Field required"
    assert contents[4] == "ValueError: boom"
    assert [r["tool_use_id"] for r in results] == [f"toolu_{n:02d}" for n in range(5)]


def test_parallel_tool_calls_take_positions_in_reply_order(
    runtime: da.Runtime, dbos_agent_database_url: str
) -> None:
    # each call waits for the next one's checkpoint: completion order is the reverse of
    # reply order
    TURN_DATABASE.append(dbos_agent_database_url)
    wid = new_id()
    blocks = [block("in_turn", {"i": i, "wid": wid}, i) for i in range(4)]
    with da.workflow_id(wid):
        results = dispatch(blocks, True)
    assert IN_SLOW["max"] > 1  # they did overlap
    assert [r["content"] for r in results] == ["0", "1", "2", "3"]
    steps = da.operations.list_steps(wid)
    assert [(s.seq, s.output) for s in steps] == [(0, 0), (1, 1), (2, 2), (3, 3)]
    finish_order = sorted((s.finished_at, s.seq) for s in steps if s.finished_at is not None)
    assert [seq for _, seq in finish_order] == [3, 2, 1, 0]


def test_crash_during_parallel_calls_replays_the_finished_ones_at_their_positions(
    runtime: da.Runtime,
) -> None:
    blocks = [block("slow", {"i": i, "delay": 0.05 * (3 - i)}, i) for i in range(4)]
    wid = new_id()
    CRASH_IN.add("slow1")  # dies before its checkpoint; 0, 2 and 3 are recorded
    with pytest.raises(SimulatedCrash), da.workflow_id(wid):
        dispatch(blocks, True)
    assert [s.seq for s in da.operations.list_steps(wid)] == [0, 2, 3]
    with da.workflow_id(wid):
        results = dispatch(blocks, True)
    assert [r["content"] for r in results] == ["0", "1", "2", "3"]
    assert RUNS == Counter(slow0=1, slow1=2, slow2=1, slow3=1)
    assert [s.name for s in da.operations.list_steps(wid)] == ["tool:slow"] * 4


# --------------------------------------------------------------------------- side effects


GUARD_CALLS: Counter[str] = Counter()


def line_already_there(path: str, line: str) -> object:
    """Check-then-act: did the append happen before the crash?"""
    GUARD_CALLS[path] += 1
    if line in Path(path).read_text().splitlines():
        return f"appended to {Path(path).name}"
    return NotDone


@tool(idempotent=False, guard=line_already_there)
def append_line(path: str, line: str) -> str:
    """Append one line to a file (not idempotent)."""
    with open(path, "a") as fh:
        fh.write(line + "\n")
    if "append" in CRASH_IN:
        CRASH_IN.discard("append")
        raise SimulatedCrash("after the append, before its checkpoint")
    return f"appended to {Path(path).name}"


@tool(idempotent=False)
def send_email(to: str) -> str:
    """Not idempotent and no way to check: a crash leaves it in doubt."""
    RUNS["send_email"] += 1
    if "send" in CRASH_IN:
        CRASH_IN.discard("send")
        raise SimulatedCrash("mid-send")
    return f"sent to {to}"


SIDE_EFFECTS = ToolRegistry([append_line, send_email])


@da.durable_workflow(name="agent_test_side_effects")
def side_effects(blocks: list[ToolUseBlock]) -> list[ToolResultBlockParam]:
    return SIDE_EFFECTS.call_all(blocks)


def test_guarded_tool_cut_off_after_its_effect_does_not_repeat_it(
    runtime: da.Runtime, tmp_path: Path
) -> None:
    target = tmp_path / "CHANGELOG.md"
    target.write_text("# Changelog\n")
    blocks = [block("append_line", {"path": str(target), "line": "- fixed it"}, 0)]
    wid = new_id()
    CRASH_IN.add("append")
    with pytest.raises(SimulatedCrash), da.workflow_id(wid):
        side_effects(blocks)
    with da.workflow_id(wid):
        (result,) = side_effects(blocks)
    assert result == {
        "type": "tool_result",
        "tool_use_id": "toolu_00",
        "content": "appended to CHANGELOG.md",
    }
    assert target.read_text() == "# Changelog\n- fixed it\n"
    # with engine intents the guard runs only for the in-doubt step; without, before each run
    assert GUARD_CALLS[str(target)] == 1


def test_unguarded_non_idempotent_tool_in_doubt_stops_the_workflow(runtime: da.Runtime) -> None:
    blocks = [block("send_email", {"to": "ops@example.com"}, 0)]
    wid = new_id()
    CRASH_IN.add("send")
    with pytest.raises(SimulatedCrash), da.workflow_id(wid):
        side_effects(blocks)
    # not an is_error result for the model: the engine's in-doubt signal propagates
    with pytest.raises(da.errors.StepInDoubtError), da.workflow_id(wid):
        side_effects(blocks)
    assert RUNS["send_email"] == 1
    assert da.retrieve(wid).status() == "IN_DOUBT"


def test_parallel_calls_outside_a_workflow_are_plain_calls() -> None:
    seen: list[str] = []
    lock = threading.Lock()

    @tool
    def note(i: int) -> int:
        with lock:
            seen.append(f"note{i}")
        return i

    registry = ToolRegistry([note])
    results = registry.call_all([block("note", {"i": i}, i) for i in range(3)], parallel=True)
    assert [r["content"] for r in results] == ["0", "1", "2"]
    assert sorted(seen) == ["note0", "note1", "note2"]

#!/usr/bin/env python3
"""Pydantic AI benchmark: what ``Durability`` costs per agent turn, and how fast a resume is.

Every figure uses the local scripted Messages API server (real HTTP on 127.0.0.1, the
script of ``bench_agent.py``: one turn = one model request + 3 tool calls) and Pydantic
AI's own ``AnthropicModel``, on the Postgres given by ``--dsn``:

  overhead  The same ``pydantic_ai.Agent`` (two function tools) runs ``--turns``-turn
            conversations, alternating: plain (an agent without the capability, outside
            any workflow) and durable (with ``Durability()``, inside a
            ``@da.durable_workflow``: each model request and tool call a step), ``--repeat``
            times after two warm-up rounds; per turn = median / (turns + 1) requests, and the
            overhead per turn = durable - plain. Beside it, in the same process and sitting,
            ``bench_agent.py``'s figure for the hand-written agent layer (``Model`` and
            ``@tool`` in a sync workflow, the same script): target, Pydantic AI's overhead per
            turn within 1 ms of the hand-written layer's.
  replay    A ``--replay-turns``-turn durable run (801 steps for 200 turns) is killed
            (SIGKILL) in a child process once its last reply is recorded; a fresh child
            launches and calls the workflow under the same id, which replays every step
            and returns: timed from the call to its return (target < 200 ms), with the
            replay phase (``track_replay``) and ``launch()`` apart. Also warm: the same in
            the process that ran it (a ``BaseException`` stands in for the kill), beside
            the floor: Pydantic AI running the same turns without HTTP or durability (a
            ``FunctionModel`` replying from the script in the process), since a replay
            runs Pydantic AI's whole agent graph again, each recorded call answered
            from the log.
  raw       One psycopg connection, ``--raw-n`` x BEGIN/INSERT/COMMIT of one row (as
            ``bench_engine.py``'s ``raw``): the p50 the figures are put against.

    python bench/bench_pydantic_ai.py --dsn postgresql://postgres@127.0.0.1:55433/postgres

Prints one JSON line per scenario, then a markdown table. Uses its own database
``dbos_agent_bench_pydantic_ai`` on that server (dropped and recreated). ``--profile DIR``
writes cProfile files of the durable overhead runs and of the cold replay child.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import bench_agent  # the hand-written layer's figure, and its script
import psycopg
from anthropic import AsyncAnthropic
from anthropic.types import MessageParam
from pydantic_ai import Agent, FunctionToolset
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    UserPromptPart,
)
from pydantic_ai.models.anthropic import AnthropicModel
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.providers.anthropic import AnthropicProvider
from pydantic_ai.usage import UsageLimits

import dbos_agent as da
from dbos_agent.agent import Model, ToolRegistry, replay_report, tool, track_replay
from dbos_agent.agent.replay import last_replay_report
from dbos_agent.agent.scripted_server import ScriptedServer, ScriptItem
from dbos_agent.integrations.pydantic_ai import Durability

BENCH_DB = "dbos_agent_bench_pydantic_ai"
MODEL_NAME = "claude-sonnet-4-6"
PAYLOAD = json.dumps({"output": "x" * 64, "n": 1})  # bench_engine.py's raw row


# --------------------------------------------------------------------------- the agents


def script(body: dict[str, Any]) -> ScriptItem:
    """``bench_agent.script``, given the first message as text (Pydantic AI sends blocks)."""
    first, *rest = body["messages"]
    content = first["content"]
    if isinstance(content, list):
        content = "".join(str(block.get("text", "")) for block in content)
    return bench_agent.script({**body, "messages": [{"role": "user", "content": content}, *rest]})


tools = FunctionToolset(id="bench")


@tools.tool_plain
def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key}"


@tools.tool_plain
def count(word: str, times: int) -> int:
    """Count letters."""
    return len(word) * times


NO_LIMIT = UsageLimits(request_limit=None)  # a 200-turn run makes 201 requests
AGENTS: dict[str, Agent[None, str]] = {}
STATE: dict[str, Callable[[], None]] = {}


def use_model(url: str) -> None:
    """The plain and the durable agent, on the scripted server at ``url``."""
    client = AsyncAnthropic(base_url=url, api_key="scripted", max_retries=0)
    model = AnthropicModel(MODEL_NAME, provider=AnthropicProvider(anthropic_client=client))
    settings: Any = {"max_tokens": 256}
    AGENTS["plain"] = Agent(model, name="bench", toolsets=[tools], model_settings=settings)
    AGENTS["durable"] = Agent(
        model,
        name="bench",
        toolsets=[tools],
        model_settings=settings,
        capabilities=[Durability()],
    )


def scripted_in_process(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """The script's replies made in the process, without HTTP: what Pydantic AI's own
    work on a run costs, the floor of any replay that lets Pydantic AI drive it."""
    turn = sum(1 for m in messages if isinstance(m, ModelResponse))
    first = next(p for p in messages[0].parts if isinstance(p, UserPromptPart))
    if turn >= int(str(first.content).split("=")[1]):
        return ModelResponse(parts=[TextPart("All done.")])
    return ModelResponse(
        parts=[
            TextPart(f"Turn {turn}: looking at three things."),
            ToolCallPart("lookup", {"key": f"a{turn}"}),
            ToolCallPart("lookup", {"key": f"b{turn}"}),
            ToolCallPart("count", {"word": f"c{turn}", "times": 3}),
        ]
    )


floor_agent = Agent(FunctionModel(scripted_in_process), name="floor", toolsets=[tools])


async def pydantic_ai_floor(turns: int) -> float:
    """ms of a plain run of ``turns`` turns on the in-process model."""
    started = time.perf_counter()
    await floor_agent.run(prompt(turns), usage_limits=NO_LIMIT)
    return (time.perf_counter() - started) * 1000


def prompt(turns: int) -> str:
    return f"turns={turns}"


@da.durable_workflow(name="bench_pydantic_ai")
async def durable_run(turns: int) -> str:
    track_replay()
    result = await AGENTS["durable"].run(prompt(turns), usage_limits=NO_LIMIT)
    kill = STATE.pop("kill_at_end", None)
    if kill is not None:  # the last reply is recorded: die before the outcome is
        kill()
    replay_report()  # closes the replay phase of a run that only replayed
    return result.output


@tool(name="lookup")
async def lookup_async(key: str) -> str:
    """Look a key up."""
    return f"value of {key}"


@tool(name="count")
async def count_async(word: str, times: int) -> int:
    """Count letters."""
    return len(word) * times


ASYNC_TOOLS = ToolRegistry([lookup_async, count_async])


async def hand_written_loop(turns: int) -> str:
    """``bench_agent.agent_loop`` on the event loop: the hand-written layer's async path
    (``create_async``, async tools called as tasks), the engine path Pydantic AI takes."""
    model: Model = bench_agent.STATE["model"]
    messages: list[MessageParam] = [{"role": "user", "content": prompt(turns)}]
    while True:
        reply = await model.create_async(messages)
        messages.append(reply.to_param())
        if reply.stop_reason != "tool_use":
            return "".join(b.text for b in reply.content if b.type == "text")
        messages.append(
            {"role": "user", "content": await ASYNC_TOOLS.call_all_async(reply.content)}
        )


@da.durable_workflow(name="bench_agent_async")
async def hand_written_async(turns: int) -> str:
    return await hand_written_loop(turns)


# --------------------------------------------------------------------------- scenarios


@contextmanager
def profiled(path: Path | None) -> Iterator[None]:
    profile = cProfile.Profile() if path is not None else None
    if profile is not None:
        profile.enable()
    try:
        yield
    finally:
        if profile is not None and path is not None:
            profile.disable()
            profile.dump_stats(path)


Run = Callable[[int], Awaitable[object]]


async def overhead(
    name: str, plain_run: Run, durable_run: Run, turns: int, repeat: int, profile: Path | None
) -> dict[str, Any]:
    """Alternating plain and durable conversations of ``turns`` turns; per turn medians."""
    plain: list[float] = []
    durable: list[float] = []
    for i in range(repeat + 2):  # two warm-up rounds
        started = time.perf_counter()
        await plain_run(turns)
        p = (time.perf_counter() - started) / (turns + 1)
        with profiled(profile if i == repeat + 1 else None):
            started = time.perf_counter()
            with da.workflow_id(f"ovh-{uuid.uuid4().hex[:10]}"):
                await durable_run(turns)
            d = (time.perf_counter() - started) / (turns + 1)
        if i >= 2:
            plain.append(p * 1000)
            durable.append(d * 1000)
    p50, d50 = statistics.median(plain), statistics.median(durable)
    return {
        "scenario": name,
        "turns": turns,
        "repeat": repeat,
        "plain_ms_per_turn": round(p50, 3),
        "durable_ms_per_turn": round(d50, 3),
        "overhead_ms_per_turn": round(d50 - p50, 3),
        "steps_per_turn": 4,
    }


async def plain_pydantic_ai(turns: int) -> str:
    return (await AGENTS["plain"].run(prompt(turns), usage_limits=NO_LIMIT)).output


async def replay_call(wid: str, turns: int) -> dict[str, float]:
    """Call the workflow under ``wid`` (every step recorded): the time until it returns."""
    started = time.perf_counter()
    with da.workflow_id(wid):
        await durable_run(turns)
    total = time.perf_counter() - started
    report = last_replay_report(wid)
    assert report is not None and report.model_calls_replayed == turns + 1, report
    return {
        "call_ms": total * 1000,
        "replay_phase_ms": report.elapsed_s * 1000,
        "steps": report.steps_replayed,
    }


async def replay_warm(turns: int) -> dict[str, float]:
    wid = f"replay-warm-{turns}-{uuid.uuid4().hex[:10]}"
    STATE["kill_at_end"] = bench_agent.raise_killed
    try:
        with da.workflow_id(wid):
            await durable_run(turns)
    except bench_agent.Killed:
        pass
    return await replay_call(wid, turns)


def replay(
    warm: list[dict[str, float]], cold: list[dict[str, float]], turns: int
) -> dict[str, Any]:
    def med(rows: list[dict[str, float]], key: str) -> float:
        return round(statistics.median(r[key] for r in rows), 2)

    calls = [r["call_ms"] for r in cold]
    return {
        "scenario": "replay_pydantic_ai",
        "turns": turns,
        "steps": int(warm[0]["steps"]),
        "repeat": len(cold),
        "warm_call_ms": med(warm, "call_ms"),
        "warm_replay_phase_ms": med(warm, "replay_phase_ms"),
        "pydantic_ai_floor_ms": med(warm, "floor_ms"),
        "cold_call_ms": med(cold, "call_ms"),
        "cold_call_range": [round(min(calls), 2), round(max(calls), 2)],
        "cold_replay_phase_ms": med(cold, "replay_phase_ms"),
        "cold_launch_ms": med(cold, "launch_ms"),
    }


async def in_one_loop(
    args: argparse.Namespace,
) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, float]]]:
    """The scenarios of this process that run on an event loop, on one (the model
    clients' connections belong to the loop that opened them)."""
    profile = args.profile / "overhead_durable.prof" if args.profile else None
    pai = await overhead(
        "overhead_pydantic_ai", plain_pydantic_ai, durable_run, args.turns, args.repeat, profile
    )
    hand = await overhead(
        "overhead_agent_layer_async",
        hand_written_loop,
        hand_written_async,
        args.turns,
        args.repeat,
        None,
    )
    warm = [await replay_warm(args.replay_turns) for _ in range(args.replay_repeat)]
    for row in warm:
        row["floor_ms"] = await pydantic_ai_floor(args.replay_turns)
    return pai, hand, warm


def raw(dsn: str, n: int) -> dict[str, Any]:
    """BEGIN/INSERT/COMMIT of one row, ``n`` times on one connection (bench_engine's raw)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS bench_ins (id bigserial PRIMARY KEY, k text, v text)"
        )
    latencies = []
    with psycopg.connect(dsn, autocommit=False, prepare_threshold=0) as conn:
        for _ in range(n):
            started = time.perf_counter()
            conn.execute(
                "INSERT INTO bench_ins (k, v) VALUES (%s, %s)", (uuid.uuid4().hex, PAYLOAD)
            )
            conn.commit()
            latencies.append(time.perf_counter() - started)
    return {
        "scenario": "raw_insert_commit",
        "n": n,
        "p50_ms": round(statistics.median(latencies) * 1000, 3),
    }


# --------------------------------------------------------------------------- plumbing


def child(args: argparse.Namespace) -> None:
    """``--role crash``: run the conversation, die once its last reply is recorded;
    ``--role resume``: launch, call it again, print what that took as JSON."""
    use_model(args.url)
    started = time.perf_counter()
    runtime = da.launch(
        args.dsn, executor_id=f"bench-{uuid.uuid4().hex[:8]}", recover=False, take_over=False
    )
    launched = time.perf_counter() - started
    try:
        if args.role == "crash":
            STATE["kill_at_end"] = bench_agent.sigkill_self
            with da.workflow_id(args.workflow_id):
                asyncio.run(durable_run(args.replay_turns))
        else:
            profile = args.profile / "replay_cold.prof" if args.profile else None
            with profiled(profile):
                row = asyncio.run(replay_call(args.workflow_id, args.replay_turns))
            print(json.dumps({**row, "launch_ms": launched * 1000}))
    finally:
        runtime.shutdown()


def table(rows: dict[str, dict[str, Any]]) -> str:
    ovh, hand = rows["overhead_pydantic_ai"], rows["overhead_agent_layer"]
    hand_async = rows["overhead_agent_layer_async"]
    rep, raw_p50 = rows["replay_pydantic_ai"], rows["raw_insert_commit"]["p50_ms"]
    gap = ovh["overhead_ms_per_turn"] - hand["overhead_ms_per_turn"]
    lines = [
        "| scenario | figure | x raw | target |",
        "|---|---|---|---|",
        f"| raw INSERT+COMMIT, one connection: p50 ms | {raw_p50:.3f} | 1.00 | |",
        f"| Pydantic AI turn (model + 3 tools): plain / durable ms | "
        f"{ovh['plain_ms_per_turn']:.2f} / {ovh['durable_ms_per_turn']:.2f} | | |",
        f"| ... overhead per turn, ms | {ovh['overhead_ms_per_turn']:.2f} | "
        f"{ovh['overhead_ms_per_turn'] / raw_p50:.1f} | |",
        f"| hand-written agent layer (bench_agent, sync): overhead per turn, ms | "
        f"{hand['overhead_ms_per_turn']:.2f} | {hand['overhead_ms_per_turn'] / raw_p50:.1f} | |",
        f"| hand-written agent layer, async (create_async, async tools): plain / durable ms | "
        f"{hand_async['plain_ms_per_turn']:.2f} / {hand_async['durable_ms_per_turn']:.2f} | | |",
        f"| ... overhead per turn, ms | {hand_async['overhead_ms_per_turn']:.2f} | "
        f"{hand_async['overhead_ms_per_turn'] / raw_p50:.1f} | |",
        f"| Pydantic AI - hand-written async, per turn, ms | "
        f"{ovh['overhead_ms_per_turn'] - hand_async['overhead_ms_per_turn']:+.2f} | | |",
        f"| Pydantic AI - hand-written (sync), per turn, ms | {gap:+.2f} | | within 1 ms |",
        f"| replay of {rep['turns']} turns ({rep['steps']} steps), fresh process: call ms | "
        f"{rep['cold_call_ms']:.1f} | {rep['cold_call_ms'] / raw_p50:.0f} | < 200 ms |",
        f"| ... its replay phase ms / launch() ms | {rep['cold_replay_phase_ms']:.1f} / "
        f"{rep['cold_launch_ms']:.1f} | | |",
        f"| the same, warm process: call ms | {rep['warm_call_ms']:.1f} | "
        f"{rep['warm_call_ms'] / raw_p50:.0f} | |",
        f"| Pydantic AI alone: a plain run of those turns, in-process model, ms | "
        f"{rep['pydantic_ai_floor_ms']:.1f} | | |",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--dsn", required=True, help="a Postgres server (a database is made)")
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--replay-turns", type=int, default=200)
    parser.add_argument("--replay-repeat", type=int, default=3)
    parser.add_argument("--raw-n", type=int, default=2000)
    parser.add_argument("--profile", type=Path, help="write cProfile files in this folder")
    parser.add_argument("--role", default="parent", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--workflow-id", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role != "parent":
        child(args)
        return
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)

    dsn = bench_agent.fresh_database(args.dsn, BENCH_DB)
    rows: dict[str, dict[str, Any]] = {}
    with ScriptedServer(script) as server:
        use_model(server.url)
        bench_agent.use_model(server.url)
        runtime = da.launch(dsn, executor_id="bench-pydantic-ai", recover=False, take_over=False)
        try:
            rows["raw_insert_commit"] = raw(dsn, args.raw_n)
            hand = bench_agent.overhead(args.turns, args.repeat)
            rows["overhead_agent_layer"] = {**hand, "scenario": "overhead_agent_layer"}
            pai, hand_async, warm = asyncio.run(in_one_loop(args))
            rows["overhead_agent_layer_async"] = hand_async
            rows["overhead_pydantic_ai"] = pai
            profile = ("--profile", str(args.profile)) if args.profile else ()
            cold = [
                bench_agent.crash_and_resume(__file__, dsn, server.url, args.replay_turns, profile)
                for _ in range(args.replay_repeat)
            ]
            rows["replay_pydantic_ai"] = replay(warm, cold, args.replay_turns)
        finally:
            runtime.shutdown()
    for row in rows.values():
        print(json.dumps(row))
    print()
    print(table(rows))


if __name__ == "__main__":
    main()

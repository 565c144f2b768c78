#!/usr/bin/env python3
"""Agent benchmark: what the durable layer costs per agent turn, and how fast a resume is.

Both figures use the local scripted Messages API server (real HTTP on 127.0.0.1) and the
official ``anthropic`` client, on the Postgres given by ``--dsn``:

  overhead  One agent turn = one model call + 3 tool calls. The same loop runs as a
            ``@durable_workflow`` (model and tool calls checkpointed) and as plain Python
            (the same ``Model``/``@tool`` objects outside a workflow are plain calls),
            alternating, ``--repeat`` conversations of ``--turns`` turns each; the figure is
            median(durable per turn) - median(plain per turn).
  replay    A ``--replay-turns``-turn conversation (model + 3 tools per turn) runs live and
            is "killed" after its final reply is recorded; re-calling it under the same id
            replays every step. Timed warm (same process) and cold (a fresh child process:
            first use of the validators included), from the call to its return: loading
            the log, replaying, rebuilding the messages, and recording the result.

  storage   A ``--storage-turns``-turn conversation (500: LangGraph's default checkpointer
            is reported at 219 MB for that many) with realistic sizes: ~1 kB of model text
            and ~2 kB per tool result, 3 tools a turn. Reports the bytes the workflow's rows
            take (``pg_column_size`` of every row of steps and workflows), the growth of the
            tables with their indexes and TOAST, and bytes per turn: the log grows with each
            turn's new data only, never with the conversation so far.

Targets: added overhead per turn < 5 ms; replay of 200 turns < 200 ms.

    python bench/bench_agent.py --dsn postgresql://postgres@127.0.0.1:5432/postgres

Uses its own database ``dbos_agent_bench_agent`` on that server (dropped and recreated).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from typing import Any

import anthropic
import psycopg
from anthropic.types import MessageParam
from psycopg import sql

import dbos_agent as da
from dbos_agent._storage.dsn import with_dbname
from dbos_agent.agent import Model, ToolRegistry, replay_report, tool, track_replay
from dbos_agent.agent.replay import last_replay_report
from dbos_agent.agent.scripted_server import Reply, ScriptedServer, ScriptItem, text, tool_use

BENCH_DB = "dbos_agent_bench_agent"


class Killed(BaseException):
    """Stops a workflow the way a dying process would: no outcome recorded."""


# --------------------------------------------------------------------------- the agent


FILLER = "The quick brown fox jumps over the lazy dog; " * 20  # ~900 bytes of prose


def script(body: dict[str, Any]) -> ScriptItem:
    """Three tool calls per turn until the turn count in the first message, then an answer.

    A first message ``turns=N fat`` asks for realistic sizes (the storage scenario)."""
    messages = body["messages"]
    first = str(messages[0]["content"])
    turns = int(first.split("=")[1].split()[0])
    turn = sum(1 for m in messages if m["role"] == "assistant")
    if turn >= turns:
        return Reply([text("All done.")], usage=(100, 5))
    prose = f" {FILLER}" if first.endswith("fat") else ""
    return Reply(
        [
            text(f"Turn {turn}: looking at three things.{prose}"),
            tool_use("lookup", {"key": f"a{turn}"}),
            tool_use("lookup", {"key": f"b{turn}"}),
            tool_use("count", {"word": f"c{turn}", "times": 3}),
        ],
        usage=(100, 20),
    )


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key}" + (FILLER * 2 if STATE.get("fat") else "")


@tool
def count(word: str, times: int) -> int:
    """Count letters."""
    return len(word) * times


TOOLS = ToolRegistry([lookup, count])
STATE: dict[str, Any] = {}


def agent_loop(turns: int) -> str:
    model: Model = STATE["model"]
    fat = " fat" if STATE.get("fat") else ""
    messages: list[MessageParam] = [{"role": "user", "content": f"turns={turns}{fat}"}]
    while True:
        reply = model.create(messages)
        messages.append(reply.to_param())
        if reply.stop_reason != "tool_use":
            kill = STATE.pop("kill_at_end", None)
            if kill is not None:
                kill()
            return "".join(b.text for b in reply.content if b.type == "text")
        messages.append({"role": "user", "content": TOOLS.call_all(reply.content)})


@da.durable_workflow(name="bench_agent")
def durable_agent(turns: int) -> str:
    track_replay()
    answer = agent_loop(turns)
    replay_report()  # closes the replay phase of a run that only replayed
    return answer


# --------------------------------------------------------------------------- scenarios


def overhead(turns: int, repeat: int) -> dict[str, Any]:
    plain: list[float] = []
    durable: list[float] = []
    for i in range(repeat + 2):  # two warm-up rounds
        started = time.perf_counter()
        agent_loop(turns)
        p = (time.perf_counter() - started) / (turns + 1)
        started = time.perf_counter()
        with da.workflow_id(f"ovh-{uuid.uuid4().hex[:10]}"):
            durable_agent(turns)
        d = (time.perf_counter() - started) / (turns + 1)
        if i >= 2:
            plain.append(p * 1000)
            durable.append(d * 1000)
    p50, d50 = statistics.median(plain), statistics.median(durable)
    return {
        "scenario": "overhead",
        "turns": turns,
        "repeat": repeat,
        "plain_ms_per_turn": round(p50, 3),
        "durable_ms_per_turn": round(d50, 3),
        "overhead_ms_per_turn": round(d50 - p50, 3),
        "steps_per_turn": 4,
    }


def raise_killed() -> None:
    raise Killed()


def sigkill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def crashed_conversation(turns: int) -> str:
    wid = f"replay-{turns}-{uuid.uuid4().hex[:10]}"
    STATE["kill_at_end"] = raise_killed
    try:
        with da.workflow_id(wid):
            durable_agent(turns)
    except Killed:
        pass
    return wid


def replay_warm(wid: str, turns: int) -> dict[str, float]:
    started = time.perf_counter()
    with da.workflow_id(wid):
        durable_agent(turns)
    total = time.perf_counter() - started
    report = last_replay_report(wid)
    assert report is not None and report.model_calls_replayed == turns + 1
    return {
        "call_ms": total * 1000,
        "replay_phase_ms": report.elapsed_s * 1000,
        "steps": report.steps_replayed,
    }


def crash_and_resume(
    script: str, dsn: str, url: str, turns: int, resume_flags: tuple[str, ...] = ()
) -> dict[str, float]:
    """Cold replay: a child of ``script`` (``--role crash``) runs a ``turns``-turn
    conversation and is kill -9'd once its last reply is recorded; a fresh child (``--role
    resume``) calls it again under the same id and prints what that took, as JSON."""
    wid = f"replay-{turns}-{uuid.uuid4().hex[:10]}"
    child = [sys.executable, script, "--dsn", dsn, "--url", url, "--workflow-id", wid]
    child += ["--replay-turns", str(turns)]
    crashed = subprocess.run([*child, "--role", "crash"], capture_output=True, text=True)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    resumed = [*child, "--role", "resume", *resume_flags]
    out = subprocess.run(resumed, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    row: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return row


def replay(dsn: str, url: str, turns: int, repeat: int) -> dict[str, Any]:
    warm: list[dict[str, float]] = []
    cold: list[dict[str, float]] = []
    for _ in range(repeat):
        warm.append(replay_warm(crashed_conversation(turns), turns))
        cold.append(crash_and_resume(__file__, dsn, url, turns))

    def med(rows: list[dict[str, float]], key: str) -> float:
        return round(statistics.median(r[key] for r in rows), 2)

    return {
        "scenario": "replay",
        "turns": turns,
        "steps": int(warm[0]["steps"]),
        "repeat": repeat,
        "warm_call_ms": med(warm, "call_ms"),
        "warm_replay_phase_ms": med(warm, "replay_phase_ms"),
        "cold_call_ms": med(cold, "call_ms"),
        "cold_replay_phase_ms": med(cold, "replay_phase_ms"),
    }


# --------------------------------------------------------------------------- plumbing


def storage(dsn: str, turns: int) -> dict[str, Any]:
    """The bytes one long conversation takes in the database."""
    tables = ("dbos_agent.steps", "dbos_agent.workflows")
    size_sql = " + ".join(f"pg_total_relation_size('{t}')" for t in tables)

    def total() -> int:
        with psycopg.connect(dsn) as conn:
            conn.execute("CHECKPOINT")
            row = conn.execute(f"SELECT {size_sql}").fetchone()  # type: ignore[arg-type]
        return int(row[0]) if row else 0

    before = total()
    wid = f"storage-{uuid.uuid4().hex[:8]}"
    STATE["fat"] = True
    try:
        started = time.perf_counter()
        with da.workflow_id(wid):
            durable_agent(turns)
        seconds = time.perf_counter() - started
    finally:
        STATE.pop("fat", None)
    after = total()
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*), sum(pg_column_size(s.*)), sum(octet_length(s.output::text))"
            " FROM dbos_agent.steps AS s WHERE workflow_id = %s",
            (wid,),
        ).fetchone()
        wf = conn.execute(
            "SELECT pg_column_size(w.*) FROM dbos_agent.workflows AS w WHERE workflow_id = %s",
            (wid,),
        ).fetchone()
    assert row is not None and wf is not None
    steps, row_bytes, json_bytes = int(row[0]), int(row[1]) + int(wf[0]), int(row[2])
    return {
        "scenario": "storage",
        "turns": turns,
        "steps": steps,
        "row_bytes": row_bytes,
        "json_text_bytes": json_bytes,
        "table_growth_bytes": after - before,
        "row_bytes_per_turn": round(row_bytes / turns),
        "seconds": round(seconds, 2),
    }


def fresh_database(dsn: str, name: str = BENCH_DB) -> str:
    """The DSN of database ``name`` on ``dsn``'s server, dropped and made again."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return with_dbname(dsn, name)


def use_model(url: str) -> None:
    client = anthropic.Anthropic(base_url=url, api_key="scripted")
    STATE["model"] = Model(client, model="claude-sonnet-4-5", max_tokens=256)


def child(args: argparse.Namespace) -> None:
    use_model(args.url)
    runtime = da.launch(
        args.dsn, executor_id=f"bench-{uuid.uuid4().hex[:8]}", recover=False, take_over=False
    )
    try:
        if args.role == "crash":
            STATE["kill_at_end"] = sigkill_self
            with da.workflow_id(args.workflow_id):
                durable_agent(args.replay_turns)
        else:
            print(json.dumps(replay_warm(args.workflow_id, args.replay_turns)))
    finally:
        runtime.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", required=True, help="a Postgres server (a database is made)")
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--replay-turns", type=int, default=200)
    parser.add_argument("--replay-repeat", type=int, default=3)
    parser.add_argument("--storage-turns", type=int, default=500)
    parser.add_argument("--role", default="parent", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--workflow-id", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role != "parent":
        child(args)
        return

    dsn = fresh_database(args.dsn)
    with ScriptedServer(script) as server:
        use_model(server.url)
        runtime = da.launch(dsn, executor_id="bench-agent", recover=False, take_over=False)
        try:
            rows = [
                overhead(args.turns, args.repeat),
                replay(dsn, server.url, args.replay_turns, args.replay_repeat),
                storage(dsn, args.storage_turns),
            ]
        finally:
            runtime.shutdown()
    for row in rows:
        print(json.dumps(row))
    ovh, rep, sto = rows
    print()
    print(
        f"per turn (model + 3 tools): plain {ovh['plain_ms_per_turn']:.2f} ms, durable "
        f"{ovh['durable_ms_per_turn']:.2f} ms -> overhead {ovh['overhead_ms_per_turn']:.2f} ms "
        f"(target < 5 ms)"
    )
    print(
        f"replay of {rep['turns']} turns ({rep['steps']} steps): warm "
        f"{rep['warm_call_ms']:.1f} ms (replay phase {rep['warm_replay_phase_ms']:.1f} ms), "
        f"cold process {rep['cold_call_ms']:.1f} ms (replay phase "
        f"{rep['cold_replay_phase_ms']:.1f} ms) (target < 200 ms)"
    )
    print(
        f"storage of a {sto['turns']}-turn conversation ({sto['steps']} steps): "
        f"{sto['row_bytes'] / 1e6:.2f} MB of rows ({sto['row_bytes_per_turn']} B per turn), "
        f"tables grew {sto['table_growth_bytes'] / 1e6:.2f} MB with indexes and TOAST"
    )


if __name__ == "__main__":
    main()

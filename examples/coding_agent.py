#!/usr/bin/env python3
"""A coding agent that survives kill -9.

The agent loop below is plain Python: ask the model, run the tools it asks for, append
the results, loop until it stops asking. Two decorators make it durable: the loop is a
``@durable_workflow`` and every model call and tool call is a step whose result is
committed to Postgres before the loop moves on. Kill the process anywhere and run the same
command again: the recorded steps are replayed from the database (no token paid twice, no
side effect repeated) and the agent carries on from where it died.

    python examples/coding_agent.py --crash-after-turn 2   # killed (SIGKILL) after turn 2
    python examples/coding_agent.py                        # continues: replays 0-2, finishes

With ``ANTHROPIC_API_KEY`` set it uses Claude; without it, an offline scripted model (a
local fake Messages API server shipped with dbos_agent) plays a short fix-the-bug session.
The database is ``$DBOS_AGENT_DATABASE_URL``, or an embedded Postgres under ./.dbos_agent/.

The tools, and what a crash in the middle of each one means:

* ``read_file``: pure. Running it again is harmless.
* ``write_file``: naturally idempotent. The same bytes make the same file.
* ``run_bash``: not idempotent (``echo ... >> CHANGELOG.md`` twice is two lines). Its step
  records an intent before the command runs; if a crash leaves the intent without a
  result, the guard ``already_appended`` looks at the file before anything runs again.

With ``--require-approval`` the agent stops before a command that changes files through the
shell and waits (for hours if need be, across restarts) for a human: approve or reject
exactly those commands from another terminal, with the command the agent prints (or from
the dashboard of ``dbos-agent serve``)::

    dbos-agent approvals coding-task-demo                       # step and digest
    dbos-agent approve coding-task-demo 7 --digest 3f0c...
    dbos-agent reject coding-task-demo 7 --digest 3f0c... --reason "not now"
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from contextvars import ContextVar
from pathlib import Path

import anthropic
from anthropic.types import Message, MessageParam, ToolResultBlockParam

import dbos_agent as da
from dbos_agent import NotDone
from dbos_agent.agent import (
    DEFAULT_MODEL,
    Model,
    ReplayReport,
    ToolRegistry,
    configure,
    replay_report,
    tool,
    track_replay,
)
from dbos_agent.agent.replay import next_step_replays, note_step, replaying
from dbos_agent.agent.scripted_server import (
    CrashPlan,
    GuardAnswers,
    ScriptedServer,
    appended_already,
    coding_task_prompt,
    coding_task_script,
    demo_arguments,
    demo_project,
    run_demo,
)

# The project the tools work on: the workflow's ``workdir`` input, set for each run.
_WORKDIR: ContextVar[Path | None] = ContextVar("coding_agent_workdir", default=None)


def workdir() -> Path:
    """The current run's work directory (the process's cwd outside a run)."""
    return _WORKDIR.get() or Path.cwd()


CRASH = CrashPlan()
GUARDED = GuardAnswers()  # what the guard answered, for the demo to say so


# --------------------------------------------------------------------------- tools


def resolve(path: str) -> Path:
    """Paths are relative to the work directory."""
    return (workdir() / path).resolve()


@tool
def read_file(path: str) -> str:
    """Read a text file and return its contents.

    Args:
        path: File path, relative to the work directory or absolute.
    """
    return resolve(path).read_text(encoding="utf-8")


@tool
def write_file(path: str, content: str) -> str:
    """Create or overwrite a text file.

    Args:
        path: File path, relative to the work directory or absolute.
        content: The complete new contents of the file.
    """
    target = resolve(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(content, encoding="utf-8")
    return f"wrote {len(content)} characters to {path}"


def bash_result(exit_code: int, output: str) -> str:
    return f"exit code {exit_code}\n{output}"


def already_appended(command: str) -> object:
    """Guard of run_bash, asked after a crash left the command in doubt.

    Check-then-act: for ``echo LINE >> FILE`` it looks whether FILE already has LINE and
    then returns what the command returned the first time; anything else (e.g. running the
    tests) is safe to run again, so it answers NotDone.
    """
    if not appended_already(command, workdir()):
        return NotDone
    GUARDED.note(command)
    return bash_result(0, "")


@tool(idempotent=False, guard=already_appended)
def run_bash(command: str) -> str:
    """Run a shell command in the work directory and return its exit code and output.

    Args:
        command: The command line, run with /bin/sh.
    """
    done = subprocess.run(
        command, shell=True, cwd=workdir(), capture_output=True, text=True, timeout=300
    )
    CRASH.check_in_tool()  # the effect happened; its result is not recorded yet
    return bash_result(done.returncode, done.stdout + done.stderr)


TOOLS = ToolRegistry([read_file, write_file, run_bash])
MODEL = Model(model=DEFAULT_MODEL, max_tokens=2048, tools=TOOLS)  # client: see below

_offline: ScriptedServer | None = None


def offline_client() -> anthropic.Anthropic:
    """A client of the offline scripted model: a local fake Messages API (not Claude) that
    plays the demo task for whichever work directory the conversation names."""
    global _offline
    if _offline is None:
        _offline = ScriptedServer(coding_task_script()).start()
    return anthropic.Anthropic(base_url=_offline.url, api_key="offline-scripted")


# Chosen on import, so that every process importing this module can run the agent: this
# script, and `dbos-agent worker --app examples.coding_agent` continuing or forking a run.
# Configuration, never a checkpointed input (no key lands in the database).
configure(client=anthropic.Anthropic() if os.environ.get("ANTHROPIC_API_KEY") else offline_client())


# --------------------------------------------------------------------------- the agent


def show(text: str) -> None:
    print(text, end="", flush=True)


def print_replay(report: ReplayReport) -> None:
    steps = ", ".join(f"#{seq} {name}" for seq, name in report.steps)
    cost = report.cost_saved()
    print(f"↺ continued from its log: {report.summary()}")
    print(f"  replayed steps: {steps}")
    if cost is not None:
        print(f"  that is about ${cost:.4f} not paid twice")
    print(flush=True)


def show_tool_calls(reply: Message, results: list[ToolResultBlockParam]) -> None:
    if replaying():  # a recovered run stays quiet about what it merely replays
        return
    print()
    uses = [block for block in reply.content if block.type == "tool_use"]
    for block, result in zip(uses, results, strict=True):
        first_line = (str(result.get("content", "")).strip().splitlines() or [""])[0]
        mark = "✗" if result.get("is_error") else "→"
        command = block.input.get("command") if isinstance(block.input, dict) else None
        call = f"$ {command}" if isinstance(command, str) else short(block.input, 120)
        if isinstance(command, str) and GUARDED.took(command):  # the command did not run
            print(GUARDED.line(block.name, call, short(first_line)))
        else:
            print(f"  ⚙ {block.name}({call}) {mark} {short(first_line)}")


def short(value: object, limit: int = 60) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def needs_approval(reply: Message) -> list[str]:
    """The shell commands of this reply that change files (appends, moves, deletions, pushes)."""
    risky = re.compile(r">>|\brm\b|\bmv\b|git push")
    return [
        str(block.input.get("command", ""))
        for block in reply.content
        if block.type == "tool_use"
        and block.name == "run_bash"
        and isinstance(block.input, dict)
        and risky.search(str(block.input.get("command", "")))
    ]


def human_approval(commands: list[str]) -> str | None:
    """Durably wait for a human's decision on exactly these commands; None if approved,
    else the reason to refuse.

    The request is recorded with the digest of the commands (``da.ask_approval``) and the
    decision must name it, so an approval cannot be replayed onto other commands or taken
    twice; a process killed while waiting keeps waiting after a restart.
    """
    wid = da.current_workflow_id()
    da.set_event("awaiting_approval", {"commands": commands})
    ticket = da.ask_approval("run_bash", {"commands": commands})
    live = not next_step_replays()  # the decision is not in the log yet: we really wait
    if live:
        print("\n⏸  waiting for approval of:")
        for command in commands:
            print(f"     $ {command}")
        print(
            f"   approve: dbos-agent approve {wid} {ticket.seq} --digest {ticket.digest}\n"
            f"   reject:  dbos-agent reject {wid} {ticket.seq} --digest {ticket.digest}"
            ' --reason "..."\n'
            "   (or with the buttons of `dbos-agent serve`, the dashboard)",
            flush=True,
        )
    note_step()  # the wait below is live work, not replay
    decision = da.wait_for_approval(ticket)
    da.set_event("awaiting_approval", None)
    reason = None if decision.approved else (decision.reason or "rejected by the operator")
    if live:
        print("✓ approved: running it" if reason is None else f"✗ rejected: {reason}", flush=True)
    return reason


def refused(reply: Message, reason: str) -> list[ToolResultBlockParam]:
    """Tool results telling the model a human refused this batch of calls."""
    return [
        {
            "type": "tool_result",
            "tool_use_id": block.id,
            "is_error": True,
            "content": f"not run: a human refused this step ({reason})",
        }
        for block in reply.content
        if block.type == "tool_use"
    ]


def text_of(reply: Message) -> str:
    return "".join(block.text for block in reply.content if block.type == "text")


@da.durable_workflow(name="coding_agent")
def coding_agent(
    task: str, max_turns: int = 30, require_approval: bool = False, workdir: str | None = None
) -> str:
    """The agent loop. ``messages`` is derived state: rebuilt from step results on replay."""
    _WORKDIR.set(Path(workdir) if workdir is not None else None)
    track_replay(on_done=print_replay)
    messages: list[MessageParam] = [{"role": "user", "content": task}]
    for turn in range(max_turns):
        CRASH.turn = turn
        reply = MODEL.stream(messages, on_text=show)  # a step: the model call
        messages.append(reply.to_param())
        if reply.stop_reason != "tool_use":
            CRASH.check_after_turn(turn)
            replay_report()  # a run that only replayed reports now (nothing ran live)
            return text_of(reply)
        risky = needs_approval(reply) if require_approval else []
        refusal = human_approval(risky) if risky else None
        # a step per tool_use block, unless a human refused them
        results = refused(reply, refusal) if refusal else TOOLS.call_all(reply.content)
        messages.append({"role": "user", "content": results})
        show_tool_calls(reply, results)
        CRASH.check_after_turn(turn)
    raise RuntimeError(f"no answer after {max_turns} turns")


# --------------------------------------------------------------------------- running it


def choose_model(args: argparse.Namespace) -> None:
    """Say which model answers; ``--base-url`` or ``--offline`` override the default."""
    if args.base_url:
        print(f"Using the Messages API at {args.base_url}")
        key = os.environ.get("ANTHROPIC_API_KEY") or "scripted"
        configure(client=anthropic.Anthropic(base_url=args.base_url, api_key=key))
    elif os.environ.get("ANTHROPIC_API_KEY") and not args.offline:
        print(f"Using Claude ({MODEL.model}) through the Anthropic API")
    else:
        client = offline_client()
        configure(client=client)
        print(
            "No ANTHROPIC_API_KEY: using the OFFLINE SCRIPTED MODEL, a local fake Messages "
            f"API at {client.base_url} whose replies are scripted (not Claude)."
        )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = demo_arguments(
        __doc__.split("\n\n")[0] if __doc__ else None,
        task_id="coding-task-demo",
        crash_in_tool="kill -9 inside turn N's run_bash call, after it acted, before its result "
        "is checkpointed",
    )
    parser.add_argument("--max-turns", type=int, default=30)
    parser.add_argument(
        "--require-approval",
        action="store_true",
        help="wait for a human's approval (dbos-agent approve) before shell commands that change "
        "files",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    project = demo_project(args)
    CRASH.after_turn, CRASH.in_tool = args.crash_after_turn, args.crash_in_tool
    choose_model(args)
    # A one-shot command: it continues its own task id below, and leaves other
    # processes' workflows (other tasks, other model endpoints) to them.
    with da.launch(args.database_url, recover=False, take_over=False):
        return run_demo(
            args.task_id,
            project,
            lambda: coding_agent(
                coding_task_prompt(project), args.max_turns, args.require_approval, str(project)
            ),
        )


if __name__ == "__main__":
    sys.exit(main())

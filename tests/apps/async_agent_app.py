"""An async agent whose tools run in parallel, run as a subprocess (and SIGKILLed).

    python -m tests.apps.async_agent_app WORKFLOW_ID

Environment: DBOS_AGENT_DATABASE_URL; MODEL_URL (a scripted Messages API server);
TOOL_LOG (every start and end of a tool, appended with the pid: counted from outside
the process); HANG_ODD=1 makes the odd-numbered tools wait until the process is killed.
The agent asks the model once, runs the reply's tool calls concurrently with
``call_all_async``, and gives the results back for a final answer, printed as JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

import anthropic
from anthropic.types import MessageParam

import dbos_agent as da
from dbos_agent.agent import Model, ToolRegistry, tool

LOG = os.environ.get("TOOL_LOG", "tools.log")


def note(line: str) -> None:
    with open(LOG, "a", encoding="utf-8") as log:
        log.write(f"{line} {os.getpid()}\n")


@tool
async def work(i: int) -> int:
    """Work on part i (odd parts take long; even ones finish at once)."""
    note(f"start {i}")
    if i % 2 and os.environ.get("HANG_ODD"):
        await asyncio.sleep(3600)  # killed -9 here
    await asyncio.sleep(0.05 * (5 - i))  # later parts finish first
    note(f"done {i}")
    return i * 10


TOOLS = ToolRegistry([work])
MODEL = Model(
    anthropic.Anthropic(base_url=os.environ.get("MODEL_URL", "http://127.0.0.1:9"), api_key="x"),
    tools=TOOLS,
    retries=0,
)


@da.durable_workflow
async def agent(task: str) -> list[str]:
    messages: list[MessageParam] = [{"role": "user", "content": task}]
    while True:
        reply = await MODEL.create_async(messages)
        if reply.stop_reason != "tool_use":
            return [block.text for block in reply.content if block.type == "text"]
        messages.append({"role": "assistant", "content": reply.content})
        messages.append({"role": "user", "content": await TOOLS.call_all_async(reply.content)})


def main() -> int:
    workflow_id = sys.argv[1]
    url = os.environ["DBOS_AGENT_DATABASE_URL"]
    with da.launch(url, executor_id="async-agent-app"):
        handle = da.start(agent, "do five parts", workflow_id=workflow_id)
        print(json.dumps(handle.result(timeout=60)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""An async agent whose tools are an MCP server's, run as a subprocess (and SIGKILLed).

    python -m tests.apps.mcp_agent_app WORKFLOW_ID

Environment: DBOS_AGENT_DATABASE_URL; MODEL_URL (a scripted Messages API server);
MCP_SIDE_EFFECTS (the file tests.apps.mcp_server_app appends its effects to; this app appends
``wf-start``/``wf-end`` of every run of the workflow body, with its pid, so that a body
run twice at once in one process shows). At startup it starts the workflow under the
given id, as an application restarted after a crash would: the same id attaches to the
run that recovery continues.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import anthropic
from anthropic.types import MessageParam
from mcp import StdioServerParameters

import dbos_agent as da
from dbos_agent.agent import Model, ToolRegistry
from tests.support import zygote

LOG = Path(os.environ.get("MCP_SIDE_EFFECTS", "mcp_side_effects.log"))
SERVER = Path(__file__).with_name("mcp_server_app.py")


def note(*words: object) -> None:
    with LOG.open("a", encoding="utf-8") as log:
        log.write(" ".join(str(word) for word in (*words, os.getpid())) + "\n")


TOOLS = ToolRegistry.from_mcp(
    StdioServerParameters(
        command=sys.executable,
        args=zygote.through([str(SERVER)], start=False),
        env={"MCP_SIDE_EFFECTS": str(LOG)},
    ),
    errlog=open(os.devnull, "w"),  # noqa: SIM115 - the server's stderr, for the process's life
)
MODEL = Model(
    anthropic.Anthropic(base_url=os.environ.get("MODEL_URL", "http://127.0.0.1:9"), api_key="x"),
    tools=TOOLS,
    retries=0,
)


@da.durable_workflow
async def mcp_agent(task: str) -> str:
    note("wf-start", da.current_workflow_id())
    messages: list[MessageParam] = [{"role": "user", "content": task}]
    while True:
        reply = await MODEL.create_async(messages)
        if reply.stop_reason != "tool_use":
            note("wf-end", da.current_workflow_id())
            return "".join(block.text for block in reply.content if block.type == "text")
        messages.append({"role": "assistant", "content": reply.content})
        messages.append({"role": "user", "content": await TOOLS.call_all_async(reply.content)})


def main() -> int:
    workflow_id = sys.argv[1]
    with da.launch(os.environ["DBOS_AGENT_DATABASE_URL"], executor_id="mcp-agent-app"):
        handle = da.start(mcp_agent, "use the tools", workflow_id=workflow_id)
        print(json.dumps(handle.result(timeout=60)), flush=True)
    TOOLS.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

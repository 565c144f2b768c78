"""A stdio MCP server with one tool, started by Pydantic AI's MCPToolset as a subprocess.

    python tests/apps/pydantic_ai_mcp_server.py

``multiply`` appends ``multiply A B PID`` to $MCP_LOG before it answers (side effects
counted from outside every process; PID is the agent's: $MCP_AGENT_PID, else this
process's parent); with $MCP_HANG set to ``A`` it hangs on that first argument until
the agent is killed (then it exits: it never outlives the test), so that a test can kill
the agent mid-call. While the file $MCP_DOWN_WHILE exists the server is down: it exits
at once, before the handshake.
"""

from __future__ import annotations

import os
import time

from mcp.server.mcpserver import MCPServer

server = MCPServer("calc")


@server.tool()
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    agent = int(os.environ.get("MCP_AGENT_PID") or os.getppid())
    with open(os.environ["MCP_LOG"], "a", encoding="utf-8") as log:
        log.write(f"multiply {a} {b} {agent}\n")
    if os.environ.get("MCP_HANG") == str(a):
        while _alive(agent):
            time.sleep(0.05)
        os._exit(0)
    return a * b


def _alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a killed one not yet reaped does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


if __name__ == "__main__":
    down = os.environ.get("MCP_DOWN_WHILE")
    if down and os.path.exists(down):
        raise SystemExit(1)
    server.run("stdio")

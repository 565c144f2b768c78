"""A stdio MCP server with one tool, started by Pydantic AI's MCPToolset as a subprocess.

    python tests/apps/pydantic_ai_mcp_server.py

``multiply`` appends ``multiply A B PID`` to $MCP_LOG before it answers (side effects
counted from outside every process); with $MCP_HANG set to ``A`` it hangs on that first
argument until the agent that started it is killed (then it exits: it never outlives
the test), so that a test can kill the agent mid-call. While the file $MCP_DOWN_WHILE
exists the server is down: it exits at once, before the handshake.
"""

from __future__ import annotations

import os
import time

from mcp.server.mcpserver import MCPServer

server = MCPServer("calc")


@server.tool()
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    agent = os.getppid()
    with open(os.environ["MCP_LOG"], "a", encoding="utf-8") as log:
        log.write(f"multiply {a} {b} {agent}\n")
    if os.environ.get("MCP_HANG") == str(a):
        while os.getppid() == agent:  # until the agent is gone (and this is re-parented)
            time.sleep(0.05)
        os._exit(0)
    return a * b


if __name__ == "__main__":
    down = os.environ.get("MCP_DOWN_WHILE")
    if down and os.path.exists(down):
        raise SystemExit(1)
    server.run("stdio")

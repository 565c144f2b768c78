"""A local MCP server for the MCP tool tests: over stdio, started by the registry under
test, or over Streamable HTTP on a port, started by the test itself.

    python -m tests.apps.mcp_server_app
    python -m tests.apps.mcp_server_app --http PORT    # http://127.0.0.1:PORT/mcp

Environment: MCP_SIDE_EFFECTS, a file each start of the server and every call's effect is
appended to, one line each with this process's pid, so that the tests count from outside
(even across a kill -9 of the agent) what really ran. MCP_DOWN_WHILE, a file: while it
exists the server is down (it exits at once with status 1, before the handshake).
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

LOG = Path(os.environ.get("MCP_SIDE_EFFECTS", "mcp_side_effects.log"))

app = MCPServer("dbos-agent-test-tools")


def note(*words: object) -> None:
    """Append one line (a single write, so concurrent writers never interleave)."""
    line = " ".join(str(word) for word in (*words, os.getpid())) + "\n"
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def lines(first_word: str, *rest: str) -> int:
    """How many lines of the log start with these words."""
    if not LOG.exists():
        return 0
    return sum(
        1
        for line in LOG.read_text().splitlines()
        if line.split()[: 1 + len(rest)] == [first_word, *rest]
    )


@app.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    note("add", a, b)
    return a + b


@app.tool()
def append(text: str) -> str:
    """Append a line of text to the log (an effect that must not repeat)."""
    note("append", text)
    return f"appended {text}"


@app.tool()
def big(size: int) -> str:
    """``size`` bytes of text (a result near a size limit)."""
    note("big", size)
    return "x" * size


@app.tool()
def refuse(reason: str) -> str:
    """Always fails, with an error the model can read."""
    note("refuse", reason)
    raise ToolError(f"refused: {reason}")


@app.tool()
async def slow_once(label: str, seconds: float) -> str:
    """The first call with a label waits (to be killed meanwhile); later ones return."""
    first = lines("slow-start", label) == 0
    note("slow-start", label)
    if first:
        await asyncio.sleep(seconds)
    note("slow-end", label)
    return f"done {label}"


if __name__ == "__main__":
    down = os.environ.get("MCP_DOWN_WHILE")
    if down and Path(down).exists():
        note("server-down")
        sys.exit(1)
    note("server-start")
    if sys.argv[1:2] == ["--http"]:
        app.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        app.run()

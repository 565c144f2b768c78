#!/usr/bin/env python3
"""A small MCP server of file and shell tools for one project folder (stdio).

    python examples/fs_mcp_server.py PROJECT_DIR

The tools of ``examples/pydantic_ai_agent.py``, named and shaped as the scripted coding
task asks for them (``read_file``, ``write_file``, ``run_bash``). Paths are taken relative
to PROJECT_DIR and refused when they resolve outside it; ``run_bash`` runs its command with
PROJECT_DIR as its working directory (a shell is not a sandbox: confinement of what a
command does is the operating system's job, e.g. a container).

The tools declare what a repeat does (MCP tool annotations, for clients that read them):
reading is read-only, writing a whole file is idempotent, a shell command is neither. The
agent still says so itself, in its tool metadata, since MCP hints are advice from the server.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

ROOT = Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()

server = MCPServer("fs", instructions=f"File and shell tools confined to {ROOT}.")


def inside(path: str) -> Path:
    """``path`` (relative to the project, or absolute) if it is inside the project."""
    target = (ROOT / path).resolve()
    if target != ROOT and ROOT not in target.parents:
        raise ValueError(f"{path} is outside the work directory {ROOT}")
    return target


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def read_file(path: str) -> str:
    """Read a text file and return its contents.

    Args:
        path: File path, relative to the work directory or absolute (inside it).
    """
    return inside(path).read_text(encoding="utf-8")


@server.tool(annotations=ToolAnnotations(read_only_hint=False, idempotent_hint=True))
def write_file(path: str, content: str) -> str:
    """Create or overwrite a text file.

    Args:
        path: File path, relative to the work directory or absolute (inside it).
        content: The complete new contents of the file.
    """
    target = inside(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(content, encoding="utf-8")
    return f"wrote {len(content)} characters to {path}"


@server.tool(annotations=ToolAnnotations(read_only_hint=False, idempotent_hint=False))
def run_bash(command: str) -> str:
    """Run a shell command in the work directory and return its exit code and output.

    Args:
        command: The command line, run with /bin/sh.
    """
    done = subprocess.run(
        command, shell=True, cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    return f"exit code {done.returncode}\n{done.stdout}{done.stderr}"


if __name__ == "__main__":
    server.run("stdio")

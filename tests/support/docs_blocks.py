"""The Python blocks of README.md and docs/ that the suite runs, and the model they talk to.

A block is runnable when the line before its fence is the comment ``<!-- runnable -->``
(invisible on GitHub and on the site)::

    <!-- runnable -->
    ```python
    import dbos_agent as da
    ...
    ```

``tests/integration/test_docs_blocks.py`` runs each one as a program of its own would,
as ``__main__``; what it provides and cleans up is said there. Other blocks (fragments
with ``...``, an MCP server, a web app) are read, not run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dbos_agent.agent.scripted_server import Reply, ScriptItem, text, tool_use

#: The root of this checkout.
ROOT = Path(__file__).resolve().parents[2]

#: The comment that marks the block after it runnable.
MARKER = "<!-- runnable -->"

_FENCE = re.compile(r"^(`{3,}|~{3,})")


@dataclass(frozen=True)
class Block:
    """One runnable block: where it is (for the test's id and tracebacks) and its code."""

    path: Path
    line: int
    code: str

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def documents() -> list[Path]:
    """The README and every page of the documentation site."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _blocks(path: Path) -> list[Block]:
    """The runnable blocks of one file: a marker line, then a ```python fence, outside any
    other fence (a page may show the convention inside a fence of its own)."""
    lines = path.read_text(encoding="utf-8").split("\n")
    blocks: list[Block] = []
    fence: str | None = None  # the opening fence while inside one
    start = 0
    for number, line in enumerate(lines):
        opening = _FENCE.match(line)
        if fence is None and opening:
            fence = opening.group(1)
            start = number + 1
        elif fence is not None and line.strip() == fence:
            marked = start >= 2 and lines[start - 2].strip() == MARKER
            if marked and lines[start - 1].startswith("```python"):
                blocks.append(Block(path, start + 1, "\n".join(lines[start:number]) + "\n"))
            fence = None
    return blocks


def runnable_blocks(paths: list[Path] | None = None) -> list[Block]:
    """The runnable blocks of ``paths`` (default: :func:`documents`), in order."""
    return [block for path in (documents() if paths is None else paths) for block in _blocks(path)]


def scripted_model(request: dict[str, Any]) -> ScriptItem:
    """The docs' model, a stand-in for Claude: it calls the request's first tool once
    (each required argument the string ``"docs"``), then answers in words, quoting the
    tool's result."""
    last = request["messages"][-1]
    content = last.get("content")
    results = [
        block
        for block in (content if isinstance(content, list) else [])
        if isinstance(block, dict) and block.get("type") == "tool_result"
    ]
    tools = request.get("tools") or []
    if results:
        return Reply([text(f"The tool answered: {results[0].get('content')!r}.")])
    if tools:
        schema = tools[0].get("input_schema", {})
        arguments = {name: "docs" for name in schema.get("required", [])}
        return Reply([tool_use(tools[0]["name"], arguments)])
    return Reply([text("A scripted answer.")])

"""The demo scenario: a small buggy project, the scripted coding task that fixes it, and the
check its shell tool's guard makes after a crash."""

from __future__ import annotations

import os
import re
import shlex
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..replay import replaying
from .protocol import _content_blocks
from .script import JSONDict, Reply, ScriptFn, ScriptItem, text, tool_use

if TYPE_CHECKING:
    from anthropic.types import ToolParam

__all__ = [
    "CHANGELOG_LINE",
    "CODING_TASK_TOOLS",
    "CrashPlan",
    "appended_already",
    "coding_task_prompt",
    "coding_task_script",
    "seed_coding_task",
]

# --------------------------------------------------------------------------- demo scenario

_PROMPT = (
    "The Python project in {workdir} has a bug: its tests (test_calc.py) fail. Find and fix "
    "the bug, run the tests to confirm the fix, then record it with one line appended to "
    "CHANGELOG.md (use `echo '- ...' >> CHANGELOG.md`). Work only inside that directory."
)
_PROMPT_WORKDIR = re.compile(r"The Python project in (?P<workdir>.+?) has a bug:")


def coding_task_prompt(workdir: str | Path) -> str:
    """The task given to the agent: fix the project seeded in ``workdir``."""
    return _PROMPT.format(workdir=workdir)


CODING_TASK_TOOLS: list[ToolParam] = [
    {
        "name": "read_file",
        "description": "Read a text file and return its contents.",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        },
    },
    {
        "name": "write_file",
        "description": "Create or overwrite a text file.",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"],
        },
    },
    {
        "name": "run_bash",
        "description": "Run a shell command and return its exit code and output.",
        "input_schema": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
]
"""Tool definitions matching :func:`coding_task_script`, to pass as ``tools=``."""

_BUGGY_CALC = '''"""A tiny calculator, the subject of the dbos_agent demo task."""


def add(a: float, b: float) -> float:
    return a + b


def average(values: list[float]) -> float:
    """Arithmetic mean of ``values``."""
    return sum(values) / (len(values) - 1)
'''

_FIXED_CALC = '''"""A tiny calculator, the subject of the dbos_agent demo task."""


def add(a: float, b: float) -> float:
    return a + b


def average(values: list[float]) -> float:
    """Arithmetic mean of ``values``."""
    if not values:
        raise ValueError("average() of an empty list")
    return sum(values) / len(values)
'''

_TEST_CALC = '''"""Tests for calc.py; run with `python test_calc.py` (or pytest)."""

from calc import add, average


def test_add() -> None:
    assert add(2, 3) == 5


def test_average() -> None:
    assert average([1, 2, 3, 4]) == 2.5


def test_average_single() -> None:
    assert average([7]) == 7


if __name__ == "__main__":
    failed = 0
    tests = [(n, f) for n, f in sorted(globals().items()) if n.startswith("test_")]
    for name, fn in tests:
        try:
            fn()
        except Exception as exc:
            failed += 1
            print(f"FAIL {name}: {exc!r}")
        else:
            print(f"PASS {name}")
    print(f"{len(tests) - failed} passed, {failed} failed")
    raise SystemExit(1 if failed else 0)
'''

CHANGELOG_LINE = "- Fixed off-by-one in calc.average() (divided by len - 1)"


def seed_coding_task(workdir: Path) -> None:
    """Write the buggy ``calc.py``, its ``test_calc.py`` and an empty ``CHANGELOG.md``."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "calc.py").write_text(_BUGGY_CALC, encoding="utf-8")
    (workdir / "test_calc.py").write_text(_TEST_CALC, encoding="utf-8")
    (workdir / "CHANGELOG.md").write_text("# Changelog\n\n", encoding="utf-8")


_APPEND = re.compile(r"^(?:cd (?P<dir>'[^']*'|\S+) && )?echo (?P<text>.+) >> (?P<file>\S+)$")


def appended_already(command: str, workdir: Path) -> bool:
    """Whether ``command`` is an append (``[cd DIR && ]echo LINE >> FILE``, as the task's
    CHANGELOG entry is made) whose LINE its FILE already holds; FILE is relative to DIR,
    else to ``workdir``.

    The check-then-act of a guard of a non-idempotent shell tool, asked after a crash left
    the command in doubt: True means it ran (do not append again); False means it did not,
    or it is another command (running the tests is safe to repeat).
    """
    match = _APPEND.match(command.strip())
    if match is None:
        return False
    line = " ".join(shlex.split(match["text"]))
    base = Path(shlex.split(match["dir"])[0]) if match["dir"] else Path(workdir)
    target = base / shlex.split(match["file"])[0]
    return target.exists() and line in target.read_text(encoding="utf-8").splitlines()


def _tool_results(messages: Sequence[Any]) -> list[str]:
    """Text of every tool_result in the conversation, in order."""
    out: list[str] = []
    for message in messages:
        if not isinstance(message, Mapping) or message.get("role") != "user":
            continue
        for block in _content_blocks(message):
            if block.get("type") != "tool_result":
                continue
            content = block.get("content", "")
            if isinstance(content, list):
                content = "".join(str(c.get("text", "")) for c in content if isinstance(c, Mapping))
            out.append(str(content))
    return out


def _workdir_of(messages: Sequence[Any]) -> Path:
    """The work directory named by the conversation's :func:`coding_task_prompt`."""
    first = messages[0] if messages else {}
    content = first.get("content", "") if isinstance(first, Mapping) else ""
    if not isinstance(content, str):
        content = " ".join(str(b.get("text", "")) for b in _content_blocks(first))
    match = _PROMPT_WORKDIR.search(content)
    if match is None:
        raise ValueError("the conversation does not start with coding_task_prompt(workdir)")
    return Path(match["workdir"])


def coding_task_script(workdir: str | None = None, python: str = "python3") -> ScriptFn:
    """A believable 6-turn coding task: read, test, fix, re-test, log to CHANGELOG, summarise.

    The turn is the number of assistant messages in the request, not a server-side counter, so
    a client that resumes a conversation after a crash gets the correct next reply. Turn 4 is
    the non-idempotent side effect (``echo ... >> CHANGELOG.md``) that crash tests look for.
    Without ``workdir`` the project is the one the conversation's first message names (see
    :func:`coding_task_prompt`), so one server can play the task for any work directory.
    """

    def script(body: JSONDict) -> ScriptItem:
        messages = body.get("messages", [])
        root = Path(workdir) if workdir is not None else _workdir_of(messages)
        calc = str(root / "calc.py")
        cd = f"cd {shlex.quote(str(root))} && "
        run_tests = cd + f"{python} test_calc.py"
        turn = sum(1 for m in messages if isinstance(m, Mapping) and m.get("role") == "assistant")
        results = _tool_results(messages)
        if turn == 0:
            return Reply(
                [text("I'll start by reading calc.py."), tool_use("read_file", {"path": calc})]
            )
        if turn == 1:
            return Reply(
                [
                    text("Let me run the test suite to see what fails."),
                    tool_use("run_bash", {"command": run_tests}),
                ]
            )
        if turn == 2:
            return Reply(
                [
                    text(
                        "`average` divides by `len(values) - 1`, so the mean is wrong and a "
                        "single value divides by zero. Fixing it to divide by `len(values)`."
                    ),
                    tool_use("write_file", {"path": calc, "content": _FIXED_CALC}),
                ]
            )
        if turn == 3:
            return Reply(
                [text("Re-running the tests."), tool_use("run_bash", {"command": run_tests})]
            )
        if turn == 4:
            command = cd + f"echo {shlex.quote(CHANGELOG_LINE)} >> CHANGELOG.md"
            return Reply(
                [
                    text("Recording the fix in CHANGELOG.md."),
                    tool_use("run_bash", {"command": command}),
                ]
            )
        second_run = results[3] if len(results) > 3 else ""
        verdict = (
            "all tests pass now"
            if "0 failed" in second_run
            else f"but the tests still report problems:\n{second_run.strip()}"
        )
        return Reply(
            [
                text(
                    "Done. `calc.average` divided by `len(values) - 1`; it now divides by "
                    f"`len(values)` and rejects empty input, {verdict}. "
                    "I added a CHANGELOG.md entry for the fix."
                )
            ]
        )

    return script


def _echo_script(body: JSONDict) -> ScriptItem:
    """Answer with the last user text: a never-ending script for smoke tests."""
    messages = body.get("messages", [])
    last = messages[-1] if messages else {}
    content = last.get("content", "") if isinstance(last, Mapping) else ""
    if isinstance(content, list):
        content = " ".join(str(b.get("text", "")) for b in content if isinstance(b, Mapping))
    return Reply([text(f"echo: {content}")])


# --------------------------------------------------------------------------- demo aid


class GuardAnswers:
    """Demo aid: the calls a guard answered in this process instead of running them again
    (a call left in doubt by a crash, found done), so that the demo says so where it shows
    the call's result: the result reads the same either way."""

    def __init__(self) -> None:
        self._answered: set[str] = set()

    def note(self, call: str) -> None:
        """The guard answered ``call`` (e.g. the shell command) from what it found."""
        self._answered.add(call)

    def took(self, call: str) -> bool:
        """Whether the guard answered ``call``, said once."""
        if call not in self._answered:
            return False
        self._answered.discard(call)
        return True

    @staticmethod
    def line(tool: str, shown: str, result: str) -> str:
        """The demo's line for a call its guard answered."""
        return f"  ⚙ {tool}({shown}) ↩ not run again: its guard found it done ({result})"


class CrashPlan:
    """Demo aid: kill this process with SIGKILL at a chosen point, only in a live run."""

    def __init__(self) -> None:
        self.after_turn: int | None = None  # after turn N is checkpointed
        self.in_tool: int | None = None  # inside turn N's tool call, before its checkpoint
        self.turn = 0

    def check_after_turn(self, turn: int) -> None:
        if self.after_turn == turn and not replaying():
            self.die(f"after turn {turn}")

    def check_in_tool(self) -> None:
        if self.in_tool == self.turn:
            self.die(f"inside the tool call of turn {self.turn}")

    @staticmethod
    def die(where: str) -> None:
        print(f"\n💥 kill -9 {where}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

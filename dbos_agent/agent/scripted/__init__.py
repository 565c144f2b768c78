"""The scripted offline Anthropic Messages API server, one job per module.

* :mod:`.script`: script items (:class:`Reply`, :class:`Fail`, :class:`Delay`) and their JSON
  form.
* :mod:`.protocol`: request checks and response rendering (messages, SSE events, errors).
* :mod:`.server`: :class:`ScriptedServer`, the HTTP side.
* :mod:`.request_log`: what the server was asked (:class:`RequestRecord`), in memory and as
  JSON lines.
* :mod:`.demo_task`: the demo coding task.
* :mod:`.demo_cli`: what the demo scripts share on the command line.
* :mod:`.cli`: the command line (``python -m dbos_agent.agent.scripted_server``).

The public entry point is :mod:`dbos_agent.agent.scripted_server`, which re-exports these.
"""

from __future__ import annotations

from .cli import main
from .demo_cli import demo_arguments, demo_project, run_demo
from .demo_task import (
    CHANGELOG_LINE,
    CODING_TASK_TOOLS,
    CrashPlan,
    GuardAnswers,
    appended_already,
    coding_task_prompt,
    coding_task_script,
    seed_coding_task,
)
from .protocol import validate_request
from .request_log import RequestRecord
from .script import (
    ContentBlock,
    Delay,
    Fail,
    Reply,
    ScriptFn,
    ScriptItem,
    TextContent,
    ToolUseContent,
    dump_script,
    item_from_json,
    item_to_json,
    load_script,
    text,
    tool_use,
)
from .server import ScriptedServer

__all__ = [
    "CHANGELOG_LINE",
    "CODING_TASK_TOOLS",
    "ContentBlock",
    "CrashPlan",
    "Delay",
    "Fail",
    "GuardAnswers",
    "Reply",
    "RequestRecord",
    "ScriptFn",
    "ScriptItem",
    "ScriptedServer",
    "TextContent",
    "ToolUseContent",
    "appended_already",
    "coding_task_prompt",
    "coding_task_script",
    "demo_arguments",
    "demo_project",
    "dump_script",
    "item_from_json",
    "item_to_json",
    "load_script",
    "main",
    "run_demo",
    "seed_coding_task",
    "text",
    "tool_use",
    "validate_request",
]

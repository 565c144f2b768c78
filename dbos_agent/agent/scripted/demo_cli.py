"""What the demo scripts (``examples/coding_agent.py``, ``examples/pydantic_ai_agent.py``)
share on the command line: their arguments, their project, and how a run is announced,
stopped and summed up. Each script keeps only what its agent does differently."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from ..._engine.handle import retrieve
from ..._engine.workflow import workflow_id
from ...errors import WorkflowCancelledError, WorkflowIdConflictError, WorkflowNotFoundError
from ..accounting import usage_totals
from .demo_task import seed_coding_task

__all__ = ["demo_arguments", "demo_project", "run_demo"]


def demo_arguments(
    description: str | None, task_id: str, crash_in_tool: str
) -> argparse.ArgumentParser:
    """A parser with the options every demo takes; ``crash_in_tool`` says where
    ``--crash-in-tool N`` kills the process."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--task-id",
        default=task_id,
        help="workflow id; run the same id again to continue after a crash",
    )
    parser.add_argument(
        "--workdir", type=Path, help="project to work on (default: ./agent-work/<task-id>, seeded)"
    )
    parser.add_argument("--database-url", help="Postgres URL (default: env or embedded)")
    parser.add_argument(
        "--base-url",
        help="use this Messages API endpoint (e.g. a scripted server started separately)",
    )
    parser.add_argument(
        "--offline",
        action="store_true",
        help="use the scripted model even if ANTHROPIC_API_KEY is set",
    )
    parser.add_argument(
        "--crash-after-turn",
        type=int,
        metavar="N",
        help="kill -9 this process once turn N (a reply and its tool calls) is checkpointed",
    )
    parser.add_argument("--crash-in-tool", type=int, metavar="N", help=crash_in_tool)
    return parser


def demo_project(args: argparse.Namespace) -> Path:
    """The project the demo works on (``--workdir``, else ``./agent-work/<task-id>``),
    seeded with the buggy calculator the first time."""
    project: Path = (args.workdir or Path("agent-work") / args.task_id).resolve()
    if not (project / "calc.py").exists():
        seed_coding_task(project)
    return project


def run_demo(task_id: str, project: Path, answer: Callable[[], str]) -> int:
    """Run ``answer()`` (the demo's workflow) under ``task_id``: say whether it starts,
    continues or has finished, print its answer and what it cost; the exit status."""
    try:
        status = retrieve(task_id).status()
        if status.finished:
            print(f"Workflow {task_id!r} already finished ({status}): its recorded outcome.")
        else:
            print(f"Workflow {task_id!r} exists ({status}): continuing it from its log.")
    except WorkflowNotFoundError:
        print(f"Starting workflow {task_id!r} in {project}")
    print()
    try:
        with workflow_id(task_id):
            final = answer()
    except WorkflowIdConflictError as exc:
        print(f"{exc}\nUse another --task-id for another task or work directory.")
        return 2
    except WorkflowCancelledError:
        print(f"\nWorkflow {task_id!r} was cancelled (`dbos-agent workflows resume` undoes it).")
        return 1
    except KeyboardInterrupt:
        print(
            f"\nInterrupted. Workflow {task_id!r} stays PENDING: run the same command "
            f"again to continue it from its log."
        )
        return 130
    totals = usage_totals(task_id)
    cost = f", about ${totals.cost_usd:.4f}" if totals.cost_usd is not None else ""
    print(f"\n\n=== final answer ===\n{final}\n")
    print(
        f"Workflow {task_id!r}: {totals.model_calls} model calls, {totals.tool_calls} tool "
        f"calls, {totals.input_tokens:,} input + {totals.output_tokens:,} output tokens{cost}."
    )
    return 0

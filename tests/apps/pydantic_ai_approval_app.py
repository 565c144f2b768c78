"""A Pydantic AI agent whose tools wait for a human's approval, run durably on dbos_agent;
imported by the tests and run as a subprocess that they kill -9 and run again:

    python -m tests.apps.pydantic_ai_approval_app WORKFLOW_ID=TASK ...

starts (or, run again, continues) ``guarded(TASK)`` under each id, all at once, and prints
``{workflow id: result}`` as JSON on the last line of stdout.

Environment: DBOS_AGENT_DATABASE_URL; MODEL_URL (a scripted Messages API server);
SIDE_LOG (every side effect, appended with the pid, counted from outside the process:
``TASK body start|end`` around each run of the workflow body, ``delete PATH`` each time
``delete`` runs, ``transfer N asked`` each time ``transfer`` asks for approval and
``transfer N done`` each time it moves the money, and ``started`` once the process has
launched and started, or attached to, every workflow it was given).
"""

from __future__ import annotations

import json
import os
import sys

from pydantic_ai import Agent, FunctionToolset, RunContext
from pydantic_ai.exceptions import ApprovalRequired

import dbos_agent as da
from dbos_agent.integrations.pydantic_ai import Durability
from tests.apps.pydantic_ai_app import model, note

#: Above this amount a transfer waits for a human (it asks by raising ApprovalRequired).
LIMIT = 100

ops = FunctionToolset[None](id="ops")


@ops.tool_plain(requires_approval=True)
def delete(path: str) -> str:
    """Delete a file (always waits for a human's approval)."""
    note(f"delete {path}")
    return f"deleted {path}"


@ops.tool
def transfer(ctx: RunContext[None], amount: int) -> str:
    """Move money; a large amount waits for a human's approval."""
    if amount > LIMIT and not ctx.tool_call_approved:
        note(f"transfer {amount} asked")
        raise ApprovalRequired(metadata={"limit": LIMIT})
    note(f"transfer {amount} done")
    return f"moved {amount}"


guard = Agent(model(), name="guard", toolsets=[ops], capabilities=[Durability()])
#: The same agent with its run's events published to the workflow's stream.
narrated_guard = Agent(
    model(), name="narrated_guard", toolsets=[ops], capabilities=[Durability(events=True)]
)

#: The same agent leaving its approvals to Pydantic AI's own flow.
own_guard = Agent(
    model(), name="own_guard", toolsets=[ops], capabilities=[Durability(approvals=False)]
)


@da.durable_workflow(name="pai_guarded")
async def guarded(task: str) -> str:
    note(f"{task} body start")
    result = await guard.run(task)
    note(f"{task} body end")
    return result.output


def main() -> int:
    runs = [arg.partition("=") for arg in sys.argv[1:]]
    with da.launch(os.environ["DBOS_AGENT_DATABASE_URL"], executor_id="pydantic-ai-approvals"):
        handles = {wid: da.start(guarded, task, workflow_id=wid) for wid, _, task in runs}
        note("started")
        results = {wid: handle.result(timeout=90) for wid, handle in handles.items()}
        print(json.dumps(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

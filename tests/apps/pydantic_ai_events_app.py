"""A Pydantic AI agent whose run's events go to a durable stream, run as a subprocess
that the tests kill -9 in the middle of a streamed model reply and run again:

    python -m tests.apps.pydantic_ai_events_app WORKFLOW_ID TASK

starts (or, run again, recovers and continues) the workflow and prints its result as
JSON. Environment: DBOS_AGENT_DATABASE_URL; MODEL_URL (a scripted Messages API server).
"""

from __future__ import annotations

import json
import os
import sys

from pydantic_ai import Agent

import dbos_agent as da
from dbos_agent.integrations.pydantic_ai import DEFAULT_EVENTS_KEY, Durability
from tests.apps.pydantic_ai_app import math, model

narrator = Agent(model(), name="narrator", toolsets=[math], capabilities=[Durability(events=True)])


@da.durable_workflow(name="pai_events_narrate")
async def narrate(task: str) -> str:
    """Run the agent, its events in the stream ``pydantic_ai.events``; then close it."""
    output = (await narrator.run(task)).output
    await da.aio.close_stream(DEFAULT_EVENTS_KEY)
    return output


def main() -> int:
    workflow_id, task = sys.argv[1], sys.argv[2]
    with da.launch(os.environ["DBOS_AGENT_DATABASE_URL"], executor_id="pydantic-ai-events-app"):
        handle = da.start(narrate, task, workflow_id=workflow_id)
        print(json.dumps(handle.result(timeout=60)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

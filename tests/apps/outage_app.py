"""Agents whose model provider is down, run as a subprocess (and SIGKILLed).

    python -m tests.apps.outage_app WORKFLOW_ID...

starts (or, run again, attaches to) one agent per id, each one model call, and prints
``{workflow id: answer}`` as JSON on the last line of stdout once all have finished.

Environment: DBOS_AGENT_DATABASE_URL; MODEL_URL (a scripted Messages API server);
ADVANCE_CLOCK, seconds this process's database clock is moved forward at launch: the
outage that passed while no process ran (tests cannot wait ten minutes).
"""

from __future__ import annotations

import json
import os
import sys

import anthropic

import dbos_agent as da
from dbos_agent.agent import Model
from dbos_agent.testing import advance_clock

MODEL = Model(
    anthropic.Anthropic(base_url=os.environ.get("MODEL_URL", "http://127.0.0.1:9"), api_key="x"),
    retries=2,
    interval=0.05,
    max_interval=300.0,
    jitter=0.0,
)


@da.durable_workflow(name="outage_agent")
def agent(task: str) -> str:
    reply = MODEL.create([{"role": "user", "content": task}])
    return "".join(block.text for block in reply.content if block.type == "text")


def main() -> int:
    url = os.environ["DBOS_AGENT_DATABASE_URL"]
    with da.launch(url, executor_id="outage-app"):
        if os.environ.get("ADVANCE_CLOCK"):
            advance_clock(float(os.environ["ADVANCE_CLOCK"]))
        handles = [da.start(agent, f"task {wid}", workflow_id=wid) for wid in sys.argv[1:]]
        answers = {h.workflow_id: h.result(timeout=120) for h in handles}
        print(json.dumps(answers), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A workflow with a token budget making model calls, run as a subprocess (SIGKILLed).

    python -m tests.apps.budget_app WORKFLOW_ID CALLS

Environment: DBOS_AGENT_DATABASE_URL; MODEL_URL (the scripted server: 300 tokens a reply).
Prints the result, or the error's type and message, as JSON.
"""

from __future__ import annotations

import json
import os
import sys

import anthropic

import dbos_agent as da
from dbos_agent.agent import Budget, Model

MODEL = Model(
    anthropic.Anthropic(base_url=os.environ.get("MODEL_URL", "http://127.0.0.1:9"), api_key="x"),
    model="claude-haiku-4-5",
    max_tokens=200,
    retries=0,
    budget=Budget(max_tokens=1000),
)


@da.durable_workflow(name="budget_app_calls")
def calls(n: int) -> int:
    for _ in range(n):
        MODEL.create([{"role": "user", "content": "hi"}])
    return n


def main() -> int:
    url = os.environ["DBOS_AGENT_DATABASE_URL"]
    with da.launch(url, executor_id="budget-app"):
        handle = da.start(calls, int(sys.argv[2]), workflow_id=sys.argv[1])
        try:
            print(json.dumps({"result": handle.result(timeout=60)}), flush=True)
        except da.DbosAgentError as exc:
            print(json.dumps({"error": type(exc).__name__, "message": str(exc)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A durable app for the messaging and timer crash tests, run as a subprocess and SIGKILLed.

    python tests/apps/messaging_app.py recv WORKFLOW_ID     # run two_messages() under that id
    python tests/apps/messaging_app.py sleep WORKFLOW_ID S  # run sleepy(S) under that id
    python tests/apps/messaging_app.py recover WORKFLOW_ID  # launch (recovering), wait, result
    python tests/apps/messaging_app.py adopt WORKFLOW_ID S  # clock S s on, take over, result

Environment: DBOS_AGENT_DATABASE_URL, MSG_EXECUTOR (executor id), MSG_DIR (where the
effects log is appended), MSG_KILL ("after-recv-0", "after-recv-1" or empty): where the
process SIGKILLs itself, right after a recv returned and before the next step.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import dbos_agent as da
from dbos_agent.testing import advance_clock, take_over_once

DIR = Path(os.environ.get("MSG_DIR", "."))
KILL = os.environ.get("MSG_KILL", "")


@da.step
def handle(message: str) -> str:
    """The side effect of a received message, counted from outside."""
    with open(DIR / "effects.log", "a") as f:
        f.write(message + "\n")
        f.flush()
        os.fsync(f.fileno())
    return message.upper()


@da.step
def clock() -> float:
    return time.time()


@da.durable_workflow
def two_messages() -> list[str]:
    handled = []
    for i in range(2):
        message = da.recv("inbox", timeout=60)
        if KILL == f"after-recv-{i}":  # received and recorded, the next step not yet run
            os.kill(os.getpid(), signal.SIGKILL)
        handled.append(handle(message))
    return handled


@da.durable_workflow
def sleepy(seconds: float) -> float:
    """How long the workflow slept, measured by two recorded clock readings."""
    start = clock()
    da.sleep(seconds)
    return clock() - start


def main() -> None:
    mode, wid = sys.argv[1], sys.argv[2]
    executor = os.environ.get("MSG_EXECUTOR", "local")
    runtime = da.launch(
        executor_id=executor, recover=(mode == "recover"), take_over=False, workers=4
    )
    try:
        result: object
        with da.workflow_id(wid):
            if mode == "adopt":  # a dead process's workflow, S s later by the database clock
                advance_clock(float(sys.argv[3]))
                take_over_once()
                result = da.retrieve(wid).result(timeout=60)
            elif mode == "recv":
                result = two_messages()
            elif mode == "sleep":
                result = sleepy(float(sys.argv[3]))
            else:
                result = da.retrieve(wid).result(timeout=60)
        print(json.dumps(result), flush=True)
    finally:
        runtime.shutdown()


if __name__ == "__main__":
    main()

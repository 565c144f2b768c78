"""A durable app for the delayed-start tests, run as a subprocess (and SIGKILLed).

    python -m tests.apps.delay_app start PREFIX SECONDS  # start PREFIX-started and enqueue
                                                     # PREFIX-queued, both delayed by
                                                     # SECONDS; print "recorded" (killed -9)
    python -m tests.apps.delay_app wait PREFIX            # launch, print both results

The first process launches with wake_suspended=False and no queue of its own, so it
could never start them itself: only the second process does.
Environment: DBOS_AGENT_DATABASE_URL.
"""

from __future__ import annotations

import json
import os
import sys
import time

import dbos_agent as da

QUEUE_NAME = "delay-app"


@da.step
def clock() -> float:
    return time.time()


@da.durable_workflow
def stamped(label: str) -> list[object]:
    """Its label and when its body ran, by a recorded clock reading."""
    return [label, clock()]


def main() -> int:
    mode, prefix = sys.argv[1], sys.argv[2]
    started, queued = f"{prefix}-started", f"{prefix}-queued"
    url = os.environ["DBOS_AGENT_DATABASE_URL"]
    if mode == "start":
        with da.launch(url, executor_id=f"delay-{os.getpid()}", wake_suspended=False):
            seconds = float(sys.argv[3])
            da.start(stamped, "started", workflow_id=started, delay=seconds)
            with da.Client(url) as client:
                client.enqueue(QUEUE_NAME, "stamped", "queued", workflow_id=queued, delay=seconds)
            print("recorded", flush=True)
            time.sleep(3600)  # killed -9 here
        return 1
    da.Queue(QUEUE_NAME)
    with da.launch(url, executor_id=f"delay-{os.getpid()}"):
        results = {wid: da.retrieve(wid).result(timeout=120) for wid in (started, queued)}
        print(json.dumps(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

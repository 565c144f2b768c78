"""A durable app for the suspension tests, run as a subprocess (and SIGKILLed).

    python -m tests.apps.suspension_app start PREFIX N SECONDS  # start N sleepers, exit once
                                                            # all are SUSPENDED (killed -9)
    python -m tests.apps.suspension_app wait PREFIX N            # launch, print their results

Environment: DBOS_AGENT_DATABASE_URL, SUSP_LOG (every start of a workflow body, replays
included, is appended there with the time: counted from outside the process).
"""

from __future__ import annotations

import json
import os
import sys
import time

import dbos_agent as da
from dbos_agent.testing import Inspector

LOG = os.environ.get("SUSP_LOG", "suspension.log")


def note(kind: str, workflow_id: str) -> None:
    with open(LOG, "a", encoding="utf-8") as log:
        log.write(f"{kind} {os.getpid()} {workflow_id} {time.time():.6f}\n")


@da.step
def clock() -> float:
    return time.time()


@da.durable_workflow
def sleeper(seconds: float) -> list[float]:
    """When it fell asleep and woke up, by recorded clock readings."""
    note("body", da.current_workflow_id() or "")
    fell_asleep = clock()
    da.sleep(seconds)
    return [fell_asleep, clock()]


def main() -> int:
    mode, prefix, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    ids = [f"{prefix}-{i}" for i in range(n)]
    url = os.environ["DBOS_AGENT_DATABASE_URL"]
    with da.launch(url, executor_id=f"susp-{os.getpid()}", workers=8):
        if mode == "start":
            for wid in ids:
                da.start(sleeper, float(sys.argv[4]), workflow_id=wid)
            with Inspector(url) as db:
                while set(db.statuses(ids).values()) != {da.WorkflowStatus.SUSPENDED}:
                    time.sleep(0.05)
            print("suspended", flush=True)
            time.sleep(3600)  # killed -9 here
        results = {wid: da.retrieve(wid).result(timeout=120) for wid in ids}
        print(json.dumps(results), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

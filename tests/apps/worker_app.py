"""The application the worker tests run in
`python -m dbos_agent.worker --app tests.apps.worker_app`.

Every step execution appends ``pid wid seq start end`` to $WORKER_APP_LOG (fsynced),
so tests can check from outside who ran what, when.
"""

from __future__ import annotations

import os
import time

import dbos_agent as da

LOG = os.environ.get("WORKER_APP_LOG", "/dev/null")
STEP_SECONDS = float(os.environ.get("WORKER_APP_STEP_SECONDS", "0.1"))

work_queue = da.Queue("worker-tests", worker_concurrency=4)
limited_queue = da.Queue("worker-tests-limited", concurrency=2)
fair_queue = da.Queue("worker-tests-fair", concurrency=4)


def _log(wid: str, seq: int, start: float, end: float) -> None:
    with open(LOG, "a") as f:
        f.write(f"{os.getpid()} {wid} {seq} {start:.6f} {end:.6f}\n")
        f.flush()
        os.fsync(f.fileno())


@da.step
def chunk(i: int) -> int:
    start = time.time()
    time.sleep(STEP_SECONDS)
    wid = da.current_workflow_id() or "?"
    _log(wid, i, start, time.time())
    return i


@da.durable_workflow
def job(steps: int) -> int:
    return sum(chunk(i) for i in range(steps))

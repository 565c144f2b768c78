"""A plain application process for the failover tests (no worker daemon beside it):

    python -m tests.apps.fleet_app PREFIX N STEPS

It launches with the defaults (executor id from $FLEET_EXECUTOR, else the default
"local"), starts N jobs of STEPS steps (tests.apps.worker_app.job, which logs every step run
to $WORKER_APP_LOG), prints "started" and stays up until SIGTERM; killed -9 by the test,
its workflows must be continued by the other application process.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

import dbos_agent as da
from tests.apps.worker_app import job


def main() -> int:
    prefix, n, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    executor = os.environ.get("FLEET_EXECUTOR") or "local"
    with da.launch(os.environ["DBOS_AGENT_DATABASE_URL"], executor_id=executor):
        for i in range(n):
            da.start(job, steps, workflow_id=f"{prefix}-{i}")
        print("started", flush=True)
        stop.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

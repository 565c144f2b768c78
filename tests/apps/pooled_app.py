"""A fleet process for the pooled-URL tests, run as a subprocess (one of several) and
perhaps SIGKILLed.

    python tests/apps/pooled_app.py PREFIX N

It launches on $DBOS_AGENT_DATABASE_URL (a pooled URL; $DBOS_AGENT_SESSION_URL, when set,
is its direct one), starts N workflows ``PREFIX-000`` ... that each run three steps, wait
in ``recv`` and run a fourth step, prints ``started``, and runs (taking over what dead
peers leave) until its stdin closes. Waits stay in memory (``suspend_after``) so that a
process killed while they wait leaves PENDING workflows of its own to take over; each
process has threads enough for its own waits and a dead peer's.

Every step appends ``pid workflow_id step`` to $POOLED_LOG (fsynced): the test counts the
steps from outside the processes.
"""

from __future__ import annotations

import os
import sys

import dbos_agent as da

LOG = os.environ.get("POOLED_LOG", "pooled.log")


@da.step
def act(k: int) -> int:
    with open(LOG, "a") as f:
        f.write(f"{os.getpid()} {da.current_workflow_id()} {k}\n")
        f.flush()
        os.fsync(f.fileno())
    return k


@da.durable_workflow
def job() -> str:
    for k in range(3):
        act(k)
    message = da.recv("go", timeout=600)
    act(3)
    return str(message)


def main() -> None:
    prefix, n = sys.argv[1], int(sys.argv[2])
    runtime = da.launch(
        executor_id=f"pooled-{prefix}",
        workers=2 * n + 4,
        pool_size=6,
        suspend_after=600,
        take_over_every=0.3,
        lease_seconds=30,
    )
    with runtime:
        for i in range(n):
            da.start(job, workflow_id=f"{prefix}-{i:03d}")
        print("started", flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    main()

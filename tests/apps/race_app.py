"""A durable app for the double-run stress test (tests/process/test_no_double_run.py), run as a
subprocess:

    python -m tests.apps.race_app PREFIX N ROUNDS

It launches with every background pass (the waker's sweep, the take-back of what the
process owns but does not run) looking every few milliseconds, starts N workflows that
each do ROUNDS rounds of "a step, then a suspended recv", prints "started" and then waits
for them; the test sends the messages. Every live run of the step is appended to RACE_LOG
(one line: pid, workflow id, round), so that double runs are counted from outside.
"""

from __future__ import annotations

import os
import sys

import dbos_agent as da
from dbos_agent.testing import run_passes_every

LOG = os.environ.get("RACE_LOG", "race.log")


@da.step
def work(round_: int) -> int:
    """The side effect: one line per live run."""
    line = f"{os.getpid()} {da.current_workflow_id()} {round_}\n".encode()
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line)  # one write of a short line under O_APPEND: never interleaved
    finally:
        os.close(fd)
    return round_


@da.durable_workflow
def racer(rounds: int) -> int:
    total = 0
    for round_ in range(rounds):
        total += work(round_)
        da.recv("go", timeout=None)
    return total


def main() -> int:
    prefix, n, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    url = os.environ["DBOS_AGENT_DATABASE_URL"]
    with da.launch(url, executor_id=f"race-{os.getpid()}", workers=8, suspend_after=0):
        run_passes_every(float(os.environ.get("RACE_PASS_EVERY", "0.005")))
        handles = [da.start(racer, rounds, workflow_id=f"{prefix}-{i}") for i in range(n)]
        print("started", flush=True)
        for handle in handles:
            handle.result(timeout=600)
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

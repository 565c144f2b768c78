"""The application of the fault tests, run by worker processes and by the test itself.

Every step writes ``S pid wid seq time`` when it starts and ``E pid wid seq time`` when
it ends to $FAULT_APP_LOG (one line each, flushed and fsynced), so that the test can
tell from outside which process ran what, and when: the side effects to count. A run
of a workflow writes ``X pid wid -1 time`` when it leaves the workflow's code, however
it leaves it (returning, or stopped by the library: taken over, finished elsewhere, an
outage, a shutdown): from then on that run starts no step, which a test waits for
instead of sleeping while a process might still start one.
"""

from __future__ import annotations

import os
import time

import dbos_agent as da

LOG = os.environ.get("FAULT_APP_LOG", "/dev/null")
STEP_SECONDS = float(os.environ.get("FAULT_APP_STEP_SECONDS", "0.1"))

faults_queue = da.Queue("fault-tests")
#: The chaos scenario's queue: each process takes at most $CHAOS_PER_PROCESS of its
#: workflows, so that the work is spread over the workers and the application from the
#: start, whichever process happens to start first (tests/support/chaos.py sets it).
chaos_queue = da.Queue(
    "chaos", worker_concurrency=int(os.environ.get("CHAOS_PER_PROCESS", "1000000"))
)


def note(kind: str, wid: str, seq: int) -> None:
    """Append one line to the side-effect log."""
    with open(LOG, "a") as f:
        f.write(f"{kind} {os.getpid()} {wid} {seq} {time.time():.6f}\n")
        f.flush()
        os.fsync(f.fileno())


@da.step
def work(wid: str, i: int) -> int:
    note("S", wid, i)
    time.sleep(STEP_SECONDS)
    note("E", wid, i)
    return i * i


def ended(wid: str) -> None:
    """Note that this process's run of ``wid`` left the workflow's code (see above)."""
    note("X", wid, -1)


@da.durable_workflow
def chain(wid: str, steps: int) -> int:
    """``steps`` steps in a row; returns the sum of the squares 0..steps-1."""
    try:
        return sum(work(wid, i) for i in range(steps))
    finally:
        ended(wid)


def read_log(path: object) -> list[tuple[str, int, str, int, float]]:
    """The side-effect log: ``(kind, pid, workflow id, step, time)`` per line."""
    rows = []
    with open(str(path)) as f:
        for line in f.read().splitlines():
            kind, pid, wid, seq, at = line.split()
            rows.append((kind, int(pid), wid, int(seq), float(at)))
    return rows


def expected(steps: int) -> int:
    return sum(i * i for i in range(steps))


@da.step
def tick(wid: str, i: int) -> int:
    note("S", wid, i)
    note("E", wid, i)
    return i * i


@da.durable_workflow
def paced(wid: str, steps: int) -> int:
    """Like :func:`chain`, but the time passes in the workflow's own code, between
    quick steps: a pause then lands between steps, not inside one."""
    total = 0
    try:
        for i in range(steps):
            time.sleep(STEP_SECONDS)
            total += tick(wid, i)
    finally:
        ended(wid)
    return total


@da.durable_workflow
def waiter(wid: str, steps: int) -> str:
    """Waits for a message (suspended meanwhile), then runs ``steps`` steps; returns the
    message and the sum of the squares. (Only a run that got the message notes its end:
    a suspension in recv leaves the code too, and is no run of the steps.)"""
    message = da.recv("go", timeout=None)
    try:
        return f"{message}:{sum(work(wid, i) for i in range(steps))}"
    finally:
        ended(wid)


def main(argv: list[str] | None = None) -> int:
    """``python -m tests.apps.fault_app APP_ID COUNT STEPS``: an application process that runs
    COUNT chain workflows itself (ids APP_ID-0..), waits for them, prints their results."""
    import json
    import sys

    app_id, count, steps = (argv or sys.argv[1:])[:3]
    with da.launch(executor_id=f"app-{app_id}", workers=int(count) + 2, run_queues=False):
        handles = [
            da.start(chain, f"{app_id}-{i}", int(steps), workflow_id=f"{app_id}-{i}")
            for i in range(int(count))
        ]
        results = {h.workflow_id: h.result(timeout=600) for h in handles}
    print(json.dumps(results), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


@da.durable_workflow
def collector(wid: str, count: int) -> list[int]:
    """Receives ``count`` messages on topic "m", one recv after another (each one waits,
    suspended, until its message comes); returns them in the order received."""
    return [int(da.recv("m", timeout=None)) for _ in range(count)]


@da.durable_workflow(name="fault_child")
def child(i: int) -> int:
    """One child of :func:`spawner`: one step, logged under the child's own id."""
    wid = da.current_workflow_id()
    assert wid is not None  # in a workflow
    return work(wid, i)


@da.durable_workflow
def spawner(wid: str, children: int) -> int:
    """Starts ``children`` children one after another, the even ones with ``da.start`` and
    the odd ones through the queue (each start a recorded ``dbos_agent.start_child`` step),
    ``STEP_SECONDS`` apart in its own code, so that a fault lands between two starts;
    returns the sum of their results (the sum of the squares 0..children-1)."""
    handles = []
    for i in range(children):
        handles.append(da.start(child, i) if i % 2 == 0 else faults_queue.enqueue(child, i))
        time.sleep(STEP_SECONDS)
    return sum(int(h.result()) for h in handles)

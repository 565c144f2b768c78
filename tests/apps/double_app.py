"""A durable app for the one-run-at-a-time stress test (tests/process/test_no_double_run_async.py),
run as a subprocess and killed with SIGKILL:

    python -m tests.apps.double_app run KIND PREFIX N
    python -m tests.apps.double_app recover KIND HOW PREFIX N ROUNDS

KIND is ``async`` (an ``async def`` workflow of ``async def`` steps, run on the shared event
loop) or ``sync``. ``run`` starts N workflows ``PREFIX-0`` ... and waits for them (the test
kills it half-way). ``recover`` launches under the same executor id, so that recovery at
launch picks the pending workflows up in the background, and at once, ROUNDS times over,
asks for every one of them HOW:

- ``start``: ``da.start(flow, ..., workflow_id=X)`` (attach, or take over, or run it);
- ``retrieve``: ``da.retrieve(X).result()`` (wait on this process's run, else the database);
- ``call``: a direct call under ``da.workflow_id(X)`` (the async one awaited on the caller's
  own event loop, the sync one in a thread of its own), all of them at once.

Every background pass looks every few milliseconds (``run_passes_every``) so that recovery,
take-back and take-over meet the calls as often as possible. Every start and end of a
workflow body and every live run of a step is appended to DOUBLE_LOG as one short line
(``pid workflow-id event [position]``, one ``O_APPEND`` write, never interleaved), so that
the test sees from outside whether a body ever overlapped itself.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import dbos_agent as da
from dbos_agent.testing import run_passes_every

LOG = os.environ.get("DOUBLE_LOG", "double.log")
EXECUTOR = os.environ.get("DOUBLE_EXECUTOR", "double")
STEPS = 5
STEP_SECONDS = 0.01
RESULT_TIMEOUT = 120.0


def note(workflow_id: str, event: str) -> None:
    """One line per event, in one ``O_APPEND`` write: the file's order is the events' order."""
    line = f"{os.getpid()} {workflow_id} {event}\n".encode()
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


@da.step
async def async_work(position: int) -> int:
    note(da.current_workflow_id() or "?", f"step {position}")
    await asyncio.sleep(STEP_SECONDS)
    return position


@da.durable_workflow
async def async_flow(key: str, steps: int) -> int:
    note(key, "body-start")
    try:
        total = 0
        for position in range(steps):
            total += await async_work(position)
        return total
    finally:
        note(key, "body-end")


@da.step
def sync_work(position: int) -> int:
    note(da.current_workflow_id() or "?", f"step {position}")
    time.sleep(STEP_SECONDS)
    return position


@da.durable_workflow
def sync_flow(key: str, steps: int) -> int:
    note(key, "body-start")
    try:
        return sum(sync_work(position) for position in range(steps))
    finally:
        note(key, "body-end")


FLOWS: dict[str, Callable[..., Any]] = {"async": async_flow, "sync": sync_flow}


def _launch() -> da.Runtime:
    runtime = da.launch(os.environ["DBOS_AGENT_DATABASE_URL"], executor_id=EXECUTOR, workers=8)
    run_passes_every(0.005)
    return runtime


def run(kind: str, ids: list[str]) -> None:
    with _launch():
        handles = [da.start(FLOWS[kind], wid, STEPS, workflow_id=wid) for wid in ids]
        print("started", flush=True)
        for handle in handles:
            handle.result(timeout=RESULT_TIMEOUT)


def recover(kind: str, how: str, ids: list[str], rounds: int) -> None:
    flow = FLOWS[kind]
    if how == "call" and kind == "async":
        asyncio.run(_call_async(ids, rounds))
        return
    with _launch():
        for _ in range(rounds):
            if how == "start":
                handles = [da.start(flow, wid, STEPS, workflow_id=wid) for wid in ids]
                for handle in handles:
                    handle.result(timeout=RESULT_TIMEOUT)
            elif how == "retrieve":
                for wid in ids:
                    da.retrieve(wid).result(timeout=RESULT_TIMEOUT)
            else:
                _call_in_threads(flow, ids)
    print("done", flush=True)


def _call_in_threads(flow: Callable[..., Any], ids: list[str]) -> None:
    errors: list[BaseException] = []

    def call(wid: str) -> None:
        try:
            with da.workflow_id(wid):
                flow(wid, STEPS)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=call, args=(wid,)) for wid in ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(RESULT_TIMEOUT)
    if errors:
        raise errors[0]


async def _call_async(ids: list[str], rounds: int) -> None:
    async def call(wid: str) -> int:
        with da.workflow_id(wid):
            result: int = await async_flow(wid, STEPS)
            return result

    async with _launch():
        for _ in range(rounds):
            await asyncio.gather(*(call(wid) for wid in ids))
    print("done", flush=True)


def main() -> int:
    mode, kind = sys.argv[1], sys.argv[2]
    if mode == "run":
        prefix, n = sys.argv[3], int(sys.argv[4])
        run(kind, [f"{prefix}-{i}" for i in range(n)])
    else:
        how, prefix, n, rounds = sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6])
        recover(kind, how, [f"{prefix}-{i}" for i in range(n)], rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A plain application process for the take-over tests (tests/process/test_takeover_capacity.py):

    python -m tests.apps.takeover_app --executor E --prefix P --sync N --async M --flag F [...]

It launches (``--workers``, ``--async-runs``, ``--recover``, ``--take-over``), starts N sync
and M async workflows under ids ``P-s-i`` and ``P-a-i`` that each record a first step,
then wait in a second one until the file F exists in $TAKEOVER_DIR, then record a last one;
prints "started" and stays up until SIGTERM. ``--tracer K`` first runs a workflow of K
steps in the foreground (with every background pass looking every 5 ms and the database
clock moved past every lease and grace), then prints "traced": a window in which a pass
that takes over would have.

Every step appends ``WHAT WORKFLOW_ID PID`` to $TAKEOVER_DIR/steps.log, so that the test
counts from outside who ran what, and in which order.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path

import dbos_agent as da
from dbos_agent.testing import advance_clock, run_passes_every

DIR = Path(os.environ.get("TAKEOVER_DIR", "."))
_POLL_S = 0.01


def _log(what: str) -> None:
    with open(DIR / "steps.log", "a") as f:
        f.write(f"{what} {da.current_workflow_id()} {os.getpid()}\n")
        f.flush()
        os.fsync(f.fileno())


@da.step
def mark(what: str) -> None:
    _log(what)


@da.step
def wait_for(flag: str) -> None:
    _log("wait")
    while not (DIR / flag).exists():
        time.sleep(_POLL_S)


@da.durable_workflow(name="takeover_held")
def held(flag: str) -> str:
    mark("first")
    wait_for(flag)
    mark("last")
    return "done"


@da.step
async def amark(what: str) -> None:
    _log(what)


@da.step
async def await_for(flag: str) -> None:
    _log("wait")
    while not (DIR / flag).exists():
        await asyncio.sleep(_POLL_S)


@da.durable_workflow(name="takeover_aheld")
async def aheld(flag: str) -> str:
    await amark("first")
    await await_for(flag)
    await amark("last")
    return "done"


@da.durable_workflow(name="takeover_tracer")
def tracer(steps: int) -> int:
    for _ in range(steps):
        mark("tracer")
    return steps


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--executor", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--sync", type=int, default=0)
    parser.add_argument("--async", dest="async_", type=int, default=0)
    parser.add_argument("--flag", default="go")
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--async-runs", type=int, default=1000)
    parser.add_argument("--recover", choices=["yes", "no"], default="yes")
    parser.add_argument("--take-over", choices=["yes", "no", "default"], default="default")
    parser.add_argument("--take-over-every", type=float, default=2.0)
    parser.add_argument("--tracer", type=int, default=0)
    args = parser.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    options = da.LaunchOptions(
        executor_id=args.executor,
        workers=args.workers,
        async_runs=args.async_runs,
        recover=args.recover == "yes",
        take_over_every=args.take_over_every,
    )
    if args.take_over != "default":  # else launch's own default, whatever it is
        options = replace(options, take_over=args.take_over == "yes")
    with da.launch(None, options) as runtime:
        if args.tracer:
            run_passes_every(0.005)
            advance_clock(3600.0)  # past every lease and grace, whichever host the dead ran on
            runtime.wait_for_recovery(60)
            with da.workflow_id(f"{args.prefix}-tracer"):
                tracer(args.tracer)
            print("traced", flush=True)
        for i in range(args.sync):
            da.start(held, args.flag, workflow_id=f"{args.prefix}-s-{i}")
        for i in range(args.async_):
            da.start(aheld, args.flag, workflow_id=f"{args.prefix}-a-{i}")
        print("started", flush=True)
        stop.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

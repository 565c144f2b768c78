"""A small durable app that the crash tests run as a subprocess and kill with SIGKILL.

    python tests/apps/crashy_app.py run WORKFLOW_ID N     # run counter_flow(N) under that id
    python tests/apps/crashy_app.py run WORKFLOW_ID -1    # run family_flow (a parent and child)
    python tests/apps/crashy_app.py recover WORKFLOW_ID   # launch (recovering), wait, print result

Environment: DBOS_AGENT_DATABASE_URL, CRASHY_EXECUTOR (executor id), CRASHY_DIR (where
side effects are appended), CRASHY_KILL ("in-step-I", "after-step-I", "in-charge",
"before-finish", "after-start", "after-child" or empty): the point at which the process
SIGKILLs itself.
Side effects are appended to files and fsynced, so the test counts them from outside.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import uuid
from pathlib import Path

import dbos_agent as da

DIR = Path(os.environ.get("CRASHY_DIR", "."))
KILL = os.environ.get("CRASHY_KILL", "")
SLOW = float(os.environ.get("CRASHY_SLOW", "0"))


def _append(name: str, line: str) -> None:
    with open(DIR / name, "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def _die_if(point: str) -> None:
    if KILL == point:
        os.kill(os.getpid(), signal.SIGKILL)


@da.step
def effect(i: int) -> int:
    _append("effects.log", str(i))
    if SLOW:
        time.sleep(SLOW)
    _die_if(f"in-step-{i}")
    return i * i


def _charged(order: str) -> object:
    """The guard: look at the world (the ledger) before charging again."""
    path = DIR / "ledger.log"
    if path.exists() and order in path.read_text().split():
        return f"charged {order}"
    return da.NotDone


@da.step(idempotent=False, guard=_charged)
def charge(order: str) -> str:
    _append("ledger.log", order)
    _die_if("in-charge")
    return f"charged {order}"


@da.step(idempotent=False)
def charge_unguarded(order: str) -> str:
    _append("ledger.log", order)
    _die_if("in-charge")
    return f"charged {order}"


@da.durable_workflow
def counter_flow(n: int, guarded: bool = True) -> dict[str, object]:
    total = 0
    for i in range(n):
        total += effect(i)
        _die_if(f"after-step-{i}")
    receipt = charge("order-1") if guarded else charge_unguarded("order-1")
    _die_if("before-finish")
    return {"total": total, "receipt": receipt}


@da.durable_workflow
def child_flow() -> int:
    return effect(100)


@da.durable_workflow
def family_flow() -> int:
    """A parent that starts its child under an id it makes up on every run."""
    child = da.start(child_flow, workflow_id=f"{da.current_workflow_id()}-{uuid.uuid4()}")
    _die_if("after-start")
    result = child.result()
    _die_if("after-child")
    return result + effect(0)


def main() -> None:
    mode, wid = sys.argv[1], sys.argv[2]
    executor = os.environ.get("CRASHY_EXECUTOR", "local")
    runtime = da.launch(executor_id=executor, recover=(mode == "recover"), workers=4)
    try:
        if mode == "run":
            n = int(sys.argv[3])
            guarded = sys.argv[4] != "unguarded" if len(sys.argv) > 4 else True
            with da.workflow_id(wid):
                result = family_flow() if n < 0 else counter_flow(n, guarded)
        else:
            try:
                result = da.retrieve(wid).result(timeout=60)
            except da.DbosAgentError as exc:
                result = {"error": type(exc).__name__, "message": str(exc)}
        print(json.dumps(result), flush=True)
    finally:
        runtime.shutdown()


if __name__ == "__main__":
    main()

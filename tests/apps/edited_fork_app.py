"""A durable app whose edited fork the process tests kill with SIGKILL mid-run.

    python tests/apps/edited_fork_app.py run WORKFLOW_ID          # plan_flow(seed=2, factor=10)
    python tests/apps/edited_fork_app.py fork WORKFLOW_ID NEW_ID  # fork it from step 1, edited
    python tests/apps/edited_fork_app.py recover NEW_ID           # launch (recovering), wait

The fork replaces step 0's output with Plan(n=5) and the input factor with 3. Environment:
DBOS_AGENT_DATABASE_URL, EDITED_EXECUTOR (executor id), EDITED_DIR (where each step appends
what it did, fsynced, for the test to count from outside), EDITED_KILL ("in-act-I":
the point at which the process SIGKILLs itself).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from pydantic import BaseModel

import dbos_agent as da

DIR = Path(os.environ.get("EDITED_DIR", "."))
KILL = os.environ.get("EDITED_KILL", "")


class Plan(BaseModel):
    n: int


def _append(line: str) -> None:
    with open(DIR / "effects.log", "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


@da.step
def plan(seed: int) -> Plan:
    _append(f"plan {seed}")
    return Plan(n=seed)


@da.step
def act(i: int, n: int) -> int:
    _append(f"act {i} {n}")
    if KILL == f"in-act-{i}":
        os.kill(os.getpid(), signal.SIGKILL)
    return i * n


@da.durable_workflow
def plan_flow(seed: int, factor: int) -> list[int]:
    n = plan(seed).n * factor
    return [act(0, n), act(1, n)]


def main() -> None:
    mode, wid = sys.argv[1], sys.argv[2]
    executor = os.environ.get("EDITED_EXECUTOR", "local")
    runtime = da.launch(executor_id=executor, recover=(mode == "recover"), workers=2)
    try:
        if mode == "run":
            result = da.start(plan_flow, 2, 10, workflow_id=wid).result(timeout=60)
        elif mode == "fork":
            handle = da.operations.fork(
                wid,
                1,
                new_workflow_id=sys.argv[3],
                inputs={"factor": 3},
                replace={"0:plan": {"n": 5}},
                by="crash-test",
            )
            result = handle.result(timeout=60)
        else:
            result = da.retrieve(wid).result(timeout=60)
        print(json.dumps(result), flush=True)
    finally:
        runtime.shutdown()


if __name__ == "__main__":
    main()

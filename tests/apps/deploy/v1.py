"""Version 1: prepare, wait for the approval, apply."""

from __future__ import annotations

import dbos_agent as da
from tests.apps.deploy import note, start_and_wait_until_suspended


@da.step(name="prepare")
def prepare() -> str:
    note("v1", "prepare")
    return "prepared"


@da.step(name="apply")
def apply(decision: str) -> str:
    note("v1", "apply")
    return f"applied after {decision}"


@da.durable_workflow(name="deploy_flow")
def approval_flow() -> list[str]:
    done = [prepare()]
    done.append(str(da.recv("approve", timeout=None)))
    done.append(apply(done[-1]))
    return done


if __name__ == "__main__":
    raise SystemExit(start_and_wait_until_suspended(approval_flow))

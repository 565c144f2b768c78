"""Version 3: the audit step added behind ``da.patched``: new runs audit, the logs of
version 1 replay as they were recorded."""

from __future__ import annotations

import dbos_agent as da
from tests.apps.deploy import note, start_and_wait_until_suspended


@da.step(name="audit")
def audit() -> str:
    note("v3", "audit")
    return "audited"


@da.step(name="prepare")
def prepare() -> str:
    note("v3", "prepare")
    return "prepared"


@da.step(name="apply")
def apply(decision: str) -> str:
    note("v3", "apply")
    return f"applied after {decision}"


@da.durable_workflow(name="deploy_flow")
def approval_flow() -> list[str]:
    done = []
    if da.patched("audit-first"):
        done.append(audit())
    done.append(prepare())
    done.append(str(da.recv("approve", timeout=None)))
    done.append(apply(done[-1]))
    return done


if __name__ == "__main__":
    raise SystemExit(start_and_wait_until_suspended(approval_flow))

"""The code `bench_check_deploy.py` checks: an agent of 20 tool steps that then waits for
a message, as the workflows it fills the database with recorded it."""

from __future__ import annotations

import dbos_agent as da


@da.step(name="bench_check.tool")
def tool(turn: int) -> dict[str, object]:
    return {"turn": turn, "text": "ok"}


@da.durable_workflow(name="bench_check.agent")
def agent(task: str, turns: int) -> str:
    for turn in range(turns):
        tool(turn)
    return str(da.recv("approve", timeout=None))

"""A kill -9 inside a step after its set_event and close_stream, before its checkpoint:
neither happened; the recovered run makes them once, with its own checkpoint."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import dbos_agent as da
from dbos_agent._engine.runtime.core import Engine
from dbos_agent.records import StepStatus
from tests.helpers import new_id
from tests.processes import output
from tests.support import zygote

APP = Path(__file__).parents[1] / "apps" / "step_effects_app.py"


def _env(url: str, executor: str, run: str, kill: bool) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DBOS_AGENT_DATABASE_URL=url,
        EFFECTS_EXECUTOR=executor,
        EFFECTS_RUN=run,
        EFFECTS_KILL="1" if kill else "",
        PYTHONPATH=str(APP.parents[2]),
    )
    return env


def test_a_kill_inside_the_step_sets_nothing_and_recovery_sets_it_once(
    runtime: da.Runtime, engine: Engine
) -> None:
    url, wid, executor = engine.db.url, new_id("effects-crash"), new_id("executor")
    killed = zygote.run(
        [sys.executable, str(APP), "run", wid],
        env=_env(url, executor, "killed", kill=True),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert killed.returncode == -signal.SIGKILL, output(killed)
    assert engine.db.messages.get_event(wid, "ran") is None
    rows, _ = engine.db.streams.read(wid, "out", 0)
    assert [(r.kind, r.value) for r in rows] == [("value", '"killed"')]  # live, no close
    assert da.operations.list_steps(wid) == []

    recovered = zygote.run(
        [sys.executable, str(APP), "recover", wid],
        env=_env(url, executor, "recovered", kill=False),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert recovered.returncode == 0, output(recovered)
    assert json.loads(recovered.stdout) == "recovered"
    assert da.get_event(wid, "ran", timeout=0) == "recovered"
    rows, _ = engine.db.streams.read(wid, "out", 0)
    assert [(r.kind, r.value) for r in rows] == [
        ("value", '"killed"'),
        ("reset", None),  # the killed attempt's items are void
        ("value", '"recovered"'),
        ("close", None),
    ]
    (step,) = da.operations.list_steps(wid)  # the step alone: no set_event or close step
    assert step.status is StepStatus.SUCCESS and step.output == "recovered"
    assert [i.value for i in da.read_stream(wid, "out", timeout=10)] == [
        "killed",
        None,
        "recovered",
    ]

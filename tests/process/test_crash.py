"""Real crashes: a subprocess is killed with SIGKILL at many points, a fresh one recovers.

Side effects are counted from outside the process (files the app appends and
fsyncs); step records from the database.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dbos_agent.testing import Inspector
from tests.helpers import new_id, wait_until
from tests.processes import output
from tests.support import zygote

APP = Path(__file__).parents[1] / "apps" / "crashy_app.py"
N = 4
EXPECTED_TOTAL = sum(i * i for i in range(N))


def _env(url: str, workdir: Path, executor: str, kill: str = "", slow: float = 0) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DBOS_AGENT_DATABASE_URL=url,
        CRASHY_DIR=str(workdir),
        CRASHY_EXECUTOR=executor,
        CRASHY_KILL=kill,
        CRASHY_SLOW=str(slow),
        PYTHONPATH=str(APP.parents[2]),
    )
    return env


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return zygote.run(
        [sys.executable, str(APP), *args], env=env, capture_output=True, text=True, timeout=120
    )


def _lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def _steps(url: str, wid: str) -> list[tuple[int, str, str]]:
    with Inspector(url) as db:
        return [(s.seq, s.name, str(s.status)) for s in db.steps(wid)]


def _status(url: str, wid: str) -> str:
    with Inspector(url) as db:
        status = db.status(wid)
    assert status is not None
    return str(status)


KILL_POINTS = [
    *(f"in-step-{i}" for i in range(N)),
    *(f"after-step-{i}" for i in range(N)),
    "in-charge",
    "before-finish",
]


@pytest.mark.parametrize(
    ("kill", "database_url"),
    [
        *((kill, "direct") for kill in KILL_POINTS),
        # through pgbouncer in transaction mode: a step cut off, and the guarded charge
        *((kill, "pooled") for kill in ("in-step-1", "in-charge")),
    ],
    indirect=["database_url"],
)
def test_killed_at_each_point_then_recovered(kill: str, database_url: str, tmp_path: Path) -> None:
    url, wid, executor = database_url, new_id("crash"), new_id("executor")
    crashed = _run(["run", wid, str(N)], _env(url, tmp_path, executor, kill))
    assert crashed.returncode == -signal.SIGKILL, output(crashed)
    assert _status(url, wid) == "PENDING"

    recovered = _run(["recover", wid], _env(url, tmp_path, executor))
    assert recovered.returncode == 0, output(recovered)
    assert json.loads(recovered.stdout) == {"total": EXPECTED_TOTAL, "receipt": "charged order-1"}
    assert _status(url, wid) == "SUCCESS"

    effects = _lines(tmp_path / "effects.log")
    # Every step that completed ran exactly once; the one cut off inside (before
    # its checkpoint) ran again on recovery: at-least-once for unrecorded steps.
    for i in range(N):
        expected = 2 if kill == f"in-step-{i}" else 1
        assert effects.count(str(i)) == expected, (kill, effects)
    # The guarded non-idempotent charge happened exactly once whatever the point.
    assert _lines(tmp_path / "ledger.log") == ["order-1"]
    steps = _steps(url, wid)
    assert [s[0] for s in steps] == list(range(N + 1))
    assert all(status == "SUCCESS" for _, _, status in steps)


@pytest.mark.parametrize("kill", ["after-start", "in-step-100", "after-child", "in-step-0"])
def test_a_parent_killed_around_its_childs_start_finds_the_same_child(
    kill: str, dbos_agent_database_url: str, tmp_path: Path
) -> None:
    """The child's id is made up (uuid4) on every run of the parent's body: recorded as
    the parent's step before the child starts, the recovered parent finds the same child."""
    url, wid, executor = dbos_agent_database_url, new_id("family"), new_id("executor")
    crashed = _run(["run", wid, "-1"], _env(url, tmp_path, executor, kill))
    assert crashed.returncode == -signal.SIGKILL, output(crashed)

    recovered = _run(["recover", wid], _env(url, tmp_path, executor))
    assert recovered.returncode == 0, output(recovered)
    assert json.loads(recovered.stdout) == 100 * 100
    with Inspector(url) as db:
        children = [w.workflow_id for w in db.workflows() if w.workflow_id.startswith(f"{wid}-")]
    assert len(children) == 1, children
    effects = _lines(tmp_path / "effects.log")
    assert effects.count("100") == (2 if kill == "in-step-100" else 1), effects
    assert effects.count("0") == (2 if kill == "in-step-0" else 1), effects


def test_unguarded_non_idempotent_step_killed_mid_call_stops_in_doubt(
    dbos_agent_database_url: str, tmp_path: Path
) -> None:
    url, wid, executor = dbos_agent_database_url, new_id("doubt"), new_id("executor")
    crashed = _run(["run", wid, "1", "unguarded"], _env(url, tmp_path, executor, "in-charge"))
    assert crashed.returncode == -signal.SIGKILL
    assert _steps(url, wid)[-1] == (1, "charge_unguarded", "PENDING")  # the intent

    recovered = _run(["recover", wid], _env(url, tmp_path, executor))
    assert recovered.returncode == 0, output(recovered)
    outcome = json.loads(recovered.stdout)
    assert outcome["error"] == "StepInDoubtError" and "step 1" in outcome["message"]
    assert _status(url, wid) == "IN_DOUBT"
    assert _lines(tmp_path / "ledger.log") == ["order-1"], "the effect must not be repeated"


def test_killed_from_outside_at_random_moments(
    dbos_agent_database_url: str, tmp_path: Path
) -> None:
    """The parent kills the app while it is somewhere in its steps, several times over."""
    url, wid, executor = dbos_agent_database_url, new_id("outside"), new_id("executor")
    n = 12
    env = _env(url, tmp_path, executor, slow=0.05)
    for round_ in range(3):
        mode = ["run", wid, str(n)] if round_ == 0 else ["recover", wid]
        proc = zygote.popen(
            [sys.executable, str(APP), *mode],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        target = len(_lines(tmp_path / "effects.log")) + 3

        def three_more_or_done(n: int = target, app: subprocess.Popen[str] = proc) -> bool:
            return len(_lines(tmp_path / "effects.log")) >= n or app.poll() is not None

        wait_until(three_more_or_done, 60, "3 more steps", every=0.01)
        time.sleep(0.013 * (round_ + 1))  # not a wait: lands the kill at another offset
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
    finished = _run(["recover", wid], env)
    assert finished.returncode == 0, output(finished)
    assert json.loads(finished.stdout)["total"] == sum(i * i for i in range(n))
    effects = _lines(tmp_path / "effects.log")
    recorded = {seq for seq, name, _ in _steps(url, wid) if name == "effect"}
    assert recorded == set(range(n))
    # each step ran at least once, and at most once more per kill (3 kills)
    assert all(1 <= effects.count(str(i)) for i in range(n))
    assert len(effects) <= n + 3
    assert _lines(tmp_path / "ledger.log") == ["order-1"]

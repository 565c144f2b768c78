"""An edited fork killed with SIGKILL mid-run and recovered by a fresh process replays its
edits, not the original's log: the replaced output and the edited inputs hold across the
crash. Side effects are counted from outside the process (a file the app fsyncs)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from dbos_agent import Client
from tests.helpers import new_id
from tests.processes import output
from tests.support import zygote

APP = Path(__file__).parents[1] / "apps" / "edited_fork_app.py"


def _run(args: list[str], url: str, workdir: Path, executor: str, kill: str = "") -> str:
    env = dict(os.environ)
    env.update(
        DBOS_AGENT_DATABASE_URL=url,
        EDITED_DIR=str(workdir),
        EDITED_EXECUTOR=executor,
        EDITED_KILL=kill,
        PYTHONPATH=str(APP.parents[2]),
    )
    done = zygote.run(
        [sys.executable, str(APP), *args], env=env, capture_output=True, text=True, timeout=120
    )
    if kill:
        assert done.returncode == -signal.SIGKILL, output(done)
    else:
        assert done.returncode == 0, output(done)
    return done.stdout.strip()


def test_an_edited_fork_replays_its_edits_after_a_kill(
    dbos_agent_database_url: str, tmp_path: Path
) -> None:
    url, wid, fork, executor = dbos_agent_database_url, new_id(), new_id("fork"), new_id("ex")
    assert _run(["run", wid], url, tmp_path, executor) == "[0, 20]"
    _run(["fork", wid, fork], url, tmp_path, executor, kill="in-act-1")
    assert _run(["recover", fork], url, tmp_path, executor) == "[0, 15]"
    effects = (tmp_path / "effects.log").read_text().split("\n")
    # The original: plan, act 0, act 1 with n = 2 * 10. The fork runs act 0 once and act 1
    # until it is recorded, all with n = 5 * 3; it never plans again.
    assert effects[:3] == ["plan 2", "act 0 20", "act 1 20"]
    assert effects[3:5] == ["act 0 15", "act 1 15"] and set(effects[5:]) <= {"act 1 15", ""}
    with Client(url) as client:
        steps = client.list_steps(fork)
        assert [(s.seq, s.name, s.output) for s in steps] == [
            (0, "plan", {"n": 5}),
            (1, "act", 0),
            (2, "act", 15),
        ]
        assert client.get_workflow(fork).inputs == {"seed": 2, "factor": 3}
        assert [(e["kind"], e["by"]) for e in client.edits(fork)] == [
            ("inputs", "crash-test"),
            ("output", "crash-test"),
        ]

"""The CLI for a newcomer: an orphan left by a killed process reads as one, a stream is
followed from a moment before its workflow starts, the library's own steps are folded
out of the steps table (``--all`` shows them)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import dbos_agent as da
from dbos_agent.testing import Inspector
from dbos_agent.testing.plugin import fresh_database
from tests.helpers import CHECKOUT, cli, new_id, ok, refused
from tests.processes import output
from tests.support import zygote

CRASHY_APP = CHECKOUT / "tests" / "apps" / "crashy_app.py"


@da.step
def shout(word: str) -> str:
    return word.upper()


@da.durable_workflow(name="cli_waiting_chatty")
def chatty(word: str) -> str:
    """Two stream writes and a patch's marker (the library's steps) around a step of its
    own: ``workflows steps`` shows the step and folds the rest into a line."""
    da.write_stream("out", "thinking")
    loud = shout(word) if da.patched("shout-first") else word
    da.write_stream("out", loud)
    return loud


@da.durable_workflow(name="cli_waiting_ticker")
def ticker(n: int) -> int:
    for i in range(n):
        da.write_stream("ticks", i)
    return n


def test_an_orphan_left_by_a_killed_process_says_so(
    dbos_agent_postgres_url: str, tmp_path: Path
) -> None:
    """Killed -9 after its second step, with no other process that has its function (a
    database of its own): PENDING, and read as an orphan at once (its process is gone
    from this host and its lock free), not as running."""
    wid, executor = new_id("orphan"), new_id("executor")
    with fresh_database(dbos_agent_postgres_url) as url:
        env = {
            **os.environ,
            "DBOS_AGENT_DATABASE_URL": url,
            "CRASHY_DIR": str(tmp_path),
            "CRASHY_EXECUTOR": executor,
            "CRASHY_KILL": "after-step-1",
            "PYTHONPATH": str(CHECKOUT),
        }
        crashed = zygote.run(
            [sys.executable, str(CRASHY_APP), "run", wid, "4"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert crashed.returncode == -signal.SIGKILL, output(crashed)
        with Inspector(url) as inspector:
            pid = inspector.owner_pid(wid)  # its process is gone; its session's row stays
        document = json.loads(ok(cli(url, "workflows", "show", wid, "--json")))
        assert document["status"] == "PENDING"
        waiting = document["waiting"]
        assert (waiting["kind"], waiting["step"], waiting["until"]) == ("orphan", None, None)
        assert waiting["text"].startswith(
            f"a live process with its function to take it over: its owner (executor "
            f"{executor!r}, pid {pid} on "
        )
        assert waiting["text"].endswith(") is gone")
        listed = ok(cli(url, "workflows", "list")).splitlines()
        [row] = [line for line in listed if line.startswith(wid + " ")]
        assert row.endswith(f"orphan: {waiting['text']}")


def test_stream_follow_waits_for_a_workflow_started_after_it(
    runtime: da.Runtime, dbos_agent_database_url: str
) -> None:
    url, wid = dbos_agent_database_url, new_id("ticker")
    env = {k: v for k, v in os.environ.items() if k != "DBOS_AGENT_DATABASE_URL"}
    env.update(DBOS_AGENT_DATABASE_URL=url, PYTHONPATH=str(CHECKOUT))
    follower = zygote.popen(
        [sys.executable, "-m", "dbos_agent", "stream", wid, "ticks", "--follow"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert follower.stderr is not None
        note = follower.stderr.readline()  # it looked, found nothing, and waits
        assert note == f"dbos-agent: waiting for workflow {wid!r} to start (up to 60 s)\n", note
        da.start(ticker, 3, workflow_id=wid).result(timeout=30)
        out, err = follower.communicate(timeout=60)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.communicate()
    assert follower.returncode == 0, (out, note + err)
    assert out.split() == ["0", "1", "2"]

    missing = cli(url, "stream", new_id("never"), "ticks", "--follow", "--timeout", "0.5")
    refused(missing, 1, "no workflow with id 'never-")


def test_the_librarys_own_steps_are_folded_unless_all(
    runtime: da.Runtime, dbos_agent_database_url: str
) -> None:
    url, wid = dbos_agent_database_url, new_id("chatty")
    with da.workflow_id(wid):
        assert chatty("hi") == "HI"
    names = ["dbos_agent.write_stream", "dbos_agent.patch:shout-first", "shout"]
    names.append("dbos_agent.write_stream")
    folded = (
        "3 library steps folded: dbos_agent.write_stream (2), dbos_agent.patch:shout-first; "
        "--all shows them"
    )

    lines = ok(cli(url, "workflows", "steps", wid)).splitlines()
    assert lines[0].split()[:3] == ["SEQ", "NAME", "STATUS"]
    assert [line.split()[:2] for line in lines[1:-1]] == [["2", "shout"]]
    assert lines[-1] == folded
    every = ok(cli(url, "workflows", "steps", wid, "--all")).splitlines()
    assert [line.split()[1] for line in every[1:]] == names
    assert "folded" not in "\n".join(every)

    shown = ok(cli(url, "workflows", "show", wid)).splitlines()
    assert "Steps (4)" in shown and shown[-1] == folded
    assert len(ok(cli(url, "workflows", "show", wid, "--all")).splitlines()) == len(shown) + 2

    documents = json.loads(ok(cli(url, "workflows", "steps", wid, "--json")))
    assert [(s["name"], s["internal"]) for s in documents] == [
        (name, name.startswith("dbos_agent.")) for name in names
    ]

    refused(
        cli(url, "steps", wid),
        2,
        "invalid choice: "
        f"'{wid}' (choose from 'resolve'); a workflow's steps are listed by "
        "`dbos-agent workflows steps ID`",
    )

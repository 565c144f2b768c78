"""The dbos-agent CLI, run as users run it: a subprocess that has only the database URL.

The workflows are created (and, after a resume or fork, run) by this test
process, which has the functions; the CLI process never imports them.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

import dbos_agent as da
from dbos_agent._engine.runtime.core import Engine
from dbos_agent._engine.runtime.current import current_engine
from dbos_agent._engine.runtime.registry import code_version
from dbos_agent.testing import Inspector, RowCounts
from dbos_agent.testing.plugin import fresh_database
from tests.apps.diverging import hold_diverged
from tests.helpers import SimulatedCrash, cli, new_id, ok, per_test, refused, wait_until
from tests.processes import ROOT, output, start_worker, stop_workers
from tests.support import zygote

RUNS: Counter[str] = per_test(Counter())
PAUSE: dict[str, threading.Event] = per_test({})
PAUSED: dict[str, threading.Event] = per_test({})
CRASH: set[str] = per_test(set())


@da.step
def ask(prompt: str) -> dict[str, Any]:
    """Stands in for a model call: returns a recorded Anthropic Message."""
    RUNS[f"ask:{prompt}"] += 1
    return {
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": [{"type": "text", "text": f"reply to {prompt}"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 1000, "output_tokens": 50},
    }


@da.step
def act(key: str, i: int) -> int:
    RUNS[f"{key}:{i}"] += 1
    return i * 10


@da.durable_workflow
def chat(key: str, turns: int) -> list[int]:
    ask(key)
    done = []
    for i in range(turns):
        if (pause := PAUSE.get(f"{key}:{i}")) is not None:
            PAUSED[f"{key}:{i}"].set()
            assert pause.wait(10)
        done.append(act(key, i))
    return done


@da.step(idempotent=False)
def charge(key: str) -> str:
    RUNS[f"charge:{key}"] += 1
    if key in CRASH:
        raise SimulatedCrash()  # after the effect, before the checkpoint
    return f"charged {key}"


@da.durable_workflow
def billing(key: str) -> str:
    return charge(key)


@da.durable_workflow
def approval(key: str) -> str:
    return f"{key}: {da.recv('approval', timeout=20)}"


@da.durable_workflow
def waits_long(key: str) -> str:
    return f"{key}: {da.recv('go', timeout=3600)}"


def test_help_version_and_usage_errors(tmp_path: Path) -> None:
    out = ok(cli(None, "--help", cwd=tmp_path))
    for command in ("migrate", "workflows", "steps", "send", "worker", "versions", "exit status"):
        assert command in out
    assert "--from-step N" in ok(cli(None, "workflows", "fork", "--help", cwd=tmp_path))
    assert ok(cli(None, "--version", cwd=tmp_path)).strip() == f"dbos-agent {da.__version__}"
    assert "--app" in ok(cli(None, "worker", "--help", cwd=tmp_path))
    refused(cli(None, cwd=tmp_path), 2, "the following arguments are required: COMMAND")
    refused(cli(None, "workflows", "list", "--status", "DONE", cwd=tmp_path), 2, "argument")
    refused(cli(None, "versions", "--wider", cwd=tmp_path), 2, "unrecognized arguments")
    refused(cli(None, "workflows", "list", "--since", "yesterday", cwd=tmp_path), 2, "argument")
    refused(cli(None, "steps", "resolve", "wf", "0", cwd=tmp_path), 2, "one of the arguments")
    refused(
        cli(None, "steps", "resolve", "wf", "0", "--rerun", "--result", "1", cwd=tmp_path),
        2,
        "argument --result: not allowed with argument --rerun",
    )
    assert not (tmp_path / ".dbos_agent").exists(), "usage errors never touch a database"


def test_list_show_and_steps(runtime: da.Runtime, dbos_agent_database_url: str) -> None:
    url, key = dbos_agent_database_url, new_id()
    with da.workflow_id(key):
        assert chat(key, 2) == [0, 10]
    other = da.start(chat, f"{key}-b", 0, workflow_id=f"{key}-b")
    other.result(timeout=10)
    filters = ("--name", "chat", "--executor", runtime.executor_id)

    table = ok(cli(url, "workflows", "list", *filters)).splitlines()
    assert table[0].split() == [
        "WORKFLOW", "ID", "NAME", "STATUS", "EXECUTOR", "CREATED", "(UTC)", "DURATION",
        "RECOVERIES", "APP", "VERSION",
    ]  # fmt: skip
    assert [line.split()[0] for line in table[1:]] == [f"{key}-b", key]
    listed = json.loads(
        ok(cli(url, "workflows", "list", *filters, "--status", "success", "--json"))
    )
    assert [w["workflow_id"] for w in listed] == [f"{key}-b", key]
    assert listed[1]["inputs"] == {"key": key, "turns": 2} and listed[1]["status"] == "SUCCESS"
    assert listed[1]["output"] == [0, 10]  # the table reads neither; the JSON has both
    assert json.loads(ok(cli(url, "--json", "workflows", "list", *filters, "--until", "1h"))) == []

    shown = ok(cli(url, "workflows", "show", key))
    assert f"Workflow    {key}" in shown and "Status      SUCCESS" in shown
    assert "Output      [0, 10]" in shown
    assert "Tokens      1000 in, 50 out over 1 model call(s)" in shown
    assert '[end_turn] "reply to' in shown and "Steps (3)" in shown
    document = json.loads(ok(cli(url, "workflows", "show", key, "--json")))
    assert document["output"] == [0, 10] and document["forked_from"] is None
    assert document["usage"]["input_tokens"] == 1000 and document["usage"]["model_calls"] == 1
    assert [s["name"] for s in document["steps"]] == ["ask", "act", "act"]

    steps = json.loads(ok(cli(url, "workflows", "steps", key, "--json")))
    assert [(s["seq"], s["status"], s["output"]) for s in steps][1:] == [
        (1, "SUCCESS", 0),
        (2, "SUCCESS", 10),
    ]
    assert steps[0]["tokens"] == {"input": 1000, "output": 50}
    assert all(s["duration_ms"] >= 0 for s in steps)
    lines = ok(cli(url, "workflows", "steps", key)).splitlines()
    assert lines[0].split()[:3] == ["SEQ", "NAME", "STATUS"] and len(lines) == 4

    refused(cli(url, "workflows", "show", "no-such-id"), 1, "no workflow with id 'no-such-id'")


def test_cancel_and_resume_from_the_cli(
    runtime: da.Runtime, engine: Engine, dbos_agent_database_url: str
) -> None:
    """The CLI's cancel reaches the running process by NOTIFY: no further step starts.
    Its resume leaves the run to a process with the function: here this one, whose
    take-over hears of it at once."""
    url, key = dbos_agent_database_url, new_id()
    assert engine.notifications.listening.wait(10)
    PAUSE[f"{key}:1"], PAUSED[f"{key}:1"] = threading.Event(), threading.Event()
    handle = da.start(chat, key, 3, workflow_id=key)
    assert PAUSED[f"{key}:1"].wait(10)

    assert "cancelled " + key + " (it was PENDING)" in ok(cli(url, "workflows", "cancel", key))
    assert handle.status() == da.WorkflowStatus.CANCELLED
    wait_until(lambda: engine.runs.cancel_flagged(key), 10, "the cancel NOTIFY", every=0.01)
    PAUSE[f"{key}:1"].set()
    with pytest.raises(da.WorkflowCancelledError):
        handle.result(timeout=10)
    assert RUNS[f"{key}:1"] == 0, "the step after the cancel never started"
    again = json.loads(ok(cli(url, "workflows", "cancel", key, "--json")))
    assert again == {
        "workflow_id": key, "status": "CANCELLED", "previous_status": "CANCELLED", "changed": False
    }  # fmt: skip

    resumed = json.loads(ok(cli(url, "workflows", "resume", key, "--json")))
    assert resumed["previous_status"] == "CANCELLED"
    assert resumed["executor_id"] == runtime.executor_id
    assert da.retrieve(key).result(timeout=10) == [0, 10, 20]
    assert RUNS == Counter({f"ask:{key}": 1, f"{key}:0": 1, f"{key}:1": 1, f"{key}:2": 1})


def test_fork_and_resolve_from_the_cli(runtime: da.Runtime, dbos_agent_database_url: str) -> None:
    url, key = dbos_agent_database_url, new_id()
    with da.workflow_id(key):
        chat(key, 3)
    fork_id = f"{key}-fork"
    forked = json.loads(
        ok(cli(url, "workflows", "fork", key, "--from-step", "2", "--id", fork_id, "--json"))
    )
    assert forked["workflow_id"] == fork_id and forked["copied_steps"] == 2
    info = da.retrieve(fork_id).get_info()
    assert (info.inputs, info.executor_id) == ({"key": key, "turns": 3}, runtime.executor_id)
    assert "Forked from  " + key + " at step 2" in ok(cli(url, "workflows", "show", fork_id))
    # the CLI has no workflow code: this process's take-over runs the fork at once
    assert da.retrieve(fork_id).result(timeout=10) == [0, 10, 20]
    assert RUNS == Counter({f"ask:{key}": 1, f"{key}:0": 1, f"{key}:1": 2, f"{key}:2": 2})
    assert da.retrieve(key).status() == da.WorkflowStatus.SUCCESS

    billed = new_id("bill")
    CRASH.add(billed)
    with pytest.raises(SimulatedCrash), da.workflow_id(billed):
        billing(billed)
    CRASH.clear()
    with pytest.raises(da.errors.StepInDoubtError) as in_doubt, da.workflow_id(billed):
        billing(billed)
    command = f"dbos-agent steps resolve {billed} 0 --result JSON"
    assert command in str(in_doubt.value), "the error names the command that resolves it"
    shown = ok(cli(url, "workflows", "steps", billed))
    assert "intent, no result (in doubt)" in shown
    out = ok(cli(url, "steps", "resolve", billed, "0", "--result", '"charged by hand"'))
    assert f"resolved step 0 of {billed}" in out
    assert da.retrieve(billed).result(timeout=10) == "charged by hand"
    assert RUNS[f"charge:{billed}"] == 1


def _snapshot(db: Inspector, prefix: str) -> list[tuple[da.WorkflowInfo, RowCounts]]:
    """Every workflow whose id starts with ``prefix`` (a fork would too), with its rows."""
    found = sorted(
        (w for w in db.workflows() if w.workflow_id.startswith(prefix)),
        key=lambda w: w.workflow_id,
    )
    return [(w, db.rows_of(w.workflow_id)) for w in found]


def test_refusals_change_nothing(
    runtime: da.Runtime, inspector: Inspector, dbos_agent_database_url: str
) -> None:
    url, key = dbos_agent_database_url, new_id()
    with da.workflow_id(key):
        chat(key, 1)
    before = _snapshot(inspector, key)
    refused(cli(url, "workflows", "cancel", key), 1, "already finished with status SUCCESS")
    assert "nothing to resume" in ok(cli(url, "workflows", "resume", key))  # as DBOS
    refused(cli(url, "workflows", "fork", key, "--from-step", "0", "--id", key), 1, "taken")
    refused(cli(url, "steps", "resolve", key, "0", "--rerun"), 1, "no in-doubt step 0")
    refused(cli(url, "steps", "resolve", key, "0", "--result", "{nope"), 2, "not valid JSON")
    missing = f"{key}-missing"
    for args in (
        ["workflows", "cancel", missing],
        ["workflows", "resume", missing],
        ["workflows", "fork", missing, "--from-step", "0"],
        ["workflows", "steps", missing],
        ["send", missing, "hello"],
    ):
        refused(cli(url, *args), 1, f"no workflow with id '{missing}'")
    assert _snapshot(inspector, key) == before


def test_database_errors_are_clear_and_name_no_password(dbos_agent_postgres_url: str) -> None:
    unreachable = "postgresql://alice:s3cret-pw@127.0.0.1:1/nowhere"
    result = cli(unreachable, "workflows", "list")
    refused(result, 1, "cannot connect to the dbos_agent database at postgresql://alice:***@")
    assert "s3cret-pw" not in result.stderr
    with fresh_database(dbos_agent_postgres_url) as empty:
        refused(
            cli(empty, "workflows", "list"),
            1,
            f"has no dbos_agent schema; run `dbos-agent migrate --database-url {empty}`",
        )
        assert "migrated from version 0 to" in ok(cli(empty, "migrate"))
        assert json.loads(ok(cli(empty, "workflows", "list", "--json"))) == []
        assert json.loads(ok(cli(empty, "versions", "--json"))) == []
        assert ok(cli(empty, "versions")) == "no unfinished workflows and no live sessions\n"


def test_send_from_the_cli(runtime: da.Runtime, dbos_agent_database_url: str) -> None:
    key = new_id()
    handle = da.start(approval, key, workflow_id=key)
    out = ok(cli(dbos_agent_database_url, "send", key, '{"approved": true}', "--topic", "approval"))
    assert f"to {key} on topic 'approval'" in out
    assert handle.result(timeout=20) == f"{key}: {{'approved': True}}"


def test_the_worker_command_takes_the_workers_options(
    tmp_path: Path, dbos_agent_database_url: str
) -> None:
    """``dbos-agent worker`` is the daemon's own parser, with --database-url before or after."""
    out = ok(cli(None, "worker", "--help", cwd=tmp_path))
    assert "--app MODULE[:OBJECT]" in out and "--lease LEASE" in out and "--retention" in out
    refused(cli(None, "worker", "--lease", "soon", cwd=tmp_path), 2, "argument --lease")
    given, ignored = "postgresql://u:pw@127.0.0.1:1/given", "postgresql://u:pw@127.0.0.1:2/ignored"
    for args in (
        ["--database-url", given, "worker", "--app", "tests.apps.worker_app"],
        ["worker", "--app", "tests.apps.worker_app", "--database-url", given],
    ):
        result = cli(ignored, *args, cwd=ROOT)
        assert result.returncode == 1, output(result)
        assert "127.0.0.1:1/given" in result.stderr and "ignored" not in result.stderr
    # Before the command, on a real database: it runs, and stops cleanly on SIGTERM.
    env = {k: v for k, v in os.environ.items() if k != "DBOS_AGENT_DATABASE_URL"}
    command = [
        "--database-url",
        dbos_agent_database_url,
        "worker",
        "--app",
        "tests.apps.worker_app",
    ]
    worker = zygote.popen(
        [sys.executable, "-m", "dbos_agent", *command, "--poll", "0.2"],
        env={**env, "DBOS_AGENT_DATABASE_URL": ignored, "PYTHONPATH": str(ROOT)},
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert worker.stderr is not None
        while "started" not in (line := worker.stderr.readline()):
            assert line, "the worker exited before it started"
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0
    finally:
        worker.kill()
        worker.wait()


def test_only_migrate_creates_a_database(tmp_path: Path) -> None:
    """In a folder without ./.dbos_agent and no URL, reading commands refuse (exit 1),
    naming the folder they looked in and how to point elsewhere, and create nothing."""
    folder = tmp_path / ".dbos_agent"
    for args in (["workflows", "list"], ["workflows", "show", "x"], ["gc", "--older-than", "1d"]):
        result = cli(None, *args, cwd=tmp_path)
        refused(result, 1, f"no embedded Postgres in {folder}/")
        assert "--database-url" in result.stderr and "$DBOS_AGENT_DATABASE_URL" in result.stderr
    refused(cli(None, "--json", "workflows", "list", cwd=tmp_path), 1, str(folder))
    assert not folder.exists()
    # migrate goes on to create it (here it stops short: no server binaries to start).
    no_binaries = tmp_path / "no-binaries"
    no_binaries.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "DBOS_AGENT_DATABASE_URL"}
    result = zygote.run(
        [sys.executable, "-m", "dbos_agent", "migrate"],
        env={**env, "DBOS_AGENT_PG_BIN": str(no_binaries)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    refused(result, 1, f"cannot start the embedded Postgres in {folder}/")
    assert "no embedded Postgres" not in result.stderr


def test_errors_under_json_are_json(runtime: da.Runtime, dbos_agent_database_url: str) -> None:
    result = cli(dbos_agent_database_url, "--json", "workflows", "show", "unknown-id")
    refused(result, 1, "no workflow with id 'unknown-id'")
    assert json.loads(result.stdout) == {
        "error": "no workflow with id 'unknown-id'",
        "type": "WorkflowNotFoundError",
    }
    for args in (["--json", "workflows", "show"], ["workflows", "show", "--json"]):
        usage = cli(dbos_agent_database_url, *args)
        assert usage.returncode == 2 and usage.stdout == "", usage
        assert json.loads(usage.stderr) == {
            "error": "the following arguments are required: ID",
            "type": "UsageError",
        }
    plain = cli(dbos_agent_database_url, "workflows", "show")
    refused(plain, 2, "the following arguments are required: ID")
    assert plain.stderr.startswith("usage: dbos-agent workflows show")


def test_send_to_a_finished_workflow_warns(
    runtime: da.Runtime, dbos_agent_database_url: str
) -> None:
    url, key = dbos_agent_database_url, new_id()
    with da.workflow_id(key):
        chat(key, 0)
    result = cli(url, "send", key, '"too late"')
    assert result.returncode == 0, output(result)
    assert f'sent "too late" to {key}' in result.stdout
    assert result.stderr.startswith("dbos-agent: warning: ")
    assert len(result.stderr.splitlines()) == 1
    assert "already finished with status SUCCESS" in result.stderr
    assert "nothing will ever receive it" in result.stderr
    result = cli(url, "send", key, "again", "--json")
    assert result.returncode == 0, output(result)
    document = json.loads(result.stdout)
    assert document["sent"] is True and document["message"] == "again"
    assert "nothing will ever receive it" in document["warning"]
    assert document["warning"] in result.stderr


def test_a_diverged_workflow_is_listed_and_shown_with_why_and_what_now(
    runtime: da.Runtime, dbos_agent_database_url: str
) -> None:
    url, key = dbos_agent_database_url, new_id("diverged")
    hold_diverged(key)
    why = f"at step 0 the log recorded 'prepare' but the code (code version {code_version()}) "
    why += "called 'audit'"

    table = ok(cli(url, "workflows", "list", "--name", "diverging_order", "--status", "DIVERGED"))
    header, *rows = table.splitlines()
    assert header.split()[-2:] == ["WAITING", "FOR"]
    (row,) = (line for line in rows if line.startswith(key + " "))
    assert row.split()[2] == "DIVERGED"
    assert row.endswith("divergence: code that fits its log (step 0: log 'prepare', code 'audit')")
    listed = json.loads(ok(cli(url, "workflows", "list", "--status", "diverged", "--json")))
    (document,) = (w for w in listed if w["workflow_id"] == key)
    diverged = document["diverged"]
    assert document["status"] == "DIVERGED" and document["error"] is None
    assert diverged == {
        "position": 0,
        "recorded": "prepare",
        "called": "audit",
        "app_version": None,
        "code_version": code_version(),
        "at": diverged["at"],
        "summary": "step 0: log 'prepare', code 'audit'",
        "why": why,
    }
    assert datetime.fromisoformat(diverged["at"]).tzinfo is not None

    shown = ok(cli(url, "workflows", "show", key))
    assert "Status       DIVERGED" in shown
    waits = "Waiting for  divergence: code that fits its log (step 0: log 'prepare', code 'audit')"
    assert waits in shown
    assert f"Diverged     {why}, since " in shown and " UTC" in shown
    assert "What now     deploy code that fits its log (the change made with da.patched)" in shown
    assert f"dbos-agent workflows fork {key} --from-step 0" in shown
    assert f"or cancel it: dbos-agent workflows cancel {key}" in shown
    assert json.loads(ok(cli(url, "workflows", "show", key, "--json")))["diverged"] == diverged
    # resume: every process may try it again; this one's code still does not fit it
    resumed = json.loads(ok(cli(url, "workflows", "resume", key, "--json")))
    assert resumed["previous_status"] == "DIVERGED"
    wait_until(lambda: da.retrieve(key).status() == da.WorkflowStatus.DIVERGED, 30, "held again")


def test_a_diverged_workflow_is_forked_and_cancelled_from_the_cli(
    runtime: da.Runtime, dbos_agent_database_url: str
) -> None:
    """The operator's two choices: a fork from the step where it diverged runs on with
    this code (this process takes it up at once); a cancel ends the held workflow,
    whose divergence stays as history."""
    url, key = dbos_agent_database_url, new_id("diverged")
    hold_diverged(key)
    fork_id = f"{key}-fork"
    forked = json.loads(
        ok(cli(url, "workflows", "fork", key, "--from-step", "0", "--id", fork_id, "--json"))
    )
    assert forked["workflow_id"] == fork_id and forked["copied_steps"] == 0
    assert da.retrieve(fork_id).result(timeout=30) == [f"audited {key}", f"applied {key}"]
    fork_document = json.loads(ok(cli(url, "workflows", "show", fork_id, "--json")))
    assert fork_document["diverged"] is None and fork_document["status"] == "SUCCESS"
    assert da.retrieve(key).status() == da.WorkflowStatus.DIVERGED, "the original stays held"

    assert f"cancelled {key} (it was DIVERGED)" in ok(cli(url, "workflows", "cancel", key))
    shown = ok(cli(url, "workflows", "show", key))
    assert "CANCELLED" in shown and "What now" not in shown
    assert "Diverged earlier  at step 0 the log recorded 'prepare'" in shown
    listed = ok(cli(url, "workflows", "list", "--name", "diverging_order", "--limit", "1000"))
    (row,) = (line for line in listed.splitlines() if line.startswith(key + " "))
    assert row.split()[2] == "CANCELLED" and "log 'prepare'" not in row, "history, not why"


def test_versions_shows_each_versions_unfinished_workflows_and_live_sessions(
    dbos_agent_postgres_url: str,
) -> None:
    """v1 (this process) and v2 (a worker) each have workflows in several statuses and a
    live session; v0 and no version have only workflows, v3 (a worker) only a session."""
    key, host = new_id("versions"), socket.gethostname()
    with fresh_database(dbos_agent_postgres_url) as url:
        runtime = da.launch(url, executor_id=f"{key}-v1", app_version="v1", workers=8)
        db = current_engine().db
        worker = ["tests.apps.worker_app", "--grace", "0.1", "--executor-id"]
        v2 = start_worker(url, *worker, f"{key}-v2", "--app-version", "v2",
                          env={"WORKER_APP_STEP_SECONDS": "600"})  # fmt: skip
        v3 = start_worker(url, *worker, f"{key}-v3", "--app-version", "v3")
        PAUSE[f"{key}:0"], PAUSED[f"{key}:0"] = threading.Event(), threading.Event()
        try:
            hold_diverged(f"{key}-diverged")  # v1: one workflow in each unfinished status
            da.start(chat, key, 1, workflow_id=key)
            waiting = da.start(waits_long, key)
            with da.Client(url) as client:
                client.enqueue("nobody-serves", "chat", key, 1, app_version="v1")
                # v2: one runs in its worker (a 10-minute step), two wait in a queue
                running = client.enqueue("worker-tests", "job", 1, app_version="v2")
                client.enqueue("nobody-serves", "job", 1, app_version="v2")
                adopted = client.enqueue("nobody-serves", "job", 1, app_version="v2")
                client.enqueue("nobody-serves", "job", 1, app_version="v0")
                client.enqueue("nobody-serves", "job", 1)
            with db.connection() as conn:  # what `check-deploy --adopt` is to record
                conn.execute(
                    "UPDATE dbos_agent.workflows SET accepted_versions = '{v3}' "
                    "WHERE workflow_id = %s",
                    (adopted.workflow_id,),
                )
            assert PAUSED[f"{key}:0"].wait(10)
            wait_until(lambda: waiting.status() == da.WorkflowStatus.SUSPENDED, 30, "suspended")
            wait_until(
                lambda: da.retrieve(running.workflow_id).status() == da.WorkflowStatus.PENDING,
                30,
                "v2's worker runs its job",
            )
            wait_until(
                lambda: [len(v.sessions) for v in db.versions.summary()] == [0, 0, 1, 1, 1],
                30,
                "both workers' sessions",
            )

            # this process's code is not the workers' (both run tests.apps.worker_app)
            code = {v.app_version: v.sessions[0].code_version for v in db.versions.summary()[2:]}
            assert code["v1"] != code["v2"] == code["v3"] and code["v1"] is not None
            table = [line.split() for line in ok(cli(url, "versions")).splitlines()]
            assert table == [
                ["APP", "VERSION", "PENDING", "ENQUEUED", "SUSPENDED", "DIVERGED", "OTHERS",
                 "MAY", "RUN", "LIVE", "SESSIONS", "CODE", "VERSIONS"],
                ["(none)", "0", "1", "0", "0", "0", "0", "-"],
                ["v0", "0", "1", "0", "0", "0", "0", "-"],
                ["v1", "1", "1", "1", "1", "0", "1", code["v1"], "(1)"],
                ["v2", "1", "2", "0", "0", "1", "(v3)", "1", code["v2"], "(1)"],
                ["v3", "0", "0", "0", "0", "0", "1", code["v3"], "(1)"],
            ]  # fmt: skip
            wide = ok(cli(url, "versions", "--wide")).splitlines()
            assert wide[0].split()[-2:] == ["EXECUTOR@HOST:PID", "CODE"]
            assert len(wide[0].split()) == 15
            assert wide[4].endswith(f"{key}-v2@{host}:{v2.pid} {code['v2']}")
            assert wide[3].endswith(f"{key}-v1@{host}:{os.getpid()} {code['v1']}")

            document = json.loads(ok(cli(url, "versions", "--json")))
            assert [v["app_version"] for v in document] == [None, "v0", "v1", "v2", "v3"]
            by_version = {v["app_version"]: v for v in document}
            assert by_version["v2"]["unfinished"] == {
                "PENDING": 1, "ENQUEUED": 2, "SUSPENDED": 0, "DIVERGED": 0
            }  # fmt: skip
            assert by_version["v2"]["accepted_elsewhere"] == 1
            assert by_version["v2"]["accepted_by"] == ["v3"]
            (session,) = by_version["v3"]["sessions"]
            assert (session["executor_id"], session["hostname"], session["pid"]) == (
                f"{key}-v3",
                host,
                v3.pid,
            )
            assert datetime.fromisoformat(session["heartbeat_at"]).tzinfo is not None
            assert session["code_version"] == code["v3"]
            assert [v["live_sessions"] for v in document] == [0, 0, 1, 1, 1]
            assert by_version["v1"]["code_versions"] == [
                {"code_version": code["v1"], "sessions": 1}
            ]
            assert by_version["v0"]["code_versions"] == []

            stop_workers([v3])  # a session that ended is no longer listed
            assert [v["app_version"] for v in json.loads(ok(cli(url, "versions", "--json")))] == [
                None, "v0", "v1", "v2"
            ]  # fmt: skip
        finally:
            PAUSE[f"{key}:0"].set()
            stop_workers([v2, v3])
            runtime.shutdown(grace=5)


#: One command line per command of the tree, with its required arguments.
EVERY_COMMAND = [
    ["migrate"],
    ["workflows", "list"],
    ["workflows", "show", "x"],
    ["workflows", "steps", "x"],
    ["workflows", "cancel", "x"],
    ["workflows", "resume", "x"],
    ["workflows", "delete", "x"],
    ["workflows", "fork", "x", "--from-step", "0"],
    ["workflows", "rewind", "x", "--to-step", "0"],
    ["steps", "resolve", "x", "0", "--rerun"],
    ["retry", "x"],
    ["send", "x", "1"],
    ["stream", "x", "k"],
    ["approvals"],
    ["approve", "x", "0", "--digest", "d"],
    ["reject", "x", "0", "--digest", "d"],
    ["versions"],
    ["gc", "--older-than", "1d"],
    ["check-deploy", "--app", "m"],
    ["export"],
    ["import", "f"],
    ["schedules"],
    ["schedules", "list"],
    ["schedules", "pause", "n"],
    ["schedules", "resume", "n"],
    ["schedules", "backfill", "n", "--from", "2h", "--to", "1h"],
    ["queues"],
    ["queues", "list"],
    ["queues", "set", "q", "--concurrency", "3", "--rate-limit", "10/60"],
    ["worker", "--app", "m"],
    ["serve"],
]


def _leaves(parser: Any, path: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    import argparse

    groups = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not groups:
        return {path}
    found = set()
    for name, sub in groups[0].choices.items():
        found |= _leaves(sub, (*path, name))
    return found


def test_the_command_list_below_names_every_command() -> None:
    from dbos_agent.cli import build_parser

    leaves = _leaves(build_parser())
    covered = {
        leaf for leaf in leaves for argv in EVERY_COMMAND if tuple(argv[: len(leaf)]) == leaf
    }
    assert covered == leaves


@pytest.mark.parametrize("argv", EVERY_COMMAND, ids=lambda argv: " ".join(argv[:2]))
def test_every_command_takes_the_database_url_before_or_after_it(argv: list[str]) -> None:
    from dbos_agent.cli import build_parser

    url = "postgresql://u@127.0.0.1:1/given"
    parser = build_parser()
    assert parser.parse_args(["--database-url", url, *argv]).database_url == url
    assert parser.parse_args([*argv, "--database-url", url]).database_url == url
    # absent when not given: the environment's, else the embedded database
    assert not hasattr(parser.parse_args(argv), "database_url")


PASSWORD = "pw-Do-Not-Print"


@pytest.mark.parametrize(
    "scheme", ["postgresql+psycopg", "postgresql+asyncpg", "postgres+psycopg2", "mysql"]
)
def test_no_command_prints_the_password_of_any_database_url(scheme: str, tmp_path: Path) -> None:
    """A URL of SQLAlchemy's spelling is read as the Postgres URL it is; another
    database's is refused naming its scheme; the password is masked everywhere."""
    url = f"{scheme}://alice:{PASSWORD}@127.0.0.1:1/db"
    refused_scheme = scheme == "mysql"
    expected = "is a 'mysql' URL" if refused_scheme else "cannot connect to the dbos_agent database"
    commands = [
        ["workflows", "list"],
        ["migrate"],
        ["gc", "--older-than", "1d"],
        ["worker", "--app", "tests.apps.worker_app"],
        ["serve", "--port", "0"],
    ]
    env = {k: v for k, v in os.environ.items() if k != "DBOS_AGENT_DATABASE_URL"}
    env.update(PYTHONPATH=str(ROOT), DBOS_AGENT_DATABASE_URL="postgresql://u@127.0.0.1:2/ignored")
    procs = [
        zygote.popen(
            [sys.executable, "-m", "dbos_agent", "--database-url", url, *command],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for command in commands
    ]
    code = (
        "import sys, dbos_agent as da\n"
        "url = sys.argv[1]\n"
        "for attempt in (lambda: da.launch(url), lambda: da.Client(url).list_workflows()):\n"
        "    try:\n"
        "        attempt()\n"
        "    except da.DbosAgentError as exc:\n"
        "        print(type(exc).__name__, exc)\n"
    )
    library = zygote.run(
        [sys.executable, "-c", code, url],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    for command, proc in zip(commands, procs, strict=True):
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 1, (command, out, err)
        assert PASSWORD not in out + err, (command, out, err)
        assert "Traceback" not in err and expected in err, (command, err)
        assert "alice:***@" in err and "ignored" not in err, (command, err)
    assert library.returncode == 0 and PASSWORD not in library.stdout + library.stderr
    launch, client = library.stdout.splitlines()
    kind = "UnsupportedDatabaseError" if refused_scheme else "DatabaseUnavailableError"
    assert launch.startswith(kind) and client.startswith(kind), library.stdout
    assert "alice:***@" in launch and "alice:***@" in client

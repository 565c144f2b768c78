"""check-deploy and check_replay: new code replayed against recorded logs, running nothing
live and writing nothing; export and import of histories; --adopt across versions."""

from __future__ import annotations

import json
import threading
from collections import Counter
from pathlib import Path

import pytest

import dbos_agent as da
from dbos_agent._engine.deploy_check import DeployCheck
from dbos_agent._engine.runtime.current import current_engine
from dbos_agent.testing import Inspector, check_replay, fresh_database
from tests.helpers import SimulatedCrash, cli, new_id, ok, refused, wait_until
from tests.processes import ROOT

RUNS: Counter[str] = Counter()
CODE: dict[str, str] = {}


@da.step
def effect(tag: str) -> str:
    """A side effect counted here: a replay must never run it."""
    RUNS[tag] += 1
    return tag


@da.durable_workflow
def child_job(n: int) -> int:
    return n * 10


@da.durable_workflow
def busy(key: str) -> str:
    """A log with every kind of position: steps, a sleep, a child's start and result, a
    send, an event, a stream value written from the body, and a recv it waits in."""
    effect(f"{key}:a")
    da.sleep(0.01)
    child = da.start(child_job, 4)
    assert child.result() == 40
    da.set_event("progress", "half")
    da.write_stream("log", "line")
    da.send(da.current_workflow_id() or "", "note", topic="self")
    assert da.recv("self", timeout=5) == "note"
    if CODE.get(key) == "changed":
        effect(f"{key}:new")  # a step the old code did not call at this position
    effect(f"{key}:b")
    decision = da.recv("go", timeout=None)  # the workflow waits here
    effect(f"{key}:after {decision}")
    return f"done {decision}"


def waits(db: Inspector, workflow_id: str) -> bool:
    """Whether the workflow's last recorded step is the recv it waits in."""
    return db.step_names(workflow_id)[-1:] == ["dbos_agent.recv"]


def _check(*names: str) -> DeployCheck:
    engine = current_engine()
    return check_replay(None, database_url=engine.db.url, names=names)


def _rows(url: str, workflow_id: str) -> tuple[object, ...]:
    with Inspector(url) as db:
        return db.workflow(workflow_id), db.steps(workflow_id), db.messages(workflow_id)


def test_a_replay_check_runs_nothing_live_writes_nothing_and_finds_a_divergence(
    runtime: da.Runtime, dbos_agent_database_url: str
) -> None:
    key = new_id("busy")
    handle = da.start(busy, key, workflow_id=key)
    with Inspector(dbos_agent_database_url) as db:  # in its last recv, not the first one
        wait_until(lambda: RUNS[f"{key}:b"] == 1 and waits(db, key), 30, "waiting")
    RUNS.clear()
    before = _rows(dbos_agent_database_url, key)

    report = _check("busy", "child_job")
    verdict = next(v for v in report.verdicts if v.workflow_id == key)
    with Inspector(dbos_agent_database_url) as db:
        waiting_at = db.steps(key)[-1].seq
    assert verdict.fits and verdict.replayed == waiting_at, verdict  # up to the recv it waits in
    CODE[key] = "changed"
    report = _check("busy", "child_job")
    verdict = next(v for v in report.verdicts if v.workflow_id == key)
    assert not verdict.fits and verdict.divergence is not None
    assert verdict.divergence.called == effect.__qualname__
    assert verdict.divergence.recorded == effect.__qualname__ or verdict.divergence.position
    assert RUNS == Counter(), "no step ran"
    assert _rows(dbos_agent_database_url, key) == before, "nothing was written"

    del CODE[key]
    da.send(key, "yes", topic="go")
    assert handle.result(timeout=30) == "done yes"
    assert RUNS == Counter({f"{key}:after yes": 1})


@da.durable_workflow
def needs_two(a: int, b: int) -> int:
    effect(f"{a}")
    return a + b


@da.durable_workflow
def raises_early(key: str) -> None:
    effect(f"{key}:1")
    if CODE.get(key) == "broken":
        raise KeyError("a bug in the new code")
    effect(f"{key}:2")
    da.recv("never", timeout=None)


@da.durable_workflow
def blocks_forever(key: str) -> None:
    effect(f"{key}:1")
    if CODE.get(key) == "blocks":
        threading.Event().wait()  # not a durable wait: a replay cannot get past it
    da.recv("never", timeout=None)


def test_what_would_fail_besides_a_divergence_is_reported(
    runtime: da.Runtime, dbos_agent_database_url: str
) -> None:
    url = dbos_agent_database_url
    unfit = new_id("inputs")
    with current_engine().db.connection() as conn:  # recorded by older code: one argument
        conn.execute(
            "INSERT INTO dbos_agent.workflows (workflow_id, name, status, inputs, executor_id,"
            " max_recovery_attempts, owner_key) VALUES (%s, 'needs_two', 'PENDING',"
            " '{\"a\": 1}', 'elsewhere', 5, %s)",
            (unfit, runtime.session_key),
        )
    early, stuck = new_id("early"), new_id("stuck")
    with Inspector(url) as db:
        for key, flow in ((early, raises_early), (stuck, blocks_forever)):
            da.start(flow, key, workflow_id=key)
        wait_until(lambda: waits(db, early) and waits(db, stuck), 30, "they wait")
    CODE[early], CODE[stuck] = "broken", "blocks"
    report = check_replay(
        None, database_url=url, names=["needs_two", "raises_early", "blocks_forever"],
        timeout=1.0,
    )  # fmt: skip
    problems = {v.workflow_id: v.problem for v in report.verdicts if not v.fits}
    assert "recorded inputs no longer fit" in (problems[unfit] or "")
    assert "raises KeyError before its log ends" in (problems[early] or "")
    assert "did not end within 1s" in (problems[stuck] or "")
    assert not report.fits
    da.operations.cancel(early), da.operations.cancel(stuck), da.operations.cancel(unfit)


def test_the_cli_says_what_went_wrong_in_one_line(
    dbos_agent_database_url: str, tmp_path: Path
) -> None:
    url = dbos_agent_database_url
    (tmp_path / "broken_app.py").write_text("import dbos_agent\nraise RuntimeError('boom')\n")
    refused(  # the app could not be checked: 2, not a verdict (1)
        cli(url, "check-deploy", "--app", "broken_app", cwd=tmp_path),
        2,
        "cannot import the app module 'broken_app': RuntimeError: boom",
    )
    refused(
        cli(url, "check-deploy", "--app", "no_such_module_here", "--json", cwd=tmp_path),
        2,
        "cannot import the app module 'no_such_module_here'",
        as_json=True,
    )
    unreachable = "postgresql://nobody:secret-password@127.0.0.1:9/none"
    result = cli(unreachable, "check-deploy", "--app", "tests.apps.deploy.v1", cwd=ROOT)
    refused(result, 1, "cannot connect")
    assert "secret-password" not in result.stderr
    refused(
        cli(url, "check-deploy", "--app", "tests.apps.deploy.v1", "--adopt", cwd=ROOT),
        1,
        "--adopt needs --app-version",
    )
    usage = cli(url, "check-deploy", "--app", "tests.apps.deploy.v1", "--timeout", "0", cwd=ROOT)
    assert usage.returncode == 2 and "not a number of seconds > 0" in usage.stderr


@da.durable_workflow
def remembered(key: str) -> str:
    effect(f"{key}:1")
    da.set_event("state", {"nul": "a\x00b", "n": 1})
    da.write_stream("out", "x")
    return str(da.recv("go", timeout=None))


def test_export_import_and_a_check_of_the_file(
    runtime: da.Runtime, dbos_agent_database_url: str, dbos_agent_postgres_url: str,
    tmp_path: Path,
) -> None:  # fmt: skip
    url = dbos_agent_database_url
    key = new_id("export")
    da.start(remembered, key, workflow_id=key)
    da.send(key, "early", topic="unrelated", idempotency_key="k1")
    with Inspector(url) as db:
        wait_until(lambda: waits(db, key), 30, "waiting")
    exported = ok(cli(url, "export", key))
    assert exported.count("\n") == 1
    document = json.loads(exported)
    assert document["format"] == "dbos_agent.history/1"
    assert document["workflow"]["workflow_id"] == key and "owner_key" not in document["workflow"]
    path = tmp_path / "histories.jsonl"
    path.write_text(exported)
    refused(cli(url, "export", key, "no-such-id"), 1, "no such workflow: no-such-id")
    assert key in ok(cli(url, "export", "--unfinished", "--name", "remembered"))

    with fresh_database(dbos_agent_postgres_url) as other:
        ok(cli(other, "migrate"))
        assert "imported 1 workflow(s) with 4 step(s)" in ok(cli(other, "import", str(path)))
        again = json.loads(ok(cli(other, "import", str(path), "--json")))
        assert again == {"imported": 0, "skipped": 1, "steps": 0}
        mine, theirs = _rows(url, key), _rows(other, key)
        assert theirs[1:] == mine[1:], "steps and messages as they were"
        with Inspector(other) as db:
            assert db.event(key, "state") == {"nul": "a\x00b", "n": 1}
        bad = tmp_path / "bad.jsonl"
        bad.write_text(exported + '{"format": "something else"}\n')
        refused(cli(other, "import", str(bad)), 1, "bad.jsonl, line 2, format: not a dbos_agent")

    report = check_replay(None, path, database_url=url)
    assert [v.workflow_id for v in report.verdicts] == [key] and report.fits
    da.operations.cancel(key)


@da.durable_workflow
def half_done(key: str) -> None:
    effect(f"{key}:1")
    if CODE.get(key) == "crash":
        raise SimulatedCrash()
    effect(f"{key}:2")


def test_adopt_is_refused_for_a_log_that_moved_since_the_check(
    runtime: da.Runtime, dbos_agent_database_url: str
) -> None:
    from dbos_agent._engine.deploy_check import adopt

    key = new_id("moved")
    CODE[key] = "crash"
    with pytest.raises(SimulatedCrash), da.workflow_id(key):
        half_done(key)
    with current_engine().db.connection() as conn:
        conn.execute("UPDATE dbos_agent.workflows SET app_version = '1' WHERE workflow_id = %s",
                     (key,))  # fmt: skip
    report = check_replay(None, database_url=dbos_agent_database_url, names=["half_done"])
    assert report.fits
    with current_engine().db.connection() as conn:  # an old process records one more step
        conn.execute(
            "INSERT INTO dbos_agent.steps (workflow_id, seq, name, status, output, started_at)"
            " VALUES (%s, 1, %s, 'SUCCESS', '\"x\"', now())",
            (key, effect.__qualname__),
        )
    adopt(current_engine().db, report, "2")
    assert (report.adopted, report.moved) == (0, 1)
    assert da.retrieve(key).get_info().app_version == "1"
    da.operations.cancel(key)

"""Workflows: idempotent start, attach, divergence, the append-only race, recovery, bad input."""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import Counter
from typing import Any

import psycopg
import pytest

import dbos_agent as da
from dbos_agent._engine.runtime.admission import admit
from dbos_agent._engine.runtime.collaborators import EngineOptions
from dbos_agent._engine.runtime.core import Engine
from dbos_agent._engine.runtime.current import current_engine
from dbos_agent._engine.runtime.recovery import take_over_once
from dbos_agent._engine.runtime.registry import code_version
from dbos_agent._storage.database import SystemDatabase
from dbos_agent._storage.locks import SESSION_LOCK_CLASS
from dbos_agent.testing import Inspector
from tests.helpers import SimulatedCrash, new_id, per_test, wait_until
from tests.processes import output
from tests.support import zygote

RUNS: Counter[str] = per_test(Counter())
GATES: dict[str, threading.Event] = per_test({})
MODE: dict[str, str] = per_test({})


@da.step
def work(key: str, i: int) -> int:
    RUNS[f"{key}:{i}"] += 1
    gate = GATES.get(key)
    if gate is not None and i == 1:
        assert gate.wait(10)
    return i * i


@da.durable_workflow
def squares(key: str, n: int) -> int:
    total = sum(work(key, i) for i in range(n))
    if MODE.get(key) == "crash":
        raise SimulatedCrash()
    return total


def test_same_id_returns_the_recorded_result_and_runs_nothing(runtime: da.Runtime) -> None:
    wid = new_id()
    with da.workflow_id(wid):
        assert squares(wid, 3) == 5
        assert squares(wid, 3) == 5
    assert da.start(squares, wid, 3, workflow_id=wid).result() == 5
    assert all(count == 1 for count in RUNS.values()) and len(RUNS) == 3


def test_the_inspector_reads_many_statuses_in_one_go(
    runtime: da.Runtime, inspector: Inspector
) -> None:
    done, held, missing = new_id(), new_id(), new_id()
    GATES[held] = threading.Event()
    try:
        assert da.start(squares, done, 2, workflow_id=done).result() == 1
        handle = da.start(squares, held, 3, workflow_id=held)
        wait_until(lambda: RUNS[f"{held}:1"] == 1, 30, "the held workflow at its gate")
        statuses = inspector.statuses([held, missing, done])
        assert list(statuses) == [held, missing, done]  # in the order asked, each once
        assert statuses == {
            held: da.WorkflowStatus.PENDING,
            missing: None,
            done: da.WorkflowStatus.SUCCESS,
        }
        assert inspector.status(missing) is None
        assert not inspector.all_finished([done, held])
    finally:
        GATES[held].set()
    assert handle.result() == 5
    assert inspector.all_finished([done, held]) and inspector.status(held) == "SUCCESS"


def test_reusing_an_id_for_other_inputs_or_another_workflow_is_a_conflict(
    runtime: da.Runtime,
) -> None:
    wid = new_id()
    with da.workflow_id(wid):
        squares(wid, 2)
        with pytest.raises(da.errors.WorkflowIdConflictError, match="other inputs"):
            squares(wid, 3)
        with pytest.raises(da.errors.WorkflowIdConflictError, match="already belongs"):
            other_workflow()
    # keyword and positional spellings of the same call are the same inputs
    with da.workflow_id(wid):
        assert squares(key=wid, n=2) == 1


@da.durable_workflow
def other_workflow() -> int:
    return 0


def test_a_pending_workflow_is_attached_to_not_run_twice(runtime: da.Runtime) -> None:
    wid = new_id()
    GATES[wid] = threading.Event()
    first = da.start(squares, wid, 3, workflow_id=wid)
    wait_until(lambda: RUNS[f"{wid}:1"] > 0, 5, "step 1 under way")
    second = da.start(squares, wid, 3, workflow_id=wid)
    assert second.status() == da.WorkflowStatus.PENDING
    GATES[wid].set()
    assert first.result(10) == second.result(10) == 5
    assert RUNS == Counter({f"{wid}:0": 1, f"{wid}:1": 1, f"{wid}:2": 1})


def test_handles_and_listing(runtime: da.Runtime) -> None:
    wid = new_id()
    handle = da.start(squares, wid, 4, workflow_id=wid)
    assert handle.workflow_id == wid
    assert handle.result(timeout=10) == 14
    assert handle.status() == da.WorkflowStatus.SUCCESS
    info = da.retrieve(wid).get_info()
    assert info.name == "squares" and info.inputs == {"key": wid, "n": 4} and info.output == 14
    assert info.executor_id == runtime.executor_id and info.recovery_attempts == 0
    listed = da.operations.list_workflows(status="SUCCESS", name="squares", limit=1000)
    assert wid in [w.workflow_id for w in listed]
    assert da.operations.list_workflows(status=da.WorkflowStatus.ERROR, name="squares") == []
    with pytest.raises(da.WorkflowNotFoundError, match="no-such-id"):
        da.retrieve("no-such-id")


@da.step
def step_a() -> str:
    RUNS["a"] += 1
    return "a"


@da.step
def step_b() -> str:
    RUNS["b"] += 1
    return "b"


@da.durable_workflow
def evolving(key: str) -> str:
    first = step_a()
    if MODE.get(key) == "crash":
        raise SimulatedCrash()
    second = step_b() if MODE.get(key) == "changed" else step_a()
    return first + second


def test_divergence_holds_the_workflow_without_running_the_step(
    runtime: da.Runtime, engine: Engine
) -> None:
    """A code change is never the workflow's error: it is held DIVERGED (unfinished,
    saying why), and this process, whose code gave the divergence, leaves it alone."""
    wid2 = new_id()
    MODE[wid2] = "crash"
    with pytest.raises(SimulatedCrash), da.workflow_id(wid2):
        evolving(wid2)
    with engine.db.connection() as conn:  # a log from an older version of the code
        conn.execute(
            "UPDATE dbos_agent.steps SET name = 'step_b' WHERE workflow_id = %s AND seq = 0",
            (wid2,),
        )
    RUNS.clear()
    MODE[wid2] = "changed"
    with pytest.raises(da.errors.WorkflowDivergedError) as err, da.workflow_id(wid2):
        evolving(wid2)
    assert err.value.seq == 0 and err.value.recorded == "step_b" and err.value.current == "step_a"
    assert wid2 in str(err.value) and "step 0" in str(err.value)
    assert RUNS["a"] == 0, "the diverging step must not run"
    info = da.retrieve(wid2).get_info()
    assert info.status == da.WorkflowStatus.DIVERGED and info.error is None
    assert info.diverged is not None
    assert (info.diverged.position, info.diverged.recorded, info.diverged.called) == (
        0,
        "step_b",
        "step_a",
    )
    assert info.diverged.code_version == code_version()
    take_over_once(engine)  # the same code would diverge again: it is not taken up
    assert da.retrieve(wid2).status() == da.WorkflowStatus.DIVERGED
    with pytest.raises(da.errors.WorkflowDivergedError), da.workflow_id(wid2):
        evolving(wid2)  # a direct call again gets the divergence at once, runs nothing
    assert RUNS["a"] == 0 and da.retrieve(wid2).status() == da.WorkflowStatus.DIVERGED
    with pytest.raises(TimeoutError):  # a waiter keeps waiting: it is not finished
        da.retrieve(wid2).result(timeout=0.2)


@da.durable_workflow
def refuses_on_purpose() -> str:
    raise da.errors.WorkflowDivergedError("elsewhere", 3, "old", "new")


def test_a_divergence_raised_by_user_code_is_its_error_as_before(runtime: da.Runtime) -> None:
    wid = new_id()
    with pytest.raises(da.errors.WorkflowDivergedError), da.workflow_id(wid):
        refuses_on_purpose()
    info = da.retrieve(wid).get_info()
    assert info.status == da.WorkflowStatus.ERROR and info.diverged is None
    assert info.error is not None and info.error["type"].endswith("WorkflowDivergedError")


@da.durable_workflow
def swallows_divergence(key: str) -> str:
    try:
        return evolving_step_only(key)
    except Exception:
        return "swallowed"


@da.step
def evolving_step_only(key: str) -> str:
    return key


def test_divergence_cannot_be_swallowed(runtime: da.Runtime, engine: Engine) -> None:
    wid = new_id()
    with engine.db.connection() as conn:
        conn.execute(
            "INSERT INTO dbos_agent.workflows (workflow_id, name, status, inputs, executor_id,"
            " max_recovery_attempts, owner_key)"
            " VALUES (%s, 'swallows_divergence', 'PENDING', %s, %s, 5, %s)",
            (wid, f'{{"key": "{wid}"}}', runtime.executor_id, runtime.session_key),
        )
        conn.execute(
            "INSERT INTO dbos_agent.steps (workflow_id, seq, name, status, output, started_at)"
            " VALUES (%s, 0, 'something_else', 'SUCCESS', '1', now())",
            (wid,),
        )
    with pytest.raises(da.errors.WorkflowDivergedError), da.workflow_id(wid):
        swallows_divergence(wid)
    assert da.retrieve(wid).status() == da.WorkflowStatus.DIVERGED


def _second_engine(url: str, executor_id: str, lease: float = 30.0) -> Engine:
    """Another executor session on the same database: another process, in effect."""
    db = SystemDatabase(url, pool_size=4)
    db.open()
    options = EngineOptions(executor_id=executor_id, workers=2, lease_seconds=lease)
    return Engine(db, options).open()


def test_a_workflow_with_a_live_owner_is_waited_for_not_run(
    runtime: da.Runtime, dbos_agent_database_url: str
) -> None:
    wid = new_id()
    GATES[wid] = threading.Event()
    first = da.start(squares, wid, 3, workflow_id=wid)
    wait_until(lambda: RUNS[f"{wid}:1"] > 0, 5, "step 1 under way")
    other = _second_engine(dbos_agent_database_url, "other")
    try:
        definition = squares.__dbos_agent_workflow__  # type: ignore[attr-defined]
        admission = admit(other, definition, wid, (wid, 3), {})
        assert admission.remote and admission.run is None
        GATES[wid].set()
        assert other.wait_for_outcome(wid, 10).unwrap() == 5
    finally:
        other.shutdown()
    assert first.result(10) == 5
    assert RUNS == Counter({f"{wid}:0": 1, f"{wid}:1": 1, f"{wid}:2": 1})


def test_a_hung_owner_loses_its_workflow_and_can_no_longer_write(
    dbos_agent_postgres_url: str, executor_id: str
) -> None:
    """The owner stops heartbeating (hung) inside step 1; after its lease another
    executor takes the workflow over and finishes it; the old run's checkpoint is
    refused, so step 1 is recorded once although it ran twice."""
    from dbos_agent.testing import fresh_database

    with fresh_database(dbos_agent_postgres_url) as url:  # orphans of other tests stay out
        _hung_owner_scenario(url, executor_id)


def _hung_owner_scenario(url: str, executor_id: str) -> None:
    from dbos_agent._engine.runtime.recovery import claim_and_recover
    from dbos_agent.records import RecoveryReport

    wid = new_id()
    hung = da.launch(url, executor_id=executor_id, workers=2)  # a 30 s lease
    other: Engine | None = None
    try:
        GATES[wid] = gate = threading.Event()
        first = da.start(squares, wid, 3, workflow_id=wid)
        wait_until(lambda: RUNS[f"{wid}:1"] > 0, 5, "step 1 under way")
        current_engine().session._stop.set()  # the heartbeat stops: the process looks hung
        del GATES[wid]
        other = _second_engine(url, new_id("other"))
        other.db.advance_clock(31)  # for the other executor the hung one's lease ran out
        report = RecoveryReport()
        claim_and_recover(other, orphans=True, report=report)
        assert report.recovered == 1
        assert other.wait_for_outcome(wid, 10).unwrap() == 5
        gate.set()  # the hung run wakes up and tries to checkpoint step 1
        assert first.result(10) == 5
        steps = da.operations.list_steps(wid)
        assert [s.seq for s in steps] == [0, 1, 2]
        assert RUNS[f"{wid}:1"] == 2 and RUNS[f"{wid}:0"] == 1
        info = da.retrieve(wid).get_info()
        assert info.executor_id == other.executor_id and info.recovery_attempts == 1
    finally:
        if other is not None:
            other.shutdown()
        hung.shutdown()


def test_the_step_log_keeps_the_first_record(runtime: da.Runtime, engine: Engine) -> None:
    wid = new_id()
    with da.workflow_id(wid):
        squares(wid, 1)
    from datetime import UTC, datetime

    from dbos_agent.records import StepStatus

    write = engine.db.steps.record(
        workflow_id=wid,
        seq=0,
        name="work",
        status=StepStatus.SUCCESS,
        output="99",
        error=None,
        attempts=1,
        started_at=datetime.now(UTC),
        owner_key=engine.session_key,
    )
    assert not write.written
    assert da.operations.list_steps(wid)[0].output == 0


@da.durable_workflow(max_recovery_attempts=2)
def always_crashes(key: str) -> None:
    RUNS[key] += 1
    raise SimulatedCrash()


def _launch(url: str, executor_id: str) -> da.Runtime:
    rt = da.launch(url, executor_id=executor_id, workers=4)
    rt.wait_for_recovery(20)
    return rt


def test_recovery_at_launch_and_dead_letter(dbos_agent_database_url: str, executor_id: str) -> None:
    crash_id, ok_id = new_id(), new_id()
    rt = _launch(dbos_agent_database_url, executor_id)
    try:
        with pytest.raises(SimulatedCrash), da.workflow_id(crash_id):
            always_crashes(crash_id)
        MODE[ok_id] = "crash"
        with pytest.raises(SimulatedCrash), da.workflow_id(ok_id):
            squares(ok_id, 3)
        MODE.clear()
    finally:
        rt.shutdown()
    for attempt in (1, 2):
        rt = _launch(dbos_agent_database_url, executor_id)
        try:
            assert rt.last_recovery is not None
            if attempt == 1:
                assert da.retrieve(ok_id).result(10) == 5

            def crashed_again(runs: int = attempt + 1) -> bool:
                return RUNS[crash_id] == runs

            wait_until(crashed_again, 10, "the recovered run")
            info = da.retrieve(crash_id).get_info()
            assert info.status == da.WorkflowStatus.PENDING
            assert info.recovery_attempts == attempt
        finally:
            rt.shutdown()
    assert RUNS[crash_id] == 3
    assert all(RUNS[f"{ok_id}:{i}"] == 1 for i in range(3))
    rt = _launch(dbos_agent_database_url, executor_id)
    try:
        assert rt.last_recovery is not None and rt.last_recovery.dead_lettered == 1
        assert RUNS[crash_id] == 3  # not run a fourth time
        handle = da.retrieve(crash_id)
        assert handle.status() == da.WorkflowStatus.MAX_RECOVERY_ATTEMPTS_EXCEEDED
        with pytest.raises(da.errors.MaxRecoveryAttemptsExceededError, match="recovered 2 times"):
            handle.result()
    finally:
        rt.shutdown()


def _insert_pending(url: str, executor_id: str, wid: str, name: str, inputs: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO dbos_agent.workflows (workflow_id, name, status, inputs, executor_id,"
            " max_recovery_attempts) VALUES (%s, %s, 'PENDING', %s, %s, 5)",
            (wid, name, inputs, executor_id),
        )


def test_recovery_keeps_unknown_workflows_pending_and_fails_unfit_inputs(
    dbos_agent_database_url: str, executor_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = dbos_agent_database_url
    unknown, unfit, sibling = new_id(), new_id(), new_id()
    _insert_pending(url, executor_id, unknown, "renamed_long_ago", "{}")
    _insert_pending(url, executor_id, unfit, "squares", '{"key": "k", "count": 3}')
    _insert_pending(url, executor_id, sibling, "squares", f'{{"key": "{sibling}", "n": 2}}')
    caplog.set_level(logging.WARNING, logger="dbos_agent")
    rt = _launch(url, executor_id)
    try:
        assert da.retrieve(sibling).result(10) == 1
        assert da.retrieve(unknown).status() == da.WorkflowStatus.PENDING
        assert "renamed_long_ago" in caplog.text and "stay PENDING" in caplog.text
        unfit_info = da.retrieve(unfit).get_info()
        assert unfit_info.status == da.WorkflowStatus.ERROR
        assert unfit_info.error is not None
        assert "no longer has: count" in unfit_info.error["message"]
        with pytest.raises(da.errors.WorkflowInputsError):
            da.retrieve(unfit).result()
    finally:
        rt.shutdown()


def test_unreachable_database_fails_fast_without_the_password() -> None:
    started = time.monotonic()
    with pytest.raises(da.DatabaseUnavailableError) as err:
        da.launch("postgresql://alice:s3cret-pw@127.0.0.1:1/nowhere")
    assert time.monotonic() - started < 45  # refused at once, not ridden out as an outage
    assert "s3cret-pw" not in str(err.value)
    assert "127.0.0.1" in str(err.value) and "alice" in str(err.value)
    with pytest.raises(da.errors.NotLaunchedError):
        squares("x", 1)


def _launch_killing_the_session_while_it_registers(
    url: str, executor_id: str, *, until_it_returns: bool, **options: Any
) -> tuple[object, list[int]]:
    """launch() while the executor session's registration waits for a lock held here,
    its backend killed as it waits: once, or (``until_it_returns``) each time it comes
    back. What launch() returned or raised, and the backends killed."""
    outcome: list[object] = []

    def launch() -> None:
        try:
            outcome.append(da.launch(url, executor_id=executor_id, **options))
        except Exception as exc:  # the test looks at it
            outcome.append(exc)

    blocker = psycopg.connect(url)
    blocker.execute("LOCK TABLE dbos_agent.executors IN SHARE MODE")  # holds back INSERTs
    opening = threading.Thread(target=launch, daemon=True)
    opening.start()
    waiting = (
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        " AND application_name = 'dbos_agent_session' AND wait_event_type = 'Lock'"
    )
    killed: list[int] = []
    try:
        with psycopg.connect(url, autocommit=True) as admin:

            def kill_the_waiting_session() -> bool:
                for (pid,) in admin.execute(waiting).fetchall():
                    admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
                    killed.append(int(pid))
                return bool(killed) and (not until_it_returns or not opening.is_alive())

            wait_until(kill_the_waiting_session, 60, "the session waiting to register", every=0.05)
    finally:
        blocker.rollback()
        blocker.close()
    opening.join(120)
    assert len(outcome) == 1, "launch() did not return"
    return outcome[0], killed


def test_a_session_connection_killed_while_it_opens_is_ridden_out(
    dbos_agent_database_url: str, executor_id: str
) -> None:
    """launch() reached the database, then lost the connection its executor session was
    opening on (a restart, an operator's kill): an outage like any other, ridden out."""
    url = dbos_agent_database_url
    rt, killed = _launch_killing_the_session_while_it_registers(
        url, executor_id, until_it_returns=False
    )
    assert isinstance(rt, da.Runtime), f"launch() failed: {rt!r}"
    try:
        key = current_engine().session_key
        with psycopg.connect(url) as conn:
            holder = conn.execute(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND classid = %s"
                " AND objid = %s AND objsubid = 2 AND granted",
                (SESSION_LOCK_CLASS, key),
            ).fetchone()
            row = conn.execute(
                "SELECT executor_id FROM dbos_agent.executors WHERE session_key = %s", (key,)
            ).fetchone()
        assert holder is not None and int(holder[0]) not in killed
        assert row == (executor_id,)
        assert squares(new_id("after-kill"), 3) == 5
    finally:
        rt.shutdown()


def test_a_session_that_cannot_register_within_the_bound_fails_cleanly(
    dbos_agent_database_url: str, executor_id: str
) -> None:
    """Killed each time it comes back, past the outage bound: DatabaseUnavailableError
    saying so, with no driver exception kept as its context, and no runtime left."""
    failure, killed = _launch_killing_the_session_while_it_registers(
        dbos_agent_database_url, executor_id, until_it_returns=True, outage_timeout=1
    )
    assert len(killed) >= 2
    assert isinstance(failure, da.DatabaseUnavailableError), repr(failure)
    assert "could not open an executor session" in str(failure)
    assert failure.__context__ is None and failure.__cause__ is None
    with pytest.raises(da.errors.NotLaunchedError):
        squares("x", 1)


def test_a_newer_schema_is_refused(dbos_agent_postgres_url: str) -> None:
    from dbos_agent.testing import fresh_database

    with fresh_database(dbos_agent_postgres_url) as url:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE SCHEMA dbos_agent")
            conn.execute(
                "CREATE TABLE dbos_agent.schema_migrations (version integer PRIMARY KEY,"
                " name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
            )
            conn.execute("INSERT INTO dbos_agent.schema_migrations VALUES (999, 'future')")
        with pytest.raises(da.errors.SchemaVersionError, match="999"):
            da.launch(url)


def test_migrations_are_idempotent_and_safe_concurrently(dbos_agent_postgres_url: str) -> None:
    from dbos_agent.testing import fresh_database

    with fresh_database(dbos_agent_postgres_url) as url:
        errors: list[BaseException] = []

        def migrate() -> None:
            db = SystemDatabase(url, pool_size=1)
            try:
                db.open()
                db.migrate()
            except BaseException as exc:
                errors.append(exc)
            finally:
                db.close()

        threads = [threading.Thread(target=migrate) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        with psycopg.connect(url) as conn:
            rows = conn.execute(
                "SELECT version FROM dbos_agent.schema_migrations ORDER BY version"
            ).fetchall()
        from dbos_agent._storage.sql_files import migrations

        assert [r[0] for r in rows] == [version for version, _, _ in migrations()]


@da.step
def slow_step(i: int) -> int:
    time.sleep(0.002)
    return i


@da.durable_workflow
def tiny(i: int) -> int:
    return slow_step(i)


def test_recovery_runs_on_a_bounded_pool(dbos_agent_database_url: str, executor_id: str) -> None:
    url = dbos_agent_database_url
    ids = [new_id("bulk") for _ in range(300)]
    with psycopg.connect(url, autocommit=True) as conn, conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO dbos_agent.workflows (workflow_id, name, status, inputs, executor_id,"
            " max_recovery_attempts) VALUES (%s, 'tiny', 'PENDING', %s, %s, 5)",
            [(wid, f'{{"i": {n}}}', executor_id) for n, wid in enumerate(ids)],
        )
    peak = 0
    # an earlier test's runtime may still be ending its worker threads: only new ones count
    earlier = set(threading.enumerate())

    def recovered() -> bool:
        nonlocal peak
        workers = [
            t
            for t in threading.enumerate()
            if t.name.startswith("dbos-agent-worker") and t not in earlier
        ]
        peak = max(peak, len(workers))
        return rt.last_recovery is not None

    rt = da.launch(url, executor_id=executor_id, workers=4)
    try:
        wait_until(recovered, 60, "recovery at launch", every=0.005)
        assert [da.retrieve(w).result(30) for w in ids] == list(range(300))
        assert rt.last_recovery is not None and rt.last_recovery.recovered == 300
    finally:
        rt.shutdown()
    assert 1 <= peak <= 4


BROKEN_ONCE: list[str] = []


@da.step
def breaks_the_log(url: str) -> int:
    if not BROKEN_ONCE:  # the database fails under the step, the first time only
        BROKEN_ONCE.append(url)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("ALTER TABLE dbos_agent.steps RENAME TO steps_gone")
    return 1


@da.durable_workflow
def checkpoint_fails(url: str) -> int:
    try:
        return breaks_the_log(url)
    except Exception:  # user code may catch everything; the workflow must not end anyway
        return -1


def test_a_failed_checkpoint_leaves_the_workflow_pending_not_failed(
    dbos_agent_postgres_url: str, executor_id: str
) -> None:
    from dbos_agent.testing import fresh_database

    with fresh_database(dbos_agent_postgres_url) as url:
        wid = new_id()
        rt = da.launch(url, executor_id=executor_id, workers=2)
        try:
            with (
                pytest.raises(da.errors.CheckpointError, match="step 0") as err,
                da.workflow_id(wid),
            ):
                checkpoint_fails(url)
            assert "steps" in str(err.value.__cause__)
            assert da.retrieve(wid).status() == da.WorkflowStatus.PENDING
        finally:
            rt.shutdown()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("ALTER TABLE dbos_agent.steps_gone RENAME TO steps")
        rt = da.launch(url, executor_id=executor_id, workers=2)  # recovery finishes it
        try:
            assert da.retrieve(wid).result(timeout=30) == 1  # the step ran again, recorded
        finally:
            rt.shutdown()


NO_WITH = """
import asyncio, logging, sys
logging.basicConfig(level=logging.INFO)
import dbos_agent as da

@da.durable_workflow
def hello() -> str:
    return "hi"

@da.durable_workflow
async def hello_async() -> str:
    return "hi async"

if sys.argv[2] == "async":
    async def main() -> None:
        async with da.launch(sys.argv[1], executor_id="exits-async"):
            print(await hello_async())
    asyncio.run(main())
else:
    da.launch(sys.argv[1], executor_id="exits-plainly")  # no with, no shutdown()
    print(hello())
"""


@pytest.mark.parametrize("mode", ["no-with", "async"])
def test_a_program_ends_quietly_with_or_without_shutdown(
    dbos_agent_database_url: str, mode: str
) -> None:
    done = zygote.run(
        [sys.executable, "-c", NO_WITH, dbos_agent_database_url, mode],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, output(done)
    assert done.stdout.strip() == ("hi async" if mode == "async" else "hi")
    noise = [line for line in done.stderr.splitlines() if "WARNING" in line or "ERROR" in line]
    assert noise == [] and "Traceback" not in done.stderr, done.stderr

"""Cron schedules on a real Postgres: each slot runs once under its id, the catch-up and
overlap policies, pause and resume, backfill, the CLI, faults, and three worker processes
firing a per-second schedule through a kill -9.

Time is the database clock: tests move it with ``advance_clock`` and drive the scheduler
one look at a time with ``fire_due`` (never sleeping to show that nothing happens)."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

import dbos_agent as da
from dbos_agent._engine.runtime.core import Engine
from dbos_agent._engine.runtime.current import current_engine
from dbos_agent._engine.runtime.recovery import recover_pending
from dbos_agent._engine.runtime.scheduler import FiredSlot
from dbos_agent._engine.schedules import (
    forget_schedules,
    registered_schedules,
    slot_workflow_id,
)
from dbos_agent._engine.schedules.cron import CronTimes
from dbos_agent._engine.schedules.operations import read_schedule
from dbos_agent.records import SlotOutcome
from dbos_agent.testing import Inspector, RestartablePostgres, advance_clock, fire_due
from tests.helpers import cli, new_id, ok, refused, wait_until
from tests.processes import start_worker, stop_workers

FIRED, SKIPPED, BUFFERED = SlotOutcome.FIRED, SlotOutcome.SKIPPED, SlotOutcome.BUFFERED
WAITING = SlotOutcome.WAITING
#: Each schedule's slots as its workflow saw them, in the order they ran.
RUNS: dict[str, list[datetime]] = defaultdict(list)
#: A schedule's runs wait for its gate (an unfinished run, for the overlap policies).
GATES: dict[str, threading.Event] = {}


@pytest.fixture(autouse=True)
def _clean_up() -> Iterator[None]:
    """Schedules defined by a test are forgotten after it (a later launch in this process
    must not fire them), and every run it held back is let go."""
    before = {s.name for s in registered_schedules()}
    yield
    for gate in GATES.values():
        gate.set()
    forget_schedules(*({s.name for s in registered_schedules()} - before))


def define(cron: str = "* * * * *", *, gated: bool = False, **options: Any) -> str:
    """A schedule of a fresh workflow that notes its slot (and waits at its gate)."""
    name = new_id("sched")
    if gated:
        GATES[name] = threading.Event()

    @da.durable_workflow(name=f"{name}-job")
    def job(scheduled_at: datetime) -> str:
        RUNS[name].append(scheduled_at)
        gate = GATES.get(name)
        if gate is not None:
            assert gate.wait(60), "the test never let the run finish"
        return f"{scheduled_at:%H:%M:%S}"

    da.scheduled(cron, name=name, **options)(job)
    return name


def database_now(engine: Engine) -> datetime:
    return datetime.fromtimestamp(engine.db.messages.database_time(), UTC)


def record(engine: Engine) -> None:
    """The first look: it records the test's schedules. Taken half a minute from any
    minute's slot, so that none comes due between recording and looking."""
    now = database_now(engine)
    advance_clock((30 - now.second - now.microsecond / 1e6) % 60)
    assert fire_due(engine) == []


def to_next_slot(engine: Engine, name: str, *, later: timedelta = timedelta(0)) -> datetime:
    """Move the clock half a second past the schedule's next slot (plus ``later``): a
    whole minute from the slot after it, however slow the machine."""
    slot = read_schedule(engine.db, name).next_slot
    assert slot is not None
    advance_clock((slot + later - database_now(engine)).total_seconds() + 0.5)
    return slot + later


def outcomes(fired: list[FiredSlot]) -> list[tuple[datetime, SlotOutcome, bool]]:
    return [(f.slot, f.outcome, f.started) for f in fired]


def result_of(name: str, slot: datetime) -> Any:
    return da.retrieve(slot_workflow_id(name, slot)).result(timeout=60)


MINUTE = timedelta(minutes=1)


# -- one process, driven one look at a time -----------------------------------------------


def test_a_slot_runs_once_under_its_id_with_its_time(engine: Engine, inspector: Inspector) -> None:
    name = define()
    record(engine)  # its first slot is the next one
    slot = to_next_slot(engine, name)
    fired = fire_due(engine)
    assert outcomes(fired) == [(slot, FIRED, True)]
    assert fired[0].workflow_id == f"{name}@{slot:%Y-%m-%dT%H:%M:%SZ}"
    assert result_of(name, slot) == f"{slot:%H:%M:%S}"
    assert RUNS[name] == [slot] and RUNS[name][0].utcoffset() == timedelta(0)
    # every later look, and the slot's transaction sent again, leave it alone
    assert fire_due(engine) == [] and fire_due(engine) == []
    info = read_schedule(engine.db, name)
    assert (info.last_slot, info.last_workflow_id) == (slot, fired[0].workflow_id)
    assert info.last_status is da.WorkflowStatus.SUCCESS and info.next_slot == slot + MINUTE
    assert inspector.workflows(name=f"{name}-job") == [inspector.workflow(fired[0].workflow_id)]
    later = to_next_slot(engine, name)
    assert outcomes(fire_due(engine)) == [(later, FIRED, True)]
    assert result_of(name, later) and RUNS[name] == [slot, later]


def test_catch_up_after_downtime_latest_all_or_none(engine: Engine) -> None:
    latest = define(overlap="allow")
    every = define(catch_up="all", catch_up_window=timedelta(minutes=5), overlap="allow")
    none = define(catch_up="none", overlap="allow")
    record(engine)
    first = to_next_slot(engine, latest, later=9 * MINUTE)  # ten slots due at once
    fired: dict[str, list[datetime]] = defaultdict(list)
    for slot in fire_due(engine):
        assert (slot.outcome, slot.started) == (FIRED, True)
        fired[slot.schedule].append(slot.slot)
    assert fired[latest] == [first]
    assert fired[every] == [first - m * MINUTE for m in (4, 3, 2, 1, 0)]
    assert fired[none] == [first]  # half a second late: on time
    passed = read_schedule(engine.db, every)  # older than the window: passed, counted
    assert (passed.passed_slots, passed.last_passed_slot) == (5, first - 5 * MINUTE)
    assert read_schedule(engine.db, latest).passed_slots == 0  # its promise is the latest
    for name, slots in fired.items():
        assert [result_of(name, s) for s in slots] == [f"{s:%H:%M:%S}" for s in slots]
    assert fire_due(engine) == []


def test_catch_up_none_passes_over_a_late_slot(engine: Engine) -> None:
    name = define("0 * * * *", catch_up="none")
    record(engine)
    late = read_schedule(engine.db, name).next_slot
    to_next_slot(engine, name, later=timedelta(minutes=10))  # ten minutes late
    assert fire_due(engine) == []
    info = read_schedule(engine.db, name)
    assert info.handled_through == late and info.last_slot is None
    on_time = to_next_slot(engine, name)
    assert outcomes(fire_due(engine)) == [(on_time, FIRED, True)]


def test_overlap_skip_does_not_start_a_slot_while_a_run_is_unfinished(
    engine: Engine, inspector: Inspector
) -> None:
    name = define(gated=True)
    record(engine)
    first = to_next_slot(engine, name)
    assert outcomes(fire_due(engine)) == [(first, FIRED, True)]
    wait_until(lambda: RUNS[name] == [first], 30, "the first run to start")
    second = to_next_slot(engine, name)
    assert outcomes(fire_due(engine)) == [(second, SKIPPED, False)]
    info = read_schedule(engine.db, name)
    assert (info.skipped_slots, info.last_skipped_slot, info.last_slot) == (1, second, first)
    GATES[name].set()
    assert result_of(name, first)
    third = to_next_slot(engine, name)
    assert outcomes(fire_due(engine)) == [(third, FIRED, True)]
    assert result_of(name, third) and RUNS[name] == [first, third]
    assert inspector.workflow(slot_workflow_id(name, second)) is None  # skipped, never run


def test_overlap_allow_starts_regardless(engine: Engine) -> None:
    name = define(gated=True, overlap="allow")
    record(engine)
    first = to_next_slot(engine, name)
    assert outcomes(fire_due(engine)) == [(first, FIRED, True)]
    second = to_next_slot(engine, name)
    assert outcomes(fire_due(engine)) == [(second, FIRED, True)]
    wait_until(lambda: len(RUNS[name]) == 2, 30, "both runs to start")
    GATES[name].set()
    assert result_of(name, first) and result_of(name, second)


def test_overlap_buffer_one_keeps_one_slot_that_starts_when_the_run_ends(engine: Engine) -> None:
    name = define(gated=True, overlap="buffer_one")
    record(engine)
    first = to_next_slot(engine, name)
    assert outcomes(fire_due(engine)) == [(first, FIRED, True)]
    second = to_next_slot(engine, name)
    assert outcomes(fire_due(engine)) == [(second, BUFFERED, False)]
    third = to_next_slot(engine, name)
    assert outcomes(fire_due(engine)) == [(third, SKIPPED, False)]  # one waits already
    info = read_schedule(engine.db, name)
    assert (info.buffered_slot, info.skipped_slots) == (second, 1)
    GATES[name].set()
    assert result_of(name, first)
    buffered = fire_due(engine)
    assert outcomes(buffered) == [(second, FIRED, True)]  # runs the slot it waited with
    assert result_of(name, second) == f"{second:%H:%M:%S}"
    assert read_schedule(engine.db, name).buffered_slot is None
    fourth = to_next_slot(engine, name)
    assert outcomes(fire_due(engine)) == [(fourth, FIRED, True)]
    assert result_of(name, fourth) and RUNS[name] == [first, second, fourth]


def test_catch_up_all_runs_a_slot_due_during_a_run_after_it_within_the_window(
    engine: Engine,
) -> None:
    """overlap="skip" under catch_up="all": a slot due while a run is unfinished waits its
    turn (nothing recorded) and runs after it; one that falls out of the window first is
    passed over and counted."""
    name = define(gated=True, catch_up="all", catch_up_window=2 * MINUTE)
    record(engine)
    first = to_next_slot(engine, name)
    assert outcomes(fire_due(engine)) == [(first, FIRED, True)]
    second = to_next_slot(engine, name)
    assert outcomes(fire_due(engine)) == [(second, WAITING, False)]
    third = to_next_slot(engine, name)
    assert outcomes(fire_due(engine)) == [(second, WAITING, False)]  # the oldest goes first
    info = read_schedule(engine.db, name)
    assert (info.handled_through, info.skipped_slots, info.passed_slots) == (first, 0, 0)
    fourth = to_next_slot(engine, name)  # the second slot is now older than the window
    assert outcomes(fire_due(engine)) == [(third, WAITING, False)]
    info = read_schedule(engine.db, name)
    assert (info.passed_slots, info.last_passed_slot, info.skipped_slots) == (1, second, 0)
    GATES[name].set()
    assert result_of(name, first)
    GATES[name].clear()  # the third's run waits at the gate: the fourth waits for it
    assert outcomes(fire_due(engine)) == [(third, FIRED, True), (fourth, WAITING, False)]
    GATES[name].set()
    assert result_of(name, third)
    assert outcomes(fire_due(engine)) == [(fourth, FIRED, True)]
    assert result_of(name, fourth) and RUNS[name] == [first, third, fourth]


def test_pause_and_resume(engine: Engine) -> None:
    name = define()
    record(engine)
    assert da.operations.pause_schedule(name) is True
    assert da.operations.pause_schedule(name) is False  # already paused: nothing changes
    paused_at = read_schedule(engine.db, name)
    assert paused_at.paused and paused_at.next_slot is None
    advance_clock(180)  # three slots come due while it is paused
    assert fire_due(engine) == []
    assert read_schedule(engine.db, name).handled_through == paused_at.handled_through
    assert (
        da.operations.resume_schedule(name) is True and da.operations.resume_schedule(name) is False
    )
    assert fire_due(engine) == []  # the slots of the pause are not caught up
    slot = to_next_slot(engine, name)
    assert outcomes(fire_due(engine)) == [(slot, FIRED, True)]
    with pytest.raises(da.errors.ScheduleNotFoundError, match="no schedule named 'no-such'"):
        da.operations.pause_schedule("no-such")


def test_backfill_runs_each_missed_slot_once(engine: Engine) -> None:
    name = define()
    record(engine)
    first = read_schedule(engine.db, name).next_slot
    assert first is not None
    last = to_next_slot(engine, name, later=5 * MINUTE)  # six slots passed, none fired
    report = da.operations.backfill_schedule(name, first, first + 3 * MINUTE)
    slots = [first + m * MINUTE for m in range(4)]
    assert report.fired == [slot_workflow_id(name, s) for s in slots]
    assert (report.slots, report.already_fired) == (4, 0)
    assert [result_of(name, s) for s in slots] == [f"{s:%H:%M:%S}" for s in slots]
    # again, and wider up to now: only the slots that never ran
    again = da.operations.backfill_schedule(name, first, last + timedelta(days=1))
    assert (again.slots, again.already_fired, len(again.fired)) == (6, 4, 2)
    assert result_of(name, last)
    # the schedule reaching a backfilled slot does not run it again
    assert outcomes(fire_due(engine)) == [(last, FIRED, False)]
    assert sorted(RUNS[name]) == [first + m * MINUTE for m in range(6)]


def test_backfill_refusals(engine: Engine, inspector: Inspector) -> None:
    name = define("* * * * * *")
    fire_due(engine)  # recorded (a slot may come due meanwhile: one a second)
    now = database_now(engine)
    with pytest.raises(da.errors.ScheduleError, match="more than 10,000 slots"):
        da.operations.backfill_schedule(name, now - timedelta(hours=3), now)
    with pytest.raises(da.errors.ScheduleError, match=r"starts .* after it ends"):
        da.operations.backfill_schedule(name, now, now - MINUTE)
    with pytest.raises(da.errors.ScheduleError, match="timezone-aware"):
        da.operations.backfill_schedule(name, datetime(2026, 1, 1), datetime(2026, 1, 2))
    with pytest.raises(da.errors.ScheduleNotFoundError):
        da.operations.backfill_schedule("no-such", now - MINUTE, now)
    assert inspector.workflow(slot_workflow_id(name, now - timedelta(hours=2))) is None


def test_a_client_lists_pauses_resumes_and_backfills(engine: Engine) -> None:
    """The same actions as Client methods, from the database alone: the backfilled slots
    are PENDING without an owner, and this process (which has the workflow) takes them."""
    name = define()
    record(engine)
    client = da.Client.over(engine.db)
    assert name in [s.name for s in client.list_schedules()]
    assert client.pause_schedule(name) is True and client.pause_schedule(name) is False
    assert client.get_schedule(name).paused
    assert client.resume_schedule(name) is True and client.resume_schedule(name) is False
    first = client.get_schedule(name).next_slot
    assert first is not None
    to_next_slot(engine, name, later=MINUTE)  # two slots passed, none fired
    report = client.backfill_schedule(name, first, first + MINUTE)
    assert (report.slots, report.already_fired) == (2, 0)
    assert [result_of(name, s) for s in (first, first + MINUTE)] == [
        f"{s:%H:%M:%S}" for s in (first, first + MINUTE)
    ]
    with pytest.raises(da.errors.ScheduleNotFoundError):
        client.get_schedule("no-such")


# -- the scheduler thread, the CLI, faults -------------------------------------------------


def test_the_scheduler_thread_fires_when_the_clock_moves(
    dbos_agent_database_url: str, executor_id: str, inspector: Inspector
) -> None:
    name = define("*/5 * * * *")
    runtime = da.launch(dbos_agent_database_url, executor_id=executor_id, workers=4)
    try:
        engine = current_engine()
        assert "dbos-agent-scheduler" in {t.name for t in threading.enumerate()}
        wait_until(
            lambda: any(s.name == name for s in da.operations.list_schedules()),
            30,
            "it to be recorded",
        )
        slot = to_next_slot(engine, name)  # the clock moved: the thread looks at once
        wid = slot_workflow_id(name, slot)
        wait_until(lambda: inspector.status(wid) is da.WorkflowStatus.SUCCESS, 30, "the slot's run")
    finally:
        runtime.shutdown()
    quiet = da.launch(dbos_agent_database_url, executor_id=executor_id, run_schedules=False)
    try:
        assert "dbos-agent-scheduler" not in {t.name for t in threading.enumerate()}
    finally:
        quiet.shutdown()


def test_the_cli_lists_pauses_resumes_and_backfills(
    engine: Engine, dbos_agent_database_url: str
) -> None:
    url = dbos_agent_database_url
    name = define(timezone="Europe/Paris")
    record(engine)
    registered = read_schedule(engine.db, name).handled_through
    slot = to_next_slot(engine, name)
    assert outcomes(fire_due(engine)) == [(slot, FIRED, True)]
    assert result_of(name, slot)
    table = ok(cli(url, "schedules"))
    assert table.splitlines()[0].split()[:4] == ["NAME", "CRON", "TIMEZONE", "PAUSED"]
    line = next(line for line in table.splitlines() if line.startswith(name))
    assert "* * * * *" in line and "Europe/Paris" in line and "SUCCESS" in line
    assert f"{slot:%Y-%m-%d %H:%M:%S}" in line and slot_workflow_id(name, slot) in line
    [document] = [
        s for s in json.loads(ok(cli(url, "schedules", "list", "--json"))) if s["name"] == name
    ]
    assert document["cron"] == "* * * * *" and document["timezone"] == "Europe/Paris"
    assert document["paused"] is False and document["last_status"] == "SUCCESS"
    assert document["last_slot"] == slot.isoformat()
    assert document["last_workflow_id"] == slot_workflow_id(name, slot)
    assert document["next_slot"] is not None and document["catch_up_window"] == 3600.0

    paused = json.loads(ok(cli(url, "schedules", "pause", name, "--json")))
    assert paused == {"name": name, "paused": True, "changed": True}
    assert "already paused" in ok(cli(url, "schedules", "pause", name))
    assert read_schedule(engine.db, name).paused
    assert "resumed schedule" in ok(cli(url, "schedules", "resume", name))
    assert not read_schedule(engine.db, name).paused

    # a backfill of slots before the schedule existed (the CLI's clock is not moved)
    start, end = registered - 10 * MINUTE, registered - 6 * MINUTE
    expected = CronTimes("* * * * *", "UTC").within(start, end, 100)
    args = ["schedules", "backfill", name, "--from", start.isoformat(), "--to", end.isoformat()]
    report = json.loads(ok(cli(url, *args, "--json")))
    assert report["fired"] == [slot_workflow_id(name, s) for s in expected]
    assert (report["slots"], report["already_fired"]) == (len(expected), 0)
    recover_pending(engine)  # what a worker (or the schedule's executor) does with them
    assert [result_of(name, s) for s in expected] == [f"{s:%H:%M:%S}" for s in expected]
    assert f"backfilled 0 slot(s) of schedule {name}" in ok(cli(url, *args))

    refused(cli(url, "schedules", "pause", "no-such"), 1, "no schedule named 'no-such'")
    refused(cli(url, "schedules", "resume", "no-such", "--json"), 1, "no schedule named")
    wide = ["--from", (start - timedelta(days=10)).isoformat(), "--to", start.isoformat()]
    refused(cli(url, "schedules", "backfill", name, *wide), 1, "more than 10,000 slots")
    refused(cli(url, "schedules", "backfill", name, "--from", "2h"), 2, "--to")
    refused(cli(url, "schedules", "backfill", name, "--from", "soon", "--to", "1h"), 2, "--from")


def test_firing_rides_out_killed_connections_and_a_restart(
    dbos_agent_restartable_postgres: RestartablePostgres, restartable_url: str, executor_id: str
) -> None:
    server, url = dbos_agent_restartable_postgres, restartable_url
    name = define()
    runtime = da.launch(url, executor_id=executor_id, workers=4, run_schedules=False)
    try:
        engine = current_engine()
        fire_due(engine)

        def fire_until_decided() -> list[FiredSlot]:
            fired: list[FiredSlot] = []  # a look right after a restart may wait for the session

            def look() -> bool:
                fired.extend(fire_due(engine))
                return bool(fired)

            wait_until(look, 30, "a slot fired")
            return fired

        assert server.terminate(url, "dbos_agent") >= 1  # the pooled connections
        first = to_next_slot(engine, name)
        assert outcomes(fire_until_decided()) == [(first, FIRED, True)]
        assert result_of(name, first)  # finished: the next slot is not an overlap
        server.restart()
        second = to_next_slot(engine, name)
        assert outcomes(fire_until_decided()) == [(second, FIRED, True)]
        server.terminate(url, "dbos_agent")
        assert da.operations.pause_schedule(name) and da.operations.resume_schedule(name)
        assert da.operations.backfill_schedule(name, first, second).already_fired == 2
        assert result_of(name, second) and RUNS[name] == [first, second]
    finally:
        runtime.shutdown()


# -- three worker processes, a kill -9 ------------------------------------------------------


def _set_clock(path: Path, offset: float) -> None:
    """Every worker follows this offset within a few milliseconds (schedule_app.py)."""
    temporary = path.with_suffix(".new")
    temporary.write_text(repr(offset))
    temporary.replace(path)


def _slot_runs(url: str, name: str) -> dict[datetime, tuple[str, Any]]:
    """Every slot the schedule fired: its workflow's status and output."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT workflow_id, status, output FROM dbos_agent.workflows"
            " WHERE name = 'tick' AND workflow_id LIKE %s",
            (f"{name}@%",),
        ).fetchall()
    return {
        datetime.strptime(wid.split("@", 1)[1], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC): (
            status,
            output,
        )
        for wid, status, output in rows
    }


def _log_lines(log: Path) -> list[tuple[int, str]]:
    """``(pid, slot)`` of every whole line (a line being written has no newline yet)."""
    lines = log.read_text().split("\n")[:-1]
    return [(int(pid), slot) for pid, slot in (line.split() for line in lines)]


def _alive_sessions(url: str, pids: list[int]) -> int:
    """How many of ``pids`` hold a session (0 before the first one created the schema)."""
    with psycopg.connect(url) as conn:
        try:
            row = conn.execute(
                "SELECT count(*) FROM dbos_agent.executors WHERE pid = ANY(%s)"
                " AND heartbeat_at > '-infinity'",
                (pids,),
            ).fetchone()
        except psycopg.errors.UndefinedTable:
            return 0
    return int(row[0]) if row else 0


def test_three_processes_fire_every_slot_once_through_a_kill_9(
    dbos_agent_database_url: str, tmp_path: Path
) -> None:
    url, log, clock = dbos_agent_database_url, tmp_path / "slots.log", tmp_path / "clock"
    log.touch()
    _set_clock(clock, 0.0)
    name = new_id("every-second")
    env = {
        "SCHEDULE_APP_LOG": str(log),
        "SCHEDULE_APP_CLOCK": str(clock),
        "SCHEDULE_APP_NAME": name,
    }
    # a long lease: the workers' clocks move in small steps that may not land together
    workers = [
        start_worker(url, "tests.apps.schedule_app", "--quiet", "--lease", "600", env=env)
        for _ in range(3)
    ]
    stderr = ""
    try:
        pids = [w.pid for w in workers]
        wait_until(lambda: _alive_sessions(url, pids) == 3, 60, "three workers up")
        offset, victim = 0.0, None
        # two minutes of slots on the database clock, in about fifteen seconds
        while len(_slot_runs(url, name)) < 130:
            offset += 1.0
            _set_clock(clock, offset)
            time.sleep(0.1)
            if victim is None and len(_slot_runs(url, name)) >= 60 and _log_lines(log):
                victim = next(w for w in workers if w.pid == _log_lines(log)[-1][0])
                victim.send_signal(signal.SIGKILL)  # the process that fired the latest slot
                victim.wait(10)
            assert offset < 1000, "the slots stopped coming"
        checked = max(_slot_runs(url, name))
        wait_until(
            lambda: all(
                status == "SUCCESS"
                for slot, (status, _) in _slot_runs(url, name).items()
                if slot <= checked
            ),
            60,
            "every slot fired so far to finish",
        )
    finally:
        stderr = stop_workers(workers)
    assert victim is not None
    runs = _slot_runs(url, name)
    slots = sorted(runs)
    # no gap: one workflow for every second from the first slot on, each its slot's own
    assert slots == [slots[0] + timedelta(seconds=s) for s in range(len(slots))], stderr
    done = [slot for slot in slots if slot <= checked]
    assert len(done) >= 120
    for slot in done:
        assert runs[slot] == ("SUCCESS", f"{slot:%Y-%m-%dT%H:%M:%SZ}"), (slot, runs[slot])
    # each slot's step ran once; twice only where the killed process was running it
    ran: dict[str, Counter[int]] = defaultdict(Counter)
    for pid, slot_text in _log_lines(log):
        ran[slot_text][pid] += 1
    for slot in done:
        by_pid = ran[f"{slot:%Y-%m-%dT%H:%M:%SZ}"]
        count = sum(by_pid.values())
        assert count == 1 or (count == 2 and by_pid[victim.pid] == 1), (slot, by_pid)
    firers = {pid for by_pid in ran.values() for pid in by_pid}
    assert victim.pid in firers and len(firers - {victim.pid}) >= 1

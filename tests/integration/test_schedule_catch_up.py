"""``catch_up="all"`` keeps every slot it promises: after every process was down, and
across a Postgres restart, each missed slot of a per-second schedule runs exactly once;
with ``overlap`` ``"skip"`` or ``"buffer_one"`` one after another, in slot order.

Counted from outside the engine: the workflows table (one workflow per slot) and a log
the slots' step appends to (``start SLOT``, then ``end SLOT``). Time is the database
clock, moved with ``advance_clock``; nothing waits on the wall clock but the predicates.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

import dbos_agent as da
from dbos_agent._engine.runtime.current import current_engine
from dbos_agent._engine.schedules import forget_schedules, registered_schedules
from dbos_agent._engine.schedules.operations import read_schedule
from dbos_agent.records import ScheduleInfo
from dbos_agent.testing import RestartablePostgres, advance_clock
from tests.helpers import new_id, wait_until

SECOND = timedelta(seconds=1)
#: Where each schedule's step notes the slots it runs.
LOGS: dict[str, Path] = {}


@pytest.fixture(autouse=True)
def _forget() -> Iterator[None]:
    """A later launch in this process must not fire this test's schedule."""
    before = {s.name for s in registered_schedules()}
    yield
    forget_schedules(*({s.name for s in registered_schedules()} - before))


def define(tmp_path: Path, **options: Any) -> str:
    """A per-second ``catch_up="all"`` schedule whose one step logs its slot."""
    name = new_id("catch-up")
    LOGS[name] = tmp_path / f"{name}.log"
    LOGS[name].touch()

    @da.step(name=f"{name}-note")
    def note(slot: str) -> str:
        with LOGS[name].open("a") as log:
            log.write(f"start {slot}\n")
            log.flush()
            log.write(f"end {slot}\n")
        return slot

    @da.durable_workflow(name=f"{name}-job")
    def job(scheduled_at: datetime) -> str:
        return note(f"{scheduled_at:%Y-%m-%dT%H:%M:%SZ}")

    da.scheduled("* * * * * *", name=name, catch_up="all", **options)(job)
    return name


def slot_runs(url: str, name: str) -> dict[datetime, str]:
    """The status of each slot's workflow, by slot."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT workflow_id, status FROM dbos_agent.workflows WHERE name = %s",
            (f"{name}-job",),
        ).fetchall()
    return {
        datetime.strptime(wid.split("@", 1)[1], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC): status
        for wid, status in rows
    }


def finished_through(url: str, name: str, last: datetime) -> bool:
    """Every slot from the first fired through ``last`` has a finished run."""
    runs = slot_runs(url, name)
    if not runs:
        return False
    first = min(runs)
    expected = [first + s * SECOND for s in range(int((last - first) / SECOND) + 1)]
    return all(runs.get(slot) == "SUCCESS" for slot in expected)


def check_every_slot_ran_once(url: str, name: str, last: datetime, *, in_order: bool) -> None:
    """No gap from the first slot through ``last``; each slot's step ran once (and, in
    order, each run started after the previous one ended, in slot order)."""
    runs = slot_runs(url, name)
    slots = sorted(runs)
    assert slots == [slots[0] + s * SECOND for s in range(len(slots))], "a slot is missing"
    assert slots[-1] >= last
    done = [slot for slot in slots if slot <= last]
    assert all(runs[slot] == "SUCCESS" for slot in done)
    lines = [line.split() for line in LOGS[name].read_text().splitlines()]
    started = Counter(slot for kind, slot in lines if kind == "start")
    assert all(started[f"{slot:%Y-%m-%dT%H:%M:%SZ}"] == 1 for slot in done), started
    assert set(started.values()) == {1}
    if in_order:
        for (kind_a, slot_a), (kind_b, slot_b) in itertools.pairwise(lines):
            if kind_a == "start":
                assert (kind_b, slot_b) == ("end", slot_a), lines  # none overlapped it
            else:
                assert kind_b == "start" and slot_b > slot_a, lines  # the next slot, later


def schedule_info(name: str) -> ScheduleInfo:
    return read_schedule(current_engine().db, name)


@pytest.mark.parametrize("overlap", ["skip", "buffer_one", "allow"])
def test_every_slot_missed_while_every_process_was_down_runs_once(
    overlap: str, dbos_agent_database_url: str, executor_id: str, tmp_path: Path
) -> None:
    url = dbos_agent_database_url
    name = define(tmp_path, overlap=overlap)
    runtime = da.launch(url, executor_id=executor_id, workers=4)
    try:
        wait_until(lambda: "SUCCESS" in slot_runs(url, name).values(), 30, "a first run")
    finally:
        runtime.shutdown()
    down_from = max(slot_runs(url, name))
    runtime = da.launch(url, executor_id=executor_id, workers=4)
    try:
        advance_clock(40)  # the schedule's processes were all down for forty seconds
        last = down_from + 40 * SECOND
        wait_until(lambda: finished_through(url, name, last), 60, "every missed slot's run")
        info = schedule_info(name)
    finally:
        runtime.shutdown()
    check_every_slot_ran_once(url, name, last, in_order=overlap != "allow")
    assert (info.skipped_slots, info.passed_slots, info.buffered_slot) == (0, 0, None)


def test_slots_due_while_postgres_restarts_run_once_it_is_back(
    dbos_agent_restartable_postgres: RestartablePostgres,
    restartable_url: str,
    executor_id: str,
    tmp_path: Path,
) -> None:
    server, url = dbos_agent_restartable_postgres, restartable_url
    name = define(tmp_path)  # overlap="skip", the default
    runtime = da.launch(url, executor_id=executor_id, workers=4)
    try:
        wait_until(lambda: "SUCCESS" in slot_runs(url, name).values(), 30, "a first run")
        down_from = max(slot_runs(url, name))
        with server.down():
            advance_clock(2.5)  # two slots (at least) come due while the server is down
        last = down_from + 3 * SECOND
        wait_until(lambda: finished_through(url, name, last), 60, "the slots of the outage")
        info = schedule_info(name)
    finally:
        runtime.shutdown()
    check_every_slot_ran_once(url, name, last, in_order=True)
    assert (info.skipped_slots, info.passed_slots) == (0, 0)

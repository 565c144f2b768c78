"""A take-over and a session coming back, interleaved on purpose.

Session 9 looks dead (its lock is gone, its heartbeat an hour old) while it is only cut
off: after a Postgres restart it reconnects, takes its lock back and registers again.
If a take-over judged it dead and committed *after* the session had re-registered and
confirmed it still owned its workflow, both would run the workflow's next step (the
chaos test once caught exactly that). The take-over statements therefore lock the dead
session's ``executors`` row (``FOR SHARE``) while they judge it:

* a session that registers (or heartbeats) while a take-over is open waits for it, and
  then reads its workflow's new owner;
* a session that registered first is seen alive, and nothing of it is taken.

Each order is forced here with two connections and an open transaction, for both
``claim_workflows`` (recovery's pass) and ``take_over_workflow`` (a direct call).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from dbos_agent._storage.locks import SESSION_LOCK_CLASS
from dbos_agent._storage.rows import Runner
from dbos_agent._storage.sql_files import query
from tests.helpers import migrated_database, wait_until

RUNNER = Runner(["job"], None, "code")
#: The database clock of every connection here, an hour ahead: session 9's heartbeat
#: (written at the real time) is an hour old by it, and so is the server's start,
#: however recently the test's Postgres came up (a session is last seen no earlier
#: than that, see dbos_agent.last_seen).
AHEAD = "-c dbos_agent.clock_offset=1h"
DEAD_LOOKING = 9  # the session that is only cut off
CLAIMER = 1


@pytest.fixture
def database(dbos_agent_postgres_url: str) -> Iterator[str]:
    """Session 9, dead by the rules (no lock, its heartbeat and lock loss an hour old by
    the clock of :data:`AHEAD`), owning the PENDING workflow ``w``; the claimer,
    session 1, alive."""
    with migrated_database(dbos_agent_postgres_url) as url:
        with psycopg.connect(url) as conn:
            conn.execute(
                "INSERT INTO dbos_agent.executors (session_key, executor_id, hostname, pid,"
                " lease_seconds, grace_seconds, heartbeat_at, lock_lost_at)"
                " VALUES (%(dead)s, 'exec-9', 'test', 9, 30, 3, now(), now()),"
                "        (%(claimer)s, 'exec-1', 'test', 1, 30, 3, now() + interval '1 hour',"
                "         NULL)",
                {"dead": DEAD_LOOKING, "claimer": CLAIMER},
            )
            conn.execute(
                "INSERT INTO dbos_agent.workflows (workflow_id, name, status, inputs,"
                " executor_id, max_recovery_attempts, created_at, owner_key)"
                " VALUES ('w', 'job', 'PENDING', '[]', 'exec-9', 10, now(), %s)",
                (DEAD_LOOKING,),
            )
        yield url


def claim(conn: psycopg.Connection[Any]) -> list[str]:
    """Recovery's claim, for the claimer, on ``conn`` (its transaction left open)."""
    params = {
        "owner_key": CLAIMER,
        "executor_id": "exec-1",
        "orphans": True,
        "skip_ids": [],
        "after_created_at": datetime(1970, 1, 1, tzinfo=UTC),
        "after_workflow_id": "",
        "limit": 100,
        **RUNNER.params(),
    }
    return [str(row[0]) for row in conn.execute(query("claim_workflows"), params).fetchall()]


def take_over(conn: psycopg.Connection[Any]) -> list[str]:
    """A direct call's take-over of ``w``, for the claimer (its transaction left open)."""
    params = {
        "workflow_id": "w",
        "old_owner_key": DEAD_LOOKING,
        "owner_key": CLAIMER,
        "executor_id": "exec-1",
    }
    return [str(row[0]) for row in conn.execute(query("take_over_workflow"), params).fetchall()]


TAKE_OVERS = {"claim_workflows": claim, "take_over_workflow": take_over}


def comes_back(url: str, done: threading.Event, backend: list[int]) -> None:
    """Session 9 reconnecting: its lock taken back, then registered again (as
    ``ExecutorSession._reconnect`` does), committed."""
    with psycopg.connect(url, autocommit=True, options=AHEAD) as conn:
        backend.append(conn.info.backend_pid)
        conn.execute("SELECT pg_advisory_lock(%s, %s)", (SESSION_LOCK_CLASS, DEAD_LOOKING))
        conn.execute(
            query("register_executor"),
            {
                "session_key": DEAD_LOOKING,
                "executor_id": "exec-9",
                "app_version": None,
                "code_version": None,
                "hostname": "test",
                "pid": 9,
                "process_key": None,
                "lease_seconds": 30,
                "grace_seconds": 3,
                "queues": [],
                "lease_only": False,
            },
        )
        done.set()
        # keep the lock (and so the session) until the test has looked
        done.wait()
        conn.execute("SELECT pg_advisory_unlock_all()")


def owner_of_w(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT owner_key FROM dbos_agent.workflows WHERE workflow_id = 'w'")
        found = row.fetchone()
    assert found is not None
    return int(found[0])


def waiting_on_a_lock(url: str, pid: int) -> bool:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
        ).fetchone()
    return row is not None and row[0] == "Lock"


@pytest.mark.parametrize("name", sorted(TAKE_OVERS))
def test_a_session_registering_during_a_take_over_waits_for_it_then_sees_the_new_owner(
    database: str, name: str
) -> None:
    take: Callable[[psycopg.Connection[Any]], list[str]] = TAKE_OVERS[name]
    registered, backend = threading.Event(), list[int]()
    with psycopg.connect(database, options=AHEAD) as claimer:
        assert take(claimer) == ["w"]  # judged dead, its row locked; not committed yet
        back = threading.Thread(target=comes_back, args=(database, registered, backend))
        back.start()
        try:
            wait_until(lambda: bool(backend), 10, "the session's connection")
            wait_until(
                lambda: waiting_on_a_lock(database, backend[0]),
                10,
                "the registration waiting for the take-over's lock",
            )
            assert not registered.is_set()
            claimer.commit()
            assert registered.wait(10), "the registration went on once the take-over ended"
            # what the session reads before its next live step: not its workflow any more
            assert owner_of_w(database) == CLAIMER
        finally:
            registered.set()
            back.join(10)


@pytest.mark.parametrize("name", sorted(TAKE_OVERS))
def test_a_session_registered_before_a_take_over_is_seen_alive_and_keeps_its_workflow(
    database: str, name: str
) -> None:
    registered, backend = threading.Event(), list[int]()
    back = threading.Thread(target=comes_back, args=(database, registered, backend))
    back.start()
    try:
        assert registered.wait(10)
        with psycopg.connect(database, options=AHEAD) as claimer:
            assert TAKE_OVERS[name](claimer) == []
        assert owner_of_w(database) == DEAD_LOOKING
    finally:
        registered.set()
        back.join(10)

"""A failover to a promoted standby is a restart, not a death sentence (migration 024).

A real synchronous standby (``pg_basebackup -R``) of a throwaway primary, and two worker
processes on a multi-host URL with ``target_session_attrs=read-write``. The primary is
stopped (``-m immediate``) for longer than the workers' lease; one worker is paused
(SIGSTOP) across the promotion of the standby, the way a GC pause or a starved CPU holds
a process, and goes on ~2 s later. A promoted standby's postmaster started before the
outage, so by the server's start alone (migration 022) every session was dead the moment
the new primary took writes: the paused worker lost its workflows to its peer, which ran
their steps in flight again. Now each session has its whole lease and grace from the
promotion, as after a restart. Counted from outside (fault_app's step log) and in the
database: no workflow is taken over, no step runs twice, every workflow finishes.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from dbos_agent.errors import PostgresNotFoundError
from dbos_agent.postgres.throwaway import LocalCluster
from tests.helpers import dead_sessions_after_start, dead_sessions_at, migrate, migrated_database
from tests.support.failover_workload import LEASE_S, FailoverWorkload, write_timeline

#: The paused worker stops this long before the promotion.
PAUSED_BEFORE_S = 1.0


@pytest.fixture
def primary_and_standby() -> Iterator[tuple[LocalCluster, LocalCluster]]:
    """A throwaway primary and a synchronous streaming standby of it."""
    try:
        primary = LocalCluster.start()
    except PostgresNotFoundError as exc:
        pytest.skip(f"a failover needs local PostgreSQL server binaries: {exc}")
    standby = None
    try:
        standby = LocalCluster.standby_of(primary, synchronous=True)
        yield primary, standby
    finally:
        primary.stop()  # first: a synchronous primary waits for its standby
        if standby is not None:
            standby.stop()


def test_a_worker_paused_across_a_failover_longer_than_its_lease_keeps_its_workflows(
    primary_and_standby: tuple[LocalCluster, LocalCluster], tmp_path: Path
) -> None:
    """The scenario of the module's doc: the primary stopped for longer than the lease,
    one worker paused from a second before the promotion to a second after its peer's
    take-over passes began to judge it on the new primary; nothing is taken over and no
    step runs twice."""
    primary, standby = primary_and_standby
    url = (
        f"postgresql://postgres@127.0.0.1:{primary.port},127.0.0.1:{standby.port}/postgres"
        "?target_session_attrs=read-write"
    )
    with FailoverWorkload(url, tmp_path / "steps.log") as work:
        primary.stop_server("immediate")  # nobody can heartbeat from now on
        # The outage itself, not a wait for a condition: it lasts past the lease.
        time.sleep(LEASE_S + 0.5 - PAUSED_BEFORE_S)
        work.paused.send_signal(signal.SIGSTOP)
        time.sleep(PAUSED_BEFORE_S)
        standby.promote()
        work.resume_once_judged()
        work.wait_finished()
    work.assert_nothing_moved()
    assert write_timeline(standby.url) == 2  # it was a promoted standby, not a restart


# -- the rule, statement by statement ------------------------------------------------


def test_after_a_promotion_a_session_has_its_lease_to_come_back(
    primary_and_standby: tuple[LocalCluster, LocalCluster],
) -> None:
    """dead_sessions() on a real promotion after an outage longer than a lease: nobody
    is dead for a lease once the new primary takes writes, and dead after it. A server
    in recovery answers without an error and judges nobody dead."""
    primary, standby = primary_and_standby
    migrate(primary.url)
    # applied on the standby (not only flushed there) when the commit returns
    with psycopg.connect(primary.url, options="-c synchronous_commit=remote_apply") as conn:
        # 7 is alive (its process is on its way back), 9 exited cleanly: 1 s leases
        conn.execute(
            "INSERT INTO dbos_agent.executors (session_key, executor_id, hostname, pid,"
            " lease_seconds, grace_seconds, heartbeat_at) VALUES"
            " (7, 'alive', 'test', 7, 1, 1, now()), (9, 'gone', 'test', 9, 1, 1, '-infinity')"
        )
    with psycopg.connect(standby.url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pg_is_in_recovery(), dbos_agent.write_timeline(),"
            " dbos_agent.server_began_at() = now()"
        ).fetchone()
    assert row == (True, None, True)  # a read-only standby: no write timeline, began now
    assert dead_sessions_at(standby.url) == [9]

    primary.stop_server("immediate")
    time.sleep(1.5)  # the outage itself, longer than the leases (not a wait for a condition)
    standby.promote()
    assert write_timeline(standby.url) == 2  # at once, whatever its checkpoint says
    assert dead_sessions_at(standby.url) == [9]  # timeline 2 is not recorded yet: began now
    with psycopg.connect(standby.url, autocommit=True) as conn:
        conn.execute("UPDATE dbos_agent.executors SET queues = queues WHERE false")  # records it
        epochs = conn.execute(
            "SELECT timeline, began_at > (SELECT heartbeat_at FROM dbos_agent.executors"
            "                             WHERE session_key = 7)"
            " FROM dbos_agent.server_epochs ORDER BY 1"
        ).fetchall()
    assert epochs == [(1, False), (2, True)]
    began = "dbos_agent.server_began_at()"  # judged as seen after it, however late we look
    assert dead_sessions_after_start(standby.url, 0.5, began) == [9]  # a lease from it
    assert dead_sessions_after_start(standby.url, 1.5, began) == [7, 9]  # and then no more


def test_a_restored_copy_forgets_the_later_timelines_of_its_old_history(
    dbos_agent_postgres_url: str,
) -> None:
    """A copy of the schema restored into another cluster carries the epochs of the old
    one: the first session write on the new server forgets those of timelines later than
    its own, so that its own promotion to such a timeline is dated by itself."""
    with (
        migrated_database(dbos_agent_postgres_url) as url,
        psycopg.connect(url, autocommit=True) as conn,
    ):
        conn.execute(
            "INSERT INTO dbos_agent.server_epochs (timeline, began_at)"
            " SELECT dbos_agent.write_timeline() + n, now() - interval '1 day'"
            " FROM generate_series(0, 2) AS n"
        )
        conn.execute("UPDATE dbos_agent.executors SET queues = queues WHERE false")
        rows = conn.execute(
            "SELECT timeline - dbos_agent.write_timeline() FROM dbos_agent.server_epochs"
        ).fetchall()
    assert rows == [(0,)]  # its own timeline stays (its start is the server's at the latest)

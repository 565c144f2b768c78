"""pg_auto_failover fails over after the primary crashes: a restart, not a death sentence.

The workload of tests/process/test_standby_failover.py (two worker processes, one paused across
the promotion), but the failover is pg_auto_failover's own: a monitor and two data nodes
run by ``pg_autoctl`` (tests/support/auto_failover.py), synchronous replication as it sets it up,
and the workers on the URL ``pg_autoctl show uri`` gives. The primary's machine crashes
(its keeper and its Postgres SIGKILLed, so nothing restarts it in place); the monitor
finds it unhealthy and promotes the standby, which takes writes once the primary's
demote timeout ran out. The outage lasts longer than the workers' lease; one worker is
paused from the monitor's decision to promote until a second after its peer's take-over
passes began to judge it on the new primary. Counted from outside and in the database:
no workflow is taken over, no step runs twice, every workflow finishes, on the former
standby, on a new timeline.

It needs pg_auto_failover (Debian: ``apt-get install postgresql-15-auto-failover``) and
skips without it, unless $DBOS_AGENT_REQUIRE_AUTO_FAILOVER is set (.ci/run sets it).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.helpers import wait_until
from tests.support.auto_failover import Formation, find_pg_autoctl
from tests.support.failover_workload import LEASE_S, FailoverWorkload, write_timeline

#: Set (as .ci/run does) to make a missing pg_autoctl a failure instead of a skip.
REQUIRE_ENV = "DBOS_AGENT_REQUIRE_AUTO_FAILOVER"
#: The workers' outage_timeout: above the failover (seconds with the formation's settings).
OUTAGE_TIMEOUT_S = 30.0


@pytest.fixture
def formation() -> Iterator[Formation]:
    """A monitor, a primary and its synchronous standby, with fast failover settings."""
    found = find_pg_autoctl()
    if found is None:
        why = (
            "needs pg_auto_failover's pg_autoctl and the pgautofailover extension "
            "(Debian: apt-get install postgresql-15-auto-failover; .ci/run installs it)"
        )
        if os.environ.get(REQUIRE_ENV):
            pytest.fail(f"{REQUIRE_ENV} is set, but the test {why}")
        pytest.skip(f"the test {why}")
    started = Formation.start(*found)
    try:
        yield started
        print(started.logs())  # pytest shows it if the test fails
    finally:
        started.stop()


def _server(url: str) -> tuple[int, int]:
    """The port of the server ``url`` reaches, and the timeline it writes on."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT inet_server_port()").fetchone()
    assert row is not None
    return int(row[0]), write_timeline(url)


def _replication(url: str) -> list[tuple[str, str]]:
    """The server's ``synchronous_standby_names`` and each streaming standby's state."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT current_setting('synchronous_standby_names'), sync_state"
            " FROM pg_stat_replication"
        ).fetchall()
    return [(str(names), str(state)) for names, state in rows]


def test_a_crash_of_the_primary_is_ridden_out_on_the_standby_pg_auto_failover_promotes(
    formation: Formation, tmp_path: Path
) -> None:
    """The scenario of the module's doc."""
    url = formation.url
    assert url.count(",") == 1 and "target_session_attrs=read-write" in url
    # node2, node1's synchronous standby, once settled: the keepers' reload of the settings
    # start() shortens makes node1 reload its own, and node2 may show as async meanwhile.
    wait_until(
        lambda: (
            _replication(formation.node_url("node1"))
            == [("ANY 1 (pgautofailover_standby_2)", "quorum")]
        ),
        60,
        "node2 to be node1's synchronous standby",
    )
    assert _server(url) == (formation.ports["node1"], 1)

    with FailoverWorkload(url, tmp_path / "steps.log", outage_timeout=OUTAGE_TIMEOUT_S) as work:
        crashed_at = time.monotonic()
        formation.crash("node1")  # nobody can heartbeat from now on
        wait_until(
            lambda: formation.states()["node2"][1] != "secondary",
            60,
            "the monitor failing over to node2",
            every=0.05,
        )
        work.paused.send_signal(signal.SIGSTOP)
        paused_at = time.monotonic()
        paused_before_writes = formation.read_only("node2")  # if now, then at the pause too
        wait_until(
            lambda: formation.states()["node2"][0] in ("wait_primary", "primary"),
            60,
            "node2 taking writes",
            every=0.05,
        )
        failover_s = time.monotonic() - crashed_at
        work.resume_once_judged()
        paused_s = time.monotonic() - paused_at
        work.wait_finished()
    ahead_s = crashed_at + failover_s - paused_at
    print(
        f"failover: {failover_s:.1f} s from the crash to node2's writes;"
        f" a worker paused {paused_s:.1f} s, from {ahead_s:.1f} s before them"
    )
    work.assert_nothing_moved()
    assert paused_before_writes, "node2 took writes before the worker was paused"
    assert failover_s > LEASE_S, failover_s  # the outage outlasted the lease (no upper bound)
    assert _server(url) == (formation.ports["node2"], 2)  # the promoted standby

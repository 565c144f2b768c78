"""Take-overs go to whoever can run them, and ``recover=False`` resumes nothing.

Real processes (tests/apps/takeover_app.py), killed -9, counted from outside: a log the steps
append to, and the database. A survivor claims a dead process's workflows only up to its
room (idle worker threads for sync workflows, free event-loop slots for async ones), so
two busy survivors share the work, and a survivor never holds PENDING workflows it cannot
start: a statement trigger installed by the test records, after every write to the
workflows table, how many PENDING workflows each session owns, by kind. In one process,
with no periodic pass in the test's time, a full process takes over nothing, then takes
over as its runs end.
"""

from __future__ import annotations

import subprocess
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest

import dbos_agent as da
from dbos_agent._storage.database import SystemDatabase
from dbos_agent.testing import Inspector, fresh_database, take_over_once
from tests.helpers import new_id, wait_until
from tests.processes import start_module, stop_workers

SYNC, ASYNC = "takeover_held", "takeover_aheld"
#: A session key the sequence of a fresh database hands out to no process in a test.
DEAD_KEY = 2_000_000_000

#: After every statement that writes workflows: the PENDING workflows each session owns.
_PROBE = """
CREATE TABLE public.pending_owned (owner_key integer, name text, pending integer);
CREATE FUNCTION public.note_pending_owned() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.pending_owned
    SELECT owner_key, name, count(*) FROM dbos_agent.workflows
    WHERE status = 'PENDING' AND owner_key IS NOT NULL GROUP BY owner_key, name;
    RETURN NULL;
END $$;
CREATE TRIGGER note_pending_owned AFTER INSERT OR UPDATE ON dbos_agent.workflows
    FOR EACH STATEMENT EXECUTE FUNCTION public.note_pending_owned();
"""


@contextmanager
def _database(server_url: str) -> Iterator[str]:
    """A database of this test alone, its schema applied and the probe installed."""
    with fresh_database(server_url) as url:
        db = SystemDatabase(url, pool_size=1)
        db.open()
        try:
            db.migrate()
        finally:
            db.close()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(_PROBE)
        yield url


def _app(url: str, folder: Path, executor: str, **options: object) -> subprocess.Popen[str]:
    """tests/apps/takeover_app.py as ``executor``; ``async_runs=2`` is ``--async-runs 2``."""
    args = ["--executor", executor]
    for name, value in options.items():
        args += [f"--{name.rstrip('_').replace('_', '-')}", str(value)]
    return start_module(url, "tests.apps.takeover_app", *args, env={"TAKEOVER_DIR": str(folder)})


def _ready(proc: subprocess.Popen[str], line: str = "started") -> None:
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == line


def _log(folder: Path) -> list[tuple[str, str, int]]:
    """``(what, workflow id, pid)`` of every step run, in order."""
    path = folder / "steps.log"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        what, wid, pid = line.split()
        rows.append((what, wid, int(pid)))
    return rows


def _waiting(folder: Path, pid: int) -> set[str]:
    """Workflows whose waiting step process ``pid`` has started."""
    return {wid for what, wid, p in _log(folder) if what == "wait" and p == pid}


def _value(url: str, sql: str, *params: object) -> Any:
    """The one value the statement returns."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(sql, params).fetchone()
    assert row is not None
    return row[0]


def _session_of(url: str, executor_id: str) -> int:
    sql = "SELECT session_key FROM dbos_agent.executors WHERE executor_id = %s"
    return int(_value(url, sql, executor_id))


def _owned_by(url: str, session_key: int, ids: list[str]) -> set[str]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT workflow_id FROM dbos_agent.workflows"
            " WHERE status = 'PENDING' AND owner_key = %s AND workflow_id = ANY(%s)",
            (session_key, ids),
        ).fetchall()
    return {str(r[0]) for r in rows}


def _most_pending(url: str, session_key: int, name: str) -> int:
    """The most PENDING workflows named ``name`` the session ever owned (the probe)."""
    return int(
        _value(
            url,
            "SELECT coalesce(max(pending), 0) FROM public.pending_owned"
            " WHERE owner_key = %s AND name = %s",
            session_key,
            name,
        )
    )


def test_busy_survivors_share_a_dead_process_s_workflows_as_their_room_allows(
    dbos_agent_postgres_url: str, tmp_path: Path
) -> None:
    """Three processes; one dies -9 holding 8 sync and 5 async workflows while the two
    others are full (3 threads, 2 event-loop slots, each busy with its own). The
    survivors claim nothing while full; as their own work ends, each claims what it can
    start, so each takes 3 sync and 2 async and the last 3 wait, claimable, until room
    frees. No survivor ever owns more PENDING workflows than it can run."""
    vp = new_id("victim")
    victim_ids = [f"{vp}-s-{i}" for i in range(8)] + [f"{vp}-a-{i}" for i in range(5)]
    with _database(dbos_agent_postgres_url) as url:
        victim = _app(
            url,
            tmp_path,
            "victim",
            prefix=vp,
            sync=8,
            async_=5,
            flag="victim-go",
            workers=8,
            async_runs=5,
        )
        survivors = [
            _app(
                url,
                tmp_path,
                f"survivor-{x}",
                prefix=new_id(x),
                sync=3,
                async_=2,
                flag="own-go",
                workers=3,
                async_runs=2,
                take_over_every=0.5,
            )
            for x in "ab"
        ]
        procs = [victim, *survivors]
        try:
            for proc in procs:
                _ready(proc)
            wait_until(
                lambda: (
                    len(_waiting(tmp_path, victim.pid)) == 13
                    and all(len(_waiting(tmp_path, s.pid)) == 5 for s in survivors)
                ),
                60,
                "every workflow of the three processes waiting in its second step",
                every=0.05,
            )
            dead = _session_of(url, "victim")
            keys = [_session_of(url, f"survivor-{x}") for x in "ab"]
            victim.kill()
            victim.wait(10)
            # a survivor's take-over pass finds the pid gone and declares the session dead
            wait_until(
                lambda: _value(
                    url,
                    "SELECT heartbeat_at = '-infinity' FROM dbos_agent.executors"
                    " WHERE session_key = %s",
                    dead,
                ),
                60,
                "the victim's session declared dead",
            )
            assert _owned_by(url, dead, victim_ids) == set(victim_ids), "full: none claimed"

            (tmp_path / "own-go").touch()  # the survivors' own work ends: room, one by one

            def taken(survivor: subprocess.Popen[str]) -> set[str]:
                return set(victim_ids) & _waiting(tmp_path, survivor.pid)

            wait_until(
                lambda: len(taken(survivors[0]) | taken(survivors[1])) == 10,
                60,
                "both survivors full of the victim's workflows",
                every=0.05,
            )
            for survivor in survivors:
                kinds = Counter("async" if "-a-" in wid else "sync" for wid in taken(survivor))
                assert kinds == {"sync": 3, "async": 2}, (survivor.pid, sorted(taken(survivor)))
            left = _owned_by(url, dead, victim_ids)
            assert len(left) == 3, "what no survivor can start stays claimable"

            (tmp_path / "victim-go").touch()
            with Inspector(url) as db:
                wait_until(lambda: db.all_finished(victim_ids), 60, "every victim workflow")
                assert set(db.statuses(victim_ids).values()) == {da.WorkflowStatus.SUCCESS}
                assert set(db.recovery_attempts(victim_ids).values()) == {1}
            for key in keys:
                assert _most_pending(url, key, SYNC) <= 3
                assert _most_pending(url, key, ASYNC) <= 2
        finally:
            print(stop_workers(procs))
    rows = _log(tmp_path)
    survivor_pids = {s.pid for s in survivors}
    for wid in victim_ids:
        runs = [(what, pid) for what, w, pid in rows if w == wid]
        first, wait_here, wait_there, last = runs
        assert first == ("first", victim.pid) and wait_here == ("wait", victim.pid), runs
        assert wait_there[0] == "wait" and wait_there[1] in survivor_pids, runs
        assert last == ("last", wait_there[1]), runs
    took = Counter(pid for what, w, pid in rows if w in victim_ids and what == "last")
    assert set(took) == survivor_pids, "each survivor took some"


@pytest.mark.parametrize("take_over", ["default", "yes"])
def test_recover_false_resumes_nothing_this_process_did_not_start(
    dbos_agent_postgres_url: str, tmp_path: Path, take_over: str
) -> None:
    """exec-a dies -9 mid-way through a sync and an async workflow. A new process
    ``launch(executor_id="exec-a", recover=False)`` runs a 20-step workflow of its own
    while its background passes look every 5 ms and its database clock is past every
    lease and grace: nothing of exec-a's is resumed, no step of it runs. With
    ``take_over=True`` as well, the same process takes them over."""
    vp = new_id("exec-a")
    ids = [f"{vp}-s-0", f"{vp}-a-0"]
    with _database(dbos_agent_postgres_url) as url:
        victim = _app(url, tmp_path, "exec-a", prefix=vp, sync=1, async_=1, flag="go")
        procs = [victim]
        try:
            _ready(victim)
            wait_until(lambda: _waiting(tmp_path, victim.pid) == set(ids), 60, "mid-way")
            dead = _session_of(url, "exec-a")
            victim.kill()
            victim.wait(10)
            (tmp_path / "go").touch()  # anything resumed would finish at once
            again = _app(
                url,
                tmp_path,
                "exec-a",
                prefix=new_id("again"),
                recover="no",
                take_over=take_over,
                tracer=20,
            )
            procs.append(again)
            _ready(again, "traced")
            _ready(again)
            tracer = [w for what, w, pid in _log(tmp_path) if what == "tracer" and pid == again.pid]
            assert len(tracer) == 20
            if take_over == "default":
                assert not [r for r in _log(tmp_path) if r[1] in ids and r[2] == again.pid]
                assert _owned_by(url, dead, ids) == set(ids)
                with Inspector(url) as db:
                    assert set(db.recovery_attempts(ids).values()) == {0}
            else:
                with Inspector(url) as db:
                    wait_until(lambda: db.all_finished(ids), 60, "exec-a's workflows taken over")
                    assert set(db.statuses(ids).values()) == {da.WorkflowStatus.SUCCESS}
                    assert set(db.recovery_attempts(ids).values()) == {1}
                assert {w for what, w, pid in _log(tmp_path) if what == "last"} == set(ids)
        finally:
            print(stop_workers(procs))


RELEASE = threading.Event()


@da.durable_workflow(name="takeover_room_blocker")
def blocker() -> str:
    RELEASE.wait(60)
    return "released"


@da.step
def double(i: int) -> int:
    return 2 * i


@da.durable_workflow(name="takeover_room_quick")
def quick(i: int) -> int:
    return double(i)


def test_a_full_process_takes_over_nothing_then_takes_over_as_its_runs_end(
    dbos_agent_postgres_url: str,
) -> None:
    """One worker thread, busy: a take-over pass claims none of a dead session's three
    workflows. Once the busy run ends, the process takes them over one at a time, each
    as the previous run ends: its periodic pass (every 600 s) plays no part."""
    ids = [new_id("orphan") for _ in range(3)]
    RELEASE.clear()
    with (
        _database(dbos_agent_postgres_url) as url,
        da.launch(url, executor_id=new_id("full"), workers=1, take_over_every=600) as rt,
    ):
        busy = da.start(blocker)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO dbos_agent.executors (session_key, executor_id, hostname, pid,"
                " lease_seconds, heartbeat_at) VALUES (%s, 'gone', 'test', 1, 30, '-infinity')",
                (DEAD_KEY,),
            )
            for i, wid in enumerate(ids):
                conn.execute(
                    "INSERT INTO dbos_agent.workflows (workflow_id, name, status, inputs,"
                    " executor_id, owner_key, max_recovery_attempts)"
                    " VALUES (%s, 'takeover_room_quick', 'PENDING', %s, 'gone', %s, 5)",
                    (wid, f'{{"i": {i}}}', DEAD_KEY),
                )
        assert take_over_once().recovered == 0, "no idle thread: nothing claimed"
        assert _owned_by(url, DEAD_KEY, ids) == set(ids)
        RELEASE.set()
        assert busy.result(30) == "released"
        with Inspector(url) as db:
            wait_until(lambda: db.all_finished(ids), 30, "the orphans taken over")
            assert set(db.recovery_attempts(ids).values()) == {1}
        assert [da.retrieve(wid).result(5) for wid in ids] == [0, 2, 4]
        assert _most_pending(url, rt.session_key or 0, "takeover_room_quick") == 1

"""An executor session: this process's registration, advisory lock, heartbeat and fence.

The session holds ``pg_advisory_lock(SESSION_LOCK_CLASS, key)`` (locks.py) on a
dedicated connection and renews a lease on it. Others take its workflows over only once
it is dead by the rules of migrations 006, 022 and 024: lease run out, or lock missing
for longer than its grace, both counted from the later of its last heartbeat and the
moment the server began accepting writes (its start, or its promotion from standby).
When the connection dies while the process lives (a Postgres restart, a failover to a
standby, a ``pg_terminate_backend``), the heartbeat thread reconnects and takes the same
key back within moments, well inside the grace, and the process keeps its workflows.

**The fence.** A run may start a live step only while no one can have taken its
workflow. Every successful heartbeat proves the lock was held and the lease fresh
when it was sent, so no one can declare this session dead before ``sent +
min(grace, lease)``; :attr:`ExecutorSession.state` carries that instant (minus a
margin) as ``valid_until``, on the monotonic clock. A *streak* is a run of
heartbeats each sent before the previous one's fence ran out; it ends when a
heartbeat comes too late (a paused process, an outage), when the connection is
re-opened, or when the database says the session looked dead meanwhile. A run
that confirmed its ownership in the current streak goes on without asking; any
other run first re-reads its workflow's owner (see ``_engine/ownership.py``).

The fence counts from the heartbeat alone, and so stays true whatever the server's
start or promotion: the rules count from the *later* of the heartbeat and that moment,
which only makes a session die later than by its heartbeat, never sooner. A
heartbeat's ``was_dead`` is judged by the rules as the server now applies them, which
after a restart or a failover may be more lenient than when a claim on the old server
judged the session; but then the connection was re-opened (or the heartbeat came late),
which ends the streak all the same.

**Lease only.** A process whose only URL goes through a transaction pooler has no
session of its own on the server to hold the lock on (``SystemDatabase.direct`` is None):
its session registers as ``lease_only`` (migration 030) and is judged by its lease alone,
so others take its workflows over once the lease has run out (at once when, from its own
host, they see its process gone), and its fence is the lease's. Its heartbeat goes through
the pooler on a client connection of its own (which holds no server connection between
heartbeats), each one statement (a transaction that sets the test clock first, in tests
that move it).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import psycopg

from .._processes import process_key, session_gone_here
from ..errors import DatabaseUnavailableError, PoolerError
from .connector import Connector
from .database import SystemDatabase
from .locks import SESSION_LOCK_CLASS
from .outages import describe, is_transient
from .rows import UnlockedSession
from .sql_files import query

log = logging.getLogger(__name__)

#: The fence ends this share of min(grace, lease) after a heartbeat was sent: room
#: for clocks that tick at slightly different rates and for a slow round trip.
_FENCE_SHARE = 0.8
_RECONNECT_MIN_S = 0.05
_RECONNECT_MAX_S = 1.0
_TAKE_LOCK_ATTEMPTS = 50


@dataclass(frozen=True, slots=True)
class Fence:
    """What a run checks before a live step: the streak, and until when it holds."""

    streak: int
    valid_until: float

    def holds(self) -> bool:
        """Whether, right now, no one can have taken this session's workflows."""
        return time.monotonic() < self.valid_until


_LAPSED = Fence(0, float("-inf"))


class ExecutorSession:
    """Registers an executor session, keeps it alive and brings it back until :meth:`close`."""

    def __init__(
        self,
        db: SystemDatabase,
        executor_id: str,
        app_version: str | None,
        lease_seconds: float,
        grace_seconds: float = 3.0,
        code_version: Callable[[], str] | None = None,
        queues: Callable[[], list[str]] = list,
    ) -> None:
        if lease_seconds <= 0 or grace_seconds <= 0:
            raise ValueError(
                f"lease_seconds and session_grace must be > 0, got {lease_seconds} "
                f"and {grace_seconds}"
            )
        self.db = db
        self.executor_id = executor_id
        self.app_version = app_version
        #: The code version of this process (registry.code_version), read at each
        #: registration: operators tell builds apart by it (``dbos-agent versions``).
        self.code_version = code_version
        self.lease_seconds = lease_seconds
        self.grace_seconds = grace_seconds
        self.key = 0
        #: The queues this process dequeues from, read for every heartbeat (a limited
        #: queue is shared among the sessions serving it).
        self.queues = queues
        #: Where the session connects: a direct connection holding the lock, else (through
        #: a pooler) a pooled one, the session then judged by its lease alone.
        self._link: Connector = db.direct or db
        self.lease_only = db.direct is None
        liveness = lease_seconds if self.lease_only else min(grace_seconds, lease_seconds)
        self._window = liveness * _FENCE_SHARE
        #: Seconds between heartbeats: several per fence window.
        self.interval = min(1.0, self._window / 3)
        #: Replaced as a whole, so readers never see half of an update.
        self.state = _LAPSED
        self._conn: psycopg.Connection[tuple[object, ...]] | None = None
        self._backend_pid: int | None = None
        self._lock = threading.RLock()  # one user of the connection at a time
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle ------------------------------------------------------------------

    def open(self) -> int:
        """Take a fresh session key (lock + row), start heartbeating, return the key.

        A first connection that fails fails at once (a wrong URL or password is said
        now, not after the outage bound); once the server has answered, a connection
        lost while the session opens (a restart, a killed backend) is an outage like any
        other, ridden out up to the bound.
        """
        answered = False

        def attempt() -> tuple[psycopg.Connection[tuple[object, ...]], int]:
            nonlocal answered
            conn = self._connect()
            answered = True
            try:
                key = self._take_new_key(conn)
                self._register(conn, key)
            except BaseException:
                conn.close()
                raise
            return conn, key

        with self._lock:
            opened, why, lost = None, None, False
            try:
                opened = attempt()
            except psycopg.Error as exc:  # dealt with below, without it as any error's context
                why = describe(exc)
                lost = answered and is_transient(exc)
            if lost:
                try:
                    opened = self._link.retrier.call(attempt, "open an executor session")
                except psycopg.Error as exc:  # not an outage: said as the first attempt's
                    why = describe(exc)
            if opened is None:
                raise DatabaseUnavailableError(
                    f"cannot open an executor session on {self._link.redacted_url}: {why}"
                )
            conn, key = opened
            self._conn, self.key = conn, key
            self.state = Fence(1, time.monotonic() + self._window)
        self._thread = threading.Thread(
            target=self._heartbeats, name="dbos-agent-heartbeat", daemon=True
        )
        self._thread.start()
        return key

    def close(self) -> None:
        """A clean exit: the session ends (its PENDING workflows are claimable at once)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        with self._lock:
            conn, self._conn = self._conn, None
            self.state = _LAPSED
        if conn is None or conn.closed:
            return
        try:
            with self._statements(conn):
                conn.execute(query("forget_idle_executor"), {"session_key": self.key})
                conn.execute(query("end_executor"), {"session_key": self.key})
            if not self.lease_only:
                conn.execute("SELECT pg_advisory_unlock(%s, %s)", (SESSION_LOCK_CLASS, self.key))
        except psycopg.Error as exc:
            log.warning("could not end executor session %s cleanly: %s", self.key, describe(exc))
        finally:
            conn.close()

    @property
    def closed(self) -> bool:
        return self._stop.is_set()

    # -- the heartbeat ----------------------------------------------------------------

    def renew(self) -> Fence:
        """One heartbeat, re-opening the connection first if it is gone; the new fence.

        Raises the connection's error when the database cannot be reached.
        """
        with self._lock:
            if self._stop.is_set():
                raise DatabaseUnavailableError("the executor session was closed")
            sent = time.monotonic()
            previous = self.state
            if self._conn is None or self._conn.closed:
                self._reconnect()
                fresh = True
            else:
                try:
                    with self._statements(self._conn):
                        row = self._conn.execute(
                            query("heartbeat_executor"),
                            {"session_key": self.key, "queues": self.queues()},
                        ).fetchone()
                except psycopg.Error:
                    self._drop_connection()
                    raise
                if row is None:  # forgotten while it looked dead: register again
                    log.warning(
                        "executor session %s had been forgotten (it looked dead); "
                        "registering it again",
                        self.key,
                    )
                    self._register(self._conn, self.key)
                    fresh = True
                else:
                    fresh = bool(row[0]) or sent >= previous.valid_until
            self.state = Fence(
                previous.streak + 1 if fresh else previous.streak, sent + self._window
            )
            return self.state

    def confirm(self, stop: Callable[[], bool] | None = None) -> Fence:
        """A fence that holds now, renewing the session (through an outage) if needed.

        Raises DatabaseUnavailableError past the outage bound, or once ``stop()`` says so.
        """

        def holding() -> Fence:
            fence = self.state
            return fence if fence.holds() else self.renew()

        return self.db.retrier.call(holding, "confirm this executor session", stop=stop)

    def _heartbeats(self) -> None:
        delay = self.interval
        retry_delay = _RECONNECT_MIN_S
        while not self._stop.wait(delay):
            try:
                self.renew()
            except Exception as exc:
                if self._stop.is_set():
                    return
                if is_transient(exc):
                    self.db.monitor.failed(exc)
                else:
                    log.warning("executor session %s heartbeat failed: %s", self.key, describe(exc))
                delay, retry_delay = retry_delay, min(retry_delay * 2, _RECONNECT_MAX_S)
                continue
            self.db.monitor.succeeded()
            delay, retry_delay = self.interval, _RECONNECT_MIN_S

    # -- the connection and the lock ----------------------------------------------------

    @contextlib.contextmanager
    def _statements(self, conn: psycopg.Connection[tuple[object, ...]]) -> Iterator[None]:
        """The session's statements on ``conn`` with the test clock set: for the whole
        session on its direct connection; through a pooler, as the pooled ones have it."""
        if self.lease_only:
            with self.db.settings_applied(conn):
                yield
        else:
            self.db.sync_clock(conn)
            yield

    def _connect(self) -> psycopg.Connection[tuple[object, ...]]:
        conn = self._link.connect_dedicated("dbos_agent_session", keepalives_idle=10)
        self._backend_pid = conn.info.backend_pid
        return conn

    def _take_new_key(self, conn: psycopg.Connection[tuple[object, ...]]) -> int:
        for _ in range(100):
            row = conn.execute(query("next_session_key")).fetchone()
            assert row is not None
            key = int(str(row[0]))
            if self.lease_only:
                return key
            if self._try_lock(conn, key):
                self._check_kept(conn, key)
                return key
        raise DatabaseUnavailableError("could not find a free executor session key")

    def _check_kept(self, conn: psycopg.Connection[tuple[object, ...]], key: int) -> None:
        """Refuse a session connection that does not keep its session: the lock just
        taken must be held by the backend the next statement runs on. Behind a
        transaction pooler that is another server connection, sooner or later."""
        row = conn.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory'"
            " AND classid = %s AND objid = %s AND objsubid = 2 AND granted"
            " AND pid = pg_backend_pid())",
            (SESSION_LOCK_CLASS, key),
        ).fetchone()
        if not (row and row[0]):
            raise PoolerError(
                self._link.undeclared_pooler(
                    "the session's lock was not held by the server connection of its next statement"
                )
            )

    @staticmethod
    def _try_lock(conn: psycopg.Connection[tuple[object, ...]], key: int) -> bool:
        row = conn.execute(
            "SELECT pg_try_advisory_lock(%s, %s)", (SESSION_LOCK_CLASS, key)
        ).fetchone()
        return bool(row and row[0])

    def _register(self, conn: psycopg.Connection[tuple[object, ...]], key: int) -> None:
        with self._statements(conn):
            self._insert_row(conn, key)

    def _insert_row(self, conn: psycopg.Connection[tuple[object, ...]], key: int) -> None:
        conn.execute(
            query("register_executor"),
            {
                "session_key": key,
                "executor_id": self.executor_id,
                "app_version": self.app_version,
                "code_version": None if self.code_version is None else self.code_version(),
                "hostname": socket.gethostname(),
                "pid": os.getpid(),
                "process_key": process_key(),
                "lease_seconds": self.lease_seconds,
                "grace_seconds": self.grace_seconds,
                "queues": self.queues(),
                "lease_only": self.lease_only,
            },
        )

    def _reconnect(self) -> None:
        """A new connection that takes this session's own key back (lock, then row)."""
        old_backend = self._backend_pid
        conn = self._connect()
        try:
            if not self.lease_only:
                self._take_lock_back(conn, old_backend)
            self._register(conn, self.key)
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        log.debug("executor session %s is back (reconnected)", self.key)

    def _take_lock_back(
        self, conn: psycopg.Connection[tuple[object, ...]], old_backend: int | None
    ) -> None:
        for _ in range(_TAKE_LOCK_ATTEMPTS):
            if self._try_lock(conn, self.key):
                return
            # Most likely our previous connection's backend, not yet gone: end it.
            holder = conn.execute(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND classid = %s"
                " AND objid = %s AND objsubid = 2 AND granted",
                (SESSION_LOCK_CLASS, self.key),
            ).fetchone()
            if holder is not None and holder[0] == old_backend:
                conn.execute("SELECT pg_terminate_backend(%s)", (old_backend,))
            time.sleep(0.05)
        raise psycopg.OperationalError(
            f"executor session {self.key}: its lock is still held elsewhere"
        )

    def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):  # already broken
                conn.close()


def end_dead_local_sessions(
    db: SystemDatabase, unlocked: list[UnlockedSession] | None = None
) -> int:
    """Declare dead, at once, the sessions of processes on this host that no longer run
    (their lock is free and their pid gone): a restart after kill -9 need not wait.
    ``unlocked`` is the list of sessions without their lock when the caller read it
    already (else it is read here)."""
    ended = 0
    for session in db.recovery.unlocked_sessions() if unlocked is None else unlocked:
        if session.process_key is not None and session_gone_here(session.process_key, True):
            ended += db.recovery.end_dead_session(session.session_key, session.process_key)
    return ended

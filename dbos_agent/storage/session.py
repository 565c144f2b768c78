"""An executor session: this process's registration, advisory lock and heartbeat.

The session holds ``pg_advisory_lock(233710, session_key)`` on a dedicated
connection for as long as the process lives. Postgres releases it when that
connection dies, which is how another process learns at once that this one
is gone; the heartbeat lease covers what the lock cannot see.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading

import psycopg

from ..errors import DatabaseUnavailableError
from .database import SystemDatabase, _q

log = logging.getLogger("dbos_agent.session")

LOCK_CLASS = 233710


class ExecutorSession:
    """Registers an executor session and keeps it alive until :meth:`close`."""

    def __init__(
        self, db: SystemDatabase, executor_id: str, app_version: str | None, lease_seconds: float
    ) -> None:
        self.db = db
        self.executor_id = executor_id
        self.app_version = app_version
        self.lease_seconds = lease_seconds
        self.session_key = 0
        self._conn: psycopg.Connection[tuple[object, ...]] | None = None
        self._lock = threading.Lock()

    def open(self) -> int:
        """Take a fresh session key (lock + row) and return it."""
        try:
            conn = psycopg.connect(
                self.db.url, autocommit=True, connect_timeout=10, application_name="dbos_agent",
                keepalives=1, keepalives_idle=10, keepalives_interval=5, keepalives_count=3,
            )
        except psycopg.Error as exc:
            raise DatabaseUnavailableError(
                f"cannot open an executor session on {self.db.redacted_url}: {exc}"
            ) from None
        for _ in range(100):
            key = random.randint(1, 2**31 - 1)
            row = conn.execute(
                "SELECT pg_try_advisory_lock(%s, %s)", (LOCK_CLASS, key)
            ).fetchone()
            if row is not None and row[0]:
                break
        else:  # pragma: no cover - 100 collisions in 2**31 keys
            raise RuntimeError("could not find a free executor session key")
        conn.execute(
            _q("register_executor"),
            {
                "session_key": key,
                "executor_id": self.executor_id,
                "app_version": self.app_version,
                "hostname": socket.gethostname(),
                "pid": os.getpid(),
                "lease_seconds": self.lease_seconds,
            },
        )
        self._conn = conn
        self.session_key = key
        return key

    def heartbeat(self) -> bool:
        """Renew the lease; False if the session's connection or row is gone."""
        with self._lock:
            conn = self._conn
            if conn is None:
                return False
            try:
                row = conn.execute(
                    _q("heartbeat_executor"), {"session_key": self.session_key}
                ).fetchone()
            except psycopg.Error as exc:
                log.warning("executor heartbeat failed: %s", exc)
                return False
        return row is not None

    def close(self) -> None:
        """A clean exit: delete the row and release the lock."""
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            conn.execute(_q("deregister_executor"), {"session_key": self.session_key})
            conn.execute("SELECT pg_advisory_unlock(%s, %s)", (LOCK_CLASS, self.session_key))
        except psycopg.Error as exc:
            log.warning("could not deregister executor session cleanly: %s", exc)
        finally:
            conn.close()

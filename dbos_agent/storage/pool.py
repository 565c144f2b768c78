"""A small pool of autocommit connections that reconnects in the caller's thread.

A general-purpose pool (psycopg_pool) reconnects in the background with a backoff
that grows to minutes during a long outage, so service can lag far behind a server
that is back. Here a caller that finds no idle connection opens one itself: service
resumes the moment the server accepts connections, and how long to keep trying stays
the caller's decision (the outage bound, see ``outages.py``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

Connection = psycopg.Connection[Any]


class PoolExhausted(psycopg.OperationalError):
    """No connection became free in time (every one is busy): worth retrying."""


class ConnectionPool:
    """At most ``max_size`` connections; idle ones are reused, newest first."""

    def __init__(self, connect: Callable[[], Connection], max_size: int) -> None:
        if max_size < 1:
            raise ValueError(f"a pool needs at least one connection, got {max_size}")
        self._connect = connect
        self._slots = threading.BoundedSemaphore(max_size)
        self._idle: list[Connection] = []
        self._lock = threading.Lock()
        self._closed = False

    @contextlib.contextmanager
    def connection(self, timeout: float) -> Iterator[Connection]:
        """A connection for the block; opened here when no idle one is left."""
        if not self._slots.acquire(timeout=timeout):
            raise PoolExhausted(f"no database connection became free within {timeout:g}s")
        conn: Connection | None = None
        try:
            with self._lock:
                if self._closed:
                    raise psycopg.InterfaceError("the connection pool is closed")
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                conn = self._connect()
            yield conn
        finally:
            if conn is not None:
                self._give_back(conn)
            self._slots.release()

    def _give_back(self, conn: Connection) -> None:
        healthy = not conn.closed and conn.info.transaction_status == TransactionStatus.IDLE
        with self._lock:
            if healthy and not self._closed:
                self._idle.append(conn)
                return
        with contextlib.suppress(Exception):
            conn.close()

    def drop_idle(self) -> None:
        """Close every idle connection: after a failure they are likely dead too, and
        fresh ones cost a few milliseconds each."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            with contextlib.suppress(Exception):
                conn.close()

    def close(self) -> None:
        """Close the idle connections; busy ones close when given back."""
        with self._lock:
            self._closed = True
        self.drop_idle()

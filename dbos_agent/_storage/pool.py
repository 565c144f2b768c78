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

from ..errors import DatabaseClosedError

Connection = psycopg.Connection[Any]


class PoolExhausted(psycopg.OperationalError):
    """No connection became free in time (every one is busy): worth retrying."""


class ConnectionPool:
    """At most ``max_size`` connections; idle ones are reused, newest first.

    One lock guards it all; a caller waits on a condition only when every connection is
    out (the common path takes and gives back a connection under that lock alone).
    """

    def __init__(self, connect: Callable[[], Connection], max_size: int) -> None:
        if max_size < 1:
            raise ValueError(f"a pool needs at least one connection, got {max_size}")
        self._connect = connect
        self._max_size = max_size
        self._idle: list[Connection] = []
        #: Connections handed out, or being opened for a caller.
        self._out = 0
        self._lock = threading.Lock()
        self._freed = threading.Condition(self._lock)
        self._closed = False

    @contextlib.contextmanager
    def connection(self, timeout: float) -> Iterator[Connection]:
        """A connection for the block; opened here when no idle one is left."""
        conn = self.take(timeout)
        try:
            yield conn
        finally:
            self.give_back(conn)

    def take(self, timeout: float) -> Connection:
        """A connection of the caller's own until :meth:`give_back` (which it must call)."""
        with self._lock:
            if self._out >= self._max_size and not self._freed.wait_for(
                lambda: self._out < self._max_size or self._closed, timeout
            ):
                raise PoolExhausted(f"no database connection became free within {timeout:g}s")
            if self._closed:
                raise DatabaseClosedError(
                    "the dbos_agent runtime (or client) was shut down: its database "
                    "connections are closed"
                )
            self._out += 1
            conn = self._idle.pop() if self._idle else None
        if conn is None:
            try:
                conn = self._connect()
            except BaseException:
                self._returned()
                raise
        return conn

    def give_back(self, conn: Connection) -> None:
        """Return a connection from :meth:`take`: kept if it is healthy, else closed."""
        healthy = not conn.closed and conn.pgconn.transaction_status == TransactionStatus.IDLE
        with self._lock:
            self._out -= 1
            self._freed.notify()
            if healthy and not self._closed:
                self._idle.append(conn)
                return
        with contextlib.suppress(Exception):
            conn.close()

    def _returned(self) -> None:
        with self._lock:
            self._out -= 1
            self._freed.notify()

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
            self._freed.notify_all()
        self.drop_idle()

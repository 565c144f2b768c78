"""How every statement runs: pooled connections, outages ridden out, values checked.

Each call is one round trip on an autocommit connection (or one short
transaction), so a write is durable when the call returns. A call rides out an
outage (see ``outages.py``): it is retried with backoff until the outage bound,
and a statement is re-sent only where its query makes a second run harmless (a
guarded insert, a claim whose workflows the owner takes back later).

What goes in is checked here, once for every caller: each JSON value against the
checkpoint limit, NUL characters made storable (``jsonb.py``), and a value that
Postgres still refuses reported as the caller's :class:`SerializationError`.
Rows come back as dicts, read by column name.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import psycopg
from psycopg.rows import DictRow, dict_row

from .._limits import DEFAULT_MAX_CHECKPOINT_BYTES, check_checkpoint_size
from ..errors import (
    CheckpointError,
    DatabaseUnavailableError,
    SerializationError,
    WriteRefusedError,
)
from . import jsonb
from .dsn import postgres_url, redact_url, scrub
from .outages import (
    DEFAULT_OUTAGE_TIMEOUT_S,
    OutageMonitor,
    Retrier,
    describe,
    is_transient,
    is_value_error,
)
from .pool import ConnectionPool
from .sql_files import query

T = TypeVar("T")
Row = dict[str, Any]
Connection = psycopg.Connection[DictRow]

CONNECT_TIMEOUT_S = 10
_WEED_EVERY_S = 0.5


class _OutcomeUnknown(Exception):
    """A statement that must not run twice lost its connection after it was sent."""


#: A pooled connection left idle inside a transaction this long is ended by the server:
#: a process paused (SIGSTOP, a VM stall) between two statements of a transaction would
#: otherwise hold its row locks, and block whoever takes its workflows over, until it
#: wakes. The library's transactions hold no wait of their own between statements.
IDLE_IN_TRANSACTION_S = 15


def connection_options(application_name: str, keepalives_idle: int = 30) -> dict[str, Any]:
    """The options of every connection: a bounded connect, and dead peers noticed."""
    return {
        "connect_timeout": CONNECT_TIMEOUT_S,
        "application_name": application_name,
        "keepalives": 1,
        "keepalives_idle": keepalives_idle,
        "keepalives_interval": max(1, keepalives_idle // 3),
        "keepalives_count": 3,
    }


#: Whether every connector made from now on in this process only reads (:func:`refuse_writes`).
_writes_refused = False


def refuse_writes() -> None:
    """Make every :class:`Connector` made from now on in this process read-only, as if
    made with ``read_only=True``: ``check-deploy``'s process imports the app, whose
    module-level code may make a Client and write; such a write raises WriteRefusedError
    at once (it is not taken for a failover in progress, and retried)."""
    global _writes_refused
    _writes_refused = True


class Connector:
    """A pool of connections to the system database and the one way statements run on it.

    ``outage_timeout`` bounds how long each call retries through an outage;
    ``max_checkpoint_bytes`` is the largest JSON value one write may carry. Pooled
    connections carry ``application_name``; ``warn_on_outage=False`` notes outages at
    DEBUG level only (for tools such as the test inspector). With ``read_only`` every
    pooled connection is read-only in Postgres itself, and a statement that would write
    raises :class:`WriteRefusedError` at once (a replay check writes nothing).
    """

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 20,
        outage_timeout: float = DEFAULT_OUTAGE_TIMEOUT_S,
        max_checkpoint_bytes: int = DEFAULT_MAX_CHECKPOINT_BYTES,
        application_name: str = "dbos_agent",
        warn_on_outage: bool = True,
        read_only: bool = False,
    ) -> None:
        if max_checkpoint_bytes < 1:
            raise ValueError(f"max_checkpoint_bytes must be >= 1, got {max_checkpoint_bytes}")
        self.url = postgres_url(url)
        self.redacted_url = redact_url(url)
        self.max_checkpoint_bytes = max_checkpoint_bytes
        self.application_name = application_name
        self.read_only = read_only or _writes_refused
        self.monitor = OutageMonitor(self.redacted_url, warn=warn_on_outage)
        self.retrier = Retrier(self.monitor, outage_timeout)
        self._weeded_at = 0.0
        self._weed_lock = threading.Lock()
        #: At most this many connections are open at once (blocking calls beyond wait).
        self.pool_size = max(1, pool_size)
        self._pool = ConnectionPool(self._connect_pooled, self.pool_size)
        #: Seconds added to the database clock (``dbos_agent.now()``) on every connection
        #: this process uses: tests move time with :meth:`advance_clock` instead of sleeping.
        self.clock_offset = 0.0
        self._clocks: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()

    def _connect_pooled(self) -> Connection:
        options = connection_options(self.application_name)
        settings = f"-c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_S}s"
        if self.read_only:
            settings += " -c default_transaction_read_only=on"
        options["options"] = settings
        return psycopg.connect(self.url, autocommit=True, row_factory=dict_row, **options)

    # -- lifecycle -------------------------------------------------------------------

    def open(self) -> None:
        """Check the server answers: a clear error within ~10 s, not retries for minutes.

        The error is raised outside the ``except``: libpq's exception is not kept even
        as its context, which a traceback or a logger might still walk."""
        try:
            with self._pool.connection(timeout=CONNECT_TIMEOUT_S):
                return
        except psycopg.Error as exc:
            why = scrub(describe(exc), self.url)
        raise DatabaseUnavailableError(
            f"cannot connect to the dbos_agent database at {self.redacted_url}: {why}"
        )

    def close(self) -> None:
        """Close every pooled connection."""
        self._pool.close()

    @contextmanager
    def connection(self) -> Iterator[Connection]:
        """A pooled autocommit connection, rows as dicts (for tests and tools)."""
        with self._pool.connection(timeout=CONNECT_TIMEOUT_S) as conn:
            self.sync_clock(conn)
            yield conn

    def connect_dedicated(
        self, application_name: str, *, keepalives_idle: int = 30
    ) -> psycopg.Connection[tuple[Any, ...]]:
        """A connection of its own (not pooled, autocommit): the session's, the listener's."""
        return psycopg.connect(
            self.url, autocommit=True, **connection_options(application_name, keepalives_idle)
        )

    def advance_clock(self, seconds: float) -> None:
        """Move this process's database clock forward (for tests): leases run out, timers
        come due and rate-limit periods pass as if ``seconds`` had gone by."""
        self.clock_offset += seconds

    def sync_clock(self, conn: psycopg.Connection[Any]) -> None:
        """Set the clock offset on ``conn`` if it differs from what that connection has (a
        dictionary lookup in the common case).

        The offset is read once: another thread may move the clock meanwhile, and noting
        the newer offset beside the older one set would leave ``conn`` behind for good.
        """
        offset = self.clock_offset
        if self._clocks.get(conn, 0.0) != offset:
            conn.execute(
                "SELECT set_config('dbos_agent.clock_offset', %s, false)", (f"{offset} seconds",)
            )
            self._clocks[conn] = offset

    @staticmethod
    def listen(conn: psycopg.Connection[Any], channel: str) -> None:
        """``LISTEN channel`` on a listener connection (the name is quoted, not trusted)."""
        conn.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(channel)))

    # -- running statements ------------------------------------------------------------

    def _weed(self, exc: BaseException) -> None:
        """After a connection failure, drop the idle connections in one go (they died with
        it, most likely), so that the retry does not walk through them one by one."""
        now = time.monotonic()
        with self._weed_lock:
            if now - self._weeded_at < _WEED_EVERY_S:
                return
            self._weeded_at = now
        self._pool.drop_idle()

    def _attempt_wait(self) -> float:
        """How long one attempt waits for a pooled connection."""
        return max(0.1, min(5.0, self.retrier.timeout))

    def run(
        self,
        what: str,
        body: Callable[[Connection], T],
        *,
        where: str | None = None,
        resend: bool = True,
        transaction: bool = False,
        single_attempt: bool = False,
    ) -> T:
        """``body(conn)`` on a pooled connection, through outages.

        ``what`` completes "could not ..." in errors. ``where`` names the value being
        written: a value Postgres refuses then raises SerializationError naming it.
        With ``resend=False`` the statement is not sent again once it may have run.
        With ``single_attempt=True`` it is tried once: a failure is raised as it is, for a caller
        with a fallback of its own (a group commit whose writers then write alone).
        """

        def once(conn: Connection) -> T:
            if not transaction:
                return body(conn)
            with conn.transaction():
                return body(conn)

        def attempt() -> T:
            conn = self._pool.take(self._attempt_wait())
            try:
                self.sync_clock(conn)
                if resend:
                    return once(conn)
                conn.execute("SELECT 1")  # a dead pooled connection fails here, harmlessly
                try:
                    return once(conn)
                except psycopg.Error as exc:
                    if is_transient(exc):
                        raise _OutcomeUnknown(describe(exc)) from exc
                    raise
            except psycopg.Error as exc:
                if self.read_only and isinstance(exc, psycopg.errors.ReadOnlySqlTransaction):
                    raise WriteRefusedError(
                        f"refused to {what}: this connection only reads"
                    ) from None
                if is_transient(exc):  # e.g. read-only after a failover: never reuse it
                    conn.close()
                raise
            finally:
                self._pool.give_back(conn)

        if single_attempt:
            return attempt()
        try:
            return self.retrier.call(attempt, what, on_failure=self._weed)
        except _OutcomeUnknown as exc:
            raise DatabaseUnavailableError(
                f"could not {what}: the connection to the database was lost while it ran "
                f"({exc}); check whether it took effect before trying again"
            ) from None
        except psycopg.Error as exc:
            if where is not None and is_value_error(exc):
                raise SerializationError(
                    f"{where}: Postgres refused the value ({describe(exc)})"
                ) from None
            raise

    def one(
        self, name: str, what: str, /, *, where: str | None = None, **params: Any
    ) -> Row | None:
        """The first row of the named query ``name`` (None when it returns none)."""
        return self.run(what, lambda c: c.execute(query(name), params).fetchone(), where=where)

    def all(self, name: str, what: str, /, **params: Any) -> list[Row]:
        """Every row of the named query ``name``."""
        return self.run(what, lambda c: c.execute(query(name), params).fetchall())

    # -- values going in ---------------------------------------------------------------

    def json_in(self, text: str, where: str) -> str:
        """A JSON value ready to be written: within the size limit, NUL characters storable.

        Raises CheckpointTooLargeError naming ``where``, the size and the limit.
        """
        check_checkpoint_size(text, where, self.max_checkpoint_bytes)
        return jsonb.to_db(text)

    def json_in_optional(self, text: str | None, where: str) -> str | None:
        """:meth:`json_in`, letting None (SQL NULL) through."""
        return None if text is None else self.json_in(text, where)

    def log_write(self, workflow_id: str, seq: int) -> _LogWrite:
        """Failures while writing the step log are CheckpointError, so that no caller
        mistakes them for the step's own error. A refused value stays SerializationError."""
        return _LogWrite(self.redacted_url, workflow_id, seq)


class _LogWrite:
    """:meth:`Connector.log_write` (a class: it wraps every checkpoint, where a
    generator-based context manager costs several times more)."""

    __slots__ = ("_seq", "_url", "_workflow_id")

    def __init__(self, url: str, workflow_id: str, seq: int) -> None:
        self._url, self._workflow_id, self._seq = url, workflow_id, seq

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        if exc is None or isinstance(exc, SerializationError | CheckpointError):
            return
        what = f"could not write step {self._seq} of workflow {self._workflow_id!r}"
        if isinstance(exc, DatabaseUnavailableError):
            raise CheckpointError(f"{what}: {exc}") from None
        if isinstance(exc, psycopg.Error):
            raise CheckpointError(
                f"{what} to the log at {self._url}: {describe(exc)}", retryable=False
            ) from exc

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

**Through a transaction pooler** (a URL with ``?pooler=transaction``: pgbouncer's
transaction mode, the pooled URLs of Supabase, Neon and RDS Proxy) every transaction may
run on another server connection, so nothing is kept on a connection from one transaction
to the next: no statement is prepared on the server (``prepare_threshold=None``), no
startup option is sent (poolers refuse ``options``), and what a direct connection sets
once for its whole session (the idle-in-transaction bound, the test clock, read-only) is
set with ``set_config(..., is_local => true)`` inside each transaction instead. A pooler
the URL does not declare is seen (it refuses the startup option, or a prepared statement
goes missing) and refused with a :class:`PoolerError` naming the fix.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, LiteralString, TypeVar

import psycopg
from psycopg.rows import DictRow, dict_row

from .._limits import DEFAULT_MAX_CHECKPOINT_BYTES, check_checkpoint_size
from ..errors import (
    CheckpointError,
    DatabaseUnavailableError,
    PoolerError,
    SerializationError,
    WriteRefusedError,
)
from . import jsonb
from .dsn import postgres_url, redact_url, scrub, split_pooler
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
#: The same, and the test clock, set inside each transaction of a pooled connection.
_SET_LOCAL: LiteralString = (
    "SELECT set_config('idle_in_transaction_session_timeout', %s, true),"
    " set_config('dbos_agent.clock_offset', %s, true)"
)
_SET_LOCAL_READ_ONLY: LiteralString = (
    _SET_LOCAL + ", set_config('transaction_read_only', 'on', true)"
)


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


def _lost_prepared_statement(exc: psycopg.Error) -> bool:
    """Whether ``exc`` says a statement psycopg prepared is missing or there already: the
    next transaction ran on another server connection, behind a transaction pooler."""
    missing = (psycopg.errors.InvalidSqlStatementName, psycopg.errors.DuplicatePreparedStatement)
    return isinstance(exc, missing) and "_pg3_" in str(exc)


def _bounds_idle_transactions(conn: Connection) -> bool:
    """Whether the server ends a transaction left idle within IDLE_IN_TRANSACTION_S by its
    own settings (those of the database, the role or the server, as every server
    connection of a pooler starts with them)."""
    row = conn.execute(
        "SELECT setting::bigint AS ms FROM pg_settings"
        " WHERE name = 'idle_in_transaction_session_timeout'"
    ).fetchone()
    return row is not None and 0 < int(row["ms"]) <= IDLE_IN_TRANSACTION_S * 1000


class Connector:
    """A pool of connections to the system database and the one way statements run on it.

    ``outage_timeout`` bounds how long each call retries through an outage;
    ``max_checkpoint_bytes`` is the largest JSON value one write may carry. Pooled
    connections carry ``application_name``; ``warn_on_outage=False`` notes outages at
    DEBUG level only (for tools such as the test inspector). With ``read_only`` every
    pooled connection is read-only in Postgres itself, and a statement that would write
    raises :class:`WriteRefusedError` at once (a replay check writes nothing).

    ``pooled`` (read from the URL's ``?pooler=transaction``) says the URL goes through a
    transaction pooler: see the module's doc. ``role`` names the URL in errors.
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
        role: str = "the database URL",
    ) -> None:
        if max_checkpoint_bytes < 1:
            raise ValueError(f"max_checkpoint_bytes must be >= 1, got {max_checkpoint_bytes}")
        #: The URL as given (checked; a pooled one keeps its ``?pooler=transaction``): what
        #: another process or tool of the library is handed to reach the same database.
        self.url = postgres_url(url)
        self._libpq_url, pooler = split_pooler(self.url)
        #: Whether the URL goes through a transaction pooler (``?pooler=transaction``).
        self.pooled = pooler is not None
        self.role = role
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
        #: Through a pooler: whether the server ends idle transactions by itself, soon
        #: enough (``ALTER DATABASE ... SET idle_in_transaction_session_timeout``, an RDS
        #: parameter group), which spares each transaction its ``set_config`` (seen by
        #: :meth:`open`).
        self._server_bounds_idle = False
        self._clocks: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()

    def _connect_pooled(self) -> Connection:
        options = self._options(self.application_name)
        if self.read_only and not self.pooled:
            options["options"] += " -c default_transaction_read_only=on"
        url = self._libpq_url
        return self._connect(
            lambda: psycopg.connect(url, autocommit=True, row_factory=dict_row, **options)
        )

    def _options(self, application_name: str, keepalives_idle: int = 30) -> dict[str, Any]:
        """The options of a connection of this connector: through a pooler, no startup
        option and no statement prepared on the server; directly, the idle-in-transaction
        bound for the whole session (which also tells a pooler the URL does not declare:
        pgbouncer refuses it)."""
        options = connection_options(application_name, keepalives_idle)
        if self.pooled:
            options["prepare_threshold"] = None
        else:
            options["options"] = f"-c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_S}s"
        return options

    def _connect(self, connect: Callable[[], T]) -> T:
        """``connect()``, a pooler's refusal of the startup option told as what it is."""
        try:
            return connect()
        except psycopg.OperationalError as exc:
            if "unsupported startup parameter" not in str(exc):
                raise
        raise PoolerError(
            self.undeclared_pooler("it refused a startup parameter, as pgbouncer does")
        )

    def undeclared_pooler(self, seen: str) -> str:
        """What to say when this connector's URL turns out to go through a pooler (``seen``:
        how that showed), naming the fix for its role."""
        if self.role == "the database URL":
            fix = (
                "add ?pooler=transaction to it (and give a direct URL as session_url, or "
                "$DBOS_AGENT_SESSION_URL, for the session's lock and LISTEN)"
            )
        else:
            fix = "give the server's direct URL here (not the pooler's)"
        return (
            f"{self.role} {self.redacted_url} goes through a connection pooler ({seen}): "
            f"{fix}; see docs/pooled-urls.md"
        )

    # -- lifecycle -------------------------------------------------------------------

    def open(self) -> None:
        """Check the server answers: a clear error within ~10 s, not retries for minutes.

        The error is raised outside the ``except``: libpq's exception is not kept even
        as its context, which a traceback or a logger might still walk."""
        try:
            with self._pool.connection(timeout=CONNECT_TIMEOUT_S) as conn:
                if self.pooled:
                    self._server_bounds_idle = _bounds_idle_transactions(conn)
                return
        except psycopg.Error as exc:
            why = scrub(describe(exc), self.url)
        raise DatabaseUnavailableError(
            f"cannot connect to the dbos_agent database at {self.redacted_url}: {why}"
        )

    def close(self) -> None:
        """Close every pooled connection."""
        self._pool.close()

    def release_idle(self) -> None:
        """Close the idle pooled connections (a direct URL's, once migrations are done)."""
        self._pool.drop_idle()

    @contextmanager
    def connection(self) -> Iterator[Connection]:
        """A pooled autocommit connection, rows as dicts (for tests and tools)."""
        with self._pool.connection(timeout=CONNECT_TIMEOUT_S) as conn:
            if not self.pooled:
                self.sync_clock(conn)
            yield conn

    def connect_dedicated(
        self, application_name: str, *, keepalives_idle: int = 30
    ) -> psycopg.Connection[tuple[Any, ...]]:
        """A connection of its own (not pooled, autocommit): the session's, the listener's."""
        options = self._options(application_name, keepalives_idle)
        return self._connect(lambda: psycopg.connect(self._libpq_url, autocommit=True, **options))

    @contextmanager
    def transaction(self, conn: psycopg.Connection[Any]) -> Iterator[None]:
        """A transaction on ``conn``. Through a pooler it first sets, for itself alone,
        what a direct connection has for its whole session: the idle-in-transaction bound,
        the test clock and, for a read-only connector, read-only."""
        with conn.transaction():
            if self.pooled and not (
                self._server_bounds_idle and self.clock_offset == 0 and not self.read_only
            ):
                conn.execute(
                    _SET_LOCAL_READ_ONLY if self.read_only else _SET_LOCAL,
                    (f"{IDLE_IN_TRANSACTION_S}s", f"{self.clock_offset} seconds"),
                )
            yield

    @contextmanager
    def settings_applied(self, conn: psycopg.Connection[Any]) -> Iterator[None]:
        """The test clock (and read-only) in force on ``conn`` for the statements of the
        block: set for its session on a direct connection; through a pooler, for one
        transaction around them, only when there is something to set (a lone statement
        otherwise runs as it is, in autocommit)."""
        if not self.pooled:
            self.sync_clock(conn)
            yield
        elif self._local_settings():
            with self.transaction(conn):
                yield
        else:
            yield

    def _local_settings(self) -> bool:
        """Whether a pooled statement needs settings of its transaction (test clock, read-only)."""
        return self.read_only or self.clock_offset != 0

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

        # Through a pooler, a moved test clock and read-only hold only inside a transaction.
        local = self.pooled and self._local_settings()

        def once(conn: Connection) -> T:
            if not (transaction or local):
                return body(conn)
            with self.transaction(conn):
                return body(conn)

        def attempt() -> T:
            conn = self._pool.take(self._attempt_wait())
            try:
                if not self.pooled:
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
                if _lost_prepared_statement(exc):
                    conn.close()
                    raise PoolerError(
                        self.undeclared_pooler(
                            "a statement prepared on one server connection was missing on the next"
                        )
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

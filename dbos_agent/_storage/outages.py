"""Riding out database outages: which failures are worth retrying, and for how long.

Every library call that talks to Postgres goes through :class:`Retrier`. A failure of
the connection (refused, closed, an admin shutdown, a server starting up or read-only
during a failover) is retried with capped exponential backoff and jitter until the
outage bound passes, then surfaces as :class:`DatabaseUnavailableError`. A value that
Postgres refuses (a class 22 data error, a class 54 limit) is the caller's fault and
is never retried. Everything else is a bug or a broken schema and passes through.

One :class:`OutageMonitor` per process keeps the logs quiet: one warning when the
database goes away, one info line when it is back, whichever connection notices.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import psycopg

from ..errors import DatabaseUnavailableError
from .redaction import scrub

log = logging.getLogger(__name__)

T = TypeVar("T")

#: How long library calls retry through an outage unless launch() says otherwise.
DEFAULT_OUTAGE_TIMEOUT_S = 60.0
_FIRST_DELAY_S = 0.02
_BACKOFF = 1.5
_MAX_DELAY_S = 1.0
#: A failure this soon after a recovery is the same outage still settling: not re-logged.
_QUIET_AFTER_RECOVERY_S = 10.0


def is_value_error(exc: BaseException) -> bool:
    """Postgres refused the *value* (NUL, out of range, too large, too deep): not an outage."""
    if isinstance(exc, psycopg.errors.DataError):
        return True
    state = getattr(exc, "sqlstate", None)
    return isinstance(state, str) and state.startswith("54")


def is_transient(exc: BaseException) -> bool:
    """Would the same call succeed once the database is reachable (or writable) again?"""
    if isinstance(exc, psycopg.InterfaceError):
        return True
    if isinstance(exc, psycopg.errors.ReadOnlySqlTransaction):
        return True  # a failover in progress: the new primary is on its way
    return isinstance(exc, psycopg.OperationalError) and not is_value_error(exc)


def describe(exc: BaseException) -> str:
    """A one-line reason, without any password."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return scrub(f"{type(exc).__name__}: {text}")


class OutageMonitor:
    """Logs the start and the end of an outage once, however many callers notice it
    (at DEBUG level only with ``warn=False``, for tools such as the test inspector)."""

    def __init__(self, where: str, *, warn: bool = True) -> None:
        self._where = where
        self._warn = warn
        self._lock = threading.Lock()
        self._down_since: float | None = None
        self._recovered_at = -_QUIET_AFTER_RECOVERY_S
        #: Whether the outage going on was announced (its end is, then, too).
        self._announced = False

    @property
    def down(self) -> bool:
        """True between a noticed failure and the next success."""
        return self._down_since is not None

    def failed(self, exc: BaseException) -> None:
        """A call failed with a transient error."""
        with self._lock:
            if self._down_since is not None:
                return
            self._down_since = time.monotonic()
            settling = self._down_since - self._recovered_at < _QUIET_AFTER_RECOVERY_S
            self._announced = self._warn and not settling
        (log.warning if self._announced else log.debug)(
            "the dbos_agent database at %s is unavailable (%s); retrying",
            self._where,
            describe(exc),
        )

    def succeeded(self) -> None:
        """A call succeeded: if an outage was going on, it is over."""
        if self._down_since is None:  # the common case, without taking the lock
            return
        with self._lock:
            since, self._down_since = self._down_since, None
            if since is None:
                return
            self._recovered_at = time.monotonic()
            announced = self._announced
        (log.info if announced else log.debug)(
            "the dbos_agent database at %s is reachable again after %.1fs",
            self._where,
            self._recovered_at - since,
        )


class Retrier:
    """Runs a database call, retrying transient failures until ``timeout`` seconds passed."""

    def __init__(self, monitor: OutageMonitor, timeout: float = DEFAULT_OUTAGE_TIMEOUT_S) -> None:
        if timeout < 0:
            raise ValueError(f"outage_timeout must be >= 0 seconds, got {timeout}")
        self.monitor = monitor
        self.timeout = timeout

    def call(
        self,
        fn: Callable[[], T],
        what: str,
        *,
        on_failure: Callable[[BaseException], None] | None = None,
        stop: Callable[[], bool] | None = None,
    ) -> T:
        """``fn()``, retried through an outage; raises DatabaseUnavailableError past the bound.

        ``on_failure`` runs after each transient failure (e.g. to drop a pool's dead
        connections); ``stop`` ends the retries early (e.g. a shutdown).
        """
        deadline: float | None = None
        delay = _FIRST_DELAY_S
        while True:
            try:
                result = fn()
            except BaseException as exc:
                if not is_transient(exc):
                    raise
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self.timeout
                self.monitor.failed(exc)
                if on_failure is not None:
                    on_failure(exc)
                if now >= deadline or (stop is not None and stop()):
                    why = describe(exc)
                    break
                pause = min(delay, deadline - now) * random.uniform(0.5, 1.0)
                time.sleep(max(0.0, pause))
                delay = min(delay * _BACKOFF, _MAX_DELAY_S)
                continue
            self.monitor.succeeded()
            return result
        # Raised here, outside the ``except``: the driver's exception, which may quote
        # pieces of the connection string, is not even kept as its context.
        raise DatabaseUnavailableError(
            f"could not {what}: the database was unavailable for {self.timeout:g}s ({why})"
        )

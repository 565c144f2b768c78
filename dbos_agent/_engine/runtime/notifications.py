"""Waking waiters when Postgres says something changed: LISTEN/NOTIFY with polling behind it.

One dedicated autocommit connection per runtime LISTENs in a background
thread and wakes the waiters registered for a (channel, payload) pair, e.g.
the recv calls of one workflow on ``dbos_agent_messages``. NOTIFY is not
durable (nothing is queued while the listener reconnects, and some poolers
drop it), so every waiter also re-checks the database every
``poll_interval`` seconds: a lost notification delays a wake-up, it never
hangs a workflow. After each (re)connect every waiter re-checks at once.

Behind a transaction pooler without a direct URL (``SystemDatabase.direct`` is None)
nothing LISTENs: a LISTEN there would hold for one transaction on one server connection.
Every waiter then polls every ``poll_interval``, and the waker sweeps as often (see
``core.py``): a wake-up takes up to that long instead of a round trip.

Durable waits block on a :class:`Waiter`, synchronously or on an event loop; the
plans that drive them are in ``plans.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import select
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg

from ..._storage.connector import Connector
from ..._storage.database import SystemDatabase
from ..._storage.outages import describe, is_transient

log = logging.getLogger(__name__)

#: NOTIFY channel of new messages; the payload is the destination workflow id.
MESSAGES_CHANNEL = "dbos_agent_messages"
#: NOTIFY channel of set events; the payload is the publishing workflow id.
EVENTS_CHANNEL = "dbos_agent_events"
#: NOTIFY channel of cancels (see operations.py); waits in a workflow end early on it.
CANCEL_CHANNEL = "dbos_agent_cancel"
#: Payload: a workflow that finished while another was suspended on its result.
FINISHED_CHANNEL = "dbos_agent_finished"
#: Payload: a workflow whose steps waiting for a retry were made due now (``dbos-agent
#: retry``): a run waiting for it in memory tries at once, the waker wakes a suspended one.
RETRY_CHANNEL = "dbos_agent_retry"
#: Payload '': a workflow became claimable (PENDING without an owner, or its session
#: ended): take-over passes look now.
CLAIMABLE_CHANNEL = "dbos_agent_claimable"

_RECONNECT_MIN_S = 0.1
_RECONNECT_MAX_S = 1.0
_IDLE_SELECT_S = 30.0


class Waiter:
    """One registered wait: the listener thread wakes it, a sync or async caller waits."""

    __slots__ = ("_closed", "_event", "_future", "_lock")

    def __init__(self, closed: threading.Event) -> None:
        self._closed = closed
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._future: tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None = None

    def wake(self) -> None:
        """Called from any thread: end the current or next wait early."""
        with self._lock:
            self._event.set()
            pending = self._future
        if pending is not None:
            loop, future = pending
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(_settle, future)

    def wait(self, timeout: float) -> None:
        """Block until woken, closed or ``timeout`` seconds passed; then re-arm."""
        if timeout > 0 and not self._closed.is_set():
            self._event.wait(timeout)
        self._event.clear()

    async def wait_async(self, timeout: float) -> None:
        """:meth:`wait` without blocking the event loop."""
        if timeout <= 0 or self._closed.is_set():
            self._event.clear()
            return
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._lock:
            if self._event.is_set():
                self._event.clear()
                return
            self._future = (loop, future)
        try:
            await asyncio.wait((future,), timeout=timeout)
        finally:
            with self._lock:
                self._future = None
                self._event.clear()


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Notifications:
    """The runtime's listener thread and the waiters and subscribers it wakes."""

    def recheck_interval(self) -> float:
        """How long a waiter may sleep before looking again: short while LISTEN is
        down, long while it is healthy (every reconnect re-checks all waiters)."""
        return self.poll_interval * (10 if self.listening.is_set() else 1)

    def __init__(
        self, db: SystemDatabase, *, poll_interval: float = 1.0, listen: bool = True
    ) -> None:
        #: Where the listener connects; None: nothing LISTENs, every waiter polls.
        self._link = db.direct if listen else None
        #: Seconds between database re-checks of a waiter when no NOTIFY comes.
        self.poll_interval = poll_interval
        #: Set while LISTEN is active on a live connection.
        self.listening = threading.Event()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._waiters: dict[tuple[str, str], set[Waiter]] = {}
        self._every: set[Waiter] = set()
        self._subscribers: dict[str, list[Callable[[str], None]]] = {}
        self._thread: threading.Thread | None = None
        # Ends the listener's select() at once (stop, a new subscription).
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None

    @property
    def closed(self) -> bool:
        """True once the runtime shut the listener down: waits end, waiters stop."""
        return self._closed.is_set()

    # -- lifecycle ----------------------------------------------------------------------

    @property
    def polls(self) -> bool:
        """Whether nothing LISTENs here (every waiter polls, see the module's doc)."""
        return self._link is None

    def start(self) -> None:
        """Start the listener thread (``launch()`` does this), unless nothing LISTENs."""
        if self._thread is not None:
            raise RuntimeError("the notification listener was started already")
        if self._link is None:
            return
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._thread = threading.Thread(
            target=self._run, name="dbos-agent-notifications", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Stop listening and end every wait now (their workflows stay PENDING)."""
        self._closed.set()
        self._poke()
        self.wake_all()
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        if thread is not None and not thread.is_alive() and self._wake_r and self._wake_w:
            self._wake_r.close()
            self._wake_w.close()

    # -- registration -------------------------------------------------------------------

    def subscribe(self, channel: str, callback: Callable[[str], None]) -> Callable[[], None]:
        """Call ``callback(payload)`` for every NOTIFY on ``channel``; returns an unsubscribe.

        The listener LISTENs on the channel within moments (NOTIFYs sent before
        that are not seen, so pair a subscription with a check of the database).
        Callbacks run on the listener thread: keep them quick and non-blocking.
        """
        with self._lock:
            self._subscribers.setdefault(channel, []).append(callback)
        self._poke()

        def unsubscribe() -> None:
            with self._lock:
                callbacks = self._subscribers.get(channel, [])
                if callback in callbacks:
                    callbacks.remove(callback)

        return unsubscribe

    def listen(self, channel: str) -> None:
        """LISTEN on ``channel`` from now on (for waiters keyed on it), if not already."""
        with self._lock:
            if channel in self._subscribers:
                return
            self._subscribers[channel] = []
        self._poke()

    @contextlib.contextmanager
    def waiter(self, *keys: tuple[str, str]) -> Iterator[Waiter]:
        """A waiter woken by a NOTIFY of any ``(channel, payload)`` in ``keys``, and by shutdown.

        Register it *before* checking the database: a NOTIFY that lands between
        the check and the wait then still ends the wait.
        """
        waiter = Waiter(self._closed)
        with self._lock:
            self._every.add(waiter)
            for key in keys:
                self._waiters.setdefault(key, set()).add(waiter)
        try:
            yield waiter
        finally:
            with self._lock:
                self._every.discard(waiter)
                for key in keys:
                    group = self._waiters.get(key)
                    if group is not None:
                        group.discard(waiter)
                        if not group:
                            del self._waiters[key]

    # -- the listener thread ------------------------------------------------------------

    def _poke(self) -> None:
        if self._wake_w is not None:
            with contextlib.suppress(OSError):
                self._wake_w.send(b"\0")

    def wake_all(self) -> None:
        """Wake every waiter: each looks again (after a reconnect, or a moved clock)."""
        with self._lock:
            waiters = list(self._every)
        for waiter in waiters:
            waiter.wake()

    def _dispatch(self, channel: str, payload: str) -> None:
        with self._lock:
            if payload:
                waiters = list(self._waiters.get((channel, payload), ()))
            else:  # a payload too long to send: wake the whole channel
                waiters = [w for (c, _), g in self._waiters.items() if c == channel for w in g]
            callbacks = list(self._subscribers.get(channel, ()))
        for callback in callbacks:  # first: a woken waiter may look at what they noted
            try:
                callback(payload)
            except Exception:
                log.exception("a NOTIFY callback for channel %r failed", channel)
        for waiter in waiters:
            waiter.wake()

    def _run(self) -> None:
        link = self._link
        assert link is not None
        delay = _RECONNECT_MIN_S
        while not self._closed.is_set():
            try:
                with link.connect_dedicated("dbos_agent_listener") as conn:
                    link.monitor.succeeded()
                    delay = _RECONNECT_MIN_S
                    self._serve(conn, link)
            except Exception as exc:
                if self._closed.is_set():
                    break
                if is_transient(exc):
                    link.monitor.failed(exc)
                else:
                    log.warning("the notification listener failed: %s", describe(exc))
            finally:
                self.listening.clear()
            self._closed.wait(delay)
            delay = min(delay * 2, _RECONNECT_MAX_S)

    def _serve(self, conn: psycopg.Connection[Any], link: Connector) -> None:
        """LISTEN on every wanted channel and dispatch NOTIFYs until closed."""
        assert self._wake_r is not None
        listened: set[str] = set()
        while not self._closed.is_set():
            with self._lock:
                wanted = {MESSAGES_CHANNEL, EVENTS_CHANNEL, *self._subscribers}
            for channel in sorted(wanted - listened):
                link.listen(conn, channel)
                listened.add(channel)
            if not self.listening.is_set():
                self.listening.set()
                self.wake_all()  # anything sent while we were not listening: re-check
            # Received ones first (a NOTIFY can arrive with a LISTEN's reply), then wait.
            for notify in conn.notifies(timeout=0):
                self._dispatch(notify.channel, notify.payload)
            poke = self._wake_r.fileno()
            readable, _, _ = select.select([conn.fileno(), poke], [], [], _IDLE_SELECT_S)
            if poke in readable:
                with contextlib.suppress(OSError):
                    while self._wake_r.recv(4096):
                        pass

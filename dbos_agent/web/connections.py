"""The connections of ``dbos-agent serve``: uvicorn's HTTP/1.1 protocol (h11) with the
limits uvicorn lacks, so that no client holds a connection, or the memory behind it,
for as long as it likes.

uvicorn closes an idle keep-alive connection, but any byte received resets that, and it
has no deadline at all for a connection's first request: a client that sends a request
line one byte at a time, or nothing, keeps its connection (an open file) forever. And a
client that stops reading its answer keeps the answer's unsent bytes, and the
connection, until it reads. So each connection here has, besides uvicorn's own limits:

- a request deadline: the whole request (line, headers and body) within
  ``request_timeout`` seconds of the connection being opened or of the last answer;
  then 408 (or, if nothing of a request came, nothing) and the connection is closed;
- a send deadline: while bytes of an answer wait to be sent and the client takes none
  of them for ``send_timeout`` seconds, the connection is reset (its buffers freed, the
  kernel's too);
- a cap on open connections: one more than ``max_connections`` is answered 503 and
  closed at once.

Repeated warnings (a malformed request, a write to a lost connection) are logged once a
minute at most, with the number held back.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import struct
import time
from dataclasses import dataclass
from typing import Any, ClassVar

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from .limits import (
    DEFAULT_IDLE_TIMEOUT,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_REQUEST_TIMEOUT,
    DEFAULT_SEND_TIMEOUT,
    MAX_HEAD_BYTES,
)

__all__ = ["ConnectionLimits", "server_config"]

#: The client is still sending its request.
_RECEIVING = (h11.IDLE, h11.SEND_BODY)


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """How long a connection may take to send a request or its answer, and how many may
    be open (see the module doc)."""

    max_connections: int = DEFAULT_MAX_CONNECTIONS
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    idle_timeout: int = DEFAULT_IDLE_TIMEOUT
    send_timeout: float = DEFAULT_SEND_TIMEOUT

    def __post_init__(self) -> None:
        for name in ("max_connections", "request_timeout", "idle_timeout", "send_timeout"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")


class _LimitedH11(H11Protocol):
    """uvicorn's h11 protocol with :class:`ConnectionLimits` (a subclass per server sets
    ``limits``)."""

    limits: ClassVar[ConnectionLimits]

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._request_timer: asyncio.TimerHandle | None = None
        self._send_timer: asyncio.TimerHandle | None = None
        self._unsent = 0
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            self._refuse(
                503,
                "TooManyConnections",
                f"this server has {self.limits.max_connections} connections open already "
                f"(its --max-connections); try again later",
            )
            return
        self._await_request()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._request_timer is not None and self.conn.their_state not in _RECEIVING:
            self._request_timer.cancel()
            self._request_timer = None

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state in _RECEIVING:
            self._await_request()
        if self.transport.get_write_buffer_size():
            self._watch_sending()

    def pause_writing(self) -> None:
        super().pause_writing()
        self._watch_sending()

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._send_timer is not None:  # the client took some: watch again when stuck
            self._send_timer.cancel()
            self._send_timer = None

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self._request_timer, self._send_timer):
            if timer is not None:
                timer.cancel()
        self._request_timer = self._send_timer = None
        super().connection_lost(exc)

    def _await_request(self) -> None:
        if self._request_timer is None:
            self._request_timer = self.loop.call_later(
                self.limits.request_timeout, self._request_late
            )

    def _request_late(self) -> None:
        self._request_timer = None
        if self.transport.is_closing() or self.conn.their_state not in _RECEIVING:
            return
        started = self.conn.their_state is h11.SEND_BODY or bool(self.conn.trailing_data[0])
        cycle = self.cycle
        answering = cycle is not None and cycle.response_started and not cycle.response_complete
        if started and not answering:
            self._refuse(
                408,
                "RequestTimeout",
                f"the request did not arrive whole within {self.limits.request_timeout:g} s "
                f"(the server's --request-timeout)",
            )
        else:
            self.transport.close()

    def _watch_sending(self) -> None:
        """Drop the connection if the client takes none of the bytes waiting for it
        within the send timeout (looked at while the answer waits for the client: paused,
        or finished)."""
        if self._send_timer is None:
            self._unsent = self.transport.get_write_buffer_size()
            self._send_timer = self.loop.call_later(self.limits.send_timeout, self._send_late)

    def _send_late(self) -> None:
        self._send_timer = None
        unsent = self.transport.get_write_buffer_size()
        finished = self.cycle is None or self.cycle.response_complete
        if unsent == 0 or not (self.flow.write_paused or finished):
            return
        if unsent < self._unsent:  # it took some: give it another period
            self._watch_sending()
            return
        self._reset()

    def _reset(self) -> None:
        """Drop the connection with a reset: the client learns it at once, and the
        kernel drops what it still held for it (a plain close would keep sending it)."""
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):  # already gone
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.transport.abort()

    def _refuse(self, status: int, kind: str, message: str) -> None:
        """A JSON error written as is (no request has been read, or not whole), and the
        connection closed."""
        body = json.dumps({"error": message, "type": kind}).encode()
        reason = {408: "Request Timeout", 503: "Service Unavailable"}[status]
        self.transport.write(
            f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode()
            + body
        )
        self.transport.close()
        self._watch_sending()


class _Repeats(logging.Filter):
    """Each message (by its format) at most once per ``every`` seconds; the next one that
    goes through says how many were held back."""

    def __init__(self, every: float = 60.0) -> None:
        super().__init__()
        self.every = every
        self.seen: dict[tuple[str, str], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg))
        now = time.monotonic()
        last, held = self.seen.get(key, (-self.every, 0))
        if now - last < self.every:
            self.seen[key] = (last, held + 1)
            return False
        self.seen[key] = (now, 0)
        if held:
            record.msg = f"{record.msg} ({held} more like it in the last {self.every:g} s)"
        return True


def server_config(app: Any, limits: ConnectionLimits, **options: Any) -> uvicorn.Config:
    """A uvicorn configuration serving ``app`` on connections with ``limits`` (uvicorn's
    ``options`` besides), its repeated warnings thinned out."""
    protocol = type("LimitedH11Protocol", (_LimitedH11,), {"limits": limits})
    config = uvicorn.Config(
        app,
        http=protocol,
        timeout_keep_alive=limits.idle_timeout,
        h11_max_incomplete_event_size=MAX_HEAD_BYTES,
        **{"log_level": "warning", **options},
    )
    repeats = _Repeats()
    for name in ("uvicorn.error", "asyncio"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _Repeats) for f in logger.filters):
            logger.addFilter(repeats)
    return config

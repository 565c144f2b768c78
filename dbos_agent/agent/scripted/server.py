"""The HTTP side: the request handler and :class:`ScriptedServer` (the log it keeps of
what it was asked is in ``request_log.py``)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, cast

from .protocol import (
    _ERROR_TYPES,
    _REASON_PHRASES,
    _digest,
    _error_body,
    _input_tokens,
    _render_message,
    _sse_events,
    validate_request,
)
from .request_log import RequestLog, RequestRecord
from .script import Delay, Fail, JSONDict, ScriptFn, ScriptItem

__all__ = ["MAX_REQUEST_BYTES", "ScriptedServer"]


#: The largest request body read: the Messages API's own limit (32 MB); a larger one is
#: refused (413 ``request_too_large``) before it is read.
MAX_REQUEST_BYTES = 32 * 1024 * 1024
_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


class _ScriptExhaustedError(Exception):
    pass


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # Hundreds of async agents connect at once: the default backlog (5) would make the
    # kernel drop their SYNs and the clients retry after a second or more.
    request_queue_size = 1024

    def __init__(self, address: tuple[str, int], scripted: ScriptedServer) -> None:
        self.scripted = scripted
        super().__init__(address, _Handler)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "ScriptedAnthropic/1.0"

    @property
    def scripted(self) -> ScriptedServer:
        return cast(_HTTPServer, self.server).scripted

    def setup(self) -> None:
        super().setup()
        # Headers and body are separate writes: without NODELAY, Nagle plus the client's
        # delayed ACK add ~40 ms to every reply.
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.scripted._track(self.connection, add=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.scripted._track(self.connection, add=False)

    def log_message(self, format: str, *args: Any) -> None:
        """Silence the default per-request stderr line; the request log has it all."""

    # -- writing ------------------------------------------------------------

    def _send_json(
        self, status: int, payload: Any, headers: Mapping[str, str] | None = None
    ) -> bool:
        data = json.dumps(payload).encode("utf-8")
        try:
            self.send_response(status, _REASON_PHRASES.get(status))
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)
            self.wfile.flush()
        except OSError:
            self.close_connection = True
            return False
        return True

    def _send_error_json(
        self, status: int, error_type: str, message: str, headers: Mapping[str, str] | None = None
    ) -> bool:
        headers = headers or {}
        request_id = headers.get("request-id", "req_unknown")
        return self._send_json(status, _error_body(error_type, message, request_id), headers)

    def _send_sse(
        self, events: list[tuple[str, JSONDict]], chunk_delay: float, headers: Mapping[str, str]
    ) -> bool:
        try:
            self.send_response(200)
            self.send_header("content-type", "text/event-stream; charset=utf-8")
            self.send_header("cache-control", "no-cache")
            self.send_header("transfer-encoding", "chunked")
            for key, value in headers.items():
                self.send_header(key, value)
            self.end_headers()
            for position, (name, payload) in enumerate(events):
                if position and chunk_delay > 0 and self.scripted._sleep(chunk_delay):
                    self.close_connection = True
                    return False
                data = f"event: {name}\ndata: {json.dumps(payload)}\n\n".encode()
                self.wfile.write(f"{len(data):X}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            self.close_connection = True
            return False
        return True

    # -- routing ------------------------------------------------------------

    def do_GET(self) -> None:
        self._not_found()

    def do_POST(self) -> None:
        refused = self._refusal()
        if refused is not None:  # answered without reading the body: the connection ends
            self.close_connection = True
            self._send_error_json(*refused)
            return
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        path = self.path.split("?", 1)[0].rstrip("/")
        if path == "/v1/messages":
            self.scripted._handle_messages(self, raw)
        elif path == "/v1/messages/count_tokens":
            self._count_tokens(raw)
        else:
            self._not_found()

    def _refusal(self) -> tuple[int, str, str] | None:
        """Why a request is refused before its body is read, if it is: this server is on a
        local port every web page the user opens can reach, so a request from a page (it
        carries an ``Origin``), for another host name (DNS rebinding), of a type a page may
        send without asking (anything but JSON) or larger than the Messages API accepts
        does not reach the script."""
        if self.headers.get("origin") is not None:
            return 403, "permission_error", "ScriptedServer refuses requests from web pages"
        if not self.scripted.serves_host(self.headers.get("host")):
            return 403, "permission_error", "ScriptedServer refuses requests for another host"
        kind = (self.headers.get("content-type") or "").split(";", 1)[0].strip().lower()
        if kind != "application/json":
            return 400, "invalid_request_error", "content-type must be application/json"
        declared = self.headers.get("content-length") or "0"
        if not declared.isdigit():
            return 400, "invalid_request_error", "a request needs a valid content-length"
        if int(declared) > MAX_REQUEST_BYTES:
            return (
                413,
                "request_too_large",
                f"the request body ({int(declared):,} bytes) is over the "
                f"{MAX_REQUEST_BYTES:,}-byte limit",
            )
        return None

    def _not_found(self) -> None:
        self._send_error_json(
            404, "not_found_error", f"ScriptedServer only serves POST /v1/messages, not {self.path}"
        )

    def _count_tokens(self, raw: bytes) -> None:
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {}
        self._send_json(
            200, {"input_tokens": _input_tokens(body if isinstance(body, dict) else {})}
        )


# --------------------------------------------------------------------------- the server


class ScriptedServer:
    """A local Messages API endpoint that answers from a script.

    ``script`` is a sequence of items consumed one per POST /v1/messages (invalid requests do
    not consume one), or a callable that gets the parsed request body and returns the item, so
    a reply can depend on the conversation. ``log_path`` appends one JSON line per request, for
    counting calls from outside a killed process; ``state_path`` persists the next script index
    so a restarted server process carries on where the previous one stopped.
    """

    def __init__(
        self,
        script: Sequence[ScriptItem] | ScriptFn | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        log_path: str | Path | None = None,
        state_path: str | Path | None = None,
    ) -> None:
        self._fn: ScriptFn | None = None
        self._items: list[ScriptItem] = []
        if callable(script):
            self._fn = script
        elif script is not None:
            self._items = list(script)
        self.host = host
        self._port = port
        self.log_path = Path(log_path) if log_path is not None else None
        self.state_path = Path(state_path) if state_path is not None else None
        self._next_index = 0
        self._seq = 0
        self._log = RequestLog(self.log_path)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._stopping = threading.Event()
        self._connections: set[socket.socket] = set()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ------------------------------------------------------------

    def start(self) -> ScriptedServer:
        """Bind and serve in a daemon thread; returns self. ``port=0`` picks a free port."""
        if self._httpd is not None:
            raise RuntimeError("ScriptedServer already started")
        if self.state_path is not None and self.state_path.exists():
            self._next_index = int(json.loads(self.state_path.read_text())["next_index"])
        self._stopping.clear()
        self._httpd = _HTTPServer((self.host, self._port), self)
        self._port = self._httpd.server_address[1]
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"scripted-anthropic-{self._port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, wake pending Delays and drop open (keep-alive) connections."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        self._stopping.set()
        httpd.shutdown()
        httpd.server_close()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> ScriptedServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The bound port (the requested one until started)."""
        return self._port

    def serves_host(self, host: str | None) -> bool:
        """Whether a request's ``Host`` names this server: on a loopback address, only
        its own names with its port (a page on another name that resolves here is not
        let in); bound to another address, any."""
        if self.host not in _LOOPBACK:
            return True
        return host is not None and host.lower() in {
            f"{name}:{self._port}" for name in ("127.0.0.1", "localhost", "[::1]")
        }

    @property
    def url(self) -> str:
        """Base URL for ``anthropic.Anthropic(base_url=...)``."""
        if self._httpd is None:
            raise RuntimeError("ScriptedServer is not running; call start() first")
        return f"http://{self.host}:{self._port}"

    # -- script and log access -------------------------------------------------

    def add(self, *items: ScriptItem) -> None:
        """Append items to a sequence script, e.g. after inspecting earlier requests."""
        if self._fn is not None:
            raise TypeError("cannot add items to a callable script")
        with self._lock:
            self._items.extend(items)

    @property
    def next_index(self) -> int:
        """Index of the next script item to serve (or number of callable calls so far)."""
        with self._lock:
            return self._next_index

    @property
    def remaining(self) -> int | None:
        """Items left in a sequence script; None for a callable script."""
        with self._lock:
            return None if self._fn is not None else max(0, len(self._items) - self._next_index)

    @property
    def requests(self) -> list[RequestRecord]:
        """A snapshot of every POST /v1/messages so far, oldest first."""
        return self._log.snapshot()

    @property
    def paid_calls(self) -> int:
        """Number of 200 replies: what a real API would have billed."""
        return self._log.paid_calls()

    @property
    def usage_total(self) -> tuple[int, int]:
        """Summed (input_tokens, output_tokens) over the paid replies."""
        return self._log.usage_total()

    def wait_for_requests(self, count: int, timeout: float = 5.0) -> list[RequestRecord]:
        """Block until ``count`` requests were answered; for clients running in other threads."""
        return self._log.wait_for(count, timeout)

    # -- internals ------------------------------------------------------------------

    def _track(self, conn: socket.socket, *, add: bool) -> None:
        with self._lock:
            if add:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)

    def _sleep(self, seconds: float) -> bool:
        """Sleep unless the server stops first; True means it is stopping."""
        return self._stopping.wait(seconds)

    def _take(self, body: JSONDict, seq: int) -> tuple[int, ScriptItem]:
        fn = self._fn
        with self._lock:
            index = self._next_index
            if fn is None and index >= len(self._items):
                raise _ScriptExhaustedError(
                    f"ScriptedServer: the script ran out: all {len(self._items)} items were "
                    f"used and request #{seq} asked for item {index}. "
                    "Add more items to the script."
                )
            self._next_index = index + 1
            self._save_state()
            if fn is None:
                return index, self._items[index]
        return index, fn(body)

    def _save_state(self) -> None:
        if self.state_path is None:
            return
        tmp = self.state_path.with_name(self.state_path.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"next_index": self._next_index}))
        tmp.replace(self.state_path)

    def _handle_messages(self, handler: _Handler, raw: bytes) -> None:
        with self._lock:
            seq = self._seq
            self._seq += 1
        started = time.time()
        request_id = "req_" + _digest(["req", seq, started])[:24]
        headers = {"request-id": request_id}
        retry_header = handler.headers.get("x-stainless-retry-count")
        retry_count = int(retry_header) if retry_header and retry_header.isdigit() else None
        body: Any = None
        stream = False
        item: ScriptItem | None = None
        index: int | None = None
        usage: tuple[int, int] | None = None
        stop_reason: str | None = None
        status = 0

        def answer_with(send: Callable[[], bool]) -> None:
            # Log first: once the client holds the reply, the log must already show it, even
            # if the client process is killed right after (crash tests read the log).
            position = self._record(
                RequestRecord(
                    seq=seq,
                    timestamp=started,
                    body=body,
                    stream=stream,
                    status=status,
                    item=item,
                    script_index=index,
                    usage=usage,
                    stop_reason=stop_reason,
                    retry_count=retry_count,
                )
            )
            if not send():
                self._mark_disconnected(position)

        def error(code: int, kind: str, message: str, extra: Mapping[str, str]) -> None:
            answer_with(lambda: handler._send_error_json(code, kind, message, extra))

        try:
            body = json.loads(raw) if raw else None
        except ValueError as exc:
            status = 400
            error(400, "invalid_request_error", f"Request body is not valid JSON: {exc}", headers)
            return
        stream = isinstance(body, dict) and body.get("stream") is True
        problem = validate_request(body)
        if problem is not None:
            status = 400
            error(400, "invalid_request_error", problem, headers)
            return
        # Script problems are test bugs: tell the client not to retry them.
        no_retry = {**headers, "x-should-retry": "false"}
        try:
            index, item = self._take(cast(JSONDict, body), seq)
        except _ScriptExhaustedError as exc:
            status = 500
            error(500, "api_error", str(exc), no_retry)
            return
        except Exception as exc:
            status = 500
            error(500, "api_error", f"ScriptedServer: the script callable raised {exc!r}", no_retry)
            return

        answer: ScriptItem = item
        while isinstance(answer, Delay):
            if self._sleep(answer.seconds):
                handler.close_connection = True
                answer_with(lambda: False)  # status 0: the server stopped before answering
                return
            answer = answer.then
        if isinstance(answer, Fail):
            status = answer.status
            fail_headers = dict(headers)
            if answer.retry_after is not None:
                seconds = float(answer.retry_after)
                fail_headers["retry-after"] = (
                    str(int(seconds)) if seconds.is_integer() else str(seconds)
                )
            if answer.should_retry is not None:
                fail_headers["x-should-retry"] = "true" if answer.should_retry else "false"
            error_type = answer.error_type or _ERROR_TYPES.get(answer.status, "api_error")
            message = answer.message or f"ScriptedServer: scripted {error_type} ({answer.status})"
            error(status, error_type, message, fail_headers)
            return
        message_json = _render_message(answer, cast(JSONDict, body), seq)
        usage = (message_json["usage"]["input_tokens"], message_json["usage"]["output_tokens"])
        stop_reason = message_json["stop_reason"]
        status = 200
        if stream:
            events = _sse_events(message_json)
            delay = answer.chunk_delay
            answer_with(lambda: handler._send_sse(events, delay, headers))
        else:
            answer_with(lambda: handler._send_json(200, message_json, headers))

    def _record(self, rec: RequestRecord) -> int:
        return self._log.append(rec)

    def _mark_disconnected(self, position: int) -> None:
        self._log.mark_disconnected(position)

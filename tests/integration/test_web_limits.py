"""`dbos-agent serve` against clients that would hold its resources (issue 29), over raw
sockets: a hundred stream readers that never read, readers that stop, connections that
send their request a byte at a time or never, more connections than the server takes.
Memory is the server process's own (a subprocess, from /proc); times are only deadlines
to give up at, never asserted."""

from __future__ import annotations

import fcntl
import json
import socket
import struct
import termios
from collections.abc import Iterator

import httpx
import pytest

import dbos_agent as da
from dbos_agent._engine.runtime.core import Engine
from dbos_agent.web.connections import ConnectionLimits
from dbos_agent.web.limits import DEFAULT_MAX_STREAMS
from tests.helpers import wait_until
from tests.support.web import Server
from tests.support.web_load import Served, closed_by_peer, hung_up, status_line

TOKEN = "limits-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ITEMS, ITEM_BYTES = 100, 64 * 1024  # 6.4 MB: every reader of it held all of it at once


@da.durable_workflow(name="limits_big_stream")
def big_stream(items: int, size: int) -> int:
    for i in range(items):
        da.write_stream("big", f"{i:06d}" + "x" * (size - 6))
    return items


@pytest.fixture
def big(runtime: da.Runtime) -> str:
    """A finished workflow with ITEMS items of ITEM_BYTES in stream ``big``."""
    handle = da.start(big_stream, ITEMS, ITEM_BYTES)
    assert handle.result(timeout=120) == ITEMS
    return handle.workflow_id


@pytest.fixture
def server(runtime: da.Runtime, dbos_agent_database_url: str) -> Iterator[Server]:
    with Server(dbos_agent_database_url, TOKEN) as running:
        yield running


def _unread(sock: socket.socket) -> int:
    """Bytes received on ``sock`` and not read yet."""
    return int(struct.unpack("i", fcntl.ioctl(sock, termios.FIONREAD, b"\0\0\0\0"))[0])


def _ask(port: int, path: str, receive_buffer: int = 16 * 1024) -> socket.socket:
    """A connection that asked for ``path`` and has read nothing (a small receive
    buffer: the server's answer backs up at once)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.settimeout(60)
    sock.connect(("127.0.0.1", port))
    sock.sendall(
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {TOKEN}\r\n\r\n".encode()
    )
    return sock


def test_a_hundred_stream_readers_that_never_read_hold_little_memory(
    big: str, dbos_agent_database_url: str
) -> None:
    """Each answer used to read its whole page (up to 500 items, here 6.4 MB) and hold it
    while its reader did not read: 100 such readers took gigabytes, and kept them. Now
    32 streams run at once (the others are told 503), each holding a page of at most
    256 KiB, read only when the last was taken; the server answers meanwhile, and gives
    the memory back when they leave."""
    with Served(dbos_agent_database_url, token=TOKEN) as server:
        assert server.get(f"/api/workflows/{big}")[0] == 200  # a request through every layer
        start = server.rss_mb()
        files = server.open_files()
        clients = [_ask(server.port, f"/api/workflows/{big}/streams/big") for _ in range(100)]
        statuses = [status_line(sock) for sock in clients]
        streaming = [sock for sock, status in zip(clients, statuses, strict=True) if status == 200]
        assert len(streaming) == DEFAULT_MAX_STREAMS, (statuses, server.output())
        assert statuses.count(503) == 100 - DEFAULT_MAX_STREAMS
        wait_until(  # every stream has read its first page and sent what it could
            lambda: all(_unread(sock) >= 8 * 1024 for sock in streaming), 60, "first pages sent"
        )
        with httpx.Client(base_url=f"http://127.0.0.1:{server.port}", timeout=30) as api:
            other = api.get(f"/api/workflows/{big}", headers=AUTH)
            assert other.status_code == 200 and other.json()["status"] == "SUCCESS"
            refused = api.get(f"/api/workflows/{big}/streams/big", headers=AUTH)
            assert refused.status_code == 503, refused.text
            assert refused.json()["type"] == "TooManyStreams"
            assert refused.headers["retry-after"] == "5"
        grown = server.peak_rss_mb() - start
        assert grown < 200, f"the server grew by {grown:.0f} MB\n{server.output()}"

        for sock in clients:
            sock.close()
        wait_until(  # (the database pool may have opened its other 3 connections)
            lambda: server.open_files() <= files + 3, 60, "the connections closed"
        )
        kept = server.rss_mb() - start
        assert kept < 100, f"the server kept {kept:.0f} MB\n{server.output()}"
        assert "socket.send() raised exception" not in server.output()


def test_a_stream_reader_that_stops_reading_is_dropped_and_its_slot_freed(
    big: str, runtime: da.Runtime, dbos_agent_database_url: str
) -> None:
    """A reader that takes none of its answer for the send timeout is dropped: it does
    not keep a stream slot, or the answer's buffers, for ever."""
    limits = ConnectionLimits(send_timeout=0.5)
    path = f"/api/workflows/{big}/streams/big"
    with Server(dbos_agent_database_url, TOKEN, limits, max_streams=2) as server:
        stuck = [_ask(server.port, path) for _ in range(2)]
        assert [status_line(sock) for sock in stuck] == [200, 200]
        third = _ask(server.port, path)
        assert status_line(third) == 503
        third.close()
        wait_until(lambda: all(hung_up(s) for s in stuck), 60, "the stopped readers dropped")
        got: list[httpx.Response] = []

        def read_whole() -> bool:  # once a slot is given back: everything, in order
            got.append(httpx.get(server.base + path, headers=AUTH, timeout=60))
            return got[-1].status_code == 200

        wait_until(read_whole, 60, "a stream slot given back")
        values = [
            json.loads(line[len("data: ") :])
            for line in got[-1].text.split("\n")
            if line.startswith('data: {"offset"')
        ]
        assert [v["offset"] for v in values] == list(range(ITEMS))
        assert all(v["value"] == f"{v['offset']:06d}" + "x" * (ITEM_BYTES - 6) for v in values)


def test_slow_and_silent_connections_are_closed_after_the_request_timeout(
    runtime: da.Runtime, dbos_agent_database_url: str
) -> None:
    """1,000 connections that send half a request (a request line, or headers without
    their end) or nothing at all: each is closed once the request timeout has passed,
    those that began a request with a 408; meanwhile the server answers others."""
    limits = ConnectionLimits(request_timeout=1, max_connections=2000)
    partial = [b"GET /api/workflows HT", b"GET /api/workflows HTTP/1.1\r\nHost: 127.0.0.1\r\nX-"]
    with Server(dbos_agent_database_url, TOKEN, limits) as slow_server:
        socks = []
        for i in range(1000):
            sock = socket.create_connection(("127.0.0.1", slow_server.port), timeout=60)
            if i % 10:  # every tenth sends nothing
                sock.sendall(partial[i % 2])
            socks.append(sock)
        listing = httpx.get(f"{slow_server.base}/api/workflows?limit=1", headers=AUTH)
        assert listing.status_code == 200
        answers = []
        for sock in socks:  # blocking reads: each ends when the server closes
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
            answers.append(answer)
            sock.close()
        timed_out = [a for i, a in enumerate(answers) if i % 10]
        assert all(a.startswith(b"HTTP/1.1 408 ") for a in timed_out), timed_out[:1]
        assert b'"type": "RequestTimeout"' in timed_out[0]
        assert all(a == b"" for i, a in enumerate(answers) if not i % 10)


def test_a_request_sent_a_byte_at_a_time_is_cut_off(
    runtime: da.Runtime, dbos_agent_database_url: str
) -> None:
    """Each byte received used to restart uvicorn's keep-alive timer: a client dribbling
    its next request kept the connection for ever. The request timeout counts from the
    last answer, whatever arrives."""
    limits = ConnectionLimits(request_timeout=1, idle_timeout=1)
    with Server(dbos_agent_database_url, TOKEN, limits) as server:
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=60)
        sock.sendall(
            f"GET /api/workflows?limit=1 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {TOKEN}\r\n\r\n".encode()
        )
        assert status_line(sock) == 200
        dribble = iter(b"GET /api/workflows HTTP/1.1\r\n" * 100)
        sent = []

        def closed_while_dribbling() -> bool:
            if closed_by_peer(sock):
                return True
            try:
                sock.send(bytes([next(dribble)]))
            except OSError:
                return True
            sent.append(1)
            return False

        wait_until(closed_while_dribbling, 60, "the dribbling connection closed", every=0.1)
        sock.close()


def test_a_connection_past_the_cap_is_told_503_and_closed(
    runtime: da.Runtime, dbos_agent_database_url: str
) -> None:
    limits = ConnectionLimits(max_connections=5)
    with Server(dbos_agent_database_url, TOKEN, limits) as server:
        held = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(5)]
        with socket.create_connection(("127.0.0.1", server.port), timeout=60) as extra:
            answer = b""
            while chunk := extra.recv(65536):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 503 "), answer
        assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["type"] == "TooManyConnections"
        for sock in held:
            sock.close()

        def answers() -> bool:
            try:
                return httpx.get(f"{server.base}/api/workflows", headers=AUTH).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(answers, 30, "a connection taken once the others closed")


def test_a_stream_page_is_bounded_in_bytes(big: str, engine: Engine) -> None:
    """A page holds items up to the byte limit (the first alone when it is larger), so a
    reader never holds more than a page; followed, the stream is whole and in order."""
    db = engine.db
    rows, status = db.streams.read(big, "big", 0, 500, 3 * ITEM_BYTES)
    assert [r.offset for r in rows] == [0, 1] and status is da.WorkflowStatus.SUCCESS
    rows, _ = db.streams.read(big, "big", 7, 500, 100)
    assert [r.offset for r in rows] == [7]  # larger than the limit: alone
    rows, _ = db.streams.read(big, "big", 95, 3, 10**9)
    assert [r.offset for r in rows] == [95, 96, 97]
    rows, _ = db.streams.read(big, "big", ITEMS, 500, 10**9)
    assert rows == []
    followed = list(da.read_stream(big, "big"))
    assert [item.offset for item in followed] == list(range(ITEMS))


def test_serve_takes_the_limits_as_options(big: str, dbos_agent_database_url: str) -> None:
    options = ("--max-streams", "1", "--request-timeout", "0.5", "--send-timeout", "0.5")
    with Served(dbos_agent_database_url, *options, token=TOKEN) as server:
        first = _ask(server.port, f"/api/workflows/{big}/streams/big")
        assert status_line(first) == 200
        with _ask(server.port, f"/api/workflows/{big}/streams/big") as second:
            assert status_line(second) == 503
        wait_until(lambda: hung_up(first), 60, "the reader that does not read dropped")
        first.close()
        with socket.create_connection(("127.0.0.1", server.port), timeout=60) as silent:
            assert silent.recv(100) == b""  # closed after the request timeout
    refused = Served(dbos_agent_database_url, "--max-connections", "0")
    assert refused.process.wait(60) == 2, refused.output()
    assert "--max-connections: '0' is not a whole number >= 1" in refused.output()


def test_readers_that_leave_mid_stream_leave_no_warnings(
    big: str, dbos_agent_database_url: str
) -> None:
    """A reader that resets its connection while the server writes to it: each write
    after the reset used to log ``socket.send() raised exception.`` (thousands of lines
    for a hundred readers); the server now sees the connection lost before writing
    again."""
    with Served(dbos_agent_database_url, "--max-streams", "100", token=TOKEN) as server:
        assert server.get(f"/api/workflows/{big}")[0] == 200  # the database opened
        files = server.open_files()
        for sock in [_ask(server.port, f"/api/workflows/{big}/streams/big") for _ in range(30)]:
            got = 0
            while got < 256 * 1024 and (chunk := sock.recv(65536)):
                got += len(chunk)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()  # a reset
        wait_until(lambda: server.open_files() <= files + 3, 60, "the connections closed")
    assert "socket.send() raised exception" not in server.output(), server.output()

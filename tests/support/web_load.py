"""`dbos-agent serve` under load, seen from outside: the server in a subprocess (its RSS and
open files read from /proc), and raw socket clients that send what they like and read as
little as they like. Used by tests/integration/test_web_limits.py and bench/bench_web_streams.py."""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from types import TracebackType

from tests.helpers import wait_until
from tests.support import zygote

ROOT = Path(__file__).resolve().parents[2]


class Served:
    """``dbos-agent serve`` on a free port, its stderr kept in a file (a full pipe would
    block it), stopped with SIGTERM; ``output()`` is what to show when a test fails."""

    def __init__(self, url: str, *options: str, token: str = "load-token") -> None:
        self.token = token
        self._errors = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (read after the exit)
        env = {k: v for k, v in os.environ.items() if k != "DBOS_AGENT_HTTP_TOKEN"}
        self.process = zygote.popen(
            [
                *(sys.executable, "-m", "dbos_agent", "--database-url", url, "serve"),
                *("--port", "0", "--token", token, *options),
            ],
            env={**env, "PYTHONPATH": str(ROOT)},
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=self._errors,
            text=True,
        )
        self.port = 0

    def __enter__(self) -> Served:
        try:
            assert self.process.stdout is not None
            for line in self.process.stdout:
                if "dashboard at http://127.0.0.1:" in line:
                    self.port = int(line.split("127.0.0.1:")[1].split("/")[0])
                    break
            assert self.port, f"the server did not start:\n{self.output()}"
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def output(self) -> str:
        self._errors.seek(0)
        return f"exit status {self.process.poll()}; stderr:\n{self._errors.read()[-5000:]}"

    def rss_mb(self) -> float:
        """The server process's resident memory now, in MB."""
        return self._status_kib("VmRSS") / 1024

    def peak_rss_mb(self) -> float:
        """The most resident memory the server process has had, in MB (the kernel's
        high-water mark: no sampling misses a peak)."""
        return self._status_kib("VmHWM") / 1024

    def _status_kib(self, field: str) -> int:
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        line = next(line for line in status.splitlines() if line.startswith(field + ":"))
        return int(line.split()[1])

    def open_files(self) -> int:
        return len(os.listdir(f"/proc/{self.process.pid}/fd"))

    def head(self, path: str, *, method: str = "GET") -> bytes:
        """A request's first lines with the token, ready to send."""
        return (
            f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
            f"Authorization: Bearer {self.token}\r\n\r\n"
        ).encode()

    def connect(self, receive_buffer: int | None = None) -> socket.socket:
        sock = socket.socket()
        if receive_buffer is not None:  # before connecting: it sets the TCP window
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        sock.settimeout(60)
        sock.connect(("127.0.0.1", self.port))
        return sock

    def get(self, path: str) -> tuple[int, bytes]:
        """A whole answer to GET ``path`` on a connection of its own: status and body."""
        with self.connect() as sock:
            sock.sendall(self.head(path).replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        return int(head.split()[1]), body


def status_line(sock: socket.socket) -> int:
    """The status of the answer on ``sock``, reading no more than its first line."""
    line = b""
    while not line.endswith(b"\r\n"):
        byte = sock.recv(1)
        if not byte:
            raise ConnectionError(f"closed after {line!r}")
        line += byte
    return int(line.split()[1])


def closed_by_peer(sock: socket.socket) -> bool:
    """Whether the other end has closed ``sock`` (what it sent before is read and dropped)."""
    sock.setblocking(False)
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return True
    except BlockingIOError:
        return False
    except ConnectionError:
        return True
    finally:
        sock.setblocking(True)


def hung_up(sock: socket.socket) -> bool:
    """Whether the other end has closed or reset ``sock``, reading nothing from it."""
    poller = select.poll()
    poller.register(sock, select.POLLRDHUP | select.POLLHUP | select.POLLERR)
    return bool(poller.poll(0))


def wait_all_closed(socks: list[socket.socket], timeout: float, what: str) -> None:
    """Wait until the server has closed every socket of ``socks``."""
    left = list(socks)

    def done() -> bool:
        left[:] = [s for s in left if not closed_by_peer(s)]
        return not left

    wait_until(done, timeout, what)

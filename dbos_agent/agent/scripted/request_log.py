"""What the scripted server was asked: one record per POST /v1/messages.

Tests count model calls from these records: in memory for a server in the test's own
process, and from a JSON-lines file for a server (or a client) that was killed -9, so
that what was paid for can be counted from outside the dead process.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .script import ScriptItem

__all__ = ["RequestLog", "RequestRecord"]


@dataclass(frozen=True)
class RequestRecord:
    """One POST /v1/messages as the server saw and answered it.

    ``item`` is the top-level script item that answered (a Delay, not what it wraps) and
    ``script_index`` its position (or the callable's call number); both are None when the
    request was rejected before reaching the script (validation) or the script ran out.
    Records are logged just before the reply is written, so a client that has its reply always
    finds it logged. ``status`` is 0 when the server stopped before answering.
    ``client_disconnected`` is set afterwards (in memory only) when writing the reply failed,
    e.g. a client killed mid-stream; such a 200 still counts as paid, as with the real API.
    """

    seq: int
    timestamp: float
    body: Any
    stream: bool
    status: int
    item: ScriptItem | None
    script_index: int | None
    usage: tuple[int, int] | None
    stop_reason: str | None
    retry_count: int | None
    client_disconnected: bool = False

    @property
    def paid(self) -> bool:
        """A 200 reply: the model did (and, for real, would bill) the work."""
        return self.status == 200


class RequestLog:
    """The records of one server, thread-safe; appended to ``path`` too when given."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._records: list[RequestRecord] = []
        self._changed = threading.Condition()

    def append(self, rec: RequestRecord) -> int:
        """Add ``rec``; returns its position (to mark it disconnected later)."""
        with self._changed:
            self._records.append(rec)
            self._changed.notify_all()
            if self.path is not None:
                self._append_line(rec)
            return len(self._records) - 1

    def mark_disconnected(self, position: int) -> None:
        """Writing the reply of the record at ``position`` failed (in memory only)."""
        with self._changed:
            self._records[position] = replace(self._records[position], client_disconnected=True)

    def snapshot(self) -> list[RequestRecord]:
        """Every record so far, oldest first."""
        with self._changed:
            return list(self._records)

    def paid_calls(self) -> int:
        """Number of 200 replies: what a real API would have billed."""
        with self._changed:
            return sum(1 for r in self._records if r.paid)

    def usage_total(self) -> tuple[int, int]:
        """Summed (input_tokens, output_tokens) over the paid replies."""
        with self._changed:
            paid = [r.usage for r in self._records if r.paid and r.usage is not None]
        return sum(u[0] for u in paid), sum(u[1] for u in paid)

    def wait_for(self, count: int, timeout: float) -> list[RequestRecord]:
        """Block until there are ``count`` records; TimeoutError after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while len(self._records) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{len(self._records)} of {count} requests after {timeout}s")
                self._changed.wait(left)
            return list(self._records)

    def _append_line(self, rec: RequestRecord) -> None:
        body = rec.body if isinstance(rec.body, dict) else {}
        messages = body.get("messages")
        line = {
            "seq": rec.seq,
            "ts": rec.timestamp,
            "pid": os.getpid(),
            "status": rec.status,
            "paid": rec.paid,
            "model": body.get("model"),
            "messages": len(messages) if isinstance(messages, list) else None,
            "stream": rec.stream,
            "item": type(rec.item).__name__.lower() if rec.item is not None else None,
            "script_index": rec.script_index,
            "stop_reason": rec.stop_reason,
            "usage": (
                {"input_tokens": rec.usage[0], "output_tokens": rec.usage[1]}
                if rec.usage is not None
                else None
            ),
            "retry_count": rec.retry_count,
        }
        # Open per line: O_APPEND makes each line one write even with several server processes.
        assert self.path is not None
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(line) + "\n")
            fh.flush()

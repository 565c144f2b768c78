"""Where an MCP server is and how to reach it: the sources ``ToolRegistry.from_mcp`` takes.

* ``StdioServerParameters`` or ``[command, *args]``: a server the registry starts, over
  stdio;
* :class:`McpHttpServer`, or an ``http(s)://`` URL: a server already running, reached
  over MCP's Streamable HTTP transport (each reconnect opens a new MCP session);
* an open ``mcp.ClientSession``: the application's own connection (see ``mcp.py``).

An HTTP server's URL may carry credentials (``user:password@``, a ``?token=``) and its
headers usually do (``Authorization``): none of them may reach a log, an error message or
the step log, where a failed call's ``isError`` text is recorded. :class:`Transport`
therefore scrubs every text it hands on, and :class:`McpHttpServer` shows only its
redacted URL.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from .._limits import DEFAULT_MAX_CHECKPOINT_BYTES
from ..errors import InvalidOptionError

__all__ = [
    "McpHttpServer",
    "McpSource",
    "Transport",
    "default_name",
    "safe_name",
    "shown_url",
    "transport_for",
]

_NAME_UNSAFE = re.compile(r"[^a-zA-Z0-9_-]")
_HIDDEN = "***"


@dataclass(frozen=True, repr=False)
class McpHttpServer:
    """An MCP server reached over Streamable HTTP at ``url`` (``http`` or ``https``),
    with ``headers`` sent on every request (``{"Authorization": "Bearer ..."}``).

    The headers' values and the URL's credentials and query are secrets: they are never
    shown, logged or recorded (``repr`` and errors show :attr:`redacted_url`).

    ``max_message_bytes`` is the largest answer (one server-sent event) read from it: by
    default twice the default checkpoint limit, so that any result a step can record gets
    through (the MCP SDK's own default, 1 MiB, refuses much less). A larger answer is an
    ``isError`` result saying so, never sent again; None reads any size.
    """

    url: str
    headers: Mapping[str, str] = field(default_factory=dict)
    max_message_bytes: int | None = 2 * DEFAULT_MAX_CHECKPOINT_BYTES

    def __post_init__(self) -> None:
        limit = self.max_message_bytes
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or limit < 1
        ):
            raise InvalidOptionError(
                f"max_message_bytes must be a positive number of bytes or None, got {limit!r}"
            )
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                f"an MCP server URL must be http(s)://host/..., got {shown_url(self.url)!r}"
            )

    @property
    def redacted_url(self) -> str:
        return shown_url(self.url)

    def __repr__(self) -> str:
        return f"McpHttpServer({self.redacted_url!r}, headers={sorted(self.headers)!r})"


#: A server: an open session, or how to reach one (see the module).
McpSource = ClientSession | StdioServerParameters | McpHttpServer | str | Sequence[str]


def shown_url(url: str) -> str:
    """``url`` without its user, password, query and fragment."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "<an unreadable URL>"
    hidden_query = _HIDDEN if parts.query else ""
    return urlunsplit((parts.scheme, host + port, parts.path, hidden_query, ""))


def _secrets_of(server: McpHttpServer) -> list[str]:
    """The strings of ``server`` (but its whole URL) no text may show, longest first."""
    parts = urlsplit(server.url)
    found = [parts.query, parts.fragment, parts.password or "", parts.username or ""]
    found += [value for _, value in parse_qsl(parts.query)]
    found += [value for value in server.headers.values()]
    found += [token for value in server.headers.values() for token in value.split()]
    return sorted({s for s in found if len(s) >= 3}, key=len, reverse=True)


@dataclass(frozen=True)
class Transport:
    """How a registry opens its own connection to a server, and what it may say of it."""

    #: What error messages call the server ("the MCP server", "the MCP server at URL").
    describe: str
    _stdio: StdioServerParameters | None = None
    _errlog: TextIO | None = None
    _http: McpHttpServer | None = None
    _secrets: tuple[str, ...] = ()

    @contextlib.asynccontextmanager
    async def streams(self) -> AsyncIterator[tuple[Any, Any]]:
        """The transport's read and write streams, open for as long as the block runs."""
        if self._http is not None:
            client = create_mcp_http_client(headers=dict(self._http.headers))
            async with (
                client,
                streamable_http_client(
                    self._http.url,
                    http_client=client,
                    max_sse_event_size=self._http.max_message_bytes,
                ) as s,
            ):
                yield s[0], s[1]
            return
        assert self._stdio is not None
        async with stdio_client(self._stdio, errlog=self._errlog or _stderr()) as s:
            yield s[0], s[1]

    def scrub(self, text: str) -> str:
        """``text`` with every secret of the server replaced (its URL by the redacted one)."""
        if self._http is not None:
            text = text.replace(self._http.url, self._http.redacted_url)
        for secret in self._secrets:
            text = text.replace(secret, _HIDDEN)
        return text


def transport_for(source: McpSource, errlog: TextIO | None) -> Transport:
    """The transport of a source the registry connects to itself (not a ``ClientSession``)."""
    if isinstance(source, str):
        source = McpHttpServer(source)
    if isinstance(source, McpHttpServer):
        return Transport(
            describe=f"the MCP server at {source.redacted_url}",
            _http=source,
            _secrets=tuple(_secrets_of(source)),
        )
    assert not isinstance(source, ClientSession)
    return Transport(describe="the MCP server", _stdio=parameters(source), _errlog=errlog)


def parameters(source: StdioServerParameters | Sequence[str]) -> StdioServerParameters:
    """A stdio server's parameters, from themselves or a ``[command, *args]`` list."""
    if isinstance(source, StdioServerParameters):
        return source
    command = [str(part) for part in source]
    if not command:
        raise ValueError("an MCP server command list must not be empty")
    return StdioServerParameters(command=command[0], args=command[1:])


def default_name(source: McpSource) -> str:
    """The server's name in step names when none is given: the script's (stdio), the
    URL path's last part or else its host (HTTP; not its port, which may change while a
    workflow waits), ``mcp`` for a session."""
    if isinstance(source, ClientSession):
        return "mcp"
    if isinstance(source, str | McpHttpServer):
        parts = urlsplit(source if isinstance(source, str) else source.url)
        segments = [s for s in parts.path.split("/") if s and s not in ("mcp", "sse")]
        name = segments[-1] if segments else parts.hostname or "mcp"  # never the port
    else:
        params = parameters(source)
        scripts = [arg for arg in params.args if not arg.startswith("-")]
        name = Path(scripts[-1] if scripts else params.command).stem.rsplit(".", 1)[-1]
    return safe_name(name) or "mcp"


def safe_name(name: str) -> str:
    """``name`` with what a step or tool name may not hold replaced by ``_``."""
    return _NAME_UNSAFE.sub("_", name)


def _stderr() -> TextIO:
    """Where a server's stderr goes by default: ours, if it is a real file (not a
    test runner's capture), else nowhere."""
    try:
        sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return open(os.devnull, "w")  # the server's stderr for its whole life
    return sys.stderr

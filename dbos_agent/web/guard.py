"""What the server checks before a request reaches the API, as one ASGI middleware.

A server on a laptop's loopback address is still reachable by every web page the
laptop's browser opens: a page on another origin can send a ``no-cors`` POST (its
answer is hidden, its effect is not), and a page whose domain name is rebound to
127.0.0.1 can read the answers as its own. So, in this order, before any body is read:

- ``Host`` must name this server: the bound host, a ``--allow-host`` name, a loopback
  name when bound to loopback, any IP literal when bound to every address (a rebound
  page always sends its own domain name) — else 421;
- the bearer token, when one is set, on every path but the dashboard's static page
  (``/``), OpenAPI document and docs included — else 401;
- a state-changing method needs a JSON body (``Content-Type: application/json``, which
  a cross-origin page cannot send without a CORS preflight, and none is ever allowed)
  and no foreign ``Origin`` nor ``Sec-Fetch-Site: cross-site`` — else 415 or 403;
- a body is at most ``max_body_bytes``: a larger ``Content-Length`` is refused at once,
  and a chunked body is read only up to the limit — else 413.

Ids may contain ``/``: sent as ``%2F``, they stay one path segment (see
:data:`SEGMENT`), which Starlette, decoding the path before routing, would lose.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from starlette.convertors import Convertor, register_url_convertor

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "SEGMENT",
    "Guard",
    "is_loopback",
    "is_wildcard",
]

#: Default largest request body (every body the API takes is a few hundred bytes).
DEFAULT_MAX_BODY_BYTES = 1024 * 1024

#: The path convertor of a path parameter that may contain ``/`` (sent as ``%2F``).
SEGMENT = "dbos_agent_segment"

_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
_UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


class _Segment(Convertor[str]):
    """One path segment, percent-decoded after routing (the guard keeps it encoded)."""

    regex = "[^/]+"

    def convert(self, value: str) -> str:
        return unquote(value)

    def to_string(self, value: str) -> str:
        return quote(value, safe="")


register_url_convertor(SEGMENT, _Segment())


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address, brackets allowed) is this machine only."""
    host = host.strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_wildcard(host: str) -> bool:
    """Whether ``host`` means every address of the machine (0.0.0.0, ::)."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_unspecified
    except ValueError:
        return False


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _host_name(authority: str) -> str:
    """The host of a ``Host`` header value (``[::1]:8787`` -> ``::1``), lower case."""
    authority = authority.strip().lower()
    if authority.startswith("["):
        return authority[1 : authority.find("]")] if "]" in authority else authority
    return authority.rsplit(":", 1)[0] if authority.count(":") == 1 else authority


class Guard:
    """The checks above, around ``app``."""

    def __init__(
        self,
        app: App,
        *,
        token: str | None,
        bound_host: str,
        allow_hosts: Iterable[str] = (),
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    ) -> None:
        if max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be >= 1, got {max_body_bytes}")
        self.app = app
        self.token = token
        self.max_body_bytes = max_body_bytes
        self.any_ip = is_wildcard(bound_host)
        hosts = {_host_name(h) for h in allow_hosts if h.strip()}
        if not self.any_ip:
            hosts.add(bound_host.strip("[]").lower())
        if is_loopback(bound_host) or self.any_ip:
            hosts.update(_LOOPBACK_NAMES)
        self.hosts = frozenset(hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        refusal = self._refusal(scope, headers)
        if refusal is not None:
            await _answer(send, *refusal)
            return
        if scope["method"] in _UNSAFE_METHODS:
            body = await self._body(headers, receive)
            if body is None:
                await _answer(
                    send,
                    413,
                    "PayloadTooLarge",
                    f"the request body is larger than {self.max_body_bytes} bytes "
                    f"(the server's --max-body-bytes)",
                )
                return
            receive = _replay(body)
        await self.app(_with_segments(scope), receive, send)

    def _refusal(self, scope: Scope, headers: dict[str, str]) -> tuple[int, str, str] | None:
        host = _host_name(headers.get("host", ""))
        if host not in self.hosts and not (self.any_ip and _is_ip(host)):
            return (
                421,
                "MisdirectedRequest",
                f"this server does not answer for host {host[:100]!r}; start it with "
                f"--allow-host {host[:100]} if that is its name",
            )
        page = scope["path"][len(scope.get("root_path", "")) :] in ("", "/")  # mounted too
        if self.token is not None and not page:
            scheme, _, given = headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                given.strip().encode(), self.token.encode()
            ):
                return (
                    401,
                    "Unauthorized",
                    "a bearer token is required: Authorization: Bearer <token>",
                )
        if scope["method"] not in _UNSAFE_METHODS:
            return None
        origin = headers.get("origin")
        if origin is not None and urlsplit(origin).netloc.lower() != headers["host"].lower():
            return (
                403,
                "CrossOriginRequest",
                f"{scope['method']} from origin {origin[:100]!r} refused: only pages of "
                f"this server may change workflows",
            )
        if headers.get("sec-fetch-site") == "cross-site":
            return 403, "CrossOriginRequest", "a cross-site request may not change workflows"
        content_type = headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type != "application/json":
            return (
                415,
                "UnsupportedMediaType",
                f"{scope['method']} needs Content-Type: application/json (an empty action "
                f"sends {{}}), got {content_type or 'none'!r}",
            )
        return None

    async def _body(self, headers: dict[str, str], receive: Receive) -> bytes | None:
        """The whole body, or None as soon as it is known to pass the limit."""
        declared = headers.get("content-length", "").strip()
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            return None
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return b"".join(chunks)
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _replay(body: bytes) -> Receive:
    """A ``receive`` that gives the body read already, then waits as the server's would."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return {"type": "http.disconnect"}

    return receive


def _with_segments(scope: Scope) -> Scope:
    """``scope`` whose ``path`` keeps ``%2F`` (and ``%25``) encoded inside a segment, so
    that an id with ``/`` stays one path parameter (:data:`SEGMENT` decodes it)."""
    raw = scope.get("raw_path")
    if not raw or b"%" not in raw:
        return scope
    raw_path = raw.decode("latin-1").split("?", 1)[0]
    path = "/".join(quote(unquote(part), safe="!$&'()*+,;=:@") for part in raw_path.split("/"))
    return {**scope, "path": path}


async def _answer(send: Send, status: int, kind: str, message: str) -> None:
    """A JSON error, and the connection closed (a refused body is never read)."""
    body = json.dumps({"error": message, "type": kind}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})

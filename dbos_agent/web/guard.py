"""What the server checks before a request reaches the API, as one ASGI middleware.

A server on a laptop's loopback address is still reachable by every web page the
laptop's browser opens: a page on another origin can send a ``no-cors`` POST (its
answer is hidden, its effect is not), and a page whose domain name is rebound to
127.0.0.1 can read the answers as its own. So, in this order, before any body is read:

- the headers it decides on (``Host``, ``Origin``, ``Authorization``, ``Content-Type``,
  ``Sec-Fetch-Site``) come once each — else 400 (which of two would a proxy have read?);
- ``Host`` is a host name or address with an optional port, nothing else
  (``localhost:80@evil.example`` is not), and names this server: the bound host, a
  ``--allow-host`` name, a loopback name when bound to loopback, any IP literal when
  bound to every address (a rebound page always sends its own domain name) — else 421;
- the bearer token, when one is set, on every path but the dashboard's static page
  (``/``), the OpenAPI document included — else 401;
- no request but for the dashboard's page comes from another page than the server's
  own: a foreign ``Origin``, or ``Sec-Fetch-Site`` other than ``same-origin`` or
  ``none``, is 403 (a page cannot read the answer, but it could still hold a stream
  open or change something);
- a state-changing method needs a JSON body (``Content-Type: application/json``, which
  a cross-origin page cannot send without a CORS preflight, and none is ever allowed)
  — else 415;
- a body is at most ``max_body_bytes``: a larger ``Content-Length`` is refused at once,
  and a chunked body is read only up to the limit — else 413.

Every answer says that no page may frame it (``X-Frame-Options: DENY``, CSP
``frame-ancestors 'none'`` unless the answer has a policy of its own), that its type is
what it says (``nosniff``) and that no ``Referer`` leaves the page (its URL may hold the
token).

Ids may contain ``/``: sent as ``%2F``, they stay one path segment (see
:data:`SEGMENT`), which Starlette, decoding the path before routing, would lose.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import re
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
#: The headers a decision is made on: each may come once.
_SINGLE = (b"host", b"origin", b"authorization", b"content-type", b"sec-fetch-site")
#: A ``Host`` value: a bracketed IPv6 address (group 1) or a name or IPv4 address (group
#: 2), then an optional port; nothing else.
_AUTHORITY = re.compile(
    r"(?:\[([0-9a-f:.]+)\]|([a-z0-9_](?:[a-z0-9._-]*[a-z0-9_])?))(?::[0-9]{0,5})?"
)
_SAME_ORIGIN = ("same-origin", "none")
_SECURITY_HEADERS = [
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
]
_NO_FRAMING = (b"content-security-policy", b"frame-ancestors 'none'")

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


def host_name(authority: str) -> str | None:
    """The host of a ``Host`` header value (``[::1]:8787`` -> ``::1``), lower case; None
    when it is not a host and an optional port (``localhost:80@evil.example``)."""
    match = _AUTHORITY.fullmatch(authority.strip().lower())
    return None if match is None else match.group(1) or match.group(2)


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
        hosts = set()
        for name in (h for h in allow_hosts if h.strip()):
            host = host_name(name)
            if host is None:
                raise ValueError(f"{name!r} is not a host name (an --allow-host)")
            hosts.add(host)
        if not self.any_ip:
            hosts.add(bound_host.strip("[]").lower())
        if is_loopback(bound_host) or self.any_ip:
            hosts.update(_LOOPBACK_NAMES)
        self.hosts = frozenset(hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        send = _with_security_headers(send)
        refusal = _repeated(scope["headers"])
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        refusal = refusal or self._refusal(scope, headers)
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
        given = headers.get("host", "")
        host = host_name(given)
        if host is None:
            return (
                421,
                "MisdirectedRequest",
                f"the Host header {given[:100]!r} is not a host name with an optional port",
            )
        if host not in self.hosts and not (self.any_ip and _is_ip(host)):
            return (
                421,
                "MisdirectedRequest",
                f"this server does not answer for host {host[:100]!r}; start it with "
                f"--allow-host {host[:100]} if that is its name",
            )
        page = scope["path"][len(scope.get("root_path", "")) :] in ("", "/")  # mounted too
        if self.token is not None and not page:
            scheme, _, token = headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                token.strip().encode(), self.token.encode()
            ):
                return (
                    401,
                    "Unauthorized",
                    "a bearer token is required: Authorization: Bearer <token>",
                )
        if page and scope["method"] not in _UNSAFE_METHODS:
            return None  # the page may be opened from a link anywhere
        return _foreign(scope["method"], headers) or _not_json(scope["method"], headers)

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


def _repeated(raw: Iterable[tuple[bytes, bytes]]) -> tuple[int, str, str] | None:
    """A 400 when a header decided on comes more than once."""
    names = [name.lower() for name, _ in raw]
    for name in _SINGLE:
        if names.count(name) > 1:
            shown = name.decode()
            return 400, "DuplicateHeader", f"the request has more than one {shown!r} header"
    return None


def _foreign(method: str, headers: dict[str, str]) -> tuple[int, str, str] | None:
    """A 403 for a request that another page sent."""
    origin = headers.get("origin")
    if origin is not None and urlsplit(origin).netloc.lower() != headers["host"].lower():
        return (
            403,
            "CrossOriginRequest",
            f"{method} from origin {origin[:100]!r} refused: only pages of this server may "
            f"use its API",
        )
    site = headers.get("sec-fetch-site")
    if site is not None and site.strip().lower() not in _SAME_ORIGIN:
        return (
            403,
            "CrossOriginRequest",
            f"a request sent by another page (Sec-Fetch-Site: {site[:20]}) may not use this "
            f"server's API",
        )
    return None


def _not_json(method: str, headers: dict[str, str]) -> tuple[int, str, str] | None:
    """A 415 for a change whose body is not JSON (what a page of another origin could
    send without a preflight)."""
    if method not in _UNSAFE_METHODS:
        return None
    content_type = headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != "application/json":
        return (
            415,
            "UnsupportedMediaType",
            f"{method} needs Content-Type: application/json (an empty action sends {{}}), "
            f"got {content_type or 'none'!r}",
        )
    return None


def _with_security_headers(send: Send) -> Send:
    """``send`` adding the headers every answer carries (see the module doc)."""

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = list(message.get("headers", []))
            names = {name.lower() for name, _ in headers}
            headers += [h for h in _SECURITY_HEADERS if h[0] not in names]
            if _NO_FRAMING[0] not in names:
                headers.append(_NO_FRAMING)
            message = {**message, "headers": headers}
        await send(message)

    return sending


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

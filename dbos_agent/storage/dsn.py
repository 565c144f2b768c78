"""Helpers for Postgres connection strings (URL and key=value conninfo forms).

Connection strings often carry passwords, and they end up in logs, exceptions and test
reports; everything that prints one goes through `redact_url` first.
"""

from __future__ import annotations

import os
import re
from urllib.parse import quote, urlsplit, urlunsplit

from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ..errors import UnsupportedDatabaseError

__all__ = [
    "URL_ENV",
    "configured_url",
    "is_url",
    "postgres_url",
    "redact_url",
    "scrub",
    "with_dbname",
]

_SCHEME_RE = re.compile(r"^(postgres(?:ql)?://)(.*)$", re.IGNORECASE | re.DOTALL)
# Any URL (``mysql://``, ``postgresql+psycopg://``): its password is masked all the same.
_ANY_SCHEME_RE = re.compile(r"^\s*([a-z][a-z0-9+.-]*://)(.*)$", re.IGNORECASE | re.DOTALL)
# SQLAlchemy's spelling of a Postgres URL with its driver: ``postgresql+psycopg://``.
_DRIVER_SUFFIX_RE = re.compile(r"^\s*(postgres(?:ql)?)\+[a-z0-9_]+://", re.IGNORECASE)
# `password=...` (and `sslpassword=...`) in a URL query string: the value runs to the next `&`.
_QUERY_PASSWORD_RE = re.compile(r"([?&][a-z_]*password=)[^&#]*", re.IGNORECASE)
# `password = value` in conninfo: the value is a single-quoted string (with \-escapes) or a word.
_CONNINFO_PASSWORD_RE = re.compile(
    r"(\b[a-z_]*password\s*=\s*)('(?:[^'\\]|\\.)*'?|\S+)", re.IGNORECASE | re.DOTALL
)
_MASK = "***"
#: The environment variable that names the system database.
URL_ENV = "DBOS_AGENT_DATABASE_URL"
# A URL inside a longer text (an error message), of any scheme: runs to whitespace or a quote.
_URL_IN_TEXT_RE = re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s'\"]+", re.IGNORECASE)


def is_url(dsn: str) -> bool:
    """Whether `dsn` is in URL form (libpq also accepts key=value conninfo)."""
    return _SCHEME_RE.match(dsn.strip()) is not None


def redact_url(url: str) -> str:
    """Return `url` with any password replaced by ``***``, safe to log or show in errors.

    Handles ``postgresql://user:secret@host/db``, ``?password=secret`` in the query string and
    ``password=secret`` / ``password='se cret'`` in key=value conninfo. When in doubt it masks
    too much rather than too little: a password may contain unescaped ``@`` or ``/``.
    """
    match = _ANY_SCHEME_RE.match(url)
    if match is None:
        return _CONNINFO_PASSWORD_RE.sub(lambda m: m.group(1) + _MASK, url)
    scheme, rest = match.group(1), match.group(2)
    query_start = rest.find("?")
    authority_end = len(rest) if query_start < 0 else query_start
    at = rest.rfind("@", 0, authority_end)
    if at >= 0:
        userinfo = rest[:at]
        colon = userinfo.find(":")
        if colon >= 0:
            rest = userinfo[:colon] + ":" + _MASK + rest[at:]
    return scheme + _QUERY_PASSWORD_RE.sub(lambda m: m.group(1) + _MASK, rest)


def postgres_url(dsn: str) -> str:
    """``dsn`` as libpq reads it: ``postgresql+psycopg://`` (SQLAlchemy's spelling, any
    driver) becomes ``postgresql://``; a URL of another scheme (``mysql://``) is refused
    with an :class:`UnsupportedDatabaseError` naming it, its password masked. Conninfo
    (``host=... dbname=...``) passes as it is."""
    stripped = _DRIVER_SUFFIX_RE.sub(lambda m: m.group(1) + "://", dsn, count=1)
    match = _ANY_SCHEME_RE.match(stripped)
    if match is None or _SCHEME_RE.match(stripped.strip()) is not None:
        return stripped
    scheme = match.group(1)[:-3]
    raise UnsupportedDatabaseError(
        f"the database URL {redact_url(dsn)} is a {scheme!r} URL: dbos_agent needs "
        f"PostgreSQL: a postgresql:// URL (postgresql+psycopg:// is read as one)"
    )


def password_of(dsn: str) -> str | None:
    """The password a connection string carries, if any (None when it cannot be parsed)."""
    try:
        password = conninfo_to_dict(dsn).get("password")
    except Exception:
        return None
    return str(password) if password else None


def scrub(text: str, dsn: str | None = None) -> str:
    """``text`` (an error message, a log line) with every password masked.

    Masks ``dsn``'s password wherever it appears, and the password of any Postgres URL
    or ``password=`` setting found in the text.
    """
    if dsn:
        text = text.replace(dsn, redact_url(dsn))
        password = password_of(dsn) or _url_password(dsn)
        if password:
            text = text.replace(password, _MASK)
    text = _URL_IN_TEXT_RE.sub(lambda m: redact_url(m.group(0)), text)
    return _CONNINFO_PASSWORD_RE.sub(lambda m: m.group(1) + _MASK, text)


def _url_password(dsn: str) -> str | None:
    """The password of a URL libpq cannot parse (``mysql://u:pw@h``), if any."""
    match = _ANY_SCHEME_RE.match(dsn)
    if match is None:
        return None
    authority = match.group(2).split("?", 1)[0]
    userinfo, at, _ = authority.rpartition("@")
    _, colon, password = userinfo.partition(":")
    return password if at and colon and password else None


def with_dbname(dsn: str, dbname: str) -> str:
    """Return `dsn` pointing at database `dbname`, keeping its form (URL stays a URL)."""
    if not is_url(dsn):
        return make_conninfo(dsn, dbname=dbname)
    parts = urlsplit(dsn.strip())
    query = "&".join(
        kv for kv in parts.query.split("&") if kv and not kv.lower().startswith("dbname=")
    )
    path = "/" + quote(dbname, safe="")
    return urlunsplit((parts.scheme, parts.netloc, path, query, parts.fragment))


def configured_url(explicit: str | None = None) -> str | None:
    """The database URL given, else ``$DBOS_AGENT_DATABASE_URL``, else None (the embedded
    default, which only the caller may decide to start); see :func:`postgres_url`."""
    url = explicit or os.environ.get(URL_ENV) or None
    return None if url is None else postgres_url(url)

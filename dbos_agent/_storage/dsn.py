"""Postgres connection strings (URL and key=value conninfo forms): read, checked, changed.

Every connection string the library is given passes :func:`postgres_url` before
anything connects with it: a string libpq cannot read, or would read otherwise than
its author meant (a password's unencoded ``/`` or ``@`` spilling into the host, port or
database name), is refused there with an :class:`InvalidDatabaseUrlError` that shows
none of it, so that no parser's error can quote a piece of its password. What may be
shown of one is :func:`redact_url`'s (see ``redaction.py``).
"""

from __future__ import annotations

import os
import re
from urllib.parse import quote, urlsplit, urlunsplit

from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ..errors import InvalidDatabaseUrlError, UnsupportedDatabaseError
from .redaction import normal_scheme, redact_url, scrub

__all__ = [
    "POOLER_PARAMETER",
    "SESSION_URL_ENV",
    "URL_ENV",
    "configured_session_url",
    "configured_url",
    "is_url",
    "postgres_url",
    "redact_url",
    "scrub",
    "split_pooler",
    "with_dbname",
]

_SCHEME_RE = re.compile(r"^(postgres(?:ql)?://)(.*)$", re.IGNORECASE | re.DOTALL)
_ANY_SCHEME_RE = re.compile(r"^([a-z][a-z0-9+.-]*)://", re.IGNORECASE)
_PORTS_RE = re.compile(r"\d*(?:,\d*)*")
#: The environment variable that names the system database.
URL_ENV = "DBOS_AGENT_DATABASE_URL"
#: The environment variable that names a direct URL of it, for what needs a session of its
#: own when ``$DBOS_AGENT_DATABASE_URL`` goes through a transaction pooler (docs/pooled-urls.md).
SESSION_URL_ENV = "DBOS_AGENT_SESSION_URL"
#: The query parameter that declares a URL pooled: ``?pooler=transaction`` (taken out before
#: libpq reads the URL, which knows no such parameter).
POOLER_PARAMETER = "pooler"
_POOLER_MODES = ("transaction",)
_CONNINFO_POOLER_RE = re.compile(
    rf"(^|\s){POOLER_PARAMETER}\s*=\s*('?)([a-z]*)\2(?=\s|$)", re.IGNORECASE
)
# libpq's parse errors, by their fixed start, told in words of our own: libpq's own quote
# a piece of the string, and that piece may be a piece of the password.
_LIBPQ_PROBLEMS = (
    ("unexpected spaces", "a space that is not percent-encoded (%20)"),
    ("invalid percent-encoded token", "a '%' that starts no %XX escape (a '%' itself is %25)"),
    ("forbidden value %00", "a percent-encoded NUL (%00)"),
    ("end of string reached when looking for matching", "an IPv6 address without its ']'"),
    ("ipv6 host address may not be empty", "an empty IPv6 address"),
    ("unexpected character", "a host followed by something else than ':' or '/'"),
    ("missing key/value separator", "a query parameter without '='"),
    ("extra key/value separator", "a query parameter with a second '='"),
    ("invalid uri query parameter", "a query parameter libpq does not know"),
    ('missing "=" after', "a word that is not key=value (a value with spaces goes in quotes)"),
    ("unterminated quoted string", "a quoted value without its closing quote"),
    ("invalid connection option", "a setting libpq does not know"),
)
_HINT = (
    "percent-encode a password's reserved characters (@ %40, / %2F, ? %3F, # %23, % %25, "
    ": %3A, space %20), or keep the password out of the URL: $PGPASSWORD, or a password "
    "file ($PGPASSFILE, else ~/.pgpass)"
)


def is_url(dsn: str) -> bool:
    """Whether `dsn` is in URL form (libpq also accepts key=value conninfo)."""
    return _SCHEME_RE.match(dsn.strip()) is not None


def postgres_url(dsn: str, *, source: str | None = None) -> str:
    """``dsn`` as libpq reads it, checked.

    Surrounding spaces go, the scheme is read case-insensitively, and
    ``postgresql+psycopg://`` (SQLAlchemy's spelling, any driver) becomes
    ``postgresql://``; key=value conninfo (``host=... dbname=...``) stays as it is. A URL
    of another scheme (``mysql://``) is refused with an :class:`UnsupportedDatabaseError`
    naming it, its password masked; a string libpq cannot read, or would misread, with
    an :class:`InvalidDatabaseUrlError` that shows none of it (``source`` names where it
    came from, e.g. ``$DBOS_AGENT_DATABASE_URL``).
    """
    text = normal_scheme(dsn)
    bare, _ = split_pooler(text)
    other = _ANY_SCHEME_RE.match(text)
    if other is not None and _SCHEME_RE.match(text) is None:
        raise UnsupportedDatabaseError(
            f"the database URL {redact_url(dsn)} is a {other.group(1)!r} URL: dbos_agent "
            f"needs PostgreSQL: a postgresql:// URL (postgresql+psycopg:// is read as one)"
        )
    problem = _problem(bare)
    if problem is not None:
        shown = "URL postgresql://…" if other is not None else "connection string"
        if source is not None:
            shown += f" in {source}"
        raise InvalidDatabaseUrlError(
            f"the database {shown} cannot be read (it is not shown: it may hold a password):"
            f" it has {problem}; {_HINT}"
        )
    return text


def split_pooler(dsn: str) -> tuple[str, str | None]:
    """``dsn`` without its ``pooler`` parameter (URL query or key=value form), and that
    parameter's value in lower case (None when it has none).

    Only ``pooler=transaction`` is known: a transaction-mode pooler (pgbouncer's
    ``pool_mode = transaction``, Supabase's pooler on port 6543, Neon's ``-pooler`` host,
    RDS Proxy). Any other value raises an :class:`InvalidDatabaseUrlError` saying so.
    """
    text = dsn.strip()
    if is_url(text):
        base, mark, query = text.partition("?")
        pairs = query.split("&") if mark else []
        found = [pair.split("=", 1)[1].lower() for pair in pairs if _is_pooler_pair(pair)]
        if not found:
            return text, None
        kept = [pair for pair in pairs if not _is_pooler_pair(pair)]
        bare = base + ("?" + "&".join(kept) if kept else "")
    else:
        found = [m.group(3).lower() for m in _CONNINFO_POOLER_RE.finditer(text)]
        if not found:
            return text, None
        bare = " ".join(_CONNINFO_POOLER_RE.sub(" ", text).split())
    mode = found[-1]
    if mode not in _POOLER_MODES:
        raise InvalidDatabaseUrlError(
            f"the database URL says {POOLER_PARAMETER}={mode!r}: only "
            f"{POOLER_PARAMETER}=transaction is known (a transaction-mode pooler); a "
            f"session-mode pooler keeps sessions and needs no parameter"
        )
    return bare, mode


def _is_pooler_pair(pair: str) -> bool:
    return pair.lower().startswith(POOLER_PARAMETER + "=")


def _problem(text: str) -> str | None:
    """What makes libpq unable to read ``text``, or read it otherwise than meant; None
    when it reads it well. Raised by the caller outside any ``except``: the parser's
    exception, which quotes the string, is not even kept as the error's context."""
    try:
        settings = conninfo_to_dict(text)
    except Exception as exc:  # psycopg's ProgrammingError; a NUL character: ValueError
        said = str(exc).strip().lower()
        return next((ours for start, ours in _LIBPQ_PROBLEMS if said.startswith(start)), None) or (
            "something libpq cannot parse"
        )
    if not _PORTS_RE.fullmatch(str(settings.get("port", ""))):
        return "a port that is not a number (a password's '/' or '?' read as the host's end)"
    if "@" in str(settings.get("host", "")):
        return "an '@' in a host name (a password's '@' read as the user info's end)"
    match = _SCHEME_RE.match(text)
    if match is not None:
        rest = match.group(2)
        first = next((i for i, char in enumerate(rest) if char in "@/"), -1)
        start = first + 1 if first >= 0 and rest[first] == "@" else 0
        query = rest.find("?", start)
        if "@" in rest[start : query if query >= 0 else len(rest)]:
            return "an '@' after its user info (a password's '@' or '/' must be encoded)"
    return None


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


def configured_session_url(explicit: str | None = None) -> str | None:
    """The session URL given, else ``$DBOS_AGENT_SESSION_URL``, else None; see
    :func:`postgres_url`."""
    if explicit:
        return postgres_url(explicit)
    url = os.environ.get(SESSION_URL_ENV)
    return postgres_url(url, source=f"${SESSION_URL_ENV}") if url else None


def configured_url(explicit: str | None = None) -> str | None:
    """The database URL given, else ``$DBOS_AGENT_DATABASE_URL``, else None (the embedded
    default, which only the caller may decide to start); see :func:`postgres_url`."""
    if explicit:
        return postgres_url(explicit)
    url = os.environ.get(URL_ENV)
    return postgres_url(url, source=f"${URL_ENV}") if url else None

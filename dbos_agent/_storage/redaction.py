"""Keeping a connection string's secrets out of what is shown: errors, logs, output.

A connection string may come malformed (an unencoded ``?``, ``@`` or space in its
password, a bad ``%`` escape, a ``password=...`` pasted after a URL), so nothing here
trusts a parser to find where its secrets end: when the form is ambiguous, everything
that might be secret is masked, at the cost of masking too much. Two tools:

- :func:`redact_url`: a connection string as it may be shown (URL or key=value form);
- :func:`scrub`: a text (an error, a log line) with every secret of a connection string
  masked wherever it appears, whole or percent-decoded, and any URL or ``password=``
  setting the text holds redacted as well.

The secrets are the password (in the user info, or ``password=`` in the query or a
key=value string) and libpq's other secret settings: ``sslpassword``,
``scram_client_key``, ``scram_server_key``, ``oauth_client_secret``.
"""

from __future__ import annotations

import json
import re
from urllib.parse import unquote

import psycopg
from psycopg.conninfo import conninfo_to_dict

__all__ = ["MASK", "normal_scheme", "redact_url", "scrub", "secrets_of"]

MASK = "***"

# A URL of any scheme (``mysql://``, ``postgresql+psycopg://``), leading spaces allowed.
_ANY_SCHEME_RE = re.compile(r"^\s*([a-z][a-z0-9+.-]*://)(.*)$", re.IGNORECASE | re.DOTALL)
# SQLAlchemy's spelling of a Postgres URL with its driver: ``postgresql+psycopg://``.
_DRIVER_SUFFIX_RE = re.compile(r"^(postgres(?:ql)?)\+[a-z0-9_]+$", re.IGNORECASE)
# The names of settings whose value is secret (libpq's, and any other ``*password``).
_SECRET_KEY = r"(?:[a-z_]*password|[a-z_]*secret|scram_client_key|scram_server_key)"
# The settings libpq knows: where a generous reading of a secret value stops.
_KEYWORDS = "|".join(
    re.escape(option.keyword.decode()) for option in psycopg.pq.Conninfo.get_defaults()
)
# ``password=value`` in a URL query: the value runs to the next ``&keyword=`` (generous:
# a password may hold an unencoded ``&``).
_QUERY_SECRET_RE = re.compile(
    rf"([?&]{_SECRET_KEY}=)((?:[^&]|&(?!(?:{_KEYWORDS})=))*)", re.IGNORECASE | re.DOTALL
)
# ``password = value`` in key=value form: everything up to the next `` keyword=`` libpq
# knows, quoted strings (backslash escapes; unclosed, to the end) taken whole. Generous:
# an unquoted password with a space, or a quote in the middle, is not cut in two.
_CONNINFO_SECRET_RE = re.compile(
    rf"(\b{_SECRET_KEY}\s*=\s*)"
    rf"((?:'(?:[^'\\]|\\.)*'?|\\.|(?!\s+(?:{_KEYWORDS})\s*=)[^'\\])+)",
    re.IGNORECASE | re.DOTALL,
)
# The same setting in a free text (an error message): an unquoted value ends at a space.
_TEXT_SECRET_RE = re.compile(
    rf"(\b{_SECRET_KEY}\s*=\s*)('(?:[^'\\]|\\.)*'?|(?:\\.|[^\s\\])+)", re.IGNORECASE | re.DOTALL
)
# A URL inside a longer text, of any scheme: runs to whitespace or a quote.
_URL_IN_TEXT_RE = re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s'\"]+", re.IGNORECASE)


def normal_scheme(dsn: str) -> str:
    """``dsn`` without surrounding spaces, a URL's scheme in lower case (schemes are
    case-insensitive) and SQLAlchemy's ``postgresql+driver://`` read as ``postgresql://``.
    Anything else is left as it is."""
    text = dsn.strip()
    match = _ANY_SCHEME_RE.match(text)
    if match is None:
        return text
    scheme = match.group(1)[:-3].lower()
    return _DRIVER_SUFFIX_RE.sub(r"\1", scheme) + "://" + match.group(2)


def _userinfo_end(url: str, rest: str) -> int:
    """Where the user info of ``url`` (``rest``: what follows ``scheme://``) ends, -1 if
    it has none. libpq's reading (the first ``@`` before any ``/``) when libpq reads the
    URL and it has no other ``@`` outside its query (nor in a secret setting of the query,
    which may be the rest of the password: ``app:@pw?password=@host``); else the last
    ``@``, so that a password holding ``@``, ``/`` or ``?`` is masked whole."""
    first = next((i for i, char in enumerate(rest) if char in "@/"), -1)
    if first >= 0 and rest[first] == "@":
        query = rest.find("?", first)
        secret_values = (
            [m.group(2) for m in _QUERY_SECRET_RE.finditer(rest[query:])] if query >= 0 else []
        )
        if (
            "@" not in rest[first + 1 : query if query >= 0 else len(rest)]
            and not any("@" in value for value in secret_values)
            and _parses(normal_scheme(url))
        ):
            return first
    return rest.rfind("@")


def redact_url(url: str) -> str:
    """``url`` (a connection string of any form) with every secret replaced by ``***``,
    safe to log or show in errors.

    Handles ``postgresql://user:secret@host/db`` (any scheme, multi-host), secrets in the
    query string (``?password=``, ``sslpassword=``, ...), key=value conninfo
    (``password=secret``, ``password='se cret'``) and such a setting pasted after a URL.
    When in doubt it masks too much rather than too little: a password may hold unescaped
    ``@``, ``/``, ``?``, ``&``, quotes or spaces.
    """
    match = _ANY_SCHEME_RE.match(url)
    if match is None:  # key=value: its secrets, and any URL in it (``dbname=postgresql://...``)
        masked = _CONNINFO_SECRET_RE.sub(lambda m: m.group(1) + MASK, url)
        return _URL_IN_TEXT_RE.sub(lambda m: redact_url(m.group(0)), masked)
    scheme, rest = match.group(1), match.group(2)
    spans = [m.span(2) for m in _QUERY_SECRET_RE.finditer(rest)]
    # A ``password=`` setting after a space: pasted after the URL (or inside a password).
    spans += [
        m.span(2) for m in _CONNINFO_SECRET_RE.finditer(rest) if rest[: m.start()][-1:].isspace()
    ]
    at = _userinfo_end(url, rest)
    colon = rest.find(":", 0, at) if at >= 0 else -1
    if colon >= 0:
        spans.append((colon + 1, at))
    return scheme + _masked(rest, spans)


def _masked(text: str, spans: list[tuple[int, int]]) -> str:
    """``text`` with each of ``spans`` (overlapping ones merged) replaced by ``***``."""
    merged: list[list[int]] = []
    for first, last in sorted(spans):
        if merged and first <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], last)
        else:
            merged.append([first, last])
    shown, end = [], 0
    for first, last in merged:
        shown += [text[end:first], MASK]
        end = last
    return "".join(shown) + text[end:]


def _unquoted(value: str) -> list[str]:
    """A key=value setting's value as written and as libpq reads it (quotes off,
    backslash escapes undone)."""
    forms = [value]
    if value.startswith("'"):
        value = value[1:-1] if len(value) > 1 and value.endswith("'") else value[1:]
        forms.append(value)
    forms.append(re.sub(r"\\(.)", r"\1", value, flags=re.DOTALL))
    return forms


def secrets_of(dsn: str) -> list[str]:
    """Every text that may be a secret of ``dsn``, longest first: what libpq reads as
    its password and secret settings, and every reading of a malformed string (the user
    info up to each ``@``; a query or key=value secret up to the next setting), each also
    percent-decoded, and as a repr or JSON would escape it."""
    found: set[str] = set()
    for text in {dsn, normal_scheme(dsn)}:
        try:
            settings = conninfo_to_dict(text)
        except Exception:  # malformed: the readings below still find its secrets
            settings = {}
        found.update(
            str(value)
            for key, value in settings.items()
            if re.fullmatch(_SECRET_KEY, key, re.IGNORECASE)
        )
    match = _ANY_SCHEME_RE.match(dsn)
    if match is not None:
        rest = match.group(2)
        colon = rest.find(":")
        if colon >= 0:
            found.update(rest[colon + 1 : at.start()] for at in re.finditer("@", rest))
        found.update(m.group(2) for m in _QUERY_SECRET_RE.finditer(rest))
    for m in _CONNINFO_SECRET_RE.finditer(dsn):
        found.update(_unquoted(m.group(2)))
    found.update([unquote(value) for value in found])
    # As a repr or a JSON string shows them (backslashes, quotes, tabs escaped).
    found.update([form for value in found for form in (repr(value)[1:-1], json.dumps(value)[1:-1])])
    return sorted((value for value in found if value), key=len, reverse=True)


def scrub(text: str, dsn: str | None = None) -> str:
    """``text`` (an error message, a log line) with every secret masked.

    Masks each of :func:`secrets_of` ``dsn`` wherever it appears, and the secrets of any
    URL or ``password=`` setting found in the text. When libpq cannot parse ``dsn``, its
    errors quote the piece it stopped at, which may be part of a password cut anywhere:
    then every run of 4 or more characters of the text found in one of its secrets is
    masked too.
    """
    if dsn:
        for form in {dsn, dsn.strip()}:
            text = text.replace(form, redact_url(form))
        found = secrets_of(dsn)
        spans = [
            (at.start(), at.end())
            for secret in found
            for at in re.finditer(re.escape(secret), text)
        ]
        if not _parses(dsn):
            spans += _pieces(text, found)
        text = _masked(text, spans)
    text = _URL_IN_TEXT_RE.sub(lambda m: redact_url(m.group(0)), text)
    return _TEXT_SECRET_RE.sub(lambda m: m.group(1) + MASK, text)


def _parses(dsn: str) -> bool:
    try:
        conninfo_to_dict(dsn)
    except Exception:
        return False
    return True


def _pieces(text: str, secrets: list[str], least: int = 4) -> list[tuple[int, int]]:
    """Where ``text`` holds a run of at least ``least`` characters of one of ``secrets``
    (the longest run from each position, left to right)."""
    spans: list[tuple[int, int]] = []
    i = 0
    while i < len(text):
        end = i
        while end < len(text) and any(text[i : end + 1] in secret for secret in secrets):
            end += 1
        if end - i >= least:
            spans.append((i, end))
            i = end
        else:
            i += 1
    return spans

"""JSON text as Postgres ``jsonb`` can hold it: NUL characters survive the round trip.

``jsonb`` refuses the escape ``\\u0000``, yet a string with a NUL in it is ordinary
Python (a tool that ``cat``s a binary file returns one). Such a value is stored
wrapped, ``{"$dbos_agent:nul": <value>}``, with every string (keys too) escaped as
``%`` -> ``%25`` and NUL -> ``%00``; reading unwraps it. Values without a NUL are
stored as they are, so the common case costs one substring search. A value whose
text happens to start like the wrapper is wrapped too, so unwrapping is unambiguous.
"""

from __future__ import annotations

import json
import re
from typing import Any

WRAPPER_KEY = "$dbos_agent:nul"
_PREFIX = '{"' + WRAPPER_KEY + '"'
_UNESCAPE = re.compile(r"%(25|00)")


def _escape(value: Any) -> Any:
    if isinstance(value, str):
        return value.replace("%", "%25").replace("\x00", "%00")
    if isinstance(value, dict):
        return {_escape(k): _escape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_escape(v) for v in value]
    return value


def _unescape_text(text: str) -> str:
    return _UNESCAPE.sub(lambda m: "%" if m.group(1) == "25" else "\x00", text)


def _unescape(value: Any) -> Any:
    if isinstance(value, str):
        return _unescape_text(value)
    if isinstance(value, dict):
        return {_unescape_text(k): _unescape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unescape(v) for v in value]
    return value


def to_db(text: str) -> str:
    """JSON text ready for a ``::jsonb`` parameter."""
    if "\\u0000" not in text and not text.startswith(_PREFIX):
        return text
    return json.dumps({WRAPPER_KEY: _escape(json.loads(text))}, separators=(",", ":"))


def to_db_optional(text: str | None) -> str | None:
    """:func:`to_db`, letting None (SQL NULL) through."""
    return None if text is None else to_db(text)


def from_db(text: str | None) -> str | None:
    """JSON text as the caller stored it (``jsonb``'s spacing aside)."""
    if text is None or not text.startswith(_PREFIX):
        return text
    wrapped = json.loads(text)
    return json.dumps(_unescape(wrapped[WRAPPER_KEY]), separators=(",", ":"))


def parse(text: str | None) -> Any:
    """Stored JSON text as Python data (None for SQL NULL)."""
    unwrapped = from_db(text)
    return None if unwrapped is None else json.loads(unwrapped)

"""Hostile passwords in every form of connection string, for the secret-keeping tests.

A password is built of pieces (``Qz`` and a few letters or digits, a text no message
holds by chance) joined by the characters that break URL and key=value parsing: so a
test can check that no *piece* of it shows, not only the whole (a password cut at an
unencoded ``/`` must not show its first half as a port either). Every form points at
127.0.0.1 port 1 (or [::1]:1), where a connection is refused at once.
"""

from __future__ import annotations

import string
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from urllib.parse import quote

from hypothesis import strategies as st

__all__ = ["FORMS", "Secret", "chain", "leaks", "secrets", "texts_of"]

# What a password may hold between its pieces: URL and conninfo delimiters, escapes
# (valid and not), quotes, spaces, non-ASCII letters.
HOSTILE = [
    "?", "@", "#", "/", ":", " ", "%zz", "%", "%40", "%2F", "'", '"', "\\", "&", "=",
    ",", "[", "]", ";", "+", "\t", "é", "✓", "中", "password=", "@127.0.0.1:2/x",
]  # fmt: skip

_piece = st.text(string.ascii_letters + string.digits, min_size=4, max_size=8).map("Qz".__add__)
_glue = st.lists(st.sampled_from(HOSTILE), max_size=3).map("".join)


@dataclass(frozen=True)
class Secret:
    """A password and the pieces none of which may be shown."""

    text: str
    pieces: tuple[str, ...]


@st.composite
def secrets(draw: st.DrawFn) -> Secret:
    """A hostile password: pieces glued by hostile characters, maybe some at either end."""
    pieces = draw(st.lists(_piece, min_size=1, max_size=3))
    text = draw(_glue)
    for piece in pieces:
        text += piece + draw(_glue)
    return Secret(text, tuple(pieces))


def _conninfo_quoted(password: str) -> str:
    return "'" + password.replace("\\", "\\\\").replace("'", "\\'") + "'"


#: Every form of connection string, each a password's (PGPASSWORD: the form without one,
#: the password in the environment).
FORMS: dict[str, Callable[[str], str]] = {
    "url": lambda pw: f"postgresql://app:{pw}@127.0.0.1:1/app",
    "url, encoded": lambda pw: f"postgresql://app:{quote(pw, safe='')}@127.0.0.1:1/app",
    "postgres://": lambda pw: f"postgres://app:{pw}@127.0.0.1:1/app",
    "sqlalchemy": lambda pw: f"postgresql+psycopg://app:{pw}@127.0.0.1:1/app",
    "upper case": lambda pw: f"POSTGRESQL://app:{pw}@127.0.0.1:1/app",
    "spaces around": lambda pw: f"  postgresql://app:{pw}@127.0.0.1:1/app \n",
    "multi-host": lambda pw: f"postgresql://app:{pw}@127.0.0.1:1,127.0.0.1:2/app",
    "ipv6": lambda pw: f"postgresql://app:{quote(pw, safe='')}@[::1]:1/app",
    "broken ipv6": lambda pw: f"postgresql://app:{pw}@[::1:1/app",
    "query": lambda pw: f"postgresql://app@127.0.0.1:1/app?sslmode=disable&password={pw}",
    "query, encoded": lambda pw: f"postgresql://127.0.0.1:1/app?password={quote(pw)}&user=app",
    "sslpassword": lambda pw: f"postgresql://app@127.0.0.1:1/app?sslpassword={quote(pw)}",
    "after a url": lambda pw: f"postgresql://app@127.0.0.1:1/app password={pw}",
    "conninfo": lambda pw: f"host=127.0.0.1 port=1 user=app password={pw}",
    "conninfo, quoted": lambda pw: f"host=127.0.0.1 password = {_conninfo_quoted(pw)} port=1",
    "mysql": lambda pw: f"mysql://app:{pw}@127.0.0.1:1/app",
    "PGPASSWORD": lambda pw: "postgresql://app@127.0.0.1:1/app",
}


def chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and every exception behind it (causes and contexts, suppressed or not)."""
    todo, seen = [exc], set()
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        todo.extend(e for e in (current.__cause__, current.__context__) if e is not None)


def texts_of(exc: BaseException) -> str:
    """All an exception can show: str and repr of each in its chain, and its traceback."""
    shown = [f"{e}\n{e!r}" for e in chain(exc)]
    return "\n".join([*shown, *traceback.format_exception(exc)])


def leaks(secret: Secret, *texts: str) -> list[str]:
    """The pieces of ``secret`` that ``texts`` show (none, or the test fails)."""
    joined = "\n".join(texts)
    return [piece for piece in secret.pieces if piece in joined]

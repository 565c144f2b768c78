"""Griffe extension for the API reference: the docstrings' reST markup, read as Markdown.

The docstrings are written for ``help()`` and Sphinx-style readers: cross-references as
roles (``:func:`launch```, ``:class:`~dbos_agent.Client```) and literal blocks after
``::``. The site renders Markdown, so a role becomes inline code (its last dotted part
when written with ``~``) and a ``::`` that opens a literal block becomes ``:``.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|data|attr|exc|obj|const):`(~?)([^`]+)`")
_LITERAL = re.compile(r"(\S)::$", re.M)


def _code(match: re.Match[str]) -> str:
    short, target = match.groups()
    return f"`{target.rsplit('.', 1)[-1] if short else target}`"


class ReSTRoles(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **_: Any) -> None:
        docstring = obj.docstring
        if docstring is not None:
            text = _ROLE.sub(_code, docstring.value)
            docstring.value = _LITERAL.sub(r"\1:", text.replace("\n::\n", "\n\n"))

"""MkDocs hook: the CLI reference's commands, from the CLI's own parser.

A page that holds the comment ``<!-- cli-reference -->`` gets, in its place, one section
per command and action with its ``--help`` text, so the reference never says what the
command line does not do.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from typing import Any

MARKER = "<!-- cli-reference -->"
WIDTH = "80"


def _commands(
    parser: argparse.ArgumentParser, words: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every command under ``parser``, depth first, with the words that name it."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*words, name), sub
                yield from _commands(sub, (*words, name))


def _reference() -> str:
    from dbos_agent.cli.parser import build_parser

    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH  # argparse wraps to the terminal's width
    try:
        sections = [
            f"### `dbos-agent {' '.join(words)}`\n\n```text\n{sub.format_help().rstrip()}\n```\n"
            for words, sub in _commands(build_parser())
        ]
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before
    return "\n".join(sections)


def on_page_markdown(markdown: str, **_: Any) -> str:
    return markdown.replace(MARKER, _reference()) if MARKER in markdown else markdown

"""What the README and the docs name exists: every `dbos-agent` command, with its action
where it needs one (a reader who types it gets the command, not a usage error), and every
file of this repository they cite (`tests/process/test_crash.py`)."""

from __future__ import annotations

import argparse
import re

from dbos_agent.cli.parser import build_parser
from tests.support.docs_blocks import ROOT, documents

_WORDS = r"[a-z][a-z-]*(?:[|/][a-z][a-z-]*)*"
#: ``dbos-agent`` and the words after it that name a command and an action
#: (``workflows show``, ``approvals|approve|reject``, ``workflows list/show``).
#: A path of this repository cited in the text.
_PATH = re.compile(r"\b(?:tests|bench|examples|dbos_agent|docs)/[\w/.-]+\.(?:py|sql|md|json)\b")
_COMMAND = re.compile(rf"dbos-agent ({_WORDS})(?:\s+({_WORDS}))?")


def _tree(parser: argparse.ArgumentParser) -> tuple[dict[str, argparse.ArgumentParser], bool]:
    """The commands (or actions) under ``parser``, and whether one must be given."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices), bool(action.required)
    return {}, False


def _unknown(text: str) -> list[str]:
    commands, _ = _tree(build_parser())
    unknown = []
    for match in _COMMAND.finditer(text):
        first, second = match.groups()
        for command in re.split(r"[|/]", first):
            if command not in commands:
                unknown.append(f"dbos-agent {command}")
                continue
            actions, required = _tree(commands[command])
            if actions and second is None and required:
                unknown.append(f"dbos-agent {command} (without its action)")
            elif actions and second is not None:
                unknown += [
                    f"dbos-agent {command} {action}"
                    for action in re.split(r"[|/]", second)
                    if action not in actions
                ]
    return unknown


def test_the_check_catches_a_command_that_does_not_exist() -> None:
    assert _unknown("run `dbos-agent workflows steps ID` or `dbos-agent stepz ID`") == [
        "dbos-agent stepz"
    ]
    assert _unknown("`dbos-agent schedules pause|resum NAME`") == ["dbos-agent schedules resum"]
    assert _unknown("`dbos-agent steps` shows them") == ["dbos-agent steps (without its action)"]


def test_every_command_the_docs_name_exists() -> None:
    unknown = {
        f"{path.relative_to(ROOT)}: {command}"
        for path in documents()
        for command in _unknown(path.read_text(encoding="utf-8"))
    }
    assert sorted(unknown) == []


def test_every_file_the_docs_cite_exists() -> None:
    missing = {
        f"{path.relative_to(ROOT)}: {cited}"
        for path in documents()
        for cited in _PATH.findall(path.read_text(encoding="utf-8"))
        if not (ROOT / cited).exists()
    }
    assert sorted(missing) == []

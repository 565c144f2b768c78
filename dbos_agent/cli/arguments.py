"""What the command line accepts: its name, its environment variable, and the types of
its values. A value that does not fit is a usage error (exit 2), reported by argparse
with the message raised here."""

from __future__ import annotations

import argparse
import json
from datetime import datetime, timedelta

from .._durations import parse_duration, parse_moment
from .._engine.retention import check_statuses
from ..errors import InvalidDurationError
from ..records import WorkflowStatus

PROG = "dbos-agent"


def when(text: str) -> datetime:
    """An ISO time (UTC unless it says otherwise) or a duration ago: 30m, 2h, 7d."""
    try:
        return parse_moment(text)
    except InvalidDurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def age(text: str) -> timedelta:
    """A duration: 45s, 90m, 12h, 30d, 2w, or a number of seconds."""
    try:
        return parse_duration(text)
    except InvalidDurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def status(text: str) -> WorkflowStatus:
    """A workflow status, in any case."""
    try:
        return WorkflowStatus(text.strip().upper())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a status; choose from {', '.join(WorkflowStatus)}"
        ) from None


def gc_status(text: str) -> WorkflowStatus:
    """A status `gc` may delete (never one that may still run or wait for a person)."""
    try:
        return check_statuses([status(text)])[0]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def natural(text: str) -> int:
    """A whole number >= 0 (a step position)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 0")
    return value


def positive(text: str) -> int:
    """A whole number >= 1 (a limit, a batch size)."""
    value = natural(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def positive_seconds(text: str) -> float:
    """A finite number of seconds > 0 (a timeout)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (0 < value < float("inf")):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds > 0")
    return value


def json_value(text: str) -> str:
    """Validate JSON text and return it normalised (parsed once here, stored as jsonb)."""
    try:
        return json.dumps(json.loads(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc}): {text!r}") from None


def json_object(text: str) -> str:
    """JSON text of an object (edited inputs: ``{"param": value}``)."""
    if not isinstance(json.loads(json_value(text)), dict):
        raise argparse.ArgumentTypeError(f'not a JSON object {{"param": value}}: {text!r}')
    return text


def replacement(text: str) -> tuple[str, object]:
    """``N=JSON`` or ``N:NAME=JSON``: a replayed step and its replacing output."""
    key, equals, value = text.partition("=")
    if not equals or not key:
        raise argparse.ArgumentTypeError(f"not N=JSON or N:NAME=JSON: {text!r}")
    return key, json.loads(json_value(value))


def nonempty(text: str) -> str:
    """Any text but the empty string (an id is never replaced by a fresh one)."""
    if not text:
        raise argparse.ArgumentTypeError("must not be empty")
    return text

"""Durations and moments as people type them (``90m``, ``2w``, ``2026-12-02T17:30Z``):
read by the command line (``gc --older-than``, ``--since``, ``worker --retention``) and
the HTTP API (``since``), and written back by reports. Plain values: what refuses one is
an :class:`~dbos_agent.errors.InvalidDurationError` (a ValueError), which each front end
reports its own way (argparse's usage error in the CLI, a 400 in the API)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from .errors import InvalidDurationError

__all__ = ["format_duration", "parse_duration", "parse_moment"]

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw]?)$")
_UNIT_S = {"w": 604800, "d": 86400, "h": 3600, "m": 60, "s": 1}


def parse_duration(text: str, *, unit_required: bool = False) -> timedelta:
    """A duration as people type it: ``45s``, ``90m``, ``12h``, ``30d``, ``2w``, ``1.5h``,
    or bare seconds (``3600``, unless ``unit_required``). Never zero."""
    match = _DURATION.match(text.strip().lower())
    if match is None or (unit_required and not match[2]):
        raise InvalidDurationError(
            f"{text!r} is not a duration: use 45s, 90m, 12h, 30d, 2w"
            + ("" if unit_required else " or a number of seconds")
        )
    try:
        duration = timedelta(seconds=float(match[1]) * _UNIT_S.get(match[2], 1))
    except OverflowError:
        raise InvalidDurationError(f"{text!r} is too long a duration") from None
    if duration <= timedelta(0):
        raise InvalidDurationError(f"{text!r}: a duration must be longer than 0")
    return duration


def parse_moment(text: str) -> datetime:
    """A moment as people type it: an ISO time (UTC unless it says otherwise) or a
    duration ago (``30m``, ``2h``, ``7d``). The CLI's ``--since`` and the API's ``since``
    read it alike."""
    try:
        return datetime.now(UTC) - parse_duration(text, unit_required=True)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise InvalidDurationError(
            f"{text!r} is neither an ISO time (2026-12-02, 2026-12-02T17:30Z) "
            f"nor a duration ago (90s, 30m, 2h, 7d, 1w)"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def format_duration(duration: timedelta) -> str:
    """The shortest exact spelling :func:`parse_duration` reads back: 30d, 90m, 2.5s."""
    seconds = duration.total_seconds()
    for unit, size in _UNIT_S.items():
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"

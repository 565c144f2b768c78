"""When a cron expression fires, in a time zone: the slots of a schedule.

A thin layer over cronsim (a small, well-kept cron evaluator): it accepts the usual five
fields (minute hour day month weekday) and a sixth, leading, seconds field
(``"*/10 * * * * *"``: every ten seconds). Times are evaluated in the schedule's IANA time
zone (daylight saving time as cron does it) and handed out in UTC, so that a slot is one
instant whatever zone looks at it.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

_ONE_MICROSECOND = timedelta(microseconds=1)


class CronTimes:
    """The slots of ``expression`` in ``timezone``. Raises ValueError saying what is
    wrong with either (the caller names the schedule)."""

    __slots__ = ("_zone", "expression", "timezone")

    def __init__(self, expression: str, timezone: str) -> None:
        if not isinstance(expression, str) or not expression.strip():
            raise ValueError(f"the cron expression must be non-empty text, got {expression!r}")
        try:
            self._zone = ZoneInfo(timezone)
        except (ZoneInfoNotFoundError, ValueError, TypeError):
            raise ValueError(
                f"unknown time zone {timezone!r} (an IANA name such as 'UTC' or 'Europe/Paris')"
            ) from None
        self.expression = expression
        self.timezone = timezone
        try:
            next(self._forward(datetime.now(UTC)))
        except CronSimError as exc:
            raise ValueError(
                f"bad cron expression {expression!r}: {exc} (five fields, minute hour day "
                f"month weekday, or six with seconds first)"
            ) from None
        except StopIteration:
            raise ValueError(f"the cron expression {expression!r} never fires") from None

    def _forward(self, after: datetime) -> Iterator[datetime]:
        """Slots strictly after ``after``, ascending, in UTC."""
        for slot in CronSim(self.expression, after.astimezone(self._zone)):
            yield slot.astimezone(UTC)

    def _backward(self, until: datetime) -> Iterator[datetime]:
        """Slots at or before ``until``, descending, in UTC (cronsim goes back from a time
        with microseconds starting at that second itself)."""
        start = (until + _ONE_MICROSECOND).astimezone(self._zone)
        for slot in CronSim(self.expression, start, reverse=True):
            yield slot.astimezone(UTC)

    def next_after(self, moment: datetime) -> datetime | None:
        """The first slot strictly after ``moment`` (None if there is none in 50 years)."""
        return next(self._forward(moment), None)

    def latest_until(self, moment: datetime) -> datetime | None:
        """The last slot at or before ``moment`` (None if there is none in 50 years)."""
        return next(self._backward(moment), None)

    def between(self, after: datetime, until: datetime, limit: int) -> list[datetime]:
        """The slots in ``(after, until]``, ascending, at most ``limit`` of them (the
        earliest): ask for one more than you accept to learn that there are too many."""
        found: list[datetime] = []
        for slot in self._forward(after):
            if slot > until or len(found) >= limit:
                break
            found.append(slot)
        return found

    def within(self, start: datetime, until: datetime, limit: int) -> list[datetime]:
        """:meth:`between`, with ``start`` itself included: the slots in ``[start, until]``."""
        return self.between(start - _ONE_MICROSECOND, until, limit)

    def latest_between(self, after: datetime, until: datetime, limit: int) -> list[datetime]:
        """The latest ``limit`` slots in ``(after, until]``, ascending: walking back from
        ``until``, so a long span costs no more than ``limit`` steps."""
        found: list[datetime] = []
        for slot in self._backward(until):
            if slot <= after or len(found) >= limit:
                break
            found.append(slot)
        found.reverse()
        return found

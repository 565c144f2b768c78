"""Schedules without a database: slots of a cron expression, the catch-up plan, the
inputs of a slot's workflow, and every definition that is refused at import time."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import dbos_agent as da
from dbos_agent._engine.runtime.scheduler import ON_TIME, plan_slots
from dbos_agent._engine.schedules.cron import CronTimes
from dbos_agent._engine.schedules.definitions import (
    MAX_SLOTS,
    Schedule,
    define_schedule,
    find_schedule,
    forget_schedules,
    registered_schedules,
    slot_inputs,
    slot_workflow_id,
)
from dbos_agent._engine.workflow import definition_of

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
SECOND = timedelta(seconds=1)


@pytest.fixture(autouse=True)
def _forget_schedules() -> Iterator[None]:
    before = {s.name for s in registered_schedules()}
    yield
    forget_schedules(*({s.name for s in registered_schedules()} - before))


@da.durable_workflow
def nightly(scheduled_at: datetime) -> str:
    return scheduled_at.isoformat()


def _schedule(
    cron: str,
    catch_up: Any = "latest",
    window: timedelta = timedelta(hours=1),
    overlap: Any = "skip",
) -> Schedule:
    return define_schedule(
        nightly,
        cron,
        name="unit-nightly",
        timezone="UTC",
        catch_up=catch_up,
        catch_up_window=window,
        overlap=overlap,
    )


def test_slots_of_five_and_six_field_expressions_in_a_time_zone() -> None:
    every_second = CronTimes("* * * * * *", "UTC")
    assert every_second.next_after(T0) == T0 + timedelta(seconds=1)
    assert every_second.latest_until(T0) == T0  # a slot at the very moment is due
    assert every_second.latest_until(T0 + timedelta(milliseconds=999)) == T0
    assert every_second.between(T0, T0 + timedelta(seconds=3), 10) == [
        T0 + timedelta(seconds=s) for s in (1, 2, 3)
    ]
    assert every_second.within(T0, T0 + timedelta(seconds=1), 10) == [
        T0,
        T0 + timedelta(seconds=1),
    ]
    assert every_second.latest_between(T0, T0 + timedelta(days=30), 2) == [
        T0 + timedelta(days=30, seconds=-1),
        T0 + timedelta(days=30),
    ]
    # 09:00 in Paris is 08:00 UTC in winter and 07:00 UTC in summer
    paris = CronTimes("0 9 * * *", "Europe/Paris")
    assert paris.next_after(T0) == datetime(2026, 3, 2, 8, 0, tzinfo=UTC)
    assert paris.next_after(datetime(2026, 4, 1, tzinfo=UTC)) == datetime(
        2026, 4, 1, 7, 0, tzinfo=UTC
    )


def test_a_slot_is_its_workflow_id_and_its_inputs_are_what_the_workflow_records() -> None:
    slot = datetime(2026, 12, 4, 18, 30, tzinfo=UTC)
    assert slot_workflow_id("reports", slot) == "reports@2026-12-04T18:30:00Z"
    paris = slot.astimezone(CronTimes("* * * * *", "Europe/Paris")._zone)
    assert slot_workflow_id("reports", paris) == "reports@2026-12-04T18:30:00Z"
    definition = definition_of(nightly)
    assert slot_inputs("scheduled_at", slot) == definition.inputs.dumps((slot,), {})
    args, _ = definition.inputs.loads(slot_inputs("scheduled_at", slot), "w")
    assert args == (slot,) and args[0].utcoffset() == timedelta(0)


def test_catch_up_latest_runs_the_most_recent_missed_slot() -> None:
    plan = plan_slots(_schedule("* * * * *"), T0, T0 + timedelta(minutes=10, seconds=5))
    assert plan.fire == [T0 + timedelta(minutes=10)] and plan.pass_through is None
    assert plan_slots(_schedule("* * * * *"), T0, T0 + timedelta(seconds=59)).fire == []


def test_catch_up_all_runs_every_missed_slot_within_the_window() -> None:
    schedule = _schedule("* * * * *", "all", timedelta(minutes=5), "allow")
    now = T0 + timedelta(minutes=30, seconds=1)
    plan = plan_slots(schedule, T0, now)
    assert plan.fire == [T0 + timedelta(minutes=m) for m in (26, 27, 28, 29, 30)]
    # the 25 slots older than the window are passed over, and counted
    assert (plan.pass_through, plan.passed) == (T0 + timedelta(minutes=25), 25)
    # the cursor bounds it too: nothing at or before it runs again
    after = T0 + timedelta(minutes=28)
    plan = plan_slots(schedule, after, now)
    assert plan.fire == [after + timedelta(minutes=m) for m in (1, 2)]
    assert (plan.pass_through, plan.passed, plan.more) == (None, 0, False)
    # a per-second schedule down for a day starts at most MAX_SLOTS, the latest ones
    flood = _schedule("* * * * * *", "all", timedelta(days=2), "allow")
    plan = plan_slots(flood, T0, T0 + timedelta(days=1))
    assert len(plan.fire) == MAX_SLOTS and plan.fire[-1] == T0 + timedelta(days=1)
    assert plan.passed == 86_400 - MAX_SLOTS and plan.pass_through == plan.fire[0] - SECOND
    # every missed slot older than the window: the cursor passes over them
    hourly = _schedule("0 * * * *", "all", timedelta(minutes=5))
    plan = plan_slots(hourly, T0, T0 + timedelta(hours=3, minutes=20))
    assert plan.fire == [] and (plan.pass_through, plan.passed) == (T0 + timedelta(hours=3), 3)


def test_catch_up_all_in_order_fires_the_oldest_first_a_few_at_a_time() -> None:
    """With overlap skip or buffer_one the first slot fires and the next waits for its run
    (the database decides that): a look is handed the oldest few, and more when more are
    due, so that it never builds a list of thousands to fire one of them."""
    for overlap in ("skip", "buffer_one"):
        schedule = _schedule("* * * * * *", "all", timedelta(minutes=1), overlap)
        now = T0 + timedelta(minutes=10)
        plan = plan_slots(schedule, T0, now)
        window_start = now - timedelta(minutes=1)
        assert plan.fire == [window_start + s * SECOND for s in range(1, 9)] and plan.more
        assert (plan.pass_through, plan.passed) == (window_start, 9 * 60)
        # two slots left in the window: both handed over, nothing more
        plan = plan_slots(schedule, now - 2 * SECOND, now)
        assert plan.fire == [now - SECOND, now] and not plan.more and plan.passed == 0


def test_a_long_outage_is_counted_a_chunk_per_look() -> None:
    schedule = _schedule("* * * * * *", "all", timedelta(hours=1))
    now = T0 + timedelta(days=3)
    plan = plan_slots(schedule, T0, now)
    assert plan.fire == [] and plan.more and plan.passed == 100_000
    assert plan.pass_through == T0 + 100_000 * SECOND


def test_catch_up_none_runs_only_a_slot_that_is_on_time() -> None:
    hourly = _schedule("0 * * * *", "none")
    on_time = plan_slots(hourly, T0, T0 + timedelta(hours=2) + ON_TIME)
    assert on_time.fire == [T0 + timedelta(hours=2)]
    late = plan_slots(hourly, T0, T0 + timedelta(hours=2, minutes=10))
    assert late.fire == [] and late.pass_through == T0 + timedelta(hours=2)


def _refused(decorate: Callable[[], object], *fragments: str) -> None:
    with pytest.raises(da.errors.ScheduleError) as caught:
        decorate()
    assert isinstance(caught.value, ValueError)
    for fragment in fragments:
        assert fragment in str(caught.value), str(caught.value)


def test_bad_schedules_are_refused_at_definition_naming_the_schedule() -> None:
    def plain(scheduled_at: datetime) -> None: ...

    _refused(lambda: da.scheduled("* * * * *", name="s1")(plain), "'s1'", "not a durable")
    _refused(lambda: da.scheduled("every day", name="s2")(nightly), "'s2'", "bad cron")
    _refused(lambda: da.scheduled("61 * * * *", name="s3")(nightly), "'s3'", "Bad minute")
    _refused(
        lambda: da.scheduled("* * * * *", name="s4", timezone="Mars/Olympus")(nightly),
        "'s4'",
        "unknown time zone 'Mars/Olympus'",
    )
    _refused(
        lambda: da.scheduled("* * * * *", name="s5", catch_up="some")(nightly),  # type: ignore[arg-type]
        "'s5'",
        "catch_up must be one of 'latest', 'all', 'none', got 'some'",
    )
    _refused(
        lambda: da.scheduled("* * * * *", name="s6", overlap="queue")(nightly),  # type: ignore[arg-type]
        "overlap must be one of 'skip', 'allow', 'buffer_one'",
    )
    _refused(
        lambda: da.scheduled("* * * * *", name="s7", catch_up_window=timedelta(0))(nightly),
        "'s7'",
        "catch_up_window",
    )
    _refused(lambda: da.scheduled("* * * * *", name="")(nightly), "must not be empty")
    _refused(lambda: da.scheduled("* * * * *", name="x" * 990)(nightly), "too long")
    assert not {"s1", "s2", "s3", "s4", "s5", "s6", "s7"} & {s.name for s in registered_schedules()}


def test_the_workflow_must_take_the_slot_as_its_one_datetime_argument() -> None:
    @da.durable_workflow
    def two(scheduled_at: datetime, extra: int) -> None: ...

    @da.durable_workflow
    def none() -> None: ...

    @da.durable_workflow
    def untyped(scheduled_at):  # type: ignore[no-untyped-def]
        ...

    @da.durable_workflow
    def keyword_only(*, scheduled_at: datetime) -> None: ...

    fns: list[Callable[..., Any]] = [two, none, keyword_only]
    for fn in fns:
        _refused(functools.partial(da.scheduled("* * * * *"), fn), "exactly one argument")
    _refused(lambda: da.scheduled("* * * * *")(untyped), "as datetime")


def test_two_functions_may_not_share_a_schedule_name() -> None:
    @da.durable_workflow
    def first(scheduled_at: datetime) -> None: ...

    @da.durable_workflow
    def second(scheduled_at: datetime) -> None: ...

    da.scheduled("*/5 * * * *", name="unit-shared")(first)
    da.scheduled("*/10 * * * *", name="unit-shared")(first)  # the same function: replaces
    shared = find_schedule("unit-shared")
    assert shared is not None and shared.cron == "*/10 * * * *"
    _refused(
        lambda: da.scheduled("* * * * *", name="unit-shared")(second),
        "two schedules are named 'unit-shared'",
        "first",
        "second",
    )

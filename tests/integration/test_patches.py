"""da.patched: new code guards its change so that logs recorded by the old code still fit.

The "old" and "new" code are one workflow function switched by ``CODE[workflow id]``;
an old run is cut short (SimulatedCrash) and continued by the new code, as a deploy would.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

import dbos_agent as da
from dbos_agent._limits import MAX_IDENTIFIER_BYTES
from tests.helpers import SimulatedCrash, new_id, per_test

CODE: dict[str, str] = {}
RUNS: Counter[str] = per_test(Counter())


@da.step
def reserve() -> str:
    RUNS["reserve"] += 1
    return "reserved"


@da.step
def check_stock() -> str:
    RUNS["check_stock"] += 1
    return "in stock"


@da.step
def ship() -> str:
    RUNS["ship"] += 1
    return "shipped"


@da.durable_workflow
def order(key: str) -> list[str]:
    code, done = CODE[key], []
    if (code == "patched" and da.patched("check-stock")) or (
        code == "deprecated" and da.deprecate_patch("check-stock")
    ):
        done.append(check_stock())
    done.append(reserve())
    if code == "old-crash" or (code != "old" and CODE.get(f"{key}:crash") == "after-reserve"):
        raise SimulatedCrash()
    done.append(ship())
    return done


def run(key: str, code: str) -> list[str]:
    CODE[key] = code
    with da.workflow_id(key):
        return order(key)


def names(key: str) -> list[str]:
    return [s.name for s in da.operations.list_steps(key)]


def test_a_new_run_records_the_marker_and_takes_the_new_branch(runtime: da.Runtime) -> None:
    key = new_id("order")
    assert run(key, "patched") == ["in stock", "reserved", "shipped"]
    assert names(key)[0] == "dbos_agent.patch:check-stock"
    assert names(key)[1:] == [
        f"{check_stock.__qualname__}",
        reserve.__qualname__,
        ship.__qualname__,
    ]


def test_an_old_log_replays_the_old_branch_without_consuming_a_position(
    runtime: da.Runtime,
) -> None:
    key = new_id("order")
    with pytest.raises(SimulatedCrash):
        run(key, "old-crash")  # the old code recorded reserve at 0, then the process died
    assert RUNS == Counter(reserve=1)
    assert run(key, "patched") == ["reserved", "shipped"]  # the new code continues it
    assert RUNS == Counter(reserve=1, ship=1), "reserve replayed, the new step not run"
    assert names(key) == [reserve.__qualname__, ship.__qualname__]
    assert da.retrieve(key).status() == da.WorkflowStatus.SUCCESS


def test_a_log_with_the_marker_replays_the_new_branch(runtime: da.Runtime) -> None:
    key = new_id("order")
    CODE[f"{key}:crash"] = "after-reserve"
    with pytest.raises(SimulatedCrash):
        run(key, "patched")
    del CODE[f"{key}:crash"]
    assert run(key, "patched") == ["in stock", "reserved", "shipped"]
    assert RUNS == Counter(check_stock=1, reserve=1, ship=1)


def test_deprecate_patch_accepts_logs_with_and_without_the_marker(runtime: da.Runtime) -> None:
    with_marker, without = new_id("order"), new_id("order")
    CODE[f"{with_marker}:crash"] = CODE[f"{without}:crash"] = "after-reserve"
    with pytest.raises(SimulatedCrash):
        run(with_marker, "patched")  # recorded by the patched code: the marker is there
    with pytest.raises(SimulatedCrash):
        run(without, "deprecated")  # started under deprecate_patch: no marker recorded
    del CODE[f"{with_marker}:crash"], CODE[f"{without}:crash"]
    RUNS.clear()
    assert run(with_marker, "deprecated") == ["in stock", "reserved", "shipped"]
    assert run(without, "deprecated") == ["in stock", "reserved", "shipped"]
    assert RUNS == Counter(ship=2), "everything before the crash replayed"
    assert names(without)[0] == check_stock.__qualname__


@da.durable_workflow
def loops_over_a_patch(turns: int) -> int:
    taken = 0
    for _ in range(turns):
        taken += da.patched("in-a-loop")  # one site: one marker, the same answer each turn
    return taken


def test_a_patch_met_again_at_its_site_answers_the_same_and_records_once(
    runtime: da.Runtime,
) -> None:
    key = new_id("loop")
    with da.workflow_id(key):
        assert loops_over_a_patch(3) == 3
    assert names(key) == ["dbos_agent.patch:in-a-loop"]


@da.durable_workflow
def two_places() -> None:
    da.patched("same")
    da.patched("same")


@da.durable_workflow
def patched_in_a_step_is_refused() -> None:
    patch_in_step()


@da.step
def patch_in_step() -> bool:
    return da.patched("nope")


def test_bad_patches_get_named_errors(runtime: da.Runtime) -> None:
    with pytest.raises(da.errors.NotInWorkflowError, match="inside a durable workflow"):
        da.patched("outside")
    with pytest.raises(da.errors.NotInWorkflowError, match="inside a durable workflow"):
        da.deprecate_patch("outside")
    with pytest.raises(da.errors.PatchError, match="two places"), da.workflow_id(new_id()):
        two_places()
    with (
        pytest.raises(da.errors.NotInWorkflowError, match="inside a step"),
        da.workflow_id(new_id()),
    ):
        patched_in_a_step_is_refused()

    @da.durable_workflow(name="patch_named")
    def named(name: str) -> bool:
        return da.patched(name)

    for bad in ("", "a\x00b"):
        with (
            pytest.raises(da.errors.InvalidIdentifierError, match="patch name"),
            da.workflow_id(new_id()),
        ):
            named(bad)
    limit = MAX_IDENTIFIER_BYTES - len("dbos_agent.patch:")
    for too_long in ("x" * (limit + 1), "x" * MAX_IDENTIFIER_BYTES, "x" * 5000):
        with (
            pytest.raises(da.errors.InvalidIdentifierError, match=f"at most {limit} bytes"),
            da.workflow_id(new_id()),
        ):
            named(too_long)  # one limit, stated the same way whatever the length
    with da.workflow_id(new_id()):
        assert named("x" * limit) is True


@da.durable_workflow
async def async_order(key: str) -> list[str]:
    done = []
    if CODE[key] == "patched" and await da.aio.patched("check-stock"):
        done.append(await asyncio.to_thread(check_stock))
    done.append(await asyncio.to_thread(reserve))
    return done


def test_patched_async_in_an_async_workflow(runtime: da.Runtime) -> None:
    key = new_id("async")
    CODE[key] = "patched"

    async def main() -> list[str]:
        with da.workflow_id(key):
            return await async_order(key)

    assert asyncio.run(main()) == ["in stock", "reserved"]
    assert names(key)[0] == "dbos_agent.patch:check-stock"

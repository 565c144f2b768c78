"""A retry predicate beside ``retry_on`` (``retry_if``), and ``da.step_info()`` in a step."""

from __future__ import annotations

from collections import Counter

import pytest

import dbos_agent as da
from tests.helpers import new_id

ATTEMPTS: Counter[str] = Counter()
SEEN: dict[str, list[da.RunningStep]] = {}


class HttpError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


def _transient(exc: BaseException) -> bool:
    return isinstance(exc, HttpError) and exc.status >= 500


@da.step(retries=4, interval=0.001, retry_on=(HttpError,), retry_if=_transient)
def call_api(key: str, statuses: list[int]) -> str:
    ATTEMPTS[key] += 1
    if ATTEMPTS[key] <= len(statuses):
        raise HttpError(statuses[ATTEMPTS[key] - 1])
    return f"ok after {ATTEMPTS[key]}"


@da.step(retries=3, interval=0.001, retry_on=(ValueError,), retry_if=lambda exc: True)
def wrong_class(key: str) -> str:
    ATTEMPTS[key] += 1
    raise KeyError(key)


def _broken_predicate(exc: BaseException) -> bool:
    raise RuntimeError("predicate bug")


@da.step(retries=3, interval=0.001, retry_if=_broken_predicate)
def predicate_fails(key: str) -> str:
    ATTEMPTS[key] += 1
    raise ValueError("step error")


@da.durable_workflow
def calling(key: str, statuses: list[int]) -> str:
    return call_api(key, statuses)


@da.durable_workflow
def calling_wrong_class(key: str) -> str:
    return wrong_class(key)


@da.durable_workflow
def calling_broken_predicate(key: str) -> str:
    return predicate_fails(key)


def test_retry_if_retries_only_what_the_predicate_accepts(runtime: da.Runtime) -> None:
    transient, permanent = new_id(), new_id()
    with da.workflow_id(transient):
        assert calling(transient, [503, 502]) == "ok after 3"
    assert da.operations.list_steps(transient)[0].attempts == 3

    with pytest.raises(HttpError, match="HTTP 400"), da.workflow_id(permanent):
        calling(permanent, [503, 400, 503])
    assert ATTEMPTS[permanent] == 2  # the 503 was retried, the 400 was not
    assert da.operations.list_steps(permanent)[0].attempts == 2


def test_retry_if_does_not_widen_retry_on(runtime: da.Runtime) -> None:
    key = new_id()
    with pytest.raises(KeyError), da.workflow_id(key):
        calling_wrong_class(key)
    assert ATTEMPTS[key] == 1


def test_a_failing_predicate_ends_the_retries_with_the_steps_error(runtime: da.Runtime) -> None:
    key = new_id()
    with pytest.raises(ValueError, match="step error"), da.workflow_id(key):
        calling_broken_predicate(key)
    assert ATTEMPTS[key] == 1


def test_retry_policy_takes_retry_if() -> None:
    policy = da.RetryPolicy(retries=2, interval=0.0, jitter=0.0, retry_if=_transient)
    assert policy.delay_before_retry(1, HttpError(500)) == 0.0
    assert policy.delay_before_retry(1, HttpError(404)) is None
    assert policy.max_attempts == 3


@da.step(retries=2, interval=0.001)
def introspecting(key: str) -> int:
    info = da.step_info()
    SEEN.setdefault(key, []).append(info)
    if info.attempt < info.max_attempts:
        raise ConnectionError("try again")
    return info.position


@da.step
def plain(key: str) -> str:
    return da.step_info().name


@da.durable_workflow
def introspect(key: str) -> tuple[str, int]:
    name = plain(key)
    return name, introspecting(key)


def test_step_info_names_position_and_attempt(runtime: da.Runtime) -> None:
    wid = new_id()
    with da.workflow_id(wid):
        name, position = introspect(wid)
    assert name.endswith("plain")
    assert position == 1
    infos = SEEN[wid]
    assert [info.attempt for info in infos] == [1, 2, 3]
    assert {info.workflow_id for info in infos} == {wid}
    assert {info.position for info in infos} == {1}
    assert {info.max_attempts for info in infos} == {3}
    assert infos[0].name.endswith("introspecting")
    assert [step.name for step in da.operations.list_steps(wid)] == [name, infos[0].name]


@da.durable_workflow
def asks_outside_a_step() -> None:
    da.step_info()


def test_step_info_outside_a_step_raises_a_named_error(runtime: da.Runtime) -> None:
    with pytest.raises(da.errors.NotInStepError, match=r"only available inside a @da\.step"):
        da.step_info()
    with pytest.raises(da.errors.NotInStepError), da.workflow_id(new_id()):
        asks_outside_a_step()
    with pytest.raises(da.errors.NotInStepError):
        plain("outside a workflow")  # a plain call: no position to tell

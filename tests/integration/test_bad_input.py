"""Bad input is named and strands nothing: NUL characters, NaN, empty and over-long ids,
values over the checkpoint limit, values Postgres refuses."""

from __future__ import annotations

import math
import random
import string
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

import dbos_agent as da
from dbos_agent._limits import MAX_IDENTIFIER_BYTES
from tests.helpers import new_id, per_test

CALLS: Counter[str] = per_test(Counter())
NUL_TEXT = "before\x00after %00 %25 \x00"


# -- NUL characters are stored faithfully -------------------------------------------


@da.step
def nul_result(text: str) -> dict[str, Any]:
    CALLS["nul_result"] += 1
    return {"text": text, f"key{text}": [text, 1]}


class NulError(Exception):
    pass


@da.step
def nul_error(text: str) -> None:
    CALLS["nul_error"] += 1
    raise NulError(text)


@da.durable_workflow
def nul_everywhere(text: str) -> str:
    got = nul_result(text)
    assert got == {"text": text, f"key{text}": [text, 1]}
    try:
        nul_error(text)
    except NulError as exc:
        assert str(exc) == text
    da.set_event("nul", text)
    return text + "!"


def test_nul_characters_round_trip_in_inputs_results_errors_and_events(
    runtime: da.Runtime,
) -> None:
    wid = new_id()
    with da.workflow_id(wid):
        assert nul_everywhere(NUL_TEXT) == NUL_TEXT + "!"
    handle = da.retrieve(wid)
    assert handle.status() == da.WorkflowStatus.SUCCESS
    info = handle.get_info()
    assert info.inputs == {"text": NUL_TEXT} and info.output == NUL_TEXT + "!"
    steps = handle.steps()
    assert steps[0].output == {"text": NUL_TEXT, f"key{NUL_TEXT}": [NUL_TEXT, 1]}
    assert steps[1].error is not None and steps[1].error["message"] == NUL_TEXT
    assert da.get_event(wid, "nul", timeout=0) == NUL_TEXT
    with da.workflow_id(wid):  # the recorded result comes back; nothing runs again
        assert nul_everywhere(NUL_TEXT) == NUL_TEXT + "!"
    assert CALLS == Counter({"nul_result": 1, "nul_error": 1})


def test_a_replay_returns_the_nul_characters_the_live_run_saw(runtime: da.Runtime) -> None:
    wid = new_id()
    with da.workflow_id(wid):
        nul_everywhere(NUL_TEXT)
    forked = da.operations.fork(wid, 3)  # steps 0-2 replay (result, error, event); the rest is live
    assert forked.result(timeout=20) == NUL_TEXT + "!"
    assert CALLS == Counter({"nul_result": 1, "nul_error": 1})


@da.durable_workflow
def receives() -> Any:
    return da.recv(topic="t", timeout=20)


def test_nul_characters_in_messages(runtime: da.Runtime) -> None:
    wid = new_id()
    handle = da.start(receives, workflow_id=wid)
    da.send(wid, {"m": NUL_TEXT}, topic="t")
    assert handle.result(timeout=20) == {"m": NUL_TEXT}


# -- NaN and infinities are refused, not turned into null ---------------------------


@da.step
def returns_nan(kind: str) -> Any:
    CALLS["returns_nan"] += 1
    return {"nan": [1.0, math.nan], "inf": math.inf, "-inf": -math.inf}[kind]


@da.durable_workflow
def nan_step(kind: str) -> Any:
    return returns_nan(kind)


@pytest.mark.parametrize("kind", ["nan", "inf", "-inf"])
def test_nan_and_infinity_in_a_step_result_are_refused_by_name(
    runtime: da.Runtime, kind: str
) -> None:
    wid = new_id()
    with (
        pytest.raises(da.errors.SerializationError, match="NaN or infinity") as err,
        da.workflow_id(wid),
    ):
        nan_step(kind)
    assert wid in str(err.value) and "returns_nan" in str(err.value)
    assert da.operations.list_steps(wid) == []  # nothing stored as null
    assert da.retrieve(wid).status() == da.WorkflowStatus.ERROR


@da.durable_workflow
def nan_result() -> float:
    return math.nan


@da.durable_workflow
def nan_input(x: Any) -> None:
    pass


def test_nan_in_a_workflow_result_input_message_or_event_is_refused(runtime: da.Runtime) -> None:
    wid = new_id()
    with pytest.raises(da.errors.SerializationError, match="NaN"), da.workflow_id(wid):
        nan_result()
    info = da.retrieve(wid).get_info()
    assert info.status == da.WorkflowStatus.ERROR and info.output is None
    assert "NaN" in (info.error or {}).get("message", "")
    other = new_id()
    with (
        pytest.raises(da.errors.SerializationError, match=r"argument 'x'.*NaN"),
        da.workflow_id(other),
    ):
        nan_input({"a": [math.inf]})
    with pytest.raises(da.WorkflowNotFoundError):
        da.retrieve(other)
    with pytest.raises(da.errors.SerializationError, match="NaN"):
        da.send(wid, {"x": math.nan})


# -- identifiers -------------------------------------------------------------------


@da.durable_workflow
def tiny_job() -> int:
    return 1


def _random_text(n: int) -> str:  # does not compress: the old failure depended on that
    return "".join(random.choices(string.ascii_letters + string.digits, k=n))


@pytest.fixture
def client(dbos_agent_database_url: str) -> Iterator[da.Client]:
    with da.Client(dbos_agent_database_url) as c:
        yield c


def test_empty_workflow_ids_are_refused_everywhere(runtime: da.Runtime, client: da.Client) -> None:
    before = len(da.operations.list_workflows(limit=10_000))
    with pytest.raises(da.errors.InvalidIdentifierError, match="must not be empty"):
        da.start(tiny_job, workflow_id="")
    with pytest.raises(da.errors.InvalidIdentifierError, match="must not be empty"):
        client.enqueue("q", "tiny_job", workflow_id="")
    with pytest.raises(ValueError, match="must not be empty"), da.workflow_id(""):
        pass
    for call in (
        lambda: da.retrieve(""),
        lambda: da.send("", 1),
        lambda: da.operations.cancel(""),
        lambda: da.get_event("", "k", timeout=0),
        lambda: da.operations.fork(new_id(), 0, new_workflow_id=""),
    ):
        with pytest.raises(da.errors.InvalidIdentifierError):
            call()
    assert len(da.operations.list_workflows(limit=10_000)) == before  # nothing was written


def test_over_long_ids_get_a_named_error_with_the_limit(
    runtime: da.Runtime, client: da.Client
) -> None:
    long_id = _random_text(10_000)
    pattern = f"at most {MAX_IDENTIFIER_BYTES} bytes"
    with pytest.raises(da.errors.InvalidIdentifierError, match=pattern):
        da.start(tiny_job, workflow_id=long_id)
    with pytest.raises(da.errors.InvalidIdentifierError, match=pattern):
        client.enqueue("q", "tiny_job", workflow_id=long_id)
    with pytest.raises(da.errors.InvalidIdentifierError, match="message topic"):
        da.send(new_id(), 1, topic=long_id)
    with pytest.raises(da.errors.InvalidIdentifierError, match="NUL"):
        da.start(tiny_job, workflow_id="a\x00b")
    at_limit = _random_text(MAX_IDENTIFIER_BYTES)  # the longest id still works
    assert da.start(tiny_job, workflow_id=at_limit).result(timeout=20) == 1
    assert da.retrieve(at_limit).status() == da.WorkflowStatus.SUCCESS


@da.durable_workflow
def parent_of_long_id() -> int:
    return tiny_job()


def test_a_child_of_a_workflow_with_the_longest_id_gets_a_stable_id(runtime: da.Runtime) -> None:
    wid = _random_text(MAX_IDENTIFIER_BYTES)
    with da.workflow_id(wid):
        assert parent_of_long_id() == 1
    children = [
        w for w in da.operations.list_workflows(name="tiny_job", limit=50) if w.workflow_id != wid
    ]
    assert any(w.workflow_id.startswith("sha256:") for w in children)


# -- the checkpoint size limit ---------------------------------------------------------

LIMIT = 50_000


@pytest.fixture
def small_limit(dbos_agent_database_url: str, executor_id: str) -> Iterator[da.Runtime]:
    rt = da.launch(
        dbos_agent_database_url, executor_id=executor_id, workers=4, max_checkpoint_bytes=LIMIT
    )
    try:
        yield rt
    finally:
        rt.shutdown(grace=5)


@da.step
def big_output(n: int) -> str:
    CALLS["big_output"] += 1
    return "x" * n


@da.durable_workflow
def makes_big_output(n: int) -> str:
    return big_output(n)[:10]


@da.durable_workflow
def returns_big(n: int) -> str:
    return "y" * n


@da.durable_workflow
def publishes_big(n: int) -> None:
    da.set_event("big", "z" * n)


def test_a_step_output_over_the_limit_is_recorded_as_its_error_by_name(
    small_limit: da.Runtime,
) -> None:
    """The value is not written; its error is the step's outcome, recorded once: a
    replay raises the same error without making the value again."""
    wid = new_id()
    with pytest.raises(da.errors.CheckpointTooLargeError) as err, da.workflow_id(wid):
        makes_big_output(LIMIT + 1)
    message = str(err.value)
    assert wid in message and "step 0" in message and "big_output" in message
    assert f"{LIMIT + 3:,}" in message and f"{LIMIT:,}" in message  # size (JSON quotes) and limit
    assert err.value.size == LIMIT + 3 and err.value.limit == LIMIT
    [step] = da.operations.list_steps(wid)
    assert step.status == "ERROR" and step.output is None
    assert (step.error or {})["type"].endswith("CheckpointTooLargeError")
    info = da.retrieve(wid).get_info()
    assert info.status == da.WorkflowStatus.ERROR
    assert (info.error or {})["type"].endswith("CheckpointTooLargeError")
    replayed = da.operations.fork(wid, from_step=1)  # the step replays its recorded error
    with pytest.raises(da.errors.CheckpointTooLargeError) as again:
        replayed.result(timeout=20)
    assert (again.value.size, again.value.limit) == (LIMIT + 3, LIMIT)
    ok = new_id()
    with da.workflow_id(ok):
        assert makes_big_output(LIMIT - 10) == "x" * 10


def test_inputs_outputs_messages_and_events_over_the_limit_are_refused(
    small_limit: da.Runtime,
) -> None:
    big_input = new_id()
    with pytest.raises(da.errors.CheckpointTooLargeError, match="inputs of workflow"):
        da.start(tiny_with_input, "i" * (LIMIT + 1), workflow_id=big_input)
    with pytest.raises(da.WorkflowNotFoundError):
        da.retrieve(big_input)
    big_result = new_id()
    with pytest.raises(da.errors.CheckpointTooLargeError, match="output of workflow"):
        da.start(returns_big, LIMIT + 1, workflow_id=big_result).result(timeout=20)
    assert da.retrieve(big_result).status() == da.WorkflowStatus.ERROR
    with pytest.raises(da.errors.CheckpointTooLargeError, match="message to workflow"):
        da.send(big_result, "m" * (LIMIT + 1))
    big_event = new_id()
    with pytest.raises(da.errors.CheckpointTooLargeError, match="event 'big'"):
        da.start(publishes_big, LIMIT + 1, workflow_id=big_event).result(timeout=20)
    assert da.retrieve(big_event).status() == da.WorkflowStatus.ERROR
    assert da.get_event(big_event, "big", timeout=0) is None


@da.durable_workflow
def tiny_with_input(text: str) -> int:
    return len(text)


# -- values Postgres refuses are the user's error ------------------------------------


@da.step
def huge_number() -> int:
    CALLS["huge_number"] += 1
    return 10**140_000  # more digits than Postgres' numeric holds


@da.durable_workflow
def refused_by_postgres() -> int:
    return huge_number() % 7


def test_a_value_postgres_refuses_ends_the_workflow_in_error_not_pending(
    runtime: da.Runtime,
) -> None:
    wid = new_id()
    with (
        pytest.raises(da.errors.SerializationError, match="Postgres refused") as err,
        da.workflow_id(wid),
    ):
        refused_by_postgres()
    assert "huge_number" in str(err.value) and "NumericValueOutOfRange" in str(err.value)
    info = da.retrieve(wid).get_info()
    assert info.status == da.WorkflowStatus.ERROR  # a user error, not a stranded workflow
    assert da.operations.list_steps(wid) == []
    assert CALLS["huge_number"] == 1

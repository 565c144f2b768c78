"""The pure logic under the database: codecs, the jsonb escape, identifiers, limits.

No Postgres here: this tier runs in about a second (``pytest tests/unit``)."""

from __future__ import annotations

import datetime
import json
import logging
import math
from typing import Any

import pytest
from pydantic import BaseModel

from dbos_agent._limits import (
    MAX_IDENTIFIER_BYTES,
    check_identifier,
    check_topic,
    derived_identifier,
)
from dbos_agent._serialization import codec_for, dumps_error, loads_error
from dbos_agent._storage import jsonb
from dbos_agent.errors import (
    CheckpointTooLargeError,
    InvalidIdentifierError,
    RecordedError,
    SerializationError,
)


class Point(BaseModel):
    x: float
    y: float


@pytest.mark.parametrize(
    "value",
    [
        "plain",
        "with\x00nul",
        "%00 and %25 and %",
        {"k\x00ey": ["a\x00", {"n": 1}], "%": None},
        ["\x00"],
        {"$dbos_agent:nul": "looks like the wrapper"},
        {"$dbos_agent:nul": "and \x00 too"},
        1.5,
        None,
    ],
)
def test_the_jsonb_escape_round_trips_every_string(value: Any) -> None:
    text = json.dumps(value)
    stored = jsonb.to_db(text)
    assert "\\u0000" not in stored  # what jsonb refuses never reaches it
    assert json.loads(jsonb.from_db(stored) or "null") == value
    if "\\u0000" not in text and not text.startswith('{"$dbos_agent:nul"'):
        assert stored == text  # the common case is untouched


def test_jsonb_accepts_its_own_spacing_on_the_way_back() -> None:
    assert jsonb.to_db(json.dumps({"a": "x\x00"})) == '{"$dbos_agent:nul":{"a":"x%00"}}'
    as_jsonb_prints_it = '{"$dbos_agent:nul": {"a": "x%00", "b": [1, "%25"]}}'
    assert json.loads(jsonb.from_db(as_jsonb_prints_it) or "") == {"a": "x\x00", "b": [1, "%"]}


@pytest.mark.parametrize(
    ("value", "path"),
    [
        (math.nan, "$"),
        ([1.0, math.inf], "$[1]"),
        ({"a": {"b": -math.inf}}, "$['a']['b']"),
        ((1, (2, math.nan)), "$[1][1]"),
    ],
)
def test_nan_and_infinity_are_refused_with_their_path(value: Any, path: str) -> None:
    with pytest.raises(SerializationError, match="NaN or infinity") as err:
        codec_for(Any).dumps(value, "here")
    assert path in str(err.value) and str(err.value).startswith("here:")


def test_nan_inside_a_model_is_refused_too() -> None:
    with pytest.raises(SerializationError, match=r"\$\['y'\]"):
        codec_for(Point).dumps(Point(x=1, y=math.nan), "step 3")
    assert codec_for(Point).dumps(Point(x=1, y=2), "step 3") == '{"x":1.0,"y":2.0}'


def test_annotated_values_come_back_as_themselves() -> None:
    when = datetime.datetime(2026, 12, 3, 14, 0, tzinfo=datetime.UTC)
    for annotation, value in [
        (set[int], {1, 2}),
        (tuple[int, str], (1, "a")),
        (datetime.datetime, when),
        (bytes, b"abc"),
        (Point, Point(x=1, y=2)),
    ]:
        codec = codec_for(annotation)
        assert codec.loads(codec.dumps(value, "w"), "w") == value


def test_an_unannotated_lossy_value_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    class Tagged(frozenset[int]):
        pass

    with caplog.at_level(logging.WARNING, logger="dbos_agent._serialization"):
        codec_for(Any).dumps(Tagged({1}), "step 1")
        codec_for(Any).dumps(Tagged({2}), "step 2")
    warnings = [r.getMessage() for r in caplog.records if "Tagged" in r.getMessage()]
    assert len(warnings) == 1 and "replays as a list" in warnings[0]


def test_errors_are_recorded_clipped_and_rebuilt() -> None:
    text = dumps_error(ValueError("x" * 200_000))
    data = json.loads(text)
    assert len(data["message"]) < 70_000 and "more characters not recorded" in data["message"]
    assert isinstance(loads_error(text), ValueError)
    nan_args = dumps_error(ValueError(math.nan))  # args that are not JSON: the message stands in
    assert json.loads(nan_args)["args"] == ["nan"]
    unknown = loads_error(json.dumps({"type": "nowhere.Missing", "message": "m"}))
    assert isinstance(unknown, RecordedError) and unknown.type_name == "nowhere.Missing"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "must not be empty"),
        ("a\x00b", "NUL"),
        ("é" * (MAX_IDENTIFIER_BYTES // 2 + 1), f"at most {MAX_IDENTIFIER_BYTES} bytes"),
        (42, "must be a string"),
    ],
)
def test_bad_identifiers_are_named(value: Any, message: str) -> None:
    with pytest.raises(InvalidIdentifierError, match=message) as err:
        check_identifier(value, "workflow id")
    assert "workflow id" in str(err.value) and isinstance(err.value, ValueError)


def test_an_empty_topic_is_refused_and_child_ids_stay_within_the_limit() -> None:
    assert check_topic(None) is None and check_topic("go") == "go"
    with pytest.raises(InvalidIdentifierError, match="empty"):
        check_topic("")
    assert derived_identifier("parent", "-3") == "parent-3"
    long = "p" * MAX_IDENTIFIER_BYTES
    child = derived_identifier(long, "-3")
    assert child.startswith("sha256:") and child.endswith("-3")
    assert child == derived_identifier(long, "-3")  # stable: the same on every replay
    assert len(child.encode()) <= MAX_IDENTIFIER_BYTES


def test_the_size_error_names_size_and_limit() -> None:
    err = CheckpointTooLargeError("workflow 'w' step 2 (fetch) output", 20_000_000, 16_777_216)
    assert "20,000,000" in str(err) and "16,777,216" in str(err) and "step 2" in str(err)
    assert isinstance(err, SerializationError)


def test_a_coroutine_is_named_as_a_missing_await() -> None:
    async def fetch() -> int:
        return 1

    pending = fetch()
    try:
        with pytest.raises(SerializationError, match="called without await") as err:
            codec_for(Any).dumps(pending, "workflow 'w' result")
        assert "fetch" in str(err.value)
    finally:
        pending.close()

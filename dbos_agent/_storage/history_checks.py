"""The rules a history document meets before it is imported or checked (``dbos-agent
import``, ``check-deploy --histories``): the engine's own (identifiers, the checkpoint
size limit) and the schema's (types, NOT NULL, the CHECK constraints, the keys).

What comes from a file is checked as what the engine creates is, in Python and before
anything is written, so that a bad line is refused by name (file, line, field) and never
by a Postgres error half-way through a file. A line is one ``dbos_agent.history/1``
document: the workflow's row, its steps, messages, events, streams and approvals, values
as stored (a value with a NUL character stored wrapped, see :mod:`.jsonb`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .._limits import (
    DEFAULT_MAX_CHECKPOINT_BYTES,
    MAX_JSON_DEPTH,
    MAX_PRIORITY,
    check_checkpoint_size,
    check_identifier,
)
from ..errors import CheckpointTooLargeError, InvalidHistoryError, InvalidIdentifierError
from ..records import StepStatus, WorkflowStatus

__all__ = ["COLUMNS", "HISTORY_FORMAT", "OMITTED", "load_history"]

#: The ``format`` of an exported history document.
HISTORY_FORMAT = "dbos_agent.history/1"

#: Postgres ``integer``.
_INT_MAX = 2**31 - 1

REQUIRED, DEFAULTED, NULLABLE = "required", "defaulted", "nullable"


class _Refused(Exception):
    """One broken rule: the field (a path in the document) and what is wrong with it."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(problem)
        self.field = field
        self.problem = problem


Check = Callable[[Any, str], None]


@dataclass(frozen=True, slots=True)
class _Field:
    """A column as a document holds it: its rule, and whether it may be absent (the
    import gives it its default) or null."""

    name: str
    check: Check
    need: str = REQUIRED
    #: What is wrong with a null where none may be.
    null: str = "must not be null"


# -- value rules -------------------------------------------------------------------------


def _identifier(what: str) -> Check:
    def check(value: Any, field: str) -> None:
        try:
            check_identifier(value, what)
        except InvalidIdentifierError as exc:
            raise _Refused(field, str(exc)) from None

    return check


def _text(value: Any, field: str) -> None:
    if not isinstance(value, str):
        raise _Refused(field, f"must be a string, got {_kind(value)}")
    _storable_text(value, field)


def _topic(value: Any, field: str) -> None:
    """A message's topic as stored: '' for the default topic (``topic=None``)."""
    if value != "":
        _identifier("message topic")(value, field)


def _integer(low: int, high: int = _INT_MAX) -> Check:
    def check(value: Any, field: str) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _Refused(field, f"must be an integer, got {_kind(value)}")
        if not low <= value <= high:
            raise _Refused(field, f"must be between {low} and {high}, got {value}")

    return check


def _one_of(*allowed: str) -> Check:
    def check(value: Any, field: str) -> None:
        if value not in allowed:
            raise _Refused(field, f"must be one of {', '.join(allowed)}, got {value!r}")

    return check


def _time(value: Any, field: str) -> None:
    if not isinstance(value, str):
        raise _Refused(field, f"must be a time (ISO 8601 text), got {_kind(value)}")
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise _Refused(field, f"must be a time (ISO 8601 text), got {value[:60]!r}") from None
    if parsed.tzinfo is None:
        raise _Refused(field, f"must be a time with its UTC offset, got {value[:60]!r}")


def _texts(value: Any, field: str) -> None:
    if not isinstance(value, list):
        raise _Refused(field, f"must be a list of strings, got {_kind(value)}")
    for i, item in enumerate(value):
        _text(item, f"{field}[{i}]")


def _json(value: Any, field: str) -> None:
    """Any JSON value, as jsonb stores it and the engine reads it back (the size limit is
    checked by :class:`_Rules`, which knows it)."""
    _walk(value, field)


def _json_object(value: Any, field: str) -> None:
    if not isinstance(value, dict):
        raise _Refused(field, f"must be a JSON object, got {_kind(value)}")
    _walk(value, field)


def _json_objects(value: Any, field: str) -> None:
    """A JSON array of objects (a workflow's ``edits``: one object per operator's edit)."""
    if not isinstance(value, list):
        raise _Refused(field, f"must be a JSON array of objects, got {_kind(value)}")
    for i, item in enumerate(value):
        _json_object(item, f"{field}[{i}]")


def _event_values(value: Any, field: str) -> None:
    """A step's ``events`` (migration 031): an object of event keys and JSON values."""
    if not isinstance(value, dict):
        raise _Refused(field, f"must be a JSON object of event values, got {_kind(value)}")
    for key, item in value.items():
        _identifier("event key")(key, f"{field}.{key}")
        _walk(item, f"{field}.{key}")


def _storable_text(text: str, field: str) -> None:
    """Text Postgres can hold: no NUL, and Unicode (no unpaired surrogate)."""
    if "\x00" in text:
        raise _Refused(
            field,
            "holds a NUL character (\\u0000), which Postgres cannot store (the engine "
            "stores such a value wrapped: this is not a value as exported)",
        )
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise _Refused(
                field, f"holds an unpaired surrogate (\\u{ord(text[exc.start]):04x}), not text"
            ) from None


def _walk(value: Any, field: str) -> None:
    """Depth, and every string (keys too) storable: without recursion, however deep."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            _storable_text(item, field)
        elif isinstance(item, dict | list):
            if depth >= MAX_JSON_DEPTH:
                raise _Refused(field, f"is nested deeper than {MAX_JSON_DEPTH} levels")
            if isinstance(item, dict):
                for key, inner in item.items():
                    _storable_text(key, field)
                    stack.append((inner, depth + 1))
            else:
                stack.extend((inner, depth + 1) for inner in item)


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


# -- the tables --------------------------------------------------------------------------

_WORKFLOW = (
    _Field("workflow_id", _identifier("workflow id")),
    _Field("name", _identifier("workflow name")),
    _Field("status", _one_of(*WorkflowStatus)),
    _Field("inputs", _json_object),
    _Field("output", _json, NULLABLE),
    _Field("error", _json, NULLABLE),
    _Field("executor_id", _identifier("executor id")),
    _Field("app_version", _text, NULLABLE),
    _Field("recovery_attempts", _integer(0), DEFAULTED),
    _Field("max_recovery_attempts", _integer(0)),
    _Field("created_at", _time, DEFAULTED),
    _Field("updated_at", _time, DEFAULTED),
    _Field("finished_at", _time, NULLABLE),
    _Field("queue_name", _identifier("queue name"), NULLABLE),
    _Field("priority", _integer(0, MAX_PRIORITY), DEFAULTED),
    _Field("dequeued_at", _time, NULLABLE),
    _Field("forked_from", _identifier("workflow id"), NULLABLE),
    _Field("forked_from_step", _integer(0), NULLABLE),
    _Field("wait_kind", _one_of("sleep", "recv", "event", "child", "retry"), NULLABLE),
    _Field("wait_target", _identifier("workflow id"), NULLABLE),
    _Field("wait_name", _text, NULLABLE),
    _Field("wake_at", _time, NULLABLE),
    _Field("parent_id", _identifier("workflow id"), NULLABLE),
    _Field("deadline_at", _time, NULLABLE),
    _Field("run_started_at", _time, DEFAULTED),
    _Field("diverged", _json_object, NULLABLE),
    _Field("diverged_versions", _texts, DEFAULTED),
    _Field("accepted_versions", _texts, DEFAULTED),
    _Field("dedup_id", _identifier("dedup id"), NULLABLE),
    _Field("partition_key", _identifier("partition key"), NULLABLE),
    _Field("edits", _json_objects, NULLABLE),
)
_STEP = (
    _Field("seq", _integer(0)),
    _Field("name", _identifier("step name")),
    _Field("status", _one_of(*StepStatus)),
    _Field("inputs", _json, NULLABLE),
    _Field("output", _json, NULLABLE),
    _Field("error", _json, NULLABLE),
    _Field("attempts", _integer(1)),
    _Field("started_at", _time),
    _Field("finished_at", _time, NULLABLE),
    _Field("retry", _json_object, NULLABLE),
    _Field("events", _event_values, NULLABLE),
)
_MESSAGE = (
    _Field("topic", _topic, null="must be a string: the default topic is stored as '', not null"),
    _Field("message", _json),
    _Field("idempotency_key", _identifier("idempotency key"), NULLABLE),
    _Field("created_at", _time),
    _Field("consumed_seq", _integer(0), NULLABLE),
    _Field("consumed_at", _time, NULLABLE),
)
_EVENT = (
    _Field("key", _identifier("event key")),
    _Field("value", _json),
    _Field("updated_at", _time),
)
_STREAM = (
    _Field("key", _identifier("stream key")),
    _Field("offset", _integer(0)),
    _Field("kind", _one_of("value", "reset", "close")),
    _Field("value", _json, NULLABLE),
    _Field("step_seq", _integer(-_INT_MAX - 1), NULLABLE),
    _Field("attempt", _integer(-_INT_MAX - 1), NULLABLE),
    _Field("attempt_id", _text, NULLABLE),
    _Field("created_at", _time),
)
_APPROVAL = (
    _Field("seq", _integer(0)),
    _Field("tool", _text),
    _Field("arguments", _json),
    _Field("digest", _text),
    _Field("status", _one_of("PENDING", "APPROVED", "REJECTED")),
    _Field("reason", _text, NULLABLE),
    _Field("requested_at", _time),
    _Field("decided_at", _time, NULLABLE),
)

#: The fields of each part of a document, by the table they go to.
COLUMNS: dict[str, tuple[str, ...]] = {
    table: tuple(f.name for f in fields)
    for table, fields in (
        ("workflows", _WORKFLOW),
        ("steps", _STEP),
        ("messages", _MESSAGE),
        ("events", _EVENT),
        ("streams", _STREAM),
        ("approvals", _APPROVAL),
    )
}
#: The columns an export leaves out (the import sets them): with :data:`COLUMNS`, every
#: column of the table (tests/process/test_import_checks.py holds the schema to it).
OMITTED: dict[str, tuple[str, ...]] = {
    "workflows": ("owner_key",),
    "steps": ("workflow_id",),
    "messages": ("message_id", "destination_id"),
    "events": ("workflow_id",),
    "streams": ("workflow_id",),
    "approvals": ("workflow_id",),
}
_PARTS = {
    "steps": _STEP,
    "messages": _MESSAGE,
    "events": _EVENT,
    "streams": _STREAM,
    "approvals": _APPROVAL,
}
_FINISHED_WITHOUT_OUTPUT = ("ERROR", "CANCELLED", "MAX_RECOVERY_ATTEMPTS_EXCEEDED", "IN_DOUBT")


# -- documents ---------------------------------------------------------------------------


def load_history(
    document: str, where: str, max_checkpoint_bytes: int = DEFAULT_MAX_CHECKPOINT_BYTES
) -> dict[str, Any]:
    """One line of an export as a document that meets every rule; InvalidHistoryError
    naming ``where`` (file and line) and the field otherwise."""
    try:
        doc = _Rules(max_checkpoint_bytes).document(_parse(document))
    except _Refused as exc:
        at = f", {exc.field}" if exc.field else ""
        raise InvalidHistoryError(f"{where}{at}: {exc.problem}") from None
    return doc


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _parse(document: str) -> Any:
    try:
        return json.loads(document, parse_constant=_refuse_constant)
    except RecursionError:
        raise _Refused(
            _deep_field(document), f"is nested deeper than {MAX_JSON_DEPTH} levels"
        ) from None
    except json.JSONDecodeError as exc:
        raise _Refused("", f"not JSON ({exc.msg} at column {exc.colno})") from None
    except ValueError as exc:  # NaN, Infinity, an integer of thousands of digits
        raise _Refused("", f"not JSON that can be stored ({exc})") from None


_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{},:]')


def _deep_field(document: str) -> str:
    """The field holding the first value nested too deeply to parse (read without
    recursion: its top levels, e.g. ``steps[2].output``)."""
    path: list[str | int] = []
    key: str | None = None
    for match in _TOKEN.finditer(document):
        token = match.group()
        if token in "[{":
            if len(path) > MAX_JSON_DEPTH:
                break
            path.append(0 if token == "[" else "")
        elif token in "]}":
            if path:
                path.pop()
        elif token == ",":
            if path and isinstance(path[-1], int):
                path[-1] += 1
        elif token == ":":
            if path and key is not None:
                path[-1] = key
        else:
            try:
                key = json.loads(token)
            except ValueError:
                key = token
    parts = path[:3]
    shown = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts)
    return shown.lstrip(".")


class _Rules:
    """The checks of one document (``max_checkpoint_bytes``: the size limit of a value)."""

    def __init__(self, max_checkpoint_bytes: int) -> None:
        self.limit = max_checkpoint_bytes

    def document(self, doc: Any) -> dict[str, Any]:
        """``doc``, once it meets every rule."""
        if not isinstance(doc, dict):
            raise _Refused("", f"not a {HISTORY_FORMAT} document (a JSON {_kind(doc)})")
        if doc.get("format") != HISTORY_FORMAT:
            raise _Refused("format", f"not a {HISTORY_FORMAT} document")
        unknown = sorted(set(doc) - {"format", "workflow", *_PARTS})
        if unknown:
            raise _Refused(unknown[0], "unknown part of a history document")
        if "workflow" not in doc:
            raise _Refused("workflow", "missing")
        workflow = doc["workflow"]
        self.row(workflow, _WORKFLOW, "workflow", "workflows")
        self.workflow(workflow)
        for part, fields in _PARTS.items():
            rows = doc.get(part, [])
            if not isinstance(rows, list):
                raise _Refused(part, f"must be a list, got {_kind(rows)}")
            for i, row in enumerate(rows):
                self.row(row, fields, f"{part}[{i}]", part)
                getattr(self, part)(row, f"{part}[{i}]")
        self.unique(doc, "steps", lambda s: s["seq"], "step number (seq)")
        self.unique(doc, "events", lambda e: e["key"], "event key")
        self.unique(doc, "streams", lambda t: (t["key"], t["offset"]), "offset")
        self.unique(doc, "approvals", lambda a: a["seq"], "approval seq")
        self.unique(doc, "messages", lambda m: m.get("idempotency_key"), "idempotency key")
        return doc

    def row(self, row: Any, fields: Iterable[_Field], at: str, table: str) -> None:
        """Types, presence and sizes of one row's fields; no field the table lacks."""
        if not isinstance(row, dict):
            raise _Refused(at, f"must be a JSON object, got {_kind(row)}")
        known = {f.name for f in fields}
        unknown = sorted(set(row) - known)
        if unknown:
            raise _Refused(
                f"{at}.{unknown[0]}",
                f"unknown field (not a column of dbos_agent.{table} that an export holds)",
            )
        for f in fields:
            field = f"{at}.{f.name}"
            if f.name not in row:
                if f.need == REQUIRED:
                    raise _Refused(field, "missing")
                continue
            value = row[f.name]
            if value is None:
                if f.need != NULLABLE:
                    raise _Refused(field, f.null)
                continue
            f.check(value, field)
            if f.check in (_json, _json_object):
                self.size(value, field)
            elif f.check is _event_values:  # each value was within the limit when set
                for key, item in value.items():
                    self.size(item, f"{field}.{key}")

    def size(self, value: Any, field: str) -> None:
        """The checkpoint size limit, as the engine checks what it writes."""
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        try:
            check_checkpoint_size(text, field, self.limit)
        except CheckpointTooLargeError as exc:
            raise _Refused(
                field,
                f"the value is {exc.size:,} bytes of JSON, over the checkpoint limit of "
                f"{exc.limit:,} bytes (launch(max_checkpoint_bytes=...)); for a database "
                "whose processes launch with a larger one, import --max-checkpoint-bytes N",
            ) from None

    def workflow(self, w: dict[str, Any]) -> None:
        """The CHECK constraints of dbos_agent.workflows."""
        status = w["status"]
        output, error = w.get("output"), w.get("error")
        if status in ("PENDING", "ENQUEUED", "SUSPENDED", "DIVERGED"):
            if output is not None or error is not None:
                raise _Refused(
                    "workflow.output" if output is not None else "workflow.error",
                    f"must be null for a {status} workflow (it has not finished)",
                )
        elif status == "SUCCESS":
            if error is not None:
                raise _Refused("workflow.error", "must be null for a SUCCESS workflow")
            if w.get("finished_at") is None:
                raise _Refused("workflow.finished_at", "missing for a SUCCESS workflow")
        elif status in _FINISHED_WITHOUT_OUTPUT and output is not None:
            raise _Refused("workflow.output", f"must be null for a {status} workflow")
        if status == "DIVERGED":
            self.divergence(w.get("diverged"))
        kind = w.get("wait_kind")
        if (status == "SUSPENDED") != (kind is not None):
            raise _Refused(
                "workflow.wait_kind",
                "missing for a SUSPENDED workflow (what wakes it)"
                if kind is None
                else f"must be null for a {status} workflow (only a SUSPENDED one waits)",
            )
        needs = {
            "wake_at": ("sleep", "retry"),
            "wait_name": ("recv", "event", "retry"),
            "wait_target": ("event", "child"),
        }
        for column, kinds in needs.items():
            if kind in kinds and w.get(column) is None:
                raise _Refused(f"workflow.{column}", f"missing for a {kind!r} wait")
        if (w.get("forked_from") is None) != (w.get("forked_from_step") is None):
            raise _Refused(
                "workflow.forked_from_step", "forked_from and forked_from_step go together"
            )

    def divergence(self, diverged: Any) -> None:
        """A DIVERGED workflow says where and how (what ``workflows show`` reads)."""
        if diverged is None:
            raise _Refused("workflow.diverged", "missing for a DIVERGED workflow")
        _integer(0)(diverged.get("position"), "workflow.diverged.position")
        for key in ("recorded", "called"):
            _text(diverged.get(key), f"workflow.diverged.{key}")

    def steps(self, s: dict[str, Any], at: str) -> None:
        """The CHECK constraints of dbos_agent.steps (RETRYING: migration 023)."""
        status, finished = s["status"], s.get("finished_at")
        output, error, retry = s.get("output"), s.get("error"), s.get("retry")
        if status == "SUCCESS":
            if error is not None:
                raise _Refused(f"{at}.error", "must be null for a SUCCESS step")
            if finished is None:
                raise _Refused(f"{at}.finished_at", "missing for a SUCCESS step")
        elif status == "ERROR":
            if error is None:
                raise _Refused(f"{at}.error", "missing for an ERROR step")
            if output is not None:
                raise _Refused(f"{at}.output", "must be null for an ERROR step")
            if finished is None:
                raise _Refused(f"{at}.finished_at", "missing for an ERROR step")
        else:  # PENDING (an intent) or RETRYING: not finished
            if output is not None:
                raise _Refused(f"{at}.output", f"must be null for a {status} step")
            if finished is not None:
                raise _Refused(f"{at}.finished_at", f"must be null for a {status} step")
            if status == "PENDING" and error is not None:
                raise _Refused(f"{at}.error", "must be null for a PENDING step")
            if status == "RETRYING" and error is None:
                raise _Refused(f"{at}.error", "missing for a RETRYING step (its last error)")
        if (status == "RETRYING") != (retry is not None):
            raise _Refused(
                f"{at}.retry",
                "missing for a RETRYING step (since, next_at)"
                if retry is None
                else f"must be null for a {status} step",
            )
        if retry is not None:
            for key in ("since", "next_at"):
                value = retry.get(key)
                if isinstance(value, bool) or not isinstance(value, int | float):
                    raise _Refused(f"{at}.retry.{key}", f"must be a number, got {_kind(value)}")
        if s.get("events") is not None and status != "SUCCESS":  # migration 031
            raise _Refused(f"{at}.events", f"must be null for a {status} step")

    def messages(self, m: dict[str, Any], at: str) -> None:
        if (m.get("consumed_seq") is None) != (m.get("consumed_at") is None):
            raise _Refused(f"{at}.consumed_at", "consumed_seq and consumed_at go together")

    def events(self, e: dict[str, Any], at: str) -> None:
        pass  # types and presence say it all

    def streams(self, t: dict[str, Any], at: str) -> None:
        if (t["kind"] == "value") != (t.get("value") is not None):
            raise _Refused(
                f"{at}.value",
                "missing for a 'value' item" if t["kind"] == "value" else
                f"must be null for a {t['kind']!r} item",
            )  # fmt: skip

    def approvals(self, a: dict[str, Any], at: str) -> None:
        if (a["status"] == "PENDING") != (a.get("decided_at") is None):
            raise _Refused(
                f"{at}.decided_at",
                "must be null for a PENDING approval" if a["status"] == "PENDING" else
                f"missing for an {a['status']} approval",
            )  # fmt: skip

    def unique(self, doc: dict[str, Any], part: str, key: Callable[[Any], Any], what: str) -> None:
        """No two rows of ``part`` with the same ``key`` (None: no key, never a clash)."""
        seen: dict[Any, int] = {}
        for i, row in enumerate(doc.get(part, [])):
            value = key(row)
            if value is None:
                continue
            if value in seen:
                raise _Refused(f"{part}[{i}]", f"{what} {value!r} again (as {part}[{seen[value]}])")
            seen[value] = i

"""Recorded exceptions: what a failed step or workflow leaves in the log, and how it is
raised again on replay.

An exception is stored as ``{"type", "message", "args", "traceback"}`` and rebuilt only
from classes the process has already imported: a database row never decides which code
gets loaded. Apart from the value codecs (serialization.py) because it shares nothing with
them: no pydantic, no annotations, only the error's own type and text.
"""

from __future__ import annotations

import json
import sys
import traceback
from typing import Any

from .errors import RecordedError

__all__ = ["dumps_error", "error_from_json", "loads_error"]

_MAX_TRACEBACK_CHARS = 20_000
#: A recorded error keeps this much of its message and arguments: enough to read it,
#: never enough to pass the checkpoint limit.
_MAX_ERROR_TEXT_CHARS = 64_000


def _jsonable_args(args: tuple[Any, ...]) -> list[Any] | None:
    """The exception's args if they are small, plain JSON; None otherwise."""
    try:
        text = json.dumps(list(args), allow_nan=False)
    except (TypeError, ValueError):
        return None
    return list(args) if len(text) <= _MAX_ERROR_TEXT_CHARS else None


def _clipped(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... [{len(text) - limit:,} more characters not recorded]"


def dumps_error(exc: BaseException) -> str:
    """A recorded exception as JSON text: type, message, args and traceback.

    Long messages and arguments are clipped, so an error always fits the checkpoint
    limit: the record is for reading and for raising the same type again.
    """
    cls = type(exc)
    message = _clipped(str(exc), _MAX_ERROR_TEXT_CHARS)
    args = _jsonable_args(exc.args)
    tb = "".join(traceback.format_exception(exc))[-_MAX_TRACEBACK_CHARS:]
    return json.dumps(
        {
            "type": f"{cls.__module__}.{cls.__qualname__}",
            "message": message,
            "args": args if args is not None else [message],
            "traceback": tb,
        }
    )


def _find_exception_class(type_name: str) -> type[BaseException] | None:
    """The already-imported exception class named ``module.QualName``, if any."""
    parts = type_name.split(".")
    for split in range(len(parts) - 1, 0, -1):
        module = sys.modules.get(".".join(parts[:split]))
        if module is None:
            continue
        obj: Any = module
        for attr in parts[split:]:
            obj = getattr(obj, attr, None)
        if isinstance(obj, type) and issubclass(obj, Exception):
            return obj
        return None
    return None


def error_from_json(data: dict[str, Any]) -> BaseException:
    """Rebuild a recorded exception: the same type and message when the class is known."""
    type_name = str(data.get("type", "builtins.Exception"))
    message = str(data.get("message", ""))
    args = data.get("args")
    args = tuple(args) if isinstance(args, list) else (message,)
    cls = _find_exception_class(type_name)
    if cls is None:
        return RecordedError(type_name, message)
    try:
        exc = cls(*args)
        if str(exc) == message:
            return exc
    except Exception:
        pass
    # The constructor wants something else (e.g. an HTTP response): build the
    # instance without it, keeping the type, args and message.
    exc = cls.__new__(cls, *args)
    exc.args = args
    if str(exc) != message:
        exc.args = (message,)
    return exc


def loads_error(text: str) -> BaseException:
    """Rebuild a recorded exception from its JSON text."""
    data = json.loads(text)
    if not isinstance(data, dict):
        return RecordedError("builtins.Exception", str(data))
    return error_from_json(data)

"""JSON checkpoints through pydantic, never pickle.

A value is written with the pydantic ``TypeAdapter`` of the annotation it was
declared with, and read back through the same adapter, so a step annotated
``-> anthropic.types.Message`` returns a ``Message`` on replay as it did live.
Exceptions are recorded by :mod:`dbos_agent._errors_codec` (their names are kept here too,
where they used to live).
"""

from __future__ import annotations

import datetime
import decimal
import inspect
import json
import logging
import math
import typing
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from functools import lru_cache
from typing import Any

from pydantic import TypeAdapter, ValidationError
from pydantic.errors import PydanticUserError
from pydantic_core import PydanticSerializationError

from ._errors_codec import dumps_error, error_from_json, loads_error
from .errors import SerializationError, WorkflowInputsError

__all__ = [
    "Codec",
    "InputsCodec",
    "codec_for",
    "dumps_error",
    "error_from_json",
    "loads_error",
    "result_codec",
]

log = logging.getLogger(__name__)


def _unserializable(value: Any, where: str, cause: Exception) -> SerializationError:
    if inspect.iscoroutine(value) or inspect.isawaitable(value):
        return SerializationError(
            f"{where}: got a coroutine ({getattr(value, '__qualname__', type(value).__name__)}), "
            f"not a value: an async function was called without await. An async step must "
            f"be awaited in an async workflow (or make the step a plain def)."
        )
    return SerializationError(
        f"{where}: cannot store a value of type {type(value).__qualname__} as JSON "
        f"({cause}). Use JSON-friendly values: pydantic models, dataclasses, "
        f"TypedDicts, lists/dicts of them, str, numbers, bool, None."
    )


def _non_finite_path(data: Any) -> str | None:
    """Where a NaN or infinity hides in plain data (``$.a[2]``), or None."""
    stack: list[tuple[Any, str]] = [(data, "$")]
    while stack:
        value, path = stack.pop()
        if isinstance(value, float):
            if not math.isfinite(value):
                return path
        elif isinstance(value, dict):
            stack.extend((v, f"{path}[{k!r}]") for k, v in value.items())
        elif isinstance(value, list | tuple | set | frozenset):
            stack.extend((v, f"{path}[{i}]") for i, v in enumerate(value))
    return None


def _non_finite_error(where: str, path: str) -> SerializationError:
    return SerializationError(
        f"{where}: cannot store NaN or infinity (at {path}): JSON has no such numbers, and "
        f"storing null instead would make replay return something else than the live run. "
        f"Use None, a string, or a finite number."
    )


#: Types that JSON turns into something else: without an annotation saying what they
#: are, replay returns a list, a string or a number instead (docs/failures/limits.md).
_LOSSY_WITHOUT_ANNOTATION = (
    set,
    frozenset,
    tuple,
    bytes,
    datetime.datetime,
    datetime.date,
    datetime.time,
    datetime.timedelta,
    decimal.Decimal,
    uuid.UUID,
)
_warned_lossy: set[type] = set()


def _warn_if_lossy(value: Any, where: str) -> None:
    """Say once per type that an unannotated value will not come back as itself."""
    cls = type(value)
    if cls in _warned_lossy or not isinstance(value, _LOSSY_WITHOUT_ANNOTATION):
        return
    _warned_lossy.add(cls)
    log.warning(
        "%s: a %s without a type annotation is stored as JSON and replays as %s, not as "
        "a %s; annotate the function's return (or parameter) with its type to get it back",
        where,
        cls.__qualname__,
        "a list" if isinstance(value, set | frozenset | tuple) else "a string or a number",
        cls.__qualname__,
    )


class Codec:
    """Turns values of one annotation into JSON text and back."""

    __slots__ = ("_adapter", "annotation")

    def __init__(self, annotation: Any) -> None:
        try:
            self._adapter: TypeAdapter[Any] = TypeAdapter(annotation)
        except PydanticUserError as exc:  # e.g. a class pydantic cannot describe
            log.warning(
                "values annotated %r cannot be validated by pydantic (%s); they are stored "
                "as plain JSON and come back from replay as plain JSON data",
                annotation,
                exc.message,
            )
            annotation = Any
            self._adapter = TypeAdapter(Any)
        self.annotation = annotation

    def check_finite(self, value: Any, where: str) -> None:
        """Refuse NaN and infinities, which pydantic would silently store as null."""
        if isinstance(value, str | int | bool) or value is None:
            return
        try:
            data = self._adapter.dump_python(value, mode="python", warnings=False)
        except (PydanticSerializationError, TypeError, ValueError):
            return  # dumping as JSON will name the real problem
        path = _non_finite_path(data)
        if path is not None:
            raise _non_finite_error(where, path)

    def to_jsonable(self, value: Any, where: str) -> Any:
        """``value`` as plain JSON data (dicts, lists, str, numbers, bool, None)."""
        _refuse_one_shot(value, where)
        try:
            data = self._adapter.dump_python(value, mode="json", warnings=False)
        except (PydanticSerializationError, TypeError, ValueError) as exc:
            raise _unserializable(value, where, exc) from exc
        self.check_finite(value, where)
        return data

    def dumps(self, value: Any, where: str) -> str:
        """``value`` as JSON text; raises :class:`SerializationError` naming ``where``."""
        _refuse_one_shot(value, where)
        try:
            out = self._adapter.dump_json(value, warnings=False)
        except (PydanticSerializationError, TypeError, ValueError) as exc:
            raise _unserializable(value, where, exc) from exc
        if b"null" in out:  # where a NaN would have gone: look closer
            self.check_finite(value, where)
        if self.annotation is Any:
            _warn_if_lossy(value, where)
        return out.decode()

    def from_jsonable(self, data: Any, where: str) -> Any:
        """Rebuild the annotated type from plain JSON data."""
        try:
            return self._adapter.validate_python(data)
        except ValidationError as exc:
            raise SerializationError(
                f"{where}: the recorded value no longer fits {self.annotation!r}: {exc}"
            ) from exc

    def loads(self, text: str, where: str) -> Any:
        """Rebuild the annotated type from JSON text."""
        try:
            return self._adapter.validate_json(text)
        except ValidationError as exc:
            raise SerializationError(
                f"{where}: the recorded value no longer fits {self.annotation!r}: {exc}"
            ) from exc


def _refuse_one_shot(value: Any, where: str) -> None:
    """A generator (any iterator, sync or async) is refused: storing it would consume
    it, so the live caller would get it empty while the log holds a list."""
    if isinstance(value, (Iterator, AsyncIterator)):
        raise SerializationError(
            f"{where}: a {type(value).__name__} cannot be checkpointed: it can be read "
            "only once, so recording it would leave the caller an exhausted one; return "
            "a list (list(...)) instead"
        )


@lru_cache(maxsize=4096)
def _cached_codec(annotation: Any) -> Codec:
    return Codec(annotation)


def codec_for(annotation: Any) -> Codec:
    """The (cached) codec of an annotation; a missing annotation means ``Any``."""
    if annotation is inspect.Parameter.empty:
        annotation = Any
    try:
        return _cached_codec(annotation)
    except TypeError:  # unhashable annotation objects are rare but legal
        return Codec(annotation)


def _type_hints(fn: Callable[..., Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn, include_extras=True)
    except Exception:  # unresolvable forward references: fall back to untyped JSON
        return {}


def result_codec(fn: Callable[..., Any]) -> Codec:
    """Codec for what ``fn`` returns (``Any`` when unannotated)."""
    return codec_for(_type_hints(fn).get("return", Any))


class InputsCodec:
    """Stores a call's bound arguments as ``{"param": value}`` JSON, and rebuilds the call.

    Binding to the signature first means ``f(1, y=2)`` and ``f(1, 2)`` store the
    same inputs, which idempotent start relies on.
    """

    def __init__(self, fn: Callable[..., Any], qualname: str) -> None:
        self._qualname = qualname
        self._signature = inspect.signature(fn)
        hints = _type_hints(fn)
        self._codecs: dict[str, Codec] = {}
        for name, param in self._signature.parameters.items():
            annotation = hints.get(name, Any)
            if param.kind is inspect.Parameter.VAR_POSITIONAL:
                annotation = list[annotation]  # type: ignore[valid-type]
            elif param.kind is inspect.Parameter.VAR_KEYWORD:
                annotation = dict[str, annotation]  # type: ignore[valid-type]
            self._codecs[name] = codec_for(annotation)

    def dumps(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """The call's inputs as JSON text; a bad call raises ``TypeError`` like Python does."""
        bound = self._signature.bind(*args, **kwargs)
        data = {
            name: self._codecs[name].to_jsonable(value, f"{self._qualname} argument {name!r}")
            for name, value in bound.arguments.items()
        }
        return json.dumps(data, separators=(",", ":"))

    @staticmethod
    def dumps_unbound(args: tuple[Any, ...], kwargs: dict[str, Any], where: str) -> str:
        """A call's inputs as JSON text where the function is not at hand (a client
        enqueues by name): ``{"$args": [...], "$kwargs": {...}}``, stored unbound and bound
        to the signature by :meth:`loads` in the process that runs it."""
        data = {
            "$args": codec_for(Any).to_jsonable(list(args), where),
            "$kwargs": codec_for(Any).to_jsonable(kwargs, where),
        }
        return json.dumps(data, separators=(",", ":"))

    def _bind_unbound(self, data: dict[str, Any], where: str) -> dict[str, Any]:
        """Bind ``{"$args": [...], "$kwargs": {...}}`` (from a client that lacks the
        function) to the signature, giving the usual ``{"param": value}`` form."""
        args, kwargs = data.get("$args", []), data.get("$kwargs", {})
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            raise WorkflowInputsError(f"{where}: malformed $args/$kwargs inputs")
        try:
            return dict(self._signature.bind(*args, **kwargs).arguments)
        except TypeError as exc:
            raise WorkflowInputsError(f"{where}: the enqueued arguments do not fit: {exc}") from exc

    def bound_data(self, text: str, workflow_id: str) -> dict[str, Any]:
        """Recorded inputs as ``{"param": JSON value}``, an enqueued call's unbound
        ``$args``/``$kwargs`` bound to the signature; WorkflowInputsError if they do not
        bind."""
        where = f"workflow {workflow_id!r} ({self._qualname})"
        data = json.loads(text)
        if not isinstance(data, dict):
            raise WorkflowInputsError(f"{where}: recorded inputs are not a JSON object")
        if set(data) <= {"$args", "$kwargs"} and data:
            return self._bind_unbound(data, where)
        return dict(data)

    def loads(self, text: str, workflow_id: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Rebuild ``(args, kwargs)`` from recorded inputs, or raise WorkflowInputsError."""
        where = f"workflow {workflow_id!r} ({self._qualname})"
        data = self.bound_data(text, workflow_id)
        unknown = sorted(set(data) - set(self._codecs))
        if unknown:
            raise WorkflowInputsError(
                f"{where}: the recorded inputs name parameters the function no longer has: "
                f"{', '.join(unknown)}"
            )
        arguments: dict[str, Any] = {}
        for name, param in self._signature.parameters.items():
            if name in data:
                try:
                    arguments[name] = self._codecs[name].from_jsonable(
                        data[name], f"{where} argument {name!r}"
                    )
                except SerializationError as exc:
                    raise WorkflowInputsError(str(exc)) from exc
            elif param.default is inspect.Parameter.empty and param.kind not in (
                inspect.Parameter.VAR_POSITIONAL,
                inspect.Parameter.VAR_KEYWORD,
            ):
                raise WorkflowInputsError(
                    f"{where}: no recorded value for the required parameter {name!r}"
                )
        bound = inspect.BoundArguments(self._signature, arguments)
        return bound.args, bound.kwargs

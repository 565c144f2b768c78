"""The limits of what dbos_agent stores, and the checks that name a value breaking them.

Identifiers (workflow ids, topics, event keys, idempotency keys, names) live in btree
indexes, whose entries Postgres caps at about 2.7 kB *after* compression: an id that
fits one day and not the next depends on how well it compresses. A fixed byte limit,
checked before anything is sent, makes the rule plain and the error clear.
"""

from __future__ import annotations

import hashlib
import math

from .errors import CheckpointTooLargeError, InvalidIdentifierError

#: Bytes (UTF-8) of a workflow id, topic, event key, idempotency key, queue or step name.
#: Two of them share one index entry (e.g. workflow id + event key) well under 2.7 kB.
MAX_IDENTIFIER_BYTES = 1000

#: Default largest JSON value one checkpoint may hold (a step output, a workflow's
#: inputs or output, a message, an event). A million-token context is about 4 MB of
#: text, so an agent's model replies and tool results fit with room to spare; a value
#: past this is nearly always a whole file or a binary blob checkpointed by mistake,
#: and it would be read back on every replay.
DEFAULT_MAX_CHECKPOINT_BYTES = 16 * 1024 * 1024

#: Deepest nesting of arrays and objects in a JSON value that comes from outside the
#: engine (``dbos-agent import``). The engine cannot write a deeper one (pydantic
#: serializes at most 255 levels) and Python's JSON parser gives up near 1,000: this
#: accepts whatever the engine wrote and refuses, by name, what could not be read back.
MAX_JSON_DEPTH = 512


def check_identifier(value: object, what: str) -> str:
    """Return ``value`` if it is a usable identifier, else raise InvalidIdentifierError.

    ``what`` names it in the message, e.g. ``"workflow id"`` or ``"recv topic"``.
    """
    if not isinstance(value, str):
        raise InvalidIdentifierError(f"a {what} must be a string, got {type(value).__name__}")
    if not value:
        raise InvalidIdentifierError(f"a {what} must not be empty")
    if value.isspace():  # as DBOS refuses it: an id no one can tell from another when shown
        raise InvalidIdentifierError(f"a {what} must not be only whitespace: {value!r}")
    if "\x00" in value:
        raise InvalidIdentifierError(
            f"a {what} must not contain a NUL character (\\x00): {value[:60]!r}"
        )
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > MAX_IDENTIFIER_BYTES:
        raise InvalidIdentifierError(
            f"a {what} may be at most {MAX_IDENTIFIER_BYTES} bytes (UTF-8), got {size} "
            f"bytes: {value[:60]!r}..."
        )
    return value


def check_checkpoint_size(text: str, where: str, limit: int) -> None:
    """Raise CheckpointTooLargeError naming ``where`` when the JSON ``text`` is over
    ``limit`` bytes (UTF-8): the one rule for every value written, checked before it is."""
    if len(text) * 4 > limit:  # only then can it be over the limit: count the bytes
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > limit:
            raise CheckpointTooLargeError(where, size, limit)


#: Queue priorities are Postgres ``integer``s; lower runs first, 0 is the default.
MAX_PRIORITY = 2**31 - 1


def check_priority(priority: int | None, queue: str) -> int:
    """A queue priority: an int from 0 (the default, first) to :data:`MAX_PRIORITY`."""
    if priority is None:
        return 0
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise TypeError(f"queue {queue!r}: priority must be an int, got {priority!r}")
    if not 0 <= priority <= MAX_PRIORITY:
        raise ValueError(
            f"queue {queue!r}: priority must be between 0 and {MAX_PRIORITY} "
            f"(lower runs first), got {priority}"
        )
    return priority


def check_topic(topic: str | None, what: str = "message topic") -> str | None:
    """A message topic: None names the default topic; an empty one is refused, as every
    empty identifier is (it is not silently the default)."""
    return None if topic is None else check_identifier(topic, what)


def derived_identifier(base: str, suffix: str) -> str:
    """``base + suffix`` (a child workflow's id), shortened to a stable digest when the
    result would pass the limit: the same inputs give the same id on every replay."""
    joined = base + suffix
    if len(joined.encode("utf-8", "surrogatepass")) <= MAX_IDENTIFIER_BYTES:
        return joined
    digest = hashlib.sha256(base.encode("utf-8", "surrogatepass")).hexdigest()
    return f"sha256:{digest}{suffix}"


#: The longest delay of a start, in seconds (about 31 years, as workflow_timeout's bound):
#: a time that far on is a mistake, and one past Postgres's timestamps could not be stored.
MAX_DELAY_SECONDS = 1e9


def check_delay(delay: float | None) -> float | None:
    """A start's ``delay`` (seconds): None, or a finite number from 0 to
    :data:`MAX_DELAY_SECONDS`."""
    if delay is None:
        return None
    if isinstance(delay, bool) or not isinstance(delay, int | float) or not math.isfinite(delay):
        raise ValueError(f"delay must be a finite number of seconds, got {delay!r}")
    if delay < 0:
        raise ValueError(f"delay must be >= 0 seconds, got {delay}")
    if delay > MAX_DELAY_SECONDS:
        raise ValueError(
            f"delay must be at most {MAX_DELAY_SECONDS:.0e} seconds (about 31 years), got {delay!r}"
        )
    return float(delay)

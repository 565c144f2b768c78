"""launch()'s options said once (_engine/launch_options.py, the engine's own in
runtime/collaborators.py): the keyword form is the dataclass's constructor (launch's
signature for type checkers), bad values fail when the options are made, an unknown option
is a TypeError naming it.

No Postgres here (``pytest tests/unit``): every refusal comes before a connection."""

from __future__ import annotations

from dataclasses import fields
from datetime import timedelta

import pytest

import dbos_agent as da
from dbos_agent._engine.launch_options import LaunchOptions, _LaunchCall
from dbos_agent._engine.runtime.collaborators import EngineOptions

#: launch()'s keywords before LaunchOptions: every one still works.
KEYWORDS = {
    "executor_id",
    "app_version",
    "recover",
    "workers",
    "pool_size",
    "lease_seconds",
    "session_grace",
    "outage_timeout",
    "max_checkpoint_bytes",
    "run_queues",
    "retention",
    "take_over",
    "take_over_every",
    "suspend_after",
    "wake_suspended",
    "async_runs",
    "run_schedules",
    # issue 33: a pooled database URL beside a direct one, and how wake-ups come
    "session_url",
    "listen",
    "poll_interval",
}


def test_the_keyword_form_is_the_dataclass() -> None:
    assert {f.name for f in fields(LaunchOptions)} == KEYWORDS
    assert {f.name for f in fields(EngineOptions)} < KEYWORDS
    launch_parameters = [f.name for f in fields(_LaunchCall) if not f.kw_only]
    assert launch_parameters == ["database_url", "options"]
    assert {f.name for f in fields(_LaunchCall) if f.kw_only} == KEYWORDS
    assert da.LaunchOptions is LaunchOptions


def test_bad_values_fail_when_made() -> None:
    with pytest.raises(ValueError, match="take_over_every must be > 0"):
        LaunchOptions(take_over_every=0)
    with pytest.raises(ValueError, match="positive duration"):
        LaunchOptions(retention=timedelta(0))
    with pytest.raises(ValueError, match="suspend_after must be >= 0"):
        LaunchOptions(suspend_after=-1)
    with pytest.raises(ValueError, match="poll_interval must be > 0"):
        LaunchOptions(poll_interval=0)
    with pytest.raises(ValueError, match="take_over_every must be > 0"):
        da.launch("postgresql://nowhere.invalid/db", LaunchOptions(), take_over_every=-1)


def test_an_unknown_option_is_a_type_error_naming_it() -> None:
    with pytest.raises(TypeError, match=r"unknown options \['wokers'\]"):
        da.launch("postgresql://nowhere.invalid/db", wokers=2)  # type: ignore[call-arg]


def test_options_are_frozen() -> None:
    options = LaunchOptions(workers=2)
    with pytest.raises(AttributeError):
        options.workers = 3  # type: ignore[misc]


def test_take_over_follows_recover_unless_given() -> None:
    """``recover=False`` resumes nothing the process did not start: no take-over either,
    unless ``take_over=True`` says so (and ``take_over=False`` holds with recovery on)."""
    assert LaunchOptions().takes_over
    assert not LaunchOptions(recover=False).takes_over
    assert LaunchOptions(recover=False, take_over=True).takes_over
    assert not LaunchOptions(take_over=False).takes_over

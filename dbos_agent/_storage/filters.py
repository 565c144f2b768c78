"""Which workflows a listing or a bulk action is about, as SQL: a
:class:`~dbos_agent.records.WorkflowFilter`'s fields given, and only those, joined with AND.

Each combination is its own statement with its own plan, which walks the index of its
filter (workflows_by_status, workflows_by_name, workflows_by_created) instead of a
generic plan for "the parameter is NULL or matches" that can use none. A field is the
equality of the column of its name, but for the fragments below.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ..records import WorkflowFilter

#: The fields that are not a column's equality; each one's parameter is its name.
_FRAGMENTS: dict[str, str] = {
    "created_after": "created_at >= %(created_after)s",
    "created_before": "created_at < %(created_before)s",
    "older_than": "created_at < dbos_agent.now() - %(older_than)s",
}


def filter_params(selection: WorkflowFilter) -> dict[str, Any]:
    """The fields given, by name: the statement's parameters."""
    return {
        field.name: value
        for field in dataclasses.fields(selection)
        if (value := getattr(selection, field.name)) is not None
    }


def filter_sql(selection: WorkflowFilter) -> str:
    """The WHERE condition of the fields given (``true`` for none)."""
    return conditions(filter_params(selection))


def conditions(given: Mapping[str, Any]) -> str:
    """The WHERE condition of the filters ``given`` (a field's name, or ``workflow_id``
    for a read by id), each its fixed fragment, joined with AND (``true`` for none)."""
    return " AND ".join(_FRAGMENTS.get(name, f"{name} = %({name})s") for name in given) or "true"

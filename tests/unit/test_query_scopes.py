"""Every named query says its scope: which rows it may touch (see queries.sql's header).

Whether a statement stays on one workflow's rows decides whether it can go to one shard,
so a query without its tag (or with two, or a misspelt one) fails here, not in a review.
No Postgres here.
"""

from __future__ import annotations

import pytest

from dbos_agent._storage.sql_files import SCOPES, queries, queries_text, query_scopes


def test_every_named_query_has_exactly_one_valid_scope() -> None:
    scopes = query_scopes(queries_text())
    assert set(scopes) == set(queries())
    wrong = {name: found for name, found in scopes.items() if len(found) != 1}
    assert wrong == {}, f"queries without exactly one '-- scope:' line: {wrong}"
    unknown = {name: found[0] for name, found in scopes.items() if found[0] not in SCOPES}
    assert unknown == {}, f"scopes must be one of {SCOPES}: {unknown}"


def test_the_tag_is_read_per_query() -> None:
    text = (
        "-- header\n--   -- scope: many (an example, not a query)\n"
        "-- name: a\n-- scope: one workflow\nSELECT 1;\n"
        "-- name: b\n-- why\nSELECT 2;\n"
        "-- name: c\n-- scope: a family\n-- scope: many\nSELECT 3;\n"
        "-- name: d\n-- scope: one shard\nSELECT 4;\n"
    )
    assert query_scopes(text) == {
        "a": ["one workflow"],
        "b": [],
        "c": ["a family", "many"],
        "d": ["one shard"],
    }


@pytest.mark.parametrize("scope", SCOPES)
def test_each_scope_is_used(scope: str) -> None:
    assert scope in {found[0] for found in query_scopes(queries_text()).values() if found}

"""The advisory-lock keys of _storage/locks.py are the ones the SQL reads and takes."""

from __future__ import annotations

import re

from dbos_agent._storage.locks import MIGRATION_LOCK_KEY, QUEUE_LOCK_CLASS, SESSION_LOCK_CLASS
from dbos_agent._storage.sql_files import queries, schema


def test_the_sql_functions_read_the_session_lock_class() -> None:
    classes = {int(c) for c in re.findall(r"l\.classid = (\d+)", schema())}
    assert classes == {SESSION_LOCK_CLASS}


def test_no_query_hard_codes_a_lock_key() -> None:
    for name, sql in queries().items():
        assert not re.search(r"advisory\w*\(\s*\d", sql), name


def test_the_keys_are_distinct() -> None:
    assert len({SESSION_LOCK_CLASS, QUEUE_LOCK_CLASS, MIGRATION_LOCK_KEY}) == 3

"""The connection pool's own rules, with stand-in connections (the integration tests run it
against Postgres): reuse, the size bound, waiting for a free one, and what is never reused."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest
from psycopg.pq import TransactionStatus

from dbos_agent._storage.pool import ConnectionPool, PoolExhausted
from dbos_agent.errors import DatabaseClosedError
from tests.helpers import blocked_in, wait_until


@dataclass
class _PgConn:
    transaction_status: TransactionStatus = TransactionStatus.IDLE


@dataclass
class _Conn:
    number: int
    closed: bool = False
    pgconn: _PgConn = field(default_factory=_PgConn)

    def close(self) -> None:
        self.closed = True


class _Opener:
    def __init__(self, fail: bool = False) -> None:
        self.opened: list[_Conn] = []
        self.fail = fail

    def __call__(self) -> Any:
        if self.fail:
            raise psycopg.OperationalError("connection refused")
        conn = _Conn(len(self.opened))
        self.opened.append(conn)
        return conn


def test_a_given_back_connection_is_reused_and_new_ones_open_only_when_none_is_idle() -> None:
    opener = _Opener()
    pool = ConnectionPool(opener, 3)
    a: Any = pool.take(1)
    b: Any = pool.take(1)
    pool.give_back(a)
    assert pool.take(1) is a  # the idle one, not a third
    with pool.connection(1) as c:
        assert c is opener.opened[2]  # type: ignore[comparison-overlap]
    assert len(opener.opened) == 3
    pool.give_back(b)


def test_at_its_size_a_taker_waits_for_a_connection_given_back_or_gives_up() -> None:
    pool = ConnectionPool(_Opener(), 1)
    held = pool.take(1)
    with pytest.raises(PoolExhausted, match=r"within 0\.1s"):
        pool.take(0.1)
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(pool.take(5)))
    waiter.start()
    wait_until(lambda: blocked_in(waiter, threading.Condition.wait), 5, "the taker waiting")
    assert got == []  # still waiting
    pool.give_back(held)
    waiter.join(5)
    assert got == [held]


def test_a_failed_connect_frees_its_place() -> None:
    opener = _Opener(fail=True)
    pool = ConnectionPool(opener, 1)
    for _ in range(3):  # never "exhausted" by attempts that opened nothing
        with pytest.raises(psycopg.OperationalError, match="refused"):
            pool.take(0.1)
    opener.fail = False
    pool.give_back(pool.take(0.1))


def test_closed_or_mid_transaction_connections_are_closed_not_reused() -> None:
    opener = _Opener()
    pool = ConnectionPool(opener, 2)
    broken: Any = pool.take(1)
    busy: Any = pool.take(1)
    broken.closed = True
    busy.pgconn.transaction_status = TransactionStatus.INTRANS
    pool.give_back(broken)
    pool.give_back(busy)
    assert busy.closed
    fresh = pool.take(1)
    assert fresh not in (broken, busy)


def test_close_wakes_waiters_and_refuses_new_takers() -> None:
    pool = ConnectionPool(_Opener(), 1)
    held = pool.take(1)
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            pool.take(5)
        except DatabaseClosedError as exc:
            errors.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    wait_until(lambda: blocked_in(waiter, threading.Condition.wait), 5, "the taker waiting")
    pool.close()
    waiter.join(5)
    assert [type(e) for e in errors] == [DatabaseClosedError]
    pool.give_back(held)
    assert held.closed  # a busy connection closes when given back to a closed pool
    with pytest.raises(DatabaseClosedError, match="shut down"):
        pool.take(1)

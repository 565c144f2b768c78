"""Group commit: a lone writer writes at once; writers arriving while batches are being
written share the next one; a batch that fails answers each of its writers ALONE."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from dbos_agent._storage.group_commit import ALONE, GroupCommit
from tests.helpers import wait_until


def test_a_lone_writer_writes_at_once_in_a_batch_of_one() -> None:
    batches: list[list[int]] = []

    def write(items: Sequence[int]) -> list[int]:
        batches.append(list(items))
        return [i * 10 for i in items]

    commit = GroupCommit(write)
    assert [commit.submit(i) for i in range(3)] == [0, 10, 20]
    assert batches == [[0], [1], [2]]


def test_writers_that_arrive_during_a_write_share_the_next_batch() -> None:
    batches: list[list[int]] = []
    release = threading.Event()

    def write(items: Sequence[int]) -> list[int]:
        batches.append(list(items))
        if items[0] == 0:
            release.wait(5)  # the first batch is slow: the others queue meanwhile
        return [i * 10 for i in items]

    commit = GroupCommit(write, max_writers=1)
    results: dict[int, object] = {}

    def writer(i: int) -> None:
        results[i] = commit.submit(i)

    first = threading.Thread(target=writer, args=(0,))
    first.start()
    wait_until(lambda: batches == [[0]], 5, "the first batch being written")
    others = [threading.Thread(target=writer, args=(i,)) for i in range(1, 6)]
    for t in others:
        t.start()
    wait_until(lambda: len(commit._queue) == 5, 5, "the five other writes queued")
    release.set()
    for t in [first, *others]:
        t.join(5)
    assert results == {i: i * 10 for i in range(6)}
    assert batches[0] == [0]
    assert sorted(i for batch in batches[1:] for i in batch) == [1, 2, 3, 4, 5]
    assert len(batches) == 2  # the five waiting writes went in one batch


def test_a_failed_batch_answers_every_writer_alone() -> None:
    def write(items: Sequence[int]) -> list[int]:
        raise RuntimeError("the connection went away")

    commit = GroupCommit(write)
    assert commit.submit(1) is ALONE
    assert commit.submit(2) is ALONE  # and the next batch is tried again


def test_each_item_is_written_in_exactly_one_batch_under_contention() -> None:
    """A writer woken while its item already sits in another thread's batch must wait for
    that batch, not write the item a second time in a batch of its own."""
    written: list[int] = []
    lock = threading.Lock()

    def write(items: Sequence[int]) -> list[int]:
        with lock:
            written.extend(items)
        time.sleep(0.0005)  # a commit: long enough for writers to pile up
        return list(items)

    commit = GroupCommit(write, max_writers=2)
    results: list[object] = []

    def writer(base: int) -> None:
        for i in range(base, base + 300):
            results.append(commit.submit(i))

    threads = [threading.Thread(target=writer, args=(k * 1000,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    expected = [k * 1000 + i for k in range(8) for i in range(300)]
    assert sorted(written) == expected  # none twice, none lost
    assert sorted(results) == expected  # type: ignore[type-var]

"""``dbos-agent queues``: the queues recorded in the database (``list``), and changing a
queue's limits in every process serving it while they run (``set``)."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from .._engine.client import Client
from .._storage.database import SystemDatabase
from ..records import QueueInfo
from . import arguments as types
from . import render
from .building import Group, add_command

#: ``--concurrency none``: no limit.
NONE = "none"


def _limit(text: str) -> int | None:
    return None if text == NONE else types.positive(text)


def _rate(text: str) -> tuple[int, float] | None:
    if text == NONE:
        return None
    limit, sep, period = text.partition("/")
    if not sep:
        raise argparse.ArgumentTypeError(f"{text!r} is not N/SECONDS (e.g. 10/60) or none")
    return types.positive(limit), types.positive_seconds(period)


def add_queues(tree: Group[Any], common: argparse.ArgumentParser) -> None:
    command = add_command(
        tree,
        common,
        "queues",
        "list queues and their limits; change a queue's limits while processes run",
        queues,
        "Without an action: every queue recorded in the database (a process that defines one\n"
        "records it when it launches) with the limits its processes apply, and whose they\n"
        "are: the code's, or an operator's (set here), which win over the code's until reset.",
    )
    actions = command.add_subparsers(dest="action", metavar="ACTION", title="actions")
    add_command(actions, common, "list", "list queues and their limits", queues)
    setting = add_command(
        actions,
        common,
        "set",
        "change a queue's limits in every process, within seconds",
        set_queue,
        "Change the limits given (others stay): every process serving the queue applies them\n"
        "within a second or two, and they win over the code's da.Queue(...) until --reset.",
    )
    setting.add_argument("name", metavar="NAME", help="queue name")
    # SUPPRESS: a limit not given is absent (it stays), not None (which lifts it)
    absent = argparse.SUPPRESS
    setting.add_argument("--concurrency", type=_limit, metavar="N|none", default=absent)
    setting.add_argument("--worker-concurrency", type=_limit, metavar="N|none", default=absent)
    setting.add_argument("--rate-limit", type=_rate, metavar="N/SECONDS|none", default=absent)
    setting.add_argument(
        "--reset", action="store_true", help="give the queue back to its code's settings"
    )


def _rows(found: list[QueueInfo]) -> list[list[str]]:
    def text(value: object) -> str:
        return "-" if value is None else str(value)

    return [
        [
            q.name,
            text(q.concurrency),
            text(q.worker_concurrency),
            "-" if q.rate_limit is None else f"{q.rate_limit[0]}/{q.rate_limit[1]:g}s",
            "yes" if q.partitioned else "no",
            q.source,
            render.ts(q.updated_at),
        ]
        for q in found
    ]


def _show(args: argparse.Namespace, found: list[QueueInfo]) -> None:
    if args.json:
        render.print_json([dataclasses.asdict(q) for q in found])
        return
    if not found:
        print("no queues recorded (a process that defines one records it when it launches)")
        return
    headers = ["QUEUE", "CONCURRENCY", "WORKER", "RATE", "PARTITIONED", "SOURCE", "UPDATED"]
    render.print_table(headers, _rows(found))


def queues(args: argparse.Namespace, db: SystemDatabase) -> None:
    """Every recorded queue and its limits."""
    _show(args, Client.over(db).queues())


def set_queue(args: argparse.Namespace, db: SystemDatabase) -> None:
    """Change the given limits of a queue."""
    given: dict[str, Any] = {
        key: getattr(args, key)
        for key in ("concurrency", "worker_concurrency", "rate_limit")
        if hasattr(args, key)
    }
    _show(args, [Client.over(db).set_queue(args.name, reset=args.reset, **given)])

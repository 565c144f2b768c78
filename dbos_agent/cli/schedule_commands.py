"""The ``schedules`` commands, each ``(args, db)``: the recorded schedules, pausing and
resuming one in every process, and backfilling its missed slots."""

from __future__ import annotations

import argparse
import dataclasses

from .. import _documents as documents
from .._engine.schedules import backfill_schedule_slots, read_schedules, set_schedule_paused
from .._storage.database import SystemDatabase
from . import render
from .arguments import PROG


def schedules(args: argparse.Namespace, db: SystemDatabase) -> None:
    """Every recorded schedule: its cron, time zone, pause, latest and next slots."""
    found = read_schedules(db)
    if args.json:
        render.print_json([documents.schedule_json(info) for info in found])
        return
    if not found:
        print("no schedules recorded (a process that defines one records it when it launches)")
        return
    rows = [
        [
            info.name,
            info.cron,
            info.timezone,
            "yes" if info.paused else "no",
            render.ts(info.last_slot),
            render.ts(info.next_slot),
            info.last_workflow_id or "-",
            info.last_status or "-",
        ]
        for info in found
    ]
    headers = ["NAME", "CRON", "TIMEZONE", "PAUSED", "LAST SLOT (UTC)", "NEXT SLOT (UTC)"]
    render.print_table([*headers, "LAST RUN", "STATUS"], rows, status_column=7)


def _set_paused(args: argparse.Namespace, db: SystemDatabase, paused: bool) -> None:
    changed = set_schedule_paused(db, args.name, paused)
    if args.json:
        render.print_json({"name": args.name, "paused": paused, "changed": changed})
    elif not changed:
        print(
            f"schedule {args.name} was already {'paused' if paused else 'running'}; nothing changed"
        )
    elif paused:
        print(
            f"paused schedule {args.name}: its slots pass without runs until "
            f"`{PROG} schedules resume {args.name}`"
        )
    else:
        print(
            f"resumed schedule {args.name}: it runs again from its next slot (the slots of "
            f"the pause are not caught up; `{PROG} schedules backfill` runs them)"
        )


def pause_schedule(args: argparse.Namespace, db: SystemDatabase) -> None:
    """Pause a schedule in every process; pausing a paused one changes nothing."""
    _set_paused(args, db, True)


def resume_schedule(args: argparse.Namespace, db: SystemDatabase) -> None:
    """Resume a paused schedule from its next slot."""
    _set_paused(args, db, False)


def backfill(args: argparse.Namespace, db: SystemDatabase) -> None:
    """Record the workflow of every slot in the range that has not run, once each."""
    report = backfill_schedule_slots(db, args.name, args.start, args.end)
    if args.json:
        render.print_json(dataclasses.asdict(report))
        return
    print(
        f"backfilled {len(report.fired):,} slot(s) of schedule {args.name} ({report.slots:,} "
        f"in the range up to now, {report.already_fired:,} of them had run already)"
        + (
            "; they are PENDING: the first process with the workflow's code that takes over "
            f"orphans (`{PROG} worker`) runs them"
            if report.fired
            else ""
        )
    )

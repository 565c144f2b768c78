"""The deploy commands: ``check-deploy`` (does new code fit the workflows in flight?),
``versions`` (what each application version has unfinished, and which builds serve it),
``export`` and ``import`` (workflows with their logs, as JSON Lines).

``check-deploy`` is the one command besides ``worker`` that runs the application's code:
in a child process (:mod:`.deploy_child`), which imports it and replays logs against it
on read-only connections, running nothing live (see
:mod:`dbos_agent._engine.deploy_check`); this process never imports it.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Iterator
from typing import Any, TextIO

from .._engine import deploy_check
from .._storage.database import SystemDatabase
from .._storage.histories import read_export
from .._storage.versions import UNFINISHED, AppVersionSummary
from ..errors import DbosAgentError
from ..records import WorkflowStatus
from . import deploy_child, render

#: How many ids ``export --unfinished`` reads per statement.
_EXPORT_PAGE = 200


def versions(args: argparse.Namespace, db: SystemDatabase) -> None:
    """Application versions: unfinished workflows by status, and the live sessions of each
    with the code versions they run.

    One row per application version, not per code version: workflows record (and are
    routed by) their application version only, so any build of it may recover them;
    what a deploy needs per build is whether its processes are up, which the code
    versions of the row's sessions say.
    """
    found = db.versions.summary()
    if args.json:
        render.print_json([_version_json(v) for v in found])
        return
    if not found:
        print("no unfinished workflows and no live sessions")
        return
    headers = ["APP VERSION", *UNFINISHED, "OTHERS MAY RUN", "LIVE SESSIONS", "CODE VERSIONS"]
    rows = []
    for v in found:
        others = str(v.accepted_elsewhere)
        if v.accepted_by:
            others += f" ({', '.join(v.accepted_by)})"
        row = [render.app_version(v.app_version), *(str(v.unfinished[s]) for s in UNFINISHED)]
        codes = ", ".join(
            f"{render.code_version(code)} ({count})" for code, count in v.code_versions.items()
        )
        row += [others, str(len(v.sessions)), codes or "-"]
        if args.wide:
            row.append(
                ", ".join(
                    f"{s.executor_id}@{s.hostname}:{s.pid} {render.code_version(s.code_version)}"
                    for s in v.sessions
                )
            )
        rows.append(row)
    render.print_table([*headers, *(["EXECUTOR@HOST:PID CODE"] if args.wide else [])], rows)
    for v in found:
        if len(v.code_versions) > 1:
            print(
                f"note: application version {render.app_version(v.app_version)} is served by "
                f"{len(v.code_versions)} code versions; any of them may recover its "
                f"workflows (one whose code does not fit a workflow's log holds it DIVERGED)"
            )


def _version_json(summary: AppVersionSummary) -> dict[str, Any]:
    """An application version as ``--json`` prints it: its fields (each session with its
    ``code_version``), how many live sessions it has, and how many of them run each code
    version (``[{"code_version", "sessions"}]``, the most first)."""
    return {
        **dataclasses.asdict(summary),
        "live_sessions": len(summary.sessions),
        "code_versions": [
            {"code_version": code, "sessions": count}
            for code, count in summary.code_versions.items()
        ],
    }


def check_deploy(args: argparse.Namespace, db: SystemDatabase) -> int:
    """Replay the unfinished workflows of the app's names against its code, in a child
    process (:mod:`.deploy_child`); exit 1 when any would diverge or fail, 2 when the app
    could not be checked. With ``--adopt``, let the new version run the old ones that
    fit."""
    if args.adopt and not args.app_version:
        raise DbosAgentError(
            "--adopt needs --app-version V: the application version of the code checked, "
            "whose processes may then run the workflows of older versions that fit it"
        )
    names, report = deploy_child.run_check(
        db.url,
        args.app,
        app_version=args.app_version,
        timeout=args.timeout,
        histories=args.histories,
    )
    if args.adopt:
        deploy_check.adopt(db, report, args.app_version)
    if args.json:
        render.print_json(_report_json(report, names))
    else:
        _print_report(report, args)
    return 0 if report.fits else 1


def _misfit_json(verdict: deploy_check.Verdict) -> dict[str, Any]:
    found = verdict.divergence
    return {
        "workflow_id": verdict.workflow_id,
        "name": verdict.name,
        "app_version": verdict.app_version,
        "status": str(verdict.status),
        "position": None if found is None else found.position,
        "recorded": None if found is None else found.recorded,
        "called": None if found is None else found.called,
        "problem": verdict.problem,
    }


def _report_json(report: deploy_check.DeployCheck, names: list[str]) -> dict[str, Any]:
    return {
        "fits": report.fits,
        "code_version": report.code_version,
        "app_version": report.app_version,
        "workflow_names": names,
        "checked": len(report.verdicts),
        "groups": [
            {
                "name": group.name,
                "app_version": group.app_version,
                "fit": group.fit,
                "misfit": len(group.misfits),
            }
            for group in report.groups()
        ],
        "misfits": [_misfit_json(v) for v in report.verdicts if not v.fits],
        "adopted": report.adopted,
        "moved": report.moved,
    }


def _print_report(report: deploy_check.DeployCheck, args: argparse.Namespace) -> None:
    out = sys.stdout
    version = f", app version {report.app_version}" if report.app_version else ""
    out.write(
        f"checked {len(report.verdicts)} unfinished workflow(s) against code version "
        f"{report.code_version}{version}\n"
    )
    for group in report.groups():
        label = group.app_version or "none"
        misfits = len(group.misfits)
        tail = f", {misfits} would not fit" if misfits else ""
        out.write(f"  {group.name} (app version {label}): {group.fit} fit{tail}\n")
        for verdict in group.misfits:
            out.write(f"    {verdict.workflow_id}  {verdict.status}  {_why(verdict)}\n")
    if args.adopt:
        out.write(
            f"adopted {report.adopted} workflow(s) of other versions for version "
            f"{args.app_version}"
            + (
                f"; {report.moved} moved since they were checked (check again)"
                if report.moved
                else ""
            )
            + "\n"
        )
    if report.fits:
        out.write("every workflow fits: the new code continues each from its log\n")
    else:
        bad = sum(1 for v in report.verdicts if not v.fits)
        out.write(
            f"{bad} workflow(s) would not fit the new code: guard the change with "
            "da.patched(...), or deploy it once the old version has finished them\n"
        )


def _why(verdict: deploy_check.Verdict) -> str:
    found = verdict.divergence
    if found is not None:
        return (
            f"at step {found.position} the log recorded {found.recorded!r}, "
            f"the new code calls {found.called!r}"
        )
    return verdict.problem or ""


def export(args: argparse.Namespace, db: SystemDatabase) -> None:
    """Write the named workflows (or every unfinished one) as JSON Lines to stdout."""
    if bool(args.workflow_ids) == args.unfinished:
        raise DbosAgentError("name workflow ids to export, or pass --unfinished (not both)")
    if args.workflow_ids:
        found = db.histories.export(args.workflow_ids)
        missing = sorted(set(args.workflow_ids) - {wid for wid, _ in found})
        if missing:
            raise DbosAgentError(f"no such workflow: {', '.join(missing)}")
        _write_lines(sys.stdout, found)
        return
    for page in _unfinished_pages(db, args.name):
        _write_lines(sys.stdout, db.histories.export(page))


def _unfinished_pages(db: SystemDatabase, name: str | None) -> Iterator[list[str]]:
    """The ids of unfinished workflows (of ``name``), page by page, oldest first."""
    unfinished = [s for s in WorkflowStatus if not s.finished]
    after = None
    while True:
        page = db.histories.unfinished_ids(unfinished, name, after, _EXPORT_PAGE)
        if page:
            yield [wid for wid, _ in page]
        if len(page) < _EXPORT_PAGE:
            return
        after = page[-1][1], page[-1][0]


def _write_lines(out: TextIO, documents: list[tuple[str, str]]) -> None:
    for _, document in documents:
        out.write(document + "\n")


def import_(args: argparse.Namespace, db: SystemDatabase) -> None:
    """Load an export into this database: every line is read and checked first (the
    engine's rules, see :mod:`dbos_agent._storage.history_checks`), then all are written in
    one transaction, whole or not at all."""
    found = [
        (where, history.workflow_id, document)
        for where, document, history in read_export(args.file, args.max_checkpoint_bytes)
    ]
    done = db.histories.import_all(found)
    imported = sum(1 for d in done if d is not None)
    skipped = len(done) - imported
    steps = sum(d[1] for d in done if d is not None)
    summary = {"imported": imported, "skipped": skipped, "steps": steps}
    if args.json:
        render.print_json(summary)
        return
    print(
        f"imported {imported} workflow(s) with {steps} step(s)"
        + (f"; skipped {skipped} whose id exists here already" if skipped else "")
    )

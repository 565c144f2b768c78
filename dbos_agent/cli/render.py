"""Everything the CLI shows: tables, fields, times, durations, JSON documents, progress.

Tables and fields go through rich. On a terminal they get colour (the status) and the
terminal's width; anywhere else (a pipe, a file, a test) they are plain text that is
never cut, wrapped or coloured, one record a line, so ``head``, ``grep`` and
``line.split()`` see whole cells. ``--json`` documents never go through rich.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, TextIO

from rich.console import Console
from rich.table import Table
from rich.text import Text

from .._documents import json_default, tokens_of
from .._engine.retention import GcReport
from ..records import StepDigest, StepInfo, StepStatus, WorkflowInfo, WorkflowStatus
from .arguments import PROG

SUMMARY_CHARS = 60
DETAIL_CHARS = 400
#: A long `gc` off a terminal prints how far it got this often (on stderr).
PROGRESS_EVERY_S = 2.0
#: Off a terminal a line is as long as it needs to be.
_UNLIMITED_WIDTH = 1 << 20
_STATUS_STYLES = {
    "SUCCESS": "green",
    "ERROR": "red",
    "PENDING": "yellow",
    "SUSPENDED": "blue",
    "ENQUEUED": "cyan",
    "CANCELLED": "magenta",
    "MAX_RECOVERY_ATTEMPTS_EXCEEDED": "bold red",
    "IN_DOUBT": "bold yellow",
    "DIVERGED": "bold dark_orange",
}
#: A ``Label  value`` line of :func:`print_fields`; a Text value keeps its colour.
Field = tuple[str, str | Text]


# -- values as text -----------------------------------------------------------------------


def ts(when: datetime | None) -> str:
    """A UTC time to the second, ``-`` for none."""
    return "-" if when is None else when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def duration(seconds: float | None) -> str:
    """A duration in the unit people read it in: 12 ms, 3.4 s, 5m 07s, 2h 03m."""
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms" if seconds >= 0.001 else f"{seconds * 1000:.2f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"


def app_version(version: str | None) -> str:
    """An application version, ``(none)`` for workflows and sessions without one."""
    return "(none)" if version is None else version


def code_version(version: str | None) -> str:
    """A session's code version, ``(unknown)`` where it registered before they were
    recorded."""
    return "(unknown)" if version is None else version


def clip(text: str, limit: int) -> str:
    """One line of at most ``limit`` characters (whitespace runs become one space)."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def compact(value: Any) -> str:
    """A JSON value on one line."""
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def error_text(error: dict[str, Any] | None) -> str:
    """A recorded error as ``Type: message`` (the type without its module)."""
    if not error:
        return ""
    kind = str(error.get("type") or "Error").rsplit(".", 1)[-1]
    return f"{kind}: {error.get('message', '')}"


def status_text(status: str) -> Text:
    """A status, coloured by what it means (the colour shows on terminals only)."""
    return Text(status, style=_STATUS_STYLES.get(status, ""))


# -- tables and fields ------------------------------------------------------------------


def _console(file: TextIO) -> Console:
    """A terminal gets colour and its width; anything else plain, uncut, unwrapped text.

    Decided here from ``isatty`` rather than by rich, so that an inherited FORCE_COLOR
    never puts escape codes into a pipe."""
    quiet: dict[str, Any] = {"highlight": False, "markup": False, "emoji": False}
    if file.isatty():
        return Console(file=file, force_terminal=True, **quiet)
    return Console(
        file=file,
        force_terminal=False,
        color_system=None,
        no_color=True,
        width=_UNLIMITED_WIDTH,
        soft_wrap=True,
        **quiet,
    )


def _emit(renderable: Table | Text, file: TextIO | None) -> None:
    out = sys.stdout if file is None else file
    console = _console(out)
    if console.is_terminal:
        console.print(renderable)
        return
    with console.capture() as captured:
        console.print(renderable)
    out.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))


def print_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    status_column: int | None = None,
    file: TextIO | None = None,
) -> None:
    """Columns two spaces apart under upper-case headers, without a frame; on a terminal
    a cell too wide for it folds within its column (nothing is cut), and the
    ``status_column`` is coloured."""
    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    for header in headers:
        table.add_column(header, overflow="fold")
    for row in rows:
        table.add_row(
            *(status_text(cell) if i == status_column else Text(cell) for i, cell in enumerate(row))
        )
    _emit(table, file)


def print_fields(fields: Sequence[Field], *, file: TextIO | None = None) -> None:
    """``Label   value`` lines, the values aligned."""
    width = max(len(label) for label, _ in fields)
    lines = [Text.assemble(label.ljust(width), "  ", value) for label, value in fields]
    _emit(Text("\n").join(lines), file)


def waits(info: WorkflowInfo) -> str:
    """What a workflow waits for, for a table: ``kind: text`` (see ``records.Waiting``),
    empty while it runs and once it finished."""
    return "" if info.waiting is None else info.waiting.line()


def waiting_fields(info: WorkflowInfo) -> list[Field]:
    """What ``workflows show`` says a workflow waits for, and what an operator may do
    about a dependency (try now) or an orphan (run a process that takes it over)."""
    found = info.waiting
    if found is None:
        return []
    fields: list[Field] = [("Waiting for", found.line())]
    wid = shlex.quote(info.workflow_id)
    if found.kind == "dependency":
        fields.append(("Try now", f"{PROG} retry {wid} (or cancel it)"))
    elif found.kind == "orphan":
        fields.append(
            (
                "What now",
                f"run a process with its function ({PROG} worker --app MODULE, or your app's "
                f"launch()): it takes it over and continues it from its log; or cancel it: "
                f"{PROG} workflows cancel {wid}",
            )
        )
    return fields


def diverged_fields(info: WorkflowInfo) -> list[Field]:
    """What ``workflows show`` says of a divergence: while the workflow is held, where its
    log and its code parted and what the operator may do; once it was continued (or
    cancelled), where they parted, as history. Nothing for a workflow that never diverged."""
    found = info.diverged
    if found is None:
        return []
    if info.status is not WorkflowStatus.DIVERGED:
        held = "" if found.at is None else f" (held from {ts(found.at)} UTC)"
        return [("Diverged earlier", found.why() + held)]
    since = "" if found.at is None else f", since {ts(found.at)} UTC"
    command = f"{PROG} workflows"
    wid, step = shlex.quote(info.workflow_id), found.position
    return [
        ("Diverged", found.why() + since),
        (
            "What now",
            "deploy code that fits its log (the change made with da.patched), or leave it to "
            "an older version still running: either continues it;",
        ),
        (
            "",
            f"or fork it from step {step}{' or earlier' if step else ''} (a new workflow "
            f"that reuses the steps before it and runs on with the code now deployed): "
            f"{command} fork {wid} --from-step {step}",
        ),
        ("", f"or cancel it: {command} cancel {wid}"),
    ]


def lineage_fields(info: WorkflowInfo) -> list[Field]:
    """Where a workflow comes from and how its queue treated it, each line only when it
    says something: the workflow that started it, the one it was forked from, its
    priority, deduplication id and dequeue time."""
    fields: list[Field] = []
    if info.parent_workflow_id is not None:
        fields.append(("Parent", info.parent_workflow_id))
    if info.forked_from is not None:
        fields.append(("Forked from", f"{info.forked_from} at step {info.forked_from_step}"))
    if info.priority:
        fields.append(("Priority", str(info.priority)))
    if info.deduplication_id is not None:
        fields.append(("Dedup id", info.deduplication_id))
    if info.dequeued_at is not None:
        fields.append(("Dequeued", ts(info.dequeued_at) + " UTC"))
    return fields


def folded(step: StepInfo) -> bool:
    """Whether the steps table leaves ``step`` out unless asked (``--all``): a step the
    library recorded for itself (``dbos_agent.*``: two stream writes per tool call, a
    patch's marker...) once it has its outcome. A wait in progress, an intent in doubt
    and a step waiting for its next attempt are always shown."""
    return step.internal and step.status.finished


def fold_line(steps: Sequence[StepInfo]) -> str:
    """What the table left out, e.g. ``3 library steps folded: dbos_agent.write_stream
    (2), dbos_agent.patch:x; --all shows them``; empty when nothing was."""
    names = Counter(step.name for step in steps if folded(step))
    if not names:
        return ""
    count = sum(names.values())
    which = ", ".join(name if n == 1 else f"{name} ({n})" for name, n in names.items())
    return f"{count} library step{'s' if count > 1 else ''} folded: {which}; --all shows them"


def print_steps(
    steps: Sequence[StepInfo], digests: Sequence[StepDigest | None], *, show_all: bool = True
) -> None:
    """The steps table: what each step did, in log order, one line each; without
    ``show_all`` the library's own finished steps are folded into one line below it."""
    rows = []
    for step, digest in zip(steps, digests, strict=True):
        if not show_all and folded(step):
            continue
        if step.waiting:
            result = step.wait_text()
        elif step.status is StepStatus.PENDING:
            result = "intent, no result (in doubt) inputs " + compact(step.inputs)
        elif step.retry is not None:
            result = step.retry.describe()
        elif step.status is StepStatus.ERROR:
            result = error_text(step.error)
        elif digest is not None and digest.summary is not None:
            result = digest.summary
        else:
            result = compact(step.output)
        tokens = tokens_of(digest)
        rows.append(
            [
                str(step.seq),
                step.name,
                str(step.status),
                str(step.attempts),
                ts(step.started_at),
                duration(None if step.duration_ms is None else step.duration_ms / 1000),
                "" if tokens is None else f"{tokens[0]}/{tokens[1]}",
                clip(result, SUMMARY_CHARS),
            ]
        )
    headers = ["SEQ", "NAME", "STATUS", "ATTEMPTS", "STARTED (UTC)", "DURATION", "TOKENS IN/OUT"]
    if rows:
        print_table([*headers, "RESULT"], rows, status_column=2)
    if not show_all and (line := fold_line(steps)):
        print(line)


# -- tokens ------------------------------------------------------------------------------


def tokens_line(totals: dict[str, Any]) -> str:
    """The ``Tokens`` field of ``workflows show``, from :func:`token_totals`."""
    cost = totals["cost_usd"]
    return (
        f"{totals['input_tokens']} in, {totals['output_tokens']} out over "
        f"{totals['model_calls']} model call(s)" + ("" if cost is None else f", about ${cost:.4f}")
    )


def budget_line(budget: dict[str, Any]) -> str:
    """The ``Budget`` field of ``workflows show``: spent against each limit."""
    parts = []
    if budget["max_tokens"] is not None:
        parts.append(f"{budget['spent_tokens']:,} of {budget['max_tokens']:,} tokens")
    if budget["max_cost_usd"] is not None:
        spent = budget["spent_cost_usd"]
        shown = "?" if spent is None else f"${spent:.4f}"
        parts.append(f"{shown} of ${budget['max_cost_usd']:.2f}")
    return ", ".join(parts) + " (this workflow's own calls)"


# -- JSON --------------------------------------------------------------------------------


def print_json(document: Any) -> None:
    """The one JSON document of a ``--json`` command, on stdout."""
    json.dump(document, sys.stdout, indent=2, ensure_ascii=False, default=json_default)
    sys.stdout.write("\n")


def print_json_line(document: Any) -> None:
    """One object of a streaming ``--json`` command (JSON Lines), flushed at once."""
    json.dump(document, sys.stdout, ensure_ascii=False, default=json_default)
    sys.stdout.write("\n")
    sys.stdout.flush()


# -- progress ----------------------------------------------------------------------------


def _gc_so_far(report: GcReport) -> str:
    rate = report.workflows / max(report.seconds, 1e-9)
    return (
        f"{report.workflows:,} workflows deleted so far, {report.batches:,} batches, "
        f"{duration(report.seconds)} ({rate:,.0f}/s)"
    )


@contextmanager
def gc_progress(*, shown: bool) -> Iterator[Callable[[GcReport], None]]:
    """The ``progress`` callback of a long ``gc``, on stderr (stdout stays the result): a
    live display on a terminal, else a line every :data:`PROGRESS_EVERY_S` seconds (a
    log file gets a few lines, not one per batch)."""
    if not shown:
        yield lambda so_far: None
    elif sys.stderr.isatty():
        from rich.progress import Progress, SpinnerColumn, TextColumn

        with Progress(
            SpinnerColumn(),
            TextColumn(f"{PROG} gc: {{task.description}}", markup=False),
            console=Console(file=sys.stderr, force_terminal=True),
            transient=True,
        ) as display:
            task = display.add_task("deleting the oldest finished workflows", total=None)
            yield lambda so_far: display.update(task, description=_gc_so_far(so_far))
    else:
        last_line = time.monotonic()

        def line(so_far: GcReport) -> None:
            nonlocal last_line
            if time.monotonic() - last_line < PROGRESS_EVERY_S:
                return
            last_line = time.monotonic()
            sys.stderr.write(f"{PROG} gc: {_gc_so_far(so_far)}\n")
            sys.stderr.flush()

        yield line


def edit_text(edit: dict[str, Any]) -> str:
    """One recorded edit (a rewind, an edited fork's inputs or step output), in words."""
    kind = edit.get("kind")
    if kind == "rewind":
        what = (
            f"rewound to step {edit.get('to_step')} from {edit.get('status')} "
            f"({edit.get('deleted_steps')} step(s) deleted)"
        )
    elif kind == "inputs":
        what = f"inputs {', '.join(map(str, edit.get('names', [])))} replaced"
    else:
        what = f"step {edit.get('seq')} ({edit.get('name')}) given another output"
    unchecked = "" if edit.get("checked", True) else ", types unchecked"
    return f"{what}, by {edit.get('by')} at {str(edit.get('at', ''))[:19]}{unchecked}"

"""Processes the tests start (apps, worker daemons, servers), run to their end or killed,
paused and restarted; and what any of them wrote, for the message of a failed test."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from tests.support import zygote

ROOT = Path(__file__).parent.parent


#: How much of a process's stdout and stderr a failure message shows (each, its end).
SHOWN = 6000


def output(
    process: subprocess.CompletedProcess[str] | subprocess.Popen[str], *texts: str | None
) -> str:
    """What ``process`` wrote, to put in an assertion's message: its command, exit status,
    stdout and stderr (the last SHOWN characters of each). For a ``Popen``, pass what
    ``communicate()`` returned (or nothing, if it was not awaited)."""
    status: int | None
    if isinstance(process, subprocess.CompletedProcess):
        texts = (process.stdout, process.stderr)
        status = process.returncode
    else:
        status = process.poll()
    out, err = (*texts, None, None)[:2]
    given: Any = process.args
    args = given if isinstance(given, str) else " ".join(map(str, given))

    def tail(text: str | bytes | None) -> str:
        if isinstance(text, bytes):
            text = text.decode(errors="replace")
        text = text or ""
        return text if len(text) <= SHOWN else "..." + text[-SHOWN:]

    return (
        f"\n$ {args}\nexit status: {status}\n--- stdout ---\n{tail(out)}"
        f"\n--- stderr ---\n{tail(err)}"
    )


def run_app(
    command: list[str],
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 120,
    status: int = 0,
) -> subprocess.CompletedProcess[str]:
    """Run ``command`` to its end, its output captured: exiting other than with ``status``
    (or outlasting ``timeout``) fails the test with all it wrote in the message."""
    try:
        done = zygote.run(
            command, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(
            f"still running after {timeout}s: {' '.join(command)}\n--- stdout ---\n"
            f"{exc.stdout!r}\n--- stderr ---\n{exc.stderr!r}"
        ) from None
    assert done.returncode == status, output(done)
    return done


def finish(process: subprocess.Popen[str], timeout: float = 60) -> tuple[str, str]:
    """Wait for ``process`` to end and return its (stdout, stderr); one still running
    after ``timeout`` is killed, and the test fails with what it wrote."""
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        raise AssertionError(
            f"still running after {timeout}s:" + output(process, out, err)
        ) from None
    return out or "", err or ""


def start_worker(
    url: str, app: str, *extra: str, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """``python -m dbos_agent.worker --app APP`` on ``url`` (stderr kept, stdout dropped),
    polling for orphans every 0.2 s unless ``extra`` says otherwise."""
    return zygote.popen(
        [sys.executable, "-m", "dbos_agent.worker", "--app", app, "--poll", "0.2", *extra],
        env={**os.environ, "DBOS_AGENT_DATABASE_URL": url, "PYTHONPATH": str(ROOT), **(env or {})},
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def start_module(
    url: str, module: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """``python -m MODULE ARGS`` on ``url`` in the checkout, its stdout and stderr kept."""
    return zygote.popen(
        [sys.executable, "-m", module, *args],
        env={**os.environ, "DBOS_AGENT_DATABASE_URL": url, "PYTHONPATH": str(ROOT), **(env or {})},
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def kill9(process: subprocess.Popen[Any]) -> float:
    """SIGKILL ``process`` and wait for its end; returns when (``time.time()``) it stopped
    running: the moment the kill returned, after which the kernel lets it run nothing more.
    Not the moment its end is reported, which a busy machine can tell tens of milliseconds
    later: a take-over started in between is no overlap."""
    process.send_signal(signal.SIGKILL)
    killed_at = time.time()
    process.wait(10)
    return killed_at


def stop_workers(procs: list[subprocess.Popen[str]]) -> str:
    """SIGTERM each (after SIGCONT, in case one is paused), wait, and return what they
    wrote on stderr; one that does not stop within 30 s is killed. Called while a failure
    passes (a ``finally:``), it adds what they wrote to the failure's message."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGCONT)
            p.send_signal(signal.SIGTERM)
    logs = []
    for p in procs:
        try:
            _, err = p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
        logs.append(err or "")
    text = "\n".join(logs)
    failure = sys.exc_info()[1]  # called from a finally: block a failure passes through
    if failure is not None:
        failure.add_note(f"what the workers wrote on stderr:\n{text or '(nothing)'}")
    return text


#: One step run as tests.apps.worker_app logs it: pid, workflow id, position, start, end.
Execution = tuple[int, str, int, float, float]


def executions(log: Path) -> list[Execution]:
    """The step runs tests.apps.worker_app appended to ``log``, in order."""
    rows = []
    for line in log.read_text().splitlines():
        pid, wid, seq, start, end = line.split()
        rows.append((int(pid), wid, int(seq), float(start), float(end)))
    return rows


def assert_never_two_at_once(rows: list[Execution], killed_pid: int, killed_at: float) -> int:
    """No workflow ran in two processes at once: per workflow, the spans each process
    worked on it (the killed one's until its death) are disjoint. Returns how many
    workflows more than one process ran (taken over)."""
    spans: dict[str, dict[int, list[float]]] = defaultdict(dict)
    for pid, wid, _seq, start, end in rows:
        span = spans[wid].setdefault(pid, [start, end])
        span[0], span[1] = min(span[0], start), max(span[1], end)
    taken_over = 0
    for wid, by_pid in spans.items():
        if killed_pid in by_pid:
            by_pid[killed_pid][1] = max(by_pid[killed_pid][1], killed_at)
        ordered = sorted(by_pid.values())
        taken_over += len(ordered) > 1
        for (_, end_a), (start_b, _) in itertools.pairwise(ordered):
            assert end_a <= start_b, f"{wid} ran in two processes at once: {by_pid}"
    return taken_over

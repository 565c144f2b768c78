"""The command line: run a :class:`ScriptedServer` as its own process."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from types import FrameType

from .demo_task import _echo_script, coding_task_script, seed_coding_task
from .script import Delay, Reply, ScriptFn, ScriptItem, load_script
from .server import ScriptedServer

__all__ = ["main"]

# --------------------------------------------------------------------------- CLI


def _write_atomic(path: Path, data: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(data, encoding="utf-8")
    tmp.replace(path)


def _with_chunk_delay(
    script: Sequence[ScriptItem] | ScriptFn, seconds: float
) -> Sequence[ScriptItem] | ScriptFn:
    """The same script with ``chunk_delay=seconds`` on every reply (also inside Delays)."""

    def slowed(item: ScriptItem) -> ScriptItem:
        if isinstance(item, Reply):
            return replace(item, chunk_delay=seconds)
        if isinstance(item, Delay):
            return replace(item, then=slowed(item.then))
        return item

    if callable(script):
        fn = script
        return lambda body: slowed(fn(body))
    return [slowed(item) for item in script]


def main(argv: Sequence[str] | None = None) -> int:
    """Run a ScriptedServer as its own process until SIGTERM/SIGINT."""
    parser = argparse.ArgumentParser(
        prog="python -m dbos_agent.agent.scripted_server",
        description="Scripted offline Anthropic Messages API server.",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--script", type=Path, help="JSON script file (list of items)")
    source.add_argument(
        "--scenario", choices=["coding_task", "echo"], help="built-in scripted conversation"
    )
    parser.add_argument("--workdir", type=Path, default=Path.cwd(), help="for coding_task")
    parser.add_argument("--seed", action="store_true", help="seed --workdir for coding_task")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--log", type=Path, help="append one JSON line per request")
    parser.add_argument("--port-file", type=Path, help="write the port here once listening")
    parser.add_argument("--state", type=Path, help="persist the script position here")
    parser.add_argument(
        "--chunk-delay",
        type=float,
        default=0.0,
        help="seconds between streamed events of each reply (to kill a client mid-stream)",
    )
    args = parser.parse_args(argv)

    script: Sequence[ScriptItem] | ScriptFn
    if args.script is not None:
        script = load_script(args.script)
    elif args.scenario == "coding_task":
        if args.seed:
            seed_coding_task(args.workdir)
        script = coding_task_script(str(args.workdir.resolve()))
    else:
        script = _echo_script
    if args.chunk_delay > 0:
        script = _with_chunk_delay(script, args.chunk_delay)

    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server = ScriptedServer(
        script, host=args.host, port=args.port, log_path=args.log, state_path=args.state
    )
    server.start()
    try:
        if args.port_file is not None:
            _write_atomic(args.port_file, f"{server.port}\n")
        print(f"scripted Anthropic server listening on {server.url}", file=sys.stderr, flush=True)
        while not stop.wait(0.2):
            pass
    finally:
        server.stop()
    return 0

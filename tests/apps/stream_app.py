"""A workflow whose step streams slowly, run as a subprocess (and SIGKILLed mid-step).

    python -m tests.apps.stream_app WORKFLOW_ID

Environment: DBOS_AGENT_DATABASE_URL; STREAM_DELAY (seconds between items, default 0.05).
The step ``speak`` writes ten words to the stream ``output`` from inside the step, then
the workflow body writes ``"done"`` (checkpointed) and closes the stream.
"""

from __future__ import annotations

import json
import os
import sys
import time

import dbos_agent as da

DELAY = float(os.environ.get("STREAM_DELAY", "0.05"))
WORDS = [f"word{i}" for i in range(10)]


@da.step
def speak() -> int:
    for word in WORDS:
        da.write_stream("output", word)
        time.sleep(DELAY)
    return len(WORDS)


@da.durable_workflow(name="stream_app_speaker")
def speaker() -> int:
    spoken = speak()
    da.write_stream("output", "done")
    da.close_stream("output")
    return spoken


def main() -> int:
    url = os.environ["DBOS_AGENT_DATABASE_URL"]
    with da.launch(url, executor_id="stream-app"):
        handle = da.start(speaker, workflow_id=sys.argv[1])
        print(json.dumps(handle.result(timeout=60)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

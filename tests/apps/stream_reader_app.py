"""A workflow that reads another workflow's stream, run as a subprocess (and SIGKILLed
while it waits for the next item).

    python -m tests.apps.stream_reader_app READER_ID SOURCE_ID

Environment: DBOS_AGENT_DATABASE_URL. Prints the values the reader read, as JSON.
"""

from __future__ import annotations

import json
import os
import sys

import dbos_agent as da


@da.durable_workflow(name="stream_reader_app_reader")
def reader(source_id: str) -> list[object]:
    return [item.value for item in da.read_stream(source_id, "s")]


def main() -> int:
    url = os.environ["DBOS_AGENT_DATABASE_URL"]
    with da.launch(url, executor_id="stream-reader-app"):
        handle = da.start(reader, sys.argv[2], workflow_id=sys.argv[1])
        print(json.dumps(handle.result(timeout=60)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A durable pipeline in a dozen lines: kill it half-way, run it again, watch it continue.

    python examples/durable_pipeline.py        # Ctrl-C or kill -9 it while it works
    python examples/durable_pipeline.py        # continues: finished steps replay instantly

With no database configured it uses the embedded Postgres under ./.dbos_agent/.
Set DBOS_AGENT_DATABASE_URL to use your own server instead.
"""

from __future__ import annotations

import sys
import time

import dbos_agent as da

WORKFLOW_ID = sys.argv[1] if len(sys.argv) > 1 else "book-summary-demo"


@da.step
def fetch_chapter(n: int) -> str:
    """Pretend to download a chapter: slow, and worth not doing twice."""
    time.sleep(0.6)
    print(f"  fetched chapter {n}", flush=True)
    return f"chapter {n} " + "lorem ipsum " * n


@da.step
def summarize(text: str) -> str:
    """Pretend to call a model: slow and paid for."""
    time.sleep(0.6)
    summary = text.split()[0] + " " + text.split()[1] + f": {len(text.split())} words"
    print(f"  summarized -> {summary}", flush=True)
    return summary


@da.durable_workflow
def summarize_book(chapters: int) -> list[str]:
    return [summarize(fetch_chapter(n)) for n in range(1, chapters + 1)]


def main() -> None:
    with da.launch(recover=False):
        recorded = len(da.operations.list_steps(WORKFLOW_ID))
        if recorded:
            print(f"workflow {WORKFLOW_ID}: {recorded} steps already recorded, replaying them")
        else:
            print(f"workflow {WORKFLOW_ID}: starting (kill me half-way, then run me again)")
        started = time.perf_counter()
        try:
            with da.workflow_id(WORKFLOW_ID):
                summaries = summarize_book(6)
        except KeyboardInterrupt:
            print(f"\ninterrupted: {WORKFLOW_ID} stays PENDING; run the same command to go on")
            sys.exit(130)
        print(f"done in {time.perf_counter() - started:.1f}s:")
        for line in summaries:
            print("  " + line)
        print(f"(run with another id to start over: python {sys.argv[0]} my-new-id)")


if __name__ == "__main__":
    main()

"""The README's example test runs as written (against the example pipeline)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readmes_example_test_passes(dbos_agent_database_url: str) -> None:
    text = README.read_text()
    start = text.index("A test of your own workflow")
    match = re.search(r"```python\n(.*?)```", text[start:], re.S)
    assert match is not None, "the README's example test is missing"
    code = match.group(1).replace("from myapp import", "from examples.durable_pipeline import")
    namespace: dict[str, Any] = {}
    exec(compile(code, "README.md", "exec"), namespace)
    namespace["test_summarize_book_survives_a_crash"](dbos_agent_database_url)

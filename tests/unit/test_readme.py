"""The README is the front door: short, its links alive, its tour runnable."""

from __future__ import annotations

import re

from tests.support.docs_blocks import ROOT, runnable_blocks

README = ROOT / "README.md"
MAX_LINES = 250


def test_the_readme_is_at_most_250_lines() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_LINES, (
        f"README.md has {lines} lines, at most {MAX_LINES}: move the rest into docs/"
    )


def test_the_readmes_links_into_the_repository_exist() -> None:
    text = README.read_text(encoding="utf-8")
    targets = {
        target.split("#")[0]
        for target in re.findall(r"\]\(([^)\s]+)\)", text)
        if "://" not in target and not target.startswith("#")
    }
    assert targets, "the README links into docs/"
    assert sorted(t for t in targets if not (ROOT / t).exists()) == []


def test_the_readmes_tour_is_runnable() -> None:
    assert runnable_blocks([README]), "README.md has no <!-- runnable --> block"

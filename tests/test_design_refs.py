"""Every pointer at the design document names something that exists (issue 33): a code or doc comment's
``docs/design.md, 'Section'`` names one of its headings, a link ``docs/design.md#anchor`` one of its anchors, and
no "DESIGN section N" of a document outside the repository is left."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"
SOURCES = [p for folder in ("sim", "objectives", "optimizer", "replay", "benchmarks", "studies", "docs", "tests")
           for p in sorted((ROOT / folder).rglob("*"))
           if p.suffix in (".py", ".md") and p != Path(__file__).resolve()] + [ROOT / "README.md"]


def _headings() -> list[str]:
    return [m.group(1).strip() for m in re.finditer(r"^#+\s+(?:\d+\.\s+)?(.+)$", DESIGN.read_text(), re.M)]


def _anchor(heading: str) -> str:  # GitHub's: lower case, punctuation dropped, spaces to dashes
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def test_named_sections_exist():
    headings = set(_headings())
    found = []
    for path in SOURCES:
        for name in re.findall(r"design\.md, '([^']+)'", path.read_text(encoding="utf-8", errors="replace")):
            if " ".join(name.split()) not in headings:
                found.append(f"{path.relative_to(ROOT)}: '{name}'")
    assert not found, f"no such section in docs/design.md: {found}; it has {sorted(headings)}"


def test_linked_anchors_exist():
    anchors = {_anchor(m.group(0).lstrip("#").strip())
               for m in re.finditer(r"^#+\s+.+$", DESIGN.read_text(), re.M)}
    found = [f"{path.relative_to(ROOT)}: #{anchor}" for path in SOURCES
             for anchor in re.findall(r"design\.md#([\w\-]+)", path.read_text(encoding="utf-8", errors="replace"))
             if anchor not in anchors]
    assert not found, found


def test_no_design_section_numbers_of_an_absent_document():
    found = [str(path.relative_to(ROOT)) for path in SOURCES
             if re.search(r"DESIGN(?:\.md)? section \d", path.read_text(encoding="utf-8", errors="replace"))]
    assert not found, found

"""The top-level README is for users (issue 33): at most 250 lines, its test command is the one `.ci/run` runs, no
commit hashes in its prose, and every file it links to exists."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _prose() -> str:
    return re.sub(r"```.*?```", "", README, flags=re.S)


def test_at_most_250_lines():
    assert len(README.splitlines()) <= 250


def test_the_test_command_is_the_one_ci_runs():
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert ci[-1] in re.findall(r"```bash\n(.*?)\n```", README, flags=re.S)


def test_no_commit_hashes_in_prose():
    words = re.findall(r"\b[0-9a-f]{7,40}\b", _prose())
    assert not [w for w in words if re.search(r"[a-f]", w) and re.search(r"\d", w)]


def test_every_linked_file_exists():
    targets = {m.split("#")[0] for m in re.findall(r"\]\(([^)\s]+)\)", README) if not m.startswith("http")}
    assert targets and not [t for t in targets if t and not (ROOT / t).exists()]

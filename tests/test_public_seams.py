"""The packages meet only through public names (issue 33): a module imports another top-level package's modules
and names only where no part of the dotted path is private (``_x``). Within its own package anything goes."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sim", "objectives", "optimizer", "replay")
CALLERS = (*PACKAGES, "benchmarks")


def _private_imports(path: Path, own: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets = [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            targets = [(node.module, alias.name) for alias in node.names]
        else:
            continue
        for module, name in targets:
            parts = module.split(".")
            if parts[0] not in PACKAGES or parts[0] == own:
                continue
            dotted = parts[1:] + ([name] if name else [])
            if any(part.startswith("_") and not part.startswith("__") for part in dotted):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {module}{'.' + name if name else ''}")
    return found


@pytest.mark.parametrize("caller", CALLERS)
def test_other_packages_are_reached_only_through_public_names(caller: str) -> None:
    files = sorted((ROOT / caller).rglob("*.py"))
    assert files, caller
    found = [hit for path in files for hit in _private_imports(path, caller)]
    assert not found, "private names of another package:\n" + "\n".join(found)


def test_the_check_sees_a_private_import(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text("from optimizer._executors import RayExecutor\nimport sim.engine.core\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert _private_imports(tmp_path / "m.py", "benchmarks") == ["m.py:1: optimizer._executors.RayExecutor"]
    finally:
        ROOT = saved

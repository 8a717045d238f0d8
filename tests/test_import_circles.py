"""No import circles among the repository's own modules (issue 33): a module that imports another, at module level
or inside a function (as ``test_public_seams.test_arrows_run_one_way`` counts them), is never imported back by it,
directly or round a longer loop.  A benchmark script's bare ``import x`` is its own folder's ``x.py`` (a script
runs with its folder on ``sys.path``)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sim", "objectives", "optimizer", "replay", "benchmarks")

#: Circles known and not yet broken, each with how to break it; the test fails on any other (and on none of these
#: being a circle any more, so that the entry goes once it is broken).
KNOWN: dict[frozenset[str], str] = {}


def _module_file(dotted: str, base: Path) -> Path | None:
    """The file of module ``dotted`` under ``base`` (a module or a package's ``__init__.py``), or None."""
    path = base.joinpath(*dotted.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _resolve(dotted: str, path: Path) -> Path | None:
    if path.relative_to(ROOT).parts[0] == "benchmarks":
        local = _module_file(dotted, path.parent)
        if local is not None:
            return local
    return _module_file(dotted, ROOT) if dotted.split(".")[0] in PACKAGES else None


def imports_of(path: Path) -> set[Path]:
    """The repository's files that ``path`` imports (a ``from package import submodule`` is that submodule)."""
    found: set[Path] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(f for alias in node.names if (f := _resolve(alias.name, path)) is not None)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = path.parent
                for _ in range(node.level - 1):
                    base = base.parent
                module = _module_file(node.module, base) if node.module else base / "__init__.py"
                module = module if module is not None and module.is_file() else None
            else:
                module = _resolve(node.module or "", path)
            if module is None:
                continue
            for alias in node.names:
                sub = _module_file(alias.name, module.parent) if module.name == "__init__.py" else None
                found.add(sub if sub is not None else module)
    found.discard(path)
    return found


def circles(files: list[Path]) -> list[frozenset[str]]:
    """The strongly connected sets of more than one file in the import graph of ``files`` (Tarjan's algorithm)."""
    graph = {f: sorted(imports_of(f) & set(files)) for f in files}
    index: dict[Path, int] = {}
    low: dict[Path, int] = {}
    stack: list[Path] = []
    on_stack: set[Path] = set()
    out: list[frozenset[str]] = []

    def visit(node: Path) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            members = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                members.append(top)
                if top == node:
                    break
            if len(members) > 1:
                out.append(frozenset(str(m.relative_to(ROOT)) for m in members))

    for f in files:
        if f not in index:
            visit(f)
    return out


def test_no_import_circles() -> None:
    files = sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))
    found = circles(files)
    new = [sorted(c) for c in found if c not in KNOWN]
    assert not new, "import circles:\n" + "\n".join(" <-> ".join(c) for c in new)
    gone = [sorted(c) for c in KNOWN if c not in found]
    assert not gone, f"no longer a circle, drop it from KNOWN: {gone}"


def test_the_check_sees_a_circle(tmp_path: Path, monkeypatch) -> None:
    """Two benchmark scripts that import each other, one inside a function, and a package whose module imports a
    sibling through the package's ``from . import``: two circles; a one-way import is none."""
    bench = tmp_path / "benchmarks"
    bench.mkdir()
    (bench / "a.py").write_text("from b import f\n")
    (bench / "b.py").write_text("def f():\n    import a\n")
    (bench / "c.py").write_text("import a\n")
    pkg = tmp_path / "sim"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "x.py").write_text("from . import y\n")
    (pkg / "y.py").write_text("from sim.x import thing\n")
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    found = set(circles(sorted(tmp_path.rglob("*.py"))))
    assert found == {frozenset({"benchmarks/a.py", "benchmarks/b.py"}), frozenset({"sim/x.py", "sim/y.py"})}

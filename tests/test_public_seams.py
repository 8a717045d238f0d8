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


#: YAML is parsed in one place, sim.safe_yaml (users' files: no aliases, bounded; kvtune's own package data through
#: read_package_yaml).  vllm_parse_config.py runs in vLLM's environment, where kvtune is not installed.
YAML_PARSERS = {"safe_load", "load", "full_load", "unsafe_load", "load_all", "safe_load_all", "compose"}
YAML_OWN = {"sim/safe_yaml.py", "benchmarks/tools/vllm_parse_config.py"}


def _yaml_parses(path: Path) -> list[str]:
    return [f"{path.relative_to(ROOT)}:{node.lineno}"
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path)))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in YAML_PARSERS
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "yaml"]


def test_every_yaml_read_goes_through_sim_safe_yaml() -> None:
    files = [path for caller in CALLERS for path in sorted((ROOT / caller).rglob("*.py"))
             if str(path.relative_to(ROOT)) not in YAML_OWN]
    found = [hit for path in files for hit in _yaml_parses(path)]
    assert not found, "YAML parsed outside sim.safe_yaml:\n" + "\n".join(found)


def test_the_yaml_check_sees_a_direct_parse(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text("import yaml\nfrom pathlib import Path\n"
                                   "doc = yaml.safe_load(Path('p.yaml').read_text())\nyaml.safe_dump(doc)\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert _yaml_parses(tmp_path / "m.py") == ["m.py:3"]
    finally:
        ROOT = saved


#: The arrows run one way: a layer imports only the layers before it (sim <- objectives <- optimizer <- replay <-
#: benchmarks), at module level or inside a function.
LAYERS = ("sim", "objectives", "optimizer", "replay", "benchmarks")


def _imports_above(path: Path, layer: int) -> list[str]:
    above = set(LAYERS[layer + 1:])
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module]
        else:
            continue
        found += [f"{path.relative_to(ROOT)}:{node.lineno}: {m}" for m in modules if m.split(".")[0] in above]
    return found


@pytest.mark.parametrize("layer", range(len(LAYERS) - 1), ids=LAYERS[:-1])
def test_arrows_run_one_way(layer: int) -> None:
    found = [hit for path in sorted((ROOT / LAYERS[layer]).rglob("*.py")) for hit in _imports_above(path, layer)]
    assert not found, f"{LAYERS[layer]} imports a layer above it:\n" + "\n".join(found)

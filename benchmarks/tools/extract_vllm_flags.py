"""Regenerate ``optimizer/data/vllm_flags.yaml`` from vLLM release wheels (a maintainer's tool; not shipped, not
imported).

    pip download --no-deps --only-binary :all: -d wheels/0.18.0 vllm==0.18.0     # one folder per version
    python benchmarks/tools/extract_vllm_flags.py wheels/*/vllm-*.whl > optimizer/data/vllm_flags.yaml

For each wheel it parses ``vllm/engine/arg_utils.py`` (no import, no torch needed) and lists every option string
given to ``add_argument`` that starts with ``--``.  A flag is *negatable* (``--no-<flag>`` exists, which is what
``vllm serve --config`` turns ``flag: false`` into) when its ``add_argument`` call passes
``action=argparse.BooleanOptionalAction`` or spreads ``<group>_kwargs["<field>"]`` for a config field annotated
``bool`` (vLLM's ``get_kwargs`` makes every bool field a ``BooleanOptionalAction``).  ``engines`` says whether the
wheel still ships the V0 engine (``vllm/core/scheduler.py``).
"""

from __future__ import annotations

import ast
import re
import sys
import zipfile


def _bool_fields(sources: list[str]) -> set[str]:
    names: set[str] = set()
    for text in sources:
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                annotation = ast.unparse(node.annotation)
                if re.search(r"\bbool\b", annotation):
                    names.add(node.target.id)
    return names


def extract(wheel: str) -> dict:
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        arg_utils = zf.read("vllm/engine/arg_utils.py").decode()
        configs = [zf.read(n).decode() for n in names if re.fullmatch(r"vllm/config(/[a-z_]+)?\.py", n)]
        has_v0 = "vllm/core/scheduler.py" in names
    bool_fields = _bool_fields(configs)
    flags: set[str] = set()
    negatable: set[str] = set()
    for node in ast.walk(ast.parse(arg_utils)):
        if not (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument"):
            continue
        opts = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
                and a.value.startswith("--")]
        if not opts:
            continue
        flags.update(opts)
        is_bool = False
        for kw in node.keywords:
            if kw.arg == "action" and "BooleanOptionalAction" in ast.unparse(kw.value):
                is_bool = True
            if kw.arg is None:  # **spread
                spread = ast.unparse(kw.value)
                for field in re.findall(r"_kwargs\[['\"](\w+)['\"]\]", spread):
                    if field in bool_fields and "store_true" not in spread:
                        is_bool = True
        if is_bool:
            negatable.update(opts)
    version = re.search(r"vllm-([0-9][^-]*)-", wheel.rsplit("/", 1)[-1]).group(1)
    return {"version": version, "flags": sorted(flags), "negatable": sorted(negatable),
            "engines": ["v0", "v1"] if has_v0 else ["v1"]}


def _flow(key: str, items: list[str], indent: int = 4, width: int = 118) -> str:
    """``key: [a, b, ...]`` as a YAML flow sequence wrapped at ``width``."""
    lines = [" " * indent + f"{key}: ["]
    for i, item in enumerate(items):
        piece = item + ("," if i < len(items) - 1 else "")
        if len(lines[-1]) + len(piece) + 1 > width:
            lines.append(" " * (indent + 2))
        lines[-1] += ("" if lines[-1].endswith("[") or not lines[-1].strip() else " ") + piece
    lines[-1] += "]"
    return "\n".join(lines)


def main(wheels: list[str]) -> None:
    entries = sorted((extract(w) for w in wheels), key=lambda e: [int(p) if p.isdigit() else p
                                                                    for p in re.split(r"[.]", e["version"].replace("post", ""))])
    print("# Real `vllm serve` engine flags, per vLLM release, as data for `kvtune export`.")
    print("# Each list was read from vllm/engine/arg_utils.py of that release's wheel on PyPI (parsed, not imported) by")
    print("# benchmarks/tools/extract_vllm_flags.py. `negatable`: boolean flags that also accept --no-<flag> (what")
    print("# `vllm serve --config` turns `flag: false` into). `engines`: v0 while the wheel still ships vllm/core/scheduler.py.")
    print("# A target version between two listed releases gets only the flags both of them have (see optimizer/_versions.py).")
    print("versions:")
    for e in entries:
        print(f"  \"{e['version']}\":")
        print(f"    source: \"vllm=={e['version']}: vllm/engine/arg_utils.py\"")
        print(f"    engines: [{', '.join(e['engines'])}]")
        print(_flow("negatable", [f[2:] for f in e["negatable"]]))
        print(_flow("flags", [f[2:] for f in e["flags"]]))


if __name__ == "__main__":
    main(sys.argv[1:])

"""Builds the compiled engine (mypyc) beside the sources; everything else is in pyproject.toml.

The modules are ``sim._compiled.COMPILED``; ``KVTUNE_PURE_PYTHON=1 pip install -e .`` builds none (the engine then
runs interpreted, 2-4x slower).  The sha256 of each compiled source is written to ``sim/_compiled_build.json``,
which ``sim._compiled.install`` checks at import so that an edited source is never shadowed by an older build.
"""

import ast
import hashlib
import json
import os
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent


def _compiled_modules() -> tuple:
    tree = ast.parse((HERE / "sim" / "_compiled.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "COMPILED" for t in node.targets):
            return ast.literal_eval(node.value)
    raise SystemExit("setup.py: sim/_compiled.py defines no COMPILED tuple")


def _ext_modules() -> list:
    if os.environ.get("KVTUNE_PURE_PYTHON", "") not in ("", "0"):
        return []
    from mypyc.build import mypycify

    names = _compiled_modules()
    paths = [str(Path(*name.split(".")).with_suffix(".py")) for name in names]
    stamp = {"sha256": {name: hashlib.sha256((HERE / path).read_bytes()).hexdigest()
                        for name, path in zip(names, paths)}}
    (HERE / "sim" / "_compiled_build.json").write_text(json.dumps(stamp, indent=1, sort_keys=True) + "\n")
    # Typing: the engine narrows its optional parts (decode columns, CPU tier, prefix pool) by flags set at start,
    # not by isinstance, so mypy's strict-optional and union checks are off; mypyc still checks every declared
    # type at run time (an int field given a float fails loudly, it is not converted).
    flags = ["--follow-imports=silent", "--ignore-missing-imports",
             "--disable-error-code=union-attr", "--disable-error-code=arg-type", "--disable-error-code=operator",
             "--disable-error-code=assignment", "--disable-error-code=attr-defined", "--disable-error-code=index",
             "--disable-error-code=return-value", "--disable-error-code=import-untyped", "--disable-error-code=type-var"]
    return mypycify(flags + paths, opt_level="3", group_name="sim._engine")


setup(ext_modules=_ext_modules())

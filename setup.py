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
from setuptools.command.build_ext import build_ext

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
    # Typing: mypy checks the compiled modules with three error codes off; mypyc still checks every declared type
    # at run time (an int field given a float fails loudly, it is not converted).  Measured with mypy 2.4.1 on
    # COMPILED with these flags, numpy's types visible and every code on (issue 33): 39 union-attr, 2 operator, 2
    # assignment; of the nine codes once off, attr-defined, index and import-untyped fired nowhere, and return-value,
    # type-var and arg-type fired 1, 1 and 7 times (fixed: a resolved config's limits typed int, the decode columns
    # narrowed where they are read after the flag).  Left off:
    #   union-attr: the optional parts (decode columns, the prefix pool in place of the plain pool, the step queue)
    #     are read after the flag that made them (use_decode_columns, blocks_hashed), not after an isinstance/None test;
    #   operator: arithmetic on a resolved config's watermark (float | None before resolve; scheduler_v1.py) and on
    #     a device's fp8_tflops behind its fp8 flag (latency/_roofline.py);
    #   assignment: decode_columns.py names a list of rows as it named an ndarray a few lines up (rename to enable).
    flags = ["--follow-imports=silent", "--ignore-missing-imports",
             "--disable-error-code=union-attr", "--disable-error-code=operator", "--disable-error-code=assignment"]
    return mypycify(flags + paths, opt_level="3", group_name="sim._engine")


class _BuildExt(build_ext):
    """``build_ext --inplace`` that puts each built module in place as a new file (unlink, then copy) instead of
    writing over the old one: a process that has the old module loaded (a benchmark or a study running while the
    tree is rebuilt) keeps its mapping instead of crashing on truncated pages (SIGBUS)."""

    def copy_file(self, infile, outfile, *args, **kwargs):
        if self.inplace and os.path.isfile(outfile):
            os.unlink(outfile)
        return super().copy_file(infile, outfile, *args, **kwargs)


setup(ext_modules=_ext_modules(), cmdclass={"build_ext": _BuildExt})

"""Where a ``sim_speed`` case's ``simulate`` spends its instructions in the compiled engine (sim/_compiled.py), which
cProfile cannot see: valgrind's callgrind, collecting only inside ``simulate``, then the inclusive share of

- each compiled engine function (``CPyDef_...``: module, class and method in mypyc's naming);
- numba's dispatcher (``Dispatcher_call``: typing the arguments of each kernel call, plus the kernels it runs);
- a few CPython and numpy costs that the compiled code still pays (float and tuple objects, Python run by the
  interpreter, numpy arrays made from lists, the cyclic collector).

One run of the case, built as ``benchmarks/sim_speed.py`` builds it (valgrind runs Python 20-60x slower: the reasoning
case takes ~2.5 minutes).  Instruction counts, not seconds: repeatable whatever else the machine does.

    python benchmarks/tools/compiled_profile.py --case reasoning [--top 20]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[2]

_RUN = r"""
import sys
sys.path.insert(0, sys.argv[2] + "/benchmarks")
sys.path.insert(0, sys.argv[2])
import sim_speed
from sim import _compiled
assert _compiled.state() == "compiled", "the compiled engine is not built (pip install -e .)"
from sim.engine.decode_columns import warm_up
from sim.profiles import load_gpu, load_model
from sim.runner import simulate
workload, config, model, gpu, kwargs = sim_speed._build(sys.argv[1])
kwargs.pop("trial", None)
model, gpu = load_model(model), load_gpu(gpu)
warm_up()
simulate(workload, config, model, gpu, **kwargs)
"""

#: Named costs outside the engine's own functions: label -> callgrind function name (inclusive).
_NAMED = {
    "numba dispatcher and kernels": "Dispatcher_call",
    "interpreted Python (SimPy; the frame loop's own cost)": "_PyEval_EvalFrameDefault",
    "numpy arrays made from Python lists (np.array)": "PyArray_FromAny_int",
    "numpy element packing (in np.array of lists, arr[i] = x)": "PyArray_Pack",
    "cyclic collector": "gc_collect_main",
    "float objects made": "PyFloat_FromDouble",
    "tuples freed": "tupledealloc",
}
_LINE = re.compile(r"^\s*([\d,]+)\s+\(\s*([\d.]+)%\)\s+(\S.*)$")


def _function(where: str) -> str:
    name = where.split(" [", 1)[0]
    return name.rsplit(":", 1)[-1].split("(", 1)[0].split("'", 1)[0]


def _shares(out: Path, inclusive: bool) -> tuple[dict[str, float], int]:
    """{function: share %} from callgrind_annotate (a function listed once per source file: the largest with
    ``inclusive``, their sum without), and the total instruction count."""
    report = subprocess.run(["callgrind_annotate", f"--inclusive={'yes' if inclusive else 'no'}", "--threshold=100",
                             str(out)], capture_output=True, text=True, check=True).stdout
    shares: dict[str, float] = {}
    total = 0
    for line in report.splitlines():
        found = _LINE.match(line)
        if not found:
            continue
        count, pct, where = int(found.group(1).replace(",", "")), float(found.group(2)), found.group(3)
        if "PROGRAM TOTALS" in where:
            total = count
            continue
        name = _function(where).strip()
        shares[name] = max(shares.get(name, 0.0), pct) if inclusive else shares.get(name, 0.0) + pct
    return shares, total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", default="reasoning", help="a benchmarks/sim_speed.py case")
    ap.add_argument("--top", type=int, default=20, help="how many compiled functions to list")
    args = ap.parse_args()
    for tool in ("valgrind", "callgrind_annotate"):
        if shutil.which(tool) is None:
            print(f"error: {tool} is not installed (Debian: apt-get install valgrind)", file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        proc = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
             "--toggle-collect=CPyDef_runner___simulate", sys.executable, "-c", _RUN, args.case, str(HERE)],
            capture_output=True, text=True, env=dict(os.environ, PYTHONHASHSEED="0"))
        if proc.returncode != 0 or not out.exists():
            lines = [line for line in proc.stderr.splitlines() if not line.startswith(("==", "--"))]
            print(f"error: the valgrind run of {args.case!r} failed (exit {proc.returncode}): "
                  + "\n".join(lines[-5:]), file=sys.stderr)
            return 1
        inclusive, total = _shares(out, True)
        own, _ = _shares(out, False)
    print(f"# {args.case}: {total / 1e9:.2f} G instructions inside simulate (callgrind)")
    print("| what | share |")
    print("|---|---|")
    for label, name in _NAMED.items():
        # The interpreter's frame loop recurses (its inclusive share counts nested frames again): its own cost.
        shares = own if name == "_PyEval_EvalFrameDefault" else inclusive
        share = sum(v for k, v in shares.items() if k == name) if shares is own else \
            max((v for k, v in shares.items() if k.startswith(name)), default=0.0)
        print(f"| {label} (`{name}`) | {share:.1f}% |")
    shares = inclusive
    engine = sorted(((v, k) for k, v in shares.items() if k.startswith("CPyDef_")), reverse=True)
    print("\n| compiled function | inclusive share |\n|---|---|")
    for share, name in engine[:args.top]:
        print(f"| `{name}` | {share:.1f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The Vidur comparison's kvtune side (``vs_vidur.py``), whole process, in two checkouts, A B A B: what the bytecode
cache that ``bytecode_cache.kvtune_env`` gives the peer benchmarks' kvtune side saves (:func:`main`):

    python benchmarks/whole_process.py --base OTHER_CHECKOUT [--pairs 8] [--base-from-source]
"""

from __future__ import annotations

from pathlib import Path


def main() -> None:
    """``kvtune simulate`` of the Vidur comparison (vs_vidur.py's kvtune side), whole process, in two checkouts:
    A (``--base``) and B (this one), A B A B, each run a fresh process (the command pins it with ``taskset`` if
    wanted); prints user+sys CPU seconds per pair, B's saving, and the medians.

        python benchmarks/whole_process.py --base OTHER_CHECKOUT [--pairs 8] [--base-from-source]

    ``--base-from-source``: A runs as the environment has it (where ``PYTHONDONTWRITEBYTECODE`` is set, compiling its
    modules every run, as vs_vidur.py did before :func:`kvtune_env`); B always with its bytecode cache.
    Both checkouts need their compiled engine built (``python setup.py build_ext --inplace``)."""
    import argparse
    import json
    import os
    import statistics
    import tempfile

    from bytecode_cache import kvtune_env
    from vs_vidur import kvtune_cmd, timed, write_traces

    p = argparse.ArgumentParser(description=main.__doc__.split("\n\n")[0])
    p.add_argument("--base", type=Path, required=True, help="checkout A (its sim/ with a built engine)")
    p.add_argument("--pairs", type=int, default=8)
    p.add_argument("--base-from-source", action="store_true")
    args = p.parse_args()
    here = Path(__file__).resolve().parent.parent
    trees = {"A": args.base.resolve(), "B": here}
    with tempfile.TemporaryDirectory(prefix="whole_process_") as tmp:
        folder = Path(tmp)
        trace, _, n = write_traces(folder, None)

        def run(side: str, i: int) -> dict:
            env = {**os.environ, "PYTHONPATH": str(trees[side])}
            if side == "B" or not args.base_from_source:
                env = kvtune_env(env, folder / f"pycache{side}")
            out = folder / f"{side}{i}"
            r = timed(kvtune_cmd(trace, out, "vllm-v0"), env, trees[side], folder / f"{side}{i}.log")
            r["makespan_s"] = json.loads((out / "summary.json").read_text())["metrics"].get("makespan_s")
            return r

        print(f"{n} requests; A {trees['A']} B {trees['B']}; load average {os.getloadavg()[0]:.1f}", flush=True)
        for side in trees:  # untimed: bytecode, the page cache
            run(side, 0)
        cpu: dict[str, list[float]] = {"A": [], "B": []}
        for i in range(1, args.pairs + 1):
            a, b = run("A", i), run("B", i)
            cpu["A"].append(a["cpu_s"])
            cpu["B"].append(b["cpu_s"])
            print(f"pair {i}: CPU s A {a['cpu_s']:.3f} B {b['cpu_s']:.3f} (A-B {a['cpu_s'] - b['cpu_s']:+.3f}); "
                  f"makespan A {a['makespan_s']} B {b['makespan_s']}; load {os.getloadavg()[0]:.1f}", flush=True)
    saving = [x - y for x, y in zip(cpu["A"], cpu["B"])]
    print(f"median CPU s A {statistics.median(cpu['A']):.3f} B {statistics.median(cpu['B']):.3f}; "
          f"A-B per pair median {statistics.median(saving):+.3f} (min {min(saving):+.3f}, max {max(saving):+.3f})")


if __name__ == "__main__":
    main()

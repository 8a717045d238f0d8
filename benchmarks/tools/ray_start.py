"""Where a local Ray's start goes: the wall time of kvtune's ``RayExecutor.start`` (``ray.init`` and N trial workers
warmed up, as a study starts them), then the CPU seconds each process has used by then, Ray's own and the
driver's.  A study with local Ray pays all of it before its first trial, on the same cores as its trials.

    python benchmarks/tools/ray_start.py [--workers 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's optimizer/
_HZ = os.sysconf("SC_CLK_TCK")


def _label(cmdline: str) -> str:
    """A process's short name: ``ray::X`` titles as they are, else the script or binary run."""
    if cmdline.startswith("ray::"):
        return cmdline.split()[0]
    parts = cmdline.split()
    for part in parts:
        if part.endswith(".py"):
            return Path(part).name
    return Path(parts[0]).name if parts else "?"


def _process_cpu() -> list[tuple[float, str]]:
    """(CPU seconds, name) of every process of this session's Ray and of this driver."""
    me = os.getpid()
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # (gone meanwhile, or not ours to read)
            continue
        fields = stat.rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / _HZ  # utime + stime
        pid = int(entry.name)
        if pid == me or "/ray/" in cmdline or cmdline.startswith("ray::"):
            out.append((cpu, "driver (this process)" if pid == me else _label(cmdline)))
    return sorted(out, reverse=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    t0 = time.perf_counter()
    from optimizer import RayExecutor

    t1 = time.perf_counter()
    executor = RayExecutor(workers=args.workers)
    executor.start()
    t2 = time.perf_counter()
    rows = _process_cpu()
    print(f"imports {t1 - t0:.2f} s, RayExecutor.start ({executor.capacity} workers ready) {t2 - t1:.2f} s (wall)")
    print("| process | CPU s |\n|---|---|")
    for cpu, name in rows:
        if cpu > 0:
            print(f"| {name} | {cpu:.2f} |")
    print(f"| all | {sum(cpu for cpu, _ in rows):.2f} |")
    t3 = time.perf_counter()
    executor.shutdown()
    print(f"RayExecutor.shutdown {time.perf_counter() - t3:.2f} s (wall)")


if __name__ == "__main__":
    main()

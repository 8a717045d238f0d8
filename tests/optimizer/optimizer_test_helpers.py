"""Helpers of the optimizer tests: a small study spec and a writer for it.

The study: the first 300 requests of the bundled Azure conversation trace on Llama-2-7B / L40S (KV-heavy MHA
model on a 48 GB GPU), ``max_model_len`` 4096, one class ``conv`` with a p99 e2e SLO of 40 s.  vLLM's default
config misses that SLO (p99 e2e about 65 s); fp8 KV with a moderate token budget meets it.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

SLO_E2E_S = 40.0

BASE_SPEC: dict[str, Any] = {
    "name": "conv-l40s",
    "workload": {
        "trace": "bundled",
        "classes": {"conv": {"slo": {"e2e_p99_s": SLO_E2E_S}}},
        "max_requests": 300,
    },
    "model": "Llama-2-7B",
    "gpu": "L40S",
    "vllm_version": ">=0.18",
    "engine": {"max_model_len": 4096},
    "objectives": ["output_tokens_per_s", "p99_e2e_s:conv"],
    "budget": {"trials": 20, "trial_timeout_s": 120},
    "sampler": {"name": "tpe", "seed": 0},
}


def with_changes(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """A deep copy of ``base`` with top-level keys replaced (``None`` removes a key)."""
    d = copy.deepcopy(base)
    for key, value in changes.items():
        if value is None:
            d.pop(key, None)
        else:
            d[key] = value
    return d


def spec_dict(**changes: Any) -> dict[str, Any]:
    """BASE_SPEC with top-level keys replaced (``None`` removes a key)."""
    return with_changes(BASE_SPEC, **changes)


def write_spec(folder: Path, d: dict[str, Any], name: str = "study.yaml") -> Path:
    path = Path(folder) / name
    path.write_text(yaml.safe_dump(d, sort_keys=False))
    return path

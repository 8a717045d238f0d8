"""Helpers of the optimizer tests: a small study spec and a writer for it.

The study: the first 300 requests of the bundled Azure conversation trace on Llama-2-7B / L40S (KV-heavy MHA
model on a 48 GB GPU), ``max_model_len`` 4096, one class ``conv`` with a p99 e2e SLO of 40 s.  vLLM's default
config misses that SLO (p99 e2e about 65 s); fp8 KV with a moderate token budget meets it.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from optimizer import TrialBackend

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


class SlowBackend(TrialBackend):
    """Test-only: a trial that takes long enough to be stopped in the middle (a file tells it started)."""

    name = "slow"

    def __init__(self, flag: str):
        self.flag = flag

    def run(self, params, seeds):
        Path(self.flag).write_text(str(os.getpid()))  # the process the trial runs in
        time.sleep(120)
        return {}


def start_slow_tune(folder: Path, *tune_args: str, cwd: Path) -> tuple[subprocess.Popen, Path, str, Path]:
    """``kvtune tune`` of a 2-trial spec in ``folder`` (SQLite storage there, no export, ``tune_args`` added) in a
    subprocess whose trials are :class:`SlowBackend`'s, returned once the first trial started: the process, the
    flag file (the trial's process id), the storage URL and the spec."""
    spec_path = write_spec(folder, spec_dict(budget={"trials": 2}))
    storage = f"sqlite:///{Path(folder) / 'study.db'}"
    flag = Path(folder) / "started"
    script = (
        "import sys\n"
        "sys.path.insert(0, %r)\n"
        "from optimizer_test_helpers import SlowBackend\n"
        "from optimizer.cli import main\n"
        "import optimizer._study as s\n"
        "s.Tuner.make_backend = lambda self, ctx: SlowBackend(%r)\n"
        "sys.exit(main(['tune', %r, *%r, '--storage', %r, '--no-export']))\n"
    ) % (str(Path(__file__).parent), str(flag), str(spec_path), list(tune_args), storage)
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(repo)})
    deadline = time.monotonic() + 300
    while not flag.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert flag.exists(), proc.communicate()[1]
    return proc, flag, storage, spec_path

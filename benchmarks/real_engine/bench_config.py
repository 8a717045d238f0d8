"""What the fidelity benchmark's scripts share about a run: the engine config a benchmark config stands for, and the
metrics of a request table (simulated or measured).  Its own module so that ``run.py`` and ``scale.py`` both import it
and neither imports the other."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from sim.engine.config import EngineConfig
from workloads import MAX_MODEL_LEN

BLOCK_SIZE = 32


@dataclass(frozen=True)
class BenchConfig:
    name: str
    max_num_seqs: int
    max_num_batched_tokens: int
    num_gpu_blocks: int
    prefix_caching: bool
    #: The workloads replayed on it.
    workloads: tuple[str, ...] = ("azure", "reasoning")
    max_model_len: int = MAX_MODEL_LEN

    def engine_config(self) -> EngineConfig:
        return EngineConfig(max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.max_num_batched_tokens,
                            block_size=BLOCK_SIZE, max_model_len=self.max_model_len,
                            enable_prefix_caching=self.prefix_caching, num_gpu_blocks_override=self.num_gpu_blocks)


def _q(values: pd.Series, q: float) -> float:
    values = values.dropna()
    return float(np.quantile(values, q)) if len(values) else math.nan


def table_metrics(req: pd.DataFrame) -> dict[str, float]:
    done = req[req["status"] == "finished"]
    span = float(req["end_s"].max() - req["arrival_s"].min()) if len(req) else math.nan
    return {
        "ttft_p50": _q(done["ttft_s"], 0.5), "ttft_p99": _q(done["ttft_s"], 0.99),
        "e2e_p50": _q(done["e2e_s"], 0.5), "e2e_p99": _q(done["e2e_s"], 0.99),
        "tpot_p50": _q(done["tpot_s"], 0.5),
        "output_tok_s": float(done["generated_tokens"].sum()) / span if span > 0 else math.nan,
        "timed_out": float((req["status"] == "timed_out").sum()),
    }


def predicted_metrics(req: pd.DataFrame) -> dict[str, float]:
    out = table_metrics(req)
    k = req["num_preemptions"].fillna(0)
    out["preemptions"] = float(k.sum())
    out["requests_preempted"] = float((k > 0).sum())
    out["preempted_twice"] = float((k > 1).sum())
    return out

"""A step time linear in the tokens scheduled: the simple, shared model for decision-level comparisons."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.latency._base import LatencyModel, StepShape


@dataclass(frozen=True)
class LinearStepModel(LatencyModel):
    """``duration = base_s + per_token_s * scheduled_tokens``.

    This is the time model of the vLLM reference replay script (shared/tools/vllm-reference), so that
    kvtune and vLLM's real scheduler can be stepped in lock-step for conformance checks.
    """

    base_s: float = 0.01
    per_token_s: float = 0.0

    def step_time(self, shape: StepShape) -> float:
        return self.base_s + self.per_token_s * (shape.prefill_tokens + shape.num_decode)

    def decode_run_times(self, batch_size: int, context_sum: int, num_steps: int) -> np.ndarray:
        return np.full(num_steps, self.base_s + self.per_token_s * batch_size)

    def decode_run_affine(self, batch_size: int, context_sum: int) -> tuple[float, float]:
        return self.base_s + self.per_token_s * batch_size, 0.0

    def overhead_time(self, shape: StepShape) -> float:
        return self.base_s

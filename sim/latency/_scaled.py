"""A latency model whose every step takes a fixed factor longer (or shorter): robustness re-simulations."""

from __future__ import annotations

import numpy as np

from sim.latency._base import LatencyModel, StepShape


class ScaledLatency(LatencyModel):
    """``base``'s step, decode-run and host-link times multiplied by ``factor`` (> 0)."""

    def __init__(self, base: LatencyModel, factor: float):
        if not factor > 0:
            raise ValueError(f"factor must be > 0, got {factor}")
        self.base = base
        self.factor = float(factor)

    def step_time(self, shape: StepShape) -> float:
        return self.factor * self.base.step_time(shape)

    def decode_run_times(self, batch_size: int, context_sum: int, num_steps: int) -> np.ndarray:
        return self.factor * self.base.decode_run_times(batch_size, context_sum, num_steps)

    def decode_run_affine(self, batch_size: int, context_sum: int) -> tuple[float, float] | None:
        affine = self.base.decode_run_affine(batch_size, context_sum)
        return None if affine is None else (self.factor * affine[0], self.factor * affine[1])

    def swap_time(self, num_blocks: int, num_copies: int) -> float:
        return self.factor * self.base.swap_time(num_blocks, num_copies)

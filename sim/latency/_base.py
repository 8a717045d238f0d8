"""The latency-model interface the engine calls between ``schedule()`` and ``update_from_output()``."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np


@dataclass
class StepShape:
    """What one step computes, aggregated over its requests.

    ``prefill_tokens``: tokens of prefill chunks (new and recomputed); ``prefill_attention``: sum over chunks of
    ``chunk * (context_before + chunk / 2)`` (the causal attention work of the chunks); ``prefill_context``:
    sum over chunks of ``context_before + chunk`` (KV read by the chunks); ``num_decode``: decode sequences;
    ``decode_context``: sum of their context lengths (KV read); ``num_seqs``: all scheduled sequences;
    ``swap_blocks``/``swap_copies``: blocks moved over the host link and the number of copy calls.
    """

    prefill_tokens: int = 0
    prefill_attention: float = 0.0
    prefill_context: int = 0
    num_decode: int = 0
    decode_context: int = 0
    num_seqs: int = 0
    swap_blocks: int = 0
    swap_copies: int = 0


class LatencyModel(ABC):
    """Maps a step's shape to its duration in seconds."""

    @abstractmethod
    def step_time(self, shape: StepShape) -> float:
        """Duration of one step."""

    def decode_run_times(self, batch_size: int, context_sum: int, num_steps: int) -> np.ndarray:
        """Durations of ``num_steps`` consecutive pure-decode steps of ``batch_size`` sequences whose context
        sum is ``context_sum`` at the first step and grows by ``batch_size`` per step.

        Subclasses override this with a vectorised form; it is the simulator's hot path.
        """
        return np.array(
            [
                self.step_time(StepShape(num_decode=batch_size, decode_context=context_sum + j * batch_size, num_seqs=batch_size))
                for j in range(num_steps)
            ]
        )

    def decode_run_affine(self, batch_size: int, context_sum: int) -> tuple[float, float] | None:
        """``(first, increment)`` when a pure-decode run's step times are ``first + increment * j`` exactly,
        so the engine can bound and sum a run in closed form; ``None`` when they are not (then it uses
        :meth:`decode_run_times`)."""
        return None

    def swap_time(self, num_blocks: int, num_copies: int) -> float:
        """Host-link time to move ``num_blocks`` KV blocks in ``num_copies`` copy calls (0 if unsupported)."""
        return 0.0

"""The latency-model interface the engine calls between ``schedule()`` and ``update_from_output()``."""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np
from mypy_extensions import mypyc_attr


class StepShape:
    """What one step computes, aggregated over its requests.

    ``prefill_tokens``: tokens of prefill chunks (new and recomputed); ``prefill_attention``: sum over chunks of
    ``chunk * (context_before + chunk / 2)`` (the causal attention work of the chunks); ``prefill_context``:
    sum over chunks of ``context_before + chunk`` (KV read by the chunks); ``num_decode``: decode sequences;
    ``decode_context``: sum of their context lengths (KV read); ``num_seqs``: all scheduled sequences;
    ``swap_blocks``/``swap_copies``: blocks moved over the host link and the number of copy calls;
    ``recompute_tokens``/``recompute_attention``/``recompute_context``: the part of the three prefill fields that
    re-prefills tokens computed before a preemption (included in them, kept apart for :meth:`LatencyModel.step_parts`).

    A plain class with its own ``__init__``, not a dataclass: the compiled engine (sim/_compiled.py) makes one or
    more per step, and a compiled dataclass keeps the ``__init__`` the dataclasses module generates, run by the
    interpreter (``benchmarks/tools/compiled_profile.py --case reasoning``: making SchedulerOutput and StepParts
    was 8.3% and 6.9% of its instructions).
    """

    def __init__(self, prefill_tokens: int = 0, prefill_attention: float = 0.0, prefill_context: int = 0,
                 num_decode: int = 0, decode_context: int = 0, num_seqs: int = 0, swap_blocks: int = 0,
                 swap_copies: int = 0, recompute_tokens: int = 0, recompute_attention: float = 0.0,
                 recompute_context: int = 0) -> None:
        self.prefill_tokens = prefill_tokens
        self.prefill_attention = prefill_attention
        self.prefill_context = prefill_context
        self.num_decode = num_decode
        self.decode_context = decode_context
        self.num_seqs = num_seqs
        self.swap_blocks = swap_blocks
        self.swap_copies = swap_copies
        self.recompute_tokens = recompute_tokens
        self.recompute_attention = recompute_attention
        self.recompute_context = recompute_context

    def as_tuple(self) -> tuple:
        return (self.prefill_tokens, self.prefill_attention, self.prefill_context, self.num_decode,
                self.decode_context, self.num_seqs, self.swap_blocks, self.swap_copies, self.recompute_tokens,
                self.recompute_attention, self.recompute_context)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StepShape) and self.as_tuple() == other.as_tuple()

    def __repr__(self) -> str:
        return f"StepShape{self.as_tuple()}"


#: The parts of a step's duration, in the order of the step table's ``time_*_s`` columns.
PART_NAMES: tuple[str, ...] = ("prefill_new", "recompute", "decode", "transfer", "overhead")


class StepParts:
    """A step's duration split by what it served (seconds; the parts sum to the duration).

    ``overhead_s`` is the batch-independent time of a step that computes anything (host scheduling and input
    preparation, per-layer small kernels), less what the latency model says async scheduling hides behind the
    GPU's work (:meth:`LatencyModel.hidden_overhead_time`): hidden time is in no step's duration, so in no part.
    ``transfer_s`` is host-link time (swap, CPU-offload stores and loads).  ``decode_s`` is what the step's
    decodes alone cost beyond the overhead; ``prefill_new_s`` + ``recompute_s`` is what its prefill chunks add on
    top of the decodes (their marginal cost: the weights a decode batch streams anyway are not charged again),
    split between new and recomputed tokens in proportion to the marginal cost of each alone.  (A plain class for
    the reason StepShape is one.)
    """

    def __init__(self, prefill_new_s: float = 0.0, recompute_s: float = 0.0, decode_s: float = 0.0,
                 transfer_s: float = 0.0, overhead_s: float = 0.0) -> None:
        self.prefill_new_s = prefill_new_s
        self.recompute_s = recompute_s
        self.decode_s = decode_s
        self.transfer_s = transfer_s
        self.overhead_s = overhead_s

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StepParts) and self.as_tuple() == other.as_tuple()

    def __hash__(self) -> int:  # (hashable, as the frozen dataclass it replaced)
        return hash(self.as_tuple())

    def __repr__(self) -> str:
        return "StepParts(" + ", ".join(f"{n}_s={v!r}" for n, v in zip(PART_NAMES, self.as_tuple())) + ")"

    def as_tuple(self) -> tuple[float, float, float, float, float]:
        return (self.prefill_new_s, self.recompute_s, self.decode_s, self.transfer_s, self.overhead_s)

    @property
    def total_s(self) -> float:
        return self.prefill_new_s + self.recompute_s + self.decode_s + self.transfer_s + self.overhead_s


# Compiled (sim/_compiled.py) and still subclassed by interpreted models (LinearStepModel, ScaledLatency, a user's).
@mypyc_attr(allow_interpreted_subclasses=True)
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

    def overhead_time(self, shape: StepShape) -> float:
        """The batch-independent time of a step that computes tokens (0 when the model has none)."""
        return 0.0

    def hidden_overhead_time(self, shape: StepShape) -> float:
        """The part of :meth:`overhead_time` that async scheduling overlaps with the GPU's work, so that
        :meth:`step_time` does not contain it (0: no overlap modelled).  A model that hides overhead subtracts
        this from ``step_time``; :meth:`step_parts` subtracts it from the overhead part."""
        return 0.0

    def step_parts(self, shape: StepShape, total_s: float | None = None) -> StepParts:
        """Split ``step_time(shape)`` into :class:`StepParts` by marginal costs, using only :meth:`step_time`,
        :meth:`swap_time` and the overhead hooks, so every latency model gets it.  The parts sum to the step
        time up to float rounding; each is non-negative when step time grows with every shape field.
        ``total_s``: ``step_time(shape)``, when the caller has it already."""
        total = self.step_time(shape) if total_s is None else total_s  # (the caller's step_time(shape))
        transfer = self.swap_time(shape.swap_blocks, shape.swap_copies) if shape.swap_blocks else 0.0
        if shape.prefill_tokens + shape.num_decode == 0:
            return StepParts(transfer_s=transfer, overhead_s=total - transfer)
        overhead = self.overhead_time(shape) - self.hidden_overhead_time(shape)
        compute = total - transfer
        if not shape.prefill_tokens:
            return StepParts(decode_s=compute - overhead, transfer_s=transfer, overhead_s=overhead)
        decodes = StepShape(num_decode=shape.num_decode, decode_context=shape.decode_context, num_seqs=shape.num_decode)
        decode_only = self.step_time(decodes) if shape.num_decode else overhead
        prefill = compute - decode_only
        recompute = 0.0
        if shape.recompute_tokens >= shape.prefill_tokens:
            recompute = prefill
        elif shape.recompute_tokens:
            # (StepShape built directly, not with dataclasses.replace: several times cheaper on this hot path.)
            num_decode, decode_context, num_seqs = shape.num_decode, shape.decode_context, shape.num_seqs
            base = StepShape(num_decode=num_decode, decode_context=decode_context, num_seqs=num_seqs)
            base_s = self.step_time(base)
            rec = StepShape(prefill_tokens=shape.recompute_tokens, prefill_attention=shape.recompute_attention,
                            prefill_context=shape.recompute_context, num_decode=num_decode,
                            decode_context=decode_context, num_seqs=num_seqs)
            new = StepShape(prefill_tokens=shape.prefill_tokens - shape.recompute_tokens,
                            prefill_attention=shape.prefill_attention - shape.recompute_attention,
                            prefill_context=shape.prefill_context - shape.recompute_context, num_decode=num_decode,
                            decode_context=decode_context, num_seqs=num_seqs)
            m_rec = self.step_time(rec) - base_s
            m_new = self.step_time(new) - base_s
            weight = m_rec / (m_rec + m_new) if m_rec + m_new > 0 else shape.recompute_tokens / shape.prefill_tokens
            recompute = prefill * weight
        return StepParts(prefill_new_s=prefill - recompute, recompute_s=recompute, decode_s=decode_only - overhead,
                         transfer_s=transfer, overhead_s=overhead)

    def run_parts(self, shape: StepShape, duration_s: float, num_steps: int) -> StepParts:
        """Parts of a step (``num_steps`` 1) or of a run of ``num_steps`` pure-decode steps lasting ``duration_s``
        in all: a run's steps are decode and overhead only."""
        if num_steps == 1:
            return self.step_parts(shape, duration_s)  # a single step's duration is step_time(shape)
        overhead = num_steps * (self.overhead_time(shape) - self.hidden_overhead_time(shape))
        return StepParts(decode_s=duration_s - overhead, overhead_s=overhead)

"""One step's output: what ``schedule()`` decided (:class:`SchedulerOutput`) and the split of a request's scheduled
tokens into new prefill, recompute and decode (:func:`split_tokens`) that the step table and the time attribution use.

As in vLLM's v1 core (vllm/v1/core/sched/output.py), the scheduler hands the step's decision to the engine core as
one object; ``update_from_output()`` (:class:`~sim.engine.scheduler_base.BaseScheduler`) applies it.
"""

from __future__ import annotations

from sim.engine.request import Request
from sim.latency import StepShape


class SchedulerOutput:
    """One step's decision, with the token accounting the step table needs.  (A plain class: see
    :class:`~sim.latency.StepShape` on why not a dataclass.)  A scheduler reuses the output the engine core hands
    back once applied (:meth:`BaseScheduler.new_output`, :meth:`reset`) instead of making one per step."""

    def __init__(self) -> None:
        self.scheduled: list[tuple[Request, int]] = []
        self.preempted: list[Request] = []
        #: ``(new prefill, recompute, decode)`` tokens of each entry of ``scheduled`` after the bulk ones, split when
        #: it was scheduled (``split_tokens``), so that the step's time is attributed without splitting again.
        self.splits: list[tuple[int, int, int]] = []
        self.shape = StepShape()
        self.reset()

    def reset(self) -> None:
        """Back to a fresh output's state (``SchedulerOutput()``), keeping its objects: making and freeing one
        output and its shape per step cost ~2% of a cold reasoning run's instructions (callgrind).  A list that is
        not empty is replaced, not emptied in place, so that a list taken from an earlier step never changes (it
        costs what ``list.clear()`` does, measured; the decode fast path replaces ``scheduled`` anyway)."""
        if self.scheduled:
            self.scheduled = []
        if self.preempted:
            self.preempted = []
        if self.splits:
            self.splits = []
        _zero_shape(self.shape)
        self.num_admitted = 0
        self.prefill_tokens_new = 0
        self.prefill_tokens_recompute = 0
        self.decode_tokens = 0
        self.swap_out_blocks = 0
        self.swap_in_blocks = 0
        self.swap_copies = 0
        #: True when this step is pure decode of every running request, nothing admitted or preempted, and
        #: whatever stopped admission cannot change until a request finishes (so identical steps can be batched).
        self.steady_decode = False
        #: Fewest outputs any running request still has to produce, when the scheduler computed it (else 0).
        self.min_remaining_outputs = 0
        #: How many leading entries of ``scheduled`` the decode fast path scheduled (one decode token each, see
        #: :meth:`BaseScheduler._schedule_decode_prefix`); it leaves their processed-token count to
        #: update_from_output.
        self.bulk_decode = 0
        #: How many of the bulk entries are the scheduler's decode columns (updated as arrays).
        self.columnar = 0


def _zero_shape(shape: StepShape) -> None:
    """``shape`` as ``StepShape()`` makes it (tests/sim/engine/test_output_reuse.py compares them field by field)."""
    shape.prefill_tokens = 0
    shape.prefill_attention = 0.0
    shape.prefill_context = 0
    shape.num_decode = 0
    shape.decode_context = 0
    shape.num_seqs = 0
    shape.swap_blocks = 0
    shape.swap_copies = 0
    shape.recompute_tokens = 0
    shape.recompute_attention = 0.0
    shape.recompute_context = 0


def split_tokens(req: Request, num_new: int) -> tuple[int, int, int]:
    """``(new prefill, recompute, decode)`` tokens among the ``num_new`` scheduled for ``req`` from its current
    ``num_computed_tokens``: below ``high_water`` is recompute, then prompt tokens are new prefill, the rest decode."""
    computed = req.num_computed_tokens
    end = computed + num_new
    high = req.high_water
    recompute = min(end, high) - computed
    if recompute < 0:
        recompute = 0
    prefill_new = min(end, req.prompt_tokens) - (computed if computed > high else high)
    if prefill_new < 0:
        prefill_new = 0
    return prefill_new, recompute, num_new - recompute - prefill_new

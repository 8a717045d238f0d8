"""The per-step numbers the engine passes as C doubles in the compiled engine are the values Python's own forms give.

``sim.engine.core._shares`` divides by ``float(n)`` (Python's float-by-int division converts ``n`` the same way) and
returns four floats where it returned a tuple or None; ``sim.run_loop.least`` is ``min`` of three floats written out.
Both are compared bit for bit with the forms they replaced (``<=`` for ``<`` in ``least`` fails on the signed-zero
ties).
"""

from __future__ import annotations

import struct

from hypothesis import example, given
from hypothesis import strategies as st

from sim.engine.core import _shares
from sim.engine.scheduler_output import SchedulerOutput
from sim.latency import StepParts
from sim.run_loop import least

_floats = st.floats(allow_nan=True, allow_infinity=True)
_seconds = st.floats(min_value=0.0, max_value=1e6, allow_nan=False) | st.floats(allow_nan=False)


def _bits(x: float) -> bytes:
    return struct.pack("<d", x)


@given(_floats, _floats, _floats)
@example(0.0, -0.0, 1.0)  # ties: the first least value, as ``min`` keeps it (its sign tells them apart)
@example(1.0, 0.0, -0.0)
@example(float("nan"), 1.0, 0.0)
@example(1.0, float("nan"), 0.0)
def test_least_is_min(a, b, c):
    assert _bits(least(a, b, c)) == _bits(min(a, b, c))


def _reference_shares(out: SchedulerOutput, parts: StepParts, num_steps: int):
    """The shares as ``EngineCore`` computed them before they were passed as floats (None: nothing scheduled)."""
    scheduled = out.scheduled
    if not scheduled:
        return None
    overhead = parts.overhead_s / len(scheduled)
    if num_steps > 1:
        return 0.0, 0.0, parts.decode_s / len(scheduled), overhead
    per_new = parts.prefill_new_s / out.prefill_tokens_new if out.prefill_tokens_new else 0.0
    per_rec = parts.recompute_s / out.prefill_tokens_recompute if out.prefill_tokens_recompute else 0.0
    per_dec = parts.decode_s / out.decode_tokens if out.decode_tokens else 0.0
    return per_new, per_rec, per_dec, overhead


@given(num=st.integers(0, 600), new=st.integers(0, 2**40), rec=st.integers(0, 2**40), dec=st.integers(0, 2**40),
       parts=st.tuples(_seconds, _seconds, _seconds, _seconds, _seconds), num_steps=st.integers(1, 5000))
def test_shares_are_python_divisions(num, new, rec, dec, parts, num_steps):
    out = SchedulerOutput()
    out.scheduled = [(None, 1)] * num  # (only counted)
    out.prefill_tokens_new, out.prefill_tokens_recompute, out.decode_tokens = new, rec, dec
    step_parts = StepParts(*parts)
    got = _shares(out, step_parts, num_steps)
    want = _reference_shares(out, step_parts, num_steps)
    if want is None:
        assert got == (0.0, 0.0, 0.0, 0.0)
    else:
        assert [_bits(x) for x in got] == [_bits(x) for x in want]

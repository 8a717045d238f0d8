"""``sim.tables.step_table`` packs each row with ``struct`` (int64 counts, float64 times); it must give the frame the
float64 matrix gave (``np.array(rows, dtype=float64)``, counts cast back to int64): same columns, dtypes and values."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.engine.core import STEP_COLUMNS
from sim.tables import _FLOAT_STEP_COLUMNS, StepColumns, step_table

_FLOAT = [name in _FLOAT_STEP_COLUMNS for name in STEP_COLUMNS]


def _matrix_table(rows: list[tuple]) -> pd.DataFrame:
    """The step table as it was made before: one float64 matrix of the rows."""
    matrix = np.array(rows, dtype=np.float64).reshape(len(rows), len(STEP_COLUMNS))
    return pd.DataFrame({name: matrix[:, j] if _FLOAT[j] else matrix[:, j].astype(np.int64)
                         for j, name in enumerate(STEP_COLUMNS)})


_value = {True: st.floats(min_value=0, max_value=1e6, allow_nan=False), False: st.integers(0, 2**53)}
_rows = st.lists(st.tuples(*(_value[f] for f in _FLOAT)), max_size=40)


@settings(max_examples=200, deadline=None)
@given(rows=_rows)
def test_step_table_is_the_float_matrix_table(rows):
    got = step_table(rows)
    assert list(got.columns) == list(STEP_COLUMNS)
    assert [got[c].dtype for c in STEP_COLUMNS] == [np.dtype(np.float64 if f else np.int64) for f in _FLOAT]
    pd.testing.assert_frame_equal(got, _matrix_table(rows), check_exact=True)


def test_step_columns_gather_chunks_into_the_whole_table():
    rows = [tuple(float(i + j) / 3 if f else i * 20 + j for j, f in enumerate(_FLOAT)) for i in range(50)]
    columns = StepColumns()
    for start in range(0, 50, 16):
        columns.add(step_table(rows[start:start + 16]))
    pd.testing.assert_frame_equal(columns.table(), step_table(rows), check_exact=True)
    assert len(step_table([])) == 0 and list(step_table([]).columns) == list(STEP_COLUMNS)


def test_a_row_of_the_wrong_width_is_an_error():
    with pytest.raises(Exception):
        step_table([tuple(range(len(STEP_COLUMNS) - 1))])

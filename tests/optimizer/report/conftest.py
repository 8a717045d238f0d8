"""Fixtures of the report tests: a small study tuned in-process (no Ray) into SQLite, once per session, and a
report written from it (no PNGs; the browser and PNG tests make their own)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from report_test_helpers import report_spec_dict


@pytest.fixture(scope="session")
def tuned_study(tmp_path_factory) -> dict[str, Any]:
    """``{"spec": StudySpec, "out": Path, "storage": url, "result": StudyResult}`` of the mini study."""
    from optimizer._executors import InProcessExecutor
    from optimizer._spec import StudySpec
    from optimizer._study import Tuner

    out = tmp_path_factory.mktemp("report-study")
    spec = StudySpec.from_dict(report_spec_dict(), base_dir=Path.cwd())
    tuner = Tuner(spec, out=out, executor=InProcessExecutor(), progress=io.StringIO())
    result = tuner.run()
    return {"spec": spec, "out": out, "storage": result.storage, "result": result, "ctx": tuner.ctx}


@pytest.fixture(scope="session")
def written_report(tuned_study, tmp_path_factory) -> Any:
    """The mini study's report (what-if on H100 and a max_num_seqs sweep), without PNG images."""
    from optimizer.report import write_report

    out = tmp_path_factory.mktemp("report-out")
    return write_report(tuned_study["spec"], out=out, storage=tuned_study["storage"], context=tuned_study["ctx"],
                        whatifs=["gpu=H100-SXM"], sweeps=["max_num_seqs=32,128,512"], png=False)

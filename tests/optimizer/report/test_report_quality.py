"""The report says when the recommended config lowers precision (issue 30: "fp8 KV and fp8 weights carry a quality
note in recommended.json, recommended.yaml and the report"): the published accuracy deltas with their sources, on
the page and in report.json; nothing at full precision."""

from __future__ import annotations

import io
from pathlib import Path

from optimizer.quality import quality_notes
from optimizer.report import gather
from optimizer.report._page import metrics_document, render_page
from report_test_helpers import report_spec_dict


def _tuned(tmp_path, search):
    from optimizer._executors import InProcessExecutor
    from optimizer._spec import StudySpec
    from optimizer._study import Tuner

    d = report_spec_dict(name="report-quality", search={"base": "none", **search}, sampler={"name": "grid", "seed": 0},
                         budget={"trials": 3, "trial_timeout_s": 120})
    d["workload"]["max_requests"] = 120
    spec = StudySpec.from_dict(d, base_dir=Path.cwd())
    tuner = Tuner(spec, out=tmp_path, executor=InProcessExecutor(), progress=io.StringIO())
    result = tuner.run()
    return gather(spec, tuner.ctx, tuner.study.get_trials(), result.storage, simulate=False)


def test_a_recommendation_that_lowers_precision_carries_its_quality_note(tmp_path):
    # Only FP8 KV is searched (the default config is the other trial): with the mini study's fixed block count
    # (num_gpu_blocks_override) both meet the SLOs, and FP8's halved KV reads make it the faster, picked config.
    data = _tuned(tmp_path, {"kv_cache_dtype": ["fp8"], "max_num_seqs": [512]})
    knobs = data.pick.trial.user_attrs["knobs"]
    assert knobs.get("kv_cache_dtype") == "fp8", (data.pick.rule, knobs)
    notes = quality_notes(knobs)
    assert notes and notes[0]["sources"]
    page = render_page(data, [])
    assert "Lower precision." in page and "kv_cache_dtype=fp8" in page
    for source in notes[0]["sources"]:
        assert source["url"] in page
    assert metrics_document(data, [], None)["pick"]["quality"] == notes


def test_a_full_precision_recommendation_has_no_quality_note(tmp_path):
    data = _tuned(tmp_path, {"max_num_seqs": [16, 512]})
    assert quality_notes(data.pick.trial.user_attrs["knobs"]) == []
    assert "Lower precision." not in render_page(data, [])
    assert metrics_document(data, [], None)["pick"]["quality"] == []

"""The at-scale report's diagnosis (benchmarks/real_engine/scale.py, issue 32) on a synthetic queue whose true
step speed is known: the elasticity of a latency to the speed, the speed that reproduces a measured throughput, and
the errors there.  No engine needed."""

from __future__ import annotations

import math

import pytest
from real_engine_helpers import load_benchmark


@pytest.fixture(scope="module")
def scale():
    return load_benchmark("scale.py", "real_engine_scale_diagnosis")


def _queue(offered: float, engine_bound: bool = True):
    """A loaded engine: throughput the service rate (100 tok/s x speed) when engine-bound, else the offered load;
    the latencies those of an M/M/1-like queue at that rate, plus the client latency (default 0.1 s)."""
    def predict(speed: float, client: float | None = None) -> dict:
        rate = 100.0 * speed
        wait = 10.0 / (rate - offered)
        c = 0.1 if client is None else client
        return {"output_tok_s": rate if engine_bound else offered, "ttft_p50": wait + c, "ttft_p99": 3 * wait + c,
                "e2e_p50": 2 * wait + c,
                "e2e_p99": 6 * wait + c, "batch": 4.0, "per_run_tok_s": [rate if engine_bound else offered] * 3}
    return predict


def _row(scale, predict, truth: float, config="a", workload="w") -> dict:
    meas = predict(truth)
    row = {"config": config, "workload": workload, "runs": [{"engine_cpu_share": 0.5}] * 3}
    for m in scale.METRICS:  # what the report has beside the diagnosed metrics
        row[m] = {"pred": math.nan, "meas": math.nan, "lo": math.nan, "hi": math.nan, "err": math.nan}
    for m in scale.DIAGNOSED:
        row[m] = {"pred": predict(1.0)[m], "meas": meas[m], "lo": meas[m] * 0.98, "hi": meas[m] * 1.02,
                  "err": scale.error(predict(1.0)[m], meas[m], m)}
    row["output_tok_s"]["per_run"] = [meas["output_tok_s"] * f for f in (0.9, 1.0, 1.1)]
    return row


def test_elasticity_of_a_queue_latency_amplifies_the_speed(scale):
    predict = _queue(offered=50.0)
    assert scale.elasticity(predict, "output_tok_s") == pytest.approx(1.0, abs=1e-9)
    # E2E p50 = 20 / (100 s - 50) + 0.1: d log / d log s at s = 1 is -(20*100/50**2) / 0.5 = -1.6
    assert scale.elasticity(predict, "e2e_p50") == pytest.approx(-1.6, rel=0.05)


def test_the_matched_speed_recovers_the_true_one_and_removes_the_latency_error(scale):
    predict = _queue(offered=50.0)
    row = _row(scale, predict, truth=1.2)
    cell = scale.diagnose_cell(row, predict)
    assert cell["engine_bound"]
    assert cell["speed"] == pytest.approx(1.2, rel=1e-4)
    # 0.5 s predicted against 0.386 s measured: +30% from a speed 1.2x off, the queue amplifying it
    assert cell["err"]["e2e_p50"] == pytest.approx(0.5 / (20 / 70 + 0.1) - 1)
    assert all(abs(e) < 1e-3 for e in cell["err_at_speed"].values())
    assert cell["err_no_client"]["e2e_p50"] == pytest.approx((0.4 - row["e2e_p50"]["meas"]) / row["e2e_p50"]["meas"])
    assert cell["per_run_tok_ratio"] == pytest.approx([1.2 * 0.9, 1.2, 1.2 * 1.1])


def test_an_under_loaded_cell_names_no_speed(scale):
    predict = _queue(offered=50.0, engine_bound=False)
    cell = scale.diagnose_cell(_row(scale, predict, truth=1.2), predict)
    assert not cell["engine_bound"] and math.isnan(cell["speed"]) and cell["err_at_speed"] == {}
    # A target the range cannot give is no speed either.
    assert math.isnan(scale.matched_speed(_queue(50.0), "output_tok_s", 1e6))


def test_the_summary_recomputes_the_agreement_at_the_matched_speeds(scale):
    fast, slow = _queue(offered=50.0), _queue(offered=50.0)
    # Config a really ran at 1.5x the predicted speed, b at 1.0x: measured, a has the lower E2E p99 ...
    rows = [_row(scale, fast, truth=1.5, config="a"), _row(scale, slow, truth=1.0, config="b")]
    # ... but the prediction says b: b's prediction is made at its true speed, a's at 0.8 of it.
    b_pred = _queue(offered=50.0)
    rows[1] = _row(scale, b_pred, truth=1.0, config="b")
    rows[1]["e2e_p99"]["pred"] = rows[0]["e2e_p99"]["pred"] * 0.5
    cells = [scale.diagnose_cell(r, p) for r, p in zip(rows, (fast, b_pred))]
    before = scale.summarize(rows)["decision_agreement"]["e2e_p99"]
    after = scale.diagnose_summary(cells, rows)
    assert (before["agree"], before["separable"]) == (0, 1)
    assert after["agreement_at_speed"]["e2e_p99"] == {"agree": 1, "separable": 1}
    assert after["engine_bound"] == 2 and after["engine_bound_median_abs_err_at_speed"]["e2e_p50"] < 1e-3
    assert after["per_run_log_sd_within_cells"] == pytest.approx(0.1003, rel=0.01)
    # As re-predicted (the cells' own predictions): the report's disagreement stands.
    assert after["repredicted"]["agreement"]["e2e_p99"] == {"agree": 0, "separable": 1}


def test_a_report_that_cannot_be_read_is_one_line_and_exit_2(scale, tmp_path, capsys):
    bad = tmp_path / "report.json"
    bad.write_text("{not json")
    assert scale.diagnose_main(["--report", str(bad), "--model", "unused"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(bad) in err, err


@pytest.mark.parametrize("value", ["0", "nan", "-1"])
def test_a_bad_speed_is_one_line_and_exit_2(scale, capsys, value):
    assert scale.diagnose_main(["--speed", value, "--model", "unused"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--speed" in err, err

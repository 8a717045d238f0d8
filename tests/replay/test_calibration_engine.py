"""Calibration to a real engine's own timings: probe groups, the engine-side fit with CPU-share normalisation,
profile files (read errors, what simulate and a study do with them)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import yaml

from optimizer.cli import main
from replay.calibrate import (CalibrationRun, at_cpu_share, calibrate, frontend_latency, probe_groups, save_profile,
                              with_client_latency)
from sim.engine.config import EngineConfig
from sim.errors import ConfigError
from sim.latency import LatencyCoefficients, load_profile, read_profile
from sim.profiles import load_gpu, load_model
from sim.runner import simulate

MODEL, GPU = "Llama-3-8B", "A100-80GB"
TRUE = {"overhead_s": 0.004, "per_seq_overhead_s": 3e-5, "mfu": 0.45, "bw_eff": 0.6}
# Synchronous steps: with async scheduling the host overheads hide under the GPU time and cannot be fitted.
KNOBS = {"max_model_len": 4096, "max_num_seqs": 32, "num_gpu_blocks_override": 2000, "async_scheduling": False}


def _groups():
    return probe_groups(EngineConfig.from_dict(KNOBS), load_model(MODEL), load_gpu(GPU),
                        prompt_sweep=(256, 1024, 3000), batch_sweep=((4, 128, 24), (32, 128, 16), (4, 2000, 16)),
                        mixed=((8, 64, 40, (0.05,)),), repeats=1, bursts=())


def test_probe_groups_cover_the_phases_within_the_config():
    groups = _groups()
    assert [g.phase for g in groups] == ["prefill"] * 3 + ["decode"] * 3 + ["mixed"]
    for g in groups:
        df = g.workload.requests
        assert len(df) <= KNOBS["max_num_seqs"] + 1
        assert (df["prompt_tokens"] + df["output_tokens"]).max() < KNOBS["max_model_len"]
    # A batch is cut to max_num_seqs; the mixed probe adds its long prompt at the given time.
    many = next(g for g in groups if g.name.startswith("decode b=32"))
    assert len(many.workload.requests) == 32
    mixed = groups[-1].workload.requests
    assert sorted(mixed["arrival_s"].unique()) == [0.0, 0.05]


def _engine_runs(coefficients: LatencyCoefficients, share: float) -> list[CalibrationRun]:
    """Runs whose engine-side means are what an engine with ``coefficients`` measures when it gets ``share`` of
    its core (every step 1/share slower), with the share recorded, as a CPU engine's runs are."""
    model, gpu = load_model(MODEL), load_gpu(GPU)
    config = EngineConfig.from_dict(KNOBS)
    runs = []
    for g in _groups():
        sim = simulate(g.workload, config, model, gpu, coefficients=coefficients).requests
        engine = {"prefill_time": float((sim["first_token_s"] - sim["first_scheduled_s"]).mean()) / share,
                  "decode_time": float((sim["end_s"] - sim["first_token_s"]).mean()) / share,
                  "queue_time": float((sim["first_scheduled_s"] - sim["arrival_s"]).mean()) / share,
                  "cpu_share": share}
        engine["client_ttft"] = engine["queue_time"] + engine["prefill_time"] + 0.05  # 50 ms of HTTP on top
        runs.append(CalibrationRun(g.workload, config, model, gpu, 0, sim, g.name, phase=g.phase, engine=engine))
    return runs


def test_engine_fit_recovers_the_dedicated_core_speed_and_writes_the_loaded_one(tmp_path):
    runs = _engine_runs(LatencyCoefficients(**TRUE), share=0.5)
    fit = calibrate(runs, max_evals=160)
    assert fit.target == "engine"
    for name, value in TRUE.items():
        assert getattr(fit.coefficients, name) == pytest.approx(value, rel=0.02), name
    assert fit.cpu_share_median == pytest.approx(0.5)
    assert fit.client.offset_s == pytest.approx(0.05, rel=1e-6)
    assert set(fit.phase_residuals()) == {"prefill", "decode", "mixed"}
    assert max(v[0] for v in fit.phase_residuals().values()) < 0.02
    path = save_profile(fit, tmp_path / "p.yaml", model=MODEL, gpu=GPU)
    profile = read_profile(path)
    assert (profile.model, profile.gpu) == (MODEL, GPU)
    # The file holds the engine at the share it had: step times twice the dedicated core's.
    assert profile.coefficients.overhead_s == pytest.approx(2 * fit.coefficients.overhead_s)
    assert profile.coefficients.mfu == pytest.approx(fit.coefficients.mfu / 2)
    doc = yaml.safe_load(path.read_text())
    assert doc["fit"]["dedicated_core_coefficients"]["mfu"] == pytest.approx(fit.coefficients.mfu)
    assert "per phase" in fit.describe()


def test_at_cpu_share_scales_every_step():
    model, gpu = load_model(MODEL), load_gpu(GPU)
    g = _groups()[4]  # a decode batch
    config = EngineConfig.from_dict(KNOBS)
    base = simulate(g.workload, config, model, gpu).requests
    slow = simulate(g.workload, config, model, gpu, coefficients=at_cpu_share(LatencyCoefficients(), 0.25)).requests
    assert np.allclose(slow["e2e_s"], 4 * base["e2e_s"], rtol=1e-9)
    assert at_cpu_share(LatencyCoefficients(), math.nan) == LatencyCoefficients()


def test_frontend_latency_is_measured_and_added_to_every_token():
    runs = _engine_runs(LatencyCoefficients(**TRUE), share=1.0)
    client = frontend_latency(runs)
    assert client.offset_s == pytest.approx(0.05)
    table = runs[0].measured
    shifted = with_client_latency(table, client)
    assert np.allclose(shifted["ttft_s"] - table["ttft_s"], 0.05)
    assert np.allclose(shifted["tpot_s"].dropna(), table["tpot_s"].dropna())


def test_engine_target_needs_engine_timings():
    runs = _engine_runs(LatencyCoefficients(**TRUE), share=1.0)
    runs[0].engine = {}
    with pytest.raises(ConfigError, match="no engine-side request timings"):
        calibrate(runs, target="engine")


# ---- profile files --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("coefficients: [1, 2", "not valid YAML"),
        ("- 1\n- 2\n", "must be a mapping (kind:, coefficients:, ...), got list"),
        ("kind: kvtune-latency-profile\ncoefficients: {mfu: -0.3}\n", "coefficients.mfu: must be a positive number"),
        ("kind: kvtune-latency-profile\ncoefficients: {mfu: 0.3, speed: 2}\n", "coefficients.speed: unknown latency coefficient; expected one of"),
        ("kind: something-else\ncoefficients: {mfu: 0.3}\n", "kind: must be one of ['kvtune-latency-profile'], got 'something-else'"),
        ("kind: kvtune-latency-profile\nmodel: 3\ncoefficients: {mfu: 0.3}\n", "model: must be a string, got 3"),
    ],
)
def test_bad_profile_files_are_one_clear_error(tmp_path, text, words):
    path = tmp_path / "p.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_profile(path)
    assert words in str(info.value) and str(path) in str(info.value)


def test_simulate_reads_the_profile_and_its_model(tmp_path, capsys):
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"kind": "kvtune-latency-profile", "model": "Llama-3-8B", "gpu": "L40S",
                                    "coefficients": {"mfu": 0.2, "overhead_s": 0.01}}))
    out = tmp_path / "sim"
    assert main(["simulate", "--profile", str(path), "--max-requests", "40", "--out", str(out)]) == 0
    doc = json.loads((out / "summary.json").read_text())
    assert (doc["model"], doc["gpu"]) == ("Llama-3-8B", "L40S")
    from sim.workload import bundled_trace_path, load_trace

    direct = simulate(load_trace(bundled_trace_path()).head(40), EngineConfig(), load_model("Llama-3-8B"),
                      load_gpu("L40S"), coefficients=LatencyCoefficients(mfu=0.2, overhead_s=0.01))
    import pandas as pd

    written = pd.read_parquet(out / "requests.parquet")
    assert np.allclose(written["e2e_s"], direct.requests["e2e_s"], equal_nan=True)
    bad = tmp_path / "bad.yaml"
    bad.write_text("coefficients: {mfu: zero}\n")
    capsys.readouterr()
    assert main(["simulate", "--profile", str(bad), "--max-requests", "3", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "coefficients.mfu: must be a number" in err[0]


def test_simulate_adds_the_profiles_client_latency_as_the_benchmark_does(tmp_path, capsys):
    """The README: the profile's measured client-side latency is added to every predicted token, by
    ``kvtune simulate --profile`` as by benchmarks/real_engine/run.py (one function, sim.latency.add_client_latency)."""
    import pandas as pd

    from replay.calibrate import ClientLatency, with_client_latency

    base = {"kind": "kvtune-latency-profile", "model": "Llama-3-8B", "gpu": "L40S",
            "coefficients": {"mfu": 0.2, "overhead_s": 0.01}}
    plain, timed = tmp_path / "plain.yaml", tmp_path / "timed.yaml"
    plain.write_text(yaml.safe_dump(base))
    timed.write_text(yaml.safe_dump({**base, "fit": {"client_latency": {"offset_s": 0.074, "fanout_s": 0.0}}}))
    assert read_profile(plain).client_offset_s == 0.0 and read_profile(timed).client_offset_s == 0.074
    tables = {}
    for path in (plain, timed):
        out = tmp_path / path.stem
        assert main(["simulate", "--profile", str(path), "--max-requests", "40", "--out", str(out)]) == 0
        tables[path.stem] = pd.read_parquet(out / "requests.parquet")
        doc = json.loads((out / "summary.json").read_text())
        assert doc["client_latency_s"] == read_profile(path).client_offset_s
    stdout = capsys.readouterr().out
    assert "client-side latency 74.0 ms" in stdout
    engine, client = tables["plain"], tables["timed"]
    done = engine["status"] == "finished"
    assert done.sum() > 10
    for col in ("ttft_s", "e2e_s", "first_token_s", "end_s"):
        assert np.allclose(client.loc[done, col] - engine.loc[done, col], 0.074), col
    assert np.allclose(client["tpot_s"], engine["tpot_s"], equal_nan=True)
    assert np.allclose(client["arrival_s"], engine["arrival_s"])
    # The real-engine benchmark's prediction: the same table.
    bench = with_client_latency(engine, ClientLatency(offset_s=read_profile(timed).client_offset_s))
    pd.testing.assert_frame_equal(bench, client)
    # p50 TTFT in summary.json moved by the offset too.
    p50 = {k: json.loads((tmp_path / k / "summary.json").read_text())["metrics"] for k in tables}
    key = next(k for k in p50["plain"] if "ttft" in k and "p50" in k)
    assert p50["timed"][key] == pytest.approx(p50["plain"][key] + 0.074, rel=1e-6)
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**base, "fit": {"client_latency": {"offset_s": -1}}}))
    assert main(["simulate", "--profile", str(bad), "--max-requests", "3", "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fit.client_latency.offset_s" in err[0]


def _timed_result(span_s: float, info: dict):
    import pandas as pd

    from replay.results import ReplayResult

    requests = pd.DataFrame({"arrival_s": [0.0, 1.0], "end_s": [span_s / 2, span_s], "status": ["finished"] * 2})
    return ReplayResult(requests=requests, steps=pd.DataFrame(), samples=pd.DataFrame(), info=info)


def test_contended_share_counts_only_the_wait_for_a_core():
    from replay.calibrate import contended_share, cpu_share

    # Kernel schedstat recorded: run / (run + wait), whatever the engine's idle time in the span.
    timed = _timed_result(10.0, {"engine_cpu_s": 4.0, "engine_run_s": 3.0, "engine_wait_s": 1.0})
    assert contended_share(timed) == pytest.approx(0.75)
    assert cpu_share(timed) == pytest.approx(0.4)  # the busy-span share counts the idle gaps too
    assert math.isnan(contended_share(_timed_result(2.0, {"engine_cpu_s": 1.0})))


def test_engine_sched_seconds_reads_this_process_group():
    import os

    from replay.calibrate import engine_sched_seconds

    if not os.path.isdir("/proc"):
        pytest.skip("needs Linux /proc")
    run, wait = engine_sched_seconds(os.getpgid(0), names=("python", "pytest"))
    assert run > 0 and wait >= 0  # this test's own process has run
    assert engine_sched_seconds(os.getpgid(0), names=("no-such-process",)) == (0.0, 0.0)


def test_engine_times_is_both_counters_in_one_walk():
    import os
    import subprocess
    from pathlib import Path
    import sys

    if not os.path.isdir("/proc"):
        pytest.skip("needs Linux /proc")
    # In a process alone in its own group (a new session), so that no other process of the group can start or end
    # between the readings: the counters then only grow, and the single walk reads values between the separate
    # readings around it.
    code = """
import os
from replay.calibrate import engine_cpu_seconds, engine_sched_seconds, engine_times
sum(i * i for i in range(300_000))  # some CPU time to read
pgid, names = os.getpgid(0), ("python",)
cpu0, (run0, wait0) = engine_cpu_seconds(pgid, names), engine_sched_seconds(pgid, names)
both = engine_times(pgid, names)
cpu1, (run1, wait1) = engine_cpu_seconds(pgid, names), engine_sched_seconds(pgid, names)
assert cpu0 <= both["engine_cpu_s"] <= cpu1 and run1 > 0, (cpu0, both, cpu1)
assert run0 <= both["engine_run_s"] <= run1 and wait0 <= both["engine_wait_s"] <= wait1, (run0, both, run1)
assert engine_times(pgid, ("no-such-process",)) == {"engine_cpu_s": 0.0, "engine_run_s": 0.0, "engine_wait_s": 0.0}
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, start_new_session=True,
                         cwd=str(Path(__file__).resolve().parents[2]), timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]

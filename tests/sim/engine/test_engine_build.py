"""One engine build: a trial's parameters are resolved, sized and given a latency model once on their way from
``SimBackend.run_one`` to the scheduler, and the objects made then are the ones the engine runs on."""

from __future__ import annotations

from collections import Counter

import pytest

import sim.engine.build as build
import sim.engine.sizing as sizing
from optimizer import SimBackend
from sim.engine import EnginePlan, build_engine, resolve_engine
from sim.engine.config import EngineConfig
from sim.engine.sizing import size_kv_cache
from sim.errors import ConfigError
from sim.latency import ScaledLatency
from sim.profiles import load_gpu, load_model
from sim.workload import WorkloadSpec

WORKLOAD = {"trace": "bundled", "max_requests": 40, "rate_scale": 4, "arrival": {"process": "poisson"}}
KNOBS = {"max_model_len": 4096, "kv_cache_dtype": "fp8"}


@pytest.fixture
def calls(monkeypatch):
    """Counts of EngineConfig.resolve, size_kv_cache and roofline_for calls, and what resolve returned."""
    counts: Counter = Counter()
    resolved: list[EngineConfig] = []

    def counted(name, fn, keep=None):
        def wrapper(*args, **kwargs):
            counts[name] += 1
            out = fn(*args, **kwargs)
            if keep is not None:
                keep.append(out)
            return out
        return wrapper

    monkeypatch.setattr(EngineConfig, "resolve", counted("resolve", EngineConfig.resolve, resolved))
    sized = counted("size_kv_cache", sizing.size_kv_cache)
    for module in (sizing, build):
        monkeypatch.setattr(module, "size_kv_cache", sized)
    monkeypatch.setattr(build, "roofline_for", counted("roofline_for", build.roofline_for))
    return counts, resolved


@pytest.mark.parametrize("kv_scale,time_scale", [(1.0, 1.0), (0.8, 1.25)])
def test_one_trial_resolves_sizes_and_picks_latency_once(calls, kv_scale, time_scale):
    counts, resolved = calls
    backend = SimBackend(WorkloadSpec.from_dict(WORKLOAD), "Llama-2-7B", "L40S", kv_scale=kv_scale,
                         time_scale=time_scale)
    backend.prepare([0])
    counts.clear()
    resolved.clear()
    metrics, result = backend.run_one(KNOBS, 0)
    assert counts == {"resolve": 1, "size_kv_cache": 1, "roofline_for": 1}
    # The engine ran on what that one resolve made (scaled: the same config with the KV override).
    if kv_scale == 1.0:
        assert result.config is resolved[0]
    else:
        assert result.config == resolved[0].replace(num_gpu_blocks_override=result.sizing.num_gpu_blocks)
    counts.clear()
    backend.run(KNOBS, [0])
    assert counts == {"resolve": 1, "size_kv_cache": 1, "roofline_for": 1}


def test_a_fleet_trial_resolves_sizes_and_picks_latency_once(calls):
    """A trial of several replicas behind a router goes the same one way: its plan, one engine built per replica."""
    counts, _ = calls
    backend = SimBackend(WorkloadSpec.from_dict(WORKLOAD), "Llama-2-7B", "L40S", kv_scale=0.8, time_scale=1.25)
    backend.prepare([0])
    counts.clear()
    metrics, _ = backend.run_one({**KNOBS, "replicas": 2, "router": "round_robin"}, 0)
    assert counts == {"resolve": 1, "size_kv_cache": 1, "roofline_for": 1}
    assert metrics["fleet.replicas"] == 2


def test_scaled_plan_is_what_sizing_again_gives():
    model, gpu = load_model("Llama-2-7B"), load_gpu("L40S")
    plan = resolve_engine(KNOBS, model, gpu)
    scaled = plan.scaled(kv_scale=0.5, time_scale=2.0)
    assert scaled.config == plan.config.replace(num_gpu_blocks_override=round(plan.sizing.num_gpu_blocks * 0.5))
    assert scaled.sizing == size_kv_cache(model, gpu, scaled.config)
    assert isinstance(scaled.latency, ScaledLatency) and scaled.latency.base is plan.latency
    assert plan.scaled() is plan
    with pytest.raises(ConfigError, match="num_gpu_blocks_override"):
        plan.scaled(kv_scale=1e-6)  # two blocks cannot hold a max-length request, as size_kv_cache says


def test_a_plan_makes_fresh_cores():
    model, gpu = load_model("Llama-3-8B"), load_gpu("H100-SXM")
    plan = resolve_engine(EngineConfig(max_model_len=2048), model, gpu)
    assert isinstance(plan, EnginePlan)
    one, two = build_engine(plan), plan.build()
    assert one.core is not two.core and one.core.scheduler is not two.core.scheduler
    assert one.config is two.config is plan.config and one.latency is plan.latency
    assert one.plan is plan
    direct = build_engine(EngineConfig(max_model_len=2048), model, gpu)
    assert direct.config == plan.config and direct.sizing == plan.sizing
    with pytest.raises(ValueError):
        build_engine(plan, coefficients=object())
    with pytest.raises(ValueError):
        build_engine(plan, load_model("Llama-2-7B"))

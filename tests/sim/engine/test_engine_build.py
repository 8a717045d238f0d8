"""One engine build: a trial's parameters are resolved, sized and given a latency model once on their way from
``SimBackend.run_one`` to the scheduler, and the objects made then are the ones the engine runs on."""

from __future__ import annotations

from collections import Counter

import pytest

import sim.engine
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
    # sim.engine hands out size_kv_cache lazily and keeps it once asked (``from sim.engine import size_kv_cache``,
    # as optimizer._capacity does): count that one too, whichever test asked first.
    monkeypatch.setattr(sim.engine, "size_kv_cache", sized, raising=False)
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


def _study_counts(calls, tmp_path, trials: list[dict]) -> Counter:
    """The calls a study of ``trials`` (enqueued, in-process) makes, set-up and export excluded: driver and worker."""
    import io

    from optimizer import InProcessExecutor, StudySpec, Tuner, open_study, prepare

    counts, _ = calls
    spec = StudySpec.from_dict({
        "name": "one-build", "workload": {**WORKLOAD, "classes": {"conv": {}}}, "model": "Llama-2-7B", "gpu": "L40S",
        "engine": {"max_model_len": 4096}, "objectives": ["output_tokens_per_s"],
        "search": {"base": "none", "max_num_seqs": [32, 64, 1024], "max_num_batched_tokens": [512, 2048]},
        "budget": {"trials": len(trials)}, "sampler": {"name": "tpe", "seed": 0}})
    storage = f"sqlite:///{tmp_path / f'study{len(trials)}.db'}"
    study = open_study(prepare(spec), storage)
    for params in trials:
        study.enqueue_trial(params)
    counts.clear()
    Tuner(spec, storage=storage, executor=InProcessExecutor(), progress=io.StringIO()).run()
    return Counter(counts)


def test_a_study_trial_resolves_once_before_it_runs_and_builds_once(calls, tmp_path):
    """From the drawn parameters to the scheduler: the study's driver fills the config's defaults once (to repair a
    draw vLLM would refuse, then to check it: ``repair_knobs`` hands its config to ``Tuner._check_config``), and the
    trial's run resolves, sizes and picks its latency model once (``SimBackend.run_one``).  Before, the driver
    resolved two or three times per trial.  Two studies that differ by two trials (one repaired) differ by those."""
    few = _study_counts(calls, tmp_path, [{"max_num_seqs": 64, "max_num_batched_tokens": 512}])
    more = _study_counts(calls, tmp_path, [{"max_num_seqs": 64, "max_num_batched_tokens": 512},
                                           {"max_num_seqs": 1024, "max_num_batched_tokens": 512},  # repaired
                                           {"max_num_seqs": 32, "max_num_batched_tokens": 2048}])
    per_two_trials = {name: more[name] - few[name] for name in ("resolve", "size_kv_cache", "roofline_for")}
    assert per_two_trials == {"resolve": 2 * 2, "size_kv_cache": 2, "roofline_for": 2}


def test_the_startup_check_sizes_a_resolved_config_without_resolving_it(calls):
    from optimizer._capacity import startup_problem

    counts, _ = calls
    config = EngineConfig.from_dict(KNOBS, "knobs").resolve(4096, load_gpu("L40S"))
    counts.clear()
    assert startup_problem(KNOBS, "Llama-2-7B", "L40S", resolved=config) is None
    assert counts == {"size_kv_cache": 1}


def test_the_spec_start_up_check_resolves_the_fixed_engine_once_and_sizes_without_a_latency_model(calls):
    """A study spec's start-up: its fixed ``engine:`` section is resolved once for vLLM's field rules (no sizing:
    the search changes the memory knobs), and ``check_model_fits`` resolves and sizes the most generous config the
    search allows once (``size_engine``: no latency model), on the first device that fits."""
    from optimizer import StudySpec

    counts, _ = calls
    for search in ({"base": "none", "max_num_seqs": [32, 64]},
                   {"base": "none", "max_num_seqs": [32, 64], "gpu": ["L40S", "H100-SXM"]}):
        counts.clear()
        StudySpec.from_dict({"name": "start-up", "workload": {**WORKLOAD, "classes": {"conv": {}}},
                             "model": "Llama-2-7B", "gpu": "L40S", "engine": {"max_model_len": 4096},
                             "search": search, "budget": {"trials": 2}})
        assert counts == {"resolve": 2, "size_kv_cache": 1}, search

"""Studies whose trials replay (``backend: {kind: replay}``): the spec's ``backend:`` section and its errors, GPU
slots of the Ray executor (a mocked cluster, no GPU needed), and a small study on the digital twin launched per
trial by the Tuner's own Ray executor, then exported."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import types

import optuna
import pytest
from optimizer_test_helpers import spec_dict

from optimizer import InProcessExecutor, RayExecutor, StudySpec, Tuner, export_study, open_study, prepare
from optimizer._spec import BackendSpec
from sim.errors import ConfigError

TWIN = {"kind": "replay", "engine": "twin", "speed": 20}


def _replay_spec(backend=None, **changes):
    d = spec_dict(
        name="conv-twin",
        workload={"trace": "bundled", "classes": {"conv": {"slo": {"e2e_p99_s": 40}}}, "max_requests": 40},
        engine={"num_gpu_blocks_override": 600, "max_model_len": 4096},
        search={"base": "none", "max_num_seqs": {"low": 8, "high": 128},
                "max_num_batched_tokens": {"low": 1024, "high": 8192}},
        budget={"trials": 3, "trial_timeout_s": 120},
        backend=backend if backend is not None else dict(TWIN),
    )
    d.update(changes)
    return d


# ---- the spec ---------------------------------------------------------------------------------------------------
def test_backend_defaults_to_sim():
    spec = StudySpec.from_dict(spec_dict())
    assert spec.backend == BackendSpec() and spec.backend.kind == "sim" and not spec.backend.is_replay
    assert spec.to_dict()["backend"] == {"kind": "sim"}
    assert "backend" not in spec.identity()  # sim studies stored before backend: existed keep resuming


def test_replay_backend_keys_and_defaults():
    spec = StudySpec.from_dict(_replay_spec())
    b = spec.backend
    assert (b.kind, b.engine, b.url, b.speed, b.gpus_per_trial) == ("replay", "twin", None, 20.0, 0.0)
    vllm = StudySpec.from_dict(_replay_spec({"kind": "replay"}, tensor_parallel_size=2)).backend
    assert (vllm.engine, vllm.speed, vllm.gpus_per_trial) == ("vllm", 1.0, 2.0)  # GPUs default to TP for vLLM
    url = StudySpec.from_dict(_replay_spec({"kind": "replay", "url": "http://127.0.0.1:8000"})).backend
    assert url.engine is None and url.gpus_per_trial == 0.0
    full = BackendSpec.from_dict({"kind": "replay", "engine": "twin", "speed": 5, "gpus_per_trial": 0.5,
                                  "startup_timeout_s": 30, "twin_slack_ms": 100})
    assert BackendSpec.from_dict(full.to_dict()) == full
    assert BackendSpec.from_dict("replay").engine == "vllm"


@pytest.mark.parametrize(("backend", "field", "words"), [
    ({"kind": "replay", "engnie": "twin"}, "backend.engnie", "did you mean 'engine'"),
    ({"kind": "replay", "engine": "vllm", "speed": 20}, "backend.speed", "must be 1 for engine vllm"),
    ({"kind": "replay", "speed": 2}, "backend.speed", "must be 1 for engine vllm"),  # engine defaults to vllm
    ({"kind": "gpu"}, "backend.kind", "must be one of ['sim', 'replay']"),
    ({"kind": "replay", "engine": "sglang"}, "backend.engine", "must be one of ['vllm', 'twin']"),
    ({"kind": "replay", "engine": "twin", "url": "http://x:1"}, "backend.url", "not both"),
    ({"kind": "replay", "url": "localhost:8000"}, "backend.url", "http(s) URL"),
    ({"kind": "replay", "engine": "twin", "speed": 0}, "backend.speed", "> 0"),
    ({"kind": "replay", "engine": "vllm", "gpus_per_trial": 0}, "backend.gpus_per_trial", "at least 1"),
    ({"kind": "replay", "engine": "twin", "gpus_per_trial": -1}, "backend.gpus_per_trial", ">= 0"),
    ({"kind": "replay", "engine": "twin", "model": "meta-llama/Llama-2-7b-hf"}, "backend.model", "twin"),
    ({"kind": "replay", "url": "http://x:1", "startup_timeout_s": 5}, "backend.startup_timeout_s", "not to url"),
    ({"kind": "replay", "engine": "vllm", "twin_slack_ms": 5}, "backend.twin_slack_ms", "twin only"),
    ({"kind": "sim", "speed": 2}, "backend.speed", "kind replay only"),
    ([1, 2], "backend", "must be a mapping"),
])
def test_backend_errors_name_the_key(backend, field, words):
    with pytest.raises(ConfigError) as info:
        StudySpec.from_dict(_replay_spec(backend))
    assert info.value.field == field
    assert words in str(info.value)


def test_backend_is_part_of_the_identity(tmp_path):
    sim = StudySpec.from_dict(_replay_spec({"kind": "sim"}))
    twin = StudySpec.from_dict(_replay_spec())
    vllm = StudySpec.from_dict(_replay_spec({"kind": "replay", "engine": "vllm"}))
    faster = StudySpec.from_dict(_replay_spec({**TWIN, "speed": 10, "twin_slack_ms": 100}))
    assert len({sim.fingerprint(), twin.fingerprint(), vllm.fingerprint()}) == 3
    assert twin.identity()["backend"] == {"kind": "replay", "engine": "twin"}
    assert faster.fingerprint() == twin.fingerprint()  # operational settings may change between resumes
    # A stored sim study is not silently resumed as a replay study.
    url = f"sqlite:///{tmp_path / 'study.db'}"
    open_study(prepare(sim), url)
    with pytest.raises(ConfigError) as info:
        open_study(prepare(twin), url)
    assert info.value.field == "backend"


def test_url_backend_runs_one_trial_at_a_time():
    spec = StudySpec.from_dict(_replay_spec({"kind": "replay", "url": "http://127.0.0.1:9"}, budget={"workers": 4}))
    tuner = Tuner(spec, storage="memory", workers=3, progress=io.StringIO())
    assert tuner.workers == 1
    assert "one at a time" in tuner.workers_note and "not 3" in tuner.workers_note


def test_sim_studies_do_not_import_the_replay_stack():
    code = ("import sys; from optimizer import StudySpec, Tuner, prepare; "
            "sys.path.insert(0, 'tests/optimizer'); from optimizer_test_helpers import spec_dict; "
            "spec = StudySpec.from_dict(spec_dict()); t = Tuner(spec, storage='memory'); "
            "b = t.make_backend(prepare(spec)); "
            "assert type(b).__name__ == 'SimBackend'; "
            "bad = [m for m in ('replay.backend', 'aiohttp') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# ---- GPU slots of the Ray executor (a fake ray module: no cluster, no GPU) ---------------------------------------
class _FakeRay(types.ModuleType):
    def __init__(self, resources):
        super().__init__("ray")
        self.resources = resources
        self.options_seen = None
        self.shut_down = False
        self.actors_started = 0

    def is_initialized(self):
        return True

    def cluster_resources(self):
        return dict(self.resources)

    def remote(self, fn):
        fake = self

        class _Method:
            def remote(self, *args, **kwargs):
                return ("ref", id(self))

        class _Actor:
            ready = _Method()

        class _Remote:
            def options(self, **kwargs):
                fake.options_seen = kwargs
                return self

            def remote(self, *args, **kwargs):  # the actor constructor's arguments (the driver's niceness)
                fake.actors_started += 1
                return _Actor()

        return _Remote()

    def wait(self, refs, num_returns=1, timeout=None):
        return list(refs), []

    def shutdown(self):
        self.shut_down = True


@pytest.mark.parametrize(("resources", "gpus_per_trial", "workers", "capacity"), [
    ({"CPU": 64, "GPU": 8}, 1, None, 8),      # GPUs bound it, not CPUs
    ({"CPU": 64, "GPU": 8}, 2, None, 4),      # TP 2: four engines on eight GPUs
    ({"CPU": 64, "GPU": 8}, 3, None, 2),      # never a fraction of a trial
    ({"CPU": 4, "GPU": 8}, 1, None, 4),       # CPUs bound it
    ({"CPU": 64, "GPU": 8}, 1, 3, 3),         # workers bound it
    ({"CPU": 64, "GPU": 2}, 0.5, None, 4),    # fractional GPUs (e.g. a twin that wants a share)
    ({"CPU": 16}, 0, None, 16),               # sim / twin: CPUs only, no GPU needed
])
def test_ray_executor_capacity_counts_gpus(monkeypatch, resources, gpus_per_trial, workers, capacity):
    fake = _FakeRay(resources)
    monkeypatch.setitem(sys.modules, "ray", fake)
    executor = RayExecutor(workers=workers, gpus_per_trial=gpus_per_trial)
    executor.start()
    assert executor.capacity == capacity
    # One warm worker per slot; a dead worker is not restarted by Ray and a trial is not retried by it
    # (kvtune re-enqueues crashed trials itself, a bounded number of times).
    assert fake.actors_started == capacity
    assert fake.options_seen["num_cpus"] == 1.0
    assert fake.options_seen["max_restarts"] == 0 and fake.options_seen["max_task_retries"] == 0
    if gpus_per_trial:
        assert fake.options_seen["num_gpus"] == gpus_per_trial
    else:
        assert "num_gpus" not in fake.options_seen
    if gpus_per_trial:
        assert f"{gpus_per_trial:g} per trial" in executor.describe()


@pytest.mark.parametrize("resources", [{"CPU": 8}, {"CPU": 8, "GPU": 1}])
def test_too_few_gpus_for_one_trial_names_the_key(monkeypatch, resources):
    monkeypatch.setitem(sys.modules, "ray", _FakeRay(resources))
    with pytest.raises(ConfigError) as info:
        RayExecutor(gpus_per_trial=2).start()
    assert info.value.field == "backend.gpus_per_trial"
    assert "needs 2 GPUs" in str(info.value)


# ---- a study on the twin ----------------------------------------------------------------------------------------
def test_replay_study_on_the_twin_completes(tmp_path, local_ray):
    spec = StudySpec.from_dict(_replay_spec())
    progress = io.StringIO()
    # No executor given: the Tuner's own RayExecutor (gpus_per_trial 0 for the twin) on the module's 2-CPU Ray.
    tuner = Tuner(spec, out=tmp_path / "run", progress=progress)
    result = tuner.run()
    text = progress.getvalue()
    assert result.finished == 3 and result.complete == 3 and result.failed == 0, text
    assert "backend replay: twin launched per trial (speed 20, 0 GPUs per trial)" in text

    study = optuna.load_study(study_name=spec.name, storage=result.storage)
    assert len(study.trials) == 3
    for t in study.trials:
        assert t.state == optuna.trial.TrialState.COMPLETE
        attrs = t.user_attrs
        for key in ("output_tokens_per_s", "class.conv.e2e_s.p99", "class.conv.ttft_s.p99",
                    "class.conv.count.finished", "all.e2e_s.p99", "preemptions_total", "kv_utilization",
                    "replay.wall_s", "replay.num_errors"):
            assert key in attrs, key
        assert attrs["class.conv.count.finished"] >= 35  # 40 requests, all served (a timeout would not be)
        assert attrs["replay.num_errors"] == 0
        assert attrs["output_tokens_per_s"] > 0 and t.values[0] == attrs["output_tokens_per_s"]
        assert attrs["knobs"]["num_gpu_blocks_override"] == 600
        # The twin stopped on SIGINT at once: a Ray worker blocks SIGINT and an engine spawned with that mask
        # used to wait out stop_timeout_s (60 s) for the SIGTERM, every trial.
        assert attrs["replay.wall_s"] < 30, attrs["replay.wall_s"]
    trial_dirs = sorted((tmp_path / "run" / "replays").glob("trial-*"))
    assert len(trial_dirs) == 3
    for d in trial_dirs:
        assert "kvtune twin: serving" in (d / "engine.log").read_text()
        assert (d / "seed-0" / "requests.parquet").is_file()

    exported = export_study(spec, out=tmp_path / "export", study_out=tmp_path / "run", context=tuner.ctx)
    doc = json.loads((tmp_path / "export" / "recommended.json").read_text())
    assert doc["backend"] == {"kind": "replay", "engine": "twin", "speed": 20.0, "gpus_per_trial": 0.0}
    assert doc["default_metrics_backend"] == "sim" and "replay" in doc["default_metrics_note"]
    assert doc["trial"] == exported.trial and set(doc["predicted"]) == {"recommended", "default"}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/<pid>/status")
def test_engines_are_spawned_with_stop_signals_deliverable():
    import signal

    from replay.launcher import _stop_signals_unblocked

    def child_blocked() -> int:
        out = subprocess.run(["grep", "SigBlk", "/proc/self/status"], capture_output=True, text=True).stdout
        return int(out.split()[1], 16)

    sigint = 1 << (signal.SIGINT - 1)
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # as a Ray worker runs its tasks
    try:
        assert child_blocked() & sigint
        with _stop_signals_unblocked():
            assert not child_blocked() & sigint
        assert signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, ())  # the caller's mask is restored
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def test_replay_study_against_a_running_server(tmp_path):
    """``url``: one server for every trial, one trial at a time, whatever workers say."""
    from replay.launcher import EngineProcess, free_port, twin_command
    from sim.engine.config import EngineConfig

    port = free_port()
    argv, env = twin_command(EngineConfig.from_dict({"num_gpu_blocks_override": 600, "max_model_len": 4096}),
                             "Llama-2-7B", "L40S", port=port, speed=20.0, slack_ms=250.0)
    server = EngineProcess(argv, f"http://127.0.0.1:{port}", env=env, startup_timeout_s=60, stop_timeout_s=10)
    spec = StudySpec.from_dict(_replay_spec({"kind": "replay", "url": server.base_url, "speed": 20},
                                            budget={"trials": 2, "trial_timeout_s": 60, "workers": 2}))
    progress = io.StringIO()
    with server:
        result = Tuner(spec, storage="memory", out=tmp_path / "run", executor=InProcessExecutor(),
                       progress=progress).run()
    assert result.complete == 2, progress.getvalue()
    assert "backend.url: trials run one at a time" in progress.getvalue()
    assert "workers forced to 1, not 2" in progress.getvalue()

"""ServeGen per-client distributions -> requests: rates and lengths as the files say, deterministic per seed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from sim.errors import ConfigError, KvtuneError, TraceError
from sim.workload._servegen import ServeGenSpec, load_client, servegen_frame
from sim.workload._spec import WorkloadSpec

SHARED = Path("/work/shared/data/traces/servegen/deepseek-r1")


def _client(folder: Path, number: int, windows: list[str], lengths: dict) -> None:
    (folder / f"chunk-{number}-trace.csv").write_text("\n".join(windows) + "\n")
    (folder / f"chunk-{number}-dataset.json").write_text(json.dumps(lengths))


@pytest.fixture
def folder(tmp_path):
    load_client.cache_clear()
    _client(tmp_path, 0, ["0,0,0,,0,0", "600,2.0,1.0,Gamma,1.0,0.5", "1200,4.0,3.0,Weibull,0.5,0.1"],
            {"0": {"input_tokens": "{100: 0.5, 300: 0.5}", "output_tokens": "{10: 0.25, 2000: 0.75}"},
             "1200": {"input_tokens": "{50: 1.0}", "output_tokens": "{5000: 1.0}"}})
    _client(tmp_path, 7, ["0,1.0,1.0,Gamma,1.0,1.0", "600,0,0,,0,0"],
            {"0": {"input_tokens": "{20: 1.0}", "output_tokens": "{30: 1.0}"}})
    return tmp_path


def test_rates_and_lengths_follow_the_windows(folder):
    frame = servegen_frame(ServeGenSpec(str(folder), (0,), start_s=600, duration_s=1200), seed=3)
    first = frame[frame["arrival_s"] < 600]
    second = frame[frame["arrival_s"] >= 600]
    assert len(first) == pytest.approx(2.0 * 600, rel=0.15) and len(second) == pytest.approx(4.0 * 600, rel=0.3)
    assert set(first["prompt_tokens"]) <= {100, 300} and set(first["output_tokens"]) <= {10, 2000}
    assert (first["output_tokens"] == 2000).mean() == pytest.approx(0.75, abs=0.06)
    assert set(second["output_tokens"]) == {5000}  # the dataset entry of t=1200 takes over
    assert frame["arrival_s"].is_monotonic_increasing and frame["arrival_s"].min() >= 0
    assert set(frame["trace_class"]) == {"client-0"}


def test_deterministic_per_seed_and_clients_have_their_own_streams(folder):
    spec = ServeGenSpec(str(folder), (0, 7), start_s=0, duration_s=1200)
    a, b = servegen_frame(spec, 1), servegen_frame(spec, 1)
    assert a.equals(b) and not a.equals(servegen_frame(spec, 2))
    alone = servegen_frame(ServeGenSpec(str(folder), (7,), start_s=0, duration_s=1200), 1)
    assert len(alone) == pytest.approx(600, rel=0.15)  # client 7: 1 rps in its first window, idle after
    assert set(a["trace_class"]) == {"client-0", "client-7"} and (a["trace_class"] == "client-7").sum() > 0


def test_workload_spec_builds_it_with_classes(folder):
    spec = WorkloadSpec.from_dict({
        "generator": {"servegen": {"path": str(folder), "clients": [0], "start_s": 600, "duration_s": 600}},
        "classes": {"short": {"match": {"output_tokens": {"max": 1024}}}, "long": {"match": {"output_tokens": {"min": 1024}}}},
    })
    workload = spec.build(0)
    assert set(workload.requests["class"]) == {"short", "long"}
    assert spec.to_dict()["generator"] == {"servegen": {"path": str(folder), "clients": [0], "start_s": 600.0,
                                                        "duration_s": 600.0}}


@pytest.mark.parametrize(("windows", "words"), [
    (["0,1.0,1.0,Gamma,1.0"], ":1: expected 6 fields"),
    (["0,1.0,1.0,Gamma,1.0,1.0", "600,x,1.0,Gamma,1.0,1.0"], ":2: non-numeric"),
    (["0,1.0,1.0,Pareto,1.0,1.0"], ":1: an active window needs distribution"),
    (["0,-1,1.0,Gamma,1.0,1.0"], ":1: rate_rps must be >= 0"),
])
def test_bad_trace_rows_name_file_and_line(tmp_path, windows, words):
    load_client.cache_clear()
    _client(tmp_path, 0, windows, {"0": {"input_tokens": "{1: 1.0}", "output_tokens": "{1: 1.0}"}})
    with pytest.raises(TraceError, match=words.replace("(", r"\(")):
        servegen_frame(ServeGenSpec(str(tmp_path), (0,)), 0)


def test_bad_dataset_and_spec_errors(tmp_path):
    load_client.cache_clear()
    _client(tmp_path, 0, ["0,1.0,1.0,Gamma,1.0,1.0"], {"0": {"input_tokens": "{1: oops}", "output_tokens": "{1: 1}"}})
    with pytest.raises(TraceError, match="input_tokens.*probability"):
        servegen_frame(ServeGenSpec(str(tmp_path), (0,)), 0)
    with pytest.raises(TraceError, match="chunk-9-trace.csv.*missing"):
        servegen_frame(ServeGenSpec(str(tmp_path), (9,)), 0)
    with pytest.raises(ConfigError, match="clients"):
        ServeGenSpec.from_dict({"path": ".", "clients": "all"})
    with pytest.raises(ConfigError, match="duration_s"):
        ServeGenSpec.from_dict({"path": ".", "duration_s": 0})
    assert issubclass(TraceError, KvtuneError)


@pytest.mark.skipif(not SHARED.is_dir(), reason="the ServeGen data is in /work/shared")
def test_the_bundled_deepseek_r1_client_35_at_noon():
    frame = servegen_frame(ServeGenSpec(str(SHARED), (35,), start_s=43200, duration_s=300), 0)
    assert len(frame) == pytest.approx(5.05 * 300, rel=0.1)  # its 12:00 window: 5.05 requests/s
    assert frame["output_tokens"].mean() == pytest.approx(3003, rel=0.1)  # the window's output mean
    assert (frame["output_tokens"] <= 1024).mean() == pytest.approx(0.41, abs=0.05)
    assert np.median(frame["prompt_tokens"]) < frame["prompt_tokens"].mean()  # long-tailed prompts

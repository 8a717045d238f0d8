"""Calibration probes are repeated until their spread is small (issue 32): ``run_probes`` replays a probe again, up
to ``max_repeats`` times in all, while the engine's mean prefill or decode time of its repeats differ by more than
``spread``; warm-ups are replayed first and not returned."""

from __future__ import annotations

import pandas as pd

import replay.calibration.probes as probes
import replay.loadgen
from replay.calibration.probes import run_probes, warmup_groups
from replay.calibrate import probe_groups
from sim.engine.config import EngineConfig
from sim.profiles import load_gpu, load_model

CONFIG = EngineConfig.from_dict({"max_model_len": 2048, "block_size": 32, "num_gpu_blocks_override": 1000,
                                 "max_num_seqs": 64})
#: The engine's decode mean per probe, replay after replay: the prefill probe's first two repeats differ by 20%
#: (a third is needed, and agrees); the decode probe's agree at once.
DECODE_MEANS = {"prefill p=256": [0.010, 0.012, 0.0121], "decode b=4 p=64 o=16": [0.020, 0.0201]}


class _Result:
    def __init__(self, workload):
        n = len(workload.requests)
        self.requests = pd.DataFrame({"status": ["finished"] * n, "ttft_s": [0.1] * n, "tpot_s": [0.01] * n})
        self.info = {}
        self.name = workload.source.split(": ", 1)[-1]


def test_a_probe_is_repeated_while_its_repeats_disagree(monkeypatch):
    model, gpu = load_model("Llama-3-8B"), load_gpu("A100-80GB")
    groups = probe_groups(CONFIG, model, gpu, prompt_sweep=(256,), batch_sweep=((4, 64, 16),), mixed=(), bursts=(),
                          repeats=2)
    assert sorted({g.name for g in groups}) == sorted(DECODE_MEANS)
    replayed: list[str] = []
    seen: dict[str, int] = {}

    def fake_replay(url, workload, options):
        result = _Result(workload)
        replayed.append(result.name)
        return result

    def fake_means(result):
        k = seen.get(result.name, 0)
        seen[result.name] = k + 1
        return {"prefill_time": 0.05, "decode_time": DECODE_MEANS[result.name][k]}

    monkeypatch.setattr(replay.loadgen, "replay", fake_replay)
    monkeypatch.setattr(probes, "engine_means", fake_means)
    warmup = warmup_groups(CONFIG, model, gpu)
    runs = run_probes("http://127.0.0.1:9", groups, CONFIG, model, gpu, pause_s=0.0, warmup=warmup,
                      max_repeats=3, spread=0.05)
    # The warm-ups first, not returned; then both probes twice; then the prefill probe a third time, and no more.
    assert len(replayed) == len(warmup) + 5
    assert [r.probe for r in runs].count("prefill p=256") == 3
    assert [r.probe for r in runs].count("decode b=4 p=64 o=16") == 2
    assert all(r.phase != "warmup" for r in runs)
    # Without max_repeats the groups are replayed as given.
    replayed.clear()
    seen.clear()
    assert len(run_probes("http://127.0.0.1:9", groups, CONFIG, model, gpu, pause_s=0.0)) == 4

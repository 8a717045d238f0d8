"""The conformance matrix: the traces (synthetic, shared-prefix, with client deadlines, an Azure slice), the
configs each runs under (block counts from ample to tight, policies, prefix caching, V0, async), and the random
(fuzz) cases.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from benchmarks.conformance.conformance import Case, CaseConfig
from benchmarks.conformance.traces import (
    azure_slice, shared_prefix_trace, synthetic_trace, trace_max_model_len, with_timeouts,
)

#: The Azure conversation trace the ``azure`` cases slice (skipped when missing).
AZURE_CONV = Path(os.environ.get("KVTUNE_AZURE_CONV", "/work/shared/data/traces/azure_conv_2023.csv"))
#: Cases kept as the recorded reference (small trace, incl. scarce blocks with preemptions).
RECORD_CASES = ("tiny/ample", "tiny/scarce", "tiny/scarce-wm", "tiny/scarce-isl-off", "tiny/scarce-priority",
                "tiny/scarce-apc", "tiny/scarce-lpt32",
                "tinyshp/medium", "tinyshp/scarce", "tinyshp/tight", "tinyshp/scarce-priority", "tinyshp/scarce-lpt32",
                "tinyshp/scarce-bs32", "tinyabort/scarce", "tinyabort/scarce-apc-off", "tinyabort/tight-priority",
                "tiny/v0-scarce", "tiny/v0-tight-swap", "tiny/v0-chunked-scarce", "tiny/v0-chunked-scarce-swap",
                "tiny/v0-scarce-swap-small", "tiny/scarce-apc-async", "tinyshp/tight-async", "tinyabort/scarce-async")
#: Cases also run with vLLM's AsyncScheduler (name + "-async").
ASYNC_OF = ("tiny/scarce", "tiny/scarce-apc", "tiny/scarce-priority", "syn/scarce", "syn/tight", "syn/scarce-apc",
            "tinyshp/scarce", "tinyshp/tight", "shp/scarce", "tinyabort/scarce", "abort/scarce",
            "abort/scarce-priority")
#: Tokens per hash id in the shared-prefix traces (4 blocks of 16, 2 of 32).
HASH_BLOCK_TOKENS = 64


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

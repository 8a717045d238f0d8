"""Check the roofline latency model (sim/latency) against published measurements.

For every usable point of shared/data/validation_points.yaml the model's prediction, the published value and
the relative error ``(predicted - published) / published`` are printed, then the median and maximum absolute
error per group and over all scored points.  Points that the model cannot predict from a step-time model alone
(queueing, unknown batch sizes) are listed with the reason they are not scored.  Vidur's measured GEMM times
(shared/data/vidur-profiles/.../mlp.csv) are compared with the model's linear part at 1..4096 tokens, and the
vLLM paper's figure 19 (swap vs recompute per block size) is checked qualitatively.

    PYTHONPATH=. python benchmarks/latency_validation.py [--data DIR] [--coefficients k=v,...] [--quiet]

``--coefficients mfu=0.6,roofline_norm=inf`` overrides defaults, to see how a change moves the errors.
Runs in well under a second of model time; most of the wall time is reading the Vidur CSVs.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from sim.latency import LatencyCoefficients, RooflineModel, StepShape
from sim.profiles import GpuProfile, ModelProfile, load_gpu, load_model
from sim.safe_yaml import read_yaml

DEFAULT_DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"
if not DEFAULT_DATA.exists():
    DEFAULT_DATA = Path("/work/shared/data")

#: Published measurements of vLLM itself, kept in the repository with their sources.
VLLM_DATA = Path(__file__).resolve().parent / "data" / "vllm_measured.yaml"

#: validation_points.yaml GPU labels -> kvtune profiles (TRT-LLM#281: the TRT-LLM tables used SXM 80GB parts).
GPU_NAMES = {"A100": "A100-80GB", "H100": "H100-SXM", "H200": "H200", "L40S": "L40S"}


@dataclass
class Point:
    group: str
    name: str
    predicted: float
    published: float
    unit: str
    scored: bool = True
    note: str = ""
    #: Regime: ``prefill`` (prefill-dominated: TTFT, long-prompt throughput), ``decode`` (ITL, decode-heavy
    #: throughput) or ``mixed``; and ``small`` (batch <= 8) or ``large``.
    phase: str = "mixed"
    batch: str = "small"
    #: Measured on vLLM itself (the fit target of issue 12: median |error| <= 10%).
    vllm: bool = False

    @property
    def error(self) -> float:
        return (self.predicted - self.published) / self.published

    @property
    def slowness(self) -> float:
        """Signed error in one direction for every metric: > 0 when the model is too slow (a time predicted too
        long, a rate too low), < 0 when too fast."""
        ratio = self.predicted / self.published
        return ratio - 1.0 if self.unit in ("ms", "s") else 1.0 / ratio - 1.0


def _model(model: str | ModelProfile, gpu: str | GpuProfile, tp: int = 1, fp8: bool = False, kv_fp8: bool | None = None,
           coefficients: LatencyCoefficients | None = None, block_size: int = 16,
           async_scheduling: bool = False) -> RooflineModel:
    """``async_scheduling``: the engine overlaps its host work with the GPU (vLLM >= 0.17 by default; the
    TensorRT-LLM PyTorch backend's overlap scheduler, on by default); off for 2023-era TensorRT-LLM C++ runs."""
    m = load_model(model) if isinstance(model, str) else model
    g = load_gpu(GPU_NAMES.get(gpu, gpu)) if isinstance(gpu, str) else gpu
    kv_fp8 = fp8 if kv_fp8 is None else kv_fp8
    return RooflineModel(m, g, tensor_parallel=tp, kv_dtype_bytes=1 if kv_fp8 else 2,
                         weight_dtype_bytes=1 if fp8 else 2, block_size=block_size, coefficients=coefficients,
                         async_scheduling=async_scheduling)


def prefill_shape(tokens: int, num_decode: int = 0, decode_context: int = 0) -> StepShape:
    """One whole-prompt prefill (optionally with decodes in the same step)."""
    return StepShape(prefill_tokens=tokens, prefill_attention=tokens * tokens / 2.0, prefill_context=tokens,
                     num_decode=num_decode, decode_context=decode_context, num_seqs=1 + num_decode)


def decode_shape(batch: int, context_sum: float) -> StepShape:
    return StepShape(num_decode=batch, decode_context=int(context_sum), num_seqs=batch)


# ---------------------------------------------------------------------------------------------------------
def trtllm_prefill(points: list[dict], coef) -> list[Point]:
    """TensorRT-LLM v0.5 first-token latency at batch 1: one prefill step.  ``fp8`` rows ran with fp8 weights
    and fp8 KV cache (the benchmark's quant config sets both)."""
    out = []
    for p in points:
        name = "Llama-2-7B" if "7B" in p["model"] else "Llama-2-70B"
        fp8 = p["dtype"] == "fp8"
        lm = _model(name, p["gpu"], tp=p["tp"], fp8=fp8, coefficients=coef)
        t = lm.step_time(prefill_shape(p["input"]))
        out.append(Point("trtllm-ttft-bs1", f"{p['gpu']} {name} {p['dtype']} TP{p['tp']} in={p['input']}",
                         t * 1e3, p["ttft_ms"], "ms", phase="prefill"))
    return out


def splitwise(points: list[dict], coef) -> list[Point]:
    """Splitwise Table IV: Llama-2-70B on a DGX (TP8), vLLM, p50 TTFT and TBT without batching.  Median prompt
    1500 (coding) / 1020 (conversation) tokens, median output 13 / 129; TBT at the middle of the output.

    Scored, but the model is not expected to match: 2023 vLLM ran TP8 in eager mode (no CUDA graphs) with NCCL
    all-reduce (20-60 us per call in Vidur's DGX profiles, 160 per step), so its decode steps were launch- and
    communication-bound at 28-52 ms; the defaults describe vLLM 0.8+/V1 (CUDA graphs, custom all-reduce)."""
    shapes = {"coding": (1500, 13), "conversation": (1020, 129)}
    out = []
    for p in points:
        isl, osl = shapes[p["trace"]]
        lm = _model("Llama-2-70B", p["gpu"], tp=8, coefficients=coef)
        ttft = lm.step_time(prefill_shape(isl))
        tbt = lm.step_time(decode_shape(1, isl + osl // 2))
        tag = f"{p['gpu']} TP8 {p['trace']} in={isl}"
        out.append(Point("splitwise-vllm", f"{tag} TTFT p50", ttft * 1e3, p["ttft_ms"], "ms", phase="prefill"))
        out.append(Point("splitwise-vllm", f"{tag} TBT p50", tbt * 1e3, p["tbt_ms"], "ms", phase="decode",
                         note="2023 vLLM: eager mode + NCCL, not modelled"))
    return out


def nim(data: dict, coef) -> list[Point]:
    """NIM Llama-3.3-70B fp8 TP2 on 2xH100, ISL 5000 / OSL 500, closed loop at a fixed concurrency c.

    Steady state: c sequences decode together; each of the other c-1 requests prefills once per cycle, so
    during one request's decode span (a share f of the cycle) f*(c-1) steps also carry a 5000-token prefill.
    ITL = mean step time over the span; TTFT = the step that carries the prefill.  fp8 KV cache assumed (NIM's
    TRT-LLM fp8 profiles).  Concurrency >= 100 is not predicted: ITL saturates at 93 ms and TTFT jumps to
    8-89 s, i.e. requests queue behind the server's batch limit, which is not published.
    """
    isl, osl = 5000, 500
    lm = _model("Llama-3-70B", "H100", tp=2, fp8=True, kv_fp8=True, coefficients=coef)
    out = []
    for c, ttft_pub, itl_pub in zip(data["concurrency"], data["ttft_ms"], data["itl_ms"]):
        if c >= 100:
            out.append(Point("nim-70b-fp8-tp2", f"c={c} ITL", math.nan, itl_pub, "ms", scored=False,
                             note="queueing: batch limit reached (ITL flat at 93 ms)"))
            out.append(Point("nim-70b-fp8-tp2", f"c={c} TTFT", math.nan, ttft_pub, "ms", scored=False,
                             note="queueing-dominated"))
            continue
        ctx = isl + osl / 2.0
        t_dec = lm.step_time(decode_shape(c, c * ctx))
        t_mix = lm.step_time(prefill_shape(isl, num_decode=c - 1, decode_context=int((c - 1) * ctx)))
        itl, ttft = t_dec, t_mix
        for _ in range(5):  # f depends on ITL and TTFT; converges in a few rounds
            f = (osl - 1) * itl / (ttft + (osl - 1) * itl)
            n_mix = min((c - 1) * f, osl - 1)
            itl = ((osl - 1 - n_mix) * t_dec + n_mix * t_mix) / (osl - 1)
        size = "small" if c <= 8 else "large"
        out.append(Point("nim-70b-fp8-tp2", f"c={c} ITL (batch {c})", itl * 1e3, itl_pub, "ms", phase="decode",
                         batch=size))
        out.append(Point("nim-70b-fp8-tp2", f"c={c} TTFT", ttft * 1e3, ttft_pub, "ms", scored=c == 1,
                         note="" if c == 1 else "start-up burst and coincident arrivals queue (not modelled)",
                         phase="prefill", batch=size))
    return out


def _steady_throughput(lm: RooflineModel, isl: int, osl: int, batch: int) -> float:
    """Output tokens/s of in-flight batching at a steady batch: each step decodes ``batch`` sequences and
    prefills ``batch * isl / osl`` tokens (chunked) on average."""
    ctx = isl + osl / 2.0
    prefill_per_step = batch * isl / osl
    shape = StepShape(prefill_tokens=int(round(prefill_per_step)), prefill_attention=batch / osl * isl * isl / 2.0,
                      prefill_context=int(round(prefill_per_step)), num_decode=batch, decode_context=int(batch * ctx),
                      num_seqs=batch + max(1, int(math.ceil(batch / osl))))
    return batch / lm.step_time(shape)


def _kv_batch(lm: RooflineModel, isl: int, osl: int, mem_fraction: float = 0.9, cap: int = 2048) -> int:
    """Sequences that fit in the KV cache (TRT-LLM: ``kv_cache_free_gpu_mem_fraction`` of memory left after
    weights), capped at ``cap``."""
    weights = lm.model.params * lm.weight_dtype_bytes / lm.tensor_parallel
    free = (lm.gpu.mem_bytes - weights - 3e9) * mem_fraction
    tokens = free / lm.model.kv_bytes_per_token(lm.kv_dtype_bytes, lm.tensor_parallel)
    return int(max(1, min(cap, tokens // (isl + osl))))


def _phase(isl: int, osl: int) -> str:
    return "prefill" if isl >= 4 * osl else ("decode" if osl >= isl else "mixed")


def trtllm_throughput(data: dict, coef) -> list[Point]:
    """TensorRT-LLM perf-overview (PyTorch backend, fp8 weights and KV), total output tok/s at max load.

    Batch = sequences fitting in the KV cache (90% of free memory), at most 2048 (trtllm-bench's heuristics
    chose the real one; it is unpublished).  Every shape is scored, the decode-dominated ones (128/128, 128/2048,
    2048/2048) too: their error depends on that batch estimate, which the regime summary shows.  The PyTorch
    backend's overlap scheduler (on by default) hides the host's per-step work like vLLM's async scheduling.
    405B has no kvtune profile.
    """
    out = []
    runs = [("llama31_8b_fp8_tp1", "Llama-3-8B", [("H100", 1), ("H200", 1)]),
            ("llama33_70b_fp8", "Llama-3-70B", [("H100_tp2", 2), ("H200_tp1", 1)])]
    for key, model, gpus in runs:
        entry = data[key]
        for col, tp in gpus:
            gpu = col.split("_")[0]
            lm = _model(model, gpu, tp=tp, fp8=True, kv_fp8=True, coefficients=coef, async_scheduling=True)
            for shape, pub in zip(entry["isl_osl"], entry[col]):
                isl, osl = map(int, shape.split("/"))
                batch = _kv_batch(lm, isl, osl)
                pred = _steady_throughput(lm, isl, osl, batch)
                phase = _phase(isl, osl)
                out.append(Point("trtllm-max-throughput", f"{gpu} {model} TP{tp} {shape} (batch {batch})", pred, pub,
                                 "tok/s", note="batch estimated" if phase != "prefill" else "", phase=phase,
                                 batch="large"))
    out.append(Point("trtllm-max-throughput", "Llama-3.1-405B fp8 TP8", math.nan, math.nan, "tok/s", scored=False,
                     note="no 405B profile"))
    return out


def trtllm_static(points: list[dict], coef) -> list[Point]:
    """TensorRT-LLM v0.6.1 'Peak Throughput' on A100 fp16 with static batching: one context step over the
    whole batch, then OSL-1 generation steps.  The table's unit is output tok/s *per GPU* (performance.md header
    'Throughput (out tok/s/GPU)')."""
    out = []
    for p in points:
        name = "Llama-2-7B" if "7B" in p["model"] else "Llama-2-70B"
        bs, isl, osl, tp = p["bs"], p["isl"], p["osl"], p["tp"]
        lm = _model(name, "A100", tp=tp, coefficients=coef)
        prefill = lm.step_time(StepShape(prefill_tokens=bs * isl, prefill_attention=bs * isl * isl / 2.0,
                                         prefill_context=bs * isl, num_seqs=bs))
        decode = lm.decode_run_times(bs, bs * (isl + 1), osl - 1).sum()
        pred = bs * osl / (prefill + decode) / tp
        out.append(Point("trtllm-static-a100", f"{name} TP{tp} bs={bs} {isl}/{osl}", pred, p["tok_s"], "tok/s/GPU",
                         phase=_phase(isl, osl), batch="large" if bs > 8 else "small"))
    return out


def _closed_loop(lm: RooflineModel, isl: int, osl: int, c: int) -> tuple[float, float, float]:
    """``(itl, ttft, output tok/s)`` of ``c`` closed-loop clients sending ``isl``/``osl`` requests: each of the other
    c-1 requests prefills once per cycle of a request, so a share of the decode steps carries a whole prefill
    (the NIM steady state above, for any shape)."""
    ctx = isl + osl / 2.0
    t_dec = lm.step_time(decode_shape(c, c * ctx))
    t_pre = lm.step_time(prefill_shape(isl, num_decode=c - 1, decode_context=int((c - 1) * ctx)))
    itl = t_dec
    for _ in range(8):
        cycle = t_pre + (osl - 1) * itl
        n_mix = min((c - 1) * (osl - 1) * itl / cycle, osl - 1) if c > 1 else 0.0
        itl = ((osl - 1 - n_mix) * t_dec + n_mix * t_pre) / (osl - 1)
    cycle = t_pre + (osl - 1) * itl
    return itl, t_pre, c * osl / cycle


def vllm_measured(path: Path, coef) -> list[Point]:
    """Published vLLM measurements (benchmarks/data/vllm_measured.yaml), each run with the async-scheduling default
    of its vLLM release (sim/data/vllm_defaults.yaml)."""
    from sim.engine.defaults import engine_defaults

    out = []
    for run in read_yaml(path)["runs"]:
        gpu = load_gpu(run["gpu"])
        asyn = engine_defaults("vllm-v1", run["vllm"], gpu).async_scheduling
        lm = _model(run["model"], gpu, fp8=run["dtype"] == "fp8", coefficients=coef, async_scheduling=asyn)
        tag = f"{run['id']} (vLLM {run['vllm']})"
        for p in run["points"]:
            c, metric, value = int(p["concurrency"]), p["metric"], float(p["value"])
            scored = p.get("scored", True)
            size = "small" if c <= 8 else "large"
            if metric == "tpot_p50_ms":
                ctx = run.get("assumed_context", 512)
                pred = lm.step_time(decode_shape(c, c * ctx)) * 1e3
                point = Point("vllm-measured", f"{tag} c={c} TPOT p50", pred, value, "ms", scored, p.get("why", ""),
                              "decode", size, True)
            elif metric == "decode_tok_s_per_request":
                itl, _, _ = _closed_loop(lm, run["isl"], run["osl"], c)
                point = Point("vllm-measured", f"{tag} c={c} decode tok/s per request", 1.0 / itl, value, "tok/s",
                              scored, p.get("why", ""), "decode", size, True)
            elif metric == "throughput_ratio_vs_c1":
                ratio = _closed_loop(lm, run["isl"], run["osl"], c)[2] / _closed_loop(lm, run["isl"], run["osl"], 1)[2]
                point = Point("vllm-measured", f"{tag} c={c} output tok/s / c=1", ratio, value, "x", scored,
                              p.get("why", ""), "mixed", size, True)
            else:
                raise ValueError(f"{path}: unknown metric {metric!r}")
            out.append(point)
    return out


# ---------------------------------------------------------------------------------------------------------
VIDUR_LINEAR_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
VIDUR_CASES = [  # (sku, directory, kvtune model, kvtune gpu); the first two are the brief's required pair
    ("a100", "Meta-Llama-3-8B", "Llama-3-8B", "A100-80GB"),
    ("h100", "Llama-2-7b-hf", "Llama-2-7B", "H100-SXM"),
    ("a100", "Llama-2-7b-hf", "Llama-2-7B", "A100-80GB"),
    ("a100", "Llama-2-70b-hf", "Llama-2-70B", "A100-80GB"),
    ("h100", "Llama-2-70b-hf", "Llama-2-70B", "H100-SXM"),
    ("a100", "Meta-Llama-3-70B", "Llama-3-70B", "A100-80GB"),
]


def vidur(data_dir: Path, coef, verbose: bool) -> tuple[list[str], list[float]]:
    """Vidur's per-layer GEMM medians (QKV, O, gate+up, down) x num_layers vs the model's linear part, for
    num_tokens 1..4096 at each profiled TP (shapes sharded per TP, measured on one GPU: no all-reduce)."""
    lines, all_errors = [], []
    base = data_dir / "vidur-profiles" / "profiling" / "compute"
    cols = [f"time_stats.{op}.median" for op in VIDUR_LINEAR_OPS]
    show = [1, 16, 64, 128, 256, 512, 1024, 2048, 4096]
    for sku, directory, model_name, gpu_name in VIDUR_CASES:
        path = base / sku / "meta-llama" / directory / "mlp.csv"
        if not path.exists():
            lines.append(f"  {sku}/{directory}: missing ({path})")
            continue
        df = pd.read_csv(path, usecols=cols + ["num_tokens", "num_tensor_parallel_workers"])
        df = df[df.num_tokens <= 4096]
        model = load_model(model_name)
        for tp, grp in df.groupby("num_tensor_parallel_workers"):
            g = grp.groupby("num_tokens")[cols].median().sum(axis=1) * 1e-3 * model.num_layers
            lm = _model(model_name, gpu_name, tp=int(tp), coefficients=coef)
            tokens = g.index.to_numpy(dtype=float)
            pred = lm.linear_time(tokens)
            err = (pred - g.to_numpy()) / g.to_numpy()
            all_errors.extend(np.abs(err).tolist())
            worst = int(tokens[np.argmax(np.abs(err))])
            lines.append(f"  {sku} {model_name:<11} TP{int(tp)}: {len(tokens):3d} token counts, "
                         f"median |err| {np.median(np.abs(err)):6.1%}, max |err| {np.max(np.abs(err)):6.1%} "
                         f"(at {worst} tokens)")
            if verbose and tp == 1:
                cells = []
                for t in show:
                    if t in g.index:
                        i = int(np.searchsorted(tokens, t))
                        cells.append(f"{t}:{pred[i] * 1e3:.2f}/{g.iloc[i] * 1e3:.2f}ms({err[i]:+.0%})")
                lines.append("      predicted/measured: " + "  ".join(cells))
    return lines, all_errors


def fig19(coef) -> list[str]:
    """vLLM paper figure 19 (OPT-13B, one A100-40GB): swap in+out vs recompute of a 256-token sequence for block
    sizes 1..256.  V0 copies each block once per layer for K and V (2 x 40 copies per block).  Published (third-
    party reading of the figure): swap ~135 ms at block 1, ~10-20 ms at 256; recompute ~20-30 ms, flat."""
    opt13b = ModelProfile(name="OPT-13B", num_layers=40, hidden_size=5120, num_attention_heads=40, num_kv_heads=40,
                          head_dim=128, intermediate_size=20480, vocab_size=50272, params_b=12.85, max_model_len=2048,
                          source="vLLM paper Table 1; facebook/opt-13b config.json")
    a100_40 = dataclasses.replace(load_gpu("A100-80GB"), name="A100-40GB", mem_gb=40, hbm_bw_gbps=1555,
                                  source="NVIDIA A100 datasheet (40GB SXM: 1,555 GB/s)")
    tokens = 256
    lines = [f"  {'block':>5} {'swap in+out ms':>15} {'recompute ms':>13}  winner"]
    swap_by_block = {}
    recompute = None
    for bs in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        lm = _model(opt13b, a100_40, block_size=bs, coefficients=coef)
        blocks = tokens // bs
        copies = blocks * 2 * opt13b.num_layers
        swap = 2 * lm.swap_time(blocks, copies)
        recompute = lm.step_time(prefill_shape(tokens))  # the recompute is one prefill step
        swap_by_block[bs] = swap
        winner = "recompute" if recompute < swap else "swap"
        lines.append(f"  {bs:>5} {swap * 1e3:>15.1f} {recompute * 1e3:>13.1f}  {winner}")
    sizes = list(swap_by_block)
    checks = [
        ("swap loses to recompute at block size 1", swap_by_block[1] > recompute),
        ("swap wins at block size 256", swap_by_block[256] < recompute),
        ("swap time falls monotonically with block size",
         all(swap_by_block[a] > swap_by_block[b] for a, b in zip(sizes[:-1], sizes[1:]))),
        # per_copy_overhead_s follows vLLM PR #11531's measurement, ~3x the paper's implied per-copy cost.
        ("block 1 swap within 3x of ~135 ms", 45 < swap_by_block[1] * 1e3 < 405),
        ("block 256 swap within 10-20 ms (+-50%)", 5 < swap_by_block[256] * 1e3 < 30),
        ("recompute within 20-30 ms (+-50%)", 10 < recompute * 1e3 < 45),
    ]
    lines += [f"  [{'ok' if ok else 'FAIL'}] {text}" for text, ok in checks]
    return lines


def pr11531(coef) -> list[str]:
    """V0 swap_blocks issues one copy per page; PR #11531 measured 3.11 GB/s swapping 1250 pages in and 3.12 GB/s
    out (1.21/1.22 GB/s for one page) on A100-40GB.  A page here is 16 tokens of one layer's K or V of an
    8-KV-head, 128-dim model (32 KiB)."""
    gpu = load_gpu("A100-40GB")
    lm = _model("Llama-3-8B", gpu, coefficients=coef)
    page = 16 * 8 * 128 * 2  # bytes: one layer's K (or V) of one 16-token block
    lines = []
    for pages, published in ((1250, 3.11), (1, 1.21)):
        t = pages * page / lm._link_bytes_per_s + coef.per_copy_overhead_s * pages
        got = pages * page / t / 1e9
        lines.append(f"  {pages:>5} pages: {got:5.2f} GB/s predicted, {published:5.2f} GB/s published "
                     f"({got / published - 1:+.0%})")
    return lines


# ---------------------------------------------------------------------------------------------------------
def collect(data_dir: Path, coef: LatencyCoefficients) -> list[Point]:
    vp = read_yaml(data_dir / "validation_points.yaml")
    points: list[Point] = []
    points += trtllm_prefill(vp["prefill_first_token_latency_bs1"], coef)
    points += splitwise(vp["splitwise_table_iv_llama2_70b_p50_no_batching"], coef)
    points += nim(vp["nim_llama33_70b_fp8_tp2_2xH100_isl5000_osl500"], coef)
    points += trtllm_throughput(vp["trtllm_max_throughput_out_tok_s"], coef)
    points += trtllm_static(vp["trtllm_v0_6_1_a100_fp16_out_tok_s"], coef)
    points.append(Point("nim-8b", "Llama-3.1-8B NIM 1.8.0", math.nan, math.nan, "ms", scored=False,
                        note="GPU/precision/ISL-OSL labels unconfirmed in the source excerpt"))
    points += vllm_measured(VLLM_DATA, coef)
    return points


def summarize(points: list[Point]) -> dict[str, tuple[float, float, int]]:
    out = {}
    groups = sorted({p.group for p in points})
    for g in groups + ["ALL", "ALL except splitwise"]:
        def member(p: Point) -> bool:
            if g == "ALL except splitwise":
                return p.group != "splitwise-vllm"
            return g == "ALL" or p.group == g

        errs = [abs(p.error) for p in points if p.scored and member(p)]
        if errs:
            out[g] = (float(np.median(errs)), float(np.max(errs)), len(errs))
    return out


def regimes(points: list[Point]) -> list[tuple[str, int, float, float, float]]:
    """Per regime (phase x batch size, over the scored points but Splitwise's 2023 eager-mode runs): count,
    median signed slowness, share of points too slow, median |error|.  A regime whose points all err the same way
    has a systematic sign."""
    rows = []
    use = [p for p in points if p.scored and p.group != "splitwise-vllm"]
    keys = [("vLLM-measured", lambda p: p.vllm)]
    for phase in ("prefill", "mixed", "decode"):
        keys.append((phase if phase == "mixed" else f"{phase}-heavy", lambda p, ph=phase: p.phase == ph))
    for size in ("small", "large"):
        keys.append((f"{size} batch", lambda p, sz=size: p.batch == sz))
    for label, member in keys:
        sel = [p for p in use if member(p)]
        if sel:
            slow = np.array([p.slowness for p in sel])
            rows.append((label, len(sel), float(np.median(slow)), float(np.mean(slow > 0)),
                         float(np.median([abs(p.error) for p in sel]))))
    return rows


FIT_PARAMS = ("overhead_s", "per_seq_overhead_s", "mfu", "mfu_fp8", "bw_eff", "async_exposed_s")


def fit(data_dir: Path, start: LatencyCoefficients, params: tuple[str, ...] = FIT_PARAMS) -> LatencyCoefficients:
    """Least squares on log(predicted / published) over every scored point but Splitwise's (2023 eager mode),
    the vLLM-measured points weighted 3x (they are the target), coefficients searched in log space."""
    from scipy.optimize import minimize

    x0 = np.log([getattr(start, k) for k in params])

    def coef_of(x):
        return dataclasses.replace(start, **{k: float(v) for k, v in zip(params, np.exp(x))})

    def loss(x):
        pts = [p for p in collect(data_dir, coef_of(x)) if p.scored and p.group != "splitwise-vllm"]
        return sum((3.0 if p.vllm else 1.0) * np.log(p.predicted / p.published) ** 2 for p in pts)

    res = minimize(loss, x0, method="Nelder-Mead", options={"maxiter": 400, "xatol": 1e-3, "fatol": 1e-6})
    return coef_of(res.x)


def parse_coefficients(text: str | None) -> LatencyCoefficients:
    if not text:
        return LatencyCoefficients()
    changes = {}
    for item in text.split(","):
        key, value = item.split("=")
        changes[key.strip()] = float(value)
    return dataclasses.replace(LatencyCoefficients(), **changes)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="shared/data directory")
    ap.add_argument("--coefficients", help="overrides, e.g. mfu=0.6,roofline_norm=inf")
    ap.add_argument("--quiet", action="store_true", help="summary only")
    ap.add_argument("--fit", action="store_true",
                    help=f"refit {', '.join(FIT_PARAMS)} to the scored points first (a few minutes) and print them")
    ap.add_argument("--fit-params", help="comma-separated coefficients --fit varies (default: all of the above)")
    args = ap.parse_args(argv)
    coef = parse_coefficients(args.coefficients)
    if args.fit:
        params = tuple(p.strip() for p in args.fit_params.split(",")) if args.fit_params else FIT_PARAMS
        coef = fit(args.data, coef, params)
        print("fitted:", ", ".join(f"{k}={getattr(coef, k):.4g}" for k in params))
    print("coefficients:", ", ".join(f"{k}={v:g}" for k, v in coef.as_dict().items()))
    points = collect(args.data, coef)
    if not args.quiet:
        print(f"\n{'group':<22} {'point':<52} {'predicted':>10} {'published':>10} {'error':>8}  note")
        for p in points:
            pred = "-" if math.isnan(p.predicted) else f"{p.predicted:,.1f}"
            pub = "-" if math.isnan(p.published) else f"{p.published:,.1f}"
            err = "-" if (math.isnan(p.predicted) or math.isnan(p.published)) else f"{p.error:+.1%}"
            flag = "" if p.scored else "(not scored) "
            print(f"{p.group:<22} {p.name:<52} {pred:>10} {pub:>10} {err:>8}  {flag}{p.note}")
    print("\nabsolute relative error over scored points:")
    for g, (med, mx, n) in summarize(points).items():
        print(f"  {g:<22} n={n:<3d} median {med:6.1%}   max {mx:6.1%}")
    print("\nby regime (scored points but Splitwise's; slowness > 0: model too slow):")
    for label, n, med_slow, share_slow, med_abs in regimes(points):
        print(f"  {label:<16} n={n:<3d} median |err| {med_abs:6.1%}   median slowness {med_slow:+6.1%}   "
              f"too slow in {share_slow:4.0%} of points")
    lines, errs = vidur(args.data, coef, verbose=not args.quiet)
    print("\nVidur operator profiles: linear layers (QKV+O+gate/up+down) x layers, model vs measured:")
    print("\n".join(lines))
    if errs:
        print(f"  ALL: n={len(errs)} median |err| {np.median(errs):.1%}, max |err| {np.max(errs):.1%}")
    print("\nvLLM paper fig. 19: swap vs recompute, OPT-13B, 256-token sequence, A100-40GB:")
    print("\n".join(fig19(coef)))
    print("\nvLLM PR #11531 (V0 swap_blocks, A100-40GB): effective swap bandwidth of 32 KiB pages:")
    print("\n".join(pr11531(coef)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

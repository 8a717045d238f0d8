"""``kvtune simulate``: one simulated run of a trace on one engine config, written as parquet + JSON."""

from __future__ import annotations

import argparse
import gc
import json
import math
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from optimizer._cli_args import (add_engine_arguments, add_format_argument, add_hash_block_tokens_argument,
                                 add_latency_arguments, add_rate_scale_argument, add_seed_argument,
                                 apply_hash_block_tokens, parse_pairs, positive_int)
from sim.errors import ConfigError
from sim.outputs import atomic_write, atomic_write_text, probe_out_dir


def parse_set(items: list[str] | None) -> dict[str, str]:
    """``--set key=value`` pairs -> dict; a malformed pair is an error naming it."""
    return parse_pairs(items, "--set")


def add_simulate_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "simulate",
        help="simulate one engine config on a trace",
        description="Simulate a trace on one engine config; writes requests.parquet, steps.parquet, summary.json.",
    )
    p.add_argument("--trace", help="trace file (default: the bundled Azure 2023 conversation trace)")
    add_format_argument(p)
    add_hash_block_tokens_argument(p)
    add_engine_arguments(p, model_help="model profile name or HF folder (default: the --profile's model, else "
                                       "Llama-3-8B)",
                         gpu_help="GPU/device profile name or YAML (default: the --profile's device, else H100-SXM)",
                         set_help="engine knob, repeatable")
    add_latency_arguments(p, coef=False,
                          profile_help="latency profile YAML (kvtune calibrate): the fitted coefficients for its model "
                                       "and device; its measured client-side latency is added to every predicted token")
    p.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel degree")
    p.add_argument("--flavor", default="vllm-v1", choices=["vllm-v1", "vllm-v0"])
    add_rate_scale_argument(p)
    p.add_argument("--max-requests", type=positive_int, default=None, help="simulate only the first N requests")
    add_seed_argument(p, help="seed for client timeouts/cancellations (0 <= S < 2**32)")
    p.add_argument("--out", default="runs/simulate", help="output folder (default runs/simulate)")
    p.set_defaults(handler=run_simulate)


@contextmanager
def _imports_uncollected() -> Iterator[None]:
    """``with _imports_uncollected():`` the cyclic garbage collector does not run inside, and what was allocated
    before and inside goes to its oldest generation at the end (``gc.freeze`` then ``gc.unfreeze``: no pass over it).

    A module import allocates objects that live as long as the process (functions, classes, their dicts), and
    none of them is garbage; yet pandas, pyarrow and numpy allocate so many that the collector ran ~170 times
    while ``kvtune simulate`` imported them (153 gen 0, 13 gen 1, one full pass), each pass walking the young
    imports again (issue 34: 3.8% of the instructions of a 200-request ``simulate`` process,
    benchmarks/speed/README.md).
    Where the collector is off already, or someone froze a heap, it changes nothing."""
    if not gc.isenabled() or gc.get_freeze_count():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.unfreeze()
        gc.enable()


def run_simulate(args: argparse.Namespace) -> int:
    # Imported here so that building the CLI (``kvtune --help``) does not load pandas and SimPy.
    with _imports_uncollected():
        import pyarrow.parquet  # noqa: F401 (the tables' writer: pandas imports it at the first ``to_parquet``)

        from objectives import StepTotals, format_summary, summarize
        from optimizer._progress import CountProgress
        from sim.engine import EngineConfig, release_record
        from sim.profiles import load_gpu, load_model
        from sim.runner import Progress, simulate
        from sim.tables import StepColumns
        from sim.workload import bundled_trace_path, load_trace

    knobs = parse_set(args.set)
    knobs.setdefault("flavor", args.flavor)
    if args.tp != 1:
        knobs.setdefault("tensor_parallel_size", str(args.tp))
    config = EngineConfig.from_dict(knobs, where="--set")
    from sim.latency import add_client_latency, read_profile, with_client_timeouts

    profile = read_profile(args.profile) if args.profile else None
    model = load_model(args.model or (profile and profile.model) or "Llama-3-8B", field="--model")
    gpu = load_gpu(args.gpu or (profile and profile.gpu) or "H100-SXM", field="--gpu")
    out = probe_out_dir(args.out)  # before the simulation: a folder that cannot be written fails at once
    trace = Path(args.trace) if args.trace else bundled_trace_path()
    workload = apply_hash_block_tokens(load_trace(trace, args.fmt, seed=args.seed), args.hash_block_tokens)
    if args.max_requests is not None:
        if args.max_requests < 1:
            raise ConfigError("--max-requests", f"must be >= 1, got {args.max_requests}")
        workload = workload.head(args.max_requests)
    if args.rate_scale != 1.0:
        workload = workload.scale_rate(args.rate_scale)
    # The profile's client-side latency is added to every token below; a client timeout counts it too, so the
    # engine is simulated with each timeout shortened by it (a finished request's client E2E stays within it).
    client_s = profile.client_offset_s if profile else 0.0
    workload = with_client_timeouts(workload, client_s)

    # tqdm's bar on a terminal, erased at the end; a plain line every 10 s in a log (optimizer/_progress.py)
    bar = CountProgress(len(workload), "req", every_s=10.0, desc="  simulating")

    def progress(p: Progress) -> None:
        bar.show(p.requests_done, f"simulated {p.sim_time_s:.1f} s",
                 f"  simulated {p.sim_time_s:9.1f} s  requests ended {p.requests_done}/{p.requests_total}  "
                 f"wall {p.wall_s:5.1f} s")

    print(f"kvtune simulate: {len(workload)} requests from {trace.name}, {model.name} on {gpu.name}"
          f" (tp {config.tensor_parallel_size}), {config.flavor}", file=sys.stderr)
    # Memory grows with the requests in the system and the table rows, not with Python objects per request or
    # step (issue 34): each request's live state is dropped once its row is in the request table's arrays, the
    # step rows are kept as columns, a chunk at a time (sim.tables.StepColumns), and the step table is written and
    # dropped before the request metrics are computed (StepTotals.of: the same figures).  The tables are the same.
    step_columns = StepColumns()
    try:
        result = simulate(workload, config, model, gpu, seed=args.seed, progress=progress,
                          coefficients=profile.coefficients if profile else None,
                          keep_requests=False, record_steps=False, step_sink=step_columns.add)
    finally:
        bar.close(clear=True)
    steps = step_columns.table()
    with atomic_write(out / "steps.parquet") as tmp:  # a full disk leaves no truncated file behind
        steps.to_parquet(tmp, index=False)
    step_totals = StepTotals.of(steps)
    del steps
    # What a client sees: the profile's client-side latency (HTTP, API server) on every token, as the real-engine
    # benchmark predicts (sim.latency.add_client_latency, issue 32).
    requests = result.requests = add_client_latency(result.requests, client_s)
    summary = summarize(requests, step_totals, workload.classes)
    with atomic_write(out / "requests.parquet") as tmp:
        requests.to_parquet(tmp, index=False)
    document = {
        "trace": str(trace),
        "model": model.name,
        "gpu": gpu.name,
        "latency_profile": args.profile,
        "client_latency_s": client_s,
        "config": {k: v for k, v in vars(result.config).items()},
        **release_record(config.engine_version, result.config),
        "num_gpu_blocks": result.sizing.num_gpu_blocks,
        "num_cpu_blocks": result.sizing.num_cpu_blocks,
        "engine_aborted": result.aborted,
        "wall_s": result.wall_s,
        "simulated_requests_per_wall_s": len(workload) / result.wall_s if result.wall_s > 0 else math.inf,
        "metrics": summary.to_dict(),
    }
    atomic_write_text(out / "summary.json", json.dumps(document, indent=1, default=str))
    print(format_summary(summary))
    if client_s:
        print(f"client-side latency {client_s * 1e3:.1f} ms (the profile's) added to every token's time")
    print(f"KV cache: {result.sizing.num_gpu_blocks} blocks of {result.config.block_size} tokens; "
          f"wall {result.wall_s:.2f} s ({document['simulated_requests_per_wall_s']:.0f} requests/s)")
    if result.aborted:
        print(f"engine aborted: {result.aborted}")
    print(f"wrote {out}/requests.parquet, steps.parquet, summary.json")
    return 0

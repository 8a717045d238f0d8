"""Identical real runs of ``router_check.py`` against each other, and kvtune's simulation against their spread
(issue 31).

``router_check.py`` compares kvtune's simulated fleet with one measured run per router.  At a few dozen sessions
a replica's request count is decided by where the sessions' first requests go, and a load-following router sends
a session's first request by whether some other request happens to be still in flight at that instant.  On the
real engines that time in flight varies from run to run (the HTTP front ends and the engines share the machine's
cores), so two runs of the same trace on the same engines already place some sessions differently.  This script
reads several ``router_check.py --out`` folders of the same trace and prints, per policy measured in two or more:

- each run's requests and prefix-cache hit rate per replica, their median and range;
- the simulated figures over the runs' fitted speeds (``--fit-speed``: each run's own round-robin run, as
  ``router_check.py --fit-speed`` fits it; ``--as-sent``: each run's own send times, as ``router_check.py
  --as-sent``) and ``--router-seeds`` tie-draw seeds: median and range, and the
  median's error against the measured median, beside the measured runs' own largest deviation from it;
- between every two runs: the session starts placed on different replicas, the requests placed on the same one,
  and the correlation of the per-request time in flight (send to end of response).

    python benchmarks/real_engine/router_repeat.py --fit-speed --router-seeds 20 \\
        --profile benchmarks/real_engine/measurements/pinned-core-profile.yaml \\
        benchmarks/real_engine/measurements/router_check/kvtune-routers-run2 \\
        benchmarks/real_engine/measurements/router_check/kvtune-routers-run3

Labels: a kvtune router's first of equals is replica 0 and the replay lists e0 first, so kvtune's runs are
compared as labelled; sglang-router's runs (its registry's order is its own) take the relabelling that agrees
most with the first run's.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import router_check as rc  # noqa: E402
from optimizer import add_latency_arguments, add_model_argument  # noqa: E402


class RunsError(Exception):
    """Run folders that cannot be compared (one line, exit 2)."""


def read_runs(folders: list[Path]) -> list[list[dict]]:
    """Each folder's ``router_check.json``; all must hold the same trace and engine sizes."""
    runs, first = [], None
    for folder in folders:
        path = folder / "router_check.json"
        if not path.is_file():
            raise RunsError(f"no {path}")
        try:
            saved = json.loads(path.read_text())
            workload = saved[0]["workload"]
        except (ValueError, LookupError, TypeError) as exc:
            raise RunsError(f"{path}: not a router_check.py measurement ({exc})") from None
        if first is None:
            first = (path, workload)
        elif workload != first[1]:
            raise RunsError(f"{path}: workload {workload} differs from {first[0]}'s {first[1]}")
        runs.append(saved)
    return runs


def by_policy(runs: list[list[dict]]) -> dict[str, list[tuple[int, dict]]]:
    """Policy -> (run number, measured run) for every policy measured in two or more runs, in first-seen order."""
    out: dict[str, list[tuple[int, dict]]] = {}
    for k, saved in enumerate(runs):
        for entry in saved:
            out.setdefault(entry["measured"]["policy"], []).append((k, entry["measured"]))
    return {policy: reals for policy, reals in out.items() if len(reals) >= 2}


def aligned(policy: str, reals: list[dict]) -> list[np.ndarray]:
    """Each run's replica per request, sglang-router's runs relabelled to agree most with the first run."""
    ref = np.array(reals[0]["replica_of"])
    out = []
    for real in reals:
        of = np.array(real["replica_of"])
        if not policy.startswith("kvtune:") and (of == 1 - ref).sum() > (of == ref).sum():
            of = np.where(of >= 0, 1 - of, of)
        out.append(of)
    return out


def first_requests(workload) -> np.ndarray:
    """The index of each session's first request."""
    sess = workload.requests["session_id"].to_numpy()
    return np.array([int(np.flatnonzero(sess == s)[0]) for s in np.unique(sess)])


def in_flight(real: dict) -> np.ndarray:
    return np.array([np.nan if s is None or e is None else e - s for s, e in zip(real["sent_s"], real["end_s"])])


def pairs(policy: str, reals: list[tuple[int, dict]], first: np.ndarray) -> list[dict]:
    """Every two runs of ``policy``: session starts placed differently, requests placed alike, and the correlation
    of their per-request times in flight."""
    ofs = aligned(policy, [real for _, real in reals])
    out = []
    for (a, (ka, ra)), (b, (kb, rb)) in itertools.combinations(enumerate(reals), 2):
        fa, fb = in_flight(ra), in_flight(rb)
        ok = ~(np.isnan(fa) | np.isnan(fb))
        out.append({"runs": (ka, kb), "starts_moved": int((ofs[a][first] != ofs[b][first]).sum()),
                    "starts": len(first), "same_replica": int((ofs[a] == ofs[b]).sum()), "n": len(ofs[a]),
                    "in_flight_corr": float(np.corrcoef(fa[ok], fb[ok])[0, 1])})
    return out


def spread(values) -> tuple[float, float, float]:
    v = np.asarray(values, dtype=float)
    return float(np.median(v)), float(v.min()), float(v.max())


def summarise(policy: str, reals: list[tuple[int, dict]], sims: list[dict]) -> list[dict]:
    """Per replica: measured per run, measured median and range, simulated median and range (relabelled against
    each measured run as ``router_check.compare`` pairs them), and the errors against the measured median."""
    ofs = aligned(policy, [real for _, real in reals])
    rows = []
    for r in range(2):
        counts = [int((of == r).sum()) for of in ofs]
        hits = [real["replicas"][r if np.array_equal(of, np.array(real["replica_of"])) else 1 - r]["hit_rate"]
                for of, (_, real) in zip(ofs, reals)]
        sim_counts = [c["per"][r]["sim_requests"] for c in sims]
        sim_hits = [c["per"][r]["sim_hit_rate"] for c in sims]
        m_count, m_hit = float(np.median(counts)), float(np.median(hits))
        rows.append({"replica": r, "counts": counts, "hits": hits, "count": spread(counts), "hit": spread(hits),
                     "sim_count": spread(sim_counts), "sim_hit": spread(sim_hits),
                     "sim_count_err": spread(sim_counts)[0] / m_count - 1 if m_count else float("nan"),
                     "sim_hit_err": spread(sim_hits)[0] / m_hit - 1 if m_hit else float("nan"),
                     "run_count_dev": max(abs(c / m_count - 1) for c in counts) if m_count else float("nan"),
                     "run_hit_dev": max(abs(h / m_hit - 1) for h in hits) if m_hit else float("nan")})
    return rows


def simulated(args, runs: list[list[dict]], policies: dict, workload) -> dict[str, list[dict]]:
    """Policy -> ``router_check.compare`` of every (run, seed) simulation against that run's measurement; with
    ``--fit-speed`` each run's step times fitted to its own round-robin run."""
    out: dict[str, list[dict]] = {policy: [] for policy in policies}
    for k, saved in enumerate(runs):
        scale = 1.0
        if args.fit_speed:
            rr = next((s["measured"] for s in saved if rc.router_of(s["measured"]["policy"]) == "round_robin"
                       and s["measured"].get("sent_s")), None)
            if rr is None:
                raise RunsError(f"--fit-speed: run {k} ({args.runs[k]}) has no round-robin run with send and "
                                "end times")
            scale = rc.fit_speed(args, rr, rc.as_sent(workload, rr) if args.as_sent else workload)
            print(f"run {k} ({args.runs[k]}): every step time x{scale:.3f}", flush=True)
        for policy, reals in policies.items():
            real = next((real for kk, real in reals if kk == k), None)
            if real is None:
                continue
            trace = rc.as_sent(workload, real) if args.as_sent else workload
            for seed in range(args.router_seeds):
                out[policy].append(rc.compare(real, rc.simulate(args, rc.router_of(policy), trace, scale, seed)))
    return out


def report(policies: dict, sims: dict, first: np.ndarray) -> str:
    lines = ["| policy | replica | requests per run | measured median [least, most] | simulated median [least, most] "
             "| sim err (runs' own largest) | hit rate per run | hit rate sim median [least, most] | sim err (runs' "
             "own largest) |", "|---|---|---|---|---|---|---|---|---|"]
    for policy, reals in policies.items():
        for row in summarise(policy, reals, sims[policy]):
            c, sc, sh = row["count"], row["sim_count"], row["sim_hit"]
            lines.append(
                f"| {policy} | e{row['replica']} | {' / '.join(map(str, row['counts']))} | {c[0]:.0f} [{c[1]:.0f}, "
                f"{c[2]:.0f}] | {sc[0]:.0f} [{sc[1]:.0f}, {sc[2]:.0f}] | {row['sim_count_err']:+.0%} "
                f"({row['run_count_dev']:.0%}) | {' / '.join(f'{h:.3f}' for h in row['hits'])} | {sh[0]:.3f} "
                f"[{sh[1]:.3f}, {sh[2]:.3f}] | {row['sim_hit_err']:+.0%} ({row['run_hit_dev']:.0%}) |")
    lines += ["", "| policy | runs | session starts placed differently | requests on the same replica | "
              "time in flight, correlation |", "|---|---|---|---|---|"]
    for policy, reals in policies.items():
        for p in pairs(policy, reals, first):
            lines.append(f"| {policy} | {p['runs'][0]} / {p['runs'][1]} | {p['starts_moved']}/{p['starts']} | "
                         f"{p['same_replica']}/{p['n']} | {p['in_flight_corr']:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="router_check.py --out folders of the same trace")
    add_model_argument(ap, help="HF model folder simulated (default ~/.cache/kvtune/tiny-llama)")
    add_latency_arguments(ap, coef=False, profile_help="latency profile YAML (default: "
                                                       "benchmarks/real_engine/profiles/tiny-llama-vllm-cpu.yaml)")
    ap.set_defaults(model=Path("~/.cache/kvtune/tiny-llama").expanduser(),
                    profile=rc.ROOT / "benchmarks/real_engine/profiles/tiny-llama-vllm-cpu.yaml")
    ap.add_argument("--fit-speed", action="store_true", help="fit each run's step times on its own round-robin run")
    ap.add_argument("--as-sent", action="store_true",
                    help="simulate each run with the requests arriving when its router placed them (router_check.py "
                         "--as-sent)")
    ap.add_argument("--router-seeds", type=int, default=1, help="tie-draw seeds simulated per run")
    args = ap.parse_args(argv)
    args.model, args.profile = Path(args.model), Path(args.profile)
    if len(args.runs) < 2:
        print("router_repeat.py: error: give two or more run folders", file=sys.stderr)
        return 2
    if args.router_seeds < 1:
        print("router_repeat.py: error: --router-seeds must be >= 1", file=sys.stderr)
        return 2
    try:
        runs = read_runs(args.runs)
        for key, value in runs[0][0]["workload"].items():
            setattr(args, key, value)
        workload = rc.shared_prefix_workload(args.requests, args.sessions, args.prefix_blocks, args.rate, args.seed)
        policies = by_policy(runs)
        if not policies:
            raise RunsError("no policy was measured in two of these runs")
        print(report(policies, simulated(args, runs, policies, workload), first_requests(workload)))
    except RunsError as exc:
        print(f"router_repeat.py: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Robustness of a recommendation: does it still meet its SLOs, and still beat the engine default config, when
the simulator is off by the amounts its own validation allows?

kvtune's KV capacity is within 2% of vLLM's logs (benchmarks/kv_capacity.py) and its step times within about
10% of published measurements (benchmarks/latency_validation.py); near saturation 5% fewer blocks can double a
tail latency.  Each perturbation re-simulates the recommended and the default config with KV blocks x0.95 or
x1.05, or every step time x0.9 or x1.1, and the worst corner (x0.95 blocks, x1.1 time).

The ten simulations run in worker processes forked from the caller, one per CPU (they inherit the workloads; the
results are the same as one after another, the simulator being deterministic); one after another on one CPU, where
``fork`` is missing, or in a process that joined a Ray (forking a Ray driver is unsafe).
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from optimizer._backend import SimBackend, TrialError
from sim.errors import KvtuneError

#: (label, KV-block factor, step-time factor).
PERTURBATIONS: tuple[tuple[str, float, float], ...] = (
    ("kv_blocks -5%", 0.95, 1.0),
    ("kv_blocks +5%", 1.05, 1.0),
    ("step_time -10%", 1.0, 0.9),
    ("step_time +10%", 1.0, 1.1),
    ("kv_blocks -5%, step_time +10%", 0.95, 1.1),
)


def _throughput(metrics: Mapping[str, Any], objective_names: Sequence[str]) -> tuple[str, float]:
    for key in ("output_tokens_per_s", "goodput_rps"):
        if key in objective_names or key in metrics:
            return key, float(metrics.get(key, math.nan))
    return "output_tokens_per_s", math.nan


#: What the forked workers of :func:`robustness` simulate: (ctx, recommended, default, perturbations), set by the
#: caller before the fork (inherited, not pickled: the workloads are large).
_JOB: tuple | None = None


def _simulate_pair(i: int) -> tuple[Any, Any, str | None]:
    """The recommended and the default config under perturbation ``i`` of :data:`_JOB`: (rec, base, error)."""
    assert _JOB is not None
    ctx, recommended, default, perturbations = _JOB
    _, kv, time = perturbations[i]
    backend = SimBackend.for_spec(ctx.spec, ctx.workloads, kv_scale=kv, time_scale=time, record_steps=False)
    try:
        return backend.run(dict(recommended), ctx.seeds), backend.run(dict(default), ctx.seeds), None
    except (TrialError, KvtuneError) as exc:
        return None, None, str(exc)


def _workers(jobs: int) -> int:
    """Forked workers for ``jobs`` simulations: one per CPU, none (run here) on one CPU, without ``fork``, or in a
    process that joined a Ray."""
    import multiprocessing
    import os
    import sys

    ray = sys.modules.get("ray")
    if (ray is not None and getattr(ray, "is_initialized", lambda: False)()) \
            or "fork" not in multiprocessing.get_all_start_methods():
        return 0
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cpus = os.cpu_count() or 1
    return min(jobs, cpus) if cpus > 1 else 0


def _simulate_all(ctx: Any, recommended: Mapping[str, Any], default: Mapping[str, Any],
                  perturbations) -> list[tuple[Any, Any, str | None]]:
    global _JOB
    _JOB = (ctx, dict(recommended), dict(default), tuple(perturbations))
    try:
        workers = _workers(len(_JOB[3]))
        if workers:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor
            from concurrent.futures.process import BrokenProcessPool

            try:
                with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
                    return list(pool.map(_simulate_pair, range(len(_JOB[3]))))
            except BrokenProcessPool:  # a worker died: the same simulations here, one after another
                pass
        return [_simulate_pair(i) for i in range(len(_JOB[3]))]
    finally:
        _JOB = None


def robustness(ctx: Any, recommended: Mapping[str, Any], default: Mapping[str, Any], shortfalls,
               perturbations=PERTURBATIONS, *, nominal: tuple[Any, Any] | None = None,
               engine_spread: float | None = None) -> dict[str, Any]:
    """Per perturbation: whether the recommendation meets every SLO and beats the default (higher throughput
    under the same perturbation), with both throughputs; and overall verdicts.  ``shortfalls(metrics)`` lists the
    SLOs a metrics mapping misses.  ``nominal``: the unperturbed (recommended, default) metrics, whose throughput
    gain is compared with ``engine_spread`` (:func:`engine_noise`)."""
    names = list(ctx.spec.objectives)
    rows = []
    for (label, kv, time), (rec, base, error) in zip(perturbations,
                                                     _simulate_all(ctx, recommended, default, perturbations)):
        row: dict[str, Any] = {"perturbation": label, "kv_scale": kv, "time_scale": time}
        if error is not None:
            row["error"] = error
            rows.append(row)
            continue
        key, rec_tp = _throughput(rec, names)
        _, base_tp = _throughput(base, names)
        misses = shortfalls(rec)
        row.update({
            "meets_all_slos": not misses,
            "missed": [str(s) for s in misses],
            "default_meets_all_slos": not shortfalls(base),
            f"recommended_{key}": rec_tp,
            f"default_{key}": base_tp,
            "beats_default": bool(rec_tp > base_tp) if rec_tp == rec_tp and base_tp == base_tp else None,
            "gain": rec_tp / base_tp - 1.0 if base_tp > 0 and rec_tp == rec_tp else None,
        })
        rows.append(row)
    ok = [r for r in rows if "error" not in r]
    gains = [r["gain"] for r in ok if r["gain"] is not None]
    beats_all = bool(ok) and len(ok) == len(rows) and all(r["beats_default"] for r in ok)
    return {
        "perturbations": rows,
        "meets_slos_under_all": bool(ok) and len(ok) == len(rows) and all(r["meets_all_slos"] for r in ok),
        "beats_default_under_all": beats_all,
        # The throughput gain over the default across the perturbations; when it changes sign inside the error
        # bands, the predicted gain is within the simulator's noise: a measurement should not expect to see it.
        "gain_range": [min(gains), max(gains)] if gains else None,
        "gain_within_noise": bool(gains) and not beats_all and max(gains) > 0,
        "note": "KV blocks x0.95/x1.05 and step times x0.9/x1.1 (kvtune's validated error bands), recommended and "
                "default re-simulated under the same perturbation",
        **engine_noise(nominal, names, engine_spread),
    }


def engine_noise(nominal: tuple[Any, Any] | None, names: Sequence[str], engine_spread: float | None) -> dict[str, Any]:
    """The predicted throughput gain of the recommendation over the default (unperturbed) against the engine's
    run-to-run spread: a gain no larger than the spread is one that a measurement of the two configs cannot
    resolve (their intervals overlap), whatever the simulator's accuracy.  {} without both."""
    if nominal is None or engine_spread is None or nominal[0] is None or nominal[1] is None:
        return {}
    _, rec = _throughput(nominal[0], names)
    _, base = _throughput(nominal[1], names)
    gain = rec / base - 1.0 if base > 0 and rec == rec else None
    return {"predicted_gain": gain, "engine_spread": float(engine_spread),
            "gain_within_engine_spread": gain is not None and abs(gain) <= engine_spread}


def describe(result: Mapping[str, Any]) -> list[str]:
    """One line per perturbation, for recommended.yaml and the export summary."""
    lines = []
    for r in result["perturbations"]:
        if "error" in r:
            lines.append(f"robustness {r['perturbation']}: could not simulate ({r['error']})")
            continue
        slo = "meets every SLO" if r["meets_all_slos"] else "MISSES " + "; ".join(r["missed"])
        beat = "beats the default" if r["beats_default"] else "does NOT beat the default"
        gain = f" ({r['gain']:+.1%})" if r.get("gain") is not None else ""
        lines.append(f"robustness {r['perturbation']}: {slo}, {beat}{gain}")
    if result.get("gain_within_noise"):
        lo, hi = result["gain_range"]
        lines.append(f"robustness: the throughput gain over the default is {lo:+.1%} to {hi:+.1%} across these "
                     "perturbations: within the simulator's error bands, so a measurement should not expect a "
                     "difference (choose on the other objectives, or keep the default)")
    if result.get("gain_within_engine_spread"):
        lines.append(f"within noise: the predicted throughput gain over the default, {result['predicted_gain']:+.1%}, "
                     f"is within the engine's run-to-run spread (+/-{result['engine_spread']:.1%}, the study's "
                     "engine_spread): a measurement should not expect to see it (judge the pick by its other "
                     "objectives, or keep the default)")
    return lines

"""Per router, the cheapest fleet that met every SLO in a stored fleet study (``kvtune tune ... --out DIR``).

Reads the study's trials from ``DIR/study.db`` (Optuna's public API) and prints, per router searched, every replica
count tried with its price, p99 TTFT and E2E of each SLO class, the fleet's prefix-cache hit rate and whether it met
every SLO, then the cheapest feasible fleet per router.  Used for studies/fleet-prefix-routing.yaml (findings in
studies/README.md):

    kvtune tune studies/fleet-prefix-routing.yaml --out runs/fleet-prefix
    python benchmarks/fleet_router_capacity.py runs/fleet-prefix
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

import optuna


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("study_out", type=Path)
    opts = parser.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = f"sqlite:///{(opts.study_out / 'study.db').resolve()}"
    (name,) = optuna.get_all_study_names(storage)
    study = optuna.load_study(study_name=name, storage=storage)
    rows = defaultdict(dict)
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        if "router" not in t.params:
            continue  # the default config (one engine, no router)
        a = t.user_attrs
        key = (t.params.get("gpu", ""), t.params.get("kv_cache_dtype", ""))
        rows[(t.params["router"], *key)][int(t.params.get("replicas", 1))] = (
            a.get("deployment.price_per_hour_usd"), a.get("all.ttft_s.p99"), a.get("all.e2e_s.p99"),
            a.get("fleet.prefix_hit_rate"), a.get("fleet.max_load_ratio"), bool(a.get("feasible")))
    print(f"study {name}: {len(study.trials)} trials")
    print(f"{'router':<20} {'gpu / kv':<16} {'replicas':>8} {'$/h':>7} {'p99 TTFT s':>10} {'p99 E2E s':>9} "
          f"{'hit rate':>8} {'max load':>8} {'meets SLOs':>10}")
    cheapest = {}
    for (router, gpu, dtype), by_n in sorted(rows.items()):
        for n, (price, ttft, e2e, hit, load, ok) in sorted(by_n.items()):
            print(f"{router:<20} {gpu + ' ' + dtype:<16} {n:>8} {price:7.2f} {ttft:10.2f} {e2e:9.2f} {hit:8.3f} "
                  f"{load:8.2f} {'yes' if ok else 'no':>10}")
            if ok and (router not in cheapest or price < cheapest[router][0]):
                cheapest[router] = (price, n, gpu, dtype)
    print("cheapest fleet meeting every SLO, per router:")
    for router, (price, n, gpu, dtype) in sorted(cheapest.items(), key=lambda kv: kv[1][0]):
        print(f"  {router:<20} {n} x {gpu or 'spec gpu'} {dtype}  ${price:.2f}/h")


if __name__ == "__main__":
    main()

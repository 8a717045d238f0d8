"""Export a study: the Pareto front as a table, and one recommended config an operator can deploy.

Files written to the output folder:

- ``pareto.csv``: every Pareto-optimal feasible trial (SLO constraints all <= 0), with its objective values,
  engine knobs, constraint violations and per-class metrics.
- ``recommended.yaml``: the engine's own config for the target vLLM (``optimizer/_vllm_config.py``), as
  ``vllm serve --config`` keys (only flags that vLLM release has, per ``optimizer/data/vllm_flags.yaml``).
  kvtune's own policies (reserved KV fraction, predicted admission) have no vLLM flag: they are listed in a
  commented ``kvtune_policies:`` section with their rationale, so the file still loads in ``vllm serve``.
- ``recommended.json``: the pick and why, the flags, the policies, and predicted per-class metrics of the
  recommended config next to the engine's default config (both simulated afresh on the study's workload, also
  for a study whose trials were replays: re-measuring both would launch engines again; ``default_metrics_backend``
  says ``sim``, ``backend`` the study's backend, and ``trial_values`` hold what the trial measured).

The pick among Pareto points: the highest throughput (``output_tokens_per_s``, else ``goodput_rps``) by default,
or with ``favor=CLASS`` the lowest tail latency of that class relative to its SLO.  Every study runs the target
vLLM's default config as a trial (``kvtune_default``), so it is a candidate like any other: when it wins, the
answer is "keep the default".

When no trial meets every SLO, the export says so and never recommends a config worse than the default on a class
the SLOs protect (p99 above both the target and the default's p99): it recommends the trial closest to feasible
among those that miss less than the default (total relative violation) and are no worse on any protected class,
marked infeasible; if there is none, it keeps the default.  ``recommended.json``'s ``comparison`` then holds, per
class and SLO, the default and the least-violating trial side by side, with what each misses and by how much.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import optuna
import pandas as pd
from optuna.trial import FrozenTrial, TrialState

from objectives import PRICE_KEY
from objectives.registry import BoundConstraint, get_objective
from optimizer._backend import SimBackend, TrialError
from optimizer._capacity import BUNDLED_LEVERS, deployment_of, priced, router_deployment, smallest_change
from optimizer._knobs import KVTUNE_POLICIES
from optimizer._robustness import describe as describe_robustness
from optimizer._robustness import robustness
from optimizer._spec import COST_OBJECTIVES, StudySpec
from optimizer._storage import (StudyContext, is_default, is_feasible, open_study, prepare, trial_metric,
                               trial_metrics)
from optimizer._vllm_config import hf_model_id, render_recommended_yaml, resolved_config, target_validity, vllm_config
from optimizer.quality import format_quality_notes, quality_notes
from sim.errors import ConfigError, KvtuneError
from sim.outputs import atomic_write_text, probe_out_dir

THROUGHPUT_KEYS = ("output_tokens_per_s", "goodput_rps")
_HEADLINE = ("output_tokens_per_s", "goodput_rps", "recompute_busy_share", "recompute_token_share",
             "new_token_busy_share", "kv_utilization", "preemptions_per_request.mean", "makespan_s")
_CLASS_METRICS = ("ttft_s", "tpot_s", "e2e_s")


# ---- Pareto front and the pick ---------------------------------------------------------------------------------
def _dominates(a: Sequence[float], b: Sequence[float], directions: Sequence[str]) -> bool:
    better = False
    for x, y, d in zip(a, b, directions):
        if d == "minimize":
            x, y = -x, -y
        if x < y:
            return False
        if x > y:
            better = True
    return better


def pareto_front(trials: Sequence[FrozenTrial], directions: Sequence[str]) -> list[FrozenTrial]:
    """Non-dominated trials among ``trials`` (complete ones), in trial order; a config that ran (or was drawn)
    more than once is listed once, as its first trial."""
    done, seen = [], set()
    for t in trials:
        if t.state == TrialState.COMPLETE and t.values is not None:
            key = json.dumps(t.params, sort_keys=True, default=str)
            if key not in seen:
                seen.add(key)
                done.append(t)
    return [t for t in done if not any(_dominates(o.values, t.values, directions) for o in done if o is not t)]


def _total_violation(t: FrozenTrial) -> float:
    return sum(max(0.0, v) for v in t.user_attrs.get("constraints", ()))


@dataclass(frozen=True)
class Shortfall:
    """One SLO a trial misses."""

    class_name: str
    metric: str
    p99_s: float
    target_s: float

    @property
    def excess(self) -> float:
        return (self.p99_s - self.target_s) / self.target_s

    def __str__(self) -> str:
        if not self.class_name:  # a bound on an objective (objectives.BoundConstraint)
            return f"{self.metric}: {self.p99_s:.3g} misses the bound"
        return (f"class {self.class_name}: p99 {self.metric} {self.p99_s:.3g} s > target {self.target_s:g} s "
                f"(+{100 * self.excess:.1f}%)")


def shortfalls(metrics: Mapping[str, Any], ctx: StudyContext) -> list[Shortfall]:
    out = []
    for c in ctx.constraints:
        if isinstance(c, BoundConstraint):
            if c.violation(metrics) > 0:
                out.append(Shortfall("", c.name, c.objective.value(metrics), c.bound))
            continue
        cls_name, metric, target = c.class_name, c.metric, c.target_s  # SloConstraint fields
        p99 = float(metrics.get(f"class.{cls_name}.{metric}.p99", math.nan))
        if c.violation(metrics) > 0:
            out.append(Shortfall(cls_name, metric, p99, target))
    return out


def _throughput_of(t: FrozenTrial, objective_names: Sequence[str]) -> float:
    for key in THROUGHPUT_KEYS:
        if key in objective_names:
            return t.values[list(objective_names).index(key)]
    for key in THROUGHPUT_KEYS:
        value = trial_metric(t, key)
        if value is not None:
            return float(value)
    return math.nan


def _class_score(t: FrozenTrial, ctx: StudyContext, class_name: str) -> float:
    """Tail latency of a class relative to its SLO (max over its targets of p99 / target); e2e p99 without one."""
    cls = ctx.classes[class_name]
    targets = cls.slo.targets()
    if not targets:
        return float(trial_metric(t, f"class.{class_name}.e2e_s.p99", math.inf))
    return max(float(trial_metric(t, f"class.{class_name}.{m}.p99", math.inf)) / target
               for m, target in targets.items())


@dataclass
class Pick:
    """The recommendation: ``trial`` (None only when the default is kept and the study holds no default trial, as a
    study stored by an earlier kvtune), why (``rule``), whether it meets every SLO, the feasible Pareto front, the
    SLOs it misses, the study's default-config trial, and when nothing is feasible the least-violating trial."""

    trial: FrozenTrial | None
    rule: str
    feasible: bool
    front: list[FrozenTrial]
    shortfalls: list[Shortfall] = field(default_factory=list)
    default: FrozenTrial | None = None
    #: The recommendation is the engine's default config: no trial improves on it.
    keep_default: bool = False
    #: When no trial is feasible: the trial closest to feasible (least total relative violation), default included.
    closest: FrozenTrial | None = None


def default_trial(trials: Sequence[FrozenTrial]) -> FrozenTrial | None:
    """The study's completed default-config trial (the first, if a resumed study ran it twice), else None."""
    return next((t for t in trials if is_default(t) and t.state == TrialState.COMPLETE and t.values is not None),
                None)


def total_violation(metrics: Mapping[str, Any], ctx: StudyContext) -> float:
    """Sum of the positive constraint violations of ``metrics`` (0: feasible)."""
    return sum(max(0.0, float(c.violation(metrics))) for c in ctx.constraints)


def worse_than_default(metrics: Mapping[str, Any], default: Mapping[str, Any], ctx: StudyContext) -> list[str]:
    """The SLO-protected class tails on which ``metrics`` is worse than the default config's: p99 above both the
    target and the default's p99 (a config that meets a class's SLO is never worse on it; one that misses it is
    worse only where it misses by more than the default does).  Empty: no protected class loses."""
    out = []
    for c in ctx.constraints:
        if isinstance(c, BoundConstraint):
            continue
        key = f"class.{c.class_name}.{c.metric}.p99"
        mine, theirs = float(metrics.get(key, math.nan)), float(default.get(key, math.nan))
        if math.isnan(mine) and math.isnan(theirs):
            continue
        if math.isnan(mine) or mine > max(c.target_s, theirs if not math.isnan(theirs) else -math.inf):
            out.append(f"class {c.class_name}: p99 {c.metric} {mine:.4g} s against the default's {theirs:.4g} s "
                       f"(target {c.target_s:g} s)")
    return out


def choose(trials: Sequence[FrozenTrial], ctx: StudyContext, favor: str | None = None,
           default_metrics: Mapping[str, Any] | None = None) -> Pick:
    """The recommended trial (see the module docstring).  ``default_metrics``: the default config's metrics, for
    a study without a default-config trial (else that trial's are used)."""
    complete = [t for t in trials if t.state == TrialState.COMPLETE and t.values is not None]
    if not complete:
        raise KvtuneError(f"study {ctx.spec.name!r} has no completed trial yet; nothing to export")
    if favor is not None and favor not in ctx.classes:
        raise ConfigError("favor", f"no class {favor!r} in the workload; classes: {sorted(ctx.classes)}")
    names = list(ctx.spec.objectives)
    default = default_trial(complete)
    if default is not None:
        default_metrics = trial_metrics(default)
    feasible = [t for t in complete if is_feasible(t)]
    front = pareto_front(feasible, ctx.directions)
    if not front:
        closest = min(complete, key=lambda t: (_total_violation(t), -_nan_low(_throughput_of(t, names)),
                                               not is_default(t)))
        falls = shortfalls(trial_metrics(closest), ctx)
        if default_metrics is None:  # nothing to compare with (a stored study without its default)
            return Pick(closest, "no trial meets every SLO: the trial closest to feasible (least total relative "
                        "violation); the study holds no default-config trial to compare it with", False, [],
                        falls, None, False, closest)
        base = total_violation(default_metrics, ctx)
        better = [t for t in complete if not is_default(t) and _total_violation(t) < base
                  and not worse_than_default(trial_metrics(t), default_metrics, ctx)]
        if better:
            best = min(better, key=lambda t: (_total_violation(t), -_nan_low(_throughput_of(t, names)), t.number))
            return Pick(best, "no trial meets every SLO: the trial closest to feasible among those that miss less "
                        "than the default config and are no worse than it on any SLO-protected class", False, [],
                        shortfalls(trial_metrics(best), ctx), default, False, closest)
        return Pick(default, "no trial meets every SLO, and none misses less than the default config without being "
                    "worse on an SLO-protected class: keep the default", False, [],
                    shortfalls(default_metrics, ctx), default, True, closest)
    if favor is None and names[0] in COST_OBJECTIVES:  # the cheapest config that meets every SLO
        best = min(front, key=lambda t: (t.values[0], -_nan_low(_throughput_of(t, names)), not is_default(t),
                                         t.number))
        rule = f"cheapest ({names[0]}) among Pareto-optimal trials meeting every SLO (ties: highest throughput)"
    elif favor is None:
        best = max(front, key=lambda t: (_nan_low(_throughput_of(t, names)), is_default(t), -t.number))
        rule = "highest throughput among Pareto-optimal trials meeting every SLO"
    else:
        best = min(front, key=lambda t: (_class_score(t, ctx, favor), -_nan_low(_throughput_of(t, names)),
                                         not is_default(t), t.number))
        rule = (f"favor class {favor}: lowest p99/SLO of {favor} among Pareto-optimal trials meeting every SLO "
                "(ties: highest throughput)")
    if is_default(best):
        rule += "; it is the default config: keep the default"
    return Pick(best, rule, True, front, [], default, is_default(best))


def _nan_low(value: float) -> float:
    return -math.inf if value is None or math.isnan(value) else value


# ---- tables ----------------------------------------------------------------------------------------------------
def trial_row(t: FrozenTrial, ctx: StudyContext) -> dict[str, Any]:
    row: dict[str, Any] = {"trial": t.number, "default": is_default(t), "feasible": is_feasible(t)}
    for name, value in zip(ctx.spec.objectives, t.values or ()):
        row[name] = value
    for key, value in t.user_attrs.get("knobs", {}).items():
        row[f"knob.{key}"] = value
    for name, value in zip(t.user_attrs.get("constraint_names", ()), t.user_attrs.get("constraints", ())):
        row[f"violation.{name}"] = value
    metrics = trial_metrics(t)
    for key in _HEADLINE:
        if key in metrics and key not in row:
            row[key] = metrics[key]
    for key in sorted(k for k in metrics if k.startswith("class.")):
        row[key] = metrics[key]
    return row


def pareto_table(front: Sequence[FrozenTrial], ctx: StudyContext, default: FrozenTrial | None = None
                 ) -> pd.DataFrame:
    """One row per Pareto-optimal trial (``pareto`` True), and the default-config trial's row when it is not one
    of them (``pareto`` False), so the table always shows what the default gives."""
    rows = [{**trial_row(t, ctx), "pareto": True} for t in front]
    if default is not None and all(t.number != default.number for t in front):
        rows.append({**trial_row(default, ctx), "pareto": False})
    if not rows:
        cols = ["trial", "default", "feasible", "pareto", *ctx.spec.objectives]
        return pd.DataFrame(columns=cols)
    return pd.DataFrame(rows)


# ---- notes on the recommendation -------------------------------------------------------------------------------
def unused_host_tier(knobs: Mapping[str, Any], metrics: Mapping[str, Any] | None) -> str | None:
    """A CPU KV tier (V1 offload, V0 swap space) that the simulation never loaded a block from costs host memory
    for no gain: say so, since a recommendation of many GiB of offload with no reuse is no improvement."""
    if not metrics:
        return None
    offload = float(knobs.get("kv_offloading_size_gb") or 0.0)
    swap = float(knobs.get("swap_space_gb") or 0.0) if knobs.get("preemption_mode") == "swap" else 0.0
    size, flag = (offload, "--kv-offloading-size") if offload else (swap, "--swap-space")
    if size <= 0 or float(metrics.get("swap_in_blocks", 0.0) or 0.0) > 0:
        return None
    return (f"the CPU KV tier ({flag} {size:g} GiB of pinned host memory) was never read in the simulation (no block "
            f"loaded back): it costs host memory with no gain on this workload; drop {flag} unless traffic differs")


# ---- predicted metrics -----------------------------------------------------------------------------------------
def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def class_metrics(metrics: Mapping[str, Any], ctx: StudyContext) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, cls in ctx.classes.items():
        prefix = f"class.{name}"
        entry: dict[str, Any] = {}
        for metric in _CLASS_METRICS:
            entry[metric] = {q: _finite(metrics.get(f"{prefix}.{metric}.{q}", math.nan)) for q in ("p50", "p90", "p99")}
        for key in ("output_tokens_per_s", "goodput_rps", "slo_attainment", "preemptions_per_request.mean"):
            entry[key] = _finite(metrics.get(f"{prefix}.{key}", math.nan))
        entry["count"] = {k.split(".")[-1]: _finite(v) for k, v in metrics.items() if k.startswith(f"{prefix}.count.")}
        targets = cls.slo.targets()
        if targets:
            entry["slo_p99_s"] = targets
            entry["meets_slo"] = all(
                (p := metrics.get(f"{prefix}.{m}.p99", math.nan)) == p and p <= t for m, t in targets.items())
        out[name] = entry
    return out


def predicted(metrics: Mapping[str, Any] | None, ctx: StudyContext, error: str | None = None) -> dict[str, Any]:
    if metrics is None:
        return {"error": error}
    out = {key: _finite(metrics.get(key, math.nan)) for key in _HEADLINE}
    if PRICE_KEY in metrics:
        out["cost"] = {name: _finite(float(get_objective(name).value(metrics)))
                       for name in ("cost_per_hour_usd", "usd_per_million_output_tokens")}
    out["objectives"] = {o.name: _finite(float(o.value(metrics))) for o in ctx.objectives}
    out["classes"] = class_metrics(metrics, ctx)
    out["meets_all_slos"] = not shortfalls(metrics, ctx)
    return out


def side_by_side(pick: Pick, default_metrics: Mapping[str, Any] | None, ctx: StudyContext) -> dict[str, Any]:
    """Per SLO-protected class and SLO metric, the default config and the trial closest to feasible side by side:
    ``{class: {metric: {"target_s", "default": {"p99_s", "meets", "excess"}, "closest": {..., "trial"}}}}``."""
    columns: list[tuple[str, Mapping[str, Any], int | None]] = []
    if default_metrics is not None:
        columns.append(("default", default_metrics, None if pick.default is None else pick.default.number))
    if pick.closest is not None and not is_default(pick.closest):
        columns.append(("closest", trial_metrics(pick.closest), pick.closest.number))
    out: dict[str, Any] = {}
    for c in ctx.constraints:
        if isinstance(c, BoundConstraint):
            continue
        entry = out.setdefault(c.class_name, {}).setdefault(c.metric, {"target_s": c.target_s})
        for label, metrics, number in columns:
            p99 = float(metrics.get(f"class.{c.class_name}.{c.metric}.p99", math.nan))
            entry[label] = {"trial": number, "p99_s": _finite(p99), "meets": p99 <= c.target_s,
                            "excess": _finite((p99 - c.target_s) / c.target_s)}
    return out


def describe_comparison(comparison: Mapping[str, Any]) -> list[str]:
    """One line per SLO: the default's p99 and the closest trial's, each against the target."""
    lines = []
    for cls, metrics in comparison.items():
        for metric, entry in metrics.items():
            parts = []
            for label in ("default", "closest"):
                if label not in entry:
                    continue
                e = entry[label]
                name = label if label == "default" else f"closest trial {e['trial']}"
                p99 = e["p99_s"]
                verdict = ("meets" if e["meets"] else
                           f"misses by {100 * e['excess']:.1f}%" if isinstance(e["excess"], float) else "misses")
                parts.append(f"{name} {_show(p99)} s ({verdict})")
            lines.append(f"class {cls} p99 {metric} (target {entry['target_s']:g} s): " + "; ".join(parts))
    return lines


# ---- export ----------------------------------------------------------------------------------------------------
@dataclass
class ExportResult:
    out: Path
    #: The recommended trial; None when the default is kept and the study holds no default-config trial.
    trial: int | None
    feasible: bool
    rule: str
    front_size: int
    flags: dict[str, Any]
    policies: dict[str, Any]
    shortfalls: list[Shortfall]
    recommended: dict[str, Any]
    default: dict[str, Any]
    files: list[Path]
    robustness: dict[str, Any] = field(default_factory=dict)
    keep_default: bool = False
    #: When nothing is feasible: per class and SLO, the default and the least-violating trial (:func:`side_by_side`).
    comparison: dict[str, Any] = field(default_factory=dict)
    #: When nothing is feasible: the smallest capacity change that meets every SLO (:func:`capacity_change`).
    capacity_change: dict[str, Any] | None = None

    def summary(self) -> str:
        which = "the engine's default config" if self.trial is None else f"trial {self.trial}"
        lines = []
        if not self.feasible:
            lines.append("kvtune: no trial meets every SLO"
                         + ("; keep the default" if self.keep_default else
                            f"; {which} misses less than the default and is no worse on any SLO-protected class"))
        lines.append(f"recommended {which} ({self.rule})")
        rec, base = self.recommended.get("objectives", {}), self.default.get("objectives", {})
        for name, value in rec.items():
            lines.append(f"  {name}: {_show(value)} (engine default config: {_show(base.get(name))})")
        if not self.feasible:
            lines.append("  SLOs missed by the recommendation:")
            lines.extend(f"    {s}" for s in self.shortfalls)
            lines.extend(f"  {line}" for line in describe_comparison(self.comparison))
            if self.capacity_change is not None:
                lines.append(f"  {describe_change(self.capacity_change)}")
        if self.robustness:
            lines.extend(f"  {line}" for line in describe_robustness(self.robustness))
        lines.append(f"wrote {', '.join(p.name for p in self.files)} to {self.out} "
                     f"({self.front_size} Pareto-optimal feasible trials)")
        return "\n".join(lines)


def _show(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def capacity_change(spec: StudySpec, ctx: StudyContext, backend: SimBackend) -> dict[str, Any]:
    """The smallest change of deployment (optimizer/_capacity.py BUNDLED_LEVERS, cheapest first) on which the
    engine's default config meets every SLO, simulated on the study's workload; or what was tried."""
    def run(knobs: Mapping[str, Any]) -> dict[str, Any] | None:
        try:
            return priced(backend.run(dict(knobs), ctx.seeds), knobs, spec.gpu)
        except (TrialError, KvtuneError):
            return None

    base = spec.fixed_knobs()
    levers = dict(BUNDLED_LEVERS)
    if not spec.lower_precision:  # the spec excludes FP8 KV
        levers["kv_cache_dtype"] = ("auto",)
    found = smallest_change(base, spec.model, spec.gpu, run, lambda m: shortfalls(m, ctx), levers)
    found["from"] = deployment_of(base, spec.gpu).to_dict()
    if found["found"]:
        metrics = found.pop("metrics")
        found["predicted"] = predicted(metrics, ctx)
        found["quality"] = quality_notes(found["knobs"])
    return found


def describe_change(change: Mapping[str, Any]) -> str:
    """One line: the smallest capacity change that meets every SLO, or that none in the tried range does."""
    if change["found"]:
        dep, base = change["deployment"], change["from"]
        more = dep["price_per_hour_usd"] - base["price_per_hour_usd"]
        return (f"capacity: no config searched meets every SLO; the smallest change that does (the default config, "
                f"simulated): {dep['description']} ({'+' if more >= 0 else '-'}${abs(more):.2f}/h against "
                f"{base['description']})" + (" - lowers precision: its published accuracy deltas are "
                                             "capacity_change.quality in recommended.json"
                                             if change.get("quality") else ""))
    return (f"capacity: none of the {len(change['tried'])} cheapest deployments of kvtune's bundled range "
            f"(devices {', '.join(change['levers']['gpu'])}, TP {change['levers']['tensor_parallel_size']}, KV "
            f"{change['levers']['kv_cache_dtype']}) meets every SLO with the default config")


def export_study(spec: StudySpec, *, storage: str | None = None, out: str | Path, favor: str | None = None,
                 study_out: str | Path | None = None, context: StudyContext | None = None,
                 capacity_search: bool = True) -> ExportResult:
    """Write pareto.csv, recommended.yaml and recommended.json for the spec's stored study to ``out``.
    ``capacity_search``: when no trial is feasible, look for the smallest capacity change (:func:`capacity_change`,
    up to ``optimizer._capacity.MAX_CAPACITY_TRIES`` simulations)."""
    out = probe_out_dir(out)  # before the work: a folder that cannot be written fails at once
    ctx = context or prepare(spec)
    url = spec.storage_url(storage, spec.out_dir(study_out))
    if url.startswith("sqlite:///") and not Path(url[len("sqlite:///"):]).exists():
        raise ConfigError("storage", f"{url} does not exist; run 'kvtune tune' first or give --storage")
    study = open_study(ctx, url, create=False)
    trials = study.get_trials(deepcopy=False)
    backend = SimBackend.for_spec(spec, ctx.workloads)
    results: dict[str, dict[str, Any]] = {}
    fresh: dict[str, Any] = {}

    def simulate(label: str, run_knobs: Mapping[str, Any]) -> None:
        try:
            fresh[label] = priced(backend.run(dict(run_knobs), ctx.seeds), run_knobs, spec.gpu)
            results[label] = predicted(fresh[label], ctx)
        except (TrialError, KvtuneError) as exc:
            fresh[label] = None
            results[label] = predicted(None, ctx, str(exc))

    if default_trial(trials) is None:  # a study stored by an earlier kvtune: compare with a fresh simulation
        simulate("default", spec.fixed_knobs())
    pick = choose(trials, ctx, favor, default_metrics=fresh.get("default"))
    files = []

    table = pareto_table(pick.front, ctx, pick.default)
    atomic_write_text(out / "pareto.csv", table.to_csv(index=False))
    files.append(out / "pareto.csv")

    knobs = dict(pick.trial.user_attrs["knobs"]) if pick.trial is not None else spec.fixed_knobs()
    flags, policies, notes = vllm_config(knobs, spec)
    if "default" not in results:
        simulate("default", spec.fixed_knobs())
    if pick.keep_default:  # the same config: one simulation
        fresh["recommended"], results["recommended"] = fresh["default"], results["default"]
    else:
        simulate("recommended", knobs)
    falls = pick.shortfalls if not pick.feasible else []
    compared = ({} if pick.feasible else
                side_by_side(pick, trial_metrics(pick.default) if pick.default else fresh.get("default"), ctx))
    unused = unused_host_tier(knobs, fresh.get("recommended"))
    if unused:
        notes.append(unused)
    robust = robustness(ctx, knobs, spec.fixed_knobs(), lambda m: shortfalls(m, ctx),
                        nominal=None if pick.keep_default else (fresh.get("recommended"), fresh.get("default")),
                        engine_spread=spec.engine_spread)
    change = (capacity_change(spec, ctx, backend) if not pick.feasible and capacity_search
              and not spec.backend.is_replay else None)

    model_id = hf_model_id(spec.model)
    target = spec.vllm_version
    deployment = deployment_of(knobs, spec.gpu)
    quality = quality_notes(knobs)
    engine = "V1" if spec.flavor == "vllm-v1" else "V0"
    which = "the engine's default config" if pick.trial is None else f"trial {pick.trial.number}"
    header = [
        f"kvtune recommendation: study {spec.name}, {which}; vLLM {target} ({engine} engine)",
        f"model {spec.model} on {deployment.describe()}, tensor parallel {deployment.tensor_parallel_size}; "
        f"start with: vllm serve {model_id} --config recommended.yaml",
        f"pick: {pick.rule}",
    ]
    for o in ctx.objectives:
        rec = results["recommended"].get("objectives", {}).get(o.name)
        base = results["default"].get("objectives", {}).get(o.name)
        header.append(f"predicted {o.name}: {_show(rec)} (engine default config: {_show(base)})")
    if pick.keep_default:
        header.append("keep the default: no trial searched improves on vLLM's default config"
                      + ("" if pick.feasible else " (and the default misses SLOs too)"))
    if falls:
        header.append("WARNING: no trial meets every SLO: " + "; ".join(str(s) for s in falls))
        header.extend(describe_comparison(compared))
    if change is not None:
        header.append(describe_change(change))
    header.extend(describe_robustness(robust))
    fleet = router_deployment(deployment)
    if fleet is not None:
        header.append(f"fleet: {fleet['replicas']} replicas behind {fleet['router']}; each replica runs this config")
        header.extend(f"  {key}: {fleet[key]}" for key in ("sglang_router", "production_stack", "note") if key in fleet)
    if quality:
        header.append("LOWER PRECISION: this recommendation lowers precision; published accuracy deltas:")
        header.extend(format_quality_notes(quality).splitlines())
    if change is not None and change.get("quality"):
        header.append("LOWER PRECISION: the capacity change above lowers precision (not this config); published "
                      "accuracy deltas:")
        header.extend(format_quality_notes(change["quality"]).splitlines())
    atomic_write_text(out / "recommended.yaml", render_recommended_yaml(flags, policies, notes, header))
    files.append(out / "recommended.yaml")

    doc = {
        "study": spec.name,
        "storage": url,
        "trial": None if pick.trial is None else pick.trial.number,
        "pick": {"rule": pick.rule, "favor": favor, "pareto_size": len(pick.front)},
        "feasible": pick.feasible,
        "keep_default": pick.keep_default,
        "default_trial": None if pick.default is None else pick.default.number,
        "comparison": compared,
        "capacity_change": change,
        "shortfalls": [{"class": s.class_name, "metric": s.metric, "p99_s": _finite(s.p99_s),
                        "target_s": s.target_s, "excess": _finite(s.excess)} for s in falls],
        "vllm_version": str(target),
        "vllm_flag_sources": target.sources(),
        "version_validity": target_validity(resolved_config(knobs, spec), target),
        "flavor": spec.flavor,
        "model": spec.model,
        "hf_model": model_id,
        "gpu": deployment.gpu,
        "tensor_parallel_size": deployment.tensor_parallel_size,
        "deployment": deployment.to_dict(),
        "fleet": router_deployment(deployment),
        "default_deployment": deployment_of(spec.fixed_knobs(), spec.gpu).to_dict(),
        "quality": quality,
        "knobs": knobs,
        "vllm_config": flags,
        "kvtune_policies": {name: {"value": value, "rationale": KVTUNE_POLICIES[name]} for name, value in policies.items()},
        "notes": notes,
        "environment": {"VLLM_USE_V1": "0"} if spec.flavor == "vllm-v0" and "v1" in target.engines else {},
        "default_config": spec.fixed_knobs(),
        "replicate_seeds": ctx.seeds,
        "predicted": results,
        "robustness": robust,
        "trial_values": dict(zip(spec.objectives, pick.trial.values)) if pick.trial is not None else None,
        "backend": spec.backend.to_dict(),
        "default_metrics_backend": "sim",
    }
    if spec.backend.is_replay:
        doc["default_metrics_note"] = (
            f"trials were measured by replay ({spec.backend.engine or 'external server'}); 'predicted' holds fresh "
            f"simulations of the recommended and the default config (replaying them would launch engines again), "
            f"so compare those two with each other, and 'trial_values' for what the trial measured")
    atomic_write_text(out / "recommended.json", json.dumps(doc, indent=2, default=_json_default) + "\n")
    files.append(out / "recommended.json")
    return ExportResult(out, None if pick.trial is None else pick.trial.number, pick.feasible, pick.rule,
                        len(pick.front), flags, policies, falls,
                        results["recommended"], results["default"], files, robust, pick.keep_default, compared,
                        change)


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    return str(value)


def load_trials(spec: StudySpec, storage: str | None = None, study_out: str | Path | None = None,
                context: StudyContext | None = None) -> tuple[optuna.Study, StudyContext]:
    """The stored study of ``spec`` (read only) and its context, for reports and notebooks."""
    ctx = context or prepare(spec)
    return open_study(ctx, spec.storage_url(storage, spec.out_dir(study_out)), create=False), ctx

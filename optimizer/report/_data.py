"""What a report shows, gathered: the stored trials as a table, the pick, and fresh simulations of the default and
recommended configs (their request and step tables), plus optional what-if re-simulations.

Trials are read from what ``optimizer._study`` stores on each one (user attributes: every summary metric, the
bucket cohorts grouped under ``prompt_buckets``/``output_buckets``/``preempted_buckets`` and read back flat by
``trial_metrics``, the engine ``knobs``, ``constraints``, ``fail_reason``); the pick
and the Pareto front come from ``optimizer._export.choose`` / ``pareto_front``, so the report recommends exactly
what ``kvtune export`` does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import pandas as pd
from optuna.trial import FrozenTrial, TrialState

from objectives import PRICE_KEY
from optimizer._backend import SimBackend, TrialError
from optimizer._capacity import startup_problem
from optimizer._export import Pick, choose, pareto_front, shortfalls
from optimizer._robustness import robustness
from optimizer._spec import StudySpec
from optimizer._storage import PRUNE_REASON, StudyContext, is_default, trial_metrics
from optimizer.report._lifelines import Lifeline, LifelineRecorder, lifelines
from sim.engine.config import V0_ONLY, V1_ONLY, EngineConfig
from sim.errors import ConfigError, KvtuneError
from sim.profiles import load_gpu


def trial_frame(trials: Sequence[FrozenTrial], objective_names: Sequence[str], front: Sequence[FrozenTrial]
                ) -> pd.DataFrame:
    """One row per complete trial: ``number``, ``default`` (the engine's default config), ``feasible``, ``pareto``, ``violation`` (largest SLO violation;
    <= 0 is feasible), ``slo_met`` / ``slo_targets`` (how many of the study's constraints the trial meets, of how
    many) and ``slo_missed`` (the names of those it misses), the objective values under their names,
    ``param.<name>`` (searched), ``knob.<name>`` (what the engine ran with), then every summary metric under its
    flat key."""
    on_front = {t.number for t in front}
    rows = []
    for t in trials:
        if t.state != TrialState.COMPLETE or t.values is None:
            continue
        violations = [float(v) for v in t.user_attrs.get("constraints", ())]
        names = list(t.user_attrs.get("constraint_names", ())) or [f"constraint {i}" for i in range(len(violations))]
        row: dict[str, Any] = {
            "number": t.number,
            "default": bool(t.user_attrs.get("kvtune_default", False)),
            "feasible": bool(t.user_attrs.get("feasible", all(v <= 0 for v in violations))),
            "pareto": t.number in on_front,
            "violation": max(violations) if violations else -math.inf,
            "slo_met": sum(v <= 0 for v in violations),
            "slo_targets": len(violations),
            "slo_missed": "; ".join(n for n, v in zip(names, violations) if v > 0),
        }
        for name, value in zip(objective_names, t.values):
            row[f"objective.{name}"] = float(value)
        for name, value in t.params.items():
            row[f"param.{name}"] = value
        for name, value in (t.user_attrs.get("knobs") or {}).items():
            row[f"knob.{name}"] = value
        row.update((key, float(value)) for key, value in trial_metrics(t).items())
        rows.append(row)
    if not rows:
        return pd.DataFrame(columns=["number", "default", "feasible", "pareto", "violation", "slo_met", "slo_targets",
                                     "slo_missed"])
    return pd.DataFrame(rows).sort_values("number").reset_index(drop=True)


def failed_frame(trials: Sequence[FrozenTrial]) -> pd.DataFrame:
    """The trials that did not complete: failed (kind and reason as stored), and pruned because their deployment
    cannot start (kind ``pruned``, the stored reason: the capacity levers, optimizer/_capacity.py)."""
    rows = []
    for t in trials:
        if t.state == TrialState.FAIL:
            kind, reason = t.user_attrs.get("fail_kind", "?"), t.user_attrs.get("fail_reason", "")
        elif t.state == TrialState.PRUNED and PRUNE_REASON in t.user_attrs:
            kind, reason = "pruned", t.user_attrs[PRUNE_REASON]
        else:
            continue
        params = ", ".join(f"{k}={_short(v)}" for k, v in t.params.items())
        rows.append({"number": t.number, "kind": kind, "reason": reason,
                     "params": params or ("(the engine's default config)" if is_default(t) else "")})
    return pd.DataFrame(rows, columns=["number", "kind", "reason", "params"])


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


# ---- fresh simulations -----------------------------------------------------------------------------------------
@dataclass
class ConfigRun:
    """One config simulated afresh on the study's workload (first replicate seed): its tables and summary."""

    label: str
    knobs: dict[str, Any]
    gpu: str
    metrics: dict[str, float] = field(default_factory=dict)
    requests: pd.DataFrame | None = None
    steps: pd.DataFrame | None = None
    num_gpu_blocks: int | None = None
    block_size: int | None = None
    tensor_parallel_size: int = 1
    error: str | None = None
    #: The most preempted requests on one time axis (default and recommended runs only).
    lifelines: list[Lifeline] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.error is None

    def class_recompute_share(self, name: str) -> float:
        """Of the tokens the class's requests had processed (prompt + generated + recomputed), the share that were
        recomputed after a preemption (from the request table; NaN without one)."""
        df = self.requests
        if df is None or not len(df):
            return math.nan
        rows = df[df["class"].astype(str) == name]
        recomputed = float(rows["recomputed_tokens"].sum())
        total = float(rows["prompt_tokens"].sum() + rows["generated_tokens"].sum()) + recomputed
        return recomputed / total if total > 0 else math.nan

    @property
    def price_per_hour_usd(self) -> float:
        return load_gpu(self.gpu).price_per_hour_usd * self.tensor_parallel_size

    @property
    def usd_per_million_output_tokens(self) -> float:
        """GPU cost of one million output tokens at the profile's $/GPU-hour (all GPUs of the TP group)."""
        rate = self.metrics.get("output_tokens_per_s", math.nan)
        if not rate or not math.isfinite(rate) or rate <= 0:
            return math.nan
        return self.price_per_hour_usd / 3600.0 / rate * 1e6

    @property
    def kv_tokens(self) -> float:
        if self.num_gpu_blocks is None or self.block_size is None:
            return math.nan
        return float(self.num_gpu_blocks * self.block_size)


def simulate_config(label: str, knobs: Mapping[str, Any], spec: StudySpec, ctx: StudyContext, *,
                    gpu: str | None = None, backend: SimBackend | None = None, record_lifelines: bool = False
                    ) -> ConfigRun:
    """``knobs`` simulated on the spec's workload (its first replicate seed) and ``gpu`` (default the spec's);
    ``record_lifelines`` also follows the most preempted requests (``optimizer.report._lifelines``)."""
    gpu = gpu or spec.gpu
    backend = backend or SimBackend.for_spec(spec, ctx.workloads, gpu=gpu)
    run = ConfigRun(label, dict(knobs), gpu, tensor_parallel_size=int(knobs.get("tensor_parallel_size", 1) or 1))
    recorder = LifelineRecorder() if record_lifelines else None
    try:
        metrics, result = backend.run_one(dict(knobs), ctx.seeds[0], observer=recorder)
    except (TrialError, KvtuneError) as exc:
        run.error = str(exc)
        return run
    run.metrics = metrics
    run.requests = result.requests
    run.steps = result.steps
    if recorder is not None:
        run.lifelines = lifelines(recorder, result.requests, result.steps)
    run.num_gpu_blocks = int(result.sizing.num_gpu_blocks)
    run.block_size = int(result.config.block_size)
    return run


# ---- what-ifs --------------------------------------------------------------------------------------------------
#: What-if keys that are not engine knobs (``rate_scale`` multiplies the study workload's request rate).
WHATIF_TOP = ("gpu", "flavor", "tensor_parallel_size", "rate_scale")


@dataclass(frozen=True)
class WhatIf:
    """An override applied to a config before re-simulating it: another GPU, flavor or engine knob values."""

    label: str
    changes: tuple[tuple[str, Any], ...]

    @property
    def gpu(self) -> str | None:
        return dict(self.changes).get("gpu")

    @property
    def rate_scale(self) -> float:
        return float(dict(self.changes).get("rate_scale", 1.0))

    @classmethod
    def parse(cls, text: str, where: str = "--whatif") -> "WhatIf":
        """``gpu=H200`` or ``gpu=H200,kv_cache_dtype=fp8``; an optional ``label:`` prefix names it."""
        label = None
        body = text.strip()
        if ":" in body.split("=", 1)[0]:
            label, body = (s.strip() for s in body.split(":", 1))
        changes: list[tuple[str, Any]] = []
        for part in [p for p in body.split(",") if p.strip()]:
            key, sep, value = part.partition("=")
            key, value = key.strip(), value.strip()
            if not sep or not key or not value:
                raise ConfigError(where, f"expected KEY=VALUE[,KEY=VALUE...], got {text!r}")
            changes.append((key, _coerce(key, value, where)))
        if not changes:
            raise ConfigError(where, f"expected KEY=VALUE[,KEY=VALUE...], got {text!r}")
        for key, value in changes:
            if key == "gpu":
                load_gpu(str(value), where)
            elif key == "rate_scale":
                if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                    raise ConfigError(where, f"rate_scale must be a number > 0, got {value!r}")
            elif key not in WHATIF_TOP and key not in {f for f in EngineConfig.__dataclass_fields__}:
                import difflib

                known = sorted([*WHATIF_TOP, *EngineConfig.__dataclass_fields__])
                close = difflib.get_close_matches(key, known, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(where, f"unknown key {key!r}{hint}; give gpu, flavor, rate_scale or an engine knob")
        return cls(label or ",".join(f"{k}={v}" for k, v in changes), tuple(changes))

    def apply(self, knobs: Mapping[str, Any]) -> dict[str, Any]:
        """``knobs`` with the overrides; a flavor change maps swap (V0) to CPU offload (V1) and back, and drops
        knobs the new flavor lacks."""
        out = dict(knobs)
        changes = dict(self.changes)
        flavor = changes.get("flavor")
        if flavor is not None and flavor != out.get("flavor", "vllm-v1"):
            out = translate_flavor(out, str(flavor))
        for key, value in changes.items():
            if key not in ("gpu", "rate_scale"):
                out[key] = value
        return out


def translate_flavor(knobs: Mapping[str, Any], flavor: str) -> dict[str, Any]:
    """Knobs of one flavor as the nearest config of the other: V0 swap preemption with ``swap_space_gb`` becomes
    V1's CPU offload of the same size (docs/design.md, 'Engine semantics': "the V1 counterpart of swap") and back;
    knobs the new flavor lacks are dropped."""
    out = {k: v for k, v in knobs.items()}
    if flavor == "vllm-v1":
        swap = out.get("preemption_mode") == "swap"
        size = out.get("swap_space_gb") or 4.0
        for name in V0_ONLY:
            out.pop(name, None)
        if swap:
            out["kv_offloading_size_gb"] = float(size)
    elif flavor == "vllm-v0":
        offload = float(out.get("kv_offloading_size_gb") or 0.0)
        for name in V1_ONLY:
            out.pop(name, None)
        out.pop("enable_prefix_caching", None)
        if out.get("scheduling_policy") == "priority":
            out["scheduling_policy"] = "fcfs"
        if offload > 0:
            out["preemption_mode"] = "swap"
            out["swap_space_gb"] = offload
        out["enable_chunked_prefill"] = True
    else:
        raise ConfigError("--whatif", f"flavor must be vllm-v1 or vllm-v0, got {flavor!r}")
    out["flavor"] = flavor
    return out


def _coerce(key: str, value: str, where: str) -> Any:
    if key == "gpu" or key == "flavor":
        return value
    if key == "rate_scale":
        try:
            return float(value)
        except ValueError:
            raise ConfigError(where, f"rate_scale must be a number, got {value!r}") from None
    if key == "tensor_parallel_size":
        try:
            return int(value)
        except ValueError:
            raise ConfigError(where, f"tensor_parallel_size must be a whole number, got {value!r}") from None
    try:
        config = EngineConfig.from_dict({key: value}, where)
    except ConfigError:
        # Knobs of the other flavor cannot be built alone; fall back to a plain number/bool/string.
        return _plain(value)
    return getattr(config, key)


def _plain(value: str) -> Any:
    low = value.lower()
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


@dataclass(frozen=True)
class Sweep:
    """One knob set to each of ``values`` on top of the default and the recommended config (a controlled
    one-knob sweep, e.g. the incident's ``max_num_seqs``)."""

    knob: str
    values: tuple[Any, ...]

    @classmethod
    def parse(cls, text: str, where: str = "--sweep") -> "Sweep":
        """``max_num_seqs=64,128,256``."""
        key, sep, body = text.partition("=")
        key = key.strip()
        values = [v.strip() for v in body.split(",") if v.strip()]
        if not sep or not key or not values:
            raise ConfigError(where, f"expected KNOB=V1,V2,..., got {text!r}")
        if key not in EngineConfig.__dataclass_fields__ or key in WHATIF_TOP:
            import difflib

            close = difflib.get_close_matches(key, sorted(EngineConfig.__dataclass_fields__), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(where, f"{key!r} is not an engine knob{hint}")
        return cls(key, tuple(_coerce(key, v, where) for v in values))


# ---- everything a report shows ---------------------------------------------------------------------------------
@dataclass
class ReportData:
    spec: StudySpec
    ctx: StudyContext
    storage: str
    trials: pd.DataFrame
    failed: pd.DataFrame
    pick: Pick | None
    #: Pareto front shown in the charts: the feasible front, or the unconstrained one when nothing is feasible.
    front_numbers: list[int]
    counts: dict[str, int]
    default: ConfigRun | None = None
    recommended: ConfigRun | None = None
    whatifs: list[tuple[WhatIf, list[ConfigRun]]] = field(default_factory=list)
    #: Per sweep: base config label ("default", "recommended") -> one run per value (metrics only).
    sweeps: list[tuple[Sweep, dict[str, list[ConfigRun]]]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: The recommendation re-simulated with KV blocks +-5% and step times +-10% (``optimizer._robustness``).
    robustness: dict[str, Any] | None = None

    @property
    def objective_names(self) -> list[str]:
        return list(self.spec.objectives)

    @property
    def runs(self) -> list[ConfigRun]:
        return [r for r in (self.default, self.recommended) if r is not None]


def gather(spec: StudySpec, ctx: StudyContext, trials: Sequence[FrozenTrial], storage: str, *,
           favor: str | None = None, whatifs: Sequence[WhatIf] = (), whatif_trials: str = "picked",
           sweeps: Sequence[Sweep] = (), simulate: bool = True) -> ReportData:
    """Tables of ``trials``, the pick, and fresh simulations of the default and recommended configs.

    ``whatif_trials``: ``picked`` re-simulates the default and recommended configs under each what-if;
    ``all`` also every complete trial (for small grid studies).  A what-if none of whose configs can start, or
    a sweep value no base config can start with (``optimizer._capacity.startup_problem``, the study's check), is
    refused before anything is simulated (ConfigError naming ``--whatif`` / ``--sweep``); a config of it that
    cannot start is a run with that reason as its error.
    """
    counts: dict[str, int] = {}
    for t in trials:
        counts[t.state.name.lower()] = counts.get(t.state.name.lower(), 0) + 1
    complete = [t for t in trials if t.state == TrialState.COMPLETE and t.values is not None]
    pick = choose(trials, ctx, favor) if complete else None
    front = pick.front if pick is not None and pick.front else pareto_front(complete, ctx.directions)
    frame = trial_frame(trials, spec.objectives, front)
    data = ReportData(spec, ctx, storage, frame, failed_frame(trials), pick, [t.number for t in front], counts)
    if pick is not None and not pick.feasible:
        data.notes.append("No trial meets every SLO: the Pareto front shown is over all complete trials and the "
                          "recommended point is the trial closest to feasible.")
    if len(frame) and PRICE_KEY not in frame:
        data.notes.append("No trial's device has a price (price_per_hour_usd in its device YAML), so the page has "
                          "no cost chart; kvtune does not count an unknown price as free.")
    if not simulate:
        return data
    whatif_plans = [_plan_whatif(whatif, spec, pick, complete, whatif_trials) for whatif in whatifs]
    sweep_plans = [_plan_sweep(sweep, spec, pick) for sweep in sweeps]
    backend = SimBackend.for_spec(spec, ctx.workloads)
    data.default = simulate_config("default", spec.fixed_knobs(), spec, ctx, backend=backend, record_lifelines=True)
    if pick is not None:
        data.recommended = simulate_config(f"recommended (trial {pick.trial.number})",
                                           dict(pick.trial.user_attrs.get("knobs") or {}), spec, ctx, backend=backend,
                                           record_lifelines=True)
        try:
            data.robustness = robustness(ctx, dict(pick.trial.user_attrs.get("knobs") or {}),
                                         spec.fixed_knobs(), lambda m: shortfalls(m, ctx))
        except (TrialError, KvtuneError) as exc:
            data.notes.append(f"Robustness check could not run: {exc}")
    for whatif, planned in zip(whatifs, whatif_plans):
        runs = []
        gpu = whatif.gpu or spec.gpu
        workloads = ctx.workloads
        if whatif.rate_scale != 1.0:
            workloads = {seed: w.scale_rate(whatif.rate_scale) for seed, w in ctx.workloads.items()}
        whatif_backend = SimBackend.for_spec(spec, workloads, gpu=gpu)
        for label, knobs, problem in planned:
            if problem is not None:
                runs.append(ConfigRun(label, dict(knobs), gpu, error=problem))
                continue
            runs.append(simulate_config(label, knobs, spec, ctx, gpu=gpu, backend=whatif_backend))
        data.whatifs.append((whatif, runs))
    for sweep, planned_sweep in zip(sweeps, sweep_plans):
        by_base: dict[str, list[ConfigRun]] = {}
        for base_label, planned in planned_sweep:
            runs = []
            for label, knobs, problem in planned:
                if problem is not None:
                    runs.append(ConfigRun(label, dict(knobs), spec.gpu, error=problem))
                    continue
                run = simulate_config(label, knobs, spec, ctx, backend=backend)
                run.requests = run.steps = None  # the sweep chart needs the summary only
                runs.append(run)
            by_base[base_label] = runs
        data.sweeps.append((sweep, by_base))
    return data


def _cannot_start(knobs: Mapping[str, Any], spec: StudySpec, gpu: str | None = None) -> str | None:
    """Why ``knobs`` (on ``gpu``, else their own ``gpu`` lever or the spec's) cannot start: the study's own check
    (``optimizer._capacity.startup_problem``: TP over one node, a dtype the device lacks, weights that do not
    fit), or None."""
    try:
        return startup_problem({**knobs, "gpu": gpu} if gpu else knobs, spec.model, spec.gpu)
    except KvtuneError:
        return None  # not a start-up problem: the simulation says what is wrong


def _plan_whatif(whatif: WhatIf, spec: StudySpec, pick: Pick | None, complete: Sequence[FrozenTrial],
                 whatif_trials: str) -> list[tuple[str, dict[str, Any], str | None]]:
    """``(label, knobs with the what-if, why it cannot start or an error, or None)`` per config the what-if
    re-simulates; a what-if none of whose configs can start is refused (``--whatif: LABEL: cannot start: ...``),
    as the study prunes such a trial."""
    configs: list[tuple[str, dict[str, Any]]] = [("default", spec.fixed_knobs())]
    if pick is not None:
        configs.append((f"recommended (trial {pick.trial.number})", dict(pick.trial.user_attrs["knobs"])))
    if whatif_trials == "all":
        configs += [(f"trial {t.number}", dict(t.user_attrs.get("knobs") or {})) for t in complete
                    if pick is None or t.number != pick.trial.number]
    planned: list[tuple[str, dict[str, Any], str | None]] = []
    problems = []
    for label, knobs in configs:
        try:
            changed = whatif.apply(knobs)
        except KvtuneError as exc:
            planned.append((label, dict(knobs), str(exc)))
            continue
        problem = _cannot_start(changed, spec, whatif.gpu)
        planned.append((label, changed, problem))
        problems.append(problem)
    if problems and all(p is not None for p in problems):
        raise ConfigError("--whatif", f"{whatif.label}: {problems[0]}")
    return planned


def _plan_sweep(sweep: Sweep, spec: StudySpec, pick: Pick | None
                ) -> list[tuple[str, list[tuple[str, dict[str, Any], str | None]]]]:
    """Per base config (default, recommended): ``(label, knobs, why it cannot start or None)`` per value; a
    value that no base config can start with is refused (``--sweep: KNOB=VALUE: cannot start: ...``)."""
    bases = [("default", spec.fixed_knobs())]
    if pick is not None:
        bases.append(("recommended", dict(pick.trial.user_attrs.get("knobs") or {})))
    planned = [(base_label, [(f"{base_label} {sweep.knob}={value}", {**knobs, sweep.knob: value},
                              _cannot_start({**knobs, sweep.knob: value}, spec)) for value in sweep.values])
               for base_label, knobs in bases]
    for i, value in enumerate(sweep.values):
        problems = [runs[i][2] for _, runs in planned]
        if all(p is not None for p in problems):
            raise ConfigError("--sweep", f"{sweep.knob}={value}: {problems[0]}")
    return planned

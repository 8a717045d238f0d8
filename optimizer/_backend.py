"""Trial backends: what runs one trial.  ``run(params, seeds)`` takes an engine config (EngineConfig knob names)
and the replicate seeds, and returns the flat metrics (``Summary.to_dict()`` keys), averaged over the replicates.

:class:`SimBackend` simulates.  Other kinds (a spec's ``backend: {kind: ...}``) are registered by the packages that
provide them, through :func:`register_backend` -- the replay package registers ``replay`` (a real engine or the
twin) when kvtune's plugins are loaded (:mod:`optimizer._plugins`) -- so that the optimizer never imports them.
A backend is pickled to the workers, so it carries what it needs (the built workloads) rather than paths only the
driver has.
"""

from __future__ import annotations

import math
import time
import warnings
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from sim.errors import ConfigError

if TYPE_CHECKING:
    from sim.workload.workload import Workload
    from optimizer._spec import StudySpec
    from optimizer._context import StudyContext


class TrialError(Exception):
    """A trial that ran but produced no usable result (e.g. the engine aborted); the message is the reason."""


class TrialBackend(ABC):
    """Runs one trial's config and returns its metrics."""

    #: Shown in trial user attributes (``backend``).
    name: str = "backend"

    @abstractmethod
    def run(self, params: Mapping[str, Any], seeds: Sequence[int]) -> dict[str, float]:
        """Metrics of ``params`` (EngineConfig knobs) averaged over ``seeds``; raise to fail the trial."""

    def prepare(self, seeds: Sequence[int]) -> None:
        """Called once in the driver before the backend is shipped to workers (build what they need)."""


#: A backend factory: ``factory(spec, ctx, out_dir)`` -> the TrialBackend of ``spec.backend`` on the workloads
#: ``ctx`` built (``out_dir``: the study's output folder, for what the backend saves).
BackendFactory = Callable[["StudySpec", "StudyContext", Path], TrialBackend]
_FACTORIES: dict[str, BackendFactory] = {}


def register_backend(kind: str, factory: BackendFactory) -> None:
    """Make ``backend: {kind: KIND}`` run trials on ``factory``'s backends (a later registration replaces it)."""
    _FACTORIES[kind] = factory


def backend_factory(kind: str) -> BackendFactory:
    """The factory registered for ``kind`` (after loading kvtune's plugins); ConfigError when none is."""
    from optimizer._plugins import load_plugins

    if kind not in _FACTORIES:
        load_plugins()
    try:
        return _FACTORIES[kind]
    except KeyError:
        known = ", ".join(sorted(["sim", *_FACTORIES])) or "none"
        raise ConfigError("backend.kind", f"no trial backend {kind!r} is registered (known: {known}); is the "
                                          f"package that provides it installed?") from None


def registered_backends() -> list[str]:
    """Kinds with a registered factory (``sim`` is built in and not listed)."""
    return sorted(_FACTORIES)


def mean_metrics(runs: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Key-wise mean over replicates; NaN where no replicate has a value, +inf if any replicate is +inf."""
    import numpy as np

    if len(runs) == 1:
        return {k: float(v) for k, v in runs[0].items()}
    keys: list[str] = []
    seen = set()
    for run in runs:
        for key in run:
            if key not in seen:
                seen.add(key)
                keys.append(key)
    out: dict[str, float] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for key in keys:
            values = np.array([float(run.get(key, math.nan)) for run in runs], dtype=float)
            out[key] = float(np.nanmean(values)) if not np.isnan(values).all() else math.nan
    return out


class SimBackend(TrialBackend):
    """Simulates each replicate: the workload of its seed (built once, in the driver) on the trial's config.

    ``workload``: a :class:`~sim.workload.WorkloadSpec` (anything with ``build(seed)``), a fixed Workload (every
    seed gets the same requests; the seed still draws client timeouts/cancels), a mapping ``seed -> Workload``,
    or a callable ``seed -> Workload``.
    """

    name = "sim"

    def __init__(self, workload: Any, model: str, gpu: str, *, coefficients: Any = None, record_steps: bool = True,
                 kv_scale: float = 1.0, time_scale: float = 1.0):
        self._source = workload
        self.model = model
        self.gpu = gpu
        self.coefficients = coefficients
        self.record_steps = record_steps
        #: Robustness re-simulations: KV blocks and every step time scaled by these factors (1: as modelled).
        self.kv_scale = float(kv_scale)
        self.time_scale = float(time_scale)
        self._workloads: dict[int, "Workload"] = {}

    @classmethod
    def for_spec(cls, spec: Any, workload: Any, *, gpu: str | None = None, **kwargs: Any) -> "SimBackend":
        """The backend a study's trials are simulated on: the spec's model on ``gpu`` (default the spec's), with
        the latency coefficients of its ``latency_profile`` (``StudySpec.coefficients``), so that every
        re-simulation of the study (export, robustness, report) predicts with the model its trials were scored
        by.  ``kwargs``: ``record_steps``, ``kv_scale``, ``time_scale``."""
        return cls(workload, spec.model, gpu or spec.gpu, coefficients=spec.coefficients(), **kwargs)

    def workload(self, seed: int) -> "Workload":
        from sim.workload.workload import Workload

        if seed not in self._workloads:
            source = self._source
            if isinstance(source, Workload):
                built = source
            elif isinstance(source, Mapping):
                if seed not in source:
                    raise TrialError(f"no workload was built for seed {seed}")
                built = source[seed]
            elif hasattr(source, "build"):
                built = source.build(seed)
            elif callable(source):
                built = source(seed)
            else:
                raise TypeError(f"cannot build a workload from {type(source).__name__}")
            self._workloads[seed] = built
        return self._workloads[seed]

    def prepare(self, seeds: Sequence[int]) -> None:
        for seed in seeds:
            self.workload(seed)

    @property
    def classes(self) -> dict:
        first = next(iter(self._workloads.values()), None) or self.workload(0)
        return dict(first.classes)

    def run_one(self, params: Mapping[str, Any], seed: int, observer: Any = None, *,
                keep_steps: bool | None = None) -> tuple[dict[str, float], Any]:
        """Metrics of one replicate and its SimResult; ``observer`` sees every step (``sim.runner.Simulation``).
        ``keep_steps`` (default: ``record_steps``): keep the step table in the result; without it the step table
        is collected in compact chunks for the metrics (same values) and ended requests are not kept."""
        from objectives import StepTotals, summarize
        from optimizer._knobs import fleet_of, split_deployment
        from sim.engine import resolve_engine
        from sim.profiles import load_gpu, load_model
        from sim.runner import simulate

        workload = self.workload(seed)
        # A study that searches devices or fleets carries the trial's in the knobs (optimizer/_capacity.py).
        knobs = params
        params, device = split_deployment(params)
        model, gpu = load_model(self.model), load_gpu(device or self.gpu)
        # Resolved, sized and given its latency model once; the plan goes to the engine as it is.
        plan = resolve_engine(params, model, gpu, coefficients=self.coefficients).scaled(self.kv_scale,
                                                                                        self.time_scale)
        keep = self.record_steps if keep_steps is None else keep_steps
        replicas, router, router_params = fleet_of(knobs)
        if replicas > 1 or router is not None:  # a fleet behind a router (sim.fleet), one SimPy clock
            return self._run_fleet(workload, plan, model, gpu, seed, replicas, router, router_params)
        totals = None if keep else StepTotals()
        result = simulate(workload, plan, model, gpu, seed=seed, record_steps=keep,
                          step_sink=None if totals is None else totals.add, keep_requests=False, observer=observer)
        if result.aborted:
            raise TrialError(f"engine aborted: {result.aborted}")
        metrics = summarize(result.requests, result.steps if totals is None else totals, workload.classes).to_dict()
        metrics["sim.num_gpu_blocks"] = float(result.sizing.num_gpu_blocks)
        metrics["sim.num_cpu_blocks"] = float(result.sizing.num_cpu_blocks)
        metrics["sim.wall_s"] = float(result.wall_s)
        return metrics, result

    def _run_fleet(self, workload: Any, plan: Any, model: Any, gpu: Any, seed: int, replicas: int,
                   router: str | None, router_params: Mapping[str, Any]) -> tuple[dict[str, float], Any]:
        """One replicate of a fleet: ``replicas`` engines of ``plan``'s config behind ``router`` (round robin when
        none is named); the summary is the fleet's (every replica's requests and steps), plus ``fleet.*``."""
        from objectives import summarize
        from sim.fleet import router_class, simulate_fleet

        router = router or "round_robin"
        own = router_class(router).params  # a searched parameter of another router does not apply to this one
        # The trial's plan as it is (resolved, sized and given its latency model once), one engine built per replica.
        result = simulate_fleet(workload, plan, model, gpu, replicas=replicas, router=router,
                                router_params={k: v for k, v in router_params.items() if k in own}, seed=seed,
                                keep_requests=False)
        if result.aborted:
            raise TrialError(f"engine aborted: {result.aborted}")
        metrics = summarize(result.requests, result.steps, workload.classes).to_dict()
        metrics["sim.num_gpu_blocks"] = float(result.sizing.num_gpu_blocks)
        metrics["sim.num_cpu_blocks"] = float(result.sizing.num_cpu_blocks)
        metrics["sim.wall_s"] = float(result.wall_s)
        for key, value in result.fleet.items():
            if isinstance(value, (int, float)):
                metrics[f"fleet.{key}"] = float(value)
        return metrics, result

    def run(self, params: Mapping[str, Any], seeds: Sequence[int]) -> dict[str, float]:
        """A trial: the mean metrics over ``seeds``; no step table is kept (only compact chunks for its metrics)."""
        t0, cpu0 = time.perf_counter(), time.thread_time()
        runs = [self.run_one(params, seed, keep_steps=False)[0] for seed in seeds]
        out = mean_metrics(runs)
        out["sim.wall_s"] = time.perf_counter() - t0
        out["sim.cpu_s"] = time.thread_time() - cpu0  # this trial's own CPU (a Ray worker runs it in a thread)
        return out

    def __getstate__(self) -> dict:
        from sim.workload.workload import Workload

        state = dict(self.__dict__)
        if self._workloads and not isinstance(self._source, (Workload, Mapping)):
            # Workers get the built workloads, not the spec (its trace path may not exist on a cluster node).
            state["_source"] = _Prebuilt(dict(self._workloads))
        return state


class _Prebuilt:
    """Workloads built in the driver; a seed not among them is an error (the driver prepares every seed)."""

    def __init__(self, workloads: dict[int, Workload]):
        self.workloads = workloads

    def build(self, seed: int) -> Workload:
        if seed not in self.workloads:
            raise TrialError(f"workload for seed {seed} was not prepared in the driver")
        return self.workloads[seed]


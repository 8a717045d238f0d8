"""The Optuna sampler a study spec names, seeded, with constraints handled the way the installed Optuna wants.

Optuna 5 reads constraints that each trial sets with ``Trial.set_constraint`` (``constraints_func`` is deprecated
there); older Optuna needs ``constraints_func``, which kvtune answers from the ``constraints`` user attribute.
"""

from __future__ import annotations

import warnings
from typing import Any, Sequence

import optuna

from optimizer._space import SearchSpace
from optimizer._spec import SamplerSpec
from sim.errors import ConfigError

#: Whether trials carry constraints themselves (Optuna >= 5).
TRIAL_CONSTRAINTS = hasattr(optuna.trial.Trial, "set_constraint")


def constraints_from_user_attrs(trial: optuna.trial.FrozenTrial) -> Sequence[float]:
    """``constraints_func`` for Optuna < 5: the violations kvtune stored on the trial."""
    return tuple(trial.user_attrs.get("constraints", ()))


def make_sampler(spec: SamplerSpec, space: SearchSpace, *, constrained: bool,
                 seed: int | None = None) -> optuna.samplers.BaseSampler:
    """The sampler ``spec`` names, seeded with ``seed`` (default the spec's; a study that resumes passes the spec's
    seed plus the trials already stored, so that its draws do not repeat the first run's)."""
    seed = spec.seed if seed is None else seed
    kwargs: dict[str, Any] = {}
    if constrained and not TRIAL_CONSTRAINTS and spec.name in ("tpe", "nsga2", "gp"):
        kwargs["constraints_func"] = constraints_from_user_attrs
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if spec.name == "tpe":
            conditional = any(d.when for d in space.domains)
            return optuna.samplers.TPESampler(
                seed=seed,
                n_startup_trials=10 if spec.n_startup_trials is None else spec.n_startup_trials,
                multivariate=True,
                group=conditional,
                constant_liar=True,
                **kwargs,
            )
        if spec.name == "nsga2":
            return optuna.samplers.NSGAIISampler(seed=seed, population_size=spec.population_size or 20, **kwargs)
        if spec.name == "gp":
            try:
                import scipy  # noqa: F401
                import torch  # noqa: F401
            except ImportError as exc:
                raise ConfigError("sampler.name", f"gp needs torch and scipy installed ({exc.name} is missing); "
                                                  "use tpe, or pip install torch scipy") from None
            return optuna.samplers.GPSampler(
                seed=seed, n_startup_trials=10 if spec.n_startup_trials is None else spec.n_startup_trials,
                **kwargs)
        if spec.name == "random":
            return optuna.samplers.RandomSampler(seed=seed)
        if spec.name == "grid":
            return optuna.samplers.GridSampler(space.grid(), seed=seed)
    raise ConfigError("sampler.name", f"unknown sampler {spec.name!r}")

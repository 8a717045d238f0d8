"""Search and distribution: study specs, search spaces, the Optuna study, trial executors and backends, export.

Entry points: :func:`load_study_spec` / :class:`StudySpec` (the YAML), :class:`Tuner` / :func:`run_study` (run or
resume a study), :func:`export_study` (Pareto front and recommended config), the :class:`TrialBackend` and
:class:`Executor` interfaces with :class:`SimBackend`, :class:`RayExecutor` and :class:`InProcessExecutor`.
The command line is :mod:`optimizer.cli`.

Names are imported lazily (Optuna, SQLAlchemy, pandas and Ray load on first use), so that ``kvtune --help``
and ``kvtune simulate`` stay cheap.
"""

from __future__ import annotations

from sim._lazy import lazy_getattr

_EXPORTS = {
    "Budget": "optimizer._spec",
    "choose": "optimizer._export",
    "default_search_space": "optimizer._space",
    "default_target": "optimizer._versions",
    "Domain": "optimizer._space",
    "Executor": "optimizer._executors",
    "export_study": "optimizer._export",
    "ExportResult": "optimizer._export",
    "flag_table": "optimizer._versions",
    "InProcessExecutor": "optimizer._executors",
    "is_feasible": "optimizer._storage",
    "is_finished": "optimizer._storage",
    "KVTUNE_POLICIES": "optimizer._knobs",
    "load_study_spec": "optimizer._spec",
    "make_sampler": "optimizer._samplers",
    "mean_metrics": "optimizer._backend",
    "open_study": "optimizer._storage",
    "params_to_knobs": "optimizer._knobs",
    "pareto_front": "optimizer._export",
    "parse_search_space": "optimizer._space",
    "Pick": "optimizer._export",
    "prepare": "optimizer._storage",
    "RayExecutor": "optimizer._executors",
    "recover_interrupted": "optimizer._storage",
    "run_study": "optimizer._study",
    "SAMPLERS": "optimizer._spec",
    "SamplerSpec": "optimizer._spec",
    "SearchSpace": "optimizer._space",
    "Shortfall": "optimizer._export",
    "SimBackend": "optimizer._backend",
    "StudyContext": "optimizer._storage",
    "StudyResult": "optimizer._study",
    "StudySpec": "optimizer._spec",
    "StudyStopped": "optimizer._study",
    "TrialBackend": "optimizer._backend",
    "TrialError": "optimizer._backend",
    "trial_metrics": "optimizer._storage",
    "TrialOutcome": "optimizer._executors",
    "Tuner": "optimizer._study",
    "vllm_config": "optimizer._export",
    "VLLM_FLAGS": "optimizer._knobs",
    "VllmTarget": "optimizer._versions",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_getattr(__name__, _EXPORTS)

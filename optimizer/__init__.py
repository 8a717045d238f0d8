"""Search and distribution: study specs, search spaces, the Optuna study, trial executors and backends, export.

Entry points: :func:`load_study_spec` / :class:`StudySpec` (the YAML), :class:`Tuner` / :func:`run_study` (run or
resume a study), :func:`export_study` (Pareto front and recommended config), the :class:`TrialBackend` and
:class:`Executor` interfaces with :class:`SimBackend`, :class:`RayExecutor`, :class:`ProcessExecutor` and
:class:`InProcessExecutor` (:func:`choose_executor` picks one per study).
The command line is :mod:`optimizer.cli`; packages that extend it (the replay package) register their trial
backends (:func:`register_backend`) and subcommands (:func:`register_commands`) and share its argument types and
its shared arguments, each defined once in ``optimizer/_cli_args.py`` (:func:`add_engine_arguments` for
``--model/--gpu/--set`` (:func:`add_model_argument` for ``--model`` alone), :func:`add_format_argument`, :func:`add_latency_arguments`, :func:`add_seed_argument`,
:func:`add_rate_scale_argument`, :func:`add_hash_block_tokens_argument` (with :func:`apply_hash_block_tokens`),
:func:`add_vllm_arguments`, :func:`add_log_level_argument`, :func:`parse_pairs`).

Names are imported lazily (Optuna, SQLAlchemy, pandas and Ray load on first use), so that ``kvtune --help``
and ``kvtune simulate`` stay cheap.
"""

from __future__ import annotations

from sim import lazy_getattr

_EXPORTS = {
    "add_engine_arguments": "optimizer._cli_args",
    "add_format_argument": "optimizer._cli_args",
    "add_hash_block_tokens_argument": "optimizer._cli_args",
    "add_latency_arguments": "optimizer._cli_args",
    "add_log_level_argument": "optimizer._cli_args",
    "add_model_argument": "optimizer._cli_args",
    "add_rate_scale_argument": "optimizer._cli_args",
    "add_seed_argument": "optimizer._cli_args",
    "add_vllm_arguments": "optimizer._cli_args",
    "apply_hash_block_tokens": "optimizer._cli_args",
    "Budget": "optimizer._spec",
    "choose": "optimizer._export",
    "default_search_space": "optimizer._space",
    "default_target": "optimizer._versions",
    "Domain": "optimizer._space",
    "engine_flag_values": "optimizer._knobs",
    "Executor": "optimizer._executors",
    "export_study": "optimizer._export",
    "ExportResult": "optimizer._export",
    "flag_table": "optimizer._versions",
    "hf_model_id": "optimizer._vllm_config",
    "InProcessExecutor": "optimizer._executors",
    "choose_executor": "optimizer._executors",
    "is_feasible": "optimizer._storage",
    "is_finished": "optimizer._storage",
    "KVTUNE_POLICIES": "optimizer._knobs",
    "load_study_spec": "optimizer._spec",
    "make_sampler": "optimizer._samplers",
    "mean_metrics": "optimizer._backend",
    "non_negative_float": "optimizer._cli_args",
    "non_negative_int": "optimizer._cli_args",
    "open_study": "optimizer._storage",
    "params_to_knobs": "optimizer._knobs",
    "parse_pairs": "optimizer._cli_args",
    "pareto_front": "optimizer._export",
    "parse_search_space": "optimizer._space",
    "Pick": "optimizer._export",
    "port": "optimizer._cli_args",
    "positive_float": "optimizer._cli_args",
    "positive_int": "optimizer._cli_args",
    "prepare": "optimizer._storage",
    "ProcessExecutor": "optimizer._executors",
    "RayExecutor": "optimizer._executors",
    "recover_interrupted": "optimizer._storage",
    "register_backend": "optimizer._backend",
    "register_commands": "optimizer._plugins",
    "render_recommended_yaml": "optimizer._vllm_config",
    "run_study": "optimizer._study",
    "SAMPLERS": "optimizer._spec",
    "SamplerSpec": "optimizer._spec",
    "SearchSpace": "optimizer._space",
    "Shortfall": "optimizer._export",
    "SimBackend": "optimizer._backend",
    "StudyContext": "optimizer._context",
    "StudyResult": "optimizer._study",
    "StudySpec": "optimizer._spec",
    "StudyStopped": "optimizer._study",
    "TrialBackend": "optimizer._backend",
    "TrialError": "optimizer._backend",
    "trial_metrics": "optimizer._storage",
    "TrialOutcome": "optimizer._executors",
    "Tuner": "optimizer._study",
    "vllm_config": "optimizer._vllm_config",
    "VLLM_FLAGS": "optimizer._knobs",
    "VllmTarget": "optimizer._versions",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_getattr(__name__, _EXPORTS)

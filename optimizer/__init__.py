"""Search and distribution: study specs, search spaces, the Optuna study, trial executors and backends, export.

Entry points: :func:`load_study_spec` / :class:`StudySpec` (the YAML), :class:`Tuner` / :func:`run_study` (run or
resume a study), :func:`export_study` (Pareto front and recommended config), the :class:`TrialBackend` and
:class:`Executor` interfaces with :class:`SimBackend`, :class:`RayExecutor` and :class:`InProcessExecutor`.
The command line is :mod:`optimizer.cli`.
"""

from optimizer._backend import SimBackend, TrialBackend, TrialError, mean_metrics
from optimizer._executors import Executor, InProcessExecutor, RayExecutor, TrialOutcome
from optimizer._export import ExportResult, Pick, Shortfall, choose, export_study, pareto_front, vllm_config
from optimizer._knobs import KVTUNE_POLICIES, VLLM_FLAGS, params_to_knobs
from optimizer._samplers import make_sampler
from optimizer._space import Domain, SearchSpace, default_search_space, parse_search_space
from optimizer._spec import SAMPLERS, Budget, SamplerSpec, StudySpec, load_study_spec
from optimizer._storage import StudyContext, is_feasible, is_finished, open_study, prepare, recover_interrupted
from optimizer._study import StudyResult, StudyStopped, Tuner, run_study
from optimizer._versions import VllmTarget, default_target, flag_table

__all__ = [
    "Budget",
    "Domain",
    "Executor",
    "ExportResult",
    "InProcessExecutor",
    "KVTUNE_POLICIES",
    "Pick",
    "RayExecutor",
    "SAMPLERS",
    "SamplerSpec",
    "SearchSpace",
    "Shortfall",
    "SimBackend",
    "StudyContext",
    "StudyResult",
    "StudySpec",
    "StudyStopped",
    "TrialBackend",
    "TrialError",
    "TrialOutcome",
    "Tuner",
    "VLLM_FLAGS",
    "VllmTarget",
    "choose",
    "default_search_space",
    "default_target",
    "export_study",
    "flag_table",
    "is_feasible",
    "is_finished",
    "load_study_spec",
    "make_sampler",
    "mean_metrics",
    "open_study",
    "pareto_front",
    "params_to_knobs",
    "parse_search_space",
    "prepare",
    "recover_interrupted",
    "run_study",
    "vllm_config",
]

"""``kvtune calibrate``: fit the latency model's coefficients to a real engine (or to any replay results).

Modules, one idea each:

- :mod:`~replay.calibration.probes`: the probe workloads (prefill sweep, decode batches, mixed steps) and their
  replay against a server (``run_probes``);
- :mod:`~replay.calibration.runs`: a calibration run (what was replayed and measured), read from a result folder;
- :mod:`~replay.calibration.engine_timing`: the engine's own timings (vLLM's histograms) and, for a CPU engine,
  how much of its core it got (kernel ``schedstat``);
- :mod:`~replay.calibration.step_log`: the engine's own record of each step (vLLM's per-step log lines);
- :mod:`~replay.calibration.loss`: how far a simulation is from a run;
- :mod:`~replay.calibration.solvers`: bounded minimizers (Levenberg-Marquardt, Nelder-Mead);
- :mod:`~replay.calibration.fit`: ``calibrate`` and ``CalibrationFit``;
- :mod:`~replay.calibration.profile`: profile files (``save_profile``, ``coefficients_from``);
- :mod:`~replay.calibration.cli`: the ``kvtune calibrate`` command.

Step fit (where the engine logged its steps, as ``kvtune calibrate --launch vllm`` has it do): each step's
duration is compared with the latency model's for a step of that shape, thousands of steps of known shapes
(no simulation of the runs, so no scheduling difference enters).  Otherwise a simulation-based fit: for candidate
coefficients, every replayed run is simulated (same workload slice, same
config, same seed, so the same clients) and compared with what was measured: the engine's own mean prefill and
decode time where vLLM exports them, else the client's per-request TTFT and TPOT, on a log scale (a soft-L1
loss).  Identifiability: prefill-heavy steps are compute-bound (``mfu``), decode steps memory-bound (``bw_eff``,
with the KV read growing with context), and the step overhead is the intercept of both; a workload with mixed
prompt lengths and batch sizes separates them.
"""

from __future__ import annotations

from sim import lazy_getattr

#: Public name -> module; imported on first use, so that ``import replay.calibration`` (the CLI) stays cheap.
_EXPORTS = {
    "ENGINE_TIMES": "replay.calibration.engine_timing",
    "at_cpu_share": "replay.calibration.engine_timing",
    "contended_share": "replay.calibration.engine_timing",
    "cpu_share": "replay.calibration.engine_timing",
    "engine_cpu_seconds": "replay.calibration.engine_timing",
    "engine_means": "replay.calibration.engine_timing",
    "engine_sched_seconds": "replay.calibration.engine_timing",
    "engine_times": "replay.calibration.engine_timing",
    "record_engine_times": "replay.calibration.engine_timing",
    "BOUNDS": "replay.calibration.fit",
    "DEFAULT_FIT_PARAMS": "replay.calibration.fit",
    "SLOT_PARAM": "replay.calibration.fit",
    "STEP_FIT_PARAMS": "replay.calibration.fit",
    "TARGETS": "replay.calibration.fit",
    "CalibrationFit": "replay.calibration.fit",
    "calibrate": "replay.calibration.fit",
    "ClientLatency": "replay.calibration.loss",
    "RunErrors": "replay.calibration.loss",
    "engine_errors": "replay.calibration.loss",
    "frontend_latency": "replay.calibration.loss",
    "run_errors": "replay.calibration.loss",
    "run_max_num_seqs": "replay.calibration.loss",
    "step_errors": "replay.calibration.loss",
    "with_client_latency": "replay.calibration.loss",
    "PROBE_CLASS": "replay.calibration.probes",
    "ProbeGroup": "replay.calibration.probes",
    "probe_groups": "replay.calibration.probes",
    "probe_workload": "replay.calibration.probes",
    "recorded_config": "replay.calibration.probes",
    "run_probes": "replay.calibration.probes",
    "coefficients_from": "replay.calibration.profile",
    "save_profile": "replay.calibration.profile",
    "CalibrationRun": "replay.calibration.runs",
    "load_run": "replay.calibration.runs",
    "load_runs": "replay.calibration.runs",
    "levenberg_marquardt": "replay.calibration.solvers",
    "nelder_mead": "replay.calibration.solvers",
    "load_profile": "sim.latency",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_getattr(__name__, _EXPORTS)

"""Hardware and model profiles, loaded from the YAML files bundled in ``sim/data``."""

from sim.profiles._profiles import (
    GpuProfile,
    ModelProfile,
    gpu_names,
    load_gpu,
    load_model,
    model_names,
)

__all__ = ["GpuProfile", "ModelProfile", "gpu_names", "load_gpu", "load_model", "model_names"]

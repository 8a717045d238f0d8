"""Hardware and model profiles, loaded from the YAML files bundled in ``sim/data``, or by path: a Hugging Face
``config.json`` (or its model folder) for a model, a device YAML for a GPU or CPU."""

from sim.profiles._profiles import (
    GpuProfile,
    ModelProfile,
    gpu_names,
    load_device_yaml,
    load_gpu,
    load_model,
    model_names,
)

from sim.profiles._hf import config_path as hf_config_path
from sim.profiles._hf import model_from_hf_config

__all__ = ["GpuProfile", "ModelProfile", "gpu_names", "hf_config_path", "load_device_yaml", "load_gpu", "load_model",
           "model_from_hf_config", "model_names"]

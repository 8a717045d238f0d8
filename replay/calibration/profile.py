"""Profile files: reading coefficients (with overrides) and writing a fit's profile YAML."""

from __future__ import annotations

from pathlib import Path

import yaml

from replay.calibration.fit import CalibrationFit
from sim.latency import LatencyCoefficients, coefficients_from_mapping, load_profile


def coefficients_from(profile: str | Path | None,
                      overrides: dict[str, float] | None = None) -> LatencyCoefficients | None:
    """A profile file's coefficients with ``overrides`` applied; None when neither is given (model defaults)."""
    if profile is None and not overrides:
        return None
    base = load_profile(profile) if profile is not None else LatencyCoefficients()
    if overrides:
        merged = {**base.as_dict(), **overrides}
        return coefficients_from_mapping(merged, where="--coef")
    return base


def save_profile(fit: CalibrationFit, path: str | Path, model: str | None = None, gpu: str | None = None) -> Path:
    """Write the profile YAML; ``model`` / ``gpu``: how to load what it was fitted for (a profile name or a
    path), recorded in place of the fitted profiles' names."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = fit.to_profile()
    doc["model"] = model or doc["model"]
    doc["gpu"] = gpu or doc["gpu"]
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


"""What a replay command's engine options name: ``--set knob=value`` as an ``EngineConfig`` and ``--profile`` /
``--coef name=value`` as latency coefficients.

Shared by ``kvtune twin`` / ``kvtune replay`` (:mod:`replay.cli`) and ``kvtune calibrate``
(:mod:`replay.calibration.cli`).  The heavy modules are imported on first call, so the CLI stays cheap to import.
"""

from __future__ import annotations

from optimizer import parse_pairs


def engine_config(sets: list[str] | None):
    """The ``EngineConfig`` of ``--set knob=value`` pairs (a misspelt knob or a bad value: ``ConfigError``)."""
    from sim.engine.config import EngineConfig

    return EngineConfig.from_dict(parse_pairs(sets, "--set"), where="--set")


def coefficients(profile: str | None, coefs: list[str] | None):
    """The latency coefficients of a ``--profile`` file with ``--coef name=value`` overrides; None when neither
    is given (the model's defaults)."""
    from replay.calibration.profile import coefficients_from

    overrides = {k: float(v) for k, v in parse_pairs(coefs, "--coef").items()}
    return coefficients_from(profile, overrides)

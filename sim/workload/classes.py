"""Request classes: who the requests are, what latency they were promised, and how their clients behave."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from sim.errors import ConfigError
from sim.fields import fail

DEFAULT_CLASS = "default"


@dataclass(frozen=True)
class SLO:
    """p99 latency targets of one class, in seconds; ``None`` means no target on that metric."""

    ttft_p99_s: float | None = None
    tpot_p99_s: float | None = None
    e2e_p99_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_p99_s", "tpot_p99_s", "e2e_p99_s"):
            value = getattr(self, name)
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise fail(f"slo.{name}", "a positive number of seconds", value)

    def targets(self) -> dict[str, float]:
        """Metric name (``ttft_s``, ``tpot_s``, ``e2e_s``) -> p99 target, for the targets that are set."""
        out = {}
        for metric, value in (("ttft_s", self.ttft_p99_s), ("tpot_s", self.tpot_p99_s), ("e2e_s", self.e2e_p99_s)):
            if value is not None:
                out[metric] = value
        return out


@dataclass(frozen=True)
class RequestClass:
    """A named class of requests with its SLOs and client behaviour.

    ``timeout_s``: the client gives up after this long (request ends ``timed_out``, its KV blocks are freed).
    ``cancel_probability``: share of requests whose client cancels; a cancelling client does so at a time drawn
    uniformly from ``cancel_after_s`` (seconds after arrival).  ``priority``: lower is more important, as in
    vLLM's ``--scheduling-policy priority``.
    """

    name: str
    slo: SLO = field(default_factory=SLO)
    timeout_s: float | None = None
    cancel_probability: float = 0.0
    cancel_after_s: tuple[float, float] = (1.0, 30.0)
    priority: int = 0

    def __post_init__(self) -> None:
        where = f"classes.{self.name}"
        if not self.name:
            raise ConfigError("classes", "a class needs a non-empty name")
        if self.timeout_s is not None and not (self.timeout_s > 0 and math.isfinite(self.timeout_s)):
            raise fail(f"{where}.timeout_s", "a positive number of seconds", self.timeout_s)
        if not 0.0 <= self.cancel_probability <= 1.0:
            raise fail(f"{where}.cancel_probability", "in [0, 1]", self.cancel_probability)
        low, high = self.cancel_after_s
        if not 0 <= low <= high:
            raise fail(f"{where}.cancel_after_s", "[low, high] with 0 <= low <= high", self.cancel_after_s)

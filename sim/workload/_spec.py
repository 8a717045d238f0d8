"""``WorkloadSpec``: the ``workload:`` section of a study spec, and how it becomes a Workload.

    workload:
      trace: traces/azure_conv_2023.csv     # or "bundled"; relative to the spec file; or generator: {...}
      format: normalized                    # optional, detected
      classes: {...}                        # class rules, see sim.workload._rules
      arrival: {process: gamma, rate_rps: 8, cv: 2}   # optional: replace the trace's timestamps
      window: {start_s: 600, end_s: 1800}   # optional: slice of the trace, in trace seconds
      rate_scale: 2.0                       # x2 = twice the request rate
      max_model_len: 8192                   # optional: cap outputs, drop prompts that cannot fit
      max_requests: 5000                    # optional: first N requests
      skip_bad_rows: false
      failed_requests: keep                 # BurstGPT failed requests: keep (class "failed") or drop
      hash_block_tokens: 512                # prompt tokens per hash_ids entry (Mooncake: 512); scale it with
                                            # the lengths of a scaled trace to keep its prefix sharing
      seed: 0

Build order: read (or generate) -> classes -> window -> arrivals -> rate_scale -> max_model_len -> max_requests,
so a window is given in the trace's own seconds and the scale applies to what is left.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from sim.errors import ConfigError
from sim.workload._arrivals import ArrivalSpec
from sim.fields import boolean, check_keys, mapping, number, string
from sim.workload._detect import check_format
from sim.workload._generator import GeneratorSpec, generate
from sim.workload._loader import from_rows, read_rows
from sim.workload._paths import resolve_trace_path
from sim.workload._readers import FAILED_POLICIES
from sim.workload._rules import ClassRules
from sim.workload._transform import cap_max_model_len, replace_arrivals
from sim.workload.workload import (MAX_HASH_BLOCK_TOKENS, MOONCAKE_HASH_BLOCK_TOKENS, Workload,
                                  check_hash_block_tokens)

_KEYS = ("trace", "format", "generator", "classes", "arrival", "window", "rate_scale", "max_model_len",
         "max_requests", "skip_bad_rows", "failed_requests", "hash_block_tokens", "seed")


@dataclass(frozen=True)
class TimeWindow:
    """Requests arriving in ``[start_s, end_s)`` of the source, shifted to start at 0."""

    start_s: float = 0.0
    end_s: float | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "window") -> "TimeWindow":
        d = mapping(d, where)
        check_keys(d, ("start_s", "end_s"), where)
        start = number(d, "start_s", where, 0.0, minimum=0.0)
        end = number(d, "end_s", where, None)
        if end is not None and not end > start:
            raise ConfigError(f"{where}.end_s", f"must be > start_s ({start:g}), got {end:g}")
        return cls(start, end)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"start_s": self.start_s}
        if self.end_s is not None:
            out["end_s"] = self.end_s
        return out


@dataclass(frozen=True)
class WorkloadSpec:
    """Where requests come from (a trace or a generator) and how they are shaped; see the module docstring."""

    trace: str | None = None
    format: str | None = None
    generator: GeneratorSpec | None = None
    classes: ClassRules | None = None
    arrival: ArrivalSpec | None = None
    window: TimeWindow | None = None
    rate_scale: float = 1.0
    max_model_len: int | None = None
    max_requests: int | None = None
    skip_bad_rows: bool = False
    failed_requests: str = "keep"
    #: Prompt tokens per ``hash_ids`` entry of the trace (Mooncake's 512 by default).
    hash_block_tokens: int = MOONCAKE_HASH_BLOCK_TOKENS
    seed: int = 0
    #: Folder that relative trace paths are taken from (the spec file's folder); not part of the YAML.
    base_dir: Path | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if (self.trace is None) == (self.generator is None):
            raise ConfigError("workload", "give exactly one of trace and generator")
        if self.generator is not None and (self.format is not None or self.arrival is not None):
            key = "format" if self.format is not None else "arrival"
            raise ConfigError(f"workload.{key}", "applies to a trace; a generator sets arrivals per class")
        if not self.rate_scale > 0:
            raise ConfigError("workload.rate_scale", f"must be > 0, got {self.rate_scale!r}")
        if self.generator is not None and self.hash_block_tokens != MOONCAKE_HASH_BLOCK_TOKENS:
            raise ConfigError("workload.hash_block_tokens", "applies to a trace's hash_ids; a generator makes none")
        check_hash_block_tokens(self.hash_block_tokens, "workload.hash_block_tokens")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "workload", *, base_dir: Path | None = None) -> "WorkloadSpec":
        """Parse and check the mapping; every problem is a ConfigError naming its key under ``where``."""
        d = mapping(d, where)
        check_keys(d, _KEYS, where)
        trace = string(d, "trace", where, None)
        fmt = string(d, "format", where, None)
        if fmt is not None:
            check_format(fmt, f"{where}.format")
        generator = GeneratorSpec.from_dict(d["generator"], f"{where}.generator") if d.get("generator") is not None else None
        if (trace is None) == (generator is None):
            raise ConfigError(f"{where}.trace", "give exactly one of trace and generator")
        if generator is not None:
            for key in ("format", "arrival", "skip_bad_rows", "failed_requests", "hash_block_tokens"):
                if d.get(key) is not None:
                    raise ConfigError(f"{where}.{key}", "applies to a trace; a generator sets arrivals and lengths per class")
        return cls(
            trace=trace,
            format=fmt,
            generator=generator,
            classes=ClassRules.from_dict(d["classes"], f"{where}.classes") if d.get("classes") is not None else None,
            arrival=ArrivalSpec.from_dict(d["arrival"], f"{where}.arrival") if d.get("arrival") is not None else None,
            window=TimeWindow.from_dict(d["window"], f"{where}.window") if d.get("window") is not None else None,
            rate_scale=number(d, "rate_scale", where, 1.0, positive=True),
            max_model_len=number(d, "max_model_len", where, None, integer=True, minimum=2),
            max_requests=number(d, "max_requests", where, None, integer=True, minimum=1),
            skip_bad_rows=boolean(d, "skip_bad_rows", where, False),
            failed_requests=string(d, "failed_requests", where, "keep", FAILED_POLICIES),
            hash_block_tokens=number(d, "hash_block_tokens", where, MOONCAKE_HASH_BLOCK_TOKENS, integer=True,
                                     minimum=1, maximum=MAX_HASH_BLOCK_TOKENS),
            seed=number(d, "seed", where, 0, integer=True, minimum=0),
            base_dir=base_dir,
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.trace is not None:
            out["trace"] = self.trace
        if self.format is not None:
            out["format"] = self.format
        if self.generator is not None:
            out["generator"] = self.generator.to_dict()
        if self.classes is not None:
            out["classes"] = self.classes.to_dict()
        if self.arrival is not None:
            out["arrival"] = self.arrival.to_dict()
        if self.window is not None:
            out["window"] = self.window.to_dict()
        if self.rate_scale != 1.0:
            out["rate_scale"] = self.rate_scale
        for key in ("max_model_len", "max_requests"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.skip_bad_rows:
            out["skip_bad_rows"] = True
        if self.failed_requests != "keep":
            out["failed_requests"] = self.failed_requests
        if self.hash_block_tokens != MOONCAKE_HASH_BLOCK_TOKENS:
            out["hash_block_tokens"] = self.hash_block_tokens
        out["seed"] = self.seed
        return out

    def trace_path(self) -> Path | None:
        return resolve_trace_path(self.trace, self.base_dir) if self.trace is not None else None

    def build(self, seed: int | None = None) -> Workload:
        """The workload; ``seed`` (default: the spec's) drives generated arrivals and lengths."""
        seed = self.seed if seed is None else seed
        if self.generator is not None:
            workload = generate(self.generator, seed, classes=self.classes, base_dir=self.base_dir)
        else:
            path = self.trace_path()
            assert path is not None
            parsed = read_rows(path, self.format, skip_bad_rows=self.skip_bad_rows,
                               failed_requests=self.failed_requests)
            # A length-only trace needs its arrivals before a window can cut it; a timed one is cut first.
            workload = from_rows(parsed, classes=self.classes, arrival=None if parsed.timed else self.arrival,
                                 seed=seed)
            if self.window is not None:
                workload = workload.window(self.window.start_s, self.window.end_s)
            if self.arrival is not None and parsed.timed:
                workload = replace_arrivals(workload, self.arrival, seed)
        if self.generator is not None and self.window is not None:
            workload = workload.window(self.window.start_s, self.window.end_s)
        if self.rate_scale != 1.0:
            workload = workload.scale_rate(self.rate_scale)
        if self.max_model_len is not None:
            workload = cap_max_model_len(workload, self.max_model_len)
        if self.max_requests is not None:
            workload = workload.head(self.max_requests)
        if len(workload) == 0:
            raise ConfigError("workload.window", f"no requests left in {workload.source} after window/max_model_len")
        if self.hash_block_tokens != workload.hash_block_tokens:
            workload = workload.with_hash_block_tokens(self.hash_block_tokens)
        return workload

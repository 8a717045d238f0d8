"""Class rules: which requests belong to which class, and each class's SLO and client behaviour.

Rules are tried in order; the first whose match holds names the row's class. Rows no rule matches go to the
``default`` class and are counted, so a typo in a rule shows up as a large unmatched count instead of a silent
misclassification.

YAML (under ``workload: classes:``)::

    chat:
      match: {trace_class: conv}              # column value; a list means any of; all keys must hold
      slo: {ttft_p99_s: 2.0, tpot_p99_s: 0.1}
      timeout_s: 120
      cancel_probability: 0.02
      cancel_after_s: [1, 30]
      priority: 0
    long_prompts:
      match: {prompt_tokens: {min: 4096}}     # range: min inclusive, max exclusive
    batch:
      match: [{Model: GPT-4}, {Log Type: API log}]   # a list of matches: any of them
    code: {}                                  # no match: rows whose class / trace_class is "code"
    default:                                  # optional: the SLOs of unmatched rows (no match allowed)
      slo: {e2e_p99_s: 300}
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
import pandas as pd

from sim.errors import ConfigError
from sim.fields import check_keys, mapping, number
from sim.workload.classes import DEFAULT_CLASS, SLO, RequestClass

_CLASS_KEYS = ("match", "slo", "timeout_s", "cancel_probability", "cancel_after_s", "priority")
_SLO_KEYS = ("ttft_p99_s", "tpot_p99_s", "e2e_p99_s")
#: Columns that hold a trace's own class label, in order of preference.
SOURCE_CLASS_COLUMNS = ("class", "trace_class")


@dataclass(frozen=True)
class Condition:
    """One column test: value in ``values``, or ``low <= value < high`` (either bound may be open)."""

    column: str
    values: tuple[Any, ...] | None = None
    low: float | None = None
    high: float | None = None

    def to_yaml(self) -> Any:
        if self.values is not None:
            return self.values[0] if len(self.values) == 1 else list(self.values)
        out: dict[str, float] = {}
        if self.low is not None:
            out["min"] = self.low
        if self.high is not None:
            out["max"] = self.high
        return out


@dataclass(frozen=True)
class ClassRule:
    """A class and the matches that select its rows (any of; each match's conditions all hold).

    No matches: the rule selects rows whose own class label (``class`` or ``trace_class`` column) is its name.
    """

    request_class: RequestClass
    matches: tuple[tuple[Condition, ...], ...] = ()


def _normal(name: str) -> str:
    return re.sub(r"[^0-9a-z]+", "_", str(name).lower()).strip("_")


def resolve_column(frame: pd.DataFrame, column: str, where: str) -> str:
    """The frame's column for a rule key; ``log_type`` finds ``Log Type``, ``model`` finds ``Model``."""
    if column in frame.columns:
        return column
    wanted = _normal(column)
    for c in frame.columns:
        if _normal(c) == wanted:
            return str(c)
    raise ConfigError(where, f"the trace has no column {column!r} (columns: {[str(c) for c in frame.columns]})")


def source_class_column(frame: pd.DataFrame) -> str | None:
    return next((c for c in SOURCE_CLASS_COLUMNS if c in frame.columns), None)


def _condition_mask(frame: pd.DataFrame, cond: Condition, where: str) -> np.ndarray:
    column = resolve_column(frame, cond.column, f"{where}.{cond.column}")
    series = frame[column]
    numeric = pd.api.types.is_numeric_dtype(series.dtype) and not pd.api.types.is_bool_dtype(series.dtype)
    if cond.values is not None:
        if numeric:
            try:
                wanted = [float(v) for v in cond.values]
            except (TypeError, ValueError):
                raise ConfigError(f"{where}.{cond.column}", f"column {column!r} is numeric; cannot match {list(cond.values)!r}") from None
            return np.isin(series.to_numpy(dtype=float), wanted)
        return series.astype("string").isin([str(v) for v in cond.values]).to_numpy(dtype=bool, na_value=False)
    if not numeric:
        raise ConfigError(f"{where}.{cond.column}", f"a min/max range needs a numeric column; {column!r} is not")
    values = series.to_numpy(dtype=float)
    mask = np.ones(len(values), dtype=bool)
    if cond.low is not None:
        mask &= values >= cond.low
    if cond.high is not None:
        mask &= values < cond.high
    return mask


def _parse_condition(column: str, value: Any, where: str) -> Condition:
    if isinstance(value, Mapping):
        check_keys(value, ("min", "max"), where)
        if not value:
            raise ConfigError(where, "a range needs min, max or both")
        low = number(value, "min", where, None)
        high = number(value, "max", where, None)
        if low is not None and high is not None and not low < high:
            raise ConfigError(where, f"min ({low:g}) must be below max ({high:g})")
        return Condition(column, None, low, high)
    values = tuple(value) if isinstance(value, (list, tuple)) else (value,)
    if not values:
        raise ConfigError(where, "an empty list matches nothing")
    for v in values:
        if not isinstance(v, (str, int, float)) or isinstance(v, bool):
            raise ConfigError(where, f"match values must be strings or numbers, got {v!r}")
    return Condition(column, values)


def _parse_match(value: Any, where: str) -> tuple[Condition, ...]:
    value = mapping(value, where)
    if not value:
        raise ConfigError(where, "an empty match would match every row; leave 'match' out or name a column")
    return tuple(_parse_condition(str(col), v, f"{where}.{col}") for col, v in value.items())


def request_class_from_dict(name: str, d: Mapping[str, Any], where: str) -> RequestClass:
    """A RequestClass from its YAML mapping (``match`` is ignored here)."""
    slo_d = mapping(d.get("slo") or {}, f"{where}.slo")
    check_keys(slo_d, _SLO_KEYS, f"{where}.slo")
    slo = SLO(**{k: number(slo_d, k, f"{where}.slo", None, positive=True) for k in _SLO_KEYS})
    cancel_after = d.get("cancel_after_s", (1.0, 30.0))
    if (not isinstance(cancel_after, (list, tuple)) or len(cancel_after) != 2
            or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in cancel_after)
            or not 0 <= cancel_after[0] <= cancel_after[1]):
        raise ConfigError(f"{where}.cancel_after_s", f"must be [low, high] seconds with 0 <= low <= high, got {cancel_after!r}")
    return RequestClass(
        name=name,
        slo=slo,
        timeout_s=number(d, "timeout_s", where, None, positive=True),
        cancel_probability=number(d, "cancel_probability", where, 0.0, minimum=0.0, maximum=1.0),
        cancel_after_s=(float(cancel_after[0]), float(cancel_after[1])),
        priority=number(d, "priority", where, 0, integer=True),
    )


def request_class_to_dict(cls: RequestClass) -> dict[str, Any]:
    out: dict[str, Any] = {}
    slo = {k: getattr(cls.slo, k) for k in _SLO_KEYS if getattr(cls.slo, k) is not None}
    if slo:
        out["slo"] = slo
    if cls.timeout_s is not None:
        out["timeout_s"] = cls.timeout_s
    if cls.cancel_probability:
        out["cancel_probability"] = cls.cancel_probability
        out["cancel_after_s"] = list(cls.cancel_after_s)
    if cls.priority:
        out["priority"] = cls.priority
    return out


@dataclass(frozen=True)
class ClassRules:
    """Ordered class rules plus the default class that takes unmatched rows."""

    rules: tuple[ClassRule, ...] = ()
    default: RequestClass = field(default_factory=lambda: RequestClass(DEFAULT_CLASS))

    def __post_init__(self) -> None:
        names = [r.request_class.name for r in self.rules]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ConfigError("classes", f"class names must be unique, repeated: {dupes}")
        if self.default.name in names:
            raise ConfigError(f"classes.{self.default.name}", "the default class takes unmatched rows; it has no match")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "classes") -> "ClassRules":
        d = mapping(d, where)
        rules: list[ClassRule] = []
        default = RequestClass(DEFAULT_CLASS)
        for name, body in d.items():
            here = f"{where}.{name}"
            body = mapping(body if body is not None else {}, here)
            check_keys(body, _CLASS_KEYS, here)
            if not isinstance(name, str) or not name:
                raise ConfigError(here, "class names must be non-empty strings")
            request_class = request_class_from_dict(name, body, here)
            if name == DEFAULT_CLASS:
                if "match" in body:
                    raise ConfigError(f"{here}.match", "the default class takes the rows no rule matches; it has no match")
                default = request_class
                continue
            raw = body.get("match")
            if raw is None:
                matches: tuple[tuple[Condition, ...], ...] = ()
            elif isinstance(raw, list):
                if not raw:
                    raise ConfigError(f"{here}.match", "an empty list matches nothing")
                matches = tuple(_parse_match(m, f"{here}.match[{i}]") for i, m in enumerate(raw))
            else:
                matches = (_parse_match(raw, f"{here}.match"),)
            rules.append(ClassRule(request_class, matches))
        return cls(tuple(rules), default)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for rule in self.rules:
            body = request_class_to_dict(rule.request_class)
            if rule.matches:
                ms = [{c.column: c.to_yaml() for c in m} for m in rule.matches]
                body = {"match": ms[0] if len(ms) == 1 else ms, **body}
            out[rule.request_class.name] = body
        default = request_class_to_dict(self.default)
        if default:
            out[self.default.name] = default
        return out

    def classes(self) -> dict[str, RequestClass]:
        out = {r.request_class.name: r.request_class for r in self.rules}
        out[self.default.name] = self.default
        return out

    def assign(self, frame: pd.DataFrame, where: str = "classes") -> tuple[np.ndarray, int]:
        """Class name per row, and how many rows fell to the default class."""
        n = len(frame)
        names = np.full(n, self.default.name, dtype=object)
        free = np.ones(n, dtype=bool)
        for rule in self.rules:
            name = rule.request_class.name
            here = f"{where}.{name}"
            if rule.matches:
                hit = np.zeros(n, dtype=bool)
                for i, conditions in enumerate(rule.matches):
                    m = np.ones(n, dtype=bool)
                    for cond in conditions:
                        m &= _condition_mask(frame, cond, f"{here}.match" + (f"[{i}]" if len(rule.matches) > 1 else ""))
                    hit |= m
            else:
                column = source_class_column(frame)
                if column is None:
                    raise ConfigError(f"{here}.match", "is required: the trace has no class or trace_class column "
                                      "to take the class name from")
                hit = frame[column].astype("string").eq(name).to_numpy(dtype=bool, na_value=False)
            hit &= free
            names[hit] = name
            free &= ~hit
        return names, int(free.sum())


def auto_classes(frame: pd.DataFrame) -> tuple[np.ndarray, dict[str, RequestClass], int]:
    """Without rules: the ``class`` column, else ``trace_class``, else everything ``default``.

    Returns names, plain classes (no SLOs), and the rows with an empty label (sent to ``default``).
    """
    column = source_class_column(frame)
    if column is None:
        names = np.full(len(frame), DEFAULT_CLASS, dtype=object)
        return names, {DEFAULT_CLASS: RequestClass(DEFAULT_CLASS)}, 0
    labels = frame[column].astype("string").str.strip()
    empty = (labels.isna() | (labels == "")).to_numpy(dtype=bool, na_value=True)
    names = np.where(empty, DEFAULT_CLASS, labels.fillna("").to_numpy(dtype=object)).astype(object)
    return names, {str(n): RequestClass(str(n)) for n in pd.unique(names)}, int(empty.sum())

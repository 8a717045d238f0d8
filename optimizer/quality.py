"""Quality notes for the knobs that lower numeric precision (``kv_cache_dtype`` fp8*, ``quantization: fp8``).

kvtune's simulator measures speed and memory; what lower precision does to the answers is other people's
measurement.  :func:`quality_notes` returns, for a config's knobs, one note per knob that lowers precision: what
it lowers, a summary, the published accuracy deltas on standard benchmarks and caveats, each with its source
(URL, title, date), from ``optimizer/data/quality.yaml``.  Full precision (``kv_cache_dtype: auto``,
``quantization: none``, or the knob unset) gives no note.  A value the data file does not know is not called full
precision: it gets a note saying kvtune has no published figure for it (``known`` False).

A note is a plain dict::

    {"knob": "kv_cache_dtype", "value": "fp8", "known": True,
     "lowers": "...", "summary": "...",
     "findings": [{"model", "benchmark", "baseline", "lowered", "delta", "recovery_pct",
                   "source": {"url", "title", "date"}}, ...],
     "caveats": [{"text", "source": {...}}, ...],
     "sources": [{"url", "title", "date"}, ...]}          # every source the note cites, once, in order

``baseline``/``lowered``/``delta`` (lowered - baseline, in the benchmark's units) are None where the source gives
only ``recovery_pct``, and ``recovery_pct`` is None where it gives the two scores.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from importlib import resources
from typing import Any

import yaml

from sim.errors import ConfigError, short_repr

#: The knobs whose values can lower numeric precision, in the order their notes come.
PRECISION_KNOBS = ("kv_cache_dtype", "quantization")
_WHERE = "optimizer/data/quality.yaml"


def _require(value: Any, kind: type | tuple, where: str) -> Any:
    if isinstance(value, bool) or not isinstance(value, kind) or (isinstance(value, str) and not value.strip()):
        raise ConfigError(f"{_WHERE}: {where}", f"must be {getattr(kind, '__name__', 'a number')}, got "
                                               f"{short_repr(value)}")
    return value


def _source(sources: Mapping, key: Any, where: str) -> dict:
    if key not in sources:
        raise ConfigError(f"{_WHERE}: {where}", f"unknown source {short_repr(key)}")
    return dict(sources[key])


def _finding(raw: Mapping, sources: Mapping, where: str) -> dict:
    out = {"model": _require(raw.get("model"), str, f"{where}.model"),
           "benchmark": _require(raw.get("benchmark"), str, f"{where}.benchmark"),
           "baseline": None, "lowered": None, "delta": None, "recovery_pct": None,
           "source": _source(sources, raw.get("source"), f"{where}.source")}
    if "recovery_pct" in raw:
        out["recovery_pct"] = float(_require(raw["recovery_pct"], (int, float), f"{where}.recovery_pct"))
    else:
        out["baseline"] = float(_require(raw.get("baseline"), (int, float), f"{where}.baseline"))
        out["lowered"] = float(_require(raw.get("lowered"), (int, float), f"{where}.lowered"))
        out["delta"] = out["lowered"] - out["baseline"]
    return out


@functools.cache
def _table() -> dict[str, tuple[frozenset, dict]]:
    """knob -> (full-precision values, {value: note template}), checked once."""
    data = yaml.safe_load(resources.files("optimizer").joinpath("data", "quality.yaml").read_text())
    sources = data["sources"]
    for key, src in sources.items():
        for field in ("url", "title", "date"):
            _require(src.get(field), str, f"sources.{key}.{field}")
        if not src["url"].startswith("https://"):
            raise ConfigError(f"{_WHERE}: sources.{key}.url", f"must be an https URL, got {src['url']!r}")
    table = {}
    for knob in PRECISION_KNOBS:
        entry = data["knobs"][knob]
        notes = {}
        for value, raw in entry["values"].items():
            where = f"knobs.{knob}.values.{value}"
            findings = [_finding(f, sources, f"{where}.findings[{i}]") for i, f in enumerate(raw["findings"])]
            caveats = [{"text": _require(c.get("text"), str, f"{where}.caveats[{i}].text"),
                        "source": _source(sources, c.get("source"), f"{where}.caveats[{i}].source")}
                       for i, c in enumerate(raw.get("caveats") or [])]
            cited = []
            for item in (*findings, *caveats):
                if item["source"] not in cited:
                    cited.append(item["source"])
            notes[str(value)] = {"knob": knob, "value": str(value), "known": True,
                                 "lowers": _require(raw.get("lowers"), str, f"{where}.lowers"),
                                 "summary": _require(raw.get("summary"), str, f"{where}.summary"),
                                 "findings": findings, "caveats": caveats, "sources": cited}
        table[knob] = (frozenset(str(v) for v in entry["full_precision"]), notes)
    return table


def _copy(note: dict) -> dict:
    return {**note, "findings": [{**f, "source": dict(f["source"])} for f in note["findings"]],
            "caveats": [{**c, "source": dict(c["source"])} for c in note["caveats"]],
            "sources": [dict(s) for s in note["sources"]]}


def quality_notes(knobs: Mapping) -> list[dict]:
    """One note per knob of ``knobs`` that lowers precision (see the module docstring); ``[]`` at full
    precision.  A value that is not a string (nor None, unset) is a ``ConfigError`` naming the knob; a string the
    data file does not know gets a note with ``known`` False and no figures."""
    if not isinstance(knobs, Mapping):
        raise ConfigError("knobs", f"must be a mapping of knob names to values, got {short_repr(knobs)}")
    out = []
    for knob in PRECISION_KNOBS:
        value = knobs.get(knob)
        if value is None:
            continue
        if not isinstance(value, str):
            raise ConfigError(knob, f"must be a string, got {short_repr(value)}")
        full, notes = _table()[knob]
        key = value.strip().lower()
        if key in full:
            continue
        if key in notes:
            out.append({**_copy(notes[key]), "value": value})
            continue
        out.append({"knob": knob, "value": value, "known": False,
                    "lowers": f"unknown: {knob}={value!r} is not a value kvtune has quality figures for",
                    "summary": (f"kvtune has no published accuracy figure for {knob}={value!r} and does not assume "
                                f"it is full precision (full precision: {', '.join(sorted(full))}); measure the "
                                f"served model's quality with it before relying on it."),
                    "findings": [], "caveats": [], "sources": []})
    return out


def format_quality_notes(notes: list[dict]) -> str:
    """The notes as plain text, one block per note, each figure with its source (for a report or a terminal)."""
    blocks = []
    for note in notes:
        lines = [f"{note['knob']}={note['value']}: {note['lowers']}", f"  {note['summary']}"]
        for f in note["findings"]:
            if f["recovery_pct"] is not None:
                figure = f"recovery {f['recovery_pct']:g}%"
            else:
                sign = "+" if f["delta"] >= 0 else ""
                figure = f"{f['baseline']:g} -> {f['lowered']:g} ({sign}{f['delta']:.4g})"
            src = f["source"]
            lines.append(f"  - {f['model']}, {f['benchmark']}: {figure} [{src['title']}, {src['date']}, {src['url']}]")
        for c in note["caveats"]:
            src = c["source"]
            lines.append(f"  ! {c['text']} [{src['title']}, {src['date']}, {src['url']}]")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


__all__ = ["PRECISION_KNOBS", "format_quality_notes", "quality_notes"]

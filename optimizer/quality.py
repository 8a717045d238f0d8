"""Quality notes for the knobs that lower numeric precision (``kv_cache_dtype`` fp8*, ``quantization: fp8``).

kvtune's simulator measures speed and memory; what lower precision does to the answers is other people's
measurement.  :func:`quality_notes` returns, for a config's knobs, one note per knob that lowers precision: what
it lowers, a summary, the published accuracy deltas on standard benchmarks and caveats, each with its source
(URL, title, date), from ``optimizer/data/quality.yaml`` (checked once, with :mod:`sim.fields`: a malformed
copy is ``<field path>: must be <expected>, got <value> (in <file>)``).  Full precision (``kv_cache_dtype: auto``,
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

from sim.errors import ConfigError
from sim.fields import at, fail, file_error, in_file, mapping, number, string, to_string
from sim.safe_yaml import read_yaml

#: The knobs whose values can lower numeric precision, in the order their notes come.
PRECISION_KNOBS = ("kv_cache_dtype", "quantization")


def _list(value: Any, field: str, optional: bool = False) -> list:
    if value is None and optional:
        return []
    if not isinstance(value, list):
        raise fail(field, "a list", value)
    return value


def _source(sources: Mapping, raw: Mapping, where: str) -> dict:
    key = string(raw, "source", where)
    if key not in sources:
        raise fail(at(where, "source"), f"a key of sources ({', '.join(map(str, sources))})", key)
    return dict(sources[key])


def _finding(raw: Any, sources: Mapping, where: str) -> dict:
    raw = mapping(raw, where)
    out = {"model": string(raw, "model", where), "benchmark": string(raw, "benchmark", where),
           "baseline": None, "lowered": None, "delta": None, "recovery_pct": None,
           "source": _source(sources, raw, where)}
    if "recovery_pct" in raw:
        out["recovery_pct"] = number(raw, "recovery_pct", where)
    else:
        out["baseline"] = number(raw, "baseline", where)
        out["lowered"] = number(raw, "lowered", where)
        out["delta"] = out["lowered"] - out["baseline"]
    return out


def _note(knob: str, value: str, raw: Any, sources: Mapping, where: str) -> dict:
    raw = mapping(raw, where)
    findings = [_finding(f, sources, at(at(where, "findings"), i))
                for i, f in enumerate(_list(raw.get("findings"), at(where, "findings")))]
    caveats = []
    for i, c in enumerate(_list(raw.get("caveats"), at(where, "caveats"), optional=True)):
        c = mapping(c, at(at(where, "caveats"), i))
        caveats.append({"text": string(c, "text", at(at(where, "caveats"), i)),
                        "source": _source(sources, c, at(at(where, "caveats"), i))})
    cited = []
    for item in (*findings, *caveats):
        if item["source"] not in cited:
            cited.append(item["source"])
    return {"knob": knob, "value": value, "known": True, "lowers": string(raw, "lowers", where),
            "summary": string(raw, "summary", where), "findings": findings, "caveats": caveats, "sources": cited}


def _checked(data: Mapping) -> dict[str, tuple[frozenset, dict]]:
    sources = {}
    for key, src in mapping(data.get("sources"), "sources").items():
        where = at("sources", str(key))
        src = mapping(src, where)
        sources[key] = {field: string(src, field, where) for field in ("url", "title", "date")}
        if not sources[key]["url"].startswith("https://"):
            raise fail(at(where, "url"), "an https URL", sources[key]["url"])
    knobs = mapping(data.get("knobs"), "knobs")
    table = {}
    for knob in PRECISION_KNOBS:
        entry = mapping(knobs.get(knob), at("knobs", knob))
        where = at(at("knobs", knob), "values")
        notes = {str(value): _note(knob, str(value), raw, sources, at(where, str(value)))
                 for value, raw in mapping(entry.get("values"), where).items()}
        full = _list(entry.get("full_precision"), at(at("knobs", knob), "full_precision"))
        table[knob] = (frozenset(to_string(at(at(at("knobs", knob), "full_precision"), i), v)
                                 for i, v in enumerate(full)), notes)
    return table


def _read_table(path: Any) -> dict[str, tuple[frozenset, dict]]:
    """knob -> (full-precision values, {value: note template}) from the quality file at ``path``; a malformed one
    is a ConfigError in the one form (sim.fields), naming ``path``.  The file is kvtune's own (its notes share text
    through YAML aliases), so it is read by sim.safe_yaml's trusted path."""
    data = read_yaml(path, aliases=True)
    if not isinstance(data, Mapping):
        raise file_error(path, f"must be a mapping (sources:, knobs:), got {type(data).__name__}")
    try:
        return _checked(data)
    except ConfigError as exc:
        raise in_file(exc, path) from None


@functools.cache
def _table() -> dict[str, tuple[frozenset, dict]]:
    """The bundled ``optimizer/data/quality.yaml``, checked once."""
    with resources.as_file(resources.files("optimizer").joinpath("data", "quality.yaml")) as path:
        return _read_table(path)


def _copy(note: dict) -> dict:
    return {**note, "findings": [{**f, "source": dict(f["source"])} for f in note["findings"]],
            "caveats": [{**c, "source": dict(c["source"])} for c in note["caveats"]],
            "sources": [dict(s) for s in note["sources"]]}


def quality_notes(knobs: Mapping) -> list[dict]:
    """One note per knob of ``knobs`` that lowers precision (see the module docstring); ``[]`` at full
    precision.  A value that is not a string (nor None, unset) is a ``ConfigError`` naming the knob; a string the
    data file does not know gets a note with ``known`` False and no figures."""
    if not isinstance(knobs, Mapping):
        raise fail("knobs", "a mapping of knob names to values", knobs)
    out = []
    for knob in PRECISION_KNOBS:
        value = knobs.get(knob)
        if value is None:
            continue
        if not isinstance(value, str):
            raise fail(knob, "a string", value)
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

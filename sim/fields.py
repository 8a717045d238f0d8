"""One way to check a field: the getters and checks every kvtune YAML document and config class validates with.

Study specs (``optimizer``), workload specs (``sim.workload``), engine configs (:class:`sim.EngineConfig`) and
device / model files (``sim.profiles``) all check their fields here, so every bad value gives the same error:

    <field path>: must be <what was expected>, got <what was there>[ (in <file>)]

a :class:`~sim.errors.ConfigError` whose ``field`` is the full path (``budget.trials``,
``workload.classes.chat.slo.e2e_p99_s``, ``search.gpu.choices[1]``; :func:`at` joins them) and whose message
says what was expected; :func:`in_file` adds the file once, where a document is read.  An error of the whole file
(unreadable, not valid YAML) has no field path: ``<file>[:<line>]: <problem>`` (:func:`file_error`).  The CLI prints that one
line and exits 2 (``optimizer/cli.py``); nothing here prints or exits.

Why a small module and not pydantic models: the documents are already parsed into frozen dataclasses that the
rest of kvtune (the mypyc-compiled engine among them) takes as they are, and much of the checking is across
fields or against other files (a knob that exists in one vLLM flavor only, a device YAML beside the spec, a
search range within its router's range), which pydantic would take as hand-written validators anyway.  pydantic
would add a second error form (``ValidationError``: several errors, ``loc`` tuples, "Input should be ...") to be
translated into this one, and a second copy of each document's shape beside its dataclass; these getters change
no message users and tests rely on, add no dependency (pydantic is only a transitive one here), and cost one
function call per field, which matters for :class:`~sim.EngineConfig`, built once per trial.

Three kinds of check: getters that read ``d[key]`` from a parsed mapping (:func:`integer`, :func:`number`,
:func:`string`, :func:`boolean`, :func:`mapping`, :func:`check_keys`: an absent or null key gives ``default``, a
required one has none); converters of one value whose path the caller knows (:func:`to_int`, :func:`to_float`,
:func:`to_string`, :func:`to_bool`: a list item, a search range's bound), which the getters use; and value checks
for a dataclass's ``__post_init__`` (:func:`int_in`, :func:`float_in`, :func:`one_of`), which never convert: a
wrong type is an error, not a silent fix.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from typing import Any, Collection, Iterable

from sim.errors import ConfigError, short_repr

__all__ = ["MAX_INT", "REQUIRED", "at", "boolean", "check_keys", "fail", "file_error", "float_in", "in_file", "int_in",
           "integer", "mapping", "message_of", "kind_words", "number", "one_of", "reroot", "string", "to_bool", "to_float", "to_int",
           "to_string", "unknown"]

#: Whole numbers beyond this are refused (none is meaningful; larger ones overflow numpy and SQLite).
MAX_INT = 2**53


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


#: The ``default`` of a key that must be given.
REQUIRED: Any = _Required()


def at(where: str, key: str | int) -> str:
    """The path of ``key`` under ``where``: ``a.b``, ``a[3]`` for a list index, ``b`` at the top (``where`` "")."""
    if isinstance(key, int):
        return f"{where}[{key}]"
    return f"{where}.{key}" if where else str(key)


def _bound(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"


def fail(field: str, expected: str, value: Any) -> ConfigError:
    """The one error form: ``<field>: must be <expected>, got <value>`` (the value cut to one line's worth)."""
    return ConfigError(field, f"must be {expected}, got {short_repr(value)}")


_KIND_WORDS = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string", "None": "null"}


def kind_words(annotation: str) -> str:
    """A field's type annotation as its error says what was expected: ``"int | None"`` -> ``"an integer or
    null"``, ``"bool | None"`` -> ``"true or false, or null"``, ``"Literal['a', 'b']"`` -> ``"one of ['a', 'b']"``
    (a kind it does not know stays as written)."""
    words = []
    for part in (p.strip() for p in annotation.split("|")):
        if part.startswith("Literal[") and part.endswith("]"):
            words.append(f"one of [{part[len('Literal['):-1]}]")
        else:
            words.append(_KIND_WORDS.get(part, part))
    if len(words) == 1:
        return words[0]
    head = ", ".join(words[:-1])
    return f"{head}, or {words[-1]}" if any(" or " in w for w in words[:-1]) else f"{head} or {words[-1]}"


def message_of(exc: ConfigError) -> str:
    """What ``exc`` says about its field (its text without the ``<field>: `` prefix)."""
    return exc.message


def reroot(exc: ConfigError, where: str, strip: str = "") -> ConfigError:
    """``exc`` with its field put under ``where`` (``strip`` first removed from its front): an error raised by a
    nested document or dataclass (``timeout_s``) named by its place in the enclosing one (``classes.x.timeout_s``)."""
    field = exc.field[len(strip):] if strip and exc.field.startswith(strip) else exc.field
    out = ConfigError(at(where, field) if field else where, exc.message)
    if getattr(exc, "file", None) is not None:
        out.file = exc.file  # type: ignore[attr-defined]
    return out


def in_file(exc: ConfigError, path: Any) -> ConfigError:
    """``exc`` naming the file it was read from: ``<field>: <message> (in <path>)``.  An error that already names
    its file (one raised while reading another file the document points at, such as a device YAML a spec names)
    keeps that file: it is the one at fault."""
    if getattr(exc, "file", None) is not None:
        return exc
    out = ConfigError(exc.field, f"{exc.message} (in {path})")
    out.file = str(path)  # type: ignore[attr-defined]
    return out


def file_error(path: Any, message: str, line: int | None = None) -> ConfigError:
    """An error of a whole file (unreadable, not valid YAML or JSON, not a mapping): ``<file>[:<line>]: <message>``.
    It names its file, so :func:`in_file` leaves it as it is."""
    out = ConfigError(f"{path}:{line}" if line is not None else str(path), message)
    out.file = str(path)  # type: ignore[attr-defined]
    return out


# ---- getters: d[key] from a parsed document ----------------------------------------------------------------------
def mapping(value: Any, where: str, *, optional: bool = False) -> Mapping[str, Any]:
    """``value`` if it is a mapping (``{}`` for ``None`` when ``optional``)."""
    if value is None and optional:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(where, f"must be a mapping, got {type(value).__name__} {short_repr(value)}")
    return value


def check_keys(d: Mapping[str, Any], allowed: Collection[str], where: str, what: str = "key") -> None:
    """Every key of ``d`` is in ``allowed`` (a collection: tuple, list, set or dict); an unknown one is an error that
    suggests the closest."""
    for key in d:
        if key not in allowed:
            raise unknown(at(where, str(key)), key, allowed, what)


def unknown(field: str, key: Any, allowed: Iterable[str], what: str = "key") -> ConfigError:
    """The error for a name that is none of ``allowed``: the closest suggested, every one listed."""
    names = [str(name) for name in allowed]
    close = difflib.get_close_matches(str(key), names, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ConfigError(field, f"unknown {what}{hint}; expected one of {names}")


def _given(d: Mapping[str, Any], key: str, field: str, default: Any) -> Any:
    value = d.get(key)
    if value is None and default is REQUIRED:
        raise ConfigError(field, "is required")
    return value


def integer(d: Mapping[str, Any], key: str, where: str, default: Any = REQUIRED, minimum: int | None = None,
            maximum: int | None = None) -> Any:
    """``d[key]`` as an int (:func:`to_int`), ``default`` when absent or null."""
    field = at(where, key)
    value = _given(d, key, field, default)
    return default if value is None else to_int(field, value, minimum, maximum)


def number(d: Mapping[str, Any], key: str, where: str, default: Any = REQUIRED, *, minimum: float | None = None,
           positive: bool = False, integer: bool = False, maximum: float | None = None) -> Any:
    """``d[key]`` as a finite float (:func:`to_float`), ``default`` when absent or null."""
    field = at(where, key)
    value = _given(d, key, field, default)
    if value is None:
        return default
    return to_float(field, value, minimum=minimum, maximum=maximum, positive=positive, integer=integer)


def string(d: Mapping[str, Any], key: str, where: str, default: Any = REQUIRED,
           choices: Iterable[str] | None = None) -> Any:
    """``d[key]``, a non-empty string (:func:`to_string`), ``default`` when absent or null."""
    field = at(where, key)
    value = _given(d, key, field, default)
    return default if value is None else to_string(field, value, choices)


def boolean(d: Mapping[str, Any], key: str, where: str, default: Any = REQUIRED) -> Any:
    """``d[key]``, ``true`` or ``false`` (:func:`to_bool`), ``default`` when absent or null."""
    field = at(where, key)
    value = _given(d, key, field, default)
    return default if value is None else to_bool(field, value)


# ---- converters: one value whose field path the caller knows (a list item, a search range's low) -----------------
def to_int(field: str, value: Any, minimum: int | None = None, maximum: int | None = None) -> int:
    """``value`` as an int (a whole float such as ``64.0`` is taken as its int), at most :data:`MAX_INT` in size,
    within the bounds."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and (not math.isfinite(value) or not value.is_integer())):
        raise fail(field, "a whole number", value)
    value = int(value)
    if abs(value) > MAX_INT:
        raise ConfigError(field, f"is out of range: must be at most {MAX_INT} in size, got {short_repr(value)}")
    if minimum is not None and value < minimum:
        raise fail(field, f">= {minimum}", value)
    if maximum is not None and value > maximum:
        raise fail(field, f"<= {maximum}", value)
    return value


def to_float(field: str, value: Any, *, minimum: float | None = None, maximum: float | None = None,
             positive: bool = False, integer: bool = False) -> Any:
    """``value`` as a finite float (an int with ``integer``), within the bounds (``positive``: > 0)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise fail(field, "a number", value)
    try:
        as_float = float(value)
    except OverflowError:  # an int beyond any float
        raise fail(field, "a finite number", value) from None
    if not math.isfinite(as_float):
        raise fail(field, "a finite number", value)
    if integer:
        if not as_float.is_integer():
            raise fail(field, "a whole number", value)
        value = int(value)
    else:
        value = as_float
    if positive and not value > 0:
        raise fail(field, "> 0", value)
    if minimum is not None and value < minimum:
        raise fail(field, f">= {_bound(minimum)}", value)
    if maximum is not None and value > maximum:
        raise fail(field, f"<= {_bound(maximum)}", value)
    return value


def to_string(field: str, value: Any, choices: Iterable[str] | None = None) -> str:
    """``value``, a non-empty string (one of ``choices`` when given)."""
    if not isinstance(value, str) or not value.strip():
        raise fail(field, "a non-empty string", value)
    if choices is not None:
        one_of(field, value, tuple(choices))
    return value


def to_bool(field: str, value: Any) -> bool:
    """``value``, ``true`` or ``false`` (no ``"yes"``, no ``1``)."""
    if not isinstance(value, bool):
        raise fail(field, "true or false", value)
    return value


# ---- value checks: a dataclass's own fields (cheap: EngineConfig runs them once per trial) -----------------------
def int_in(field: str, value: Any, low: int, high: int) -> None:
    """``value`` is an int (not a bool, not a float) in ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise fail(field, "an integer", value)
    if not low <= value <= high:
        raise fail(field, f"in [{low}, {high}]", value)


def float_in(field: str, value: Any, low: float, high: float) -> None:
    """``value`` is a finite int or float (not a bool) in ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise fail(field, "a number", value)
    if not low <= value <= high:
        raise fail(field, f"in [{low}, {high}]", value)


def one_of(field: str, value: Any, choices: tuple) -> None:
    """``value`` is one of ``choices``; ``true``/``false`` only where a choice is a bool (``True == 1``)."""
    if value not in choices or ((value is True or value is False)
                                and not any(c is True or c is False for c in choices)):
        raise fail(field, f"one of {list(choices)}", value)

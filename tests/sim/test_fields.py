"""sim.fields, the one validation layer: each getter's accepted values, its error text, and (a property over
arbitrary values and paths) that every error names the full field path and says what was expected."""

from __future__ import annotations

import math
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim import fields
from sim.errors import ConfigError

# ---- getters -------------------------------------------------------------------------------------------------------


def test_at_joins_paths():
    assert fields.at("", "trials") == "trials"
    assert fields.at("budget", "trials") == "budget.trials"
    assert fields.at("gpu", 2) == "gpu[2]"


@pytest.mark.parametrize("d, kwargs, expected", [
    ({"n": 3}, {}, 3),
    ({"n": 64.0}, {}, 64),  # a whole float is its int
    ({}, {"default": 7}, 7),
    ({"n": None}, {"default": None}, None),
    ({"n": -5}, {"default": 0}, -5),
])
def test_integer_accepts(d, kwargs, expected):
    value = fields.integer(d, "n", "w", **kwargs)
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize("value, kwargs, text", [
    (True, {}, "w.n: must be a whole number, got True"),
    (2.5, {}, "w.n: must be a whole number, got 2.5"),
    (math.nan, {}, "w.n: must be a whole number, got nan"),
    ("3", {}, "w.n: must be a whole number, got '3'"),
    (2**60, {}, "w.n: is out of range: must be at most 9007199254740992 in size"),
    (0, {"minimum": 1}, "w.n: must be >= 1, got 0"),
    (2**32, {"maximum": 2**32 - 1}, "w.n: must be <= 4294967295, got 4294967296"),
])
def test_integer_refuses(value, kwargs, text):
    with pytest.raises(ConfigError) as err:
        fields.integer({"n": value}, "n", "w", **kwargs)
    assert str(err.value).startswith(text)
    assert err.value.field == "w.n"


def test_required_keys():
    for getter in (fields.integer, fields.number, fields.string, fields.boolean):
        with pytest.raises(ConfigError, match=r"^classes\.x\.match: is required$"):
            getter({"match": None}, "match", "classes.x")


@pytest.mark.parametrize("value, kwargs, text", [
    ("fast", {}, "r.v: must be a number, got 'fast'"),
    (math.inf, {}, "r.v: must be a finite number, got inf"),
    (False, {}, "r.v: must be a number, got False"),
    (0, {"positive": True}, "r.v: must be > 0, got 0.0"),
    (-0.5, {"minimum": 0.0}, "r.v: must be >= 0, got -0.5"),
    (1.5, {"maximum": 1.0}, "r.v: must be <= 1, got 1.5"),
    (2.5, {"integer": True}, "r.v: must be a whole number, got 2.5"),
])
def test_number_refuses(value, kwargs, text):
    with pytest.raises(ConfigError) as err:
        fields.number({"v": value}, "v", "r", **kwargs)
    assert str(err.value) == text


def test_a_number_beyond_any_float_is_one_error():
    with pytest.raises(ConfigError, match=r"^r\.v: must be a finite number, got 1000"):
        fields.number({"v": 10**400}, "v", "r")
    with pytest.raises(ConfigError, match=r"^r\.v: is out of range"):
        fields.integer({"v": 10**400}, "v", "r")


def test_number_types():
    assert fields.number({"v": 3}, "v", "r") == 3.0 and type(fields.number({"v": 3}, "v", "r")) is float
    assert type(fields.number({"v": 3.0}, "v", "r", integer=True)) is int


@pytest.mark.parametrize("value, text", [
    ("", "s.k: must be a non-empty string, got ''"),
    ("  ", "s.k: must be a non-empty string, got '  '"),
    (3, "s.k: must be a non-empty string, got 3"),
    ("gp2", "s.k: must be one of ['tpe', 'gp'], got 'gp2'"),
])
def test_string_refuses(value, text):
    with pytest.raises(ConfigError) as err:
        fields.string({"k": value}, "k", "s", choices=("tpe", "gp"))
    assert str(err.value) == text


def test_boolean():
    assert fields.boolean({}, "b", "w", False) is False
    assert fields.boolean({"b": True}, "b", "w", False) is True
    with pytest.raises(ConfigError, match=r"^w\.b: must be true or false, got 'yes'$"):
        fields.boolean({"b": "yes"}, "b", "w", False)


def test_mapping_and_keys():
    assert fields.mapping(None, "engine", optional=True) == {}
    with pytest.raises(ConfigError, match=r"^engine: must be a mapping, got list \[1\]$"):
        fields.mapping([1], "engine")
    with pytest.raises(ConfigError, match=r"^budget\.trails: unknown key \(did you mean 'trials'\?\); expected one of "
                                          r"\['trials', 'workers'\]$"):
        fields.check_keys({"trials": 1, "trails": 2}, ("trials", "workers"), "budget")
    with pytest.raises(ConfigError, match=r"^zzz: unknown knob; expected"):
        fields.check_keys({"zzz": 1}, ("trials",), "", what="knob")


def test_unknown_suggests_and_lists():
    err = fields.unknown("engine.max_num_seq", "max_num_seq", ("max_num_seqs", "block_size"), "engine knob")
    assert str(err) == ("engine.max_num_seq: unknown engine knob (did you mean 'max_num_seqs'?); expected one of "
                        "['max_num_seqs', 'block_size']")


def test_a_huge_value_is_cut_to_one_line():
    with pytest.raises(ConfigError) as err:
        fields.string({"k": list(range(10_000))}, "k", "w")
    assert len(str(err.value)) < 200 and "\n" not in str(err.value)


# ---- value checks --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("check, value, text", [
    (lambda v: fields.int_in("max_num_seqs", v, 1, 4096), 64.0, "max_num_seqs: must be an integer, got 64.0"),
    (lambda v: fields.int_in("max_num_seqs", v, 1, 4096), True, "max_num_seqs: must be an integer, got True"),
    (lambda v: fields.int_in("max_num_seqs", v, 1, 4096), 0, "max_num_seqs: must be in [1, 4096], got 0"),
    (lambda v: fields.float_in("watermark", v, 0.0, 0.5), 0.7, "watermark: must be in [0.0, 0.5], got 0.7"),
    (lambda v: fields.float_in("watermark", v, 0.0, 0.5), math.nan, "watermark: must be a number, got nan"),
    (lambda v: fields.one_of("tensor_parallel_size", v, (1, 2, 4, 8)), 3,
     "tensor_parallel_size: must be one of [1, 2, 4, 8], got 3"),
    (lambda v: fields.one_of("tensor_parallel_size", v, (1, 2, 4, 8)), True,
     "tensor_parallel_size: must be one of [1, 2, 4, 8], got True"),
])
def test_value_checks(check, value, text):
    with pytest.raises(ConfigError) as err:
        check(value)
    assert str(err.value) == text


def test_value_checks_pass_good_values():
    fields.int_in("n", 4096, 1, 4096)
    fields.float_in("x", 0, 0.0, 0.5)
    fields.one_of("dtype", "fp8", ("auto", "fp8"))
    fields.one_of("flag", True, (True, False))


@pytest.mark.parametrize("annotation, words", [
    ("int | None", "an integer or null"),
    ("float", "a number"),
    ("bool | None", "true or false, or null"),
    ("Literal['recompute', 'swap'] | None", "one of ['recompute', 'swap'] or null"),
])
def test_kind_words(annotation, words):
    assert fields.kind_words(annotation) == words


@pytest.mark.parametrize("key, value, text", [
    ("max_num_seqs", "abc", "engine.max_num_seqs: must be an integer or null, got 'abc'"),
    ("enable_prefix_caching", "maybe", "engine.enable_prefix_caching: must be true or false, or null, got 'maybe'"),
    ("swap_space_gb", "lots", "engine.swap_space_gb: must be a number or null, got 'lots'"),
])
def test_an_engine_knob_that_cannot_be_read_says_what_it_must_be_in_words(key, value, text):
    """``--set`` strings and YAML scalars of an EngineConfig: no Python annotation (``int | None``) in the error."""
    from sim.engine.config import EngineConfig

    with pytest.raises(ConfigError) as err:
        EngineConfig.from_dict({key: value})
    assert str(err.value) == text


# ---- re-rooting and files ------------------------------------------------------------------------------------------


def test_reroot_and_in_file():
    inner = ConfigError("timeout_s", "must be > 0, got 0")
    moved = fields.reroot(inner, "classes.x")
    assert str(moved) == "classes.x.timeout_s: must be > 0, got 0"
    assert str(fields.reroot(ConfigError("engine.block_size", "m"), "", strip="engine.")) == "block_size: m"
    spec = fields.in_file(moved, "study.yaml")
    assert str(spec) == "classes.x.timeout_s: must be > 0, got 0 (in study.yaml)"
    # The file named first is the one at fault: a device YAML a spec points at keeps its own name.
    assert str(fields.in_file(fields.reroot(spec, "workload"), "outer.yaml")) == \
        "workload.classes.x.timeout_s: must be > 0, got 0 (in study.yaml)"
    assert pickle.loads(pickle.dumps(spec)).field == spec.field  # crosses a process (Ray) intact
    whole = fields.file_error("dev.yaml", "not valid YAML (found ':')", line=3)
    assert str(whole) == "dev.yaml:3: not valid YAML (found ':')"
    assert fields.in_file(whole, "study.yaml") is whole  # names its file already


# ---- the property: every error names its field path and what was expected ----------------------------------------

_keys = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12)
_paths = st.lists(_keys, max_size=3).map(".".join)
_values = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True),
                    st.text(max_size=20), st.lists(st.integers(), max_size=3), st.dictionaries(_keys, st.integers(),
                                                                                               max_size=2))
_getters = [
    lambda d, k, w: fields.integer(d, k, w, minimum=0, maximum=100),
    lambda d, k, w: fields.number(d, k, w, positive=True, maximum=10.0),
    lambda d, k, w: fields.number(d, k, w, integer=True, minimum=1),
    lambda d, k, w: fields.string(d, k, w, choices=("a", "b")),
    lambda d, k, w: fields.boolean(d, k, w),
    lambda d, k, w: fields.check_keys(d, ("only",), w),
    lambda d, k, w: fields.mapping(d[k], fields.at(w, k)),
    lambda d, k, w: fields.int_in(fields.at(w, k), d[k], 1, 8),
    lambda d, k, w: fields.float_in(fields.at(w, k), d[k], 0.0, 1.0),
    lambda d, k, w: fields.one_of(fields.at(w, k), d[k], (1, 2, 4, 8)),
]


@settings(max_examples=300, deadline=None)
@given(where=_paths, key=_keys, value=_values, getter=st.sampled_from(range(len(_getters))))
def test_every_error_names_its_field_path(where, key, value, getter):
    try:
        _getters[getter]({key: value}, key, where)
    except ConfigError as exc:
        path = fields.at(where, key)
        assert exc.field == path
        text = str(exc)
        assert text.startswith(f"{path}: ")
        assert any(word in exc.message for word in ("must be", "is required", "expected one of")), text
        assert "\n" not in text and len(text) < 400

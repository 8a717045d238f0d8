"""sim.safe_yaml.read_yaml: every problem is the one whole-file form of sim.fields.file_error,
'<file>[:<line>]: <problem>', naming the file (issue 33)."""

from __future__ import annotations

import pytest

from sim import safe_yaml
from sim.errors import ConfigError
from sim.safe_yaml import read_yaml


def _error(path) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        read_yaml(path)
    assert getattr(info.value, "file", None) == str(path)  # names its file: sim.fields.in_file leaves it
    return info.value


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("a: 1\nb: c: d\n", "{p}:2: not valid YAML: mapping values are not allowed here"),
        ("a: [1, 2\n", "{p}:2: not valid YAML: expected ',' or ']', but got '<stream end>'"),
        ("a: &x 1\nb: *x\n",
         "{p}:2: not valid YAML: aliases (*name) are not allowed in kvtune files; write the values out"),
        ("a: " + "[" * 100 + "]" * 100 + "\n", "{p}:1: not valid YAML: nested deeper than 64 levels"),
        (b"a: \xff\n", "{p}: not UTF-8 text (byte 3: b'\\xff')"),
        (b"a: 1\x00\n", "{p}: not a text file (it holds NUL bytes)"),
    ],
)
def test_read_yaml_errors_are_the_whole_file_form(tmp_path, content, expected):
    path = tmp_path / "f.yaml"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    exc = _error(path)
    assert str(exc) == expected.format(p=path)
    assert exc.field == expected.format(p=path).split(": ", 1)[0]


def test_an_unreadable_or_oversized_file(tmp_path, monkeypatch):
    gone = tmp_path / "gone.yaml"
    exc = _error(gone)
    assert str(exc).startswith(f"{gone}: cannot read: ") and isinstance(exc.__cause__, OSError)
    big = tmp_path / "big.yaml"
    big.write_text("a: 1\n")
    monkeypatch.setattr(safe_yaml, "MAX_BYTES", 2)
    exc = _error(big)
    assert str(exc) == f"{big}: too large: 5 bytes; a kvtune YAML file is at most 2"
    assert exc.__cause__ is None  # the file is at fault, not the path that named it


def test_a_good_file_reads(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text("a: [1, 2]\nb: {c: x}\n")
    assert read_yaml(path) == {"a": [1, 2], "b": {"c": "x"}}


def test_aliases_only_on_the_trusted_path(tmp_path, monkeypatch):
    """issue 33: kvtune's own package data (quality.yaml shares notes through aliases) is read by the one trusted
    path, sim.safe_yaml.read_package_yaml / read_yaml(aliases=True): aliases allowed, every other check kept."""
    path = tmp_path / "a.yaml"
    path.write_text("a: &x [1, 2]\nb: *x\n")
    assert read_yaml(path, aliases=True) == {"a": [1, 2], "b": [1, 2]}
    with pytest.raises(ConfigError, match="aliases"):
        read_yaml(path)
    monkeypatch.setattr(safe_yaml, "MAX_BYTES", 2)
    with pytest.raises(ConfigError, match="too large"):
        read_yaml(path, aliases=True)


def test_the_bundled_data_reads_through_the_trusted_path():
    quality = safe_yaml.read_package_yaml("optimizer", "data", "quality.yaml")
    values = quality["knobs"]["kv_cache_dtype"]["values"]
    assert values["fp8"] == values["fp8_e4m3"]  # one note, shared through an alias
    assert safe_yaml.read_package_yaml("sim", "data", "hardware.yaml")["gpus"]
    with pytest.raises(ConfigError, match=r"nope\.yaml: cannot read: "):
        safe_yaml.read_package_yaml("sim", "data", "nope.yaml")


def test_the_trusted_path_on_libyaml_reads_the_same_values():
    """issue 34: the trusted path parses with libyaml where PyYAML has it (sim.safe_yaml._TRUSTED); every YAML
    kvtune ships reads to the same values as with PyYAML's pure-Python loader, and the nesting check holds."""
    from pathlib import Path

    import yaml

    root = Path(safe_yaml.__file__).resolve().parent.parent
    files = sorted([*root.glob("sim/data/*.yaml"), *root.glob("optimizer/data/*.yaml"),
                    *root.glob("sim/profiles/devices/*.yaml")])
    assert len(files) >= 5
    for path in files:
        text = path.read_text()
        assert yaml.load(text, Loader=safe_yaml._TRUSTED) == yaml.load(text, Loader=safe_yaml._TrustedLoader), path
    with pytest.raises(ConfigError, match="nested deeper than 64 levels"):
        safe_yaml.load_yaml("a: " + "[" * 100 + "]" * 100 + "\n", "deep.yaml", aliases=True)

"""Trial backends behind the optimizer's registry: the replay package registers ``replay`` as a kvtune plugin,
an unknown kind is one clear error, and no optimizer module imports replay (arrows sim <- objectives <- optimizer
<- replay)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from optimizer._backend import backend_factory, register_backend, registered_backends
from optimizer._plugins import command_adders
from sim.errors import ConfigError

OPTIMIZER = Path(__file__).resolve().parents[2] / "optimizer"


def test_replay_registers_its_backend_and_commands():
    from replay.plugin import replay_backend_from_spec

    assert backend_factory("replay") is replay_backend_from_spec
    assert "replay" in registered_backends()
    assert any(add.__module__ == "replay.cli" for add in command_adders())


def test_an_unregistered_kind_is_a_config_error():
    with pytest.raises(ConfigError, match="backend.kind: no trial backend 'sglang' is registered"):
        backend_factory("sglang")


def test_a_registered_factory_is_used(monkeypatch):
    from optimizer import _backend

    monkeypatch.setattr(_backend, "_FACTORIES", dict(_backend._FACTORIES))
    register_backend("fake", lambda spec, ctx, out: ("built", spec, out))
    assert backend_factory("fake")("spec", None, "out") == ("built", "spec", "out")


def test_no_optimizer_module_imports_replay():
    offenders = []
    for path in sorted(OPTIMIZER.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.relative_to(OPTIMIZER.parent)}: {n}" for n in names
                          if n == "replay" or n.startswith("replay.")]
    assert not offenders, offenders


@pytest.mark.parametrize("backend, field, match", [
    ({"kind": "replay", "engine": "twin", "vllm_python": "/x/python"}, "backend.vllm_python", "engine vllm only"),
    ({"kind": "replay", "engine": "vllm", "vllm_args": "--enforce-eager"}, "backend.vllm_args", "list of strings"),
    ({"kind": "replay", "url": "http://h:1", "port": 18000}, "backend.port", "not to url"),
    ({"kind": "replay", "engine": "vllm", "port": 0}, "backend.port", ">= 1"),
])
def test_vllm_launch_keys_are_checked(backend, field, match):
    from optimizer._spec import BackendSpec

    with pytest.raises(ConfigError, match=match) as err:
        BackendSpec.from_dict(backend)
    assert err.value.field == field


def test_vllm_launch_keys_round_trip():
    from optimizer._spec import BackendSpec

    d = {"kind": "replay", "engine": "vllm", "vllm_python": "/opt/v/bin/python", "vllm_args": ["--enforce-eager"],
         "port": 18005}
    b = BackendSpec.from_dict(d)
    assert (b.vllm_python, b.vllm_args, b.port) == ("/opt/v/bin/python", ("--enforce-eager",), 18005)
    assert BackendSpec.from_dict(b.to_dict()) == b
    assert b.identity() == {"kind": "replay", "engine": "vllm"}  # where vLLM lives does not change a trial

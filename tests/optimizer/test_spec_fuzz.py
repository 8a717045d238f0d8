"""Fuzzed study specs: a valid spec with one part replaced by a hostile value (or raw hostile YAML text) loads as
a StudySpec or fails with one KvtuneError (the CLI's one error line), never another exception."""

from __future__ import annotations

import copy

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from optimizer_test_helpers import spec_dict

from optimizer import StudySpec, load_study_spec
from sim.errors import KvtuneError

HOSTILE = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-2**80, max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
    st.sampled_from(["/any/path", "../../x", "", "bundled", "tpe", "grid", "slo", "none", "1e400", "\x00"]),
    st.lists(st.integers(min_value=-5, max_value=2**40), max_size=3),
    st.dictionaries(st.sampled_from(["low", "high", "choices", "log", "step", "when", "name", "seed", "trials",
                                     "kind", "engine", "e2e_p99_s"]),
                    st.one_of(st.integers(min_value=-2**70, max_value=2**70), st.floats(), st.text(max_size=4),
                              st.lists(st.integers(), max_size=2)), max_size=3),
)
PATHS = st.sampled_from([
    ("name",), ("model",), ("gpu",), ("flavor",), ("vllm_version",), ("tensor_parallel_size",), ("replicates",),
    ("objectives",), ("constraints",), ("engine",), ("engine", "max_model_len"), ("engine", "block_size"),
    ("search",), ("search", "max_num_seqs"), ("search", "gpu_memory_utilization"), ("budget",),
    ("budget", "trials"), ("budget", "trial_timeout_s"), ("sampler",), ("sampler", "seed"), ("backend",),
    ("workload",), ("workload", "max_requests"), ("workload", "classes"), ("workload", "classes", "conv", "slo"),
    ("workload", "seed"), ("workload", "rate_scale"), ("storage",), ("out",),
])


def _set(d, path, value):
    for key in path[:-1]:
        if not isinstance(d.get(key), dict):
            d[key] = {}
        d = d[key]
    d[path[-1]] = value


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(changes=st.lists(st.tuples(PATHS, HOSTILE), min_size=1, max_size=3))
def test_a_mutated_spec_loads_or_fails_cleanly(changes):
    d = copy.deepcopy(spec_dict())
    d["workload"]["max_requests"] = 20
    for path, value in changes:
        _set(d, path, value)
    try:
        spec = StudySpec.from_dict(d)
    except KvtuneError as exc:
        assert str(exc).strip()
        return
    assert spec.name and spec.budget.trials >= 1 and 0 <= spec.sampler.seed < 2**32


@settings(max_examples=80, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.one_of(
    st.text(max_size=200),
    st.binary(max_size=200).map(lambda b: b.decode("latin-1")),
    st.integers(min_value=1, max_value=4000).map(lambda n: "a: " + "[" * n + "]" * n),
    st.integers(min_value=1, max_value=9).map(lambda n: "x: &a [1, 2]\n" + "".join(f"y{i}: *a\n" for i in range(n))),
))
def test_raw_spec_text_loads_or_fails_cleanly(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("spec") / "s.yaml"
    path.write_text(yaml.safe_dump(spec_dict())[:0] + text, encoding="utf-8", errors="surrogatepass")
    try:
        load_study_spec(path)
    except KvtuneError as exc:
        assert str(exc).strip()

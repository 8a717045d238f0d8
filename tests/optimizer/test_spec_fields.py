"""Study specs through the one validation layer (sim.fields): a value of the wrong type anywhere in a spec is one
ConfigError whose field is exactly that value's path, in the one form ``<path>: must be <expected>, got <value>``."""

from __future__ import annotations

import copy
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from optimizer_test_helpers import spec_dict

from optimizer import StudySpec
from sim.errors import ConfigError

#: Paths of a spec (from its root) with what their value must be; each is set to a value of another type.
NUMERIC = [("budget", "trials"), ("budget", "workers"), ("budget", "trial_timeout_s"), ("sampler", "seed"),
           ("replicates",), ("tensor_parallel_size",), ("engine", "max_num_seqs"), ("engine", "block_size"),
           ("engine", "gpu_memory_utilization"), ("engine", "max_num_batched_tokens"), ("workload", "max_requests"),
           ("workload", "classes", "conv", "slo", "e2e_p99_s"), ("backend", "speed")]
STRING = [("sampler", "name"), ("flavor",), ("executor",), ("description",), ("engine", "kv_cache_dtype"),
          ("backend", "kind")]
BOOLEAN = [("lower_precision",), ("engine", "enable_prefix_caching")]

_not_numbers = st.one_of(st.text(alphabet="abcxyz", min_size=1, max_size=5), st.booleans(),
                         st.lists(st.integers(), min_size=1, max_size=2), st.just(math.nan))
_not_strings = st.one_of(st.integers(), st.booleans(), st.lists(st.text(max_size=3), min_size=1, max_size=2))
_not_bools = st.one_of(st.integers(min_value=2), st.text(alphabet="yesno", min_size=1, max_size=3))

_cases = st.one_of(st.tuples(st.sampled_from(NUMERIC), _not_numbers),
                   st.tuples(st.sampled_from(STRING), _not_strings),
                   st.tuples(st.sampled_from(BOOLEAN), _not_bools))


def _set(d: dict, path: tuple[str, ...], value) -> dict:
    d = copy.deepcopy(d)
    here = d
    for key in path[:-1]:
        here = here.setdefault(key, {})
    here[path[-1]] = value
    if path[0] == "backend":  # the replay-only keys are checked under kind replay
        d["backend"].setdefault("kind", "replay")
        d["backend"].setdefault("engine", "twin")
    return d


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=_cases)
def test_a_wrong_type_names_its_exact_path(case):
    path, value = case
    try:
        StudySpec.from_dict(_set(spec_dict(), path, value))
    except ConfigError as exc:
        field = ".".join(path)
        assert exc.field == field, (path, value, str(exc))
        assert str(exc).startswith(f"{field}: must be "), str(exc)
        assert ", got " in str(exc) and "\n" not in str(exc)
    else:
        raise AssertionError(f"{'.'.join(path)} = {value!r} was accepted")

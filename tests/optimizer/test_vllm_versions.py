"""Target vLLM versions and the flag table read from each release's vllm/engine/arg_utils.py."""

from __future__ import annotations

import pytest

from optimizer import VllmTarget, default_target, flag_table
from sim.errors import ConfigError


def test_flag_table_records_its_sources():
    table = flag_table()
    assert [r.version for r in table] == sorted((r.version for r in table), key=lambda v: VllmTarget.parse(v).release)
    for release in table:
        assert release.source == f"vllm=={release.version}: vllm/engine/arg_utils.py"
        assert {"max-num-seqs", "max-num-batched-tokens", "gpu-memory-utilization", "block-size",
                "kv-cache-dtype", "max-model-len", "tensor-parallel-size"} <= release.flags
        assert "enable-prefix-caching" in release.negatable


@pytest.mark.parametrize(
    ("target", "present", "absent"),
    [
        ("0.8.5", {"preemption-mode", "swap-space", "enable-chunked-prefill"}, {"kv-offloading-size", "watermark"}),
        ("0.10.2", {"preemption-mode", "swap-space"}, {"kv-offloading-size"}),
        ("0.11.0", {"swap-space"}, {"preemption-mode", "kv-offloading-size"}),
        ("0.17.1", {"swap-space", "kv-offloading-size"}, {"preemption-mode", "watermark"}),
        (">=0.18", {"kv-offloading-size", "kv-offloading-backend"}, {"swap-space", "preemption-mode", "watermark"}),
        ("0.33.0", {"watermark", "scheduler-reserve-full-isl", "kv-offloading-size"}, {"swap-space"}),
        ("latest", {"watermark"}, {"preemption-mode"}),
    ],
)
def test_flags_per_target(target, present, absent):
    t = VllmTarget.parse(target)
    assert present <= t.flags, present - t.flags
    assert not (absent & t.flags), absent & t.flags


def test_between_listed_releases_only_flags_both_have():
    # 0.20 lies between 0.18.0 and 0.25.0: --watermark (in 0.25.0 only) is not promised.
    t = VllmTarget.parse("0.20.1")
    assert [r.version for r in t.releases] == ["0.18.0", "0.25.0"]
    assert "watermark" not in t.flags and "kv-offloading-size" in t.flags
    # Beyond the newest listed release: the newest one's flags.
    assert VllmTarget.parse("0.40").flags == VllmTarget.parse("0.33.0").flags
    # A floor is bounded by every release from it on.
    assert VllmTarget.parse(">=0.25").flags == VllmTarget.parse("0.25.0").flags & VllmTarget.parse("0.33.0").flags


def test_engines():
    assert VllmTarget.parse("0.8.5.post1").engines == {"v0", "v1"}
    assert VllmTarget.parse("==0.10.2").engines == {"v0", "v1"}
    assert VllmTarget.parse("0.11.0").engines == {"v1"}
    assert VllmTarget.parse(">=0.8.5").engines == {"v1"}
    assert str(default_target("vllm-v0")) == "0.10.2"
    assert str(default_target("vllm-v1")) == flag_table()[-1].version


@pytest.mark.parametrize("bad", ["0.5", "x.y", "~=0.18", "", "<0.9"])
def test_bad_versions(bad):
    with pytest.raises(ConfigError) as info:
        VllmTarget.parse(bad)
    assert info.value.field == "vllm_version"

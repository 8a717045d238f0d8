"""Device prices: every built-in GPU's price names its source and date; a device YAML may give them too, and
without a price a device is unpriced (0.0, ``has_price`` False)."""

import re

import pytest

from sim.errors import ConfigError
from sim.profiles import load_gpu
from sim.profiles._profiles import _gpus

DEVICE = "name: my-gpu\nmem_gb: 48\nhbm_bw_gbps: 960\nbf16_tflops: 180\nhost_link_gbps: 25\n"
BUILT_IN_GPUS = sorted({p.name for p in _gpus().values() if not p.source.startswith("benchmarks/")})


@pytest.mark.parametrize("name", BUILT_IN_GPUS)
def test_built_in_prices_name_their_source_and_date(name):
    gpu = load_gpu(name)
    assert gpu.has_price and gpu.price_per_hour_usd > 0
    assert isinstance(gpu.price_source, str) and "https://" in gpu.price_source
    assert isinstance(gpu.price_date, str) and re.fullmatch(r"\d{4}-\d{2}(-\d{2})?", gpu.price_date)


def test_the_five_priced_devices_quote_one_provider():
    # A100-80GB, H100, H200, L40S and GH200 come from the same public price list (the 8-GPU instance / 8).
    expected = {"A100-80GB": 21.60 / 8, "H100-SXM": 49.24 / 8, "H200": 50.44 / 8, "L40S": 18.00 / 8, "GH200": 6.50}
    for name, price in expected.items():
        gpu = load_gpu(name)
        assert gpu.price_per_hour_usd == pytest.approx(price, abs=1e-9)
        assert gpu.price_source.startswith("CoreWeave")


def test_a_device_without_a_price_is_unpriced(tmp_path):
    path = tmp_path / "dev.yaml"
    path.write_text(DEVICE)
    gpu = load_gpu(str(path))
    assert gpu.price_per_hour_usd == 0.0 and not gpu.has_price
    assert gpu.price_source is None and gpu.price_date is None
    assert not load_gpu("vllm-cpu").has_price


def test_a_device_yaml_gives_its_price_source_and_date(tmp_path):
    path = tmp_path / "dev.yaml"
    path.write_text(DEVICE + 'price_per_hour_usd: 1.5\nprice_source: "Acme, https://acme.example/prices"\n'
                             "price_date: 2026-03\n")
    gpu = load_gpu(str(path))
    assert gpu.has_price and gpu.price_per_hour_usd == 1.5
    assert (gpu.price_source, gpu.price_date) == ("Acme, https://acme.example/prices", "2026-03")


def test_an_unquoted_yaml_date_is_taken_as_its_text(tmp_path):
    path = tmp_path / "dev.yaml"
    path.write_text(DEVICE + "price_per_hour_usd: 1.5\nprice_date: 2026-03-14\n")
    assert load_gpu(str(path)).price_date == "2026-03-14"


@pytest.mark.parametrize("extra, match", [
    ("price_source: 3\n", "price_source: must be a non-empty string"),
    ("price_source: [a, b]\n", "price_source: must be a non-empty string"),
    ('price_source: ""\n', "price_source: must be a non-empty string"),
    ("price_date: 202603\n", "price_date: must be a non-empty string"),
    ('price_date: "March 2026"\n', "price_date: must be a date YYYY-MM or YYYY-MM-DD"),
    ('price_date: "2026-13"\n', "price_date: must be a date YYYY-MM or YYYY-MM-DD"),
])
def test_a_bad_price_field_is_one_error_naming_file_and_field(tmp_path, extra, match):
    path = tmp_path / "bad.yaml"
    path.write_text(DEVICE + extra)
    with pytest.raises(ConfigError, match=match) as err:
        load_gpu(str(path))
    assert str(path) in str(err.value)

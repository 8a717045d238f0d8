"""Cost objectives: the deployment's price (PRICE_KEY, added by the backend) and USD per million output tokens."""

import math

import pytest

from objectives import PRICE_KEY, deployment_price, get_objective, objective_names, parse_bound
from sim.errors import ConfigError
from sim.profiles import load_gpu

METRICS = {PRICE_KEY: 12.31, "output_tokens_per_s": 2500.0, "goodput_rps": 3.0}


def test_price_key_is_the_deployment_price():
    assert PRICE_KEY == "deployment.price_per_hour_usd"


@pytest.mark.parametrize("name", ["cost_per_hour_usd", "usd_per_million_output_tokens"])
def test_found_by_name_and_minimized(name):
    objective = get_objective(name)
    assert objective.name == name and objective.direction == "minimize"
    assert name in objective_names()


def test_values_on_a_hand_made_metrics_dict():
    assert get_objective("cost_per_hour_usd").value(METRICS) == 12.31
    # 12.31 $/h = 0.0034194 $/s; at 2500 tok/s that is 1.3678e-6 $/token, 1.3678 $ per million
    usd = get_objective("usd_per_million_output_tokens").value(METRICS)
    assert usd == pytest.approx(12.31 / 3600 / 2500 * 1e6) and usd == pytest.approx(1.36778, rel=1e-4)


def test_no_output_is_infinitely_expensive_and_unknown_stays_unknown():
    objective = get_objective("usd_per_million_output_tokens")
    assert objective.value({**METRICS, "output_tokens_per_s": 0.0}) == math.inf
    assert math.isnan(objective.value({**METRICS, "output_tokens_per_s": math.nan}))


@pytest.mark.parametrize("name", ["cost_per_hour_usd", "usd_per_million_output_tokens"])
def test_missing_price_key_is_a_config_error_naming_it(name):
    metrics = {k: v for k, v in METRICS.items() if k != PRICE_KEY}
    with pytest.raises(ConfigError, match=PRICE_KEY) as err:
        get_objective(name).value(metrics)
    assert err.value.field == f"objective.{name}"


def test_missing_throughput_is_the_registry_error():
    with pytest.raises(ConfigError, match="output_tokens_per_s"):
        get_objective("usd_per_million_output_tokens").value({PRICE_KEY: 1.0})


@pytest.mark.parametrize("price", [0.0, -1.0])
def test_a_zero_price_in_the_metrics_is_not_a_free_deployment(price):
    with pytest.raises(ConfigError, match="no cost"):
        get_objective("cost_per_hour_usd").value({**METRICS, PRICE_KEY: price})


def test_a_bound_on_cost():
    bound = parse_bound("usd_per_million_output_tokens <= 2")
    assert bound.violation(METRICS) < 0
    assert bound.violation({**METRICS, "output_tokens_per_s": 100.0}) > 0


def test_deployment_price_multiplies_gpus_and_replicas():
    h100 = load_gpu("H100-SXM")
    assert deployment_price(h100, 1) == h100.price_per_hour_usd
    assert deployment_price(h100, 4, replicas=2) == pytest.approx(8 * h100.price_per_hour_usd)
    assert deployment_price("H100", 2) == pytest.approx(2 * h100.price_per_hour_usd)  # a name works too


def test_deployment_price_of_an_unpriced_device_names_it(tmp_path):
    with pytest.raises(ConfigError, match=r"'vllm-cpu-1core' has no price \(price_per_hour_usd 0"):
        deployment_price(load_gpu("vllm-cpu"), 1)
    path = tmp_path / "dev.yaml"
    path.write_text("name: my-gpu\nmem_gb: 48\nhbm_bw_gbps: 960\nbf16_tflops: 180\nhost_link_gbps: 25\n")
    with pytest.raises(ConfigError, match="'my-gpu' has no price"):
        deployment_price(str(path), 2)


@pytest.mark.parametrize("tp, replicas", [(0, 1), (1, 0), (1.5, 1), (True, 1)])
def test_deployment_price_refuses_bad_counts(tp, replicas):
    with pytest.raises(ConfigError, match="must be an integer >= 1"):
        deployment_price(load_gpu("H100-SXM"), tp, replicas)

"""Objectives and SLO constraints by name, read from a Summary or from its flat dict (trial user attrs)."""

import math

import optuna
import pytest

from objectives import constraint_values, get_objective, objective_names, parse_bound, slo_constraints, summarize
from sim.errors import ConfigError
from sim.workload.classes import SLO, RequestClass

CLASSES = {
    "chat": RequestClass("chat", SLO(ttft_p99_s=0.5, e2e_p99_s=4.0), timeout_s=30.0),
    "batch": RequestClass("batch", SLO(e2e_p99_s=100.0)),
    "idle": RequestClass("idle", SLO(e2e_p99_s=1.0)),
}


@pytest.fixture
def summary(tables):
    r = tables.request
    reqs = tables.requests(r(cls="chat", ttft=0.25, end=5.0, generated=20), r(cls="batch", ttft=1.0, end=50.0))
    step = tables.step(duration=1.0, new=100, recompute=100, parts={"prefill_new": 0.3, "recompute": 0.6, "overhead": 0.1})
    return summarize(reqs, tables.steps(step), CLASSES)


def test_named_objectives(summary):
    tput = get_objective("output_tokens_per_s")
    assert tput.direction == "maximize" and tput.value(summary) == pytest.approx(30 / 50.0)
    assert get_objective("recompute_token_share").direction == "minimize"
    assert get_objective("recompute_token_share").value(summary) == pytest.approx(0.5)
    assert get_objective("recompute_busy_share").value(summary) == pytest.approx(0.6)
    assert get_objective("slo_attainment:chat").direction == "maximize"
    assert get_objective("slo_attainment:chat").value(summary) == 0.0  # 5 s > its 4 s E2E target
    assert get_objective("e2e_attainment:batch").value(summary) == 1.0
    assert get_objective("p99_max_itl_s:chat").key == "class.chat.max_itl_s.p99"
    assert get_objective("max_preempted_s").key == "all.preempted_s.max"
    assert get_objective("p99_e2e_s:output.0-256").value(summary) == 50.0
    p99 = get_objective("p99_e2e_s:chat")
    assert p99.direction == "minimize" and p99.value(summary) == 5.0
    assert get_objective("p50_ttft_s:batch").value(summary) == 1.0
    assert get_objective("p99_e2e_s").value(summary) == 50.0  # no class: all requests


def test_objectives_read_the_flat_dict_too(summary):
    flat = summary.to_dict()
    for name in ("goodput_rps", "p99_tpot_s:chat", "new_token_busy_share", "preemptions_per_request", "p99_max_itl_s:chat"):
        obj = get_objective(name)
        a, b = obj.value(summary), obj.value(flat)
        assert a == b or (math.isnan(a) and math.isnan(b))


def test_unknown_names_are_config_errors_listing_known_ones(summary):
    with pytest.raises(ConfigError, match="throughput.*known:.*output_tokens_per_s"):
        get_objective("throughput")
    with pytest.raises(ConfigError, match="ghost.*classes"):
        get_objective("p99_e2e_s:ghost", CLASSES)
    with pytest.raises(ConfigError, match="ghost"):
        get_objective("p99_e2e_s:ghost").value(summary)  # caught at evaluation without classes
    assert "p{50,90,99}_{ttft,tpot,e2e}_s[:<cohort>]" in objective_names()


def test_slo_constraints_relative_violation(summary):
    cons = slo_constraints(CLASSES)
    assert [c.name for c in cons] == [
        "slo:chat:p99_ttft_s<=0.5", "slo:chat:p99_e2e_s<=4", "slo:batch:p99_e2e_s<=100", "slo:idle:p99_e2e_s<=1"
    ]
    values = constraint_values(cons, summary)
    # chat E2E p99 5 s > 4 s: its one request misses, miss share 1.0; idle: no requests, vacuously feasible
    assert values == pytest.approx((-0.5, 1.0, -0.5, 0.0))
    assert constraint_values(cons, summary.to_dict()) == values


def test_unverifiable_or_never_answered_slo_is_violated(tables):
    r = tables.request
    reqs = tables.requests(r("rejected", cls="batch", end=0.0, generated=0), r(cls="chat", ttft=0.1, end=1.0))
    reqs.loc[1, ["ttft_s", "first_token_s"]] = math.nan  # replay could not observe the first token
    values = constraint_values(slo_constraints(CLASSES), summarize(reqs, None, CLASSES))
    assert values[0] == math.inf  # chat TTFT unknown
    assert values[2] == 1.0  # batch p99 is inf: its one request (rejected) is a miss
    assert not any(math.isnan(v) for v in values)


def test_feeds_optuna_named_constraints(summary):
    """Optuna 5 takes constraints per trial by name (``Trial.set_constraint``); NaN would be refused there."""
    cons = slo_constraints(CLASSES)
    obj = get_objective("output_tokens_per_s")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction=obj.direction, sampler=optuna.samplers.TPESampler(seed=0))

    def trial_fn(trial):
        trial.suggest_int("max_num_seqs", 1, 4)
        for c in cons:
            trial.set_constraint(c.name, c.violation(summary))
        return obj.value(summary)

    study.optimize(trial_fn, n_trials=3)
    frozen = study.trials[-1]
    assert frozen.state == optuna.trial.TrialState.COMPLETE
    assert frozen.value == pytest.approx(30 / 50.0)
    assert frozen.system_attrs["constraints:slo:chat:p99_e2e_s<=4"] == pytest.approx(1.0)


def test_bounds_on_any_objective_are_constraints(summary):
    att = parse_bound("slo_attainment:chat >= 0.95", CLASSES)
    assert att.name == "slo_attainment:chat>=0.95" and att.violation(summary) == pytest.approx(1.0)
    itl = parse_bound("p99_max_itl_s<=2")
    assert itl.violation(summary) == math.inf  # the table has no inter-token gaps: unverifiable
    share = parse_bound("recompute_busy_share <= 0.8")
    assert share.violation(summary) == pytest.approx((0.6 - 0.8) / 0.8)
    assert parse_bound("preempted_ge2_share <= 0").violation(summary) == 0.0
    for bad in ("p99_e2e_s < 3", "p99_e2e_s <= fast", "nonsense >= 1", "p99_e2e_s:ghost <= 1"):
        with pytest.raises(ConfigError):
            parse_bound(bad, CLASSES)

"""The engine's default config is a trial of every study, and the export never recommends a config worse than it
on a class the SLOs protect (optimizer/_export.py choose)."""

from __future__ import annotations

import io
import json

import pandas as pd
import pytest

from optimizer import InProcessExecutor, SimBackend, StudySpec, Tuner, choose, prepare
from optimizer._export import export_study, worse_than_default
from optimizer._storage import DEFAULT_ATTR, is_default, requeue

from optimizer_test_helpers import SLO_E2E_S, spec_dict

# class conv's p99 E2E (s) and SLO attainment per searched max_num_seqs; None: the default config.
KEEP_DEFAULT = {None: (60.0, 0.90), 32: (80.0, 0.95), 64: (90.0, 0.92), 128: (100.0, 0.50)}
BETTER_INFEASIBLE = {None: (60.0, 0.90), 32: (80.0, 0.95), 64: (50.0, 0.97), 128: (100.0, 0.50)}
FEASIBLE = {None: (60.0, 0.90), 32: (80.0, 0.95), 64: (50.0, 0.97), 128: (30.0, 1.00)}


class _ByKnobs:
    """Every config returns one simulated run's metrics with conv's p99 E2E, attainment and throughput set by
    ``max_num_seqs`` (absent: the default config)."""

    name = "by-knobs"

    def __init__(self, metrics, table):
        self.metrics, self.table = metrics, table

    def prepare(self, seeds):
        pass

    def run(self, knobs, seeds):
        p99, attainment = self.table[knobs.get("max_num_seqs")]
        return {**self.metrics, "class.conv.e2e_s.p99": p99, "class.conv.e2e_s.attainment": attainment,
                "output_tokens_per_s": 1000.0 + (knobs.get("max_num_seqs") or 0)}


@pytest.fixture(scope="module")
def base():
    spec = StudySpec.from_dict(spec_dict(search={"base": "none", "max_num_seqs": [32, 64, 128]},
                                         sampler={"name": "grid", "seed": 0}, budget={"trials": 10}))
    ctx = prepare(spec)
    metrics, _ = SimBackend.for_spec(spec, ctx.workloads).run_one({}, ctx.seeds[0])
    return spec, ctx, metrics


def _study(tmp_path, base, table):
    spec, ctx, metrics = base
    tuner = Tuner(spec, storage=f"sqlite:///{tmp_path}/s.db", backend=_ByKnobs(metrics, table),
                  executor=InProcessExecutor(), progress=io.StringIO(), context=ctx)
    result = tuner.run()
    return spec, ctx, tuner.study.get_trials(), result


def test_the_default_is_trial_0_and_the_grid_still_runs_whole(tmp_path, base):
    spec, ctx, trials, result = _study(tmp_path, base, KEEP_DEFAULT)
    assert result.finished == 4  # three grid points and the default
    assert [is_default(t) for t in trials] == [True, False, False, False]
    assert trials[0].params == {} and trials[0].user_attrs["knobs"] == spec.fixed_knobs()
    assert sorted(t.params["max_num_seqs"] for t in trials[1:]) == [32, 64, 128]
    # A resumed study does not run the default again.
    _, _, again, _ = _study(tmp_path, base, KEEP_DEFAULT)
    assert sum(is_default(t) for t in again) == 1 and len(again) == 4


def test_nothing_beats_the_default_keep_it(tmp_path, base):
    spec, ctx, trials, _ = _study(tmp_path, base, KEEP_DEFAULT)
    pick = choose(trials, ctx)
    # The trial closest to feasible by violation (attainment 0.95) has a worse p99 than the default: not picked.
    assert pick.closest.params == {"max_num_seqs": 32}
    assert worse_than_default({"class.conv.e2e_s.p99": 80.0}, {"class.conv.e2e_s.p99": 60.0}, ctx)
    assert pick.keep_default and not pick.feasible and is_default(pick.trial)
    exported = export_study(spec, storage=f"sqlite:///{tmp_path}/s.db", out=tmp_path / "export", context=ctx)
    doc = json.loads((tmp_path / "export" / "recommended.json").read_text())
    assert doc["keep_default"] and doc["trial"] == doc["default_trial"] == 0 and not doc["feasible"]
    side = doc["comparison"]["conv"]["e2e_s"]
    assert side["target_s"] == SLO_E2E_S
    assert side["default"]["p99_s"] == 60.0 and side["closest"]["p99_s"] == 80.0 and side["closest"]["trial"] != 0
    assert side["default"]["excess"] == pytest.approx(0.5) and not side["default"]["meets"]
    assert doc["knobs"] == spec.fixed_knobs()
    # The smallest capacity change: the default config on the cheapest deployments of the bundled range, in order.
    change = doc["capacity_change"]
    assert change["from"]["description"].startswith("one L40S") and change["tried"]
    assert change["tried"][0]["deployment"].startswith("fp8 KV on one L40S")
    if change["found"]:
        assert change["predicted"]["meets_all_slos"] and not change["tried"][-1]["misses"]
        assert change["deployment"]["description"] == change["tried"][-1]["deployment"]
        assert "capacity: no config searched meets every SLO; the smallest change" in exported.summary()
    else:
        assert all(t["misses"] for t in change["tried"])
    # The change found is FP8 KV on the same L40S: its lower precision is said where the change is named, with
    # the published deltas in recommended.json (capacity_change.quality) and recommended.yaml, not in 'quality'
    # (the recommended config is the default's full precision).
    assert change["found"] and change["deployment"]["kv_cache_dtype"] == "fp8"
    assert change["quality"] and change["quality"][0]["sources"] and doc["quality"] == []
    assert "lowers precision: its published accuracy deltas are capacity_change.quality" in exported.summary()
    yaml_text = (tmp_path / "export" / "recommended.yaml").read_text()
    assert "LOWER PRECISION: the capacity change above lowers precision (not this config)" in yaml_text
    assert change["quality"][0]["sources"][0]["url"] in yaml_text
    text = exported.summary()
    assert text.splitlines()[0] == "kvtune: no trial meets every SLO; keep the default"
    assert "closest trial" in text and "misses by 100.0%" in text
    assert "keep the default" in (tmp_path / "export" / "recommended.yaml").read_text()
    table = pd.read_csv(tmp_path / "export" / "pareto.csv")
    assert table["default"].tolist() == [True] and table["pareto"].tolist() == [False]


def test_an_infeasible_trial_is_recommended_only_if_no_worse_than_the_default(tmp_path, base):
    spec, ctx, trials, _ = _study(tmp_path, base, BETTER_INFEASIBLE)
    pick = choose(trials, ctx)
    assert not pick.feasible and not pick.keep_default
    assert pick.trial.params == {"max_num_seqs": 64}  # p99 50 s < the default's 60 s, though still over 40 s
    assert pick.closest.params == {"max_num_seqs": 64}


def test_a_feasible_trial_wins_and_the_table_shows_the_default(tmp_path, base):
    spec, ctx, trials, _ = _study(tmp_path, base, FEASIBLE)
    pick = choose(trials, ctx)
    assert pick.feasible and pick.trial.params == {"max_num_seqs": 128} and not pick.keep_default
    export_study(spec, storage=f"sqlite:///{tmp_path}/s.db", out=tmp_path / "export", context=ctx)
    table = pd.read_csv(tmp_path / "export" / "pareto.csv")
    assert table.loc[table["default"], "pareto"].tolist() == [False]
    assert table.loc[table["pareto"], "trial"].tolist() == [pick.trial.number]
    assert json.loads((tmp_path / "export" / "recommended.json").read_text())["comparison"] == {}


def test_a_requeued_default_stays_the_default(tmp_path, base):
    spec, ctx, trials, _ = _study(tmp_path, base, KEEP_DEFAULT)
    import optuna

    study = optuna.load_study(study_name=spec.name, storage=f"sqlite:///{tmp_path}/s.db")
    requeue(study, trials[0], {"retry_of": 0})
    waiting = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert len(waiting) == 1 and waiting[0].user_attrs[DEFAULT_ATTR] and waiting[0].user_attrs["retry_of"] == 0

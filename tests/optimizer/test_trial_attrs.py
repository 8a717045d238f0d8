"""A trial's metrics are written in one transaction (``set_user_attrs``) and read back as Optuna's own
``set_user_attr`` would have stored them, on SQLite and in memory."""

import math
import warnings

import optuna
import pytest

from optimizer._storage import make_storage, set_user_attrs

ATTRS = {"class.chat.e2e_s.p99": 12.5, "knobs": {"max_num_seqs": 64, "preemption_mode": "recompute"},
         "constraints": [0.0, -1.5], "feasible": True, "nan_metric": math.nan, "inf_metric": math.inf,
         "name": "kv", **{f"bucket.{i}.tpot_s.p50": i / 7 for i in range(500)}}


def _study(url):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return optuna.create_study(storage=make_storage(url), directions=["maximize"])


def _same(a, b):
    assert a.keys() == b.keys()
    for key, value in a.items():
        if isinstance(value, float) and math.isnan(value):
            assert math.isnan(b[key]), key
        else:
            assert b[key] == value, key


@pytest.mark.parametrize("kind", ["sqlite", "memory"])
def test_bulk_attrs_read_back_as_optuna_stores_them(tmp_path, kind):
    study = _study(f"sqlite:///{tmp_path}/s.db" if kind == "sqlite" else "memory")
    one_by_one, bulk = study.ask(), study.ask()
    for key, value in ATTRS.items():
        one_by_one.set_user_attr(key, value)
    one_by_one.set_user_attr("name", "first")
    set_user_attrs(bulk, {"name": "first"})
    set_user_attrs(bulk, ATTRS)  # a key written again is replaced (an upsert), as set_user_attr does
    one_by_one.set_user_attr("name", "kv")
    _same(bulk.user_attrs, ATTRS)  # the Trial object's own view too
    study.tell(one_by_one, [1.0])
    study.tell(bulk, [2.0])
    stored = {t.number: t.user_attrs for t in study.get_trials()}
    _same(stored[0], ATTRS)
    _same(stored[1], stored[0])


def test_a_finished_trial_is_not_updated(tmp_path):
    study = _study(f"sqlite:///{tmp_path}/s.db")
    trial = study.ask()
    study.tell(trial, [1.0])
    with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):
        set_user_attrs(trial, {"late": 1.0})
    assert "late" not in study.get_trials()[0].user_attrs

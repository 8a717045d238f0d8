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


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")
@pytest.mark.parametrize("state", [optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL])
def test_tell_stores_what_study_tell_stores_and_reads_the_trial_once(tmp_path, monkeypatch, state):
    """The study's ``_tell`` is ``Study.tell`` without its read-back of the finished trial (a trial carries hundreds
    of attributes): the same rows are stored, and the told trial is read from the RDB storage once (the check that
    it is still RUNNING), not a second time after it finished."""
    from optimizer._study import _tell

    values = [1.5] if state == optuna.trial.TrialState.COMPLETE else None
    stored = []
    for i, tell in enumerate((lambda s, t: s.tell(t, values, state=state),
                              lambda s, t: _tell(s, t, values, state=state))):
        study = _study(f"sqlite:///{tmp_path}/s{i}.db")
        trial = study.ask()
        trial.set_constraint("slo", -1.0)
        set_user_attrs(trial, ATTRS)
        backend = study._storage._backend
        reads = []
        original = type(backend).get_trial
        monkeypatch.setattr(backend, "get_trial", lambda trial_id: reads.append(trial_id) or original(backend, trial_id))
        tell(study, trial)
        monkeypatch.undo()
        stored.append((study.get_trials()[0], len(reads)))
    (by_optuna, optuna_reads), (ours, our_reads) = stored
    assert (ours.state, ours.values, ours.params) == (by_optuna.state, by_optuna.values, by_optuna.params)
    assert ours.system_attrs == by_optuna.system_attrs
    _same(ours.user_attrs, by_optuna.user_attrs)
    assert ours.datetime_complete is not None
    assert optuna_reads == 2 and our_reads == 1

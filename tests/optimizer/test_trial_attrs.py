"""A trial's metrics are written in one transaction (``set_user_attrs``) and read back as Optuna's own
``set_user_attr`` would have stored them, on SQLite and in memory.  Each bucket-cohort family is stored as one
attribute (``metric_attrs``) and every reader sees the flat metrics (``trial_metrics``), also of trials an earlier
kvtune stored flat."""

import io
import math
import warnings

import optuna
import pytest
from optimizer_test_helpers import spec_dict

from objectives import BUCKET_PREFIXES, Summary
from optimizer import InProcessExecutor, SimBackend, StudySpec, Tuner, choose, prepare
from optimizer._study import outcomes as outcomes_module
from optimizer._capacity import priced
from optimizer._export import pareto_table, shortfalls, trial_row
from optimizer._storage import BUCKET_ATTRS, make_storage, metric_attrs, set_user_attrs, trial_metric, trial_metrics
from optimizer.report._data import trial_frame

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
    """The study's ``tell`` is ``Study.tell`` without its read-back of the finished trial (a trial carries hundreds
    of attributes): the same rows are stored, and the told trial is read from the RDB storage once (the check that
    it is still RUNNING), not a second time after it finished."""
    from optimizer._study.outcomes import tell as _tell

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


# ---- the bucket cohorts grouped (metric_attrs) and read back flat (trial_metrics) ------------------------------
# Objectives and bounds on one cohort of each bucket family, and the run-wide throughput.
BUCKET_OBJECTIVES = ["output_tokens_per_s", "p99_e2e_s:output.256-1024", "e2e_attainment:prompt.0-512"]
BUCKET_BOUNDS = ["p99_e2e_s:preempted.1 <= 0.001", "slo_attainment:output.0-256 >= 0.0"]


def _old_layout(metrics):
    """What kvtune stored before every bucket family was grouped: prompt.* under prompt_buckets, the rest flat."""
    out = {k: v for k, v in metrics.items() if not k.startswith("prompt.")}
    out["prompt_buckets"] = {k[len("prompt."):]: v for k, v in metrics.items() if k.startswith("prompt.")}
    return out


class _Fixed:
    """Every config returns the metrics of one simulated run (a Summary.to_dict() plus the backend's sim.*)."""

    name = "fixed"

    def __init__(self, metrics):
        self.metrics = metrics

    def prepare(self, seeds):
        pass

    def run(self, params, seeds):
        return dict(self.metrics)


@pytest.fixture(scope="module")
def simulated():
    """One run of the helper study under KV pressure: its prompt, output and preempted buckets are non-empty."""
    spec = StudySpec.from_dict(spec_dict(engine={"max_model_len": 4096, "num_gpu_blocks_override": 1200},
                                         objectives=BUCKET_OBJECTIVES, constraints=["slo", *BUCKET_BOUNDS],
                                         search={"base": "none", "max_num_seqs": [32, 64]},
                                         sampler={"name": "random", "seed": 0}))
    ctx = prepare(spec)
    backend = SimBackend.for_spec(spec, ctx.workloads)
    metrics, _ = backend.run_one({}, ctx.seeds[0])
    summary_keys = [k for k in metrics if not k.startswith("sim.")]
    for prefix in BUCKET_PREFIXES:
        assert any(k.startswith(f"{prefix}.") and k.endswith(".count.total") and metrics[k] > 0 for k in metrics)
    return spec, ctx, metrics, summary_keys


def _run(spec, ctx, storage, trials, metrics):
    tuner = Tuner(spec, trials=trials, storage=storage, backend=_Fixed(metrics), executor=InProcessExecutor(),
                  progress=io.StringIO(), context=ctx)
    result = tuner.run()
    assert result.failed == 0
    return tuner.study.get_trials()


def test_bucket_prefixes_are_the_summarys_bucket_groups():
    assert set(Summary(0.0, 0.0, 0.0, None, {}, {}).cohort_groups()) == {"class", *BUCKET_PREFIXES}


def test_metric_attrs_group_every_bucket_family_and_read_back_flat(simulated):
    *_, metrics, _ = simulated
    attrs = metric_attrs(metrics)
    assert set(BUCKET_ATTRS.values()) <= set(attrs)
    assert not [k for k in attrs if k.split(".")[0] in BUCKET_PREFIXES]  # no bucket metric left flat
    assert any(k.startswith("class.") for k in attrs) and "all.e2e_s.p99" in attrs  # these stay flat
    assert len(attrs) == len(metrics) - sum(k.split(".")[0] in BUCKET_PREFIXES for k in metrics) + 3
    _same(trial_metrics(attrs), metrics)
    _same(trial_metrics(_old_layout(metrics)), metrics)  # the layouts of earlier kvtunes
    _same(trial_metrics(metrics), metrics)


@pytest.mark.parametrize("kind", ["sqlite", "memory"])
def test_a_stored_trial_reads_back_its_summary_and_evaluates_alike(tmp_path, simulated, kind):
    spec, ctx, metrics, summary_keys = simulated
    storage = f"sqlite:///{tmp_path}/s.db" if kind == "sqlite" else "memory"
    # The default config, then three draws of two configs: one is a copy (_copy_result).
    trials = _run(spec, ctx, storage, 4, metrics)
    assert [t.user_attrs.get("kvtune_default", False) for t in trials] == [True, False, False, False]
    assert sum("duplicate_of" in t.user_attrs for t in trials) >= 1
    with_price = priced(metrics, {}, spec.gpu)  # a trial stores its deployment's price beside what the backend measured
    assert len(with_price) == len(metrics) + 1
    for t in trials:
        flat = trial_metrics(t)
        _same(flat, with_price)
        assert set(summary_keys) <= set(flat)  # every Summary.to_dict() key, the bucket cohorts included
        assert all(isinstance(t.user_attrs[a], dict) for a in BUCKET_ATTRS.values())
        assert not [k for k in t.user_attrs if k.split(".")[0] in BUCKET_PREFIXES]
        row = trial_frame([t], spec.objectives, []).iloc[0]  # the report's table: every metric, as a float
        _same({k: row[k] for k in metrics}, {k: float(v) for k, v in metrics.items()})
        for o, value in zip(ctx.objectives, t.values):
            assert o.value(flat) == o.value(metrics) == pytest.approx(value)
        assert [c.name for c in ctx.constraints] == t.user_attrs["constraint_names"]
        for c, stored in zip(ctx.constraints, t.user_attrs["constraints"]):
            assert c.violation(flat) == c.violation(metrics) == pytest.approx(stored)
        assert trial_metric(t, "output.256-1024.e2e_s.p99") == metrics["output.256-1024.e2e_s.p99"]
        assert trial_metric(t, "class.conv.e2e_s.p99") == metrics["class.conv.e2e_s.p99"]
        assert trial_metric(t, "preempted.9.e2e_s.p99", "none") == "none"
    # The preempted-bucket bound cannot be met: the pick is the closest trial, its shortfalls read from the trial.
    pick = choose(trials, ctx)
    assert not pick.feasible
    assert "p99_e2e_s:preempted.1<=0.001" in [s.metric for s in pick.shortfalls]
    assert [str(s) for s in pick.shortfalls] == [str(s) for s in shortfalls(metrics, ctx)]
    row = trial_row(pick.trial, ctx)
    assert row["class.conv.e2e_s.p99"] == metrics["class.conv.e2e_s.p99"]
    assert row["output_tokens_per_s"] == metrics["output_tokens_per_s"]
    assert len(pareto_table([pick.trial], ctx)) == 1
    frame = trial_frame(trials, spec.objectives, [])
    assert frame["output.256-1024.e2e_s.p99"].tolist() == [metrics["output.256-1024.e2e_s.p99"]] * len(trials)


def test_a_study_resumed_over_trials_stored_flat_reads_them_alike(tmp_path, simulated, monkeypatch):
    """A study begun by a kvtune that stored output.* and preempted.* flat, resumed by this one."""
    spec, ctx, metrics, _ = simulated
    spec = StudySpec.from_dict({**spec_dict(engine={"max_model_len": 4096, "num_gpu_blocks_override": 1200},
                                            objectives=BUCKET_OBJECTIVES, constraints=["slo", *BUCKET_BOUNDS],
                                            sampler={"name": "random", "seed": 0}),
                                "search": {"base": "none", "max_num_seqs": [16, 32, 64, 128]}})
    ctx = prepare(spec)
    storage = f"sqlite:///{tmp_path}/s.db"
    monkeypatch.setattr(outcomes_module, "metric_attrs", _old_layout)
    _run(spec, ctx, storage, 2, metrics)
    monkeypatch.undo()
    trials = _run(spec, ctx, storage, 4, metrics)
    old = [t for t in trials if "output.256-1024.e2e_s.p99" in t.user_attrs]
    new = [t for t in trials if "output_buckets" in t.user_attrs]
    # The first two old-style; a later trial that drew an old config copies its attrs as they are (copy_result).
    assert len(trials) == 4 and len(old) >= 2 and new and len(old) + len(new) == 4
    assert len(new[0].user_attrs) < len(old[0].user_attrs) - 500
    with_price = priced(metrics, {}, spec.gpu)
    for t in trials:
        flat = trial_metrics(t)
        _same(flat, with_price)
        for o, value in zip(ctx.objectives, t.values):
            assert o.value(flat) == pytest.approx(value)
        for c, stored in zip(ctx.constraints, t.user_attrs["constraints"]):
            assert c.violation(flat) == pytest.approx(stored)
        assert trial_metric(t, "preempted.1.e2e_s.p99") == metrics["preempted.1.e2e_s.p99"]
    frame = trial_frame(trials, spec.objectives, [])
    assert frame["preempted.1.e2e_s.p99"].tolist() == [metrics["preempted.1.e2e_s.p99"]] * 4
    assert not choose(trials, ctx).feasible

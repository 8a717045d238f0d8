"""A small real study end to end: local Ray (2 CPUs), SQLite storage, 20 trials, two objectives (throughput up,
conv p99 e2e down) and the conv class SLO as a constraint; then export, checked by a fresh simulation."""

from __future__ import annotations

import io
import json

import optuna
import pytest
import pandas as pd
import yaml
from optimizer_test_helpers import SLO_E2E_S, spec_dict

from objectives import summarize
from optimizer import RayExecutor, StudySpec, Tuner, export_study
from optimizer._backend import SimBackend
from optimizer._storage import trial_metrics
from sim.engine.config import EngineConfig
from sim.profiles import load_gpu, load_model
from sim.runner import simulate


def _fresh(spec: StudySpec, knobs: dict) -> dict:
    """One simulation of ``knobs`` on the study's workload, outside the optimizer."""
    seed = spec.workload.seed
    workload = spec.workload.build(seed)
    result = simulate(workload, EngineConfig.from_dict(knobs), load_model(spec.model), load_gpu(spec.gpu), seed=seed)
    assert result.aborted is None
    return summarize(result.requests, result.steps, workload.classes).to_dict()


def test_study_end_to_end(tmp_path, local_ray):
    spec = StudySpec.from_dict(spec_dict())
    progress = io.StringIO()
    executor = RayExecutor(workers=2)
    result = Tuner(spec, out=tmp_path / "run", executor=executor, progress=progress).run()
    assert result.finished == 20 and result.ran == 20 and result.failed == 0
    assert result.feasible >= 1
    assert "trials 20/20 done (0 failed)" in progress.getvalue()
    assert "best feasible: output_tokens_per_s=" in progress.getvalue()

    study = optuna.load_study(study_name=spec.name, storage=result.storage)
    assert [d.name for d in study.directions] == ["MAXIMIZE", "MINIMIZE"]
    # A trial whose worker died (a loaded machine's OOM killer...) is retried, not counted: the others complete.
    lost = [(t.number, t.user_attrs.get("fail_reason")) for t in study.trials
            if t.state != optuna.trial.TrialState.COMPLETE]
    assert all(study.trials[n].user_attrs.get("retried") for n, _ in lost), lost
    for t in study.trials:
        if t.state != optuna.trial.TrialState.COMPLETE:
            continue
        # Every metric of the summary, per class, is a user attribute; constraints as Optuna and kvtune store them.
        for key in ("output_tokens_per_s", "goodput_rps", "recompute_busy_share", "class.conv.e2e_s.p99",
                    "class.conv.ttft_s.p99", "class.conv.tpot_s.p99", "class.conv.goodput_rps",
                    "class.conv.count.finished", "all.e2e_s.p99"):
            assert key in t.user_attrs, key
        # The bucket cohorts grouped, one attribute per family, read back under their flat keys.
        assert t.user_attrs["prompt_buckets"] and t.user_attrs["output_buckets"] and t.user_attrs["preempted_buckets"]
        flat = trial_metrics(t)
        for key in ("prompt.0-512.e2e_s.p99", "output.0-256.e2e_s.p99", "preempted.0.count.total"):
            assert key in flat, key
        violation = t.user_attrs["constraints"][0]
        p99 = t.user_attrs["class.conv.e2e_s.p99"]
        if p99 <= SLO_E2E_S:  # met: the relative margin
            assert violation == (p99 - SLO_E2E_S) / SLO_E2E_S
        else:  # missed: the share of the class's requests that missed it (lost ones included)
            assert violation == pytest.approx(1.0 - t.user_attrs["class.conv.e2e_s.attainment"]) and violation > 0
        if hasattr(t, "constraints"):
            assert list(t.constraints.values()) == [violation]
        assert t.values[1] == t.user_attrs["class.conv.e2e_s.p99"]
        assert t.user_attrs["knobs"]["max_model_len"] == 4096

    out = tmp_path / "export"
    exported = export_study(spec, out=out, study_out=tmp_path / "run")
    assert exported.feasible
    table = pd.read_csv(out / "pareto.csv")
    # The default config's row is shown too (it misses the SLO here, so it is not on the feasible front).
    assert table["default"].tolist().count(True) == 1
    assert not table.loc[table["default"], "pareto"].any() and not table.loc[table["default"], "feasible"].any()
    pareto = table[table["pareto"]]
    assert len(pareto) == exported.front_size >= 1
    assert pareto["feasible"].all()
    assert {"output_tokens_per_s", "p99_e2e_s:conv", "knob.max_num_seqs", "class.conv.e2e_s.p99"} <= set(pareto)
    assert (pareto["p99_e2e_s:conv"] <= SLO_E2E_S).all()
    # No row dominates another.
    for _, a in pareto.iterrows():
        for _, b in pareto.iterrows():
            assert not (a["output_tokens_per_s"] > b["output_tokens_per_s"]
                        and a["p99_e2e_s:conv"] < b["p99_e2e_s:conv"])
    # The default pick is the highest-throughput Pareto point.
    assert exported.trial == int(pareto.loc[pareto["output_tokens_per_s"].idxmax(), "trial"])

    doc = json.loads((out / "recommended.json").read_text())
    flags = yaml.safe_load((out / "recommended.yaml").read_text())
    assert set(flags) <= spec.vllm_version.flags
    assert doc["vllm_config"] == flags

    # A fresh simulation of the recommended config meets the SLO; the engine's default config misses it, and
    # the recommendation beats it on the objective (throughput) too.
    tuned = _fresh(spec, doc["knobs"])
    default = _fresh(spec, spec.fixed_knobs())
    assert tuned["class.conv.e2e_s.p99"] <= SLO_E2E_S
    assert default["class.conv.e2e_s.p99"] > SLO_E2E_S
    assert tuned["output_tokens_per_s"] > default["output_tokens_per_s"]
    # recommended.json reports the same numbers side by side.
    assert doc["predicted"]["recommended"]["classes"]["conv"]["meets_slo"] is True
    assert doc["predicted"]["default"]["classes"]["conv"]["meets_slo"] is False
    assert abs(doc["predicted"]["default"]["classes"]["conv"]["e2e_s"]["p99"] - default["class.conv.e2e_s.p99"]) < 1e-9
    assert abs(doc["predicted"]["recommended"]["output_tokens_per_s"] - tuned["output_tokens_per_s"]) < 1e-9
    # Robustness: the recommendation re-simulated with KV blocks +-5% and step times +-10% (and the worst corner),
    # against the default under the same perturbation; the verdicts follow from the rows.
    robust = doc["robustness"]
    rows = robust["perturbations"]
    assert [r["perturbation"] for r in rows] == ["kv_blocks -5%", "kv_blocks +5%", "step_time -10%",
                                                  "step_time +10%", "kv_blocks -5%, step_time +10%"]
    for r in rows:
        assert r["beats_default"] == (r["recommended_output_tokens_per_s"] > r["default_output_tokens_per_s"])
    assert robust["meets_slos_under_all"] == all(r["meets_all_slos"] for r in rows)
    assert robust["beats_default_under_all"] == all(r["beats_default"] for r in rows)
    slower = SimBackend(spec.workload, spec.model, spec.gpu, time_scale=1.1).run(doc["knobs"], doc["replicate_seeds"])
    assert rows[3]["recommended_output_tokens_per_s"] == pytest.approx(slower["output_tokens_per_s"])
    assert rows[3]["recommended_output_tokens_per_s"] < tuned["output_tokens_per_s"]
    assert any(line.startswith("# robustness step_time +10%:") for line in (out / "recommended.yaml").read_text().splitlines())


def test_infeasible_export_names_the_failing_class(tmp_path):
    from optimizer import InProcessExecutor

    # An SLO no config can meet: export the closest trial, marked infeasible, naming the class and the excess.
    d = spec_dict(budget={"trials": 4})
    d["workload"]["classes"]["conv"]["slo"] = {"e2e_p99_s": 5.0}
    spec = StudySpec.from_dict(d)
    Tuner(spec, out=tmp_path / "run", executor=InProcessExecutor(), progress=io.StringIO()).run()
    exported = export_study(spec, out=tmp_path / "export", study_out=tmp_path / "run", capacity_search=False)
    assert not exported.feasible
    assert exported.shortfalls and exported.shortfalls[0].class_name == "conv"
    assert "class conv: p99 e2e_s" in str(exported.shortfalls[0]) and "%" in str(exported.shortfalls[0])
    doc = json.loads((tmp_path / "export" / "recommended.json").read_text())
    assert doc["feasible"] is False and doc["shortfalls"][0]["class"] == "conv"
    assert "WARNING: no trial meets every SLO" in (tmp_path / "export" / "recommended.yaml").read_text()
    table = pd.read_csv(tmp_path / "export" / "pareto.csv")  # no Pareto-optimal feasible trial; the default's row
    assert table["default"].tolist() == [True] and table["pareto"].tolist() == [False]
    # Never worse than the default on the class the SLO protects.
    p99 = doc["comparison"]["conv"]["e2e_s"]
    assert doc["predicted"]["recommended"]["classes"]["conv"]["e2e_s"]["p99"] <= max(
        5.0, doc["predicted"]["default"]["classes"]["conv"]["e2e_s"]["p99"])
    assert p99["default"]["trial"] == 0 and not p99["default"]["meets"]

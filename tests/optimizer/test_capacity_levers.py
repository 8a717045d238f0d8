"""Capacity levers (optimizer/_capacity.py): devices, tensor parallelism and KV precision searched beside the
engine knobs, priced; combinations that cannot start are pruned with their reason; a cost objective first picks
the cheapest config that meets every SLO; lower precision is never hidden in the export."""

from __future__ import annotations

import io
import json

import pytest
from optuna.trial import TrialState

from objectives import PRICE_KEY
from optimizer import InProcessExecutor, StudySpec, Tuner
from optimizer._capacity import deployment_of, router_deployment
from optimizer._export import export_study
from optimizer._storage import PRUNE_REASON, is_default, trial_metrics
from optimizer.cli import main
from sim.errors import ConfigError
from sim.profiles import load_gpu

from optimizer_test_helpers import SLO_E2E_S, spec_dict, write_spec


def _run(tmp_path, d):
    spec = StudySpec.from_dict(d)
    tuner = Tuner(spec, storage=f"sqlite:///{tmp_path}/s.db", executor=InProcessExecutor(), progress=io.StringIO())
    tuner.run()
    return spec, tuner


def test_the_cheapest_config_that_meets_every_slo(tmp_path):
    d = spec_dict(gpu=["L40S", "H100-SXM"], objectives=["cost_per_hour_usd"],
                  search={"base": "none", "kv_cache_dtype": ["auto", "fp8"]}, sampler={"name": "grid", "seed": 0},
                  budget={"trials": 10})
    spec, tuner = _run(tmp_path, d)
    assert spec.gpu == "L40S" and spec.search["gpu"].choices == ("L40S", "H100-SXM")
    trials = tuner.study.get_trials()
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(complete) == 5 and is_default(complete[0])  # 2 devices x 2 KV dtypes, and the default
    for t in complete:
        device = t.user_attrs["knobs"].get("gpu", "L40S")
        assert t.values[0] == trial_metrics(t)[PRICE_KEY] == load_gpu(device).price_per_hour_usd
    blocks = {(t.params.get("gpu"), t.params.get("kv_cache_dtype")): t.user_attrs["sim.num_gpu_blocks"]
              for t in complete if not is_default(t)}
    assert blocks[("H100-SXM", "auto")] > blocks[("L40S", "auto")]  # each trial ran on its own device
    assert blocks[("L40S", "fp8")] > blocks[("L40S", "auto")]
    exported = export_study(spec, storage=tuner.storage, out=tmp_path / "export", context=tuner.ctx)
    feasible = [t for t in complete if t.user_attrs["feasible"]]
    assert feasible and exported.feasible
    cheapest = min(t.values[0] for t in feasible)
    doc = json.loads((tmp_path / "export" / "recommended.json").read_text())
    assert doc["deployment"]["price_per_hour_usd"] == cheapest and "cheapest" in doc["pick"]["rule"]
    assert doc["predicted"]["recommended"]["classes"]["conv"]["e2e_s"]["p99"] <= SLO_E2E_S
    assert doc["predicted"]["recommended"]["cost"]["cost_per_hour_usd"] == cheapest
    if doc["knobs"].get("kv_cache_dtype") == "fp8":  # lower precision is said, with sources
        assert doc["quality"] and doc["quality"][0]["sources"]
        assert "LOWER PRECISION" in (tmp_path / "export" / "recommended.yaml").read_text()
    else:
        assert doc["quality"] == []


def test_a_device_yaml_in_the_gpu_list_is_searched_and_priced(tmp_path):
    # issue 30: "gpu can be a list: device names or device YAMLs". A YAML beside the spec, by relative path: a
    # 96 GB device at $3.10/h; its trials run on its memory and carry its price.
    import yaml

    from optimizer import load_study_spec

    (tmp_path / "big.yaml").write_text(yaml.safe_dump({
        "name": "Big-96", "mem_gb": 96.0, "hbm_bw_gbps": 864, "bf16_tflops": 362, "host_link_gbps": 25.0,
        "price_per_hour_usd": 3.10, "price_source": "a test", "price_date": "2026-12-06"}))
    d = spec_dict(gpu=["L40S", "big.yaml"], objectives=["cost_per_hour_usd"],
                  search={"base": "none", "max_num_seqs": [128]}, sampler={"name": "grid", "seed": 0},
                  budget={"trials": 5})
    d["workload"]["max_requests"] = 60
    spec = load_study_spec(write_spec(tmp_path, d))
    big = str(tmp_path / "big.yaml")
    assert spec.gpu == "L40S" and spec.search["gpu"].choices == ("L40S", big)
    tuner = Tuner(spec, storage=f"sqlite:///{tmp_path}/s.db", executor=InProcessExecutor(), progress=io.StringIO())
    tuner.run()
    complete = {t.params.get("gpu"): t for t in tuner.study.get_trials()
                if t.state == TrialState.COMPLETE and not is_default(t)}
    assert set(complete) == {"L40S", big}
    assert trial_metrics(complete[big])[PRICE_KEY] == 3.10 == complete[big].values[0]
    assert complete[big].user_attrs["sim.num_gpu_blocks"] > 2 * complete["L40S"].user_attrs["sim.num_gpu_blocks"]
    # Without a price, a cost objective refuses it by its place in the list.
    (tmp_path / "unpriced.yaml").write_text(yaml.safe_dump({
        "name": "Big-96", "mem_gb": 96.0, "hbm_bw_gbps": 864, "bf16_tflops": 362, "host_link_gbps": 25.0}))
    d["gpu"] = ["L40S", "unpriced.yaml"]
    with pytest.raises(ConfigError) as err:
        load_study_spec(write_spec(tmp_path, d))
    assert "gpu[1]" in str(err.value) and "has no price" in str(err.value)


def test_a_deployment_that_cannot_start_is_pruned_with_its_reason(tmp_path):
    # Llama-3-70B's 141 GB of BF16 weights need more than one L40S (48 GB); four hold them.
    d = spec_dict(model="Llama-3-70B", search={"base": "none", "tensor_parallel_size": [1, 4]},
                  sampler={"name": "grid", "seed": 0}, budget={"trials": 10})
    d["workload"]["max_requests"] = 30
    spec, tuner = _run(tmp_path, d)
    trials = tuner.study.get_trials()
    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    assert {t.user_attrs["knobs"]["tensor_parallel_size"] for t in pruned} == {1}
    assert len(pruned) == 2 and any(is_default(t) for t in pruned)  # the default (TP 1) and the TP-1 draw
    assert all("cannot start: Llama-3-70B on one L40S" in t.user_attrs[PRUNE_REASON] for t in pruned)
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert [t.params for t in complete] == [{"tensor_parallel_size": 4}]
    assert trial_metrics(complete[0])[PRICE_KEY] == pytest.approx(4 * load_gpu("L40S").price_per_hour_usd)
    # The report lists the pruned trials with their reasons (the default config by name).
    from optimizer.report import gather
    from optimizer.report._page import render_page

    data = gather(spec, tuner.ctx, trials, f"sqlite:///{tmp_path}/s.db", simulate=False)
    rows = data.failed.set_index("number")
    assert sorted(rows.index) == sorted(t.number for t in pruned) and set(rows["kind"]) == {"pruned"}
    for t in pruned:
        assert rows.loc[t.number, "reason"] == t.user_attrs[PRUNE_REASON]
        assert rows.loc[t.number, "params"] == ("(the engine's default config)" if is_default(t)
                                                else "tensor_parallel_size=1")
    page = render_page(data, [])
    assert "<h2>Failed and pruned trials</h2>" in page and "cannot start: Llama-3-70B on one L40S" in page


def test_tensor_parallelism_over_one_node_is_pruned_with_its_reason(tmp_path):
    # issue 30: "TP over the devices of a node" cannot start. CoreWeave sells GH200 one per node (gpus_per_node 1
    # in sim/data/hardware.yaml): its TP-2 trial is pruned with that reason; the L40S's (8 per node) runs.
    from optimizer._capacity import capacity_candidates

    d = spec_dict(gpu=["L40S", "GH200"], search={"base": "none", "tensor_parallel_size": [1, 2]},
                  sampler={"name": "grid", "seed": 0}, budget={"trials": 10})
    d["workload"]["max_requests"] = 30
    spec, tuner = _run(tmp_path, d)
    trials = tuner.study.get_trials()
    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    assert [t.params for t in pruned] == [{"gpu": "GH200", "tensor_parallel_size": 2}]
    assert pruned[0].user_attrs[PRUNE_REASON] == (
        f"cannot start: Llama-2-7B on 2 x GH200 (TP 2), ${2 * load_gpu('GH200').price_per_hour_usd:.2f}/h: TP 2 "
        f"spans more GPUs than one GH200 node holds (1: its gpus_per_node); tensor parallelism runs within one node")
    complete = {tuple(sorted(t.params.items())) for t in trials if t.state == TrialState.COMPLETE}
    assert (("gpu", "L40S"), ("tensor_parallel_size", 2)) in complete and len(complete) == 4  # with the default's ()
    # The export's capacity search never proposes TP over one GH200 node.
    gh200 = [k for k in capacity_candidates(spec.fixed_knobs(), spec.model, spec.gpu) if k["gpu"] == "GH200"]
    assert gh200 and {k["tensor_parallel_size"] for k in gh200} == {1}


@pytest.mark.parametrize("value", [0, -1, 2.5, "eight"])
def test_a_bad_gpus_per_node_in_a_device_yaml_names_the_field(tmp_path, value):
    import yaml

    from sim.profiles import load_gpu as load

    path = tmp_path / "dev.yaml"
    path.write_text(yaml.safe_dump({"mem_gb": 48.0, "hbm_bw_gbps": 864, "bf16_tflops": 362, "host_link_gbps": 25.0,
                                    "gpus_per_node": value}))
    with pytest.raises(ConfigError) as err:
        load(str(path))
    assert "gpus_per_node" in str(err.value) and str(path) in str(err.value)


def _no_fp8_device(tmp_path):
    # A priced device whose vLLM has no FP8 KV cache and no FP8 weights (kv_cache_dtypes / quantizations).
    import yaml

    path = tmp_path / "nofp8.yaml"
    path.write_text(yaml.safe_dump({"name": "NoFP8", "mem_gb": 48.0, "hbm_bw_gbps": 864, "bf16_tflops": 362,
                                    "host_link_gbps": 25.0, "price_per_hour_usd": 1.0, "kv_cache_dtypes": ["auto"],
                                    "quantizations": ["none"]}))
    return str(path)


def test_every_bundled_gpu_has_fp8_kv_and_weights():
    # The default (sim/profiles/_types.py, with its vLLM sources): all bundled GPUs start fp8 KV and fp8 weights.
    for name in ("A100-80GB", "A100-40GB", "H100-SXM", "H200", "L40S", "GH200"):
        device = load_gpu(name)
        assert device.kv_cache_dtypes == ("auto", "fp8") and device.quantizations == ("none", "fp8"), name


def test_a_dtype_the_device_lacks_is_pruned_with_its_reason(tmp_path):
    # issue 30: "a dtype the device lacks" cannot start: the device's fp8 trial is pruned with that reason, the
    # L40S's runs; the export's capacity search never proposes it.
    from optimizer._capacity import capacity_candidates, startup_problem

    dev = _no_fp8_device(tmp_path)
    d = spec_dict(gpu=["L40S", dev], search={"base": "none", "kv_cache_dtype": ["auto", "fp8"]},
                  sampler={"name": "grid", "seed": 0}, budget={"trials": 10})
    d["workload"]["max_requests"] = 30
    spec, tuner = _run(tmp_path, d)
    trials = tuner.study.get_trials()
    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    assert [t.params for t in pruned] == [{"gpu": dev, "kv_cache_dtype": "fp8"}]
    assert pruned[0].user_attrs[PRUNE_REASON] == (
        f"cannot start: Llama-2-7B on fp8 KV on one {dev}, $1.00/h: NoFP8 lacks kv_cache_dtype fp8 (its "
        f"kv_cache_dtypes: auto); vLLM cannot start it there")
    complete = {tuple(sorted(t.params.items())) for t in trials if t.state == TrialState.COMPLETE}
    assert (("gpu", "L40S"), ("kv_cache_dtype", "fp8")) in complete and len(complete) == 4  # with the default's ()
    assert "lacks quantization fp8" in startup_problem({"gpu": dev, "quantization": "fp8"}, spec.model, spec.gpu)
    levers = {"gpu": (dev, "L40S"), "tensor_parallel_size": (1,), "kv_cache_dtype": ("auto", "fp8")}
    mine = [k for k in capacity_candidates(spec.fixed_knobs(), spec.model, "H100-SXM", levers) if k["gpu"] == dev]
    assert [k["kv_cache_dtype"] for k in mine] == ["auto"]


@pytest.mark.parametrize("key, value", [("kv_cache_dtypes", "fp8"), ("kv_cache_dtypes", []),
                                        ("kv_cache_dtypes", ["auto", "fp16"]), ("kv_cache_dtypes", ["fp8"]),
                                        ("quantizations", ["none", "int4"]), ("quantizations", [None])])
def test_a_bad_dtype_list_in_a_device_yaml_names_the_file_and_field(tmp_path, key, value):
    import yaml

    from sim.profiles import load_gpu as load

    path = tmp_path / "dev.yaml"
    path.write_text(yaml.safe_dump({"mem_gb": 48.0, "hbm_bw_gbps": 864, "bf16_tflops": 362, "host_link_gbps": 25.0,
                                    key: value}))
    with pytest.raises(ConfigError) as err:
        load(str(path))
    assert err.value.field.startswith(key) and str(path) in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("changes, field, words", [
    (dict(engine={"kv_cache_dtype": "fp8"}), "engine.kv_cache_dtype", ["NoFP8 lacks kv_cache_dtype fp8"]),
    (dict(engine={"quantization": "fp8"}), "engine.quantization", ["NoFP8 lacks quantization fp8"]),
    (dict(search={"base": "none", "kv_cache_dtype": ["fp8"], "max_num_seqs": [8, 16]}), "search.kv_cache_dtype",
     ["vLLM cannot start kv_cache_dtype fp8 on any device"]),
])
def test_a_fixed_dtype_the_device_lacks_is_one_line_exit_2(tmp_path, capsys, changes, field, words):
    dev = _no_fp8_device(tmp_path)
    with pytest.raises(ConfigError) as err:
        StudySpec.from_dict(spec_dict(gpu=dev, **changes))
    assert err.value.field == field
    for w in words:
        assert w in str(err.value), (w, str(err.value))
    path = write_spec(tmp_path, spec_dict(gpu=dev, **changes))
    assert main(["tune", str(path), "--in-process", "--out", str(tmp_path / "run")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"kvtune: error: {field}: "), lines
    assert not (tmp_path / "run").exists()
    # The same choice on a device that has it starts.
    StudySpec.from_dict(spec_dict(gpu=["L40S", dev], **changes))


@pytest.mark.parametrize("changes, field", [
    (dict(gpu=["L40S", "B300"]), "gpu[1]"),
    (dict(gpu=["L40S", "vllm-cpu-1core"], objectives=["usd_per_million_output_tokens"]), "gpu[1]"),
    (dict(search={"base": "none", "gpu": ["L40S", "vllm-cpu-1core"]}, objectives=["cost_per_hour_usd"]),
     "search.gpu.choices[1]"),
    (dict(gpu="vllm-cpu-1core", objectives=["cost_per_hour_usd"]), "gpu"),
    (dict(search={"base": "none", "tensor_parallel_size": [1, 3]}), "search.tensor_parallel_size.choices[1]"),
    (dict(gpu=["L40S", "H200"], search={"base": "none", "gpu": ["H100-SXM"]}), "search.gpu"),
    (dict(search={"base": "none", "gpu": ["L40S", "H100-SXM", "nope"]}), "search.gpu.choices[2]"),
    (dict(engine={"gpu": "H100-SXM"}), "engine.gpu"),
])
def test_bad_capacity_levers_are_one_error_naming_the_field(changes, field):
    with pytest.raises(ConfigError) as err:
        StudySpec.from_dict(spec_dict(**changes))
    assert err.value.field == field


@pytest.mark.parametrize("changes, expect", [
    (dict(gpu=["L40S", "B300"]), "gpu[1]: unknown GPU 'B300'"),
    (dict(gpu=["L40S", "vllm-cpu-1core"], objectives=["cost_per_hour_usd"]),
     "gpu[1]: device 'vllm-cpu-1core' has no price"),
    (dict(search={"base": "none", "gpu": ["L40S", "vllm-cpu-1core"]}, objectives=["usd_per_million_output_tokens"]),
     "search.gpu.choices[1]: device 'vllm-cpu-1core' has no price"),
    (dict(tensor_parallel_size=3), "tensor_parallel_size: must be one of [1, 2, 4, 8], got 3"),
    (dict(search={"base": "none", "tensor_parallel_size": [1, 16]}),
     "search.tensor_parallel_size.choices[1]: must be one of [1, 2, 4, 8], got 16"),
])
def test_bad_capacity_levers_via_kvtune_tune_are_one_line_exit_2(tmp_path, capsys, changes, expect):
    # issue 30: the field the spec wrote (a top-level gpu list is gpu[i], not search.gpu), one line, exit 2.
    path = write_spec(tmp_path, spec_dict(**changes))
    assert main(["tune", str(path), "--in-process", "--out", str(tmp_path / "run")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"kvtune: error: {expect}"), lines
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("changes, field, words", [
    # A larger TP of one node holds the weights: the TP field the spec wrote (or would write) is named.
    (dict(model="Llama-3-70B"), "tensor_parallel_size", ["(model, gpu, tensor_parallel_size)", "TP 4 on L40S"]),
    (dict(model="Llama-3-70B", gpu="A100-40GB", search={"base": "none", "tensor_parallel_size": [1, 2]}),
     "search.tensor_parallel_size", ["(model, gpu, search.tensor_parallel_size)", "on A100-40GB at TP 2",
                                     "TP 8 on A100-40GB would hold them: add it to search.tensor_parallel_size"]),
    (dict(model="Llama-3-70B", gpu=["L40S", "A100-40GB"]), "tensor_parallel_size",
     ["on L40S at TP 1", "on A100-40GB at TP 1", "TP 4 on L40S, TP 4 on A100-40GB"]),
    (dict(model="Llama-3-70B", search={"base": "none", "gpu": ["L40S", "A100-40GB"]}), "tensor_parallel_size",
     ["(model, search.gpu, tensor_parallel_size)", "a larger search.gpu"]),
    # No TP of one node holds them: the device is named.
    (dict(model="Llama-3-70B", gpu="vllm-cpu-1core", search={"base": "none", "max_num_seqs": [8, 16]}), "gpu",
     ["no tensor parallelism within one node holds them: a larger gpu, a smaller model or FP8 weights"]),
    # One GH200 per node (gpus_per_node 1): TP 2 cannot start there, and TP 1 does not hold 70B's weights.
    (dict(model="Llama-3-8B", gpu="GH200", tensor_parallel_size=2), "tensor_parallel_size",
     ["on GH200 TP 2 spans more GPUs than one GH200 node holds (1: its gpus_per_node)",
      "TP 1 on GH200 would hold them: set tensor_parallel_size"]),
    (dict(model="Llama-3-70B", gpu="GH200", search={"base": "none", "tensor_parallel_size": [1, 2]}), "gpu",
     ["on GH200 at TP 1: Llama-3-70B needs", "no tensor parallelism within one node holds them"]),
    (dict(model="Llama-3-70B", gpu="H100-SXM", engine={"max_model_len": 4096, "gpu_memory_utilization": 0.3},
          search={"base": "none", "max_num_seqs": [8, 16]}), "tensor_parallel_size",
     ["a higher engine.gpu_memory_utilization (now 0.3)"]),
    # The weights fit, one max-length request does not: max_model_len.
    (dict(gpu="A100-40GB", engine={"max_model_len": 4096, "gpu_memory_utilization": 0.37},
          search={"base": "none", "max_num_seqs": [8, 16]}), "engine.max_model_len",
     ["cannot hold one max-length request", "needs 4096", "lower engine.max_model_len (now 4096)"]),
])
def test_a_model_that_fits_no_device_names_the_fields_to_change(changes, field, words):
    # issue 30: a study none of whose deployments can start was reported under `gpu` whatever the cause.
    with pytest.raises(ConfigError) as err:
        StudySpec.from_dict(spec_dict(**changes))
    assert err.value.field == field
    for w in words:
        assert w in str(err.value), (w, str(err.value))


def test_a_model_that_fits_no_device_via_kvtune_tune_is_one_line_exit_2(tmp_path, capsys):
    path = write_spec(tmp_path, spec_dict(model="Llama-3-70B", gpu=["L40S", "A100-40GB"]))
    assert main(["tune", str(path), "--in-process", "--out", str(tmp_path / "run")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvtune: error: tensor_parallel_size: Llama-3-70B cannot start "
                                                   "on any device of this study"), lines
    assert not (tmp_path / "run").exists()


def test_a_deployment_says_what_it_is_and_costs():
    dep = deployment_of({"gpu": "H100-SXM", "tensor_parallel_size": 2, "kv_cache_dtype": "fp8"}, "L40S")
    assert dep.gpus == 2 and dep.price_per_hour_usd == pytest.approx(2 * load_gpu("H100-SXM").price_per_hour_usd)
    assert dep.describe().startswith("fp8 KV on 2 x H100-SXM (TP 2), $")
    assert deployment_of({}, "L40S").describe() == f"one L40S, ${load_gpu('L40S').price_per_hour_usd:.2f}/h"


def test_lower_precision_can_be_excluded(tmp_path):
    with pytest.raises(ConfigError) as err:
        StudySpec.from_dict(spec_dict(lower_precision=False, search={"base": "none", "kv_cache_dtype": ["auto", "fp8"]}))
    assert err.value.field == "search.kv_cache_dtype"
    with pytest.raises(ConfigError) as err:
        StudySpec.from_dict(spec_dict(lower_precision="no"))
    assert err.value.field == "lower_precision"
    # An SLO nothing meets: the export's capacity search then tries full-precision deployments only.
    d = spec_dict(lower_precision=False, search={"base": "none", "max_num_seqs": [32]}, budget={"trials": 2},
                  sampler={"name": "grid", "seed": 0})
    d["workload"]["max_requests"] = 60
    d["workload"]["classes"]["conv"]["slo"] = {"e2e_p99_s": 0.5}
    spec, tuner = _run(tmp_path, d)
    exported = export_study(spec, storage=tuner.storage, out=tmp_path / "export", context=tuner.ctx)
    change = exported.capacity_change
    assert not exported.feasible and change["tried"] and not change["found"]
    assert not any("fp8" in t["deployment"] for t in change["tried"])
    assert [t["deployment"] for t in change["tried"]][:2] == [
        f"one A100-80GB, ${load_gpu('A100-80GB').price_per_hour_usd:.2f}/h",
        f"2 x L40S (TP 2), ${2 * load_gpu('L40S').price_per_hour_usd:.2f}/h"]
    assert "none of the 12 cheapest deployments" in exported.summary()


def test_replicas_and_routers_are_searched_and_priced(tmp_path):
    d = spec_dict(search={"base": "none", "replicas": [1, 2], "router": ["round_robin", "sglang_cache_aware"]},
                  sampler={"name": "grid", "seed": 0}, budget={"trials": 10})
    d["workload"]["max_requests"] = 120
    spec, tuner = _run(tmp_path, d)
    complete = {json.dumps(t.params, sort_keys=True): t for t in tuner.study.get_trials()
                if t.state == TrialState.COMPLETE}
    assert len(complete) == 5  # the default and the 2 x 2 grid
    price = load_gpu("L40S").price_per_hour_usd
    default = complete["{}"]
    one_rr = complete[json.dumps({"replicas": 1, "router": "round_robin"}, sort_keys=True)]
    two = complete[json.dumps({"replicas": 2, "router": "sglang_cache_aware"}, sort_keys=True)]
    # One replica behind round robin is the single engine.
    for key in ("output_tokens_per_s", "class.conv.e2e_s.p99", "preemptions_total"):
        assert one_rr.user_attrs[key] == default.user_attrs[key], key
    assert trial_metrics(one_rr)[PRICE_KEY] == price and trial_metrics(two)[PRICE_KEY] == 2 * price
    assert two.user_attrs["fleet.requests"] == 120 and 0 < two.user_attrs["fleet.max_load_ratio"]
    assert two.user_attrs["class.conv.e2e_s.p99"] < default.user_attrs["class.conv.e2e_s.p99"]
    dep = deployment_of(two.user_attrs["knobs"], "L40S")
    assert dep.describe().startswith("2 replicas of one L40S behind sglang_cache_aware")
    fleet = router_deployment(deployment_of({**two.user_attrs["knobs"], "router.cache_threshold": 0.5}, "L40S"))
    assert fleet["sglang_router"].endswith("--worker-urls http://REPLICA0:8000 http://REPLICA1:8000 --policy "
                                           "cache_aware --cache-threshold 0.5")
    assert router_deployment(deployment_of({}, "L40S")) is None
    assert router_deployment(deployment_of({"replicas": 3}, "L40S"))["production_stack"] == "--routing-logic roundrobin"


@pytest.mark.parametrize("search, field", [
    ({"router": ["round_robin", "nope"]}, "search.router.choices[1]"),
    ({"replicas": [0, 2]}, "search.replicas.choices[0]"),
    ({"router": ["sglang_cache_aware"], "router.cache_threshold": {"low": 0.1, "high": 1.5}},
     "search.router.cache_threshold"),
    ({"router": ["round_robin"], "router.cache_threshold": [0.5]}, "search.router.cache_threshold"),
    ({"router.no_such_param": [1.0]}, "search.router.no_such_param.choices[0]"),
])
def test_bad_fleet_levers_are_one_error_naming_the_field(search, field):
    with pytest.raises(ConfigError) as err:
        StudySpec.from_dict(spec_dict(search={"base": "none", **search}))
    assert err.value.field == field

import pandas as pd
import pytest

from sim.errors import ConfigError
from sim.workload import DEFAULT_CLASS, ClassRules, Workload, load_trace

FRAME = pd.DataFrame({
    "arrival_s": [0.0, 1.0, 2.0, 3.0, 4.0],
    "prompt_tokens": [100, 5000, 300, 9000, 50],
    "output_tokens": [10, 20, 30, 40, 50],
    "trace_class": ["conv", "conv", "code", "code", None],
    "Model": ["ChatGPT", "GPT-4", "GPT-4", "ChatGPT", "ChatGPT"],
})


def test_first_matching_rule_wins_and_unmatched_go_to_default():
    rules = ClassRules.from_dict({
        "long": {"match": {"prompt_tokens": {"min": 4096}}, "slo": {"ttft_p99_s": 10}},
        "code": {},  # no match: rows labelled "code"
        "gpt4": {"match": {"Model": ["GPT-4"]}},
    })
    names, unmatched = rules.assign(FRAME)
    assert names.tolist() == ["default", "long", "code", "long", "default"]
    assert unmatched == 2
    assert list(rules.classes()) == ["long", "code", "gpt4", DEFAULT_CLASS]


def test_match_conditions_and_any_of():
    rules = ClassRules.from_dict({
        "short_chatgpt": {"match": {"model": "ChatGPT", "prompt_tokens": {"max": 1000}}},
        "either": {"match": [{"trace_class": "code"}, {"output_tokens": [20]}]},
    })
    names, unmatched = rules.assign(FRAME)
    assert names.tolist() == ["short_chatgpt", "either", "either", "either", "short_chatgpt"]
    assert unmatched == 0


def test_class_fields_and_default_class_slo():
    rules = ClassRules.from_dict({
        "chat": {"match": {"trace_class": "conv"}, "slo": {"ttft_p99_s": 2, "tpot_p99_s": 0.1},
                 "timeout_s": 60, "cancel_probability": 0.05, "cancel_after_s": [2, 20], "priority": -1},
        "default": {"slo": {"e2e_p99_s": 300}},
    })
    chat = rules.classes()["chat"]
    assert (chat.slo.ttft_p99_s, chat.slo.tpot_p99_s, chat.timeout_s) == (2.0, 0.1, 60.0)
    assert (chat.cancel_probability, chat.cancel_after_s, chat.priority) == (0.05, (2.0, 20.0), -1)
    assert rules.default.slo.e2e_p99_s == 300
    assert ClassRules.from_dict(rules.to_dict()) == rules


@pytest.mark.parametrize("spec, field", [
    ({"chat": {"slo": {"ttft_p99": 2}}}, "workload.classes.chat.slo.ttft_p99"),
    ({"chat": {"slo": {"ttft_p99_s": -2}}}, "workload.classes.chat.slo.ttft_p99_s"),
    ({"chat": {"timeout": 5}}, "workload.classes.chat.timeout"),
    ({"chat": {"timeout_s": "soon"}}, "workload.classes.chat.timeout_s"),
    ({"chat": {"cancel_probability": 1.5}}, "workload.classes.chat.cancel_probability"),
    ({"chat": {"cancel_after_s": [5, 1]}}, "workload.classes.chat.cancel_after_s"),
    ({"chat": {"priority": 0.5}}, "workload.classes.chat.priority"),
    ({"chat": {"match": {}}}, "workload.classes.chat.match"),
    ({"chat": {"match": {"prompt_tokens": {"min": 5, "max": 1}}}}, "workload.classes.chat.match.prompt_tokens"),
    ({"chat": {"match": {"prompt_tokens": {"above": 5}}}}, "workload.classes.chat.match.prompt_tokens.above"),
    ({"chat": {"match": [{"Model": "x"}, 3]}}, "workload.classes.chat.match[1]"),
    ({"default": {"match": {"Model": "x"}}}, "workload.classes.default.match"),
    ({"chat": 5}, "workload.classes.chat"),
    ([1], "workload.classes"),
])
def test_bad_specs_name_the_key(spec, field):
    with pytest.raises(ConfigError) as err:
        ClassRules.from_dict(spec, "workload.classes")
    assert err.value.field == field


def test_rule_on_missing_column_names_rule_and_columns():
    rules = ClassRules.from_dict({"x": {"match": {"Log Type": "API log"}}})
    with pytest.raises(ConfigError, match=r"classes.x.match.Log Type: the trace has no column 'Log Type'"):
        rules.assign(FRAME)
    rules = ClassRules.from_dict({"x": {"match": {"Model": {"min": 3}}}})
    with pytest.raises(ConfigError, match="needs a numeric column"):
        rules.assign(FRAME)
    bare = pd.DataFrame({"prompt_tokens": [1], "output_tokens": [1], "arrival_s": [0.0]})
    with pytest.raises(ConfigError, match="classes.x.match: is required"):
        ClassRules.from_dict({"x": {}}).assign(bare)


def test_load_trace_with_rules_keeps_original_label(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("arrival_s,prompt_tokens,output_tokens,class\n0,10,5,chat\n1,9000,6,chat\n2,30,7,batch\n")
    rules = ClassRules.from_dict({"long": {"match": {"prompt_tokens": {"min": 8192}}}, "chat": {}})
    w = load_trace(p, classes=rules)
    assert w.requests["class"].tolist() == ["chat", "long", "default"]
    assert w.requests["trace_class"].tolist() == ["chat", "chat", "batch"]
    assert w.report.unmatched_rows == 1
    assert set(w.classes) == {"long", "chat", "default"}


def test_default_class_left_out_when_every_row_matches(data_dir):
    rules = ClassRules.from_dict({"conv": {"slo": {"ttft_p99_s": 3}}})
    w = load_trace(data_dir / "azure_conv_2023_head.normalized.csv", classes=rules)
    assert set(w.classes) == {"conv"} and w.report.unmatched_rows == 0
    assert isinstance(w, Workload) and w.classes["conv"].slo.ttft_p99_s == 3

import numpy as np
import pytest

from sim.errors import ConfigError, TraceError
from sim.workload import ArrivalSpec, detect_format, interarrival_cv, load_trace

from .conftest import write


def test_length_file_needs_an_arrival_process(data_dir):
    p = data_dir / "sharegpt_lengths_head.csv"
    with pytest.raises(TraceError, match="has no arrival times"):
        load_trace(p)
    with pytest.raises(TraceError, match="has no arrival times"):
        load_trace(p, arrival=ArrivalSpec("replay"))
    with pytest.raises(ConfigError, match="arrival.rate_rps"):
        load_trace(p, arrival=ArrivalSpec("poisson"))
    w = load_trace(p, "sharegpt", arrival=ArrivalSpec("poisson", rate_rps=4.0), seed=3)
    assert len(w) == 30 and w.requests["prompt_tokens"].tolist()[:3] == [74, 290, 1402]
    assert np.all(np.diff(w.requests["arrival_s"]) >= 0)
    again = load_trace(p, "sharegpt", arrival=ArrivalSpec("poisson", rate_rps=4.0), seed=3)
    assert w.requests["arrival_s"].tolist() == again.requests["arrival_s"].tolist()


def test_etalon_style_column_names(tmp_path):
    p = write(tmp_path, "lens.csv", "num_prefill_tokens,num_decode_tokens\n100,20\n2000,7\n")
    assert detect_format(p) == "sharegpt"
    w = load_trace(p, arrival=ArrivalSpec("gamma", rate_rps=1.0, cv=3.0))
    assert w.requests["output_tokens"].tolist() == [20, 7]


def test_gamma_arrivals_on_lengths_have_the_cv(data_dir, shared_traces):
    w = load_trace(shared_traces / "sharegpt_lengths.csv", arrival=ArrivalSpec("gamma", rate_rps=5.0, cv=2.0))
    assert interarrival_cv(w.requests["arrival_s"].to_numpy()) == pytest.approx(2.0, rel=0.08)
    assert len(w) / w.span_s == pytest.approx(5.0, rel=0.05)


def test_bad_length_row(tmp_path):
    p = write(tmp_path, "lens.csv", "input_len,output_len\n100,20\n2000,-7\n")
    with pytest.raises(TraceError, match=r"lens.csv:3: output_len=-7 is negative"):
        load_trace(p, arrival=ArrivalSpec("poisson", rate_rps=1.0))
    with pytest.raises(TraceError, match="needs a prompt length column"):
        load_trace(write(tmp_path, "x.csv", "a,b\n1,2\n"), "sharegpt", arrival=ArrivalSpec("poisson", rate_rps=1.0))

"""Writing a workload as a normalized trace (CSV, CSV.GZ or parquet), readable back with format ``normalized``."""

from __future__ import annotations

from pathlib import Path

from sim.errors import ConfigError
from sim.outputs import atomic_write, probe_out_dir
from sim.workload._files import kind_of
from sim.workload.workload import Workload

_FIRST = ["arrival_s", "prompt_tokens", "output_tokens", "class"]


def write_trace(workload: Workload, path: str | Path) -> Path:
    """Columns ``arrival_s,prompt_tokens,output_tokens,class`` then the extras; ``hash_ids`` as ``"1 2 3"`` in CSV."""
    path = Path(path)
    kind = kind_of(path)
    if kind == "jsonl":
        raise ConfigError("out", f"{path}: write .csv, .csv.gz or .parquet")
    df = workload.requests
    columns = _FIRST + [c for c in df.columns if c not in _FIRST and c != "request_id"]
    out = df[columns].copy()
    if kind == "csv" and "hash_ids" in out.columns:
        out["hash_ids"] = [" ".join(map(str, ids)) for ids in out["hash_ids"]]
    probe_out_dir(path.parent, "out")
    with atomic_write(path, "out") as tmp:
        if kind == "parquet":
            out.to_parquet(tmp, index=False)
        else:
            out.to_csv(tmp, index=False, float_format="%.6f", compression="gzip" if path.suffix == ".gz" else None)
    return path

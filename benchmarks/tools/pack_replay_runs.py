"""Replay result folders <-> one compact file: what a test needs of raw runs, without a folder of parquet files.

A replay result folder (``replay.results.ReplayResult.save``) holds ``replay.json`` and a few small parquet
tables; parquet's per-file overhead is most of their size.  ``pack`` writes several folders into one gzipped
JSON (each table as its columns, with their dtypes; floats as Python writes them, so they read back exactly);
``unpack`` writes the folders back, which ``ReplayResult.load`` and ``kvtune calibrate`` read as before.

    python benchmarks/tools/pack_replay_runs.py pack OUT.json.gz FOLDER...
    python benchmarks/tools/pack_replay_runs.py unpack FILE.json.gz INTO
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

import pandas as pd

FORMAT = "kvtune-replay-runs/1"


def _table(frame: pd.DataFrame) -> dict:
    return {"dtypes": {c: str(t) for c, t in frame.dtypes.items()},
            "columns": {c: frame[c].tolist() for c in frame.columns}}


def _frame(doc: dict) -> pd.DataFrame:
    frame = pd.DataFrame(doc["columns"], columns=list(doc["dtypes"]))
    return frame.astype(doc["dtypes"]) if len(frame.columns) else frame


def pack(folders: list[Path], out: Path) -> Path:
    """Write ``folders`` (each a replay result folder, named by its folder name) into the gzipped JSON ``out``."""
    runs = []
    for folder in folders:
        folder = Path(folder)
        tables = {p.stem: _table(pd.read_parquet(p)) for p in sorted(folder.glob("*.parquet"))}
        runs.append({"name": folder.name, "replay": json.loads((folder / "replay.json").read_text()),
                     "tables": tables})
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(out, "wt", encoding="utf-8", compresslevel=9) as f:
        json.dump({"format": FORMAT, "runs": runs}, f, separators=(",", ":"))
    return out


def unpack(packed: Path, into: Path) -> list[Path]:
    """Write the folders of ``packed`` under ``into``; returns them in packing order."""
    with gzip.open(packed, "rt", encoding="utf-8") as f:
        doc = json.load(f)
    if doc.get("format") != FORMAT:
        raise ValueError(f"{packed}: not a {FORMAT} file")
    folders = []
    for run in doc["runs"]:
        folder = Path(into) / run["name"]
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "replay.json").write_text(json.dumps(run["replay"], indent=2))
        for name, table in run["tables"].items():
            _frame(table).to_parquet(folder / f"{name}.parquet", index=False)
        folders.append(folder)
    return folders


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="verb", required=True)
    p = sub.add_parser("pack", help="result folders -> one .json.gz")
    p.add_argument("out", type=Path)
    p.add_argument("folders", type=Path, nargs="+")
    u = sub.add_parser("unpack", help="one .json.gz -> result folders")
    u.add_argument("packed", type=Path)
    u.add_argument("into", type=Path)
    args = ap.parse_args(argv)
    if args.verb == "pack":
        out = pack(sorted(args.folders), args.out)
        print(f"{len(args.folders)} runs -> {out} ({out.stat().st_size} bytes)")
    else:
        print(f"{len(unpack(args.packed, args.into))} runs -> {args.into}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

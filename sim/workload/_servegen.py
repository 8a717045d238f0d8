"""ServeGen workloads: production per-client arrival and length distributions, turned into requests.

ServeGen (alibaba/ServeGen, "ServeGen: Workload Characterization of Large Language Model Serving in Production",
arXiv 2505.09999) publishes no request-by-request trace but, per client ``N`` of a model's traffic:

- ``chunk-N-trace.csv`` (no header): one row per 600 s window, ``window_start_s, rate_rps, cv, distribution,
  shape, scale``: the window's request rate and the inter-arrival distribution fitted to it (``Gamma`` or
  ``Weibull``, numpy's shape/scale parameters); rate 0 is an idle window;
- ``chunk-N-dataset.json``: for window start times (keys, seconds), Python-literal ``{tokens: probability}``
  dicts ``input_tokens`` and ``output_tokens`` (and ``reason_ratio``, not used here).

Requests are generated window by window, as ServeGen's own generator does: inter-arrival gaps from the window's
fitted distribution, rescaled so their mean is the window's measured ``1 / rate_rps`` (the fits do not always
reproduce the rate: a CV-14 Weibull does not), and prompt and output lengths drawn independently from the
length distributions of the latest dataset entry at or before the window.  Each client's requests get
``trace_class`` ``client-N``.  YAML (under ``workload: generator:``)::

    servegen:
      path: ../../shared/data/traces/servegen/deepseek-r1   # folder of chunk-N-* files; relative to the spec
      clients: [35]                  # default: every client in the folder
      start_s: 21600                 # source seconds (a 600 s window boundary or not)
      duration_s: 1200
"""

from __future__ import annotations

import ast
import csv
import json
import math
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd

from sim.errors import ConfigError, TraceError
from sim.fields import check_keys, mapping, number, string

#: ServeGen's window length (seconds).
WINDOW_S = 600.0
_TRACE = re.compile(r"^chunk-(\d+)-trace\.csv$")
_DISTRIBUTIONS = ("Gamma", "Weibull")


@dataclass(frozen=True)
class Window:
    """One 600 s window of one client: measured rate and the fitted inter-arrival distribution."""

    start_s: float
    rate_rps: float
    distribution: str
    shape: float
    scale: float


@dataclass(frozen=True)
class Pmf:
    """A length distribution: token counts and their probabilities (summing to 1)."""

    tokens: np.ndarray
    probs: np.ndarray

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return rng.choice(self.tokens, size=n, p=self.probs)

    @property
    def mean(self) -> float:
        return float((self.tokens * self.probs).sum())


@dataclass(frozen=True)
class Client:
    """A client's windows and its length distributions by start time (sorted)."""

    number: int
    windows: tuple[Window, ...]
    lengths: tuple[tuple[float, Pmf, Pmf], ...]  # (from_s, input, output)

    def lengths_at(self, t: float) -> tuple[Pmf, Pmf]:
        """The latest dataset entry at or before ``t`` (the first one before the first entry)."""
        chosen = self.lengths[0]
        for entry in self.lengths:
            if entry[0] <= t:
                chosen = entry
        return chosen[1], chosen[2]


def client_numbers(folder: Path) -> list[int]:
    """Clients with a trace file in ``folder``, ascending."""
    if not folder.is_dir():
        raise TraceError(str(folder), None, "is not a folder of ServeGen chunk-N-trace.csv and -dataset.json files")
    return sorted(int(m.group(1)) for p in folder.iterdir() if (m := _TRACE.match(p.name)))


def _windows(path: Path) -> tuple[Window, ...]:
    out = []
    with path.open(newline="") as f:
        for line_no, row in enumerate(csv.reader(f), 1):
            if not row:
                continue
            if len(row) != 6:
                raise TraceError(str(path), line_no, f"expected 6 fields (start, rate, cv, distribution, shape, "
                                                      f"scale), got {len(row)}")
            try:
                start, rate, shape, scale = float(row[0]), float(row[1]), float(row[4]), float(row[5])
            except ValueError:
                raise TraceError(str(path), line_no, f"non-numeric field in {row!r}") from None
            dist = row[3].strip()
            if rate < 0 or not math.isfinite(rate):
                raise TraceError(str(path), line_no, f"rate_rps must be >= 0, got {row[1]!r}")
            if rate > 0 and (dist not in _DISTRIBUTIONS or not shape > 0 or not scale > 0):
                raise TraceError(str(path), line_no, f"an active window needs distribution {list(_DISTRIBUTIONS)} "
                                                      f"with shape and scale > 0, got {row[3:]!r}")
            out.append(Window(start, rate, dist, shape, scale))
    return tuple(out)


def _pmf(text: Any, where: str) -> Pmf:
    try:
        table = ast.literal_eval(text) if isinstance(text, str) else text
        tokens = np.array([int(k) for k in table], dtype=np.int64)
        probs = np.array([float(v) for v in table.values()], dtype=float)
    except (ValueError, SyntaxError, TypeError, AttributeError):
        raise TraceError(where, None, "is not a {tokens: probability} mapping") from None
    keep = probs > 0
    tokens, probs = tokens[keep], probs[keep]
    if not len(tokens) or (tokens < 1).any() or not math.isfinite(probs.sum()):
        raise TraceError(where, None, "needs token counts >= 1 with positive probabilities")
    return Pmf(tokens, probs / probs.sum())


def _lengths(path: Path) -> tuple[tuple[float, Pmf, Pmf], ...]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise TraceError(str(path), None, f"cannot read a ServeGen dataset: {exc}") from None
    out = []
    for key, entry in data.items():
        where = f"{path}[{key}]"
        if not isinstance(entry, dict) or not {"input_tokens", "output_tokens"} <= set(entry):
            raise TraceError(where, None, "needs input_tokens and output_tokens")
        out.append((float(key), _pmf(entry["input_tokens"], f"{where}.input_tokens"),
                    _pmf(entry["output_tokens"], f"{where}.output_tokens")))
    if not out:
        raise TraceError(str(path), None, "has no length distributions")
    return tuple(sorted(out, key=lambda e: e[0]))


@lru_cache(maxsize=16)
def load_client(folder: str, number: int) -> Client:
    """Client ``number``'s windows and lengths from ``folder`` (cached: studies build one workload per seed)."""
    base = Path(folder)
    trace, dataset = base / f"chunk-{number}-trace.csv", base / f"chunk-{number}-dataset.json"
    for path in (trace, dataset):
        if not path.is_file():
            raise TraceError(str(path), None, f"missing: client {number} needs its -trace.csv and -dataset.json")
    return Client(number, _windows(trace), _lengths(dataset))


def _gaps(window: Window, n: int, rng: np.random.Generator) -> np.ndarray:
    raw = rng.gamma(window.shape, window.scale, n) if window.distribution == "Gamma" \
        else window.scale * rng.weibull(window.shape, n)
    mean = raw.mean()
    return raw * ((1.0 / window.rate_rps) / mean) if mean > 0 else np.full(n, 1.0 / window.rate_rps)


def client_arrivals(client: Client, start_s: float, end_s: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival times in ``[start_s, end_s)`` (source seconds), window by window."""
    out = []
    for w in client.windows:
        lo, hi = max(w.start_s, start_s), min(w.start_s + WINDOW_S, end_s)
        if w.rate_rps <= 0 or hi <= lo:
            continue
        span = hi - lo
        n = max(8, int(span * w.rate_rps * 2) + 8)
        times = lo + np.cumsum(_gaps(w, n, rng)) * 1.0
        while times[-1] < hi:  # rare: bursty gaps ran short; draw more
            times = np.concatenate([times, times[-1] + np.cumsum(_gaps(w, n, rng))])
        out.append(times[times < hi])
    return np.concatenate(out) if out else np.empty(0)


@dataclass(frozen=True)
class ServeGenSpec:
    """Requests of the ServeGen ``clients`` in ``path`` over ``[start_s, start_s + duration_s)``."""

    path: str
    clients: tuple[int, ...] | None = None
    start_s: float = 0.0
    duration_s: float = WINDOW_S

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "generator.servegen") -> "ServeGenSpec":
        d = mapping(d, where)
        check_keys(d, ("path", "clients", "start_s", "duration_s"), where)
        clients = d.get("clients")
        if clients is not None:
            if not isinstance(clients, list) or not clients or not all(
                    isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in clients):
                raise ConfigError(f"{where}.clients", f"must be a non-empty list of client numbers, got {clients!r}")
            clients = tuple(clients)
        return cls(string(d, "path", where), clients, number(d, "start_s", where, 0.0, minimum=0.0),
                   number(d, "duration_s", where, WINDOW_S, positive=True))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path}
        if self.clients is not None:
            out["clients"] = list(self.clients)
        out.update(start_s=self.start_s, duration_s=self.duration_s)
        return {"servegen": out}

    def folder(self, base_dir: Path | None) -> Path:
        path = Path(self.path).expanduser()
        return path if path.is_absolute() or base_dir is None else Path(base_dir) / path


def servegen_frame(spec: ServeGenSpec, seed: int, base_dir: Path | None = None) -> pd.DataFrame:
    """Rows (arrival_s from 0, prompt_tokens, output_tokens, trace_class) sorted by arrival; deterministic in
    ``seed``; each client draws from its own child stream."""
    folder = spec.folder(base_dir)
    numbers = list(spec.clients) if spec.clients is not None else client_numbers(folder)
    if not numbers:
        raise TraceError(str(folder), None, "has no chunk-N-trace.csv files")
    end = spec.start_s + spec.duration_s
    streams = [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(len(numbers))]
    parts = []
    for number_, rng in zip(numbers, streams):
        client = load_client(str(folder.resolve()), number_)
        arrivals = client_arrivals(client, spec.start_s, end, rng)
        prompt = np.empty(len(arrivals), dtype=np.int64)
        output = np.empty(len(arrivals), dtype=np.int64)
        starts = np.floor(arrivals / WINDOW_S) * WINDOW_S
        for t in np.unique(starts):
            rows = starts == t
            inp, out = client.lengths_at(float(t))
            prompt[rows], output[rows] = inp.sample(int(rows.sum()), rng), out.sample(int(rows.sum()), rng)
        parts.append(pd.DataFrame({"arrival_s": arrivals - spec.start_s, "prompt_tokens": prompt,
                                   "output_tokens": output, "trace_class": f"client-{number_}"}))
    frame = pd.concat(parts, ignore_index=True).sort_values("arrival_s", kind="stable").reset_index(drop=True)
    if frame.empty:
        raise ConfigError("generator.servegen", f"clients {numbers} sent no request in [{spec.start_s:g}, {end:g}) s")
    return frame

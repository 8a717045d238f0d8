"""Scale out: one kvtune study on a multi-node Ray cluster started on this machine, trials per minute against trial
slots, and whether the driver and the Optuna storage keep up at 64 trials at once (issue 34).

What it does:

1. starts a Ray cluster of its own: a head (``ray start --head --num-cpus 0``: it runs no trials, only the GCS and
   the driver's raylet) and ``--nodes`` worker nodes (``ray start --address HEAD --num-cpus --cpus-per-node``), each
   ``ray start --block`` in its own session, under a temp dir of its own; with ``--pin`` (default) the head and the
   driver run on CPU 0 and the worker nodes on the other CPUs (``taskset``), as on a cluster where the driver has a
   machine to itself; the trials then share what the worker nodes have: on a 2-core machine one core for 64 slots;
2. per slot count (``--slots 8,16,32,64``) runs the whole command
   ``kvtune tune SPEC --address HEAD --executor ray --workers S --trials S*WAVES --no-export`` on a fresh SQLite
   file, in a driver process that counts, for the storage: SQL statements and writes (INSERT/UPDATE/DELETE),
   commits and the seconds spent in them (SQLAlchemy engine events), and Optuna heartbeats recorded (and any that
   raised); it reads back the study's own split (``study_run.json``: start, trials, storage, shutdown) and, from
   the storage, the trials' states and crash retries (``retry_of`` / ``crash_attempt`` user attributes);
3. stops its own nodes by their process ids (each node's ``ray start --block`` session, then any process left
   whose command line names this run's temp dir).

The spec is ``studies/kv-pressure-incident.yaml`` with ``workload.max_requests`` set by ``--max-requests``
(default 19366, the whole bundled trace: ~0.5 CPU s a trial), and TPE (its first 12 trials random).

    python benchmarks/ray_cluster.py [--nodes 4] [--cpus-per-node 16] [--slots 8,16,32,64] [--waves 2]
                                     [--max-requests 19366] [--no-pin]

Figures per slot count: trials, the study's wall and its split, the share of the study's wall inside trials
(``trials`` of the split over the study's wall) and of the trial loop (``trials / (trials + storage)``: start-up
and shutdown left out), trials per minute (over the study's wall and over the trial loop), the driver's ask and
tell milliseconds per trial, the storage's writes per second and commits per second (over the study's wall), the
seconds inside SQL statements, heartbeats, failed and retried trials, the process's wall and the driver's CPU
seconds, and the peak memory (PSS) of this run's Ray processes (sampled each second).  Run it on a quiet machine; on a
shared one the figures say what the trials got of it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "studies" / "kv-pressure-incident.yaml"


# ---- the driver: kvtune tune, with the storage's statements and heartbeats counted ---------------------------------
def driver(report: str, argv: list[str]) -> int:
    import resource

    import optuna
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    counts = {"statements": 0, "writes": 0, "rows": 0, "commits": 0, "sql_s": 0.0, "heartbeats": 0, "heartbeat_errors": 0,
              "heartbeat_s": 0.0}
    lock = threading.Lock()
    local = threading.local()

    @event.listens_for(Engine, "before_cursor_execute")
    def _before(conn, cursor, statement, parameters, context, executemany):  # noqa: ANN001
        local.t0 = time.perf_counter()

    @event.listens_for(Engine, "after_cursor_execute")
    def _after(conn, cursor, statement, parameters, context, executemany):  # noqa: ANN001
        dt = time.perf_counter() - getattr(local, "t0", time.perf_counter())
        verb = statement.lstrip()[:6].upper()
        with lock:
            counts["statements"] += 1
            counts["sql_s"] += dt
            if verb in ("INSERT", "UPDATE", "DELETE"):
                counts["writes"] += 1
                counts["rows"] += max(cursor.rowcount, 1)  # an executemany is one statement, many rows

    @event.listens_for(Engine, "commit")
    def _commit(conn):  # noqa: ANN001
        with lock:
            counts["commits"] += 1

    original = optuna.storages.RDBStorage.record_heartbeat

    def record_heartbeat(self, trial_id):  # noqa: ANN001
        t0 = time.perf_counter()
        try:
            return original(self, trial_id)
        except Exception:
            with lock:
                counts["heartbeat_errors"] += 1
            raise
        finally:
            with lock:
                counts["heartbeats"] += 1
                counts["heartbeat_s"] += time.perf_counter() - t0

    optuna.storages.RDBStorage.record_heartbeat = record_heartbeat
    from optimizer import RayExecutor
    from optimizer.cli import main

    # 64 workers warming up on one shared core can take longer than the 300 s a study waits for them by default.
    RayExecutor.__init__.__kwdefaults__["startup_timeout_s"] = float(os.environ.get("RC34_STARTUP_TIMEOUT_S", 1200))

    rc = 1
    try:
        rc = main(argv)
    finally:
        ru = resource.getrusage(resource.RUSAGE_SELF)
        counts["driver_cpu_s"] = ru.ru_utime + ru.ru_stime
        counts["rc"] = rc
        Path(report).write_text(json.dumps(counts))
    return rc


# ---- the cluster ---------------------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _own_pids(tag: str) -> list[int]:
    """This run's Ray processes: those whose command line names ``tag`` (this run's temp dir), and their
    descendants (a trial worker renames itself ``ray::_TrialWorker``)."""
    named, parent = set(), {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        parent[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
        if tag.encode() in cmd:
            named.add(int(entry))
    found = set(named)
    for pid in parent:  # walk up from each process: is one of its ancestors ours?
        p, seen = parent.get(pid), 0
        while p and p not in found and seen < 64:
            p, seen = parent.get(p), seen + 1
        if p in found:
            found.add(pid)
    return sorted(found)


def _pss_mb(pids: list[int]) -> float:
    """Proportional set size: shared library pages split between the processes that map them."""
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


def _available_mb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return float("inf")


class Cluster:
    def __init__(self, nodes: int, cpus_per_node: int, pin: bool):
        self.nodes, self.cpus_per_node, self.pin = nodes, cpus_per_node, pin
        self.tmp = Path(tempfile.mkdtemp(prefix="rc34_", dir="/tmp"))  # short: Ray's socket paths are limited
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.procs: list[subprocess.Popen] = []
        ncpu = os.cpu_count() or 1
        self.driver_cpus = "0" if pin and ncpu > 1 else None
        self.worker_cpus = f"1-{ncpu - 1}" if pin and ncpu > 1 else None
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled"}

    def _start(self, args: list[str], cpus: str | None, name: str) -> None:
        cmd = ["ray", "start", *args, f"--temp-dir={self.tmp}", "--disable-usage-stats", "--block",
               "--object-store-memory=200000000"]
        if cpus is not None:
            cmd = ["taskset", "-c", cpus, *cmd]
        log = open(self.tmp / f"{name}.log", "w")  # noqa: SIM115
        self.procs.append(subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True, cwd=ROOT))
        deadline = time.monotonic() + 120
        while "Ray runtime started" not in (self.tmp / f"{name}.log").read_text():
            if self.procs[-1].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start:\n" + (self.tmp / f"{name}.log").read_text()[-3000:])
            time.sleep(0.5)

    def start(self) -> float:
        t0 = time.perf_counter()
        self._start(["--head", f"--port={self.port}", "--num-cpus=0", "--include-dashboard=false"],
                    self.driver_cpus, "head")
        for i in range(self.nodes):
            self._start([f"--address={self.address}", f"--num-cpus={self.cpus_per_node}"], self.worker_cpus,
                        f"node{i}")
        return time.perf_counter() - t0

    def stop(self) -> None:
        for proc in reversed(self.procs):  # each node's `ray start --block` session, by its own process id
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        time.sleep(2)
        for sig in (signal.SIGTERM, signal.SIGKILL):  # what the raylets left behind: named by this run's temp dir
            for pid in _own_pids(str(self.tmp)):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            time.sleep(1)
        shutil.rmtree(self.tmp, ignore_errors=True)


# ---- one study -----------------------------------------------------------------------------------------------------
def _spec(max_requests: int, folder: Path) -> Path:
    import yaml

    from sim.safe_yaml import read_yaml

    spec = read_yaml(SPEC)
    spec["workload"]["max_requests"] = max_requests
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def _stored(db: Path) -> dict[str, int]:
    con = sqlite3.connect(db)
    try:
        states = dict(con.execute("SELECT state, COUNT(*) FROM trials GROUP BY state").fetchall())
        retries = con.execute("SELECT COUNT(*) FROM trial_user_attributes WHERE key IN ('retry_of', 'crash_attempt')"
                              ).fetchone()[0]
        attrs = con.execute("SELECT COUNT(*) FROM trial_user_attributes").fetchone()[0]
        beats = con.execute("SELECT COUNT(*) FROM trial_heartbeats").fetchone()[0]
    finally:
        con.close()
    return {"complete": states.get("COMPLETE", 0), "failed": states.get("FAIL", 0),
            "pruned": states.get("PRUNED", 0), "retried": retries, "attr_rows": attrs, "heartbeat_rows": beats}


def run_study(cluster: Cluster, spec: Path, slots: int, trials: int, folder: Path) -> dict:
    out = folder / f"s{slots}"
    db = out / "study.db"
    out.mkdir(parents=True)
    report = out / "driver.json"
    cmd = [sys.executable, __file__, "--driver", str(report), "--", "tune", str(spec), "--address", cluster.address,
           "--executor", "ray", "--workers", str(slots), "--trials", str(trials), "--storage", f"sqlite:///{db}",
           "--out", str(out), "--no-export"]
    if cluster.driver_cpus is not None:
        cmd = ["taskset", "-c", cluster.driver_cpus, *cmd]
    peak = [0.0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(1.0):
            peak[0] = max(peak[0], _pss_mb(_own_pids(str(cluster.tmp))))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.perf_counter()
    with open(out / "driver.log", "w") as log:
        proc = subprocess.Popen(cmd, env=cluster.env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        try:
            rc = proc.wait()
        except BaseException:  # interrupted: the driver goes first, then the cluster (main's finally)
            proc.kill()
            proc.wait()
            raise
        finally:
            stop.set()
    wall = time.perf_counter() - t0
    stop.set()
    sampler.join()
    if rc != 0:
        raise RuntimeError(f"the study with {slots} slots failed (rc {rc}):\n" + (out / "driver.log").read_text()[-3000:])
    run = json.loads((out / "study_run.json").read_text())
    drv = json.loads(report.read_text())
    stored = _stored(db)
    split, phases = run["split_s"], run["phases_s"]
    study_wall = run["wall_s"]
    loop = split["trials"] + split["storage"]
    ran = run["ran"]
    return {"slots": slots, "n_trials": ran, "process_wall_s": wall, "study_wall_s": study_wall, **split,
            "in_trials": split["trials"] / study_wall, "in_trials_loop": split["trials"] / loop,
            "trials_per_min": 60 * ran / study_wall, "trials_per_min_loop": 60 * ran / loop,
            "ask_ms": 1000 * phases.get("ask", 0) / max(ran, 1), "tell_ms": 1000 * phases.get("tell", 0) / max(ran, 1),
            "writes_per_s": drv["writes"] / study_wall, "commits_per_s": drv["commits"] / study_wall,
            "rows_per_s": drv["rows"] / study_wall, "executor_start": phases.get("executor_start", 0.0),
            "writes": drv["writes"], "rows": drv["rows"], "statements": drv["statements"], "sql_s": drv["sql_s"],
            "heartbeats": drv["heartbeats"], "heartbeat_errors": drv["heartbeat_errors"],
            "driver_cpu_s": drv["driver_cpu_s"], "ray_peak_mb": peak[0], **stored}


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--driver":
        argv = sys.argv[3:]
        if argv and argv[0] == "--":
            argv = argv[1:]
        sys.path.insert(0, str(ROOT))
        return driver(sys.argv[2], argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=4, help="worker nodes (ray start --address), besides the head")
    p.add_argument("--cpus-per-node", type=int, default=16, help="--num-cpus of each worker node (trial slots)")
    p.add_argument("--slots", default="8,16,32,64", help="trials at once, one study each (comma-separated)")
    p.add_argument("--waves", type=int, default=2, help="trials per study = slots x waves")
    p.add_argument("--max-requests", type=int, default=19366, help="requests per trial (workload.max_requests)")
    p.add_argument("--no-pin", action="store_true", help="do not pin the head and driver to CPU 0, the nodes to the rest")
    p.add_argument("--json", type=Path, help="also write the rows here")
    args = p.parse_args()
    slots = [int(s) for s in args.slots.split(",")]
    if max(slots) > args.nodes * args.cpus_per_node:
        p.error(f"{max(slots)} slots need more than {args.nodes} x {args.cpus_per_node} CPUs")
    cluster = Cluster(args.nodes, args.cpus_per_node, pin=not args.no_pin)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `kill PID` stops the cluster too (main's finally)
    rows = []
    with tempfile.TemporaryDirectory(prefix="rc34_runs_") as folder:
        try:
            started = cluster.start()
            print(f"cluster: head + {args.nodes} nodes x {args.cpus_per_node} CPUs at {cluster.address} in "
                  f"{started:.1f} s; driver CPUs {cluster.driver_cpus or 'all'}, trial CPUs "
                  f"{cluster.worker_cpus or 'all'}; load average {os.getloadavg()[0]:.1f}", flush=True)
            spec = _spec(args.max_requests, Path(folder))
            for s in slots:
                need_mb = 1500 + 180 * s  # a warm trial worker: ~165 MB private (PSS ~170), measured at 8 slots
                if _available_mb() < need_mb:
                    print(f"skipped {s} slots: {_available_mb():.0f} MB available, ~{need_mb} MB needed", flush=True)
                    continue
                row = run_study(cluster, spec, s, s * args.waves, Path(folder))
                row["load"] = os.getloadavg()[0]
                rows.append(row)
                print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
        finally:
            cluster.stop()
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    print()
    print("| slots | trials | study wall s | start / trials / storage / shutdown s | inside trials (of study / of loop) "
          "| trials/min (study / loop) | ask / tell ms | writes/s (rows/s) | commits/s | SQL s | heartbeats (errors) "
          "| failed / retried | driver CPU s | Ray peak MB (PSS) |")
    print("|" + "---|" * 14)
    for r in rows:
        print(f"| {r['slots']} | {r['n_trials']} | {r['study_wall_s']:.1f} | {r['start']:.1f} / {r['trials']:.1f} / "
              f"{r['storage']:.1f} / {r['shutdown']:.1f} | {100 * r['in_trials']:.1f}% / {100 * r['in_trials_loop']:.1f}% "
              f"| {r['trials_per_min']:.0f} / {r['trials_per_min_loop']:.0f} | {r['ask_ms']:.0f} / {r['tell_ms']:.0f} "
              f"| {r['writes_per_s']:.0f} ({r['rows_per_s']:.0f}) | {r['commits_per_s']:.0f} | {r['sql_s']:.1f} | {r['heartbeats']} "
              f"({r['heartbeat_errors']}) | {r['failed']} / {r['retried']} | {r['driver_cpu_s']:.1f} "
              f"| {r['ray_peak_mb']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

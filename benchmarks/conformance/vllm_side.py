#!/usr/bin/env python3
"""The vLLM side of the conformance check: run the shared reference replay script over several jobs in one
process, recording every ``Scheduler.schedule()`` decision.

Run with the reference venv's python (it imports vLLM), never with the project's::

    VENV/bin/python benchmarks/conformance/vllm_side.py jobs.json

``jobs.json`` is a list of ``{"trace": CSV, "args": [replay flags...], "out_dir": DIR}``.  Each job calls the
replay script's own ``main()`` (so admission, the step loop and the time model are exactly the script's), with
``Scheduler.schedule`` wrapped to append one JSON line per call to ``DIR/sched_steps.jsonl``:
``{"step", "sched": [[req_id, tokens], ...] (in vLLM's order), "preempted": [...], "free_after_schedule",
"num_running", "num_waiting"}``.  The script's own ``requests.csv``/``steps.csv``/``summary.json`` land in
``DIR`` too.  Nothing here changes a scheduling decision.

The replay script is found at ``$KVTUNE_VLLM_REPLAY`` or ``/work/shared/tools/vllm-reference/vllm_sched_replay.py``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time

DEFAULT_REPLAY = "/work/shared/tools/vllm-reference/vllm_sched_replay.py"


def load_replay_module(path: str):
    spec = importlib.util.spec_from_file_location("vllm_sched_replay", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        jobs = json.load(f)
    replay = load_replay_module(os.environ.get("KVTUNE_VLLM_REPLAY", DEFAULT_REPLAY))

    from vllm.v1.core.sched.scheduler import Scheduler

    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    state: dict = {"log": None, "step": 0}

    def recorder(original):
        def recording_schedule(self, *args, **kwargs):
            log = state["log"]
            if log is None:
                return original(self, *args, **kwargs)
            # Requests waiting before this call: those scheduled now were admitted; what they had computed
            # before their first chunk is their prefix-cache hit (num_computed_tokens already counts the chunk).
            waiting = [r for queue in (self.waiting, self.kv_holding_waiting) for r in queue]
            so = original(self, *args, **kwargs)
            admitted = [r for r in waiting if r.request_id in so.num_scheduled_tokens]
            row = {
                "step": state["step"],
                "sched": [[rid, int(n)] for rid, n in so.num_scheduled_tokens.items()],
                "preempted": sorted(so.preempted_req_ids) if so.preempted_req_ids else [],
                "free_after_schedule": self.kv_cache_manager.block_pool.get_num_free_blocks(),
                "num_running": len(self.running),
                "num_waiting": len(self.waiting) + len(self.kv_holding_waiting),
                "hits": [[r.request_id, int(r.num_computed_tokens - so.num_scheduled_tokens[r.request_id])]
                         for r in admitted],
            }
            log.write(json.dumps(row, separators=(",", ":")) + "\n")
            state["step"] += 1
            return so
        return recording_schedule

    Scheduler.schedule = recorder(Scheduler.schedule)
    if "schedule" in AsyncScheduler.__dict__:
        AsyncScheduler.schedule = recorder(AsyncScheduler.__dict__["schedule"])
    saved_argv = sys.argv
    for i, job in enumerate(jobs):
        out_dir = job["out_dir"]
        os.makedirs(out_dir, exist_ok=True)
        t0 = time.time()
        with open(os.path.join(out_dir, "sched_steps.jsonl"), "w") as log:
            state["log"], state["step"] = log, 0
            argv = ["vllm_sched_replay.py", job["trace"], *map(str, job["args"]), "--out-dir", out_dir, "--quiet"]
            try:
                if job.get("driver"):
                    from lockstep_driver import drive  # the project's own loop: shared prefixes, aborts

                    drive(replay, argv[1:], job["driver"])
                else:
                    sys.argv = argv
                    replay.main()
            except SystemExit as exc:  # the script exits on bad input: record it and go on
                with open(os.path.join(out_dir, "error.txt"), "w") as err:
                    err.write(str(exc))
            finally:
                state["log"] = None
                sys.argv = saved_argv
        print(f"[vllm {i + 1}/{len(jobs)}] {out_dir} {time.time() - t0:.1f}s", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()

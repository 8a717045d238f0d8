"""kvtune simulator: workloads, the engine model (schedulers, KV blocks, latency) and the run loop."""

from sim import _compiled

# Before any engine module is imported: the compiled engine, unless its build is older than the sources.
_compiled.install()

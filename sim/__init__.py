"""kvtune simulator: workloads, the engine model (schedulers, KV blocks, latency) and the run loop."""

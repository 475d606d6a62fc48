"""Benchmark: drive real wrk against each layout and report which one to run.

Flow: ``scenarios`` (what load) -> ``sweep`` (which layouts, interleaved repeats)
-> ``measure`` (one stack, wrk, stats server, CPU) -> ``results`` (versioned JSON)
-> ``analysis`` (medians, spread, verdict) -> ``report`` / ``plots`` (from JSON only).
"""

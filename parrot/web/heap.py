"""The serving process's garbage collector: what a long-running manager sets once it has started.

CPython's cyclic collector pauses every thread while it runs (the event loop, the engine loop's
Python half), for a time that grows with the objects it traverses. Three things make a serving
process pay more than it needs to:

- Startup leaves ~220k tracked objects (torch, FastAPI, pydantic, the tokenizer) that live as long
  as the process; every full collection would traverse them again (~0.2 s a collection on a
  2-core AMD EPYC).
  `settle_heap` collects once and then freezes what is left (`gc.freeze`: the permanent
  generation, never traversed again), as vLLM does after its start-up. The price: a reference
  cycle among frozen objects that later becomes garbage is never freed (start-up objects live as
  long as the process; what is made afterwards is collected as before).
- The youngest generation's threshold (700 allocations) promotes objects that live for a few
  event-loop turns (a call's views, its tasks, its events) into the older generations, where only
  a full collection frees them; with 10k applications in flight on 256 simulated engines the
  collector takes 45 of 86 s of wall time (30 full collections) with neither the freeze nor this
  threshold raised to 10,000, 21 of 67 s (6 full ones) with both (`benchmarks.sim.scale` reports the
  collector's share of each run: bench_results/sim-manager-scale/).
- Full collections walk the whole heap (~1.5 s with 10k applications in flight) and CPython starts
  one every 10 collections of the middle generation once the objects promoted since the last one
  exceed a quarter of the old generation: during a burst of applications that is every ~1M
  allocations, so their cost grows with the square of the applications in flight (4 full
  collections, 4.3 s, in a 10k-application run). What Parrot makes for an application forms no
  reference cycles (tests/test_bench_sim.py: 40 finished applications leave no garbage for the
  collector), so those walks find nothing of theirs to free: the oldest threshold is 100, not 10
  (a full collection at most every ~10M allocations; the quarter rule stays).

Applied by the processes Parrot owns (`parrot serve`, `parrot engine`, and `benchmarks.sim.scale`,
which stands for a serving manager), not by `start_embedded`: a program that embeds Parrot keeps
its own collector settings.
"""

from __future__ import annotations

import gc

GEN0_THRESHOLD = 10_000
GEN2_THRESHOLD = 100


def settle_heap(gen0_threshold: int = GEN0_THRESHOLD, gen2_threshold: int = GEN2_THRESHOLD) -> None:
    """Collect, freeze what survives start-up, and raise the youngest and the oldest generations'
    thresholds (the middle one's is kept)."""
    gc.collect()
    gc.freeze()
    _, gen1, _ = gc.get_threshold()
    gc.set_threshold(gen0_threshold, gen1, gen2_threshold)

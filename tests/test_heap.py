"""The serving process's collector settings (parrot/web/heap.py), in a process of their own."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = """
import gc, json
from parrot.web.heap import GEN0_THRESHOLD, GEN2_THRESHOLD, settle_heap
before = gc.get_threshold()
kept = [[i] for i in range(1000)]  # start-up objects: frozen, never traversed again
settle_heap()
after = gc.get_threshold()
tracked = len(gc.get_objects())  # the generations', not the frozen ones
print(json.dumps({"gen0": GEN0_THRESHOLD, "gen2": GEN2_THRESHOLD, "before": before, "after": after,
                  "frozen": gc.get_freeze_count(), "tracked": tracked}))
"""


def test_settle_heap_freezes_start_up_objects_and_raises_the_youngest_and_oldest_thresholds() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, check=True)
    r = json.loads(out.stdout)
    assert r["after"] == [r["gen0"], r["before"][1], r["gen2"]]
    assert r["gen0"] > r["before"][0]
    assert r["gen2"] > r["before"][2]
    assert r["frozen"] >= 1000  # at least the lists made before it
    assert r["tracked"] < 100  # only what was made after the freeze is traversed

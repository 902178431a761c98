"""The paper's workloads as data: its applications' shapes, its measured network round trips and
its reported results (`paper_workloads.json`, a copy of shared/workloads/paper_workloads.json).
The application benchmark scales the shapes down (benchmarks/apps/scaling.py); the simulator runs
them at full size (benchmarks/sim/)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

WORKLOADS_JSON = Path(__file__).parent / "paper_workloads.json"


def load_paper_workloads(path: Path | None = None) -> dict[str, Any]:
    """paper_workloads.json, parsed."""
    return dict(json.loads((path or WORKLOADS_JSON).read_text()))

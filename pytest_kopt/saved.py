"""Saved timing baselines in pytest-benchmark's storage format (``--kopt-save`` / ``--kopt-compare``).

Each kernel's timing samples become one pytest-benchmark entry (stats computed by pytest-benchmark's own ``Stats``),
stored with its ``FileStorage`` under a machine folder named after the GPU model, so ``pytest-benchmark compare`` and
its histograms read them, and a number from another GPU is never compared.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import re
from pathlib import Path
from typing import Any, Mapping

LOG = logging.getLogger("pytest_kopt.saved")


def machine_id(gpu_name: str) -> str:
    """The storage folder of a GPU model: ``kopt-NVIDIA_H200``."""
    return "kopt-" + re.sub(r"[^A-Za-z0-9]+", "_", gpu_name).strip("_")


def benchmark_entry(label: str, samples_ms: list[float], extra: Mapping[str, Any]) -> dict[str, Any]:
    """One pytest-benchmark entry (times in seconds, as pytest-benchmark stores them; ``data`` keeps the samples)."""
    from pytest_benchmark.stats import Stats

    st = Stats()
    for ms in samples_ms:
        st.update(ms / 1e3)
    stats = st.as_dict()
    stats.update(data=[ms / 1e3 for ms in samples_ms], iterations=1)
    return {"group": "kopt", "name": label, "fullname": f"kopt::{label}", "params": None, "param": None,
            "extra_info": dict(extra), "options": {"timer": "cuda_events", "disable_gc": False,
                                                   "min_rounds": len(samples_ms), "warmup": True},
            "stats": stats}


def save(storage: Path, name: str, gpu_name: str, entries: list[dict[str, Any]],
         machine_info: Mapping[str, Any]) -> Path:
    """Write ``<storage>/<machine_id>/NNNN_<name>.json`` through pytest-benchmark's FileStorage; returns the file."""
    from pytest_benchmark.storage.file import FileStorage

    fs = FileStorage(storage, LOG, default_machine_id=machine_id(gpu_name))
    doc = {"machine_info": {"node": machine_id(gpu_name), **machine_info}, "commit_info": {},
           "benchmarks": entries, "datetime": _dt.datetime.now(_dt.timezone.utc).isoformat(), "version": "kopt"}
    before = set(fs.query(f"*_{name}"))
    fs.save(doc, name)
    return next(iter(set(fs.query(f"*_{name}")) - before))


def load_latest(storage: Path, name: str, gpu_name: str) -> dict[str, list[float]] | None:
    """Samples (ms) by kernel label from the newest save called ``name`` for this GPU model; None if there is none."""
    from pytest_benchmark.storage.file import FileStorage

    fs = FileStorage(storage, LOG, default_machine_id=machine_id(gpu_name))
    files = [f for f in fs.query(f"*_{name}") if f.parent.name == machine_id(gpu_name)]
    if not files:
        return None
    doc = json.loads(sorted(files)[-1].read_text())
    return {b["name"]: [s * 1e3 for s in b["stats"].get("data") or []] for b in doc["benchmarks"]}

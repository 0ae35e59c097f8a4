"""The artifacts gates and the loop write and read: one atomic JSON writer, tolerant readers, typed records.

Every JSON file pytest-kopt writes goes through :func:`write_json` (a temp file in the same folder, then
``os.replace``), so a reader never sees half a file. Readers are tolerant (pytest's ``stepwise`` plugin's rule): a
missing or corrupt file reads as None, never a traceback, and the caller decides what that means. The typed records
name the fields the code reads; ``doc`` keeps the whole document for reports.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH = "bench.json"
NCU_TOP = "ncu_top.json"
ROOFLINE = "roofline.json"
ENV = "env.json"


def write_json(path: Path, data: Any) -> Path:
    """Write ``data`` as indented JSON to ``path`` atomically (temp file in the same folder, then ``os.replace``);
    creates the folder. Values JSON cannot encode are written as their ``str()``. Returns ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, default=str)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_text(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (summary.md, analysis templates); creates the folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
    return path


def read_json(path: Path) -> Any | None:
    """The JSON document at ``path``, or None when it is missing, unreadable or not valid JSON."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def read_dict(path: Path) -> dict[str, Any] | None:
    """:func:`read_json`, but None unless the document is a JSON object."""
    doc = read_json(path)
    return doc if isinstance(doc, dict) else None


@dataclass(frozen=True, slots=True)
class Bench:
    """A kernel's ``bench.json`` (the timing gate): ``median_ms`` (None when timing is not valid),
    ``samples_ms`` (every timed sample, ms), ``gpu_uuid`` (the GPU the timed process reported), ``workload`` (the
    reference's ``workload_model``: ``flops``, ``bytes_min``), ``pr_baseline`` (the PR gate's baseline timed in the
    same rounds: ``kernel``, ``samples_ms``); ``doc`` is the whole document."""

    timing_valid: bool
    median_ms: float | None
    samples_ms: list[float]
    gpu_uuid: str | None
    workload: dict[str, float] | None
    pr_baseline: dict[str, Any] | None
    doc: dict[str, Any] = field(repr=False)
    #: several benchmark shapes: one row per shape (``dims``, ``label``, ``path`` of its own bench.json,
    #: ``median_ms``, ``timing_valid``); then ``median_ms`` is their geometric mean and ``samples_ms`` empty
    shapes: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def load(cls, folder: Path) -> "Bench | None":
        """``<folder>/bench.json``, or None when there is none (or it is unreadable)."""
        doc = read_dict(Path(folder) / BENCH)
        if doc is None:
            return None
        valid = bool(doc.get("timing_valid"))
        median = doc.get("median_ms")
        return cls(timing_valid=valid, median_ms=float(median) if valid and median is not None else None,
                   samples_ms=list(doc.get("samples_ms") or []), gpu_uuid=doc.get("gpu_uuid"),
                   workload=doc.get("workload"), pr_baseline=doc.get("pr_baseline"), doc=doc,
                   shapes=[r for r in doc.get("shapes") or [] if isinstance(r, dict)])

    def shape_benches(self) -> dict[str, "Bench | None"]:
        """Each benchmark shape's own bench.json by its label (``M=4096,N=1024``); {} for one shape."""
        return {str(r.get("label")): Bench.load(Path(str(r.get("path", ""))).parent) for r in self.shapes}

    @property
    def valid_samples(self) -> list[float] | None:
        """The timing samples (ms) when timing is valid, else None."""
        return self.samples_ms if self.timing_valid and self.samples_ms else None


@dataclass(frozen=True, slots=True)
class NcuTop:
    """A kernel's ``ncu_top.json`` (the ncu gate): ``set`` (the section set that succeeded, ``full`` or
    ``light``), ``duration_ms`` (ncu's ``gpu__time_duration`` summed over the profiled call's launches),
    ``metrics`` (registry metric -> value of the longest launch), ``top`` (per axis, the ``ncu_num`` largest
    metrics), ``kernel`` (the longest launch's name), ``report`` (the ``.ncu-rep`` path)."""

    set: str | None
    duration_ms: float | None
    metrics: dict[str, float | None]
    top: dict[str, list[dict[str, Any]]]
    kernel: str | None
    report: str | None
    doc: dict[str, Any] = field(repr=False)

    @classmethod
    def load(cls, path: Path) -> "NcuTop | None":
        """The document at ``path`` (a folder means its ``ncu_top.json``), or None when missing, unreadable or
        written without registry metrics."""
        path = Path(path)
        doc = read_dict(path / NCU_TOP if path.is_dir() else path)
        if doc is None or "metrics" not in doc:
            return None
        return cls(set=doc.get("set"), duration_ms=doc.get("duration_ms"), metrics=dict(doc["metrics"]),
                   top=dict(doc.get("top") or {}), kernel=doc.get("kernel"), report=doc.get("report"), doc=doc)


@dataclass(frozen=True, slots=True)
class Roofline:
    """A ``roofline.json`` (the roofline gate, SKILL.md 3b): the gaps ``delta_*`` (None when unknown), ``bound``,
    ``near_peak``, ``axis_budget`` (``compute``/``memory``/``latency`` -> slots)."""

    delta_compute: float | None
    delta_memory: float | None
    delta_latency: float | None
    bound: str | None
    near_peak: bool
    axis_budget: dict[str, int]
    doc: dict[str, Any] = field(repr=False)

    @classmethod
    def load(cls, path: Path) -> "Roofline | None":
        """The document at ``path`` (a folder means its ``roofline.json``), or None when missing or unreadable."""
        path = Path(path)
        doc = read_dict(path / ROOFLINE if path.is_dir() else path)
        if doc is None or not isinstance(doc.get("axis_budget"), dict):
            return None
        return cls(delta_compute=doc.get("delta_compute"), delta_memory=doc.get("delta_memory"),
                   delta_latency=doc.get("delta_latency"), bound=doc.get("bound"),
                   near_peak=bool(doc.get("near_peak")), axis_budget=dict(doc["axis_budget"]), doc=doc)


@dataclass(frozen=True, slots=True)
class CorrectnessRecord:
    """``correctness/<case>.json``: what one correctness case decided, for this build (``fingerprint``) and signed
    by the session (``mac``, see :mod:`pytest_kopt.gates.trust`), so the timing and ncu gates of the same session can
    rely on it without re-running the case."""

    fingerprint: str | None
    passed: bool
    mac: str | None
    status: str | None
    message: str | None
    doc: dict[str, Any] = field(repr=False)

    @classmethod
    def load(cls, path: Path) -> "CorrectnessRecord | None":
        """The record at ``path``, or None when missing or unreadable."""
        doc = read_dict(path)
        if doc is None:
            return None
        return cls(fingerprint=doc.get("fingerprint"), passed=bool(doc.get("passed")), mac=doc.get("mac"),
                   status=doc.get("status"), message=doc.get("message"), doc=doc)

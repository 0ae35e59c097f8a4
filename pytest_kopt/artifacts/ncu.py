"""``ncu_top.json``: what the ncu gate read from the profile of one call of a kernel, and the loop's copy of it in
an iteration (with ``evidence_of``). :class:`NcuTop` reads it; :meth:`NcuTop.build` is the one place its document is
built, :meth:`NcuTop.write` writes it. Field names are the ones on disk; the document has no schema version.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .io import read_dict, write_json

NCU_TOP = "ncu_top.json"
#: The name of the per-launch metric bundle (``launches[].metrics``) and ncu's clock control, as recorded.
METRIC_SET = "kopt-basic"
CLOCK_CONTROL = "none"


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
    def from_doc(cls, doc: Mapping[str, Any]) -> NcuTop | None:
        """The record of a document already read (or just built); None when it has no registry metrics."""
        return cls._of(dict(doc)) if "metrics" in doc else None

    @classmethod
    def _of(cls, doc: dict[str, Any]) -> NcuTop:
        return cls(set=doc.get("set"), duration_ms=doc.get("duration_ms"), metrics=dict(doc["metrics"]),
                   top=dict(doc.get("top") or {}), kernel=doc.get("kernel"), report=doc.get("report"), doc=doc)

    @classmethod
    def load(cls, path: Path) -> NcuTop | None:
        """The document at ``path`` (a folder means its ``ncu_top.json``), or None when missing, unreadable or
        written without registry metrics."""
        path = Path(path)
        doc = read_dict(path / NCU_TOP if path.is_dir() else path)
        return None if doc is None else cls.from_doc(doc)

    def write(self, folder: Path, evidence_of: str | None = None, name: str = NCU_TOP) -> Path:
        """Write the document to ``<folder>/ncu_top.json`` atomically; returns its path. ``evidence_of``: the
        kernel the profile is evidence of (the loop's copy in an iteration, SKILL.md 3a), recorded as
        ``evidence_of`` when given; ``name``: another file name (the loop's ``kernel_ncu_top.json``)."""
        doc = {**self.doc, "evidence_of": evidence_of} if evidence_of else self.doc
        return write_json(Path(folder) / name, doc)

    @classmethod
    def build(cls, launches: Sequence[Mapping[str, Any]], *, metric_names: Mapping[str, str], nvtx_range: str,
              report: str, set: str, set_reason: str, attempts: Sequence[Mapping[str, Any]], ncu_num: int,
              top: Mapping[str, list[dict[str, Any]]], metrics: Mapping[str, float | None],
              kernel: str) -> NcuTop:
        """The ncu gate's document. ``launches``: per launch of the profiled call, in order, ``{"id", "kernel",
        "grid", "block", "metrics"}`` with ``metrics`` the basic bundle in base units (``duration_ns`` in ns,
        bytes, %); ``target_kernel`` is the longest launch's and ``duration_ms`` their total (ms).
        ``metric_names``: the bundle's ncu names; ``nvtx_range``: the NVTX range profiled; ``report``: the
        ``.ncu-rep`` path; ``set``/``set_reason``: the section set that succeeded and why it was chosen;
        ``attempts``: each set tried; ``ncu_num``: metrics kept per axis in ``top``; ``metrics``: every registry
        metric of the longest launch; ``kernel``: its name. Raises ValueError when ``launches`` is empty."""
        rows = [dict(r) for r in launches]
        total_ns = sum((r["metrics"]["duration_ns"] or 0.0) for r in rows)
        main = max(rows, key=lambda r: r["metrics"]["duration_ns"] or 0.0)
        return cls._of({
            "metric_set": METRIC_SET, "clock_control": CLOCK_CONTROL, "nvtx_range": nvtx_range, "launches": rows,
            "target_kernel": main["kernel"], "duration_ms": total_ns / 1e6, "metric_names": dict(metric_names),
            "report": report, "set": set, "set_reason": set_reason, "attempts": list(attempts), "ncu_num": ncu_num,
            "top": dict(top), "metrics": dict(metrics), "kernel": kernel})

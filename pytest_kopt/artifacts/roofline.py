"""``roofline.json``: the roofline gate's analysis of a kernel's profile (SKILL.md 3b), and the loop's copy of it in
an iteration. :class:`Roofline` reads it; :meth:`Roofline.analysis` and :meth:`Roofline.build` are the one place its
document is built (from the figures :mod:`pytest_kopt.gates.roofline` computes), :meth:`Roofline.write` writes it.
Field names are the ones on disk; the document has no schema version.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .io import read_dict, write_json

ROOFLINE = "roofline.json"


@dataclass(frozen=True, slots=True)
class Achieved:
    """What the kernel achieved by the workload model over the profiled duration: FLOP/s, bytes/s (of
    ``bytes_min``) and the arithmetic intensity (FLOP/byte; None when ``bytes_min`` is 0)."""

    flops_per_s: float
    bytes_per_s: float
    arithmetic_intensity: float | None


@dataclass(frozen=True, slots=True)
class Floor:
    """The roofline against the GPU's measured ``peaks``: the time floor (ms) against the fp32 peak and against the
    best measured peak (bf16 tensor cores), the % of speed of light (floor / duration) against each, and which
    roof bounds the fp32 floor (``memory`` or ``compute``)."""

    peaks: dict[str, Any]
    floor_ms_fp32: float
    floor_ms_best: float
    sol_pct_fp32: float
    sol_pct_best: float
    roofline_bound: str


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
    def from_doc(cls, doc: Mapping[str, Any]) -> Roofline | None:
        """The record of a document already read (or just built); None when it has no axis budget."""
        if not isinstance(doc.get("axis_budget"), dict):
            return None
        doc = dict(doc)
        return cls(delta_compute=doc.get("delta_compute"), delta_memory=doc.get("delta_memory"),
                   delta_latency=doc.get("delta_latency"), bound=doc.get("bound"),
                   near_peak=bool(doc.get("near_peak")), axis_budget=dict(doc["axis_budget"]), doc=doc)

    @classmethod
    def load(cls, path: Path) -> Roofline | None:
        """The document at ``path`` (a folder means its ``roofline.json``), or None when missing or unreadable."""
        path = Path(path)
        doc = read_dict(path / ROOFLINE if path.is_dir() else path)
        return None if doc is None else cls.from_doc(doc)

    def write(self, folder: Path, name: str = ROOFLINE) -> Path:
        """Write the document to ``<folder>/roofline.json`` (or ``name``: the loop's ``kernel_roofline.json``)
        atomically; returns its path."""
        return write_json(Path(folder) / name, self.doc)

    @staticmethod
    def analysis(*, delta: Mapping[str, float | None], bound: str | None, near_peak: bool,
                 axis_budget: Mapping[str, int], method: str, stall_shares_pct: Mapping[str, float],
                 duration_ms: float | None, achieved: Achieved | None = None,
                 floor: Floor | None = None) -> dict[str, Any]:
        """The analysis fields of the document, in their order on disk: the gaps (``delta``: ``compute``,
        ``memory``, ``latency``), ``bound``, ``near_peak``, ``axis_budget``, ``method`` (``roofline`` with a
        workload model, else ``bottleneck-gap heuristic``), each stall reason's share of stall cycles (%), the
        profiled duration (ms); with a workload model what was ``achieved``, and with the measured peaks too the
        ``floor``."""
        doc: dict[str, Any] = {"delta_compute": delta["compute"], "delta_memory": delta["memory"],
                               "delta_latency": delta["latency"], "bound": bound, "near_peak": near_peak,
                               "axis_budget": dict(axis_budget), "method": method,
                               "stall_shares_pct": dict(stall_shares_pct), "duration_ms": duration_ms}
        if achieved is not None:
            doc.update(achieved_flops=achieved.flops_per_s, achieved_bytes_per_s=achieved.bytes_per_s,
                       arithmetic_intensity=achieved.arithmetic_intensity)
            if floor is not None:
                doc.update(peaks=dict(floor.peaks), floor_ms_fp32=floor.floor_ms_fp32,
                           floor_ms_best=floor.floor_ms_best, sol_pct_fp32=floor.sol_pct_fp32,
                           sol_pct_best=floor.sol_pct_best, roofline_bound=floor.roofline_bound)
        return doc

    @classmethod
    def build(cls, analysis: Mapping[str, Any], *, kernel: str | None, dims: Mapping[str, Any]) -> Roofline:
        """The roofline gate's document: the ``analysis`` (:meth:`analysis`), then the profiled ``kernel`` (the
        longest launch's name) and the ``dims`` it ran at. Raises ValueError when the analysis has no axis
        budget."""
        built = cls.from_doc({**analysis, "kernel": kernel, "dims": dict(dims)})
        if built is None:
            raise ValueError("a roofline analysis without an axis budget")
        return built

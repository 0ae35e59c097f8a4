"""``bench.json``: the timing gate's record of a kernel at one shape, or its summary over several benchmark shapes.

:class:`Bench` reads it and is the one place its documents are built: :meth:`Bench.invalid` (a timing that measured
nothing valid), :meth:`Bench.measured` (a finished measurement) and :meth:`Bench.over_shapes` (the summary); each
gets typed parts (:class:`Head`, :class:`TimedRun`, :class:`Basis`, :class:`Timing`, :class:`FirstAttempt`), and
:meth:`Bench.write` writes it. Field names are the ones on disk; the document has no schema version.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from .. import stats
from ..child.cupti import HOST_INSIDE_KEYS
from ..stats import Distribution
from .io import read_dict, write_json

BENCH = "bench.json"

#: The clock each basis of samples is read from, as ``timing_method.clock`` names it.
CLOCKS = {"cupti": "cupti_kernel_span", "graph": "cuda_graph_events"}
#: What the summary over benchmark shapes copies from the first shape's own document besides the figures: what
#: the loop and the reports read.
FIRST_SHAPE_FIELDS = ("gpu", "gpu_uuid", "gpu_index", "compile_pass", "contract_pass", "correctness_pass",
                      "autotune", "race_safe", "seeds")


def _as_dict(obj: Any) -> dict[str, Any]:
    """A flat dataclass's fields as a dict, in declaration order (``dataclasses.asdict`` without its deep copy)."""
    return {f.name: getattr(obj, f.name) for f in fields(obj)}


@dataclass(frozen=True, slots=True)
class Head:
    """The fields every measured ``bench.json`` starts with: the kernel (path), its dims (also recorded as the
    requested and the realized dims), the build's arch, the GPU as the timed process reported it (``gpu``: its
    name, ``gpu_uuid``), the session's index of that GPU, and per ``@triton.autotune`` kernel the config the build
    pinned and every gate ran. The earlier gates' pass flags (SKILL.md) are true: the timing gate runs only after
    them."""

    kernel: str
    dims: dict[str, Any]
    arch: str
    gpu: str | None
    gpu_uuid: str | None
    gpu_index: int | None
    autotune: dict[str, Any]

    def fields(self) -> dict[str, Any]:
        """The head as the document's first fields."""
        return {"kernel": self.kernel, "dims": self.dims, "requested_dims": self.dims, "realized_dims": self.dims,
                "arch": self.arch, "gpu": self.gpu, "gpu_uuid": self.gpu_uuid, "gpu_index": self.gpu_index,
                "compile_pass": True, "contract_pass": True, "correctness_pass": True, "autotune": self.autotune}


@dataclass(frozen=True, slots=True)
class TimedRun:
    """What one timed harness process reported (:mod:`pytest_kopt.child.timing`'s final result) that the timing gate
    reads: samples in ms (``event_ms`` CUDA events per call, ``host_ms`` the host's synchronised clock), the stop
    reason, the timing mode (``method``: ``events`` or ``graph``; ``graph_method``, ``graph_note``, ``graph_hold``
    of the graph mode), the kernel-only records (``cupti``: {} when none), NVML's readings and throttle flags, the L2
    flush size (bytes), the number of rotating input sets, the GPU (name, UUID), the reference's ``workload_model``,
    the host's own launch and overhead times of one call (ms), and the seconds of the process's phases
    (``phase_s``) and of the gate's (``gate_phase_s``: the measurement and the output check, as the pytest process
    saw them, and the output check's parts in the judge's process under ``judge``). ``raw`` is the whole result
    (what the unstable-timing diagnosis reads)."""

    event_ms: list[float]
    stop_reason: str | None
    method: str
    graph_method: str | None
    graph_note: str | None
    graph_hold: Any
    cupti: dict[str, Any]
    host_ms: list[float]
    host_launch_ms: float | None
    host_overhead_ms: float | None
    throttled: list[bool] | None
    nvml: Any
    flush_bytes: int | None
    rotating_sets: int | None
    gpu: str | None
    gpu_uuid: str | None
    workload: dict[str, float] | None
    phase_s: dict[str, float]
    gate_phase_s: dict[str, Any]
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def of(cls, result: Mapping[str, Any]) -> TimedRun:
        """The typed view of a timing request's result (a dict as the harness returned it)."""
        r = dict(result)
        return cls(event_ms=list(r.get("event_ms") or []), stop_reason=r.get("stop_reason"),
                   method=r.get("method", "events"), graph_method=r.get("graph_method"),
                   graph_note=r.get("graph_note"), graph_hold=r.get("graph_hold"), cupti=dict(r.get("cupti") or {}),
                   host_ms=list(r.get("host_ms") or []), host_launch_ms=r.get("host_launch_ms"),
                   host_overhead_ms=r.get("host_overhead_ms"), throttled=r.get("throttled"), nvml=r.get("nvml"),
                   flush_bytes=r.get("flush_bytes"), rotating_sets=r.get("rotating_sets"), gpu=r.get("gpu"),
                   gpu_uuid=r.get("gpu_uuid"), workload=r.get("workload"), phase_s=dict(r.get("phase_s") or {}),
                   gate_phase_s=dict(r.get("gate_phase_s") or {}), raw=r)

    @property
    def mode(self) -> str:
        """The timing mode as the reports name it: the graph mode's own method, else ``method``."""
        return self.graph_method or self.method


@dataclass(frozen=True, slots=True)
class Basis:
    """Which samples a timing reports and every decision reads (:func:`pytest_kopt.gates.measure.timing_basis`):
    ``name`` (``cupti``: kernel-only spans, ``events``, ``graph``), the kernel's, the reference's and a PR gate's
    baseline's samples (ms; ``baseline`` None without one), ``note``: why the basis is not the one asked for, and
    ``host_work_ms``: the host work inside a call (ms per call, the events' median less the kernels' span) that put
    it on the events (None where there is none)."""

    name: str
    kernel: list[float]
    reference: list[float]
    baseline: list[float] | None
    note: str | None
    host_work_ms: float | None = None

    @classmethod
    def of(cls, basis: Mapping[str, Any]) -> Basis:
        """From :func:`~pytest_kopt.gates.measure.timing_basis`' dict (``basis``, ``kernel``, ``reference``,
        ``baseline``, ``note``, ``host_work_ms`` where there is host work)."""
        return cls(name=basis["basis"], kernel=basis["kernel"], reference=basis["reference"],
                   baseline=basis["baseline"], note=basis["note"], host_work_ms=basis.get("host_work_ms"))

    @property
    def clock(self) -> str:
        """``timing_method.clock``: the clock the samples are read from."""
        return CLOCKS.get(self.name, "cuda_events")


@dataclass(frozen=True, slots=True)
class Timing:
    """The statistics of one measurement: the basis, the distributions (ms) of the kernel's and the reference's
    samples on it and of the kernel's CUDA event samples, the speedup over the reference with its bootstrap 95% CI
    ``(ratio, low, high)``, and the stability class with what it was judged on (``robust_cv``, or ``median_rse``
    for graph samples)."""

    basis: Basis
    kernel: Distribution
    reference: Distribution
    events: Distribution
    speedup: tuple[float, float, float]
    stability: str
    stability_basis: str


@dataclass(frozen=True, slots=True)
class FirstAttempt:
    """An unstable first measurement: its robust CV, median (ms) and sample count on its basis, the causes found
    (sentences), and what the second measurement changed (``remeasured``; "" when nothing could be changed, and
    then there was none)."""

    robust_cv: float
    median_ms: float
    samples: int
    causes: list[str]
    remeasured: str
    basis: str

    def fields(self) -> dict[str, Any]:
        """As ``bench.json``'s ``first_attempt``."""
        return _as_dict(self)


def _rounded(phases: Mapping[str, float]) -> dict[str, float]:
    return {k: round(v, 3) for k, v in phases.items()}


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
    def from_doc(cls, doc: Mapping[str, Any]) -> Bench:
        """The record of a ``bench.json`` document already read (or just built)."""
        doc = dict(doc)
        valid = bool(doc.get("timing_valid"))
        median = doc.get("median_ms")
        return cls(timing_valid=valid, median_ms=float(median) if valid and median is not None else None,
                   samples_ms=list(doc.get("samples_ms") or []), gpu_uuid=doc.get("gpu_uuid"),
                   workload=doc.get("workload"), pr_baseline=doc.get("pr_baseline"), doc=doc,
                   shapes=[r for r in doc.get("shapes") or [] if isinstance(r, dict)])

    @classmethod
    def load(cls, folder: Path) -> Bench | None:
        """``<folder>/bench.json``, or None when there is none (or it is unreadable, or not a JSON object)."""
        doc = read_dict(Path(folder) / BENCH)
        return None if doc is None else cls.from_doc(doc)

    def write(self, folder: Path) -> Path:
        """Write the document to ``<folder>/bench.json`` atomically; returns its path."""
        return write_json(Path(folder) / BENCH, self.doc)

    def shape_benches(self) -> dict[str, Bench | None]:
        """Each benchmark shape's own bench.json by its label (``M=4096,N=1024``); {} for one shape."""
        return {str(r.get("label")): Bench.load(Path(str(r.get("path", ""))).parent) for r in self.shapes}

    def revoked(self, reason: str) -> Bench:
        """This timing declared void after the fact (a measurement outside the kernel's process contradicts it):
        ``timing_valid`` False, ``median_ms`` None, ``revoked`` the reason; the samples stay for the record."""
        return Bench.from_doc({**self.doc, "timing_valid": False, "median_ms": None, "revoked": reason})

    @property
    def valid_samples(self) -> list[float] | None:
        """The timing samples (ms) when timing is valid, else None."""
        return self.samples_ms if self.timing_valid and self.samples_ms else None

    @classmethod
    def invalid(cls, head: Head, run: TimedRun, basis: Basis, *, policy: Mapping[str, Any],
                timed_output_check: str) -> Bench:
        """The document of a timing that measured nothing valid, judged before any statistics: the timed call's
        output was wrong (``timed_output_check`` is the judge's status), or the timed calls did no work (no GPU
        work under CUPTI, or a median of 0). ``policy``: the timing policy the request carried."""
        return cls.from_doc({
            **head.fields(), "timing_valid": False, "median_ms": None, "samples_ms": basis.kernel,
            "event_samples_ms": run.event_ms, "timing_basis": basis.name, "timed_output_check": timed_output_check,
            "kernel_time": {"method": "cupti", **run.cupti} if run.cupti else None,
            "timing_method": {**policy, "method": run.graph_method or run.raw.get("method")}})

    @classmethod
    def measured(cls, head: Head, timing: Timing, run: TimedRun, ref: TimedRun, *, valid: bool,
                 race_safe: bool | None, policy: Mapping[str, Any], interleaved: bool, seeds: Sequence[int],
                 floor_ms: float | None, peaks: Mapping[str, Any] | None, gflops: float | None,
                 gbytes_per_s: float | None, suspects: Sequence[str], timed_output_check: str, peaks_s: float,
                 first_attempt: FirstAttempt | None = None, baseline: TimedRun | None = None,
                 baseline_kernel: str | None = None, memory: Mapping[str, Any] | None = None) -> Bench:
        """The document of a finished measurement (SKILL.md's fields and what the reports read). ``timing``: its
        statistics; ``run``, ``ref``, ``baseline``: the kernel's, the reference's and a PR gate's baseline's timed
        results (``baseline_kernel`` the baseline's path); ``valid``: whether the timing is valid (stable, nothing
        suspect); ``suspects``: the findings that make it suspect; ``policy``: the timing policy the request
        carried; ``interleaved``: whether the reference was timed in rounds alternating with the kernel;
        ``seeds``: the session's validation seeds (the first is the timing's); ``floor_ms``: the roofline floor
        (ms) from the measured ``peaks``; ``gflops``/``gbytes_per_s``: from the workload model; ``peaks_s``:
        seconds spent on the peaks; ``memory``: the device memory across the timed calls, the LEAK check and a
        call's peak (:func:`pytest_kopt.gates.leaks.assess`), written as ``memory``."""
        k, r, ke, basis = timing.kernel, timing.reference, timing.events, timing.basis
        speedup, sp_lo, sp_hi = timing.speedup
        doc: dict[str, Any] = {
            **head.fields(), "race_safe": race_safe, "timing_valid": valid, "average_ms": k.mean_ms,
            "median_ms": k.median_ms, "timing_basis": basis.name, "timing_basis_note": basis.note,
            "robust_cv": k.robust_cv, "stability": timing.stability, "stability_basis": timing.stability_basis,
            "distribution": _as_dict(k), "samples_ms": basis.kernel, "event_samples_ms": run.event_ms,
            "events": _as_dict(ke), "host_ms": run.host_ms,
            # each side-stream probe's median (ms): more than one where the first showed a gap and was taken again
            "host_probes_ms": run.raw.get("host_probes_ms"), "throttled": run.throttled, "nvml": run.nvml,
            "warmup": run.raw.get("warmup"),
            "stop_reason": run.stop_reason,
            "reference": {**_as_dict(r), "samples_ms": basis.reference, "event_samples_ms": ref.event_ms},
            "speedup_vs_ref": speedup, "speedup_ci95": [sp_lo, sp_hi], "workload": run.workload or None,
            "gflops": gflops, "gbytes_per_s": gbytes_per_s, "roofline_floor_ms": floor_ms, "peaks": peaks,
            "suspect": list(suspects), "timed_output_check": timed_output_check,
            "timing_method": {**policy, "clock": basis.clock, "l2_flush_bytes": run.flush_bytes,
                              "rotating_sets": run.rotating_sets, "fresh_values_every_call": True,
                              "graph_method": run.graph_method, "graph_note": run.graph_note,
                              "graph_hold": run.graph_hold, "interleaved_with_reference": interleaved},
            "seeds": list(seeds), "timing_seed": seeds[0],
            # the kernels' own execution span from CUPTI activity records (child/timer.cupti_samples): the basis by
            # default; beside it the event time, which also holds launch gaps and the flush's tail
            "kernel_time": {"method": "cupti", **{k2: v for k2, v in run.cupti.items()
                                                  if k2 not in ("spans_us", *HOST_INSIDE_KEYS)}}
            if run.cupti else None,
            # where the item's wall time went (s): the GPU's peaks (cached after the first session), the
            # measurement and the output check as the pytest process saw them, and each timed process's own phases
            "phase_s": {"peaks": round(peaks_s, 3), **run.gate_phase_s, "candidate": _rounded(run.phase_s),
                        "reference": _rounded(ref.phase_s)}}
        if memory is not None:  # device memory across the timed calls: the LEAK check, a call's peak
            doc["memory"] = dict(memory)
        if basis.host_work_ms is not None:  # host work inside the call, which put it on the events (ms per call)
            doc["host_work_ms"] = basis.host_work_ms
        if first_attempt is not None:  # an unstable first measurement, its causes and what was done about them
            doc["first_attempt"] = first_attempt.fields()
        if baseline is not None:  # the PR gate's baseline, timed in the same rounds as this kernel
            doc["pr_baseline"] = {"kernel": baseline_kernel, "samples_ms": basis.baseline,
                                  "event_samples_ms": baseline.event_ms, "timing_basis": basis.name,
                                  "stop_reason": baseline.stop_reason}
        return cls.from_doc(doc)

    @classmethod
    def over_shapes(cls, kernel: str, dims: Mapping[str, Any], arch: str,
                    shapes: Sequence[tuple[Mapping[str, Any], str, Path]]) -> Bench:
        """The kernel's summary over its benchmark shapes ``(dims, label, folder)`` (each shape's own bench.json in
        ``folder``): ``shapes`` (dims, label, path, timing_valid, median_ms, speedup_vs_ref and stop_reason per
        shape),
        ``geomean_over``, ``timing_valid`` (every shape timed and valid), ``median_ms`` (geometric mean of the
        shapes' medians, ms; None until every shape has valid timing), ``speedup_vs_ref`` and ``speedup_ci95``
        (geometric mean over the shapes with a bootstrap CI; None until every shape has valid samples and reference
        samples), ``samples_ms`` [] (each shape has its own), and the first shape's :data:`FIRST_SHAPE_FIELDS`."""
        rows, pairs, medians = [], [], []
        benches = []
        for shape_dims, label, folder in shapes:
            b = cls.load(folder)
            benches.append(b)
            rows.append({"dims": shape_dims, "label": label, "path": str(Path(folder) / BENCH),
                         "timing_valid": bool(b and b.timing_valid), "median_ms": b.median_ms if b else None,
                         "speedup_vs_ref": (b.doc.get("speedup_vs_ref") if b else None),
                         # converged, budget, max_samples, or capped: the rounds' cap ended it (measure.rounds_cap_s)
                         "stop_reason": (b.doc.get("stop_reason") if b else None)})
            if b and b.valid_samples:
                medians.append(b.median_ms)
                ref = (b.doc.get("reference") or {}).get("samples_ms")
                if ref:
                    pairs.append((ref, b.valid_samples))
        valid = all(r["timing_valid"] for r in rows)
        doc: dict[str, Any] = {"kernel": kernel, "dims": dims, "arch": arch, "shapes": rows,
                               "geomean_over": len(rows), "timing_valid": valid, "samples_ms": [],
                               "median_ms": stats.geomean(medians) if valid and medians else None,
                               "speedup_vs_ref": None, "speedup_ci95": None}
        if valid and len(pairs) == len(rows):
            sp, lo, hi = stats.bootstrap_geomean_ratio_ci(pairs)
            doc.update(speedup_vs_ref=sp, speedup_ci95=[lo, hi])
        first = benches[0] if benches else None
        if first is not None:
            doc.update({k: first.doc.get(k) for k in FIRST_SHAPE_FIELDS})
        return cls.from_doc(doc)

"""Device memory across the timed calls: the LEAK rule (:func:`judge_growth`, a pure function of readings), the
reading the pytest process takes of the timed process's memory through NVML between rounds (:class:`ProcessMemory`),
and ``bench.json``'s ``memory`` record from the readings of both sides (:func:`assess`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..errors import LeakError

#: Bytes a reading must grow by, in each half of the readings, before growth counts: 2 MiB, the granularity at
#: which the CUDA driver maps device memory (cudaMalloc's physical pages, cuMemGetAllocationGranularity's minimum
#: on current GPUs) and in which torch's caching allocator grows its small-block pool (kSmallBuffer, 2 MiB). An
#: honest process's memory moves in steps of this size when a workspace or a cache segment is made once; growth
#: past it in both halves is growth that repeats with the calls.
GRANULARITY_BYTES = 2 * 2**20
#: Readings a verdict needs: a first one after the warm-up and at least two batches of calls after it.
MIN_READINGS = 3


@dataclass(frozen=True, slots=True)
class Growth:
    """What :func:`judge_growth` decided: ``verdict`` (``leak``, ``flat`` or ``too_few_readings``), the growth
    from the first reading to the last (bytes), per unit of the count between them (``rate``: bytes per call when
    the count is calls), the growth of each half (bytes), the count between the first reading and the last, and the
    number of readings judged. Fields are None where too few readings left nothing to measure."""

    verdict: str
    rate: float | None
    growth_bytes: int | None
    halves_bytes: tuple[int, int] | None
    span: int | None
    readings: int


def judge_growth(points: Sequence[tuple[int, int]], granularity: int = GRANULARITY_BYTES,
                 min_readings: int = MIN_READINGS) -> Growth:
    """Whether memory grows with the number of calls. ``points``: (count, bytes) per reading taken after the
    warm-up, count a number of calls (or of samples) so far, bytes the memory held then; in any order.

    The readings are split at the one nearest the middle of the count (never the first or the last): LEAK
    (``leak``) when memory grew by more than ``granularity`` (:data:`GRANULARITY_BYTES`) in both halves, so growth
    that happened once (a workspace, a cache segment, a lazily built table) is not a leak, wherever it falls; and
    growth below the granularity in either half is noise. ``too_few_readings`` with fewer than ``min_readings``
    distinct counts (two batches need three readings). ``rate`` is the growth from the first reading to the last
    over the count between them."""
    by_count: dict[int, int] = {}
    for count, held in points:
        by_count[int(count)] = int(held)  # the later reading of one count
    pts = sorted(by_count.items())
    if len(pts) < min_readings:
        return Growth("too_few_readings", None, None, None, None, len(pts))
    (c0, b0), (cn, bn) = pts[0], pts[-1]
    mid = min(pts[1:-1], key=lambda p: abs(p[0] - (c0 + cn) / 2))
    halves = (mid[1] - b0, bn - mid[1])
    leak = halves[0] > granularity and halves[1] > granularity
    return Growth("leak" if leak else "flat", (bn - b0) / (cn - c0), bn - b0, halves, cn - c0, len(pts))


class ProcessMemory:
    """NVML's figure of the device memory the timed process holds, read by the pytest process (outside the
    candidate's reach) between timing rounds while the process is stopped and the GPU lock held. ``gpu``: the
    timed GPU's UUID (None: NVML's device 0). Inert, with :attr:`note` saying why, without nvidia-ml-py or NVML."""

    def __init__(self, gpu: str | None) -> None:
        self.nvml: Any = None
        self.note: str | None = None
        try:
            import pynvml
        except ImportError:
            self.note = "nvidia-ml-py is not installed in the pytest process"
            return
        try:
            pynvml.nvmlInit()
            self.handle = (pynvml.nvmlDeviceGetHandleByUUID(gpu) if gpu else pynvml.nvmlDeviceGetHandleByIndex(0))
        except Exception as exc:  # pynvml.NVMLError and its subclasses
            self.note = f"NVML did not start ({type(exc).__name__}: {exc})"
            return
        self.nvml = pynvml

    def read(self, pids: Sequence[int]) -> int | None:
        """The bytes NVML lists for ``pids`` (the harness process and what it started) on the GPU, summed; None
        (and :attr:`note` says why) when NVML is missing, failed or does not list them."""
        if self.nvml is None or not pids:
            if not pids:
                self.note = "the timed process was not running between rounds"
            return None
        from ..child.clocks import process_used

        try:
            procs = self.nvml.nvmlDeviceGetComputeRunningProcesses(self.handle)
        except Exception as exc:
            self.note = f"NVML's process list failed ({type(exc).__name__})"
            return None
        used, why = process_used(procs, set(pids))
        if used is None:
            self.note = why
        return used

    def close(self) -> None:
        """Shut NVML down (once per :meth:`__init__` that started it)."""
        if self.nvml is not None:
            try:
                self.nvml.nvmlShutdown()
            except Exception:
                pass
            self.nvml = None


#: bench.json's name of each basis, in the order it is preferred: NVML read by the pytest process, NVML read by the
#: timed process of itself, the device's used memory read by the timed process (every process's memory).
BASES = {"nvml_outside": "NVML, read by the pytest process between rounds",
         "nvml_inside": "NVML, read by the timed process of itself",
         "device_used": "the device's used memory (cudaMemGetInfo), read by the timed process"}


def _count(value: Any) -> bool:
    """An int figure (bytes, a count): what a reading's fields must be (the timed process's are the kernel's to
    forge, and a forged string must not crash the gate)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _readings(raw: Any, fields: Sequence[str]) -> list[dict[str, Any]]:
    """The well-formed readings of ``raw``: a mapping each, ``samples`` an int, ``fields`` ints or None."""
    if not isinstance(raw, list):
        return []
    return [dict(r) for r in raw if isinstance(r, Mapping) and _count(r.get("samples"))
            and all(r.get(f) is None or _count(r.get(f)) for f in fields)]


def _warm(reading: Mapping[str, Any], sets: int) -> bool:
    """A reading taken after the warm-up: after more samples than there are rotating input sets, so the first
    refresh of every set (whose temporaries torch's allocator keeps) is behind it."""
    return int(reading.get("samples") or 0) > sets


def assess(result: Mapping[str, Any], sets: int) -> dict[str, Any]:
    """``bench.json``'s ``memory`` record of a timed candidate's result: its readings on the preferred basis
    (:data:`BASES`: the pytest process's NVML readings ``result["memory_outside"]`` where there are any, else the
    timed process's own ``result["memory"]``), judged by :func:`judge_growth` against the samples taken (a count the
    pytest process knows), with torch's allocated bytes in the timed process judged beside them (a torch tensor kept
    alive per call). ``sets``: the most rotating input sets a timing makes (readings up to that many samples are
    the warm-up's). Returns ``leak`` (True, False, None when not judged), ``check`` (``leak``, ``flat``,
    ``too_few_readings``, ``not_read``), ``basis``, ``basis_note`` (why a preferred basis was not used),
    ``bytes_per_call`` (growth over the calls the timed process counted between the readings; per sample, and
    ``per`` says so, where it counted none), ``growth_bytes``, ``halves_bytes``, ``readings``, ``granularity_bytes``,
    ``held_bytes`` (the first reading after the warm-up), ``torch`` (the torch witness: ``check``,
    ``growth_bytes``, ``bytes_per_call``), ``peak_call_bytes`` and ``peak_call`` (:meth:`Timer.call_peak`) and
    ``points`` ([samples, calls, bytes] per reading judged)."""
    inside = result.get("memory") if isinstance(result.get("memory"), Mapping) else {}
    outside = result.get("memory_outside") if isinstance(result.get("memory_outside"), Mapping) else {}
    ins = _readings(inside.get("readings"), ("calls", "nvml_bytes", "device_used_bytes", "torch_allocated_bytes"))
    outs = _readings(outside.get("readings"), ("parties_min", "bytes"))
    calls_at = {int(r.get("samples") or 0): r.get("calls") for r in ins}
    notes = []
    basis, rows = None, []
    if outs and all(r.get("bytes") is not None for r in outs):
        basis, rows = "nvml_outside", [(r["samples"], r["bytes"]) for r in outs if _warm(r, sets)]
    else:
        notes.append(f"not read by the pytest process: {outside.get('note') or 'no reading between rounds'}")
        if ins and all(r.get("nvml_bytes") is not None for r in ins):
            basis, rows = "nvml_inside", [(r["samples"], r["nvml_bytes"]) for r in ins if _warm(r, sets)]
        else:
            notes.append(f"not read through NVML by the timed process: {str(inside.get('nvml_note'))[:200]}"
                         if inside.get("nvml_note") else "not read through NVML by the timed process")
            if ins and all(r.get("device_used_bytes") is not None for r in ins):
                # every process's memory: a reading counts once every party's warm-up is behind it
                # every process's memory: in alternating rounds a reading counts once every party's warm-up is
                # behind it (the fewest samples any party had taken then, as the pytest process counted them)
                least = {int(r.get("samples") or 0): int(r.get("parties_min") or 0) for r in outs}
                basis = "device_used"
                rows = [(r["samples"], r["device_used_bytes"]) for r in ins
                        if _warm(r, sets) and least.get(int(r["samples"]), sets + 1) > sets]
    peak = inside.get("peak_call") if isinstance(inside.get("peak_call"), Mapping) else None
    if peak is not None and not all(_count(peak.get(k)) for k in ("torch_bytes", "device_held_bytes", "bytes")):
        peak = None
    out: dict[str, Any] = {"basis": basis, "basis_note": "; ".join(notes) or None,
                           "granularity_bytes": GRANULARITY_BYTES, "peak_call": dict(peak) if peak else None,
                           "peak_call_bytes": peak.get("bytes") if peak else None}
    torch_rows = [(r["samples"], r["torch_allocated_bytes"]) for r in ins
                  if _warm(r, sets) and r.get("torch_allocated_bytes") is not None]
    tg = judge_growth(torch_rows)
    out["torch"] = {"check": tg.verdict, "growth_bytes": tg.growth_bytes,
                    "bytes_per_call": _per_call(tg, torch_rows, calls_at)[0]}
    if basis is None:
        return {**out, "leak": None, "check": "not_read", "bytes_per_call": None, "per": None, "growth_bytes": None,
                "halves_bytes": None, "readings": 0, "held_bytes": None, "points": []}
    g = judge_growth(rows)
    per_call, per = _per_call(g, rows, calls_at)
    leak = g.verdict == "leak" or tg.verdict == "leak"
    if g.verdict != "leak" and tg.verdict == "leak":  # torch's figure is the exact one then
        per_call, per = out["torch"]["bytes_per_call"], "call"
    return {**out, "leak": None if g.verdict == "too_few_readings" and not leak else leak,
            "check": "leak" if leak else g.verdict, "bytes_per_call": per_call, "per": per,
            "growth_bytes": g.growth_bytes, "halves_bytes": list(g.halves_bytes) if g.halves_bytes else None,
            "readings": g.readings, "held_bytes": min(rows)[1] if rows else None,
            "points": [[s, calls_at.get(int(s)), b] for s, b in sorted(rows)]}


def _per_call(g: Growth, rows: Sequence[tuple[int, int]], calls_at: Mapping[int, Any]) -> tuple[float | None, str]:
    """``g``'s growth per call (the timed process's call counts at the first and last reading), else per sample."""
    if g.growth_bytes is None or not rows:
        return None, "call"
    first, last = min(rows)[0], max(rows)[0]
    c0, cn = calls_at.get(int(first)), calls_at.get(int(last))
    if isinstance(c0, int) and isinstance(cn, int) and cn > c0:
        return g.growth_bytes / (cn - c0), "call"
    return g.rate, "sample"


def leak_error(memory: Mapping[str, Any], display: str) -> LeakError:
    """The timing gate's LEAK failure from :func:`assess`'s record (``leak`` True)."""
    mib = 2.0**20
    per = memory.get("bytes_per_call")
    first, second = memory.get("halves_bytes") or (None, None)
    rate = f"{per / mib:.3f} MiB ({per:.0f} bytes) per {memory.get('per') or 'call'}" if per is not None else "?"
    halves = (f"; {first / mib:.1f} MiB and {second / mib:.1f} MiB in the two halves of the readings"
              if first is not None and second is not None else "")
    torch = memory.get("torch") or {}
    witness = (f"; torch's allocated bytes grew {torch['growth_bytes'] / mib:.1f} MiB"
               if torch.get("check") == "leak" and torch.get("growth_bytes") is not None else "")
    figures = {k: v for k, v in {"leak_bytes_per_call": per, "leak_growth_bytes": memory.get("growth_bytes"),
                                 "memory_basis": memory.get("basis"),
                                 "peak_call_bytes": memory.get("peak_call_bytes")}.items() if v is not None}
    return LeakError(f"device memory grows with the calls: {rate} over {memory.get('readings')} readings after the "
                     f"warm-up{halves}{witness} ({BASES.get(memory.get('basis') or '', 'no basis')})",
                     gate="timing", path=display, figures=figures,
                     fix="free in solve()/run_kernel() what it allocates on every call (cudaFree, or keep one "
                         "workspace and reuse it), and keep no per-call results in globals")

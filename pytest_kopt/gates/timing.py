"""The ``timing`` gate: the kernel and its reference (and a PR gate's baseline) timed in alternating rounds, each
in its own warm harness process (:mod:`.measure`); the statistics, the sanity checks (:mod:`.suspects`), the figures,
the summary line and ``bench.json`` (:class:`pytest_kopt.artifacts.Bench`), per benchmark shape and over them."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

from .. import stats
from ..artifacts import Bench, Head, TimedRun, Timing, read_dict
from ..child.samples import host_gap_ms, median
from ..errors import HardwareError, IncorrectError, KoptError, TimingError
from ..settings import dims_label
from .build import built
from .context import Context, Outcome
from .correctness import require_correct
from .gpus import same_device
from .leaks import assess, leak_error
from .measure import (GRAPH_CALLS, MS_PER_US, TIMING, Measured, device_peaks, interleaves_reference,
                      measure_shape, retime_interleaved, stability, timing_basis, timing_policy)
from .request import harness_request
from .suspects import Finding, cupti_suspects, suspects, unstable_causes

# the gate's own names, and what the loop (retime_interleaved), the benchmarks (GRAPH_CALLS, TIMING) and the tests
# (timing_basis, cupti_suspects, unstable_causes) import from here though it lives in .measure or .suspects
__all__ = ["GRAPH_CALLS", "TIMING", "cupti_suspects", "gate_timing", "profiled_shape", "retime_interleaved",
           "shapes_summary", "timing_basis", "timing_cases", "unstable_causes"]

#: How the summary line names each basis of samples.
BASIS_NAMES = {"cupti": "kernel-only (CUPTI)", "graph": "graph", "events": "events"}


def timing_cases(ctx: Context) -> list[tuple[str, Any]]:
    """One timing item for one benchmark shape (no case: ``timing``); with several, one per shape
    (``timing[M=4096,N=1024]``, the case is its dims)."""
    shapes = ctx.benchmarks
    if len(shapes) < 2:
        return [("", None)]
    return [(dims_label(d), dict(d)) for d in shapes]


def gate_timing(ctx: Context, case: Any = None) -> Outcome:
    """Time the kernel and (in its own process) the reference: rotating input sets with fresh values, L2 flushed
    before every call, adaptive stopping on the median's standard error, NVML clocks. Writes ``bench.json`` with
    SKILL.md's fields. Fails with LEAK (device memory that grows with the timed calls: :mod:`.leaks`),
    UNSTABLE_TIMING (robust CV > 0.10), SUSPECT (under the roofline floor from the measured peaks, or host clock far
    beyond the event time: work on another stream), or the guard status of the timed-output check (a timed call's
    output is checked against the reference in another process).

    ``case``: one of several benchmark shapes (its dims). That shape's ``bench.json`` goes to
    ``shapes/<M=..,N=..>/``, and the kernel's own ``bench.json`` becomes their summary (:func:`shapes_summary`):
    ``median_ms`` the geometric mean of the shapes' medians, ``speedup_vs_ref`` the geometric mean of their
    speedups with a bootstrap CI."""
    device = ctx.device_for("timing")
    res = built(ctx)
    require_correct(ctx, res, device)
    if device == "cuda":
        try:
            ctx.ahead.profile_ahead(ctx)  # the estimate's set only; its kernels wait for the ncu item's turn
        except (OSError, KoptError):
            pass  # the ncu item starts its own
    if case is None:
        return _time_shape(ctx, res, device)
    try:
        outcome = _time_shape(ctx.at(case), res, device)
    finally:
        shapes_summary(ctx)
    return outcome


def profiled_shape(ctx: Context) -> tuple[dict[str, Any] | None, Bench | None]:
    """The shape ncu and the roofline work on, and its timing: with several benchmark shapes the first one (its
    dims, its own ``shapes/<label>/bench.json``), else (None, the kernel's ``bench.json``)."""
    if len(ctx.benchmarks) < 2:
        return None, Bench.load(ctx.outdir)
    first = dict(ctx.benchmarks[0])
    return first, Bench.load(ctx.at(first).outdir)


def shapes_summary(ctx: Context) -> dict[str, Any]:
    """Write (and return) the kernel's ``bench.json`` over its benchmark shapes from each shape's own
    ``shapes/<label>/bench.json`` (:meth:`pytest_kopt.artifacts.Bench.over_shapes`)."""
    shapes = [(dims, dims_label(dims), ctx.at(dims).outdir) for dims in ctx.benchmarks]
    bench = Bench.over_shapes(str(ctx.kernel), ctx.settings.dims, ctx.arch, shapes)
    bench.write(ctx.outdir)
    return bench.doc


def race_safe(ctx: Context) -> bool | None:
    """SKILL.md's ``race_safe``: from this session's racecheck record, None when racecheck did not run."""
    if "racecheck" not in ctx.settings.sanitizer:
        return None
    rec = read_dict(ctx.outdir / "sanitizer_racecheck.json")
    errors = (rec or {}).get("errors")
    return None if errors is None else errors == 0


def bench_head(ctx: Context, run: TimedRun) -> Head:
    """The head of ``ctx``'s bench.json: the kernel, its dims, arch, the GPU that timed it (name and UUID as the
    timed process reported them, the session's index of it); ``autotune``: per ``@triton.autotune`` kernel, the
    config the build pinned and every gate ran."""
    return Head(kernel=str(ctx.kernel), dims=ctx.settings.dims, arch=ctx.arch, gpu=run.gpu, gpu_uuid=run.gpu_uuid,
                gpu_index=(ctx.env.get("gpu") or {}).get("index"),
                autotune={name: c["config"] for name, c in built(ctx).autotune.items()})


@dataclass(frozen=True, slots=True)
class Judged:
    """A measurement's statistics (:class:`~pytest_kopt.artifacts.Timing`) and what the gate derives from them:
    the host's median time of a call and its gap beyond the events, a call's launch and a synchronise (ms), the
    roofline floor (ms, None without a workload model and peaks), GFLOP/s and GB/s by the workload model (None
    without one), and the suspect findings."""

    timing: Timing
    host_median_ms: float
    host_gap_ms: float
    floor_ms: float | None
    gflops: float | None
    gbytes_per_s: float | None
    suspects: list[Finding]

    @property
    def valid(self) -> bool:
        """Whether the timing is valid: not unstable and nothing suspect."""
        return self.timing.stability != "unstable" and not self.suspects


def judge(ctx: Context, m: Measured, peaks: dict[str, Any] | None) -> Judged:
    """The statistics of ``m`` (samples on its basis; graph samples are differences of two replays, whose spread is
    the flush's, so their stability is judged on the median's precision) and the suspect rules over them."""
    run, basis = m.run, m.basis
    k = stats.describe(basis.kernel)
    r = stats.describe(basis.reference)
    ke = stats.describe(run.event_ms)
    host_med = median(run.host_ms)  # as the timing process chose its probe by
    # expected host time of one un-held call: its launch + the kernel + a synchronise round trip (calibrated);
    # against the event median, the clock the host's own time is comparable with
    gap = host_gap_ms(host_med, ke.median_ms, run.raw["host_launch_ms"], run.raw["host_overhead_ms"])
    wm = run.workload or {}
    floor = stats.roofline_floor_ms(wm.get("flops"), wm.get("bytes_min"),
                                    max((peaks or {}).get("bf16_flops") or 0, (peaks or {}).get("fp32_flops") or 0)
                                    or None, (peaks or {}).get("dram_bytes_per_s"))
    stable, judged_on = stability(k, graph=basis.name == "graph", host_work=basis.host_work_ms is not None)
    timing = Timing(basis=basis, kernel=k, reference=r, events=ke,
                    speedup=stats.bootstrap_ratio_ci(basis.reference, basis.kernel), stability=stable,
                    stability_basis=judged_on)
    found = suspects(basis=basis.name, method=ctx.settings.timing_method, kernel_median_ms=k.median_ms,
                     events_median_ms=ke.median_ms, host_median_ms=host_med, host_gap_ms=gap, floor_ms=floor,
                     cupti=run.cupti, ref_cupti=m.ref.cupti)

    def giga_per_s(amount: float | None) -> float | None:  # a workload amount per second of the median, in 1e9/s
        return None if amount is None else amount / (k.median_ms * 1e-3) / 1e9

    return Judged(timing=timing, host_median_ms=host_med, host_gap_ms=gap, floor_ms=floor,
                  gflops=giga_per_s(wm.get("flops")), gbytes_per_s=giga_per_s(wm.get("bytes_min")), suspects=found)


def figures(m: Measured, j: Judged, memory: dict[str, Any] | None = None) -> dict[str, Any]:
    """The timing item's figures (scalars: they become junit ``user_properties``); ``memory``: bench.json's
    ``memory`` record (:func:`~pytest_kopt.gates.leaks.assess`), whose check, basis, held bytes, a call's peak
    (bytes) and growth per call (bytes) join them where they have a value."""
    t, run = j.timing, m.run
    k = t.kernel
    speedup, sp_lo, sp_hi = t.speedup
    out: dict[str, Any] = {"median_ms": k.median_ms, "mean_ms": k.mean_ms, "min_ms": k.min_ms, "p10_ms": k.p10_ms,
                           "p90_ms": k.p90_ms, "ci95_low_ms": k.ci95_low_ms, "ci95_high_ms": k.ci95_high_ms,
                           "robust_cv": round(k.robust_cv, 5), "median_rse": round(k.median_rse, 5),
                           "stability": t.stability, "stability_basis": t.stability_basis, "samples": k.n,
                           "timing_basis": t.basis.name, "events_median_ms": t.events.median_ms,
                           "stop_reason": run.raw["stop_reason"], "rotating_sets": run.raw["rotating_sets"],
                           "timing_method": run.mode, "host_gap_ms": j.host_gap_ms,
                           "ref_median_ms": t.reference.median_ms, "speedup_vs_ref": speedup,
                           "speedup_ci95_low": sp_lo, "speedup_ci95_high": sp_hi,
                           "gpu_uuid": run.gpu_uuid}  # as the timed process reported it
    if run.throttled is not None:
        out["throttled_samples"] = sum(run.throttled)
    if run.cupti.get("median_us") is not None:
        out["cupti_median_ms"] = run.cupti["median_us"] * MS_PER_US
    if m.basis.host_work_ms is not None:
        out["host_work_ms"] = m.basis.host_work_ms
    if j.gflops is not None:
        out["gflops"] = j.gflops
    if j.gbytes_per_s is not None:
        out["gbytes_per_s"] = j.gbytes_per_s
    if j.floor_ms is not None:
        out["roofline_floor_ms"] = j.floor_ms
    if m.first_attempt is not None:
        out["first_attempt_robust_cv"] = round(m.first_attempt.robust_cv, 5)
    mem = memory or {}
    for key, name in (("check", "memory_check"), ("basis", "memory_basis"), ("held_bytes", "memory_held_bytes"),
                      ("peak_call_bytes", "peak_call_bytes"), ("bytes_per_call", "memory_bytes_per_call")):
        if mem.get(key) is not None:
            out[name] = mem[key]
    return out


def memory_note(memory: dict[str, Any]) -> str:
    """The summary line's words on device memory: the check's verdict and a call's peak."""
    mib = 2.0**20
    peak = memory.get("peak_call_bytes")
    peak_text = f", a call's peak {peak / mib:.1f} MiB" if peak is not None else ""
    check = memory.get("check")
    if check == "flat":
        return f"; device memory flat over {memory.get('readings')} readings{peak_text}"
    if check == "too_few_readings":
        return f"; device memory not judged ({memory.get('readings')} readings after the warm-up){peak_text}"
    return f"; device memory not read{peak_text}"


def summary(m: Measured, j: Judged, memory: dict[str, Any] | None = None) -> str:
    """The timing item's line: the median with its CI on its basis, stability, the reference and the speedup, then
    what else is worth knowing (GFLOP/s, an unstable first attempt, throttling, the other clock, the basis's note)."""
    ms = stats.fmt_ms
    t, run, basis, cupti = j.timing, m.run, m.basis, m.run.cupti
    k = t.kernel
    speedup, sp_lo, sp_hi = t.speedup
    extra = f", {j.gflops:.1f} GFLOP/s" if j.gflops is not None else ""
    if m.first_attempt is not None:
        fa = m.first_attempt
        extra += (f"; the first measurement was unstable (robust CV {fa.robust_cv:.3f}: "
                  f"{'; '.join(fa.causes)}), measured again {fa.remeasured}")
    if run.throttled:
        extra += f", {sum(run.throttled)} throttled samples"
    if basis.name == "cupti":
        extra += f"; CUDA events {ms(t.events.median_ms)}"
    elif cupti.get("median_us") is not None:
        extra += f"; kernel-only (CUPTI) {ms(cupti['median_us'] * MS_PER_US)}"
    if basis.note:
        extra += f"; {basis.note}"
    elif cupti.get("error") and basis.name != "cupti":
        extra += f"; no CUPTI time ({cupti['error'][:80]})"
    if memory is not None:
        extra += memory_note(memory)
    judged = " by the median's precision" if t.stability_basis == "median_rse" else ""
    return (f"median {ms(k.median_ms)} [{ms(k.ci95_low_ms)}, {ms(k.ci95_high_ms)}] "
            f"{BASIS_NAMES.get(basis.name, basis.name)} (robust CV {k.robust_cv:.3f}, {t.stability}{judged}, n={k.n}, "
            f"{run.raw['stop_reason']}), reference {ms(t.reference.median_ms)}, speedup {speedup:.2f}x "
            f"[{sp_lo:.2f}, {sp_hi:.2f}]{extra}")


def no_valid_timing(ctx: Context, m: Measured) -> KoptError:
    """The error of a measurement with nothing valid to describe: a timed call's output was wrong, or the timed
    calls did no measurable work (:attr:`~pytest_kopt.gates.measure.Measured.did_nothing`)."""
    v = m.verdict
    if not v.ok:
        return IncorrectError(f"a timed call's output is wrong: {v.message}", gate="timing", path=ctx.display,
                              status=v.status, details="\n".join(v.details),
                              fix="the kernel behaves differently while timed (cached results, stale pointers)")
    what = ("its profiled calls launched no GPU work (CUPTI recorded no kernel, memset or copy between the flushes)"
            if m.basis.name == "cupti" and not m.basis.kernel else
            f"the timed calls' median is {statistics.median(m.run.event_ms) * 1e3:.3f} µs, not above zero")
    return TimingError(f"{what}: the timed work did nothing measurable", gate="timing", path=ctx.display,
                       status="SUSPECT", fix="the kernel must launch its work on the current stream inside "
                                             "solve()/run_kernel(), on every call and also while a CUDA graph is "
                                             "captured")


def unstable(ctx: Context, m: Measured, j: Judged) -> TimingError:
    """The error of an unstable timing: the spread that failed, and why (:func:`unstable_causes`)."""
    k = j.timing.kernel
    graph = m.basis.name == "graph"
    what = (f"the median's relative standard error {k.median_rse:.1%} > 4.0% (graph samples, robust CV "
            f"{k.robust_cv:.3f})" if graph else f"robust CV {k.robust_cv:.3f} > 0.10")
    why = unstable_causes(m.run.raw)["causes"] if not graph else []
    fa = m.first_attempt
    again = f" (measured twice: {fa.remeasured})" if fa and fa.remeasured else ""
    return TimingError(f"timing is unstable: {what} over {k.n} {m.basis.name} samples (median "
                       f"{stats.fmt_ms(k.median_ms)}){again}; why: {'; '.join(why) or 'no cause found'}",
                       gate="timing", path=ctx.display,
                       fix="make sure nothing else runs on the GPU; keep host work (allocations, copies, "
                           "synchronisations) out of solve()/run_kernel(); a kernel of a few µs needs more "
                           "samples or --kopt-timing graph")


def _time_shape(ctx: Context, res: Any, device: str) -> Outcome:
    """The timing gate at ``ctx``'s shape (:func:`gate_timing`), its build ``res`` on ``device``."""
    t_peaks = time.perf_counter()
    peaks = device_peaks(ctx)
    t_peaks = time.perf_counter() - t_peaks
    req = harness_request(ctx, "timing", device, ctx.settings.seeds[0], res, timing=timing_policy(ctx))
    m = measure_shape(ctx, req)
    head = bench_head(ctx, m.run)
    if not m.verdict.ok or m.did_nothing:
        # judged before any statistics: a timed call that did no work (a graph captured empty, a call that launches
        # nothing) has a median of noise around 0, which no distribution describes; the bench.json left says why
        # timing is not valid
        Bench.invalid(head, m.run, m.basis, policy=m.policy, timed_output_check=m.verdict.status).write(ctx.outdir)
        raise no_valid_timing(ctx, m)
    pinned = (ctx.env.get("gpu") or {}).get("uuid") if ctx.env.get("pinned") else None
    if not same_device(m.run.gpu_uuid, pinned):
        raise HardwareError(f"the timed process ran on {m.run.gpu_uuid}, not on {pinned}, the GPU this "
                            "worker is pinned to", gate="timing", path=ctx.display,
                            fix="leave CUDA_VISIBLE_DEVICES to pytest-kopt (--kopt-gpus) in the kernel's process")
    j = judge(ctx, m, peaks)
    memory = assess(m.run.raw, int(m.policy.get("max_sets") or TIMING["max_sets"]))
    leak = bool(memory["leak"])
    path = Bench.measured(head, j.timing, m.run, m.ref, valid=j.valid and not leak, race_safe=race_safe(ctx),
                          policy=m.policy, memory=memory,
                          interleaved=interleaves_reference(ctx), seeds=ctx.settings.seeds, floor_ms=j.floor_ms,
                          peaks=peaks, gflops=j.gflops, gbytes_per_s=j.gbytes_per_s,
                          suspects=[text for text, _ in j.suspects], timed_output_check=m.verdict.status,
                          peaks_s=t_peaks, first_attempt=m.first_attempt, baseline=m.baseline,
                          baseline_kernel=str(ctx.settings.baseline)).write(ctx.outdir)
    if leak:
        # the process holds what the calls leaked: ended, so the session's later items find the memory free
        ctx.pool.end(ctx.server("candidate"), dict(req.get("env") or {}))
        raise leak_error(memory, ctx.display)
    if j.suspects:
        raise TimingError("; ".join(text for text, _ in j.suspects), gate="timing", path=ctx.display,
                          status="SUSPECT", fix="; ".join(dict.fromkeys(fix for _, fix in j.suspects)))
    if j.timing.stability == "unstable":
        raise unstable(ctx, m, j)
    return Outcome(figures(m, j, memory), summary(m, j, memory), (str(path),))

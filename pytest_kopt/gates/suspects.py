"""What makes a timing suspect or unstable, each rule a small pure function over figures the timing gate measured:
the roofline floor, the host's gap, CUPTI's records of the profiled calls, events against the kernel-only spans, a
kernel the profiler could not record; and why a timing is unstable (:func:`unstable_causes`). A rule returns
(finding, fix) pairs, [] when it finds nothing."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .. import stats
from ..child.samples import HOST_UNDER_EVENTS, host_gap_exceeds

#: A finding (a sentence: what was seen) and its fix (what to change).
Finding = tuple[str, str]

#: Share of samples whose launch call took longer on the host than the stream hold, from which the host's own time
#: is taken to be inside the timed window (the GPU idles waiting for the rest of the launches).
HOST_BOUND_SHARE = 0.10
#: Share of throttled samples from which clocks are named as a cause.
THROTTLED_SHARE = 0.10


def unstable_causes(result: dict[str, Any]) -> dict[str, Any]:
    """Why an events-method timing is unstable, from what the timed process recorded: host work inside the call (a
    launch whose host time exceeded the stream hold in at least :data:`HOST_BOUND_SHARE` of the samples: the GPU
    waited for the host inside the window), other processes with a context on the GPU (NVML), throttled clocks.
    Returns ``{"causes": [sentences], "remedy": what a second measurement changes ("" for nothing), "hold_us": the
    hold for it (2 x the 90th percentile of the launches' host time + 20 µs), "wait_s": seconds to wait first}``."""
    causes: list[str] = []
    remedy: list[str] = []
    hold_us = float(result.get("hold_us") or 0)
    wait_s = 0.0
    launches = [x for x in (result.get("launch_host_us") or []) if x is not None]
    if launches:
        p90 = stats.quantile(launches, 0.9)
        over = sum(x > hold_us for x in launches) / len(launches)
        if over >= HOST_BOUND_SHARE:
            causes.append(f"host work inside the timed call: its launch took {stats.quantile(launches, 0.5):.0f} µs "
                          f"(p90 {p90:.0f} µs) on the host, longer than the {hold_us:.0f} µs stream hold in "
                          f"{over:.0%} of the samples, so the GPU waited for the host inside the window")
            remedy.append(f"with a {2 * p90 + 20:.0f} µs hold")
            hold_us = 2 * p90 + 20
    others = result.get("gpu_processes") or []
    if others:
        causes.append(f"{len(others)} other process(es) hold a context on this GPU (pids "
                      f"{', '.join(str(o['pid']) for o in others[:5])})")
        remedy.append("after 2 s")
        wait_s = 2.0
    throttled = result.get("throttled") or []
    if throttled and sum(throttled) / len(throttled) >= THROTTLED_SHARE:
        causes.append(f"{sum(throttled)} of {len(throttled)} samples ran at throttled clocks (power/thermal "
                      "slowdown or an SM clock under 75% of its maximum)")
    return {"causes": causes, "remedy": " and ".join(remedy), "hold_us": hold_us, "wait_s": wait_s}


def cupti_suspects(cupti: Mapping[str, Any]) -> list[Finding]:
    """What the kernel-only records say of a call that does not do its work every time: calls that launched no GPU
    work, or calls that launched different kernels (by the sorted list of kernel names) from one call to the next.
    Returns (finding, fix) pairs."""
    out: list[Finding] = []
    empty, calls = int(cupti.get("empty_calls") or 0), int(cupti.get("calls") or 0)
    if empty:
        out.append((f"{empty} of {empty + calls} profiled calls launched no GPU work (a result computed once and "
                    "replayed, or work skipped on some calls)",
                    "launch the kernel's work on every call; a call that does no GPU work has no kernel time"))
    sets = cupti.get("launch_sets") or []
    if len(sets) > 1:
        shown = "; ".join(f"{', '.join(d['kernels'])[:120] or 'nothing'} in {d['calls']} call(s)" for d in sets[:3])
        out.append((f"the calls launched different kernels from call to call ({shown})",
                    "launch the same work on every call; if the work truly depends on the input values, time it "
                    "with --kopt-timing events"))
    return out


def under_floor(median_ms: float, floor_ms: float | None) -> list[Finding]:
    """A median (ms) under the roofline floor (ms, :func:`pytest_kopt.stats.roofline_floor_ms`): faster than the
    measured peaks allow."""
    if not (floor_ms is not None and median_ms < floor_ms):
        return []
    return [(f"median {stats.fmt_ms(median_ms)} is under the roofline floor {stats.fmt_ms(floor_ms)} "
             f"(bytes_min / measured bandwidth, flops / measured peak, each with {stats.FLOOR_HEADROOM:g}x "
             "headroom)", "check workload_model's flops and bytes_min; synchronise all work inside "
                          "solve()/run_kernel()")]


def host_gap(gap_ms: float, host_median_ms: float, events_median_ms: float) -> list[Finding]:
    """Work outside the timed stream: the host saw the device busy far longer than the events did. ``gap_ms``: the
    host's median time of a call less the event median, the call's launch and a synchronise round trip (ms,
    :func:`~pytest_kopt.child.samples.host_gap_ms`; the threshold is
    :func:`~pytest_kopt.child.samples.host_gap_exceeds`'). The timing process takes its probe again where it shows
    a gap (:meth:`pytest_kopt.child.timer.Timer.result`), so this sees the smallest of its probes."""
    if not host_gap_exceeds(gap_ms, events_median_ms):
        return []
    return [(f"the host clock (synchronised) saw {stats.fmt_ms(host_median_ms)} per call but CUDA events "
             f"{stats.fmt_ms(events_median_ms)} (work on another stream or a background thread?)",
             "synchronise all work inside solve()/run_kernel(): launch it on the current stream")]


def host_under_events(host_median_ms: float, events_median_ms: float) -> list[Finding]:
    """The side-stream probe's synchronised calls (median, ms) took less than
    :data:`~pytest_kopt.child.samples.HOST_UNDER_EVENTS` of the timed calls' event median (ms): a synchronised
    call holds its kernels, so the calls did less when probed than when timed."""
    if not host_median_ms < HOST_UNDER_EVENTS * events_median_ms:
        return []
    return [(f"the host clock (synchronised) saw {stats.fmt_ms(host_median_ms)} per call, under the "
             f"{stats.fmt_ms(events_median_ms)} CUDA events saw of the timed calls: the calls did less work when "
             "not timed", "do the same work in every call of solve()/run_kernel()")]


#: A kernel-only median under (the event median - 20 µs) / 1.5 is SUSPECT: calls that do their work when not profiled
#: only. Honest calls differ by launch gaps and the flush's tail: 2.5 to 3 µs on an H200 (events/span 2.795 at
#: 1.41 µs, 1.061 at 43.7 µs, 1.049 at 60.3 µs; timing_fidelity.py, 2026-12-03).
EVENTS_OVER_KERNEL = 1.5
EVENTS_GAP_MS = 0.020


def _events_exceed(events_median_ms: float, kernel_median_ms: float) -> bool:
    return events_median_ms > EVENTS_OVER_KERNEL * kernel_median_ms + EVENTS_GAP_MS


def host_work(events_median_ms: float, kernel_median_ms: float, host_inside_ms: float | None) -> float | None:
    """The host work inside a call (ms: the event median less the kernel-only median) when the events exceed the
    kernels' own span beyond what launch gaps and the flush's tail explain (:data:`EVENTS_OVER_KERNEL`,
    :data:`EVENTS_GAP_MS`) *and* the profiled calls show where the difference went: the host worked
    ``host_inside_ms`` per call inside the call while its GPU waited (up to its last launch under the profiled
    spin, and while the GPU idled between or after its kernels: ``host_inside_median_us`` of
    :mod:`pytest_kopt.child.cupti`), enough that the events less that time are within the bound. None when the
    events are within the bound, or when the host's time does not account for them (:func:`events_over_kernel`).

    What tells the two apart. Honest host work (a ``solve()`` that calls ``cudaMalloc``/``cudaFree`` per call, a
    copy to the host and back) happens in the profiled calls too: CUPTI records the host inside the call ahead of
    its first launch (``cudaMalloc``) and the GPU waiting for the host (after the last kernel while ``cudaFree``
    runs, between two kernels). The attack the rule was written for does its work only when not profiled: its
    profiled calls launch a cheap kernel and return, and the events (taken without the profiler) hold work nothing
    recorded. A candidate can imitate honest host work in its profiled calls (sleep before or after its cheap
    kernel), so a call with host work is timed by its CUDA events, host work included, never by the kernels' span
    (:func:`pytest_kopt.gates.measure.timing_basis`): what an imitation would hide is then in the reported time.
    The host's time under the profiled spin counts in full though the event timer's hold covers part of it: an
    over-count moves the timing to the events, the call's whole cost, and never under it."""
    if host_inside_ms is None or not _events_exceed(events_median_ms, kernel_median_ms):
        return None
    if _events_exceed(events_median_ms - host_inside_ms, kernel_median_ms):
        return None
    return events_median_ms - kernel_median_ms


def events_over_kernel(events_median_ms: float, kernel_median_ms: float,
                       host_inside_ms: float | None = None) -> list[Finding]:
    """Kernel-only samples (ms) far under the event samples (:data:`EVENTS_OVER_KERNEL`), where the host's time
    inside the profiled calls while their GPU waited (``host_inside_ms``, ms; None when not measured) does not
    account for the difference (:func:`host_work`): calls that do their work when not profiled only."""
    if not _events_exceed(events_median_ms, kernel_median_ms) \
            or host_work(events_median_ms, kernel_median_ms, host_inside_ms) is not None:
        return []
    idle = (f"; the host worked only {stats.fmt_ms(host_inside_ms)} per profiled call inside it while the GPU "
            "waited" if host_inside_ms is not None else "")
    # honest calls differ by launch gaps and the flush's tail (2.5 to 3 µs on an H200, EVENTS_OVER_KERNEL)
    return [(f"CUDA events saw {stats.fmt_ms(events_median_ms)} per call but the kernels' own records "
             f"{stats.fmt_ms(kernel_median_ms)} (more than {EVENTS_OVER_KERNEL:g}x + "
             f"{EVENTS_GAP_MS * 1e3:g} µs){idle}: the calls do work the profiled calls did not",
             "launch the same work whether or not a profiler is attached; move host work out of "
             "solve()/run_kernel()")]


def kernel_not_profiled(cupti: Mapping[str, Any], ref_cupti: Mapping[str, Any]) -> list[Finding]:
    """The profiler recorded the reference's calls (``ref_cupti`` has spans) but failed on the kernel's
    (``cupti``'s ``error``): a kernel that interferes with the profiler."""
    if not (cupti.get("error") and ref_cupti.get("spans_us")):
        return []
    return [(f"the profiler recorded the reference's calls but not the kernel's ({cupti['error'][:160]})",
             "leave the profiler alone in solve()/run_kernel(); --kopt-timing events times without it")]


def host_inside_ms(cupti: Mapping[str, Any]) -> float | None:
    """The host's median time (ms) inside the kernel's profiled calls while their GPU waited for it: before the
    first launch and while the GPU idled between or after the call's kernels (``cupti``'s
    ``host_inside_median_us``; a record from before that field, ``idle_median_us``), None when not measured."""
    t = cupti.get("host_inside_median_us", cupti.get("idle_median_us"))
    return None if t is None else float(t) * 1e-3


def suspects(*, basis: str, method: str, kernel_median_ms: float, events_median_ms: float, host_median_ms: float,
             host_gap_ms: float, floor_ms: float | None, cupti: Mapping[str, Any],
             ref_cupti: Mapping[str, Any]) -> list[Finding]:
    """Every rule that applies to a timing on ``basis`` (``cupti``, ``events``, ``graph``) under the session's
    ``--kopt-timing`` ``method``, in the order the reports list them. Medians in ms; ``cupti``/``ref_cupti``: the
    kernel's and the reference's kernel-only records ({} when none). A call with host work (:func:`host_work`) is
    timed on ``events`` (:func:`pytest_kopt.gates.measure.timing_basis`), where :func:`events_over_kernel` does not
    apply; calls that launch nothing or launch different kernels (:func:`cupti_suspects`), work the events cannot
    see (:func:`host_gap`) and calls that do less when probed (:func:`host_under_events`) stay suspect on every
    basis."""
    found = (under_floor(kernel_median_ms, floor_ms) + host_gap(host_gap_ms, host_median_ms, events_median_ms)
             + host_under_events(host_median_ms, events_median_ms))
    if basis == "cupti" or (method == "cupti" and cupti.get("spans_us")):
        found += cupti_suspects(cupti)
    if basis == "cupti":
        found += events_over_kernel(events_median_ms, kernel_median_ms, host_inside_ms(cupti))
    if method == "cupti" and basis == "events":
        found += kernel_not_profiled(cupti, ref_cupti)
    return found


#: ncu's own duration of the profiled call against the timing gate's median: a kernel whose timing reads under a
#: third of what ncu measured, less 10 µs, had its timing reported by something other than its kernels. ncu runs
#: with ``--clock-control none`` and flushes the caches between its passes, as the timing gate flushes L2 before
#: every call: on the H200 the two agree to 0.1% at 25 ms (README) and a kernel-only span is never shorter than the
#: sum of its launches' durations, so an honest kernel is far from this bound.
NCU_OVER_TIMING = 3.0
NCU_SLACK_MS = 0.010


def outside_measurement(ncu_ms: float | None, timing_ms: float | None) -> list[Finding]:
    """ncu's duration of the profiled call (ms, measured by ncu, outside anything the kernel's process reports)
    against the timing gate's median (ms): TAMPERED when the timing is far under it (:data:`NCU_OVER_TIMING`)."""
    if ncu_ms is None or timing_ms is None or not ncu_ms > NCU_OVER_TIMING * timing_ms + NCU_SLACK_MS:
        return []
    return [(f"ncu measured the kernel at {stats.fmt_ms(ncu_ms)} per call but its timing reported "
             f"{stats.fmt_ms(timing_ms)} (more than {NCU_OVER_TIMING:g}x + {NCU_SLACK_MS * 1e3:g} µs apart): the "
             "timing figures did not come from the kernel's own work",
             "the kernel's process must not change how it is timed (torch's events, the profiler, the harness); "
             "its timing is void")]

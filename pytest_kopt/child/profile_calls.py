"""A profile's records split into calls: the device records (kernels, memsets, copies) of each profiled call told
apart from its flush window's by when the host launched them, or by the names a flush alone launched, and the host's
time inside each call while its GPU idles or waits for launches. Plain Python over (start, end, name, correlation
id) tuples in one clock (µs); no CUDA. Used by :mod:`pytest_kopt.child.cupti`."""

from __future__ import annotations

import bisect
from typing import Mapping


def call_segments(events: list[tuple[float, float, str]], flush_names: set[str],
                  per_flush: int) -> list[list[tuple[float, float, str]]]:
    """Split a profile's device records (start, end, name), sorted by start, into calls: each run of
    ``per_flush`` records named in ``flush_names`` (one flush may launch several kernels) starts a call, and the
    records up to the next flush are that call's. A call that launched nothing is an empty list between two
    flushes; records before the first flush belong to no call."""
    segments: list[list[tuple[float, float, str]]] = []
    current: list[tuple[float, float, str]] | None = None
    run = 0
    for ev in events:
        if ev[2] in flush_names:
            if run % max(1, per_flush) == 0:
                if current is not None:
                    segments.append(current)
                current = []
            run += 1
        else:
            run = 0
            if current is not None:
                current.append(ev)
    if current is not None:
        segments.append(current)
    return segments


def calls_by_launch(records: list[tuple[float, float, str, int]], launches: Mapping[int, float],
                    flush_windows: list[tuple[float, float]]) -> tuple[list[list[tuple[float, float, str]]], int]:
    """Split device records into calls by when the host launched them, not by their names (a call that launches
    the flush's own kernel, a torch.sum, must not read as a flush; a kernel named like the flush must not hide).

    ``records``: (start, end, name, correlation id) per device record; ``launches``: correlation id -> host time
    of the runtime call that launched it (cudaLaunchKernel, cudaGraphLaunch, cudaMemsetAsync...);
    ``flush_windows``: (host start, host end) of each flush's range, in order, all times in one clock (µs). A
    record launched inside a window is the flush's; one launched after window k (and before window k+1) is call
    k's; one launched before the first window belongs to no call. Returns (one list of (start, end, name) per
    window, in device start order; the number of records no launch matched)."""
    starts = [w[0] for w in flush_windows]
    segments: list[list[tuple[float, float, str]]] = [[] for _ in flush_windows]
    unmatched = 0
    for start, end, name, corr in sorted(records):
        t = launches.get(corr)
        if t is None:
            unmatched += 1
            continue
        k = bisect.bisect_right(starts, t) - 1
        if k >= 0 and t > flush_windows[k][1]:
            segments[k].append((start, end, name))
    return segments, unmatched


def idle_in_calls(records: list[tuple[float, float, str, int]], segments: list[list[tuple[float, float, str]]],
                  call_windows: list[tuple[float, float]]) -> list[float]:
    """Per call that launched something (in ``segments`` order, as the spans are), the µs inside the call during
    which the GPU ran nothing while the host was still in it: from the host's start of the call to whichever ends
    later, the host's return or the call's last device record, less the time any device record (the flush window's
    spin included) ran. ``records``: every device record of the batch (start, end, name, correlation id);
    ``segments``: each call's records (:func:`calls_by_launch`); ``call_windows``: (host start, host end) of each
    call, one per segment; all in one clock (µs).

    This is the host work a call does while its GPU waits (a ``cudaFree`` after the last kernel, a ``cudaMalloc``
    between two, a copy to the host and back): the CUDA events around an unprofiled call see it and the kernels'
    span does not. Host work queued behind the flush window's spin (a ``cudaMalloc`` before the first launch) keeps
    the GPU busy and is not counted: the event timer's own hold covers it the same way."""
    merged: list[list[float]] = []
    for start, end, _, _ in sorted(records):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    starts = [m[0] for m in merged]
    out = []
    for seg, (lo, host_end) in zip(segments, call_windows):
        if not seg:
            continue
        hi = max(host_end, max(e for _, e, _ in seg))
        busy = 0.0
        for a, b in merged[max(0, bisect.bisect_right(starts, lo) - 1):bisect.bisect_right(starts, hi)]:
            busy += max(0.0, min(b, hi) - max(a, lo))
        out.append(max(0.0, (hi - lo) - busy))
    return out


def host_before_launch(records: list[tuple[float, float, str, int]], launches: Mapping[int, float],
                       segments: list[list[tuple[float, float, str]]], call_windows: list[tuple[float, float]],
                       flush_windows: list[tuple[float, float]] | None = None) -> list[float]:
    """Per call that launched something (in ``segments`` order, as :func:`idle_in_calls`), the µs the host spent
    inside the call while the flush window's spin still held the GPU, up to the call's last launch that ran on the
    device: from the host's start of the call to the earlier of that launch's host time (``launches``, by the
    correlation id of a device record in ``records``) and the end of the flush window's last device record
    (``flush_windows``: (host start, host end) of each window, whose launches are the flush's; without them, the
    launch's time alone). Same clock and arguments as :func:`idle_in_calls`.

    Host work between the call's launches while the spin runs (a ``cudaMalloc`` before the first kernel, or after a
    first ``cudaMemsetAsync``) keeps the GPU busy with the spin while profiled, so :func:`idle_in_calls` does not
    see it; behind the event timer's shorter hold it is inside the events' window. After the spin ends, the GPU's
    idle time is :func:`idle_in_calls`'s. A call with no host work spends here only its launch path (a few µs; a
    Triton or torch candidate's Python, tens of µs); a ``cudaFree`` that waits for the call's kernels is no launch
    and not counted."""
    by_launch = sorted((launches[c], end) for _, end, _, c in records if c in launches)
    launched = [t for t, _ in by_launch]
    out = []
    for k, (seg, (lo, hi)) in enumerate(zip(segments, call_windows)):
        if not seg:
            continue
        a, b = bisect.bisect_left(launched, lo), bisect.bisect_right(launched, hi)
        if a == b:
            out.append(0.0)
            continue
        last = launched[b - 1]
        if flush_windows is not None and k < len(flush_windows):
            w0, w1 = flush_windows[k]
            ends = [end for t, end in by_launch[bisect.bisect_left(launched, w0):bisect.bisect_right(launched, w1)]]
            if ends:  # past the spin's end the GPU idles while the host works: idle_in_calls counts that
                last = min(last, max(ends))
        out.append(max(0.0, last - lo))
    return out

"""Timing inside a harness process: the L2 flush, the stream hold, and the two timers.

:class:`EventsTimer` times one call per sample with CUDA events; :class:`GraphTimer` times N (flush, call) pairs
against N flushes alone, captured in CUDA graphs (or queued behind a host-held stream where capture is impossible).
Both are resumable, so several parties (candidate, reference, a PR gate's baseline) can be timed in alternating
rounds. All times are in ms. The kernel-only time from CUPTI's activity records is :mod:`pytest_kopt.child.cupti`.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

from .clocks import Clocks, StreamGate, reset_persisting_l2
from .samples import HOST_UNDER_EVENTS, host_gap_exceeds, host_gap_ms, median, should_stop


class Timer:
    """The sampling loop shared by kernel and reference timing, resumable (:meth:`take`) so parties can be timed
    in alternating rounds. Created once per party: allocates the L2 flush buffer (read, 2x the L2 size), warms up
    for ``t["warmup_ms"]`` of wall time, calibrates the stream hold (90th percentile of the warmup launches' host
    time, x2 + 20 µs) and the host overhead of a launch + synchronise, and measures the device memory one call
    holds at its peak (:meth:`call_peak`). ``launch(set)`` calls the party once without waiting (every call is
    counted: :attr:`calls`); ``refresh(set, k)`` writes new values into a set (outside any timed window).
    Subclasses define one sample (:meth:`sample`) and when sets are refreshed (:meth:`refresh_sets`). Device memory
    is read (:meth:`read_memory`) at the end of every :meth:`take` and, sampling to the stopping rule in one go, after
    sample 16, 32, 64, ...: the in-process witness of :mod:`pytest_kopt.gates.leaks`."""

    method = "events"

    def __init__(self, torch: Any, sets: list[Any], launch: Callable[[Any], None],
                 refresh: Callable[[Any, int], None], t: dict[str, Any]) -> None:
        self.torch, self.sets, self.refresh, self.t = torch, sets, refresh, t
        #: calls of ``launch`` so far (warm-up, samples, the peak's call, the profiled calls)
        self.calls = 0

        def counted(s: Any) -> None:
            self.calls += 1
            launch(s)

        self.launch = counted
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        self.l2 = int(getattr(props, "L2_cache_size", 0) or 50 * 2**20)
        # flush by *reading* 2x L2: a write-based flush leaves dirty lines whose write-back then runs in the kernel
        self.flush_buf = torch.ones(2 * self.l2 // 4, dtype=torch.float32, device="cuda")
        self.flush_out = torch.empty((), dtype=torch.float32, device="cuda")
        self.clocks = Clocks()
        before = self.clocks.read()
        t_end = time.perf_counter() + t["warmup_ms"] / 1e3
        i = 0
        launch_s: list[float] = []
        while i < 3 or time.perf_counter() < t_end:
            h = time.perf_counter()
            self.launch(sets[i % len(sets)])
            launch_s.append(time.perf_counter() - h)
            torch.cuda.synchronize()
            i += 1
        self.warmup_calls = i
        after = self.clocks.read()
        #: the warm-up: its calls and the SM clock (MHz, NVML) before and after it, beside the GPU's maximum (None
        #: without NVML): whether the GPU was already at its clocks when the warm-up began
        self.warmup = {"calls": i, "sm_mhz_before": before["sm_mhz"] if before else None,
                       "sm_mhz_after": after["sm_mhz"] if after else None,
                       "max_sm_mhz": getattr(self.clocks, "max_sm", None) if self.clocks.nvml else None}
        tail = launch_s[1:] or launch_s
        self.host_launch_us = 1e6 * sorted(tail)[int(0.9 * (len(tail) - 1))]
        self.host_launch_ms = statistics.median(tail) * 1e3
        self.clock_khz = int(getattr(props, "clock_rate", 0) or 1_980_000)
        # a re-measurement may ask for a longer hold (a launch whose host time varies: host work inside solve())
        self.hold_us = max(2 * self.host_launch_us + 20, float(t.get("hold_us") or 0))
        # host-clock overhead of an (almost) empty launch + sync, to judge the host-vs-event gap against
        tiny = torch.empty(1, device="cuda")
        over = []
        for _ in range(20):
            h0 = time.perf_counter()
            tiny.zero_()
            torch.cuda.synchronize()
            over.append((time.perf_counter() - h0) * 1e3)
        self.host_overhead_ms = statistics.median(over)
        #: device memory readings (:meth:`read_memory`), and why NVML gave this process's own figure in none
        self.memory: list[dict[str, Any]] = []
        self.memory_note: str | None = None
        self.peak_call = self.call_peak()
        self.start, self.stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self.event_ms: list[float] = []
        #: host time (µs) of each timed launch call: longer than the hold, the GPU idles inside the window
        self.launch_host_us: list[float] = []
        self.throttled: list[bool] = []
        self.readings: list[dict[str, Any]] = []
        self.elapsed_s = 0.0
        self.k = 0
        #: what a non-final round reports besides the samples (the candidate's input spec, for the reference)
        self.info: dict[str, Any] = {}
        #: where this party's wall time went (s): ``prepare`` (load, first call, input sets, warmup: set by the
        #: caller), ``sampling``, ``side_stream_probe``, and what the mode adds (``cupti``, ``check_call``)
        self.phase_s: dict[str, float] = {}

    def call_peak(self) -> dict[str, int]:
        """The device memory one call (after the warm-up, on the first set) holds at its peak, in bytes:
        ``torch_bytes``, torch's allocator peak during the call above what was allocated before it (what a torch or
        Triton candidate allocates through torch, its outputs included); ``device_held_bytes``, the device's free
        memory before the call less after it (what the call left held: a workspace it keeps, a segment torch's
        allocator reserved, a leak); ``bytes``, the larger. Memory a ``.cu`` call cudaMalloc's and frees before it
        returns is in neither (no reading runs inside a call)."""
        torch = self.torch
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        free0 = torch.cuda.mem_get_info()[0]
        self.launch(self.sets[0])
        torch.cuda.synchronize()
        peak = max(0, int(torch.cuda.max_memory_allocated() - before))
        held = max(0, int(free0 - torch.cuda.mem_get_info()[0]))
        return {"torch_bytes": peak, "device_held_bytes": held, "bytes": max(peak, held)}

    def read_memory(self) -> None:
        """Append one device memory reading: after ``samples`` samples and ``calls`` calls, this process's own
        memory as NVML lists it (``nvml_bytes``, None where it cannot: :meth:`Clocks.process_bytes`), the device's
        used memory (total - free, every process's), and torch's allocated and reserved bytes in this process."""
        torch = self.torch
        try:
            free, total = torch.cuda.mem_get_info()
            used: int | None = int(total - free)
        except RuntimeError:
            used = None
        nvml, self.memory_note = self.clocks.process_bytes()
        self.memory.append({"samples": self.k, "calls": self.calls, "nvml_bytes": nvml, "device_used_bytes": used,
                            "torch_allocated_bytes": int(torch.cuda.memory_allocated()),
                            "torch_reserved_bytes": int(torch.cuda.memory_reserved())})

    def flush(self) -> None:
        """Queue the L2 flush (a read of 2x the L2 size)."""
        self.torch.sum(self.flush_buf, dim=0, out=self.flush_out)

    def hold(self, us: float) -> None:
        """Queue a GPU spin of ``us`` microseconds (keeps the stream busy while the host launches)."""
        self.torch.cuda._sleep(int(us * self.clock_khz / 1e3))

    def sample(self) -> float:
        """One sample, ms."""
        raise NotImplementedError

    def refresh_sets(self) -> None:
        """Before sample ``k``: new values in the set it uses, once every set has been used (outside the window);
        before every sample with ``t["refresh_every_call"]`` (a call that changes its in-place outputs)."""
        if self.k >= len(self.sets) or (self.t.get("refresh_every_call") and self.k):
            self.refresh(self.sets[self.k % len(self.sets)], self.k)

    def _stop(self) -> str | None:
        t = self.t
        return should_stop(self.event_ms, self.elapsed_s, target_rse=t["target_rse"], min_samples=t["min_samples"],
                           min_time_s=t["min_time_s"], budget_s=t["budget_s"], max_samples=t["max_samples"])

    def take(self, count: int | None = None) -> str | None:
        """Take ``count`` samples, or (None) sample until :func:`pytest_kopt.stats.should_stop`; returns the stop
        reason (None after a fixed count that did not meet it)."""
        if count == 0:
            return self._stop()
        taken = 0
        while True:
            t0 = time.perf_counter()
            self.refresh_sets()
            before = self.clocks.read()
            self.event_ms.append(self.sample())
            after = self.clocks.read()
            if before and after:
                self.throttled.append(before["throttled"] or after["throttled"])
                if self.k % 16 == 0:
                    self.readings.append(after)
            self.k += 1
            taken += 1
            self.elapsed_s += time.perf_counter() - t0
            reason = self._stop()
            done = (reason is not None and count is None) or (count is not None and taken >= count)
            if done or (count is None and self.k >= 16 and not self.k & (self.k - 1)):
                self.read_memory()  # outside the sample's time: the stopping rule never sees it
            if done:
                return reason

    def result(self, reason: str | None) -> dict[str, Any]:
        """The side-stream probe, then every figure: per-sample lists (ms) and the stop reason.

        Probe: without the stream hold, launch and synchronise the whole device :func:`probe_calls` times; work the
        events did not see (another stream, a background thread) lengthens these host-clock times beyond launch +
        event + sync (:func:`~pytest_kopt.child.samples.host_gap_ms`). A probe that shows such a gap is taken again,
        up to :data:`PROBE_RETRIES` times :data:`PROBE_RETRY_WAIT_S` apart, and the one of the smallest median that
        is not under :data:`~pytest_kopt.child.samples.HOST_UNDER_EVENTS` of the event median is reported
        (``host_ms``; ``host_probes_ms``: each probe's median): a call's own work on another stream is in every
        probe, another process's driver work beside this one (a CUDA context being made, ncu starting) is not; a
        probe under the events is of calls that did less than the timed ones (the judge's
        :func:`~pytest_kopt.gates.suspects.host_under_events`)."""
        events = median(self.event_ms) if self.event_ms else None
        t0 = time.perf_counter()
        probes = [self._probe(events if events is not None else 1.0)]
        host_ms = probes[0]
        while events is not None and len(probes) <= PROBE_RETRIES and host_gap_exceeds(
                host_gap_ms(median(host_ms), events, self.host_launch_ms, self.host_overhead_ms), events):
            time.sleep(PROBE_RETRY_WAIT_S)
            probes.append(self._probe(events))
            # the smallest probe that did the timed calls' work: one under HOST_UNDER_EVENTS of the events (calls
            # that skip their work after a pause) is never chosen over one that shows the gap
            full = [p for p in probes if median(p) >= HOST_UNDER_EVENTS * events] or probes
            host_ms = min(full, key=median)
        self.phase_s.update(sampling=self.elapsed_s, side_stream_probe=time.perf_counter() - t0)
        return {"event_ms": self.event_ms, "host_ms": host_ms, "host_probes_ms": [median(p) for p in probes],
                "host_overhead_ms": self.host_overhead_ms,
                "host_launch_ms": self.host_launch_ms, "throttled": self.throttled or None,
                "launch_host_us": self.launch_host_us or None, "gpu_processes": self.clocks.other_processes(),
                "nvml": self.readings or None, "stop_reason": reason, "rotating_sets": len(self.sets),
                "l2_bytes": self.l2, "flush_bytes": 2 * self.l2, "warmup_calls": self.warmup_calls,
                "warmup": self.warmup, "host_launch_us": self.host_launch_us, "hold_us": self.hold_us,
                "method": self.method, "phase_s": self.phase_s,
                "memory": {"readings": self.memory, "peak_call": self.peak_call, "nvml_note": self.memory_note}}

    def _probe(self, events_median_ms: float) -> list[float]:
        """One side-stream probe: :func:`probe_calls` synchronised calls, each one's host time (ms)."""
        torch = self.torch
        host_ms: list[float] = []
        for j in range(probe_calls(events_median_ms)):
            s = self.sets[j % len(self.sets)]
            torch.cuda.synchronize()
            h0 = time.perf_counter()
            self.launch(s)
            torch.cuda.synchronize()
            host_ms.append((time.perf_counter() - h0) * 1e3)
        return host_ms


#: How many times a side-stream probe that shows a gap is taken again, and the wait before each (s). One honest
#: Triton branch of 32 in a close saw 0.10 ms a synchronised call against its 0.012 ms events (every call of the
#: probe, a 3 ms window) while the close's other processes made CUDA contexts; its 31 siblings' gaps were -30 to
#: +4 µs (H100, 2026-12-07).
PROBE_RETRIES = 2
PROBE_RETRY_WAIT_S = 0.05


def probe_calls(median_ms: float) -> int:
    """Calls of the side-stream probe (:meth:`Timer.result`) for a kernel whose event median is ``median_ms``: about
    0.1 s of them, at least 5 and at most 30 (a 25 ms kernel gets 5, where 30 cost 0.77 s on the H200)."""
    return max(5, min(30, int(100.0 / max(median_ms, 1e-3))))


class EventsTimer(Timer):
    """One sample = CUDA events around one ``launch(set)``, on the next rotating set. Before it, outside the window:
    persisting L2 lines reset, L2 flushed, and the stream held by a GPU spin longer than the host's launch time, so
    Python launch latency stays out of the window."""

    method = "events"

    def sample(self) -> float:
        torch = self.torch
        s = self.sets[self.k % len(self.sets)]
        reset_persisting_l2()
        torch.cuda.synchronize()
        # the flush stays queued ahead of the timed launch, so the GPU is busy while the host launches (a host
        # round trip between them would put launch latency, tens of µs for a Python launcher, inside the window)
        self.flush()
        self.hold(self.hold_us)
        self.start.record()
        h = time.perf_counter()
        self.launch(s)
        self.launch_host_us.append((time.perf_counter() - h) * 1e6)
        self.stop.record()
        torch.cuda.synchronize()
        return self.start.elapsed_time(self.stop)


class GraphTimer(Timer):
    """For kernels of a few µs, where one event pair's resolution and the launch gap dominate: ``t["graph_calls"]``
    (N) pairs of (L2 flush, launch on the next set) captured in one CUDA graph and the N flushes alone in another;
    one sample = (replay time of the pairs - replay time of the flushes) / N, the two replays timed back to back,
    their order alternating. A launch CUDA cannot capture (``t["capture"]`` false: a ``.cu`` ``solve()`` launches on
    the legacy default stream) falls back to the same N pairs queued behind a hold on a host-written flag
    (:class:`StreamGate`; a GPU spin where the driver refuses it). ``graph_method`` (``cuda_graph`` or ``queued``)
    and ``graph_hold`` say which ran. Every set's values are refreshed in place between samples (the graphs read
    fixed addresses)."""

    method = "graph"

    def __init__(self, torch: Any, sets: list[Any], launch: Callable[[Any], None],
                 refresh: Callable[[Any, int], None], t: dict[str, Any]) -> None:
        super().__init__(torch, sets, launch, refresh, t)
        self.n = int(t.get("graph_calls", 20))
        self.graph_method: str | None = None
        self.graph_note: str | None = None
        self.graph_hold: str | None = None
        self._gate: StreamGate | None = None
        self._prepare(bool(t.get("capture", True)))

    def _pairs(self, with_kernel: bool) -> None:
        for j in range(self.n):
            self.flush()
            if with_kernel:
                self.launch(self.sets[j % len(self.sets)])

    def _prepare(self, capture: bool) -> None:
        torch = self.torch
        try:
            if not capture:
                raise RuntimeError("a .cu solve() launches on the legacy default stream, which a capture does not "
                                   "record")
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # torch's rule: warm up on a side stream before capture
                self._pairs(True)
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            self.g_pairs, self.g_flush = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.g_pairs):
                self._pairs(True)
            with torch.cuda.graph(self.g_flush):
                self._pairs(False)
            torch.cuda.synchronize()
            self.graph_method = "cuda_graph"
        except Exception as exc:  # e.g. cudaErrorStreamCaptureImplicit: a launch on the legacy default stream
            torch.cuda.synchronize()
            self.graph_method = "queued"
            self.graph_note = f"no CUDA graph ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); " \
                              f"the {self.n} pairs are queued behind a stream hold instead"
            h = time.perf_counter()
            self._pairs(True)
            self.queue_us = (time.perf_counter() - h) * 1e6
            torch.cuda.synchronize()
            self._gate = StreamGate.create(torch)

    def _timed_block(self, with_kernel: bool) -> float:
        torch = self.torch
        torch.cuda.synchronize()
        if self.graph_method == "cuda_graph":
            graph = self.g_pairs if with_kernel else self.g_flush
            self.hold(self.hold_us)
            self.start.record()
            graph.replay()
        else:
            gate = self._gate
            if gate is not None and gate.close():
                self.graph_hold = "stream_wait_value"
                try:  # held until every pair is queued, however slow the host is
                    self.start.record()
                    self._pairs(with_kernel)
                    self.stop.record()
                finally:
                    gate.open()
                torch.cuda.synchronize()
                return self.start.elapsed_time(self.stop)
            self.graph_hold = "spin"
            self.hold(4 * self.queue_us + 100)
            self.start.record()
            self._pairs(with_kernel)
        self.stop.record()
        torch.cuda.synchronize()
        return self.start.elapsed_time(self.stop)

    def sample(self) -> float:
        if self.k % 2:  # alternate which block goes first, so a drift between them cancels
            flush_only = self._timed_block(False)
            pairs = self._timed_block(True)
        else:
            pairs = self._timed_block(True)
            flush_only = self._timed_block(False)
        return (pairs - flush_only) / self.n

    def refresh_sets(self) -> None:
        if self.k > 0:
            for j, s in enumerate(self.sets):
                self.refresh(s, self.k * len(self.sets) + j)

    def replay_pairs(self) -> None:
        """Replay what was timed (the captured pairs) once and wait: the timed-output check reads its results."""
        self.g_pairs.replay()
        self.torch.cuda.synchronize()

    def result(self, reason: str | None) -> dict[str, Any]:
        return {**super().result(reason), "graph_method": self.graph_method, "graph_calls": self.n,
                "graph_note": self.graph_note, "graph_hold": self.graph_hold}


def make_timer(torch: Any, sets: list[Any], launch: Callable[[Any], None], refresh: Callable[[Any, int], None],
               t: dict[str, Any]) -> Timer:
    """The timer of the policy's method (``t["method"]``: ``events`` or ``graph``)."""
    cls = GraphTimer if t.get("method", "events") == "graph" else EventsTimer
    return cls(torch, sets, launch, refresh, t)

"""Timing inside a harness process: the L2 flush, the stream hold, NVML clocks, and the two timers.

:class:`EventsTimer` times one call per sample with CUDA events; :class:`GraphTimer` times N (flush, call) pairs
against N flushes alone, captured in CUDA graphs (or queued behind a host-held stream where capture is impossible).
Both are resumable, so several parties (candidate, reference, a PR gate's baseline) can be timed in alternating
rounds. All times are in ms.
"""

from __future__ import annotations

import ctypes
import functools
import os
import statistics
import time
from typing import Any, Callable, Mapping

from ..stats import median, quantile, should_stop


class Clocks:
    """NVML (nvidia-ml-py) readings of the GPU: SM clock (MHz), temperature (C) and throttle reasons; inert when
    NVML is missing. ``throttled`` follows nvbench: a power/thermal slowdown reason, or an SM clock under 75% of
    the maximum."""

    # nvmlClocksThrottleReason* bits that mean the clock was pulled down (SW power cap, HW slowdown, SW/HW thermal,
    # HW power brake); idle, application clocks and sync boost are not slowdowns.
    SLOWDOWN = 0x4 | 0x8 | 0x20 | 0x40 | 0x80

    def __init__(self) -> None:
        self.nvml: Any = None
        try:
            import pynvml

            pynvml.nvmlInit()
            # NVML ignores CUDA_VISIBLE_DEVICES: find the GPU this process uses by the UUID or index it names
            first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
            if first.upper().startswith("GPU-"):
                self.handle = pynvml.nvmlDeviceGetHandleByUUID(first)
            else:
                self.handle = pynvml.nvmlDeviceGetHandleByIndex(int(first) if first.isdigit() else 0)
            self.max_sm = pynvml.nvmlDeviceGetMaxClockInfo(self.handle, pynvml.NVML_CLOCK_SM)
            self.nvml = pynvml
        except Exception:  # no NVML: readings are reported as unavailable
            self.nvml = None

    def read(self) -> dict[str, Any] | None:
        """One reading, or None without NVML."""
        if self.nvml is None:
            return None
        n = self.nvml
        try:
            sm = n.nvmlDeviceGetClockInfo(self.handle, n.NVML_CLOCK_SM)
            temp = n.nvmlDeviceGetTemperature(self.handle, n.NVML_TEMPERATURE_GPU)
            reasons = n.nvmlDeviceGetCurrentClocksThrottleReasons(self.handle)
        except Exception:
            return None
        return {"sm_mhz": sm, "temp_c": temp, "reasons": int(reasons),
                "throttled": bool(reasons & self.SLOWDOWN) or sm < 0.75 * self.max_sm}

    def other_processes(self) -> list[dict[str, Any]] | None:
        """The other processes that hold a context on this GPU (``pid``, ``used_bytes``), None without NVML."""
        if self.nvml is None:
            return None
        try:
            procs = self.nvml.nvmlDeviceGetComputeRunningProcesses(self.handle)
        except Exception:
            return None
        return [{"pid": int(p.pid), "used_bytes": int(getattr(p, "usedGpuMemory", 0) or 0)} for p in procs
                if not same_session(int(p.pid))]


def same_session(pid: int, root: int | None = None) -> bool:
    """True when ``pid`` is this process or descends from the session's root process (``KOPT_SESSION_PID``: the
    pytest controller), read from ``/proc``: the session's own reference and candidate processes hold contexts on
    the GPU too, and are not another user's load. A pid this namespace cannot see (NVML inside a container reports
    the host's pids) is counted as another process."""
    if pid == os.getpid():
        return True
    if root is None:
        try:
            root = int(os.environ.get("KOPT_SESSION_PID", "0"))
        except ValueError:
            return False
    seen = 0
    while pid > 1 and seen < 64:
        if pid == root:
            return True
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])  # the field after the (name) is state, then ppid
        except (OSError, ValueError, IndexError):
            return False
        seen += 1
    return False


_LIBCUDA: list[Any] = []


def _libcuda() -> Any:
    if not _LIBCUDA:
        _LIBCUDA.append(ctypes.CDLL("libcuda.so.1"))
    return _LIBCUDA[0]


def reset_persisting_l2() -> None:
    """cuCtxResetPersistingL2Cache: lines a kernel pinned with an access-policy window survive a normal flush.
    It waits for the device, so it must run before the flush is queued, never between flush and timed launch."""
    try:
        _libcuda().cuCtxResetPersistingL2Cache()
    except (OSError, AttributeError):
        pass


class StreamGate:
    """Holds the current stream on a host-written flag (driver ``cuStreamWaitValue32``, nvbench's blocking-kernel
    idea without a spin): :meth:`close` enqueues a wait for flag >= 1, the host queues the timed work, :meth:`open`
    writes the flag. Used by the queued graph mode, where the host may need longer to queue N pairs than any fixed
    spin. ``create`` returns None where stream memory operations are unavailable (the caller then spins)."""

    def __init__(self, torch: Any, fn: Any, flag: Any) -> None:
        self.torch, self.fn, self.flag = torch, fn, flag

    @staticmethod
    def create(torch: Any) -> "StreamGate | None":
        """The gate, or None when the driver has no stream memory operations."""
        try:
            lib = _libcuda()
            fn = getattr(lib, "cuStreamWaitValue32_v2", None) or lib.cuStreamWaitValue32
            fn.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
            fn.restype = ctypes.c_int
            flag = torch.zeros(1, dtype=torch.int32, pin_memory=True)  # mapped into the device's address space
        except (OSError, AttributeError, RuntimeError):
            return None
        return StreamGate(torch, fn, flag)

    def close(self) -> bool:
        """Enqueue the wait on the current stream (flag reset to 0 first); False when the driver refused it."""
        try:
            self.flag[0] = 0
            stream = self.torch.cuda.current_stream().cuda_stream
            return self.fn(ctypes.c_void_p(stream), self.flag.data_ptr(), 1, 0) == 0  # CU_STREAM_WAIT_VALUE_GEQ
        except (ctypes.ArgumentError, RuntimeError, OSError):
            return False

    def open(self) -> None:
        """Let the held stream run."""
        self.flag[0] = 1


class Timer:
    """The sampling loop shared by kernel and reference timing, resumable (:meth:`take`) so parties can be timed
    in alternating rounds. Created once per party: allocates the L2 flush buffer (read, 2x the L2 size), warms up
    for ``t["warmup_ms"]`` of wall time, calibrates the stream hold (90th percentile of the warmup launches' host
    time, x2 + 20 µs) and the host overhead of a launch + synchronise. ``launch(set)`` calls the party once without
    waiting; ``refresh(set, k)`` writes new values into a set (outside any timed window). Subclasses define one
    sample (:meth:`sample`) and when sets are refreshed (:meth:`refresh_sets`)."""

    method = "events"

    def __init__(self, torch: Any, sets: list[Any], launch: Callable[[Any], None],
                 refresh: Callable[[Any, int], None], t: dict[str, Any]) -> None:
        self.torch, self.sets, self.launch, self.refresh, self.t = torch, sets, launch, refresh, t
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        self.l2 = int(getattr(props, "L2_cache_size", 0) or 50 * 2**20)
        # flush by *reading* 2x L2: a write-based flush leaves dirty lines whose write-back then runs in the kernel
        self.flush_buf = torch.ones(2 * self.l2 // 4, dtype=torch.float32, device="cuda")
        self.flush_out = torch.empty((), dtype=torch.float32, device="cuda")
        self.clocks = Clocks()
        t_end = time.perf_counter() + t["warmup_ms"] / 1e3
        i = 0
        launch_s: list[float] = []
        while i < 3 or time.perf_counter() < t_end:
            h = time.perf_counter()
            launch(sets[i % len(sets)])
            launch_s.append(time.perf_counter() - h)
            torch.cuda.synchronize()
            i += 1
        self.warmup_calls = i
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
            if reason is not None and count is None:
                return reason
            if count is not None and taken >= count:
                return reason

    def result(self, reason: str | None) -> dict[str, Any]:
        """The side-stream probe, then every figure: per-sample lists (ms) and the stop reason.

        Probe: without the stream hold, launch and synchronise the whole device :func:`probe_calls` times; work the
        events did not see (another stream, a background thread) lengthens these host-clock times beyond launch +
        event + sync."""
        torch = self.torch
        host_ms: list[float] = []
        t0 = time.perf_counter()
        for j in range(probe_calls(statistics.median(self.event_ms) if self.event_ms else 1.0)):
            s = self.sets[j % len(self.sets)]
            torch.cuda.synchronize()
            h0 = time.perf_counter()
            self.launch(s)
            torch.cuda.synchronize()
            host_ms.append((time.perf_counter() - h0) * 1e3)
        self.phase_s.update(sampling=self.elapsed_s, side_stream_probe=time.perf_counter() - t0)
        return {"event_ms": self.event_ms, "host_ms": host_ms, "host_overhead_ms": self.host_overhead_ms,
                "host_launch_ms": self.host_launch_ms, "throttled": self.throttled or None,
                "launch_host_us": self.launch_host_us or None, "gpu_processes": self.clocks.other_processes(),
                "nvml": self.readings or None, "stop_reason": reason, "rotating_sets": len(self.sets),
                "l2_bytes": self.l2, "flush_bytes": 2 * self.l2, "warmup_calls": self.warmup_calls,
                "host_launch_us": self.host_launch_us, "hold_us": self.hold_us, "method": self.method,
                "phase_s": self.phase_s}


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


#: The profiler range (torch.profiler.record_function) each profiled flush runs in: what was launched inside it is
#: the flush's, whatever its kernels are named
FLUSH_RANGE = "kopt::l2_flush"
#: µs of GPU spin before each profiled flush (inside its range, so never counted): time for the host to queue the
#: call's launches while the profiler slows it
KERNEL_TIMES_HOLD_US = 1000.0


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
    import bisect

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


def cupti_calls(median_ms: float) -> int:
    """How many calls the first batch of :func:`cupti_samples` profiles for a kernel whose event median is
    ``median_ms`` (ms): about 0.3 s of calls, at least 5 and at most 50 (a 25 ms kernel gets 12, a 10 µs one 50)."""
    return max(5, min(50, int(300.0 / max(median_ms, 1e-3))))


#: The kernel-only (CUPTI) samples' stopping rule: at least ``min_samples`` calls, then batches until the median's
#: relative standard error is under ``target_rse`` (half the events' 0.5%: the spread of 5 repeated medians, about
#: 4.6 standard errors for n = 5, then stays under 1%), ``budget_s`` of profiling or ``max_samples`` calls. A call
#: under ``batches_below_us`` is not converged before ``min_batches`` batches: the calls of one batch are not
#: independent samples of a short kernel. On the H200 (2026-12-03), a two-kernel sum of 11.7 µs gave medians
#: whose standard error from within a batch of 50 calls (MAD, order statistics or bootstrap) read 0.1-0.25%, while
#: 8 batches' medians spread over 1.36% (standard deviation 0.46%), with new input sets or the same ones; over 3
#: batches of 50 calls the spread of 8 medians was 0.37-0.50%. Three batches (200 calls) took 0.50 s for that sum and
#: 0.44 s for an add of 1 M floats (median of 12 runs each, H200, 2026-12-03, seventh session). More batches do not
#: take the sum under 1%: its medians fall in two levels run to run (docs/timing.md).
CUPTI = {"min_samples": 20, "target_rse": 0.0025, "budget_s": 1.5, "max_samples": 1000, "batch_max": 200,
         "min_batches": 3, "batches_below_us": 1000.0}


def cupti_stop(spans_us: list[float], elapsed_s: float, batches: int) -> str | None:
    """Why the kernel-only sampling stops after ``batches`` batches that gave ``spans_us`` (µs, one per call) in
    ``elapsed_s`` seconds (``converged``, ``budget``, ``max_samples``: :func:`pytest_kopt.stats.should_stop` with
    :data:`CUPTI`'s figures), or None to profile another batch: a median under ``batches_below_us`` is not
    ``converged`` before ``min_batches`` batches."""
    reason = should_stop([x / 1e3 for x in spans_us], elapsed_s, target_rse=CUPTI["target_rse"],
                         min_samples=CUPTI["min_samples"], budget_s=CUPTI["budget_s"],
                         max_samples=CUPTI["max_samples"])
    if reason == "converged" and batches < CUPTI["min_batches"] and median(spans_us) < CUPTI["batches_below_us"]:
        return "budget" if elapsed_s >= CUPTI["budget_s"] else None
    return reason


@functools.lru_cache(maxsize=None)
def demangle(name: str) -> str:
    """A C++ kernel name as torch's profiler shows it (``_Z11sgemm_naivePKfS0_Pfiii`` ->
    ``sgemm_naive(float const*, float const*, float*, int, int, int)``), through the C++ runtime's
    ``__cxa_demangle``; a name it cannot read (a C or Triton kernel's, or no libstdc++) comes back as it is. CUPTI's
    records carry mangled names; the messages and ``launch_sets`` show them demangled, whichever client recorded."""
    if not name.startswith("_Z"):
        return name
    try:
        fn = ctypes.CDLL("libstdc++.so.6").__cxa_demangle
    except (OSError, AttributeError):
        return name
    fn.restype = ctypes.c_void_p
    fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
    status = ctypes.c_int(1)
    ptr = fn(name.encode(), None, None, ctypes.byref(status))
    if not ptr or status.value != 0:
        return name
    try:
        return ctypes.string_at(ptr).decode(errors="replace")
    finally:
        free = ctypes.CDLL(None).free
        free.argtypes = [ctypes.c_void_p]
        free(ptr)


class CuptiActivity:
    """CUPTI's activity API through cupti-python (``pip install cupti-python``, a version no newer than the driver's
    CUDA): the device records (kernels, memcpy, memset) and the host records of the runtime and driver calls that
    launched them, in one clock (CUPTI's timestamps, in µs after the session's start: they count ns since the Unix
    epoch, about 1.8e18, where a float64 of µs keeps only quarter-µs steps). One per process, made by
    :func:`profiler_backend`: CUPTI serves one activity client per process up to CUDA 13.2, so torch's profiler is
    not used beside it. Raises what cupti-python raises when CUPTI cannot start (no cupti-python, a CUPTI newer than
    the driver: ``CUPTI_ERROR_NOT_INITIALIZED``)."""

    #: bytes per activity buffer CUPTI asks for (it asks again when one fills)
    BUFFER_BYTES = 8 << 20

    def __init__(self) -> None:
        from cupti import cupti

        self.cupti = cupti
        kind = cupti.ActivityKind
        self.kinds = [kind.CONCURRENT_KERNEL, kind.MEMCPY, kind.MEMSET, kind.RUNTIME, kind.DRIVER]
        self._kernel = int(kind.CONCURRENT_KERNEL)
        self._names = {int(kind.MEMCPY): "Memcpy", int(kind.MEMSET): "Memset"}
        self._api = {int(kind.RUNTIME), int(kind.DRIVER)}
        #: CUPTI's timestamp (ns) at the session's start: every time here is µs after it
        self.origin = 0
        #: (start µs, end µs, name, correlation id) of each device record of the session
        self.device: list[tuple[float, float, str, int]] = []
        #: correlation id -> host µs at which the runtime or driver call that carries it started
        self.launches: dict[int, float] = {}
        cupti.activity_register_callbacks(self._requested, self._completed)

    def _requested(self) -> tuple[int, int]:
        return self.BUFFER_BYTES, 0

    def _completed(self, activities: Any) -> None:
        for a in activities:
            k = int(a.kind)
            if k in self._api:
                self.launches.setdefault(int(a.correlation_id), (a.start - self.origin) / 1e3)
            elif a.end > a.start and (k == self._kernel or k in self._names):
                name = demangle(str(a.name)) if k == self._kernel else self._names[k]
                self.device.append(((a.start - self.origin) / 1e3, (a.end - self.origin) / 1e3, name,
                                    int(a.correlation_id)))

    def now_us(self) -> float:
        """CUPTI's clock now (the clock of its records), in µs after the session's start."""
        return (self.cupti.get_timestamp() - self.origin) / 1e3

    def start(self) -> None:
        """Drop what the last session recorded and start recording."""
        self.device, self.launches = [], {}
        self.origin = int(self.cupti.get_timestamp())
        enabled = []
        try:
            for k in self.kinds:
                self.cupti.activity_enable(k)
                enabled.append(k)
        except Exception:  # leave CUPTI as it was (torch's profiler may take over), then say why
            for k in enabled:
                try:
                    self.cupti.activity_disable(k)
                except Exception:
                    pass
            raise

    def stop(self) -> None:
        """Deliver every record (the caller synchronized the device first) and stop recording."""
        try:
            self.cupti.activity_flush_all(1)  # CUPTI_ACTIVITY_FLAG_FLUSH_FORCED: incomplete buffers too
        finally:
            for k in self.kinds:
                self.cupti.activity_disable(k)


#: This process's profiler backend, once :func:`profiler_backend` chose it: ``name`` (``cupti-python`` or
#: ``torch.profiler``), ``activity`` (the :class:`CuptiActivity`, or None), ``note`` (why cupti-python is not used),
#: ``warm_s`` (the seconds the first session took).
_BACKEND: dict[str, Any] = {}


def profiler_backend(prefer: str = "auto") -> dict[str, Any]:
    """This process's CUPTI client, chosen once (later calls return it at once): cupti-python's activity API when it
    is installed and CUPTI starts (its first session 0.02-0.06 s on an H200, 2026-12-03), else torch's profiler
    (Kineto; its first session in a process 3.5-4.7 s there, then about 0.005 s). ``prefer``: ``auto``, or
    ``torch.profiler`` to skip cupti-python (the fidelity benchmark compares the two). Opens and closes one empty
    session, so CUPTI's start-up is paid here. A timing process calls it while idle
    (:func:`pytest_kopt.child.protocol.serve`) or, at the latest, before its first CUDA request; it runs in the
    calling thread, never beside a request's CUDA work. Returns ``{"name", "activity", "note", "warm_s"}``; a
    failure of both is left for :func:`kernel_times` to meet and report. Raises ValueError for another ``prefer``."""
    if prefer not in ("auto", "torch.profiler"):
        raise ValueError(f"profiler_backend: prefer is 'auto' or 'torch.profiler', not {prefer!r}")
    if _BACKEND:
        if prefer != "auto" and _BACKEND["name"] != prefer:
            raise ValueError(f"profiler_backend: this process already uses {_BACKEND['name']} (CUPTI takes one "
                             f"client per process); {prefer} needs a process of its own")
        return _BACKEND
    t0 = time.perf_counter()
    note = "not tried (torch.profiler asked for)"
    try:
        import torch

        cuda = torch.cuda.is_available()
    except Exception:  # pragma: no cover - a harness process always has torch
        cuda = False
    if prefer == "auto":
        import importlib.util

        if importlib.util.find_spec("cupti") is None:
            note = ("cupti-python is not installed (pip install cupti-python, with it and nvidia-cuda-cupti no newer "
                    "than the driver's CUDA)")
        else:
            try:
                activity = CuptiActivity()
                if cuda:
                    activity.start()
                    try:
                        torch.cuda.synchronize()
                    finally:
                        activity.stop()
                _BACKEND.update(name="cupti-python", activity=activity, note=None, warm_s=time.perf_counter() - t0)
                return _BACKEND
            except Exception as exc:  # an import error inside it, a CUPTI newer than the driver, or busy
                note = f"cupti-python could not start CUPTI: {type(exc).__name__}: {exc}"[:300]
    try:
        from torch.profiler import ProfilerActivity, profile

        if cuda:
            with profile(activities=[ProfilerActivity.CUDA]):
                torch.cuda.synchronize()
    except Exception:  # reported by the first real session, if it fails too
        pass
    _BACKEND.update(name="torch.profiler", activity=None, note=note, warm_s=time.perf_counter() - t0)
    return _BACKEND


def _fall_back(why: str) -> dict[str, Any]:
    """Switch this process from cupti-python to torch's profiler (``why`` becomes the backend's note); returns the
    new backend."""
    _BACKEND.clear()
    backend = profiler_backend("torch.profiler")
    backend["note"] = why
    return backend


def warm_profiler() -> float:
    """CUPTI's start-up in this process, once (:func:`profiler_backend`; later calls return at once). Returns the
    seconds this call took."""
    if _BACKEND:
        return 0.0
    return float(profiler_backend()["warm_s"])


def profiler_warm() -> bool:
    """True once :func:`warm_profiler` ran in this process."""
    return bool(_BACKEND)


def kernel_times(timer: Timer, calls: int = 50, hold_us: float | None = None,
                 flush_names: set[str] | None = None, start: int = 0) -> dict[str, Any]:
    """Kernel-only time of ``calls`` calls from the GPU's own records (CUPTI activity records, through cupti-python
    or torch's profiler: :func:`profiler_backend`), each after the L2 flush; per call the span from its first
    kernel's start to its last kernel's end, every kernel (and memset/memcpy) it launched on any stream counted.
    Before each flush, inside the flush's window: from the second pass over the input sets (or every call, for a
    call that changes its in-place outputs) fresh values in the set the call uses (call number ``start`` + i), the
    flush, and a GPU spin of ``hold_us`` (default :data:`KERNEL_TIMES_HOLD_US`: time for the host to queue a call of
    several launches while the profiler slows it); none of it counted. Each call ends (a device synchronisation)
    before the next window is queued.

    The flush's records are told apart by when the host launched them (:func:`calls_by_launch`, ``"split":
    "launch"``); where the records do not link device work to its launches, by the names a profiled flush alone
    launched (``flush_names``, measured here when not given; ``"split": "names"``, which reads a call that
    launches the flush's kernel as flushes). Returns ``spans_us`` (per call with records, in call order),
    ``median_us``, ``p10_us``, ``p90_us``, ``calls``, ``empty_calls`` (calls that launched nothing),
    ``kernels_per_call`` (the distinct counts seen), ``launch_sets`` (each distinct sorted list of kernel names a
    call launched, with how many calls launched it), ``kernels`` (names, first call), ``split``, ``flush_names``,
    ``backend`` (and ``backend_note``: why cupti-python was not used), or ``{"error": reason}`` when the profiler
    gave no records. The events timing measures launch gaps and the flush's tail as well: about 2 µs more on an
    H200 (docs/timing.md)."""
    torch = timer.torch
    backend = profiler_backend()  # CUPTI's start-up (a fresh process's) before the calls, not inside their records
    hold = max(2 * timer.hold_us, KERNEL_TIMES_HOLD_US) if hold_us is None else hold_us
    refresh_every = bool(timer.t.get("refresh_every_call"))
    info = {"backend": backend["name"], **({"backend_note": backend["note"]} if backend["note"] else {})}
    torch.cuda.synchronize()
    try:
        capture = _capture_cupti if backend["activity"] is not None else _capture_torch
        if flush_names is None:
            flush_records, _, _ = capture(backend, timer, 0, start, hold, refresh_every)
            if not flush_records and backend["activity"] is not None:
                # CUPTI started but recorded not even the flush (the warm-up ran no kernel, to disturb no other
                # process's measurement): this process uses torch's profiler from now on
                backend = _fall_back("cupti-python started CUPTI but delivered no record of a flush")
                info = {"backend": backend["name"], "backend_note": backend["note"]}
                capture = _capture_torch
                flush_records, _, _ = capture(backend, timer, 0, start, hold, refresh_every)
            flush_names = {n for _, _, n, _ in flush_records}
        records, launches, windows = capture(backend, timer, calls, start, hold, refresh_every)
    except Exception as exc:  # the profiler failed: the event timing stands alone
        return {**info, "error": f"{type(exc).__name__}: {exc}"[:300]}
    if not records:
        return {**info, "error": "the profiler delivered no CUDA records (CUPTI busy, or a second profiler session "
                                 "in this process)"}
    segments, unmatched = calls_by_launch(records, launches, windows) if len(windows) == calls else ([], len(records))
    split = "launch"
    if unmatched:  # records not linked to launches: the names of a flush alone mark the boundaries
        if not flush_names:
            return {**info, "error": f"{unmatched} of {len(records)} device records have no launch, and a flush "
                                     "alone gave no records to tell the flush by"}
        per_flush = max(1, sum(1 for r in records if r[2] in flush_names) // max(1, calls))
        segments = call_segments([(a, b, n) for a, b, n, _ in records], flush_names, per_flush)
        split = "names"
    spans = [max(e for _, e, _ in seg) - min(s for s, _, _ in seg) for seg in segments if seg]
    sets: dict[tuple[str, ...], int] = {}
    for seg in segments:
        if seg:
            names = tuple(sorted(n for _, _, n in seg))
            sets[names] = sets.get(names, 0) + 1
    base: dict[str, Any] = {**info, "calls": len(spans), "empty_calls": sum(1 for seg in segments if not seg),
                            "split": split, "flush_names": sorted(flush_names), "spans_us": spans,
                            "launch_sets": [{"kernels": list(k), "calls": n} for k, n in sets.items()]}
    if not spans:
        return {**base, "error": "no kernel of the call was recorded between the flushes"}
    return {**base, "median_us": median(spans), "p10_us": quantile(spans, 0.1), "p90_us": quantile(spans, 0.9),
            "kernels_per_call": sorted({len(seg) for seg in segments if seg}),
            "kernels": sorted({n for _, _, n in segments[0]}) if segments and segments[0] else []}


#: What one profiled batch hands back: (device records (start µs, end µs, name, correlation id), sorted; correlation
#: id -> host µs of the call that launched it; (host start, host end) µs of each flush's window, in order)
Capture = tuple[list[tuple[float, float, str, int]], dict[int, float], list[tuple[float, float]]]


def _flush_window(timer: Timer, k: int, hold: float, refresh_every: bool) -> None:
    """What precedes call ``k`` inside its flush's window: fresh values in its set (from the second pass over the
    sets, or every call for in-place outputs), the L2 flush, then a GPU spin of ``hold`` µs. The call's launches
    queue behind the spin, so its span holds no launch gap (the host runs slower while it is profiled: a 2-kernel
    torch.sum read 12.1 µs behind a 2x hold_us spin, 9.2 µs without CPU records, H200), and the flush's memory
    traffic has drained when the call starts. The capture waits for each call to end before it queues the next
    window, so the host launches nothing while a call runs: queued behind the call, the next window's launches
    lengthened the calls of a memset and a kernel (a 4 M torch.sum: medians of 100 calls 11.79-12.80 µs over three
    batches, the gap between the two 1.7-2.6 µs; waiting for each call, 11.63-11.71 µs and 1.60-1.68 µs, H200,
    docs/timing.md)."""
    s = timer.sets[k % len(timer.sets)]
    if refresh_every or k >= len(timer.sets):
        timer.refresh(s, 1_000_000 + k)  # values no event sample used
    timer.flush()
    timer.hold(hold)


def _capture_cupti(backend: dict[str, Any], timer: Timer, calls: int, start: int, hold: float,
                   refresh_every: bool) -> Capture:
    """One batch through cupti-python (:class:`CuptiActivity`); ``calls`` 0 records a flush alone (its kernels'
    names). The windows are CUPTI timestamps read on the host around each flush's launches."""
    act: CuptiActivity = backend["activity"]
    torch = timer.torch
    windows: list[tuple[float, float]] = []
    act.start()
    try:
        if not calls:
            timer.hold(hold)
            timer.flush()
        for i in range(calls):
            k = start + i
            t0 = act.now_us()
            _flush_window(timer, k, hold, refresh_every)
            windows.append((t0, act.now_us()))
            timer.launch(timer.sets[k % len(timer.sets)])
            torch.cuda.synchronize()  # the next window is queued once this call has ended (:func:`_flush_window`)
        torch.cuda.synchronize()  # CUPTI delivers only finished work: with calls=0, the flush alone
    finally:
        act.stop()
    return sorted(act.device), dict(act.launches), windows


def _capture_torch(backend: dict[str, Any], timer: Timer, calls: int, start: int, hold: float,
                   refresh_every: bool) -> Capture:
    """One batch through torch's profiler (Kineto); each flush's window is a :data:`FLUSH_RANGE` record_function
    range, and the launches are the host records of the runtime and driver calls (names starting ``cu``)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, record_function

    torch = timer.torch
    activities = [ProfilerActivity.CUDA] if not calls else [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    with profile(activities=activities) as prof:
        if not calls:
            timer.hold(hold)
            timer.flush()
        for i in range(calls):
            k = start + i
            with record_function(FLUSH_RANGE):
                _flush_window(timer, k, hold, refresh_every)
            timer.launch(timer.sets[k % len(timer.sets)])
            torch.cuda.synchronize()  # the next window is queued once this call has ended (:func:`_flush_window`)
        torch.cuda.synchronize()  # with calls=0, the flush alone
    records = sorted((float(e.time_range.start), float(e.time_range.end), str(e.name), int(e.id))
                     for e in prof.events()
                     if getattr(e, "device_type", None) == DeviceType.CUDA and e.time_range.end > e.time_range.start
                     and not getattr(e, "is_user_annotation", False) and str(e.name) != FLUSH_RANGE)
    host = [e for e in prof.events() if getattr(e, "device_type", None) == DeviceType.CPU]
    windows = sorted((float(e.time_range.start), float(e.time_range.end)) for e in host if str(e.name) == FLUSH_RANGE)
    # the runtime and driver calls that launch device work (cudaLaunchKernel, cuLaunchKernelEx, cudaGraphLaunch,
    # cudaMemcpyAsync...), by the correlation id CUPTI gives both them and their device records
    launches = {int(e.id): float(e.time_range.start) for e in host if str(e.name).startswith("cu")}
    return records, launches, windows


def cupti_samples(timer: Timer, median_ms: float) -> dict[str, Any]:
    """Kernel-only samples (:func:`kernel_times`) in batches until :func:`cupti_stop` stops them: the first batch
    :func:`cupti_calls` calls behind a 1 ms spin each; when every call of it launched one kernel (whose span no
    launch gap can lengthen), later batches spin only the event timer's hold. Returns :func:`kernel_times`'s
    fields over all batches, plus ``batches``, ``stop_reason`` and ``profile_s`` (wall seconds), or its ``error``
    (when the first batch fails; a later batch's failure ends the sampling with ``batch_error``)."""
    t0 = time.perf_counter()
    first = kernel_times(timer, cupti_calls(median_ms))
    if "error" in first:
        return {**first, "profile_s": time.perf_counter() - t0}
    out = dict(first)
    out["batches"] = 1
    single = first["kernels_per_call"] == [1] and not first["empty_calls"]
    reason = None
    while True:
        reason = cupti_stop(out["spans_us"], time.perf_counter() - t0, out["batches"])
        if reason is not None:
            break
        n = min(CUPTI["batch_max"], CUPTI["max_samples"] - len(out["spans_us"]), max(20, len(out["spans_us"])))
        nxt = kernel_times(timer, n, hold_us=timer.hold_us if single else None,
                           flush_names=set(out["flush_names"]), start=out["calls"] + out["empty_calls"])
        if "error" in nxt and not nxt.get("spans_us"):
            out["batch_error"] = nxt["error"]
            reason = "batch_error"
            break
        out["batches"] += 1
        out["spans_us"] = out["spans_us"] + nxt["spans_us"]
        out["calls"] += nxt["calls"]
        out["empty_calls"] += nxt["empty_calls"]
        out["kernels_per_call"] = sorted(set(out["kernels_per_call"]) | set(nxt.get("kernels_per_call") or []))
        merged = {tuple(d["kernels"]): d["calls"] for d in out["launch_sets"]}
        for d in nxt["launch_sets"]:
            merged[tuple(d["kernels"])] = merged.get(tuple(d["kernels"]), 0) + d["calls"]
        out["launch_sets"] = [{"kernels": list(k), "calls": c} for k, c in merged.items()]
        if nxt["split"] != "launch":
            out["split"] = nxt["split"]
    spans = out["spans_us"]
    out.update(median_us=median(spans), p10_us=quantile(spans, 0.1), p90_us=quantile(spans, 0.9), stop_reason=reason,
               profile_s=time.perf_counter() - t0)
    return out

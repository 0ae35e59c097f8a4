"""Kernel-only time from CUPTI's activity records inside a timing process: the profiler's backend (cupti-python's
activity API, else torch's profiler), its warm-up, the profiled calls between flushes, each call's span from its
first kernel's start to its last one's end, and the stopping rule of those spans. All spans are in µs."""

from __future__ import annotations

import ctypes
import functools
import time
from typing import TYPE_CHECKING, Any

from .profile_calls import call_segments, calls_by_launch, host_before_launch, idle_in_calls
from .samples import median, quantile, should_stop

if TYPE_CHECKING:
    from .timer import Timer


#: The profiler range (torch.profiler.record_function) each profiled flush runs in: what was launched inside it is
#: the flush's, whatever its kernels are named
FLUSH_RANGE = "kopt::l2_flush"
#: The profiler range each profiled call runs in (torch's profiler): the host's start and end of the call
CALL_RANGE = "kopt::call"
#: µs of GPU spin before each profiled flush (inside its range, so never counted): time for the host to queue the
#: call's launches while the profiler slows it
KERNEL_TIMES_HOLD_US = 1000.0


def cupti_calls(median_ms: float, call_wall_ms: float = 0.0) -> int:
    """How many calls the first batch of :func:`cupti_samples` profiles for a kernel whose event median is
    ``median_ms`` (ms) and one of whose event samples took ``call_wall_ms`` of wall time (ms: the fresh values
    written before it, the flush, the hold, the synchronisation): about 0.3 s of calls, at least 5 and at most 50
    (a 25 ms kernel gets 12, a 10 µs one 50; a 10 µs one whose inputs take 20 ms to refresh, as a GPU MODE
    ``generate_input`` on the host can, 15)."""
    return max(5, min(50, int(300.0 / max(median_ms, call_wall_ms, 1e-3))))


#: The kernel-only (CUPTI) samples' stopping rule: at least ``min_samples`` calls, then batches until the median's
#: relative standard error is under ``target_rse`` (half the events' 0.5%: the spread of 5 repeated medians, about
#: 4.6 standard errors for n = 5, then stays under 1%), ``budget_s`` of profiling or ``max_samples`` calls. A call
#: under ``batches_below_us`` is not converged before ``min_batches`` batches: the calls of one batch are not
#: independent samples of a short kernel. On the H200 (2026-12-03), a two-kernel sum of 11.7 µs gave medians
#: whose standard error from within a batch of 50 calls (MAD, order statistics or bootstrap) read 0.1-0.25%, while
#: 8 batches' medians spread over 1.36% (standard deviation 0.46%), with new input sets or the same ones; over 3
#: batches of 50 calls the spread of 8 medians was 0.37-0.50%. Three batches (200 calls, as batches doubled then)
#: took 0.50 s for that sum and 0.44 s for an add of 1 M floats (median of 12 runs each, H200, 2026-12-03, seventh
#: session). More batches do not take the sum under 1%: its medians fall in two levels run to run (docs/timing.md).
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
    not used beside it. ``api``: ``launches`` records only the runtime and driver calls that queue device work
    (:data:`LAUNCH_API_WORDS`), ``all`` every call. Raises ValueError for another ``api``, and what cupti-python
    raises when CUPTI cannot start (no cupti-python, a CUPTI newer than the driver: ``CUPTI_ERROR_NOT_INITIALIZED``)."""

    #: bytes per activity buffer CUPTI asks for (it asks again when one fills)
    BUFFER_BYTES = 8 << 20
    #: Words in the names of the runtime and driver calls that queue device work (kernel and graph launches, copies,
    #: sets): their records link each device record to its launch (the same correlation id). With ``api``
    #: ``launches`` every other call's record is switched off (``cuptiActivityEnableRuntimeApi``/``DriverApi``):
    #: a profiled 1024^3 ``torch.mm`` with its flush window left 69 API records per call (H100, 2026-12-06), each
    #: recorded by CUPTI and handed to Python.
    LAUNCH_API_WORDS = ("Launch", "Memcpy", "Memset")

    def __init__(self, api: str = "launches") -> None:
        if api not in ("launches", "all"):
            raise ValueError(f"CuptiActivity: api is 'launches' or 'all', not {api!r}")
        from cupti import cupti

        self.cupti = cupti
        #: which runtime and driver calls are recorded: ``launches`` (:data:`LAUNCH_API_WORDS`) or ``all``
        self.api = api
        #: why this process records every call (``api`` went from ``launches`` to ``all``), or None
        self.api_note: str | None = None
        self._quiet: list[tuple[Any, int]] | None = None
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

    def quiet_api(self) -> list[tuple[Any, int]]:
        """(switch, callback id) of each runtime and driver call whose name has none of :data:`LAUNCH_API_WORDS`
        (``cupti.activity_enable_runtime_api`` or ``_driver_api``, CUPTI's ids from cupti-python's enums); computed
        once."""
        if self._quiet is None:
            c = self.cupti
            out = []
            for enum, switch in ((c.runtime_api_trace_cbid, c.activity_enable_runtime_api),
                                 (c.driver_api_trace_cbid, c.activity_enable_driver_api)):
                for m in enum:
                    if m.name not in ("INVALID", "SIZE", "FORCE_INT") and \
                            not any(w in m.name for w in self.LAUNCH_API_WORDS):
                        out.append((switch, int(m)))
            self._quiet = out
        return self._quiet

    def record_all(self, why: str) -> None:
        """Record every runtime and driver call from now on in this process (``api`` ``all``; ``why`` becomes
        :attr:`api_note`): a device record no recorded launch matched, or a CUPTI without per-call switches."""
        self.api, self.api_note = "all", why
        for switch, cbid in self._quiet or []:
            try:
                switch(cbid, 1)
            except Exception:  # a CUPTI without the switch never switched it off
                break

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
        if self.api == "launches":
            kept, error = [], None
            for switch, cbid in self.quiet_api():
                try:
                    switch(cbid, 0)
                    kept.append((switch, cbid))
                except Exception as exc:  # an id this CUPTI does not know stays recorded
                    error = exc
            if error is not None and not kept:  # a CUPTI without the per-call switches: every call is recorded
                self.record_all(f"CUPTI cannot switch off single API records: {type(error).__name__}: {error}"[:300])
            elif error is not None:
                self._quiet = kept

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
    ``idle_us`` and ``idle_median_us`` (per call with records, the µs its GPU idled while the host was inside the
    call: :func:`idle_in_calls`), ``before_launch_us`` (the host's time inside the call up to its last launch
    under the flush window's spin: :func:`host_before_launch`), ``host_inside_us`` (their sum per call) and
    ``host_inside_median_us``; all absent where the records are split by names,
    ``backend`` (and ``backend_note``: why cupti-python was not used), ``api`` and ``api_note`` (which runtime and
    driver calls were recorded, :class:`CuptiActivity`), ``records`` (device records delivered), ``next_call`` (the
    first call number, and so input values, this batch left unused: ``start`` + ``calls``, or twice ``calls`` when
    a device record with no recorded launch had the batch profiled again), ``times_s`` (wall seconds of the batch's
    parts: ``names``, a flush recorded alone; ``capture``, the profiled calls with the session's start and stop;
    ``split``, the records split into calls), or ``{"error": reason}``
    when the profiler gave no records. The events timing measures launch gaps and the flush's tail as well: about
    2 µs more on an H200 (docs/timing.md)."""
    torch = timer.torch
    backend = profiler_backend()  # CUPTI's start-up (a fresh process's) before the calls, not inside their records
    hold = max(2 * timer.hold_us, KERNEL_TIMES_HOLD_US) if hold_us is None else hold_us
    refresh_every = bool(timer.t.get("refresh_every_call"))
    info = {"backend": backend["name"], **({"backend_note": backend["note"]} if backend["note"] else {})}
    torch.cuda.synchronize()
    #: wall seconds of this batch's parts: recording a flush alone (its kernels' names), the profiled calls (the
    #: session's start and stop included), splitting the records into calls
    times = {"names": 0.0, "capture": 0.0, "split": 0.0}
    t0 = time.perf_counter()
    try:
        capture = _capture_cupti if backend["activity"] is not None else _capture_torch
        if flush_names is None:
            flush_records = capture(backend, timer, 0, start, hold, refresh_every)[0]
            if not flush_records and backend["activity"] is not None:
                # CUPTI started but recorded not even the flush (the warm-up ran no kernel, to disturb no other
                # process's measurement): this process uses torch's profiler from now on
                backend = _fall_back("cupti-python started CUPTI but delivered no record of a flush")
                info = {"backend": backend["name"], "backend_note": backend["note"]}
                capture = _capture_torch
                flush_records = capture(backend, timer, 0, start, hold, refresh_every)[0]
            flush_names = {n for _, _, n, _ in flush_records}
            times["names"] = time.perf_counter() - t0
            t0 = time.perf_counter()
        records, launches, windows, *rest = capture(backend, timer, calls, start, hold, refresh_every)
        times["capture"] = time.perf_counter() - t0
        t0 = time.perf_counter()
    except Exception as exc:  # the profiler failed: the event timing stands alone
        return {**info, "error": f"{type(exc).__name__}: {exc}"[:300]}
    if not records:
        return {**info, "error": "the profiler delivered no CUDA records (CUPTI busy, or a second profiler session "
                                 "in this process)"}
    def split() -> tuple[list[list[tuple[float, float, str]]], int]:  # every record unmatched without all windows
        return calls_by_launch(records, launches, windows) if len(windows) == calls else ([], len(records))

    segments, unmatched = split()
    act = backend["activity"]
    next_call = start + calls  # the first call number (its input values) this batch left unused
    if unmatched and act is not None and act.api == "launches" and len(windows) == calls:
        # a device record whose launch was not recorded (a call outside CuptiActivity.LAUNCH_API_WORDS): this
        # process records every call from now on, and the batch is profiled again on the call numbers after it
        # (fresh input values, never the ones these calls just saw)
        act.record_all(f"{unmatched} of {len(records)} device records came from calls outside the recorded launch "
                       "calls")
        t0 = time.perf_counter()
        try:
            records, launches, windows, *rest = capture(backend, timer, calls, next_call, hold, refresh_every)
            next_call += calls
        except Exception as exc:
            return {**info, "error": f"{type(exc).__name__}: {exc}"[:300]}
        times["capture"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        segments, unmatched = split()
    if act is not None:
        info.update(api=act.api, **({"api_note": act.api_note} if act.api_note else {}))
    split = "launch"
    if unmatched:  # records not linked to launches: the names of a flush alone mark the boundaries
        if not flush_names:
            return {**info, "error": f"{unmatched} of {len(records)} device records have no launch, and a flush "
                                     "alone gave no records to tell the flush by"}
        per_flush = max(1, sum(1 for r in records if r[2] in flush_names) // max(1, calls))
        segments = call_segments([(a, b, n) for a, b, n, _ in records], flush_names, per_flush)
        split = "names"
    spans = [max(e for _, e, _ in seg) - min(s for s, _, _ in seg) for seg in segments if seg]
    call_windows = rest[0] if rest else []
    timed_calls = split == "launch" and len(call_windows) == len(segments)
    idle = idle_in_calls(records, segments, call_windows) if timed_calls else None
    before = host_before_launch(records, launches, segments, call_windows, windows) if timed_calls else None
    sets: dict[tuple[str, ...], int] = {}
    for seg in segments:
        if seg:
            names = tuple(sorted(n for _, _, n in seg))
            sets[names] = sets.get(names, 0) + 1
    base: dict[str, Any] = {**info, "calls": len(spans), "empty_calls": sum(1 for seg in segments if not seg),
                            "split": split, "flush_names": sorted(flush_names), "spans_us": spans,
                            "launch_sets": [{"kernels": list(k), "calls": n} for k, n in sets.items()]}
    if idle is not None and before is not None:
        base["idle_us"] = idle
        base["before_launch_us"] = before
        base["host_inside_us"] = [a + b for a, b in zip(idle, before)]
    times["split"] = time.perf_counter() - t0
    base.update(records=len(records), times_s=times, next_call=next_call)
    if not spans:
        return {**base, "error": "no kernel of the call was recorded between the flushes"}
    if idle:
        base["idle_median_us"] = median(idle)
        base["host_inside_median_us"] = median(base["host_inside_us"])
    return {**base, "median_us": median(spans), "p10_us": quantile(spans, 0.1), "p90_us": quantile(spans, 0.9),
            "kernels_per_call": sorted({len(seg) for seg in segments if seg}),
            "kernels": sorted({n for _, _, n in segments[0]}) if segments and segments[0] else []}


#: What one profiled batch hands back: (device records (start µs, end µs, name, correlation id), sorted; correlation
#: id -> host µs of the call that launched it; (host start, host end) µs of each flush's window, in order; (host
#: start, host end) µs of each call, in order)
Capture = tuple[list[tuple[float, float, str, int]], dict[int, float], list[tuple[float, float]],
                list[tuple[float, float]]]


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
    calls_at: list[tuple[float, float]] = []
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
            c0 = act.now_us()
            timer.launch(timer.sets[k % len(timer.sets)])
            calls_at.append((c0, act.now_us()))
            torch.cuda.synchronize()  # the next window is queued once this call has ended (:func:`_flush_window`)
        torch.cuda.synchronize()  # CUPTI delivers only finished work: with calls=0, the flush alone
    finally:
        act.stop()
    return sorted(act.device), dict(act.launches), windows, calls_at


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
            with record_function(CALL_RANGE):
                timer.launch(timer.sets[k % len(timer.sets)])
            torch.cuda.synchronize()  # the next window is queued once this call has ended (:func:`_flush_window`)
        torch.cuda.synchronize()  # with calls=0, the flush alone
    records = sorted((float(e.time_range.start), float(e.time_range.end), str(e.name), int(e.id))
                     for e in prof.events()
                     if getattr(e, "device_type", None) == DeviceType.CUDA and e.time_range.end > e.time_range.start
                     and not getattr(e, "is_user_annotation", False)
                     and str(e.name) not in (FLUSH_RANGE, CALL_RANGE))
    host = [e for e in prof.events() if getattr(e, "device_type", None) == DeviceType.CPU]
    windows = sorted((float(e.time_range.start), float(e.time_range.end)) for e in host if str(e.name) == FLUSH_RANGE)
    calls_at = sorted((float(e.time_range.start), float(e.time_range.end)) for e in host if str(e.name) == CALL_RANGE)
    # the runtime and driver calls that launch device work (cudaLaunchKernel, cuLaunchKernelEx, cudaGraphLaunch,
    # cudaMemcpyAsync...), by the correlation id CUPTI gives both them and their device records
    launches = {int(e.id): float(e.time_range.start) for e in host if str(e.name).startswith("cu")}
    return records, launches, windows, calls_at


#: The per-call lists of where the host worked inside a profiled call (:func:`idle_in_calls`,
#: :func:`host_before_launch` and their sum), merged over batches while every batch has them.
HOST_INSIDE_KEYS = ("idle_us", "before_launch_us", "host_inside_us")


def cupti_samples(timer: Timer, median_ms: float, call_wall_ms: float = 0.0) -> dict[str, Any]:
    """Kernel-only samples (:func:`kernel_times`) in batches until :func:`cupti_stop` stops them: the first batch
    :func:`cupti_calls` calls behind a 1 ms spin each; later batches as many calls each (at least 20) and, when every
    call of the first launched one kernel (whose span no launch gap can lengthen), behind the event timer's hold. A
    later batch is no longer than the profiling budget left allows at the wall time a call took so far, so a call
    whose inputs are slow to refresh cannot run far past :data:`CUPTI`'s budget. Returns :func:`kernel_times`'s
    fields over all batches (``calls``, ``records`` and ``times_s`` summed), plus ``batches``, ``stop_reason`` and
    ``profile_s`` (wall seconds), or its ``error`` (when the first batch fails; a later batch's failure ends the
    sampling with ``batch_error``)."""
    t0 = time.perf_counter()
    first = kernel_times(timer, cupti_calls(median_ms, call_wall_ms))
    if "error" in first:
        return {**first, "profile_s": time.perf_counter() - t0}
    out = dict(first)
    out["batches"] = 1
    first_calls = first["calls"] + first["empty_calls"]
    single = first["kernels_per_call"] == [1] and not first["empty_calls"]
    reason = None
    while True:
        reason = cupti_stop(out["spans_us"], time.perf_counter() - t0, out["batches"])
        if reason is not None:
            break
        # as many calls as the first batch (at least 20): three batches of 50 for a call under 6 ms, the spread of
        # whose medians was measured (:data:`CUPTI`); doubling batches profiled 200 calls where 150 did
        n = min(CUPTI["batch_max"], CUPTI["max_samples"] - len(out["spans_us"]), max(20, first_calls))
        elapsed = time.perf_counter() - t0
        per_call_s = elapsed / max(1, out["calls"] + out["empty_calls"])
        n = max(5, min(n, int((CUPTI["budget_s"] - elapsed) / max(per_call_s, 1e-6))))
        nxt = kernel_times(timer, n, hold_us=timer.hold_us if single else None,
                           flush_names=set(out["flush_names"]), start=out["next_call"])
        if "error" in nxt and not nxt.get("spans_us"):
            out["batch_error"] = nxt["error"]
            reason = "batch_error"
            break
        out["batches"] += 1
        out["next_call"] = nxt["next_call"]
        out["times_s"] = {k: out["times_s"].get(k, 0.0) + v for k, v in (nxt.get("times_s") or {}).items()}
        out["records"] = out.get("records", 0) + nxt.get("records", 0)
        out["spans_us"] = out["spans_us"] + nxt["spans_us"]
        out["calls"] += nxt["calls"]
        out["empty_calls"] += nxt["empty_calls"]
        # the GPU's idle time inside the calls, while every batch has it (one split by names has none)
        for key in HOST_INSIDE_KEYS:
            out[key] = out[key] + nxt[key] if out.get(key) is not None and key in nxt else None
        out["kernels_per_call"] = sorted(set(out["kernels_per_call"]) | set(nxt.get("kernels_per_call") or []))
        merged = {tuple(d["kernels"]): d["calls"] for d in out["launch_sets"]}
        for d in nxt["launch_sets"]:
            merged[tuple(d["kernels"])] = merged.get(tuple(d["kernels"]), 0) + d["calls"]
        out["launch_sets"] = [{"kernels": list(k), "calls": c} for k, c in merged.items()]
        if nxt["split"] != "launch":
            out["split"] = nxt["split"]
    spans = out["spans_us"]
    if out.get("idle_us") and out.get("host_inside_us"):
        out["idle_median_us"] = median(out["idle_us"])
        out["host_inside_median_us"] = median(out["host_inside_us"])
    else:
        for key in (*HOST_INSIDE_KEYS, "idle_median_us", "host_inside_median_us"):
            out.pop(key, None)
    out.update(median_us=median(spans), p10_us=quantile(spans, 0.1), p90_us=quantile(spans, 0.9), stop_reason=reason,
               profile_s=time.perf_counter() - t0)
    return out

"""What a timing process reads of the GPU besides the timed work: NVML's clocks and throttle reasons, the other
processes on the GPU, the persisting-L2 window (reset before each sample), and the stream gate a graph timer holds
its queued pairs behind (``cuStreamWaitValue32`` through the driver)."""

from __future__ import annotations

import ctypes
import os
from typing import Any


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

    def process_bytes(self) -> tuple[int | None, str | None]:
        """The device memory (bytes) NVML reports this process holding on this GPU, and why there is none: no
        NVML, or this pid absent from NVML's list (inside a container's pid namespace NVML lists the host's pids),
        or NVML not reporting per-process memory (usedGpuMemory unavailable)."""
        if self.nvml is None:
            return None, "no NVML (nvidia-ml-py) in the timing process"
        try:
            procs = self.nvml.nvmlDeviceGetComputeRunningProcesses(self.handle)
        except Exception as exc:
            return None, f"NVML's process list failed ({type(exc).__name__})"
        return process_used(procs, {os.getpid()})


def process_used(procs: Any, pids: set[int]) -> tuple[int | None, str | None]:
    """The summed ``usedGpuMemory`` (bytes) of the entries of an NVML process list (``pid``, ``usedGpuMemory``)
    whose pid is in ``pids``, and why there is none: no entry matched (a container's pid namespace: NVML lists the
    host's pids), or NVML gives no figure for them (None, or NVML_VALUE_NOT_AVAILABLE, 2**64 - 1)."""
    mine = [getattr(p, "usedGpuMemory", None) for p in procs if int(p.pid) in pids]
    if not mine:
        return None, ("the process's pid is not in NVML's process list (a container's pid namespace: NVML lists "
                      "the host's pids)")
    if any(m is None or int(m) >= 2**63 for m in mine):
        return None, "NVML reports no per-process memory on this system"
    return sum(int(m) for m in mine), None


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

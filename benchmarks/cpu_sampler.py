"""Where a host's CPU time goes while a command runs: the machine's busy share (``/proc/stat``) and each process's
CPU seconds (``/proc/<pid>/stat`` utime + stime), sampled every ``period_s`` and summed by what the process is
(its command line): the pytest processes, the harness processes by role, the compile toolchain, ncu.

Linux only (it reads ``/proc``); elsewhere :meth:`CpuSampler.table` says so. A process that lives less than one
period is missed; its CPU shows in the machine's total, as ``unattributed``.

    with CpuSampler() as cpu:
        subprocess.run(...)
    print("\\n".join(cpu.table()))
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def category(cmdline: list[str], comm: str = "") -> str | None:
    """What a process is, from its argv (and its ``comm``: a harness process forked by kopt's fork server has the
    server's argv and names itself ``kopt-timing`` or ``kopt-harness``); None for processes of no interest."""
    if not cmdline:
        return None
    if comm in ("kopt-timing", "kopt-harness"):
        return "harness, forked " + ("(timing)" if comm == "kopt-timing" else "(no profiler)")
    exe = Path(cmdline[0]).name
    text = " ".join(cmdline)
    if exe in ("nvcc", "cicc", "ptxas", "fatbinary", "nvlink", "cudafe++", "gcc", "g++", "cc1plus", "cc1", "as",
               "ld", "collect2", "cuobjdump", "nvdisasm"):
        return "compile toolchain (nvcc, cicc, ptxas, gcc)"
    if "ncu" in exe or "compute-sanitizer" in exe:
        return "ncu"
    if "pytest_kopt.child" in text:
        if "--fork-server" in text:
            return "harness fork server"
        if "--serve" in text:
            return "harness, warm (no profiler)" if "--no-profiler" in text else "harness, warm (timing)"
        return "harness, fresh process"
    if "pytest" in text or "execnet" in text or "xdist" in text:
        return "pytest (controller, workers)"
    if exe.startswith("python"):
        return "other python"
    return None


class CpuSampler:
    """A background thread that samples ``/proc`` every ``period_s`` seconds between ``__enter__`` and
    ``__exit__``."""

    def __init__(self, period_s: float = 0.5) -> None:
        self.period_s = period_s
        self.ok = Path("/proc/stat").is_file()
        self.cpu_s: dict[int, tuple[str, float]] = {}  # pid -> (category, CPU s at the last sample)
        self.busy: list[tuple[float, float]] = []  # (t, the machine's busy share since the last sample)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._first: tuple[float, float] | None = None
        self._last: tuple[float, float] | None = None

    def __enter__(self) -> "CpuSampler":
        if self.ok:
            self.t0 = time.time()
            self._first = self._last = _machine()
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.ok:
            self._stop.set()
            self._thread.join()
            self._sample()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self._sample()

    def _sample(self) -> None:
        now = _machine()
        if self._last is not None and now[1] > self._last[1]:
            self.busy.append((time.time() - self.t0, (now[0] - self._last[0]) / (now[1] - self._last[1])))
        self._last = now
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            pid = int(d)
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
                if pid not in self.cpu_s or self.cpu_s[pid][0] == "harness fork server":  # forked, not yet named
                    cat = category(Path(f"/proc/{d}/cmdline").read_bytes().decode(errors="replace")
                                   .split("\0")[:-1], Path(f"/proc/{d}/comm").read_text().strip())
                    if cat is None:
                        self.cpu_s[pid] = ("", 0.0)
                        continue
                else:
                    cat = self.cpu_s[pid][0]
                fields = stat.rsplit(")", 1)[1].split()
                self.cpu_s[pid] = (cat, (int(fields[11]) + int(fields[12])) / TICK)
            except (OSError, IndexError, ValueError):
                continue

    def table(self) -> list[str]:
        """The CPU seconds per category (and processes seen), the machine's total busy CPU seconds over the run,
        its busy share and the busy share per 10 s."""
        if not self.ok or self._first is None or self._last is None:
            return ["  (no /proc: CPU not sampled)"]
        ncpu = os.cpu_count() or 1
        total_ticks = self._last[1] - self._first[1]  # all CPUs' ticks
        busy_s = (self._last[0] - self._first[0]) / TICK
        share = (self._last[0] - self._first[0]) / total_ticks if total_ticks else 0.0
        per: dict[str, list[float]] = {}
        for cat, s in self.cpu_s.values():
            if cat:
                per.setdefault(cat, []).append(s)
        out = [f"  CPU: {ncpu} CPUs, busy {share:.0%} over the run, {busy_s:.0f} CPU-s in all"]
        for cat, v in sorted(per.items(), key=lambda kv: -sum(kv[1])):
            out.append(f"  {cat:<44} {sum(v):8.1f} CPU-s  {len(v):4d} processes  "
                       f"{sum(v) / len(v):6.2f} s each")
        out.append(f"  {'unattributed (short-lived, other)':<44} {busy_s - sum(map(sum, per.values())):8.1f} CPU-s")
        bins: dict[int, list[float]] = {}
        for t, b in self.busy:
            bins.setdefault(int(t // 10), []).append(b)
        out.append("  busy per 10 s: " + " ".join(f"{sum(v) / len(v):.0%}" for _, v in sorted(bins.items())))
        return out


def host_line() -> str:
    """One line naming the host a benchmark ran on: its CPU model (``/proc/cpuinfo``'s first ``model name``), the
    CPUs this process may use, and the load average (1, 5, 15 min) at the start. Hosts of one GPU model differed
    by up to 60% in a close's host-side parts (docs/loop.md, issue #40's figures on a slower H100 host)."""
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ncpu = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    load = "/".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    return f"host: {model}, {ncpu} CPUs, load average {load}"


def _machine() -> tuple[float, float]:
    """(busy ticks, all ticks) of all CPUs since boot, from /proc/stat's first line (busy: all but idle and
    iowait)."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    total = sum(f[:8])  # user nice system idle iowait irq softirq steal (guest is inside user)
    return total - f[3] - f[4], total

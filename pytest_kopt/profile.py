"""The ``ncu`` gate: profile only the target launch (NVTX range ``kopt_target``), keep the ``.ncu-rep``, parse it.

ncu runs with ``--clock-control none`` (the lent H200s do not allow clock locking, and timings then match the
timing gate's conditions). Metrics are read back with ``ncu --import --csv --page raw`` and parsed by
:mod:`pytest_kopt.ncu_csv`.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from .errors import Blocked, ProfilerError
from .ncu_csv import NcuLaunch, NcuParseError, metric_value, parse_ncu_csv

NVTX_RANGE = "kopt_target"

#: The basic metric bundle (names from Nsight Compute's metric reference; all exist on sm_70+).
METRICS: dict[str, str] = {
    "duration_ns": "gpu__time_duration.sum",
    "sm_throughput_pct": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "memory_throughput_pct": "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "dram_throughput_pct": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "dram_bytes_read": "dram__bytes_read.sum",
    "dram_bytes_write": "dram__bytes_write.sum",
    "achieved_occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "registers_per_thread": "launch__registers_per_thread",
    "fma_pipe_pct": "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active",
    "tensor_pipe_pct": "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "l2_hit_rate_pct": "lts__t_sector_hit_rate.pct",
}

COUNTER_PERMISSION = "ERR_NVGPUCTRPERM"


#: SKILL.md 3a: the full set below 10 ms of kernel time, the light set at 10 ms and above.
FULL_BELOW_MS = 10.0


def choose_set(duration_ms: float | None) -> tuple[str, str]:
    """(set name, reason): ``full`` when the kernel is under 10 ms or its duration is unknown, else ``light``."""
    if duration_ms is None:
        return "full", "duration unknown (no timing in this session)"
    if duration_ms < FULL_BELOW_MS:
        return "full", f"{duration_ms:.4g} ms < {FULL_BELOW_MS:g} ms"
    return "light", f"{duration_ms:.4g} ms >= {FULL_BELOW_MS:g} ms"


def ncu_prefix(ncu: str, report: Path, set_args: list[str] | None = None) -> list[str]:
    """The ncu command that wraps the harness: target range only, no clock control, all child processes, the
    registry's section set (``set_args``) plus the basic METRICS."""
    return [ncu, "--clock-control", "none", "--nvtx", "--nvtx-include", f"{NVTX_RANGE}/",
            "--target-processes", "all", *(set_args or []), "--metrics", ",".join(METRICS.values()),
            "--force-overwrite", "-o", str(report)]


def check_ncu_output(text: str) -> None:
    """Raise Blocked when ncu could not read counters (ERR_NVGPUCTRPERM), ProfilerError on another ==ERROR==."""
    if COUNTER_PERMISSION in text:
        raise Blocked("ncu", "ncu cannot read GPU performance counters (ERR_NVGPUCTRPERM): run as root or set "
                      "the driver option NVreg_RestrictProfilingToAdminUsers=0")
    errors = [ln for ln in text.splitlines() if ln.startswith("==ERROR==")]
    if errors:
        raise ProfilerError("ncu reported an error: " + " | ".join(errors[:3]), gate="ncu",
                            fix="see the ncu output; check that the kernel runs outside ncu first")


def import_report(ncu: str, report: Path, timeout_s: float = 120.0) -> list[NcuLaunch]:
    """Read a ``.ncu-rep`` back as CSV (raw page) and parse it. Raises ProfilerError on failure or 0 metrics."""
    try:
        proc = subprocess.run([ncu, "--import", str(report), "--csv", "--page", "raw"], capture_output=True,
                              text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise ProfilerError(f"ncu --import ran past {timeout_s:.0f} s", gate="ncu") from None
    if proc.returncode != 0:
        raise ProfilerError(f"ncu --import failed (exit {proc.returncode})", gate="ncu", details=proc.stderr[-2000:])
    try:
        return parse_ncu_csv(proc.stdout)
    except NcuParseError as exc:
        raise ProfilerError(f"no metrics in {report.name}: {exc}", gate="ncu", details=proc.stdout[-1500:],
                            fix="no kernel ran inside the kopt_target range, or the report is empty") from None


def summarize_launches(launches: list[NcuLaunch]) -> dict[str, object]:
    """``ncu_top.json`` content: per launch (in order) its kernel name and METRICS in base units (ns, byte, %),
    and the total duration in ms over all launches of the profiled call."""
    rows = []
    for launch in launches:
        values = {key: metric_value(launch, name) for key, name in METRICS.items()}
        rows.append({"id": launch.id, "kernel": launch.kernel_name, "grid": launch.grid_size,
                     "block": launch.block_size, "metrics": values})
    total_ns = sum((r["metrics"]["duration_ns"] or 0.0) for r in rows)  # type: ignore[index]
    main = max(rows, key=lambda r: r["metrics"]["duration_ns"] or 0.0)  # type: ignore[index]
    return {"metric_set": "kopt-basic", "clock_control": "none", "nvtx_range": NVTX_RANGE,
            "launches": rows, "target_kernel": main["kernel"], "duration_ms": total_ns / 1e6,
            "metric_names": METRICS}

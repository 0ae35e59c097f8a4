"""The ``ncu`` gate: profile only the target launch (NVTX range ``kopt_target``), keep the ``.ncu-rep``, parse it.

ncu runs with ``--clock-control none`` (the lent H200s do not allow clock locking, and timings then match the
timing gate's conditions). Metrics are read back with ``ncu --import --csv --page raw`` and parsed by
:mod:`pytest_kopt.ncu_csv`.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from typing import Any

from .. import registry
from ..stats import fmt_ms
from ..artifacts import Bench, CorrectnessRecord, NcuTop
from ..child.profile import NVTX_RANGE
from ..errors import Blocked, KernelRuntimeError, KoptError, ProfilerError, TimingError
from ..proc.runner import FreshProcess
from .build import built
from .context import Context, Outcome
from .correctness import cases, fingerprint, require_correct
from .ncu_csv import NcuLaunch, NcuParseError, metric_value, parse_ncu_csv
from .request import harness_request
from .roofline import metric_table, top_metrics
from .suspects import outside_measurement
from .timing import profiled_shape

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
        fix = "run as root or set the driver option NVreg_RestrictProfilingToAdminUsers=0"
        raise Blocked("ncu", f"ncu cannot read GPU performance counters (ERR_NVGPUCTRPERM): {fix}", fix)
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


def profile_phases(t0: float, t_lock: float, t_run: float, t_read: float, at: dict[str, float]) -> dict[str, float]:
    """Where one profile's wall seconds went, from the gate's stamps (``time.time()``: start, lock taken, ncu
    ended, report read) and the harness's (``at`` of :func:`pytest_kopt.child.profile.mode_profile`): ``lock``
    waiting for the GPU, ``start`` (ncu's and Python's start, imports) up to the request, ``inputs`` (CUDA context,
    inputs), ``warmup``, ``range`` (the profiled call with ncu's replays), ``after`` (the call outside the range,
    the process's end, ncu writing the report), ``read`` (reading the report back). For a profile started ahead
    (:func:`profile_ahead`) ``lock`` ends at its go, and ``start`` is what it still needed after it."""
    out = {"lock": t_lock - t0}
    if {"enter", "inputs", "warmup", "range", "exit"} <= at.keys():
        # a profile started ahead entered long ago: from its go on (``start`` is then how long it still needed
        # to get ready after the gate let it go, 0 when it was waiting)
        begun = at.get("go", at["enter"])
        out.update(start=max(0.0, begun - t_lock), inputs=at["inputs"] - begun, warmup=at["warmup"] - at["inputs"],
                   range=at["range"] - at["warmup"], after=t_run - at["range"])
    else:
        out["run"] = t_run - t_lock
    out["read"] = t_read - t_run
    return {k: round(v, 3) for k, v in out.items()}


def launch_rows(launches: list[NcuLaunch]) -> list[dict[str, Any]]:
    """``ncu_top.json``'s ``launches``: per launch (in order) its id, kernel name, grid, block and :data:`METRICS`
    in base units (ns, byte, %)."""
    return [{"id": launch.id, "kernel": launch.kernel_name, "grid": launch.grid_size, "block": launch.block_size,
             "metrics": {key: metric_value(launch, name) for key, name in METRICS.items()}} for launch in launches]


def _profile_request(ctx: Context, res: Any, device: str, dims: dict[str, Any] | None) -> dict[str, Any]:
    return harness_request(ctx, "profile", device, ctx.settings.seeds[0], res, dims=dims)


def estimated_ms(ctx: Context) -> float | None:
    """The kernel's time as this session's passed correctness seeds saw it (the smallest ``call_ms``: one warm
    call's wall time from launch to synchronized, an upper bound of its GPU time), ms; None when none recorded it.
    Only the seed cases at the session's dims count, and only records of this build on the GPU (their
    fingerprint): a boundary shape's, another session's seeds' and an earlier build's do not."""
    res = None
    seen = []
    for label, case in cases(ctx):
        if case.get("dims") is not None:
            continue
        rec = CorrectnessRecord.load(CorrectnessRecord.path(ctx.outdir, label))
        if rec is None or not rec.passed or rec.call_ms is None:
            continue
        try:
            res = res or built(ctx)
        except Blocked:
            return None
        if rec.fingerprint == fingerprint(ctx, res, case, "cuda"):
            seen.append(rec.call_ms)
    return min(seen) if seen else None


#: Where the seeds' estimate is this close to :data:`FULL_BELOW_MS` (a factor, either side), the timing gate keeps
#: both sets' profiles running: the estimate is a warm call's wall time, the set is picked by the timed median of
#: cold calls.
NEAR_FULL_BELOW = 1.5


def sets_ahead(ctx: Context, early: bool) -> tuple[tuple[str, ...], bool, dict[str, Any] | None] | None:
    """Which profiles of ``ctx``'s kernel should run ahead of its ncu item, so ncu's start, Python's, torch's
    import and the CUDA context under ncu (5-6.5 s on the H200, ``phase_s`` of ``ncu_top.json``) overlap the
    correctness and timing items instead of following them: ``(sets, end_others, dims)``, or None for none (no ncu
    item for this kernel in this process, no ncu, no GPU, or, not ``early``, no estimate yet).

    The set is the run's pinned one, else the one :func:`choose_set` gives for :func:`estimated_ms`. ``early`` (once
    the kernel is built, and at the correctness gate): with no estimate yet (no seed has a call time) or several
    benchmark shapes (whose first shape no seed timed), both sets, and the ncu item takes the one its timed median
    picks. Later (the timing gate) the estimate's set, and ``end_others`` True (the other set's process ends), unless
    the estimate is within :data:`NEAR_FULL_BELOW` of the sets' threshold. ``dims``: the shape profiled (None: the
    session's). Called by the session's scheduler (:class:`pytest_kopt.scheduler.Scheduler`), which owns the
    processes."""
    if "ncu" not in ctx.collected or not ctx.gpu or not ctx.tool("ncu"):
        return None
    dims, _ = profiled_shape(ctx)
    pinned = ctx.settings.ncu_set
    est = estimated_ms(ctx) if dims is None and not pinned else None
    if pinned:
        sets: tuple[str, ...] = (pinned,)
    elif est is not None:
        sets = (choose_set(est)[0],)
    elif early:
        sets = ("full", "light")
    else:
        return None
    near = est is not None and FULL_BELOW_MS / NEAR_FULL_BELOW <= est < FULL_BELOW_MS * NEAR_FULL_BELOW
    return sets, not early and not near, dims


def launch_profile(ctx: Context, set_name: str, dims: dict[str, Any] | None) -> "ProfileAhead | None":
    """Start ``ctx``'s kernel's profile with ``set_name`` at ``dims`` (None: the session's) under ncu, its kernels
    held until the ncu gate holds the GPU lock and writes its go file (:func:`pytest_kopt.child.profile.wait_for_go`;
    the request carries only the go token's SHA-256, so the kernel's own processes, which can read the work folder,
    cannot release it). None when it cannot start (no build, no ncu, an unknown set): the ncu item reports it."""
    if not ctx.tool("ncu"):
        return None
    try:
        res = built(ctx)
        req = _profile_request(ctx, res, "cuda", dims)
    except (KoptError, Blocked):
        return None
    metrics = registry.load(registry.METRICS)
    if set_name not in metrics["metric_sets"]:
        return None
    ctx.work.mkdir(parents=True, exist_ok=True)
    go = ctx.work / f"ncu-go-{os.getpid()}-{time.monotonic_ns()}"
    go.unlink(missing_ok=True)
    report = ctx.outdir / "kernel.ncu-rep"
    ctx.outdir.mkdir(parents=True, exist_ok=True)
    report.unlink(missing_ok=True)
    token = secrets.token_hex(16)
    proc = FreshProcess({**req, "go": str(go), "go_sha": hashlib.sha256(token.encode()).hexdigest(),
                         "owner": os.getpid()}, gate="ncu", workdir=ctx.work,
                        prefix=ncu_prefix(ctx.tool("ncu") or "ncu", report.with_suffix(""),
                                          metrics["metric_sets"][set_name]))
    return ProfileAhead(proc, go, time.time(), token)


@dataclass
class ProfileAhead:
    """A profile process started ahead of its ncu item: the process, its go file, when it started (``time.time()``),
    its go token."""

    proc: FreshProcess
    go: Path
    started: float
    #: what the gate writes into the go file (the process knows only its SHA-256)
    token: str = ""

    def release(self) -> None:
        """Let it run: write its token into its go file (the caller holds the GPU lock)."""
        self.go.write_text(self.token)

    def kill(self) -> str:
        """End the process (no gate took it) and remove its go file; returns its log's tail."""
        out = self.proc.kill()
        self.go.unlink(missing_ok=True)
        return out


def _against_timing(ctx: Context, dims: dict[str, Any] | None, bench: Bench | None, ncu_ms: float | None) -> None:
    """ncu's duration of the call against the timing this session measured of the same shape
    (:func:`pytest_kopt.gates.suspects.outside_measurement`): where they contradict, the timing's ``bench.json``
    is revoked (the PR gate and the loop then find no valid timing) and the item fails as TAMPERED."""
    if bench is None or not bench.timing_valid:
        return
    found = outside_measurement(ncu_ms, bench.median_ms)
    if not found:
        return
    text, fix = found[0]
    bench.revoked(text).write(ctx.at(dims).outdir if dims is not None else ctx.outdir)
    raise TimingError(text, gate="ncu", path=ctx.display, status="TAMPERED", fix=fix)


def gate_ncu(ctx: Context, case: Any = None) -> Outcome:
    """Profile one call of the kernel (NVTX range only) with ncu, adaptive set (SKILL.md 3a: full below 10 ms of
    this session's timed median, light above; a full replay that times out or fails is retried once with the light
    set), or the loop run's own set when ``settings.ncu_set`` pins it (no fallback then); keep ``kernel.ncu-rep``,
    write ``ncu_top.json`` (set, reason, attempts, per-axis top ``--kopt-ncu-num``
    metrics, every registry metric). Skips when counters cannot be read (ERR_NVGPUCTRPERM); ProfilerError (exit 3)
    otherwise."""
    device = ctx.device_for("ncu")
    ncu = ctx.tool("ncu")
    if not ncu:
        fix = "install Nsight Compute and put ncu on PATH (or in $CUDA_HOME/bin)"
        raise Blocked("hardware", f"ncu (Nsight Compute) not found: {fix}", fix)
    res = built(ctx)
    require_correct(ctx, res, device)
    ctx.outdir.mkdir(parents=True, exist_ok=True)
    report = ctx.outdir / "kernel.ncu-rep"
    dims, bench = profiled_shape(ctx)
    pinned = ctx.settings.ncu_set
    if pinned:
        chosen, reason = pinned, ("the run's bundle (state.json ncu_set: one set for the whole run, so its "
                                  "profiles compare)")
    else:
        chosen, reason = choose_set(bench.median_ms if bench else None)
    metrics = registry.load(registry.METRICS)
    attempts: list[dict[str, Any]] = []
    launches = None
    for set_name in ([chosen, "light"] if chosen == "full" and not pinned else [chosen]):
        ahead, ahead_note = ctx.ahead.take_profile(ctx, set_name) if not attempts else (None, "none started")
        try:
            t0 = time.time()
            if ahead is not None:
                try:
                    with ctx.gpu_lock():
                        t_lock = time.time()
                        ahead.release()
                        result = ahead.proc.finish(timeout_s=ctx.settings.ncu_timeout_s, path=ctx.display)
                finally:
                    ahead.go.unlink(missing_ok=True)
            else:
                req = _profile_request(ctx, res, device, dims)
                report.unlink(missing_ok=True)
                with ctx.gpu_lock():
                    t_lock = time.time()
                    result = ctx.pool.run(req, gate="ncu", timeout_s=ctx.settings.ncu_timeout_s, path=ctx.display,
                                          workdir=ctx.work, prefix=ncu_prefix(ncu, report.with_suffix(""),
                                                                              metrics["metric_sets"][set_name]))
            t_run = time.time()
            check_ncu_output(result.get("stdout", ""))
            if not report.is_file():
                raise ProfilerError("ncu wrote no report (no kernel ran inside the kopt_target range?)", gate="ncu",
                                    path=ctx.display, details=result.get("stdout", "")[-2000:])
            launches = import_report(ncu, report)
            attempts.append({"set": set_name, "ok": True, "started_ahead_s": None if ahead is None else
                             round(t_lock - ahead.started, 3), "ahead": ahead_note,
                             "phase_s": profile_phases(t0, t_lock, t_run, time.time(), result.get("at") or {})})
            chosen = set_name
            break
        except (KernelRuntimeError, ProfilerError) as exc:
            attempts.append({"set": set_name, "ok": False, "status": exc.status, "error": exc.message,
                             "started_ahead_s": None if ahead is None else round(time.time() - ahead.started, 3),
                             "ahead": ahead_note})
            if set_name == "light" or chosen != "full":
                raise ProfilerError(f"ncu failed with the {set_name} set: {exc.message}", gate="ncu",
                                    path=ctx.display, details=exc.details,
                                    fix="run the kernel outside ncu first; raise --kopt-ncu-timeout") from None
    assert launches is not None
    main_launch = max(launches, key=lambda ln: metric_value(ln, "gpu__time_duration.sum") or 0.0)
    table = metric_table(main_launch, metrics)
    rows = launch_rows(launches)
    top = NcuTop.build(rows, metric_names=METRICS, nvtx_range=NVTX_RANGE, report=str(report), set=chosen,
                       set_reason=reason, attempts=attempts, ncu_num=ctx.settings.ncu_num,
                       top=top_metrics(table, metrics, ctx.settings.ncu_num), metrics=table,
                       kernel=main_launch.kernel_name)
    path = top.write(ctx.outdir)
    _against_timing(ctx, dims, bench, top.duration_ms)
    main = max(rows, key=lambda r: r["metrics"]["duration_ns"] or 0.0)
    m = main["metrics"]
    figures = {"ncu_duration_ms": top.duration_ms, "kernels": len(rows), "target_kernel": main["kernel"],
               "ncu_set": chosen}
    for key in ("sm_throughput_pct", "dram_throughput_pct", "achieved_occupancy_pct", "registers_per_thread"):
        if m.get(key) is not None:
            figures[key] = m[key]

    def pct(v: Any) -> str:
        return "n/a" if v is None else f"{v:.1f}%"

    return Outcome(figures, f"{main['kernel'][:60]}: {fmt_ms(top.duration_ms)} ({chosen} set), SM "
                            f"{pct(m.get('sm_throughput_pct'))}, DRAM {pct(m.get('dram_throughput_pct'))}, occupancy "
                            f"{pct(m.get('achieved_occupancy_pct'))}", (str(report), str(path)))

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
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from typing import Any

from .. import registry
from ..stats import fmt_ms
from ..artifacts import read_dict, write_json
from ..child.profile import NVTX_RANGE
from ..errors import Blocked, KernelRuntimeError, KoptError, ProfilerError
from ..proc.runner import FreshProcess
from .build import built
from .context import Context, Outcome
from .correctness import cases, fingerprint, require_correct
from .ncu_csv import NcuLaunch, NcuParseError, metric_value, parse_ncu_csv
from .request import harness_request
from .roofline import metric_table, top_metrics
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
        rec = read_dict(ctx.outdir / "correctness" / f"{label}.json") or {}
        if not rec.get("passed") or not isinstance(rec.get("call_ms"), (int, float)):
            continue
        try:
            res = res or built(ctx)
        except Blocked:
            return None
        if rec.get("fingerprint") == fingerprint(ctx, res, case, "cuda"):
            seen.append(float(rec["call_ms"]))
    return min(seen) if seen else None


#: Where the seeds' estimate is this close to :data:`FULL_BELOW_MS` (a factor, either side), the timing gate keeps
#: both sets' profiles running: the estimate is a warm call's wall time, the set is picked by the timed median of
#: cold calls.
NEAR_FULL_BELOW = 1.5


#: Held while a kernel's profiles started ahead are started, taken or ended: the build threads start them
#: (:func:`pytest_kopt.gates.build.build_quietly`) while the items run in the main thread.
_AHEAD_LOCK = threading.RLock()


def profile_ahead(ctx: Context, *, early: bool = False) -> tuple[str, ...]:
    """Start the ncu item's profile before its turn, so ncu's start, Python's, torch's import and the CUDA context
    under ncu (5-6.5 s on the H200, ``phase_s`` of ``ncu_top.json``) overlap the correctness and timing items
    instead of following them. The process launches no kernel until :func:`gate_ncu` holds the GPU lock and creates
    its go file (:func:`pytest_kopt.child.profile.wait_for_go`).

    The ncu set is the run's pinned one, else the one :func:`choose_set` gives for :func:`estimated_ms`. ``early``
    (the build's thread once the kernel is built, :class:`pytest_kopt.gates.build.BuildAhead`, and the correctness
    gate): with no estimate yet (no seed has a call time) or several benchmark shapes (whose first shape no seed
    timed), both sets start, and the ncu item takes the one its timed median picks and ends the other. Later (the
    timing gate, ``early`` False) the estimate's set is started if it is not running yet and the other set's
    process is ended, unless the estimate is within :data:`NEAR_FULL_BELOW` of the sets' threshold. Returns the
    sets started or already running; empty when nothing was: no ncu item for this kernel in this process, no ncu,
    no GPU, the ncu item already ran, or (not ``early``) no estimate."""
    with _AHEAD_LOCK:
        return _profile_ahead(ctx, early)


def _profile_ahead(ctx: Context, early: bool) -> tuple[str, ...]:
    if "ncu" not in ctx.collected or not ctx.gpu or not ctx.tool("ncu") or str(ctx.kernel) in ctx.pool.ahead_closed:
        return ()
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
        return ()
    near = est is not None and FULL_BELOW_MS / NEAR_FULL_BELOW <= est < FULL_BELOW_MS * NEAR_FULL_BELOW
    if not early and not near:
        end_ahead(ctx, ctx.kernel, keep=sets)
    return tuple(s for s in sets if start_profile(ctx, s, dims))


def start_profile(ctx: Context, set_name: str, dims: dict[str, Any] | None) -> bool:
    """Start ``ctx``'s kernel's profile with ``set_name`` at ``dims`` (None: the session's) ahead of its gate
    (:func:`profile_ahead`; the loop's close for the likely champion). False when it cannot start (no build, no
    ncu); True when it runs (or already did)."""
    with _AHEAD_LOCK:
        return _start_profile(ctx, set_name, dims)


def _start_profile(ctx: Context, set_name: str, dims: dict[str, Any] | None) -> bool:
    key = (str(ctx.kernel), set_name)
    if key in ctx.pool.ahead:
        return True
    if not ctx.tool("ncu"):
        return False
    try:
        res = built(ctx)
        req = _profile_request(ctx, res, "cuda", dims)
    except (KoptError, Blocked):
        return False  # the ncu item reports it
    ctx.work.mkdir(parents=True, exist_ok=True)
    go = ctx.work / f"ncu-go-{os.getpid()}-{time.monotonic_ns()}"
    go.unlink(missing_ok=True)
    report = ctx.outdir / "kernel.ncu-rep"
    ctx.outdir.mkdir(parents=True, exist_ok=True)
    report.unlink(missing_ok=True)
    metrics = registry.load(registry.METRICS)
    if set_name not in metrics["metric_sets"]:
        return False  # the ncu gate reports an unknown set
    token = secrets.token_hex(16)
    proc = FreshProcess({**req, "go": str(go), "go_sha": hashlib.sha256(token.encode()).hexdigest(),
                         "owner": os.getpid()}, gate="ncu", workdir=ctx.work,
                        prefix=ncu_prefix(ctx.tool("ncu") or "ncu", report.with_suffix(""),
                                          metrics["metric_sets"][set_name]))
    ctx.pool.ahead[key] = Ahead(proc, go, time.time(), token)
    return True


def abandon_ahead(ctx: Context) -> None:
    """``ctx``'s kernel will not be profiled in this session (a correctness case failed): end the profiles started
    ahead for it and start none again."""
    with _AHEAD_LOCK:
        ctx.pool.ahead_closed.add(str(ctx.kernel))
        end_ahead(ctx, ctx.kernel)


def end_ahead(ctx: Context, kernel: Path, keep: tuple[str, ...] = ()) -> None:
    """End the profiles started ahead for ``kernel`` (a path) in ``ctx``'s pool, but those of the ncu sets in
    ``keep``."""
    with _AHEAD_LOCK:
        for key in [k for k in ctx.pool.ahead if k[0] == str(kernel) and k[1] not in keep]:
            ctx.pool.ahead.pop(key).kill()


@dataclass
class Ahead:
    """A profile process :func:`start_profile` started: the process, its go file, when it started, its go token."""

    proc: FreshProcess
    go: Path
    started: float
    #: what the gate writes into the go file (the process knows only its SHA-256)
    token: str = ""

    def release(self) -> None:
        """Let it run: write its token into its go file (the caller holds the GPU lock)."""
        self.go.write_text(self.token)

    def kill(self) -> str:
        """End the process (the pool's shutdown: no gate took it) and remove its go file; returns its log's tail."""
        out = self.proc.kill()
        self.go.unlink(missing_ok=True)
        return out


def _take_ahead(ctx: Context, set_name: str) -> tuple[Ahead | None, str]:
    """The profile started ahead for this kernel with ``set_name``, if it is still waiting for its turn, and what
    became of it (``used``; ``none started``; ``started with the <set> set``; ``ended before its turn``, with its
    output's tail); any other of this kernel's is ended."""
    with _AHEAD_LOCK:
        return _take(ctx, set_name)


def _take(ctx: Context, set_name: str) -> tuple[Ahead | None, str]:
    ctx.pool.ahead_closed.add(str(ctx.kernel))
    mine = [k for k in ctx.pool.ahead if k[0] == str(ctx.kernel)]
    held, note = None, "none started"
    for key in mine:
        ahead = ctx.pool.ahead.pop(key)
        if key[1] == set_name and ahead.proc.alive():
            held, note = ahead, "used"
        elif key[1] == set_name:
            code = ahead.proc.proc.returncode
            note = f"ended before its turn (exit {code}): {ahead.kill()[-300:]}"
        else:
            ahead.kill()
            note = f"started with the {key[1]} set" if held is None else note
    return held, note


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
        chosen, reason = pinned, "the run's bundle (state.json ncu_set; SKILL.md 3g: kept identical across the run)"
    else:
        chosen, reason = choose_set(bench.median_ms if bench else None)
    metrics = registry.load(registry.METRICS)
    attempts: list[dict[str, Any]] = []
    launches = None
    for set_name in ([chosen, "light"] if chosen == "full" and not pinned else [chosen]):
        ahead, ahead_note = _take_ahead(ctx, set_name) if not attempts else (None, "none started")
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
    top = summarize_launches(launches)
    main_launch = max(launches, key=lambda ln: metric_value(ln, "gpu__time_duration.sum") or 0.0)
    table = metric_table(main_launch, metrics)
    top.update({"report": str(report), "set": chosen, "set_reason": reason, "attempts": attempts,
                "ncu_num": ctx.settings.ncu_num, "top": top_metrics(table, metrics, ctx.settings.ncu_num),
                "metrics": table, "kernel": main_launch.kernel_name})
    path = write_json(ctx.outdir / "ncu_top.json", top)
    main = max(top["launches"], key=lambda r: r["metrics"]["duration_ns"] or 0.0)  # type: ignore[index, union-attr]
    m = main["metrics"]
    figures = {"ncu_duration_ms": top["duration_ms"], "kernels": len(top["launches"]),  # type: ignore[arg-type]
               "target_kernel": main["kernel"], "ncu_set": chosen}
    for key in ("sm_throughput_pct", "dram_throughput_pct", "achieved_occupancy_pct", "registers_per_thread"):
        if m.get(key) is not None:
            figures[key] = m[key]

    def pct(v: Any) -> str:
        return "n/a" if v is None else f"{v:.1f}%"

    return Outcome(figures, f"{main['kernel'][:60]}: {fmt_ms(top['duration_ms'])} ({chosen} set), SM "
                            f"{pct(m.get('sm_throughput_pct'))}, DRAM {pct(m.get('dram_throughput_pct'))}, occupancy "
                            f"{pct(m.get('achieved_occupancy_pct'))}", (str(report), str(path)))

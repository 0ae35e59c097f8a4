"""The ``sanitizer[tool]`` gate: one candidate call under compute-sanitizer (memcheck, racecheck, initcheck,
synccheck), its summary parsed from the tool's log."""

from __future__ import annotations

import re
from pathlib import Path

from ..artifacts import write_json
from ..errors import Blocked, HardwareError, KernelRuntimeError, KoptError
from .build import built
from .context import Context, Outcome
from .hardware import find_tool
from .request import harness_request

_SAN_ERRORS_RE = re.compile(r"ERROR SUMMARY: (\d+) errors?")
_SAN_RACE_RE = re.compile(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)")


def cases(ctx: Context) -> list[tuple[str, str]]:
    """One item per ``--kopt-sanitizer`` tool (none without the option)."""
    return [(t, t) for t in ctx.settings.sanitizer]


def sanitizer_summary(text: str) -> dict[str, int] | None:
    """Error and warning counts from compute-sanitizer's log: ``ERROR SUMMARY: N errors`` (memcheck, initcheck,
    synccheck) or ``RACECHECK SUMMARY: H hazards displayed (E errors, W warnings)`` (racecheck; warnings are
    hazards it cannot prove harmful, reported but not failed). Counts are summed over every process the tool
    followed; None when no summary line is present (the tool did not finish)."""
    errors = [int(n) for n in _SAN_ERRORS_RE.findall(text)]
    races = [(int(e), int(w)) for _, e, w in _SAN_RACE_RE.findall(text)]
    if not errors and not races:
        return None
    return {"errors": sum(errors) + sum(e for e, _ in races), "warnings": sum(w for _, w in races)}


def gate_sanitizer(ctx: Context, tool: str) -> Outcome:
    """One candidate call (first seed's inputs) under ``compute-sanitizer --tool <tool>``, its report written to a
    log file (kept even when the tool makes the call fail, as memcheck does on a bad access); writes
    ``sanitizer_<tool>.json``. Any reported error fails with status SANITIZER_<TOOL> (racecheck sets SKILL.md's
    ``race_safe``); a tool that printed no summary fails as HARDWARE_UNAVAILABLE with its output."""
    device = ctx.device_for("sanitizer")
    sanitizer = find_tool("compute-sanitizer")
    if not sanitizer:
        fix = "install the CUDA toolkit's compute-sanitizer and put its bin/ on PATH, or drop --kopt-sanitizer"
        raise Blocked("hardware", f"compute-sanitizer not found: {fix}", fix)
    res = built(ctx)
    req = harness_request(ctx, "candidate", device, ctx.settings.seeds[0], res)
    req["calls"] = 1
    # torch's caching allocator hands out slices of large cudaMalloc segments, inside which an out-of-bounds access
    # is invisible to memcheck; without it every tensor is its own allocation
    req["env"] = {**req["env"], "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
    ctx.work.mkdir(parents=True, exist_ok=True)
    log = ctx.work / f"sanitizer_{tool}.log"
    log.unlink(missing_ok=True)
    prefix = [sanitizer, "--tool", tool, "--print-limit", "20", "--target-processes", "all", "--log-file", str(log)]
    call_error: KoptError | None = None
    with ctx.gpu_lock():
        try:
            result = ctx.pool.run(req, gate="sanitizer", timeout_s=max(600.0, ctx.settings.gate_timeout_s * 10),
                                  path=ctx.display, workdir=ctx.work, prefix=prefix)
            if result.get("npz"):
                Path(result["npz"]).unlink(missing_ok=True)
        except KernelRuntimeError as exc:  # the tool's own report still says what went wrong
            if exc.status == "TIMEOUT":
                raise
            call_error = exc
    text = log.read_text(errors="replace") if log.is_file() else ""
    summary = sanitizer_summary(text)
    write_json(ctx.outdir / f"sanitizer_{tool}.json", {"tool": tool, **(summary or {}), "log_tail": text[-4000:],
                                                        "call_error": call_error.message if call_error else None})
    if summary is None:
        raise HardwareError(f"compute-sanitizer {tool} printed no summary", gate="sanitizer", path=ctx.display,
                            details=(text or (call_error.details if call_error else ""))[-2000:],
                            fix="run the command in the log by hand; check the tool's version against the driver")
    if summary["errors"]:
        first = "\n".join(ln for ln in text.splitlines() if ln.startswith("=========") and ln.strip("= "))[:3000]
        raise KernelRuntimeError(f"compute-sanitizer {tool} found {summary['errors']} error(s)", gate="sanitizer",
                                 path=ctx.display, status=f"SANITIZER_{tool.upper()}", details=first,
                                 fix="fix the reported accesses/races; the first ones are listed above")
    if call_error is not None:
        raise call_error
    warn = f", {summary['warnings']} warning(s)" if summary["warnings"] else ""
    return Outcome({"tool": tool, "errors": 0, "warnings": summary["warnings"]}, f"{tool}: 0 errors{warn}")

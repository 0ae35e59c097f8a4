"""The request loop of a harness process: one request (a fresh process) or many (a warm one), each answered with
the SHA-256 of its result on a private pipe (see :mod:`pytest_kopt.child` for the contract)."""

from __future__ import annotations

import ctypes
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

from . import HarnessError, share
from .frames import user_traceback
from .sentinels import Guard, Sentinels
from .tree import kill_tree
from .candidate import mode_candidate
from .correctness import mode_check_timed, mode_judge
from .interpreter import interpreter_gap, interpreting
from .plan import mode_plan_candidate, mode_plan_reference
from .profile import mode_profile
from .timing import mode_peaks, mode_time_reference, mode_timing
from .triton_aot import mode_triton_build

#: When this process started its harness (``time.time()``), and its start-up stamps (s after that) reported once,
#: with its first request's result: ``imported`` (torch imported, ready to serve).
_T0 = time.time()
_STARTUP: dict[str, float] = {}


def restart_clock(t0: float) -> None:
    """Count this process's start-up stamps from ``t0``: a harness process forked from the fork server
    (:mod:`pytest_kopt.child.forkserver`) starts at its fork, not at the server's start."""
    global _T0
    _T0 = t0


def mode_ready(req: dict[str, Any]) -> dict[str, Any]:
    """Answering it says the process is up and, for a CUDA request, that the profiler's warm-up (which
    :func:`handle` runs first) is done and the CUDA context and cuBLAS's handle are made (:func:`warm_cuda`, where
    nothing made them yet), so a timing can take the GPU lock without then waiting for them, and the process does
    not make them while idle after it, beside a measurement."""
    if req.get("device") == "cuda":
        import torch

        if not torch.cuda.is_initialized():
            warm_cuda(torch)
    return {}


MODES: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "ready": mode_ready,
    "candidate": mode_candidate, "judge": mode_judge, "check_timed": mode_check_timed,
    "timing": mode_timing, "time_reference": mode_time_reference, "peaks": mode_peaks, "profile": mode_profile,
    "triton_build": mode_triton_build, "plan_candidate": mode_plan_candidate, "plan_reference": mode_plan_reference}


def _jsonable(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return str(x)


def handle(req_path: str, guard: Guard) -> tuple[int, str, bool]:
    """Run one request file's mode and write ``<out>.json``. Returns (0 on success or 1 on error, SHA-256 of the
    JSON bytes written, whether the request ends its work in this process): the first two are the attestation the
    process sends on its private control pipe (the hash of any ``.npz`` it saved is inside that JSON); the last is
    False for a round of an interleaved timing that is not its final one (its timer and input sets stay alive in
    this process for the next round, so there is nothing to free). The result lists in ``tampered`` the harness's
    functions and the timing entry points that are not what they were when this process started
    (:class:`~pytest_kopt.child.sentinels.Sentinels`), and is written and attested with the originals."""
    req = json.loads(Path(req_path).read_text())
    result: dict[str, Any]
    share.release()  # the arrays the last request exported: the judge has copied them by now
    t_in = time.time()
    rnd = req.get("round")
    ends = not (isinstance(rnd, dict) and not rnd.get("final"))
    if req.get("device") == "cuda" and _PROCESS["timing"]:  # CUPTI's start-up before a request's CUDA work
        from .cupti import warm_profiler

        warm_profiler()
    t_mode = time.time()
    try:
        result = {"ok": True, **MODES[req["mode"]](req)}
        # where the request's time went inside this process (s): waiting for CUPTI's start-up, the mode itself, the
        # process's age at the end; the first request also carries the process's start-up stamps (and
        # ``cuda_warm_end``, the Unix second its context made while idle was done)
        result["harness_s"] = {"wait_profiler": round(t_mode - t_in, 3), "mode": round(time.time() - t_mode, 3),
                               "age": round(time.time() - _T0, 3), **_STARTUP}
        _STARTUP.clear()
        code = 0
    except HarnessError as exc:
        text, path, line = user_traceback(exc, (req.get("kernel"), req.get("ref")))
        if exc.path:  # the file to change, named by the check that raised
            path, line = exc.path, exc.line
        result = {"ok": False, "category": exc.category, "message": str(exc), "fix": exc.fix,
                  "traceback": text, "path": path, "line": line}
        code = 1
    except Exception as exc:  # the candidate's own Python (Triton) raised
        gap = interpreter_gap(exc) if interpreting() else None
        text, path, line = user_traceback(exc, (req.get("kernel"), req.get("ref")))
        # a gap of Triton's interpreter is no error of the kernel's: the parent skips it, for a GPU to check
        result = {"ok": False, "category": "interpreter_gap" if gap else "runtime",
                  "message": gap or f"{type(exc).__name__}: {exc}", "fix": None,
                  "traceback": text, "path": path, "line": line}
        code = 1
    tampered = guard.changed()
    if tampered:  # a kernel replaced what the harness measures or judges with: nothing it reported can stand
        result = {**result, "tampered": tampered}
    data = guard.dumps(result, default=_jsonable).encode()
    Path(req["out"] + ".json").write_bytes(data)
    sys.stdout.flush()
    sys.stderr.flush()
    return code, guard.sha256(data).hexdigest(), ends


def serve(ctl_fd: int, profiler: bool = True, reference: bool = False) -> int:
    """Warm-process loop (:class:`pytest_kopt.proc.pool.HarnessServer`): import torch, say ``ready`` on the control
    pipe, then run each request path read from stdin and answer ``done <seq> <code> <sha>``. Ends at EOF, or after
    a failed request (the parent starts a fresh process: a CUDA error can leave this context unusable). On a GPU,
    while idle before its first request, it makes its CUDA context (:func:`warm_cuda`) and, a timing process
    (``profiler``), warms CUPTI up (which a timing process also does before its first CUDA request); the others
    never load CUPTI. A process of the reference (``reference``: no kernel's code ever runs in it, and it is not
    stopped between requests) also does so while idle after requests that did not make its CUDA context (the
    plan's, on the meta device)."""
    import gc

    import numpy  # noqa: F401  (imported once here, not per request)
    import torch

    from .cupti import profiler_warm, warm_profiler

    # what the imports made lives as long as this process: out of the collector's sight, a full collection after a
    # request scans only what requests made (85 ms with torch's objects tracked, 0.05 ms without, on a 2-CPU host)
    gc.collect()
    gc.freeze()
    # before any kernel or reference file is imported: what this process measures and judges with, and the two
    # functions of this loop, held in locals a kernel cannot rebind
    guard = Sentinels().take().guard()
    run = handle
    _STARTUP["imported"] = round(time.time() - _T0, 3)
    _PROCESS["timing"] = profiler
    # until its first request: nothing of a kernel has run here yet, so this process may make its CUDA context
    # while idle, outside the GPU lock (seconds on a loaded host, that the first request would hold the lock for)
    cold = torch.cuda.is_available()
    os.set_inheritable(ctl_fd, False)  # a program the kernel runs does not get the control pipe
    ctl = os.fdopen(ctl_fd, "w", buffering=1)
    ctl.write("ready\n")
    stdin = sys.stdin  # kept: a kernel that rebinds or closes sys.stdin does not cut the request channel
    while True:
        # CUPTI's first session (seconds), paid while this process is idle: a request already on its way (the
        # plan's, sent as soon as this process is ready) is served first
        if cold and not _pending(stdin, IDLE_S):
            cold = False
            try:
                if profiler and not profiler_warm():
                    _STARTUP["profiler_warm"] = round(warm_profiler(), 3)
                _STARTUP["cuda_warm"] = round(warm_cuda(torch), 3)
                _STARTUP["cuda_warm_end"] = round(time.time(), 3)  # Unix seconds: when, beside what else ran
            except Exception:  # no context to be had (the GPU's memory full, a lost device): the next request
                pass  # meets the error and reports it as its own
            continue
        line = stdin.readline()
        if not line:
            break
        if not line.strip():
            continue
        seq, _, path = line.strip().partition(" ")
        code, json_sha, ends = run(path, guard)
        # a request's kernel may have run: a candidate's process does nothing of its own between requests. The
        # reference's, after a request on the meta device (its plan), makes its context while idle rather than in
        # its first judge's shared hold of the GPU lock (7 to 8.8 s there with some 40 processes making contexts
        # at a close's start, H100, 2026-12-06, docs/loop.md)
        cold = reference and torch.cuda.is_available() and not torch.cuda.is_initialized()
        done = f"done {seq} {code} {json_sha}\n"
        if code:  # the context may be broken (a sticky CUDA error): report, touch nothing, end
            ctl.write(done)
            return code
        if not tidy(torch, ends):  # an error the request's own checks missed: its result stands, this process ends
            ctl.write(f"done {seq} 1 {json_sha}\n")  # code 1: the parent drops this process
            return 1
        ctl.write(done)
    return 0


def warm_cuda(torch: Any) -> float:
    """Make this process's CUDA context and cuBLAS's handle (an 8x8 float32 matmul on the current device), as its
    first CUDA request would; returns the seconds it took. Called only before the first request (:func:`serve`)."""
    t0 = time.time()
    x = torch.ones(8, 8, device="cuda")
    (x @ x).sum().item()
    del x
    return time.time() - t0


def tidy(torch: Any, ends: bool) -> bool:
    """After a request that ``ends`` its work (:func:`handle`): collect its garbage and return torch's cached device
    memory, so the next request (a timing's rotating sets) sizes itself from free memory. After a round of a timing
    still under way, nothing: the next round comes at once, its timer and sets are alive, and a CUDA error that
    only the cache's release would have raised is met by that round instead. Returns False when the release raised
    (an error the request's own checks missed)."""
    import gc

    if not ends:
        return True
    gc.collect()
    try:
        if torch.cuda.is_initialized():
            torch.cuda.empty_cache()
    except Exception:
        return False
    return True


#: How long an idle warm process waits for a request before it warms the profiler up (s).
IDLE_S = 0.3
#: What this process is: ``timing`` is True while it serves requests as a timing process (:func:`serve`), which warms
#: the profiler up before its first CUDA request; False for the others and for a fresh process.
_PROCESS: dict[str, bool] = {"timing": False}


def _pending(stream: Any, timeout_s: float) -> bool:
    """True when ``stream`` has input within ``timeout_s`` (requests come one at a time, each after the answer to
    the last, so nothing waits in its buffer)."""
    import select

    return bool(select.select([stream], [], [], timeout_s)[0])


def die_with_parent(subreaper: bool = True) -> None:
    """Linux: SIGKILL this process when the process that started it ends (prctl PR_SET_PDEATHSIG), so a pytest
    killed by SIGTERM does not leave a kernel spinning on the GPU; and, with ``subreaper``, become the subreaper of
    its descendants (a harness process; not the fork server, whose only children are harness processes).
    Elsewhere a no-op."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, 9)  # PR_SET_PDEATHSIG = 1, SIGKILL = 9
        # PR_SET_CHILD_SUBREAPER = 36: orphans of the kernel's own children (a setsid() double fork) stay below
        # this process, where the parent finds, pauses and kills them, instead of escaping to init
        if subreaper:
            libc.prctl(36, 1)
        if os.getppid() == 1:  # the parent was already gone before the call
            os._exit(1)
    except (OSError, AttributeError):
        pass


def main(argv: list[str]) -> int:
    """Entry point: ``REQUEST.json [--ctl FD]`` runs one request; ``--serve CTL_FD`` runs :func:`serve`."""
    if sys.platform.startswith("linux"):
        die_with_parent()
    if len(argv) > 2 and argv[1] == "--serve":
        return serve(int(argv[2]), profiler="--no-profiler" not in argv[3:], reference="--reference" in argv[3:])
    if len(argv) > 3 and argv[2] == "--ctl":
        os.set_inheritable(int(argv[3]), False)  # a program the kernel runs does not get the control pipe
    try:
        import torch  # noqa: F401  (its entry points are recorded before the request imports a kernel)
    except ImportError:
        pass
    code, json_sha, _ = handle(argv[1], Sentinels().take().guard())
    if len(argv) > 3 and argv[2] == "--ctl":  # a fresh process: the same attestation, on its own private pipe
        with os.fdopen(int(argv[3]), "w") as ctl:
            ctl.write(f"done 0 {code} {json_sha}\n")
    # what the kernel started dies with this process (as its subreaper it holds even setsid() daemons, which at
    # its exit would go to init)
    kill_tree(os.getpid(), include_root=False)
    return code

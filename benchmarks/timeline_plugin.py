"""A pytest plugin for benchmarks: one JSON line per test phase (node id, phase, worker, start and stop in Unix
seconds, outcome) appended to the file named by ``KOPT_TIMELINE``; with xdist, the controller writes the lines of
every worker. Each process that loads it (the controller and every worker) also appends one line per hold of the
per-GPU lock (``lock``: shared or exclusive; ``asked``, ``held``, ``released``: Unix seconds; ``caller``: the
function that took it), by wrapping :class:`pytest_kopt.proc.gpulock.GpuLock`, and one line per request to a warm
harness process (``request``: its mode, ``round``: a timing round's sample count or ``final``, ``sent``,
``returned``: Unix seconds), by wrapping :meth:`pytest_kopt.proc.pool.HarnessPool.run` (with ``context``: when the
process made its CUDA context while idle before its first request). Load it with ``-p timeline_plugin`` and this
folder on ``PYTHONPATH`` (benchmarks/throughput.py does)."""

from __future__ import annotations

import json
import os
import sys
import time


_CONTROLLER = [False]


def pytest_configure(config) -> None:
    _CONTROLLER[0] = not hasattr(config, "workerinput")
    if os.environ.get("KOPT_TIMELINE"):
        for wrap in (_wrap_gpu_lock, _wrap_requests):
            try:
                wrap(os.environ["KOPT_TIMELINE"])
            except (ImportError, AttributeError):  # an older pytest_kopt (a baseline's tree) without it: not logged
                pass


def _append(path: str, row: dict) -> None:
    """One JSON line appended to ``path`` (one ``O_APPEND`` write, so processes' lines do not interleave)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(row) + "\n").encode())
    finally:
        os.close(fd)


def _wrap_requests(path: str) -> None:
    """Log each request this process sends to a harness process (its mode and how long it took)."""
    from pytest_kopt.proc.pool import HarnessPool

    if getattr(HarnessPool, "_timeline", False):
        return
    run = HarnessPool.run

    def logged_run(self, req, **kw):
        sent = time.time()
        result = None
        try:
            result = run(self, req, **kw)
            return result
        finally:
            rnd = req.get("round") or {}
            row = {"request": req.get("mode"), "gate": kw.get("gate"),
                   "round": "final" if rnd.get("final") else rnd.get("count"), "sent": sent,
                   "returned": time.time(), "pid": os.getpid()}
            made = (result.get("harness_s") or {}) if isinstance(result, dict) else {}
            if isinstance(made.get("cuda_warm_end"), (int, float)) and isinstance(made.get("cuda_warm"), (int, float)):
                # the process made its CUDA context while idle before this request: from, to (Unix seconds)
                row["context"] = [made["cuda_warm_end"] - made["cuda_warm"], made["cuda_warm_end"]]
            _append(path, row)

    HarnessPool.run = logged_run
    HarnessPool._timeline = True


def _caller() -> str:
    """Where the lock is taken: the nearest function outside the lock's own module, ``module.function`` (the
    holds with no request in them are told apart by it: an ncu profile, the device's peaks, a sanitizer run)."""
    frame = sys._getframe(2)
    while frame is not None and (frame.f_code.co_filename.endswith(("gpulock.py", "contextlib.py"))
                                 or frame.f_code.co_name.startswith("logged_")):
        frame = frame.f_back
    if frame is None:
        return "?"
    return f"{frame.f_globals.get('__name__', '?').rsplit('.', 1)[-1]}.{frame.f_code.co_name}"


def _wrap_gpu_lock(path: str) -> None:
    """Log each hold of the per-GPU lock taken in this process (one ``O_APPEND`` write a line)."""
    from pytest_kopt.proc.gpulock import GpuLock

    if getattr(GpuLock, "_timeline", False):
        return
    enter, exit_ = GpuLock.__enter__, GpuLock.__exit__

    def logged_enter(self):
        self._caller = _caller()
        self._asked = time.time()
        out = enter(self)
        self._held = time.time()
        return out

    def logged_exit(self, *exc):
        out = exit_(self, *exc)
        _append(path, {"lock": "shared" if self.shared else "exclusive", "asked": self._asked, "held": self._held,
                       "released": time.time(), "pid": os.getpid(), "caller": self._caller})
        return out

    GpuLock.__enter__, GpuLock.__exit__ = logged_enter, logged_exit
    GpuLock._timeline = True


def pytest_sessionstart(session) -> None:
    path = os.environ.get("KOPT_TIMELINE")
    if path and _CONTROLLER[0]:
        with open(path, "a") as f:
            f.write(json.dumps({"event": "sessionstart", "t": time.time()}) + "\n")


def pytest_runtest_logreport(report) -> None:
    path = os.environ.get("KOPT_TIMELINE")
    if not path or not _CONTROLLER[0]:
        return
    start, stop = getattr(report, "start", None), getattr(report, "stop", None)
    if start is None:  # pytest before 8 has no start/stop on reports
        return
    with open(path, "a") as f:
        f.write(json.dumps({"nodeid": report.nodeid, "when": report.when, "worker": getattr(report, "node", None)
                            and getattr(report.node, "gateway", None) and report.node.gateway.id,
                            "location": report.location[2] if report.location else None, "start": start, "stop": stop, "outcome": report.outcome}) + "\n")


def pytest_sessionfinish(session) -> None:
    path = os.environ.get("KOPT_TIMELINE")
    if path and _CONTROLLER[0]:
        with open(path, "a") as f:
            f.write(json.dumps({"event": "sessionfinish", "t": time.time()}) + "\n")

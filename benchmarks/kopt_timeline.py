"""A pytest plugin that stamps where a kopt session's wall time goes, for the benchmarks that print it
(``compile_timeline.py``, ``loop_gemm.py``). Loaded with ``-p kopt_timeline`` (this folder on ``PYTHONPATH``) and
active only when ``$KOPT_TIMELINE`` names a file: every process of the session (the controller, each xdist worker)
appends one JSON line per stamp, ``{"t": epoch s, "what": ..., "proc": "controller" | "gw0" ...}``.

Stamps: pytest's configure, collection's end, each worker's end as the controller sees it, the session end's start
and end in each process, the harness pool's shutdown, each ``build_cuda`` (the CUDA and CUTLASS kinds' nvcc) and the
GPU probe, and, in a loop's close, each item's end, the controller's steps (branch results, the champion's ncu and
roofline, the iteration's state, charts, summary).
Benchmark code only: it wraps module attributes, so it must be imported before the session runs (``-p`` does).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable

TIMELINE = os.environ.get("KOPT_TIMELINE")
PROC = os.environ.get("PYTEST_XDIST_WORKER", "controller")


def stamp(what: str, **fields: object) -> None:
    """Append one stamp to ``$KOPT_TIMELINE`` (a no-op without it)."""
    if TIMELINE:
        with open(TIMELINE, "a") as f:
            f.write(json.dumps({"t": time.time(), "what": what, "proc": PROC, **fields}) + "\n")


def _wrap(owner: Any, name: str, label: str, end_only: bool = False) -> None:
    inner: Callable[..., Any] = getattr(owner, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        if not end_only:
            stamp(f"{label}_start")
        try:
            return inner(*args, **kwargs)
        finally:
            stamp(f"{label}_end")

    setattr(owner, name, timed)


def read(path: str, t0: float) -> dict[str, float]:
    """Seconds from ``t0`` to each stamp of a timeline file, keyed ``"<what> (first)"`` and ``"<what> (last)"``
    across processes, and ``"<proc>: <what>"`` (last) per process."""
    out: dict[str, float] = {}
    with open(path) as f:
        for line in f:
            d = json.loads(line)
            t = d["t"] - t0
            out.setdefault(f"{d['what']} (first)", t)
            out[f"{d['what']} (last)"] = t
            out[f"{d.get('proc', '?')}: {d['what']}"] = t
    return out


if TIMELINE:
    import pytest

    from pytest_kopt.gates import builtin as _gates
    from pytest_kopt.gates import hardware as _hardware
    from pytest_kopt.kinds import cuda as _cuda
    from pytest_kopt.loop import branch_step as _branch_step
    from pytest_kopt.loop import session as _loop
    from pytest_kopt.loop import state as _state
    from pytest_kopt.loop import summary as _summary
    from pytest_kopt.proc import pool as _pool

    _wrap(_cuda, "build_cuda", "build")  # what the CUDA and CUTLASS kinds' build calls
    _wrap(_hardware, "probe_gpus", "probe", end_only=True)
    _wrap(_pool.HarnessPool, "shutdown", "pool_shutdown")
    # each where the loop looks it up (a module attribute), so the wrapper is what runs
    for _owner, _name in ((_branch_step, "branch_results"), (_branch_step, "same_gpu_decision"),
                          (_summary, "plot_history"), (_summary, "render_summary"), (_loop, "finish_run")):
        _wrap(_owner, _name, _name)
    # the ncu and roofline rows of the session's gate table (built at configure, after this import): in a loop's
    # close, the champion's profile and roofline, which the controller runs
    for _name in ("gate_ncu", "gate_roofline"):
        _wrap(_gates, _name, _name)
    for _name in ("close_iteration", "open_iteration"):
        _wrap(_state, _name, _name)

    @pytest.hookimpl(tryfirst=True)
    def pytest_configure(config: pytest.Config) -> None:  # noqa: D103
        stamp("configure")

    def pytest_collection_finish(session: pytest.Session) -> None:  # noqa: D103
        stamp("collected")

    def pytest_runtest_logreport(report: pytest.TestReport) -> None:  # noqa: D103
        if report.when == "call" or report.outcome != "passed":
            stamp("item_done", item=report.nodeid.rsplit("/", 3)[-1] if "/" in report.nodeid else report.nodeid)

    @pytest.hookimpl(optionalhook=True)  # xdist's hook: without xdist there are no workers
    def pytest_testnodedown(node: Any, error: Any) -> None:  # noqa: D103
        stamp("worker_down", worker=str(getattr(getattr(node, "gateway", None), "id", "")))

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_sessionfinish(session: pytest.Session) -> Any:  # noqa: D103
        stamp("sessionfinish_start")
        try:
            return (yield)
        finally:
            stamp("sessionfinish_end")

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(terminalreporter: object) -> None:  # noqa: D103
        stamp("summary_end")

    def pytest_unconfigure(config: pytest.Config) -> None:  # noqa: D103
        stamp("unconfigure")

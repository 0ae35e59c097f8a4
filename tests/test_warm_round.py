"""A timing's warm round (the kernel's load and first call, ahead of the measurement's exclusive hold): the timing
process keeps what it made for its measurement's first round and says where the warm-up ran; a first round
without one warms inside; a warm-up an aborted measurement left is never used by another. The pytest side takes
a shared hold for it in a loop's close only. Stand-ins for the Timer and for the warm processes; the GPU run is
the one named in the commit."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_kopt.child import timing
from pytest_kopt.gates import measure


class FakeTimer:
    """What :func:`pytest_kopt.child.timing.timed` reads of a Timer: samples taken per round, its phases."""

    def __init__(self, made: Any) -> None:
        self.made = made
        self.event_ms: list[float] = []
        self.phase_s: dict[str, float] = {}
        self.elapsed_s = 0.0
        self.info: dict[str, Any] = {}

    def take(self, count: int | None = None) -> str | None:
        self.event_ms += [0.5] * (4 if count is None else count)
        return "converged" if count is None else None

    def result(self, reason: str | None) -> dict[str, Any]:
        return {"event_ms": list(self.event_ms), "stop_reason": reason, "made": self.made}


def _mode(log: list[str]) -> Any:
    """A timing mode whose warm-up and prepare record themselves in ``log``."""
    def run(req: dict[str, Any]) -> dict[str, Any]:
        def warm() -> str:
            log.append("warm")
            return f"kernel-{len(log)}"

        def prepare(made: str) -> tuple[FakeTimer, Any]:
            log.append(f"prepare {made}")
            timer = FakeTimer(made)
            return timer, lambda result: {**result, "phase_s": dict(timer.phase_s)}

        return timing.timed(req, prepare, warm)
    return run


@pytest.fixture(autouse=True)
def _fresh_process() -> Any:
    timing._ROUNDS.clear()
    timing._WARM.clear()
    yield
    timing._ROUNDS.clear()
    timing._WARM.clear()


def test_a_warm_round_is_kept_for_its_measurements_first_round() -> None:
    log: list[str] = []
    mode = _mode(log)
    ahead = mode({"round": {"key": "m-0", "count": 0, "warm": True}})
    assert ahead == {"round": True, "warm": True, "event_ms": [], "stop_reason": None}
    assert log == ["warm"] and "m-0" in timing._WARM
    first = mode({"round": {"key": "m-0", "count": 3}})
    assert first["event_ms"] == [0.5] * 3 and first["stop_reason"] is None
    assert log == ["warm", "prepare kernel-1"]  # no second load: what the warm round made was used
    final = mode({"round": {"key": "m-0", "count": 0, "final": True}})
    assert final["made"] == "kernel-1" and final["stop_reason"] == "rounds"
    assert "warm_ahead" in final["phase_s"] and "warm" not in final["phase_s"]
    assert final["phase_s"]["warm_ahead"] >= 0 and final["phase_s"]["prepare"] >= 0
    assert timing._WARM == {} and timing._ROUNDS == {}


def test_a_first_round_without_a_warm_round_warms_inside_it() -> None:
    log: list[str] = []
    mode = _mode(log)
    mode({"round": {"key": "m-0", "count": 3}})
    final = mode({"round": {"key": "m-0", "count": 0, "final": True}})
    assert log == ["warm", "prepare kernel-1"]
    assert "warm" in final["phase_s"] and "warm_ahead" not in final["phase_s"]


def test_an_aborted_measurements_warm_up_is_not_used_by_the_next() -> None:
    """A warm round whose measurement never came (its lock wait was interrupted) is dropped by the next one's warm
    round or first round: a kernel loaded for one request is never timed for another."""
    log: list[str] = []
    mode = _mode(log)
    mode({"round": {"key": "old-0", "count": 0, "warm": True}})
    mode({"round": {"key": "new-0", "count": 3}})
    assert log == ["warm", "warm", "prepare kernel-2"] and timing._WARM == {}
    mode({"round": {"key": "new-0", "count": 0, "final": True}})
    mode({"round": {"key": "a-0", "count": 0, "warm": True}})
    mode({"round": {"key": "b-0", "count": 0, "warm": True}})
    assert list(timing._WARM) == ["b-0"]


def test_a_one_shot_timing_warms_and_prepares_at_once() -> None:
    log: list[str] = []
    got = _mode(log)({})
    assert log == ["warm", "prepare kernel-1"] and got["stop_reason"] == "converged"
    assert "prepare" in got["phase_s"]


class Locks:
    """The GPU lock's holds as taken, and the requests sent inside each."""

    def __init__(self, writers: bool = False) -> None:
        self.log: list[tuple[str, Any]] = []
        self.writers = writers  # other timings hold or wait for the GPU

    def gpu_lock(self, shared: bool = False) -> Any:
        return SimpleNamespace(writers_waiting=lambda: self.writers)

    def device_lock(self, device: str, shared: bool = False) -> Any:
        @contextlib.contextmanager
        def hold() -> Any:
            self.log.append(("hold", "shared" if shared else "exclusive"))
            yield
            self.log.append(("release", None))
        return hold()


def _ctx(locks: Locks, loop_mode: str | None) -> Any:
    def run(req: dict[str, Any], **_: Any) -> dict[str, Any]:
        rnd = req["round"]
        locks.log.append(("request", "warm" if rnd.get("warm") else "final" if rnd.get("final") else rnd["count"]))
        done = {"event_ms": [0.5] * 3, "stop_reason": "converged", "sample_wall_s": 0.001, "spec": [],
                "scalars": {}}
        return done

    settings = SimpleNamespace(loop_mode=loop_mode, pr_gate=False, fresh_process=False, baseline=None,
                               gate_timeout_s=60.0)
    return SimpleNamespace(
        settings=settings, shares_gpu=loop_mode == "run", device_lock=locks.device_lock, gpu_lock=locks.gpu_lock,
        server=lambda role: f"{role}:k.cu", display="k.cu", ref="ref.py", env={}, benchmarks=[None], work=None,
        pool=SimpleNamespace(run=run, served=lambda *a: True, pids=lambda *a: []))


def test_a_loops_close_warms_the_candidate_under_a_shared_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(measure, "ProcessMemory", lambda gpu: SimpleNamespace(close=lambda: None, note=None,
                                                                               read=lambda pids: None))
    locks = Locks()
    measure.interleaved(_ctx(locks, "run"), {"device": "cuda", "env": {}})
    assert locks.log == [("hold", "shared"), ("request", "warm"), ("release", None),
                         ("hold", "exclusive"), ("request", 3), ("request", "final"), ("release", None)]


def test_a_loops_close_warms_inside_the_exclusive_hold_while_other_timings_queue(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A shared hold asked for while other timings hold or wait for the GPU waits until all of them have run, and
    the exclusive queue can run dry meanwhile: the candidate then asks for its exclusive hold at once, and its first
    round warms inside it."""
    monkeypatch.setattr(measure, "ProcessMemory", lambda gpu: SimpleNamespace(close=lambda: None, note=None,
                                                                               read=lambda pids: None))
    locks = Locks(writers=True)
    measure.interleaved(_ctx(locks, "run"), {"device": "cuda", "env": {}})
    assert locks.log == [("hold", "exclusive"), ("request", 3), ("request", "final"), ("release", None)]


def test_outside_a_loops_close_everything_runs_in_one_exclusive_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where seeds do not share the GPU (a PR gate, a plain session), a separate hold for the warm-up would be a
    second exclusive one: the first round warms inside the measurement's hold, as before."""
    monkeypatch.setattr(measure, "ProcessMemory", lambda gpu: SimpleNamespace(close=lambda: None, note=None,
                                                                               read=lambda pids: None))
    locks = Locks()
    measure.interleaved(_ctx(locks, None), {"device": "cuda", "env": {}})
    assert ("request", "warm") not in locks.log
    assert locks.log[0] == ("hold", "exclusive") and locks.log.count(("hold", "exclusive")) == 1


@pytest.mark.parametrize("reference", [True, False])
def test_only_the_references_process_makes_its_context_while_idle_after_its_plan(
        monkeypatch: pytest.MonkeyPatch, reference: bool) -> None:
    """A warm process makes its CUDA context while idle before its first request. The reference's process (the
    judge), whose first request is its plan on the meta device, makes it while idle after that request too, so its
    first judge does not make it inside a shared hold of the GPU lock (7 to 8.8 s at a close's start on an H100);
    a candidate's process never does anything of its own after a request (a kernel's code may have run there).
    A stand-in CUDA, request handler and request channel; the GPU run is the one named in the commit."""
    import gc
    import io
    import os
    import sys

    import torch

    from pytest_kopt.child import protocol

    state = {"initialized": False}
    order: list[str] = []

    def handle(path: str, guard: Any) -> tuple[int, str, bool]:
        order.append(path)
        if path == "judge":  # a request on the GPU makes the context
            state["initialized"] = True
        return 0, "sha", True

    def warm_cuda(_torch: Any) -> float:
        order.append("warm_cuda")
        state["initialized"] = True
        return 0.0

    waiting = iter([True, False, False, False])  # the plan's request is on its way when the process is ready
    monkeypatch.setattr(protocol, "handle", handle)
    monkeypatch.setattr(protocol, "warm_cuda", warm_cuda)
    monkeypatch.setattr(protocol, "_pending", lambda stream, timeout_s: next(waiting, True))
    monkeypatch.setattr(protocol, "tidy", lambda torch, ends: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: state["initialized"])
    monkeypatch.setattr(sys, "stdin", io.StringIO("1 plan\n2 judge\n"))
    r, w = os.pipe()
    try:
        assert protocol.serve(w, profiler=False, reference=reference) == 0
    finally:
        gc.unfreeze()
        os.close(r)
    assert order == (["plan", "warm_cuda", "judge"] if reference else ["plan", "judge"])


def test_re_timing_raises_the_pools_cap_for_its_rounds_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Re-timing five finalists side by side keeps all five processes warm through the rounds (the pool's cap,
    4, would end one to start it again inside the hold), and leaves the pool's cap as it was afterwards, whether
    the rounds finished or raised."""
    pool = SimpleNamespace(max_servers=4, prestart=lambda *a, **k: None)
    seen: list[int] = []

    class Rounds:
        def __init__(self, ctx: Any, parties: list[Any]) -> None:
            self.parties = parties

        def start(self, i: int) -> None:
            seen.append(pool.max_servers)

        def finish(self) -> list[dict[str, Any]]:
            if len(self.parties) == 2:
                raise RuntimeError("a finalist crashed")
            return [{"event_ms": [0.5], "stop_reason": "converged"} for _ in self.parties]

    ctxs = [SimpleNamespace(pool=pool, work=None, display=f"b{i}", server=lambda role: role,
                            gpu_lock=contextlib.nullcontext, settings=SimpleNamespace(timing_method="events"))
            for i in range(5)]
    monkeypatch.setattr(measure, "timing_request", lambda c, device: {"env": {}})
    monkeypatch.setattr(measure, "ready_for_timing", lambda ctx, parties: None)
    monkeypatch.setattr(measure, "Rounds", Rounds)
    assert len(measure.retime_interleaved(ctxs)) == 5
    assert seen == [7] * 5 and pool.max_servers == 4
    with pytest.raises(RuntimeError, match="crashed"):
        measure.retime_interleaved(ctxs[:2])
    assert pool.max_servers == 4


def test_the_shared_reference_timing_readies_its_process_before_the_gpu_lock(tmp_path: Any,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """In a loop's close the reference is timed once for every branch (the session's signed cache) in a process
    no worker started ahead: it is started, its CUDA context and CUPTI made (a ``ready`` request) before the GPU
    lock is taken for the timing; a second branch reads the cached timing and starts nothing."""
    from pytest_kopt.gates.trust import Trust

    log: list[tuple[str, Any]] = []

    def run(req: dict[str, Any], **kw: Any) -> dict[str, Any]:
        log.append((req["mode"], kw.get("lock")))
        return {"event_ms": [2.0], "stop_reason": "converged", "cupti": None}

    monkeypatch.setattr(measure, "ready_for_timing", lambda ctx, parties: log.append(("ready", parties[0][1])))
    ctx = SimpleNamespace(ref=tmp_path / "ref.py", env={"gpu": {"uuid": "GPU-0"}}, cache_dir=tmp_path / "cache",
                          settings=SimpleNamespace(gate_timeout_s=60.0), work=tmp_path, display="b1/kernel.cu",
                          trust=Trust(b"k" * 32), gpu_lock=lambda: "the GPU lock", server=lambda role: role,
                          pool=SimpleNamespace(run=run))
    (tmp_path / "ref.py").write_text("def reference(x): return x\n")
    req = {"plan": {}, "seed": 1, "dims": {"N": 8}, "device": "cuda"}
    cand = {"spec": [{"name": "x"}], "scalars": {}}
    assert measure.reference_timing(ctx, req, cand)["event_ms"] == [2.0]  # type: ignore[arg-type]
    assert log == [("ready", "reference"), ("time_reference", "the GPU lock")]
    assert measure.reference_timing(ctx, req, cand)["event_ms"] == [2.0]  # type: ignore[arg-type]
    assert len(log) == 2


def test_ready_makes_the_context_and_a_failed_idle_warm_up_leaves_the_error_to_the_next_request(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``ready`` request on CUDA answers once the context is made (a timing then takes the GPU lock without
    waiting for it, and nothing is made while idle beside a measurement); on the CPU it makes none. A context that
    cannot be made while idle (the GPU's memory full) does not end the process: the next request meets the error."""
    import gc
    import io
    import os
    import sys

    import torch

    from pytest_kopt.child import protocol

    made: list[str] = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: bool(made))
    monkeypatch.setattr(protocol, "warm_cuda", lambda _torch: made.append("context") or 0.0)
    assert protocol.mode_ready({"device": "cpu"}) == {} and made == []
    assert protocol.mode_ready({"device": "cuda"}) == {} and made == ["context"]
    assert protocol.mode_ready({"device": "cuda"}) == {} and made == ["context"]  # made once

    served: list[str] = []

    def fail(_torch: Any) -> float:
        raise RuntimeError("CUDA error: out of memory")

    monkeypatch.setattr(protocol, "warm_cuda", fail)
    monkeypatch.setattr(protocol, "handle", lambda path, guard: (served.append(path), (0, "sha", True))[1])
    monkeypatch.setattr(protocol, "_pending", lambda stream, timeout_s: False)
    monkeypatch.setattr(protocol, "tidy", lambda torch, ends: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(sys, "stdin", io.StringIO("1 judge\n"))
    r, w = os.pipe()
    try:
        assert protocol.serve(w, profiler=False) == 0
    finally:
        gc.unfreeze()
        os.close(r)
    assert served == ["judge"]

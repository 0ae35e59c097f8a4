"""The warm harness processes of pytest_kopt.proc.pool, and the session's signed cache (pytest_kopt.gates.trust)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from pytest_kopt.errors import KernelRuntimeError
from pytest_kopt.gates.trust import Trust, read_verified
from pytest_kopt.proc.pool import HarnessPool


def test_prestarted_process_serves_the_first_request_and_is_ended_at_shutdown(tmp_path: Path) -> None:
    """prestart() spawns without waiting; the first request's server lookup then waits for that same process (no
    second spawn), and shutdown() ends it. A second prestart of a running identity is a no-op; None (fresh
    processes) too."""
    pool = HarnessPool()
    pool.prestart(None, {}, tmp_path)
    assert not pool.starting
    pool.prestart("reference:/r.py", {}, tmp_path)
    started = pool.starting[("reference:/r.py", ())]
    try:
        srv = pool._server("reference:/r.py", {}, tmp_path, gate="correctness", path="r.py")
        assert srv is started and not pool.starting
        assert srv.proc.poll() is None  # ready, alive
        pool.prestart("reference:/r.py", {}, tmp_path)
        assert not pool.starting
    finally:
        pool.shutdown()
    assert started.proc.poll() is not None and not pool.live


def test_only_the_timing_processes_load_the_profiler(tmp_path: Path) -> None:
    """The candidate's and the reference's correctness processes (``check``, ``judge``) start with --no-profiler, so
    their requests never wait for CUPTI's start (seconds); the timing processes warm it up while idle. A reference
    process is never stopped between requests, a candidate's always."""
    pool = HarnessPool()
    roles = ("check:/k.cu", "candidate:/k.cu", "judge:/r.py", "reference:/r.py")
    try:
        for identity in roles:
            pool.prestart(identity, {}, tmp_path)
        argv = {key[0]: srv.proc.args for key, srv in pool.starting.items()}
        assert {k: "--no-profiler" in a for k, a in argv.items()} == {
            "check:/k.cu": True, "candidate:/k.cu": False, "judge:/r.py": True, "reference:/r.py": False}
        pausing = {key[0]: srv.pausing for key, srv in pool.starting.items()}
        assert pausing == {"check:/k.cu": True, "candidate:/k.cu": True, "judge:/r.py": False,
                           "reference:/r.py": False}
        # the four of one kernel fit the pool: none ends another
        for identity in roles:
            pool._server(identity, {}, tmp_path, gate="correctness", path="k.cu")
        assert sorted(k[0] for k in pool.live) == sorted(roles)
        assert all(srv.proc.poll() is None for srv in pool.live.values())
    finally:
        pool.shutdown()


def test_a_ready_request_answers_once_the_process_is_up(tmp_path: Path) -> None:
    """The timing gate asks each timing process ``ready`` before it takes the GPU lock; the answer is an ordinary
    attested result (on a GPU, after the profiler's warm-up)."""
    pool = HarnessPool()
    try:
        got = pool.run({"mode": "ready", "device": "cpu", "env": {}}, gate="timing", timeout_s=120.0, path="r.py",
                       workdir=tmp_path, server="reference:/r.py")
        assert got["ok"] is True and set(got["harness_s"]) >= {"wait_profiler", "mode", "age", "imported"}
        assert list(pool.live) == [("reference:/r.py", ())]
        # served: the timing gate asks it nothing more before it takes the lock
        assert pool.served("reference:/r.py", {}) and not pool.served("candidate:/k.cu", {})
    finally:
        pool.shutdown()


def test_a_kernels_first_item_ends_the_unused_processes_of_the_kernel_before(tmp_path: Path) -> None:
    """Processes started for a kernel that failed before it used them (a compile error) do not pile up over a
    session: the next kernel's start ends them; the reference's stay (every kernel uses them)."""
    pool = HarnessPool()
    try:
        for identity in ("check:/a.cu", "candidate:/a.cu", "judge:/r.py"):
            pool.prestart(identity, {}, tmp_path)
        first = {k[0]: srv for k, srv in pool.starting.items()}
        pool.prestart("check:/b.cu", {}, tmp_path)
        assert sorted(k[0] for k in pool.starting) == ["check:/b.cu", "judge:/r.py"]
        assert first["check:/a.cu"].proc.poll() is not None and first["candidate:/a.cu"].proc.poll() is not None
        assert first["judge:/r.py"].proc.poll() is None
    finally:
        pool.shutdown()


def test_the_shutdown_ends_what_was_started_ahead(tmp_path: Path) -> None:
    """A profile started ahead that no gate took (its item was deselected or blocked) ends with the session's
    scheduler and pool (the session's end shuts down both)."""
    from pytest_kopt.gates.ncu import ProfileAhead
    from pytest_kopt.proc.runner import FreshProcess
    from pytest_kopt.scheduler import Scheduler

    req = {"mode": "plan_reference", "ref": str(tmp_path / "none.py")}
    # the wrapping tool (ncu, here a shell that ignores its target) waits like a profile waiting for its go
    proc = FreshProcess(req, gate="ncu", workdir=tmp_path, prefix=["sh", "-c", "sleep 60", "sh"])
    go = tmp_path / "go"
    go.touch()
    pool = HarnessPool()
    ahead = Scheduler(pool)
    ahead._profiles[("k.cu", "full")] = ProfileAhead(proc, go, 0.0)
    assert proc.alive()
    ahead.shutdown()
    pool.shutdown()
    assert not proc.alive() and not go.exists() and not ahead._profiles


def test_two_pools_keep_their_own_processes(tmp_path: Path) -> None:
    """A pool is an object, not a module global: a second pool (an in-process pytest run) neither sees nor ends the
    first one's processes."""
    a, b = HarnessPool(), HarnessPool()
    a.prestart("reference:/r.py", {}, tmp_path)
    try:
        assert not b.starting
        b.shutdown()
        assert a.starting[("reference:/r.py", ())].proc.poll() is None
    finally:
        a.shutdown()


def test_read_verified_returns_the_hashed_bytes_or_raises_tampered(tmp_path: Path) -> None:
    """The reference's outputs are judged from the bytes whose SHA-256 matched the attested one; a changed file (or
    no attested hash) is TAMPERED."""
    f = tmp_path / "ref.npz"
    f.write_bytes(b"outputs v1")
    good = hashlib.sha256(b"outputs v1").hexdigest()
    assert read_verified(f, good, "correctness", "k.cu") == b"outputs v1"
    f.write_bytes(b"outputs v2")
    for sha in (good, None):
        with pytest.raises(KernelRuntimeError) as info:
            read_verified(f, sha, "correctness", "k.cu")
        assert info.value.status == "TAMPERED" and "ref.npz" in info.value.message


def test_the_signed_cache_computes_once_and_never_trusts_what_it_did_not_sign(tmp_path: Path) -> None:
    """One computation per name; a second session's key (or a planted entry) does not verify, so the value is
    computed again; a blob changed on disk is computed again, never returned."""
    calls: list[int] = []

    def compute() -> tuple[dict, bytes]:
        calls.append(1)
        return {"n": len(calls)}, b"blob %d" % len(calls)

    t = Trust()
    assert t.cached(tmp_path, "k", compute) == ({"n": 1}, b"blob 1", False)
    assert t.cached(tmp_path, "k", compute) == ({"n": 1}, b"blob 1", True)
    assert Trust().cached(tmp_path, "k", compute) == ({"n": 2}, b"blob 2", False)  # another session's key
    (tmp_path / "k.npz").write_bytes(b"planted")
    assert Trust().cached(tmp_path, "k", compute)[1] == b"blob 3"
    unsigned = t.cached(tmp_path / "u", "p", lambda: ({"v": 1}, None), signed=False)
    assert unsigned == ({"v": 1}, None, False)
    assert Trust().cached(tmp_path / "u", "p", lambda: pytest.fail("kept across sessions"), signed=False)[2]


def test_the_signed_cache_keeps_a_hash_the_caller_verified_and_recomputes_on_a_wrong_one(tmp_path: Path) -> None:
    """compute() may hand back the blob's SHA-256 it has just checked (the reference's outputs): the entry is then
    a hit with that hash. A hash that is not the blob's never makes a wrong blob trusted: the next read fails its
    check and computes again."""
    import hashlib

    blob = b"reference outputs"
    t = Trust()
    good = t.cached(tmp_path, "g", lambda: ({"v": 1}, blob, hashlib.sha256(blob).hexdigest()))
    assert good == ({"v": 1}, blob, False)
    assert t.cached(tmp_path, "g", lambda: pytest.fail("a hit")) == ({"v": 1}, blob, True)
    assert t.cached(tmp_path, "w", lambda: ({"v": 1}, blob, "0" * 64)) == ({"v": 1}, blob, False)
    assert t.cached(tmp_path, "w", lambda: ({"v": 2}, b"again", None)) == ({"v": 2}, b"again", False)


def test_a_timing_round_that_is_not_the_last_leaves_the_process_untidied(tmp_path: Path) -> None:
    """A warm process collects garbage and empties torch's cache after a request, but not after a round of an
    interleaved timing that is not its final one: its timer and input sets stay alive for the next round, and the
    collection cost about 85 ms a round (torch's objects tracked; a 25 ms kernel's measurement is some 30 rounds).
    ``handle`` says which (its third value); the attestation is unchanged."""
    import json

    from pytest_kopt.child.protocol import handle
    from pytest_kopt.child.sentinels import Sentinels

    guard = Sentinels().take().guard()
    ends = {}
    for name, rnd in (("plain", None), ("mid", {"key": "k", "count": 3, "final": False}),
                      ("last", {"key": "k", "count": 0, "final": True})):
        req = {"mode": "ready", "device": "cpu", "out": str(tmp_path / name), **({"round": rnd} if rnd else {})}
        (tmp_path / f"{name}.req.json").write_text(json.dumps(req))
        code, sha, ends[name] = handle(str(tmp_path / f"{name}.req.json"), guard)
        data = (tmp_path / f"{name}.json").read_bytes()
        assert code == 0 and sha == hashlib.sha256(data).hexdigest() and json.loads(data)["ok"] is True
    assert ends == {"plain": True, "mid": False, "last": True}


def test_the_tidy_up_runs_after_a_request_that_ends_and_not_after_a_round_under_way(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``tidy`` collects garbage and returns torch's cached device memory after a request that ends its work, and
    does nothing after a timing round still under way; a release that raises (an error the request missed) says
    so, and the process then ends."""
    import gc
    from types import SimpleNamespace

    from pytest_kopt.child.protocol import tidy

    calls: list[str] = []
    monkeypatch.setattr(gc, "collect", lambda *a: calls.append("collect") or 0)
    cuda = SimpleNamespace(is_initialized=lambda: True, empty_cache=lambda: calls.append("empty_cache"))
    torch = SimpleNamespace(cuda=cuda)
    assert tidy(torch, ends=False) is True and calls == []
    assert tidy(torch, ends=True) is True and calls == ["collect", "empty_cache"]

    def broken() -> None:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    cuda.empty_cache = broken
    assert tidy(torch, ends=True) is False


def test_kernels_started_ahead_keep_their_processes(tmp_path: Path) -> None:
    """A worker starts the next kernel's processes (``ahead``) while the current kernel's run, and a loop's close
    the processes of the branches it may re-time side by side: an ``ahead`` start ends no other kernel's unused
    processes, and an ordinary start ends those of every kernel but itself and the ones started ahead (until their
    own ordinary start); reference processes are never ended."""
    pool = HarnessPool()
    try:
        pool.prestart("candidate:/a.cu", {}, tmp_path)
        pool.prestart("judge:/r.py", {}, tmp_path)
        pool.prestart("candidate:/b.cu", {}, tmp_path, ahead=True)
        pool.prestart("candidate:/c.cu", {}, tmp_path, ahead=True)
        assert sorted(k[0] for k in pool.starting) == ["candidate:/a.cu", "candidate:/b.cu", "candidate:/c.cu",
                                                        "judge:/r.py"]
        pool.prestart("check:/a.cu", {}, tmp_path)  # the current kernel, again (its plan gate)
        assert len(pool.starting) == 5
        a = pool.starting[("candidate:/a.cu", ())]
        pool.prestart("check:/b.cu", {}, tmp_path)  # b is current: a's unused processes end, c's stay
        assert sorted(k[0] for k in pool.starting) == ["candidate:/b.cu", "candidate:/c.cu", "check:/b.cu",
                                                        "judge:/r.py"]
        assert a.proc.wait(timeout=30) is not None
        assert pool.ahead_targets == {"/c.cu"}
        c = pool.starting[("candidate:/c.cu", ())]
        pool.end_ahead("/c.cu")  # another worker ran c: its unused processes end
        assert sorted(k[0] for k in pool.starting) == ["candidate:/b.cu", "check:/b.cu", "judge:/r.py"]
        assert c.proc.wait(timeout=30) is not None and not pool.ahead_targets
    finally:
        pool.shutdown()

"""The per-GPU reader-writer lock (pytest_kopt/proc/gpulock.py) and who holds it how: shared holds run side by side,
an exclusive one runs alone, a waiting writer is not overtaken, writers waiting together go before readers, and an older session's filelock.FileLock is kept
apart. Each case records the order of events between threads; the waits only give a blocked thread the chance to
get in wrongly (an ordering is asserted, never a speed)."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import filelock
import pytest

from pytest_kopt.gates.context import Context
from pytest_kopt.gates.measure import interleaves_reference
from pytest_kopt.proc.gpulock import GpuLock

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="the GPU lock is fcntl's flock: Linux and macOS")
#: how long a thread that should be blocked is given to get in wrongly (s)
CHANCE_S = 0.3


def _holder(path: str, shared: bool, name: str, log: list[str], release: threading.Event) -> threading.Thread:
    """A thread that takes the lock, logs ``+name``, waits for ``release`` and logs ``-name`` as it lets go."""
    def run() -> None:
        with GpuLock(path, shared=shared):
            log.append(f"+{name}")
            release.wait(10)
            log.append(f"-{name}")
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _until(cond, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out waiting for a thread"
        time.sleep(0.01)


def test_shared_holds_run_side_by_side(tmp_path: Path) -> None:
    path, log, go = str(tmp_path / "gpu.lock"), [], threading.Event()
    a = _holder(path, True, "a", log, go)
    b = _holder(path, True, "b", log, go)
    _until(lambda: {"+a", "+b"} <= set(log))  # both inside at once
    go.set()
    a.join(5), b.join(5)
    assert sorted(log[:2]) == ["+a", "+b"]


def test_an_exclusive_hold_waits_for_the_shared_ones_and_keeps_them_out(tmp_path: Path) -> None:
    path, log = str(tmp_path / "gpu.lock"), []
    go_r, go_w = threading.Event(), threading.Event()
    r = _holder(path, True, "r", log, go_r)
    _until(lambda: "+r" in log)
    w = _holder(path, False, "w", log, go_w)
    time.sleep(CHANCE_S)
    assert log == ["+r"]  # the writer waits for the reader
    go_r.set()
    _until(lambda: "+w" in log)
    go_r2 = threading.Event()
    r2 = _holder(path, True, "r2", log, go_r2)
    time.sleep(CHANCE_S)
    assert "+r2" not in log  # a reader waits for the writer
    go_w.set()
    go_r2.set()
    for t in (r, w, r2):
        t.join(5)
    assert log == ["+r", "-r", "+w", "-w", "+r2", "-r2"]


def test_a_waiting_writer_is_not_overtaken_by_a_later_reader(tmp_path: Path) -> None:
    path, log = str(tmp_path / "gpu.lock"), []
    go_r1, go_w, go_r2 = threading.Event(), threading.Event(), threading.Event()
    _holder(path, True, "r1", log, go_r1)
    _until(lambda: "+r1" in log)
    _holder(path, False, "w", log, go_w)
    time.sleep(CHANCE_S)  # the writer is waiting now
    _holder(path, True, "r2", log, go_r2)
    time.sleep(CHANCE_S)
    assert log == ["+r1"]  # r2 did not join r1's shared hold past the waiting writer
    go_r1.set()
    _until(lambda: "+w" in log)
    go_w.set()
    go_r2.set()
    _until(lambda: "-r2" in log)
    assert log.index("-w") < log.index("+r2")


def test_writers_waiting_together_go_before_the_readers(tmp_path: Path) -> None:
    """Two writers queue behind a shared hold, then a reader comes: both writers run (one after the other) before
    the reader, so the shared holds drain once for both, not once each."""
    path, log = str(tmp_path / "gpu.lock"), []
    go = {k: threading.Event() for k in ("r1", "w1", "w2", "r2")}
    _holder(path, True, "r1", log, go["r1"])
    _until(lambda: "+r1" in log)
    _holder(path, False, "w1", log, go["w1"])
    _holder(path, False, "w2", log, go["w2"])
    time.sleep(CHANCE_S)
    _holder(path, True, "r2", log, go["r2"])
    time.sleep(CHANCE_S)
    assert log == ["+r1"]
    go["r2"].set()  # r2 lets go as soon as it gets in: its place in the order is what is asserted
    go["r1"].set()
    _until(lambda: any(x in log for x in ("+w1", "+w2", "+r2")))
    first = "w1" if "+w1" in log else "w2"
    second = "w2" if first == "w1" else "w1"
    time.sleep(CHANCE_S)
    assert log == ["+r1", "-r1", f"+{first}"]  # the writer alone: neither the other writer nor the reader
    go[first].set()
    _until(lambda: f"+{second}" in log or "+r2" in log)
    time.sleep(CHANCE_S)
    assert log[-1] == f"+{second}"  # the second writer before the reader that came after it
    go[second].set()
    _until(lambda: "-r2" in log)
    assert log == ["+r1", "-r1", f"+{first}", f"-{first}", f"+{second}", f"-{second}", "+r2", "-r2"]


def test_a_reader_waits_only_while_a_writer_waits_or_holds(tmp_path: Path) -> None:
    """A writer's announcement ends with its hold: readers after it come in side by side, and a writer whose wait
    was interrupted leaves no announcement behind."""
    path, log = str(tmp_path / "gpu.lock"), []
    with GpuLock(path):
        pass
    go = threading.Event()
    _holder(path, True, "a", log, go)
    _holder(path, True, "b", log, go)
    _until(lambda: {"+a", "+b"} <= set(log))
    go.set()
    import pytest_kopt.proc.gpulock as gpulock

    class Interrupted(Exception):
        pass

    lock = GpuLock(path)
    real = gpulock.GpuLock._take
    gpulock.GpuLock._take = lambda self: (_ for _ in ()).throw(Interrupted())
    try:
        with pytest.raises(Interrupted):
            lock.__enter__()
    finally:
        gpulock.GpuLock._take = real
    assert lock._writer is None
    with GpuLock(path, shared=True):  # not blocked by the interrupted writer
        pass


def test_writers_waiting_reads_whether_a_shared_hold_would_wait_for_a_writer(tmp_path: Path) -> None:
    """``writers_waiting`` is True while a writer holds or waits (a shared hold asked for then waits for it), False
    while only readers hold or nobody does; it takes nothing itself."""
    path, log = str(tmp_path / "gpu.lock"), []
    probe = GpuLock(path, shared=True)
    assert probe.writers_waiting() is False
    go_r, go_w = threading.Event(), threading.Event()
    _holder(path, True, "r", log, go_r)
    _until(lambda: "+r" in log)
    assert probe.writers_waiting() is False  # a reader alone keeps no reader out
    w = _holder(path, False, "w", log, go_w)
    _until(lambda: probe.writers_waiting())  # the writer waits for the reader
    assert "+w" not in log
    go_r.set()
    _until(lambda: "+w" in log)
    assert probe.writers_waiting() is True  # and then holds
    go_w.set()
    w.join(5)
    assert probe.writers_waiting() is False
    with GpuLock(path):  # the probe left nothing held
        pass


def test_an_older_sessions_filelock_excludes_a_shared_hold(tmp_path: Path) -> None:
    """Another session of an earlier pytest-kopt takes the same file with filelock.FileLock (flock exclusive)."""
    path, log = str(tmp_path / "gpu.lock"), []
    old = filelock.FileLock(path)
    old.acquire()
    go = threading.Event()
    _holder(path, True, "r", log, go)
    time.sleep(CHANCE_S)
    assert log == []
    old.release()
    _until(lambda: "+r" in log)
    go.set()
    with GpuLock(path):  # and an exclusive hold here keeps FileLock out
        with pytest.raises(filelock.Timeout):
            filelock.FileLock(path, timeout=0.1).acquire()


def _settings(**kw):
    base = {"fresh_process": False, "loop_mode": None, "pr_gate": False}
    return SimpleNamespace(settings=SimpleNamespace(**{**base, **kw}))


@pytest.mark.parametrize("settings, interleaves, shares", [
    ({}, True, False),  # a session of its own: the reference in rounds beside the kernel, each seed alone
    ({"fresh_process": True}, False, False),
    ({"loop_mode": "init"}, True, False),  # a run's set-up times its baseline as any session does
    ({"loop_mode": "run"}, False, True),  # a close: the reference timed once for its branches, seeds side by side
    ({"loop_mode": "run", "pr_gate": True}, True, True),
])
def test_who_times_the_reference_in_rounds_and_who_shares_the_gpu(settings, interleaves: bool, shares: bool) -> None:
    ctx = _settings(**settings)
    assert interleaves_reference(ctx) is interleaves
    assert Context.shares_gpu.fget(ctx) is shares


def test_a_lock_file_of_another_user_is_opened_read_only(tmp_path: Path, monkeypatch) -> None:
    """flock needs no write access: a lock file this user may not write (another user's, mode 0644) still locks.
    (The refusal is simulated: root, as CI runs, may write any file.)"""
    import os

    import pytest_kopt.proc.gpulock as gpulock

    real_open, opened = os.open, []

    def no_write(path, flags, *mode):
        if flags & os.O_RDWR:
            raise PermissionError(13, "Permission denied", path)
        opened.append(path)
        return real_open(path, flags, *mode)

    path = tmp_path / "gpu.lock"
    for p in (path, Path(f"{path}.turn"), Path(f"{path}.writers")):
        p.touch()
    monkeypatch.setattr(gpulock.os, "open", no_write)  # the os module itself: undone before FileLock opens
    with GpuLock(str(path)):
        monkeypatch.undo()
        with pytest.raises(filelock.Timeout):
            filelock.FileLock(str(path), timeout=0.1).acquire()
    assert opened == [f"{path}.writers", f"{path}.turn", str(path)]


def test_a_lock_that_cannot_be_opened_is_a_hardware_error_naming_the_file(tmp_path: Path) -> None:
    from pytest_kopt.errors import HardwareError

    path = tmp_path / "missing-folder" / "gpu.lock"
    with pytest.raises(HardwareError) as info:
        with GpuLock(str(path)):
            pass
    assert info.value.path == f"{path}.writers" and "TMPDIR" in info.value.fix

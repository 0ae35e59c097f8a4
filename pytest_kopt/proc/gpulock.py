"""The per-GPU lock: what runs on one GPU, across this session's workers and other sessions, as a reader-writer lock
over OS file locks (``flock``).

An exclusive hold (timing, ncu, the sanitizer, the GPU's peaks, correctness outside a loop's close) runs alone on the
GPU. Shared holds (a loop close's correctness seeds, whose figures are verdicts, not times) run beside each other,
never beside an exclusive one. A waiting writer is not overtaken by readers that come after it: every acquirer
passes a turnstile (a second file, ``<lock>.turn``) holding it exclusively while it waits for the lock itself, so a
writer waiting there keeps later readers out until it has its hold. The lock file is the one ``filelock.FileLock``
takes (``flock`` exclusive on Linux), so a session of an older pytest-kopt, which takes it that way, is still kept
apart from every hold here.

Linux and macOS (``fcntl``); each hold opens its own file descriptions, so two threads of one process exclude each
other as two processes do. Holds are never nested.
"""

from __future__ import annotations

import os
from types import TracebackType


class GpuLock:
    """A hold of the per-GPU lock at ``path``, exclusive or ``shared``, as a context manager; waits without a
    timeout (a hold ends with its process, whatever kills it, since the OS drops a dead process's ``flock``). Raises
    OSError when the lock files cannot be opened."""

    def __init__(self, path: str, shared: bool = False) -> None:
        self.path = path
        self.shared = shared
        self._fd: int | None = None

    def __enter__(self) -> GpuLock:
        import fcntl

        turn = os.open(self.path + ".turn", os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(turn, fcntl.LOCK_EX)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX)
            except BaseException:
                os.close(fd)
                raise
            self._fd = fd
        finally:
            os.close(turn)  # closing the turnstile's descriptor releases it: the next acquirer may wait for the lock
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._fd is not None:
            os.close(self._fd)  # the hold ends with its descriptor
            self._fd = None

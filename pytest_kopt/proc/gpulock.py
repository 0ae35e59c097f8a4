"""The per-GPU lock: what runs on one GPU, across this session's workers and other sessions, as a reader-writer lock
over OS file locks (``flock``).

An exclusive hold (timing, ncu, the sanitizer, the GPU's peaks, correctness outside a loop's close) runs alone on the
GPU. Shared holds (a loop close's correctness seeds, whose figures are verdicts, not times) run beside each other,
never beside an exclusive one. A waiting writer is not overtaken by readers that come after it: every acquirer
passes a turnstile (a second file, ``<lock>.turn``) holding it exclusively while it waits for the lock itself, so a
writer waiting there keeps later readers out until it has its hold. Writers that wait together go before the
readers: each writer holds a third file, ``<lock>.writers``, shared from before the turnstile to its release, and a
reader enters only once it can take that file exclusively (no writer waits or holds), so the queued exclusive holds
run one after another and the shared holds drain once for all of them, not once each (while shared holds drain
before a writer, the GPU runs fewer and fewer of them; in a loop's close of 32 branches those hand-overs were a
third of the close, H100, 2026-12-06). The lock file is the one ``filelock.FileLock`` takes (``flock`` exclusive on
Linux), so a session of an older pytest-kopt, which takes it that way, is still kept apart from every hold here.

Linux and macOS (``fcntl``); each hold opens its own file descriptions, so two threads of one process exclude each
other as two processes do. Holds are never nested.
"""

from __future__ import annotations

import os
from types import TracebackType

from ..errors import HardwareError


def _open(path: str) -> int:
    """A descriptor of the lock file ``path``, made if missing. ``flock`` needs no write access, so a file another
    user made (mode 0644 under the usual umask) is opened read-only. Raises HardwareError naming the file and the
    fix when it can be neither made nor read (a missing or read-only folder, a file of mode 0600 of another user)."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except PermissionError:
        try:
            return os.open(path, os.O_RDONLY)
        except OSError as exc:
            err: OSError = exc
    except OSError as exc:
        err = exc
    raise HardwareError(f"the per-GPU lock file {path} cannot be opened: {err.strerror or err}", gate="hardware",
                        path=path, fix="make it readable by this user (chmod a+r, or remove it if no session "
                                       "runs), or give this session a temp dir of its own (TMPDIR=...)") from None


class GpuLock:
    """A hold of the per-GPU lock at ``path``, exclusive or ``shared``, as a context manager; waits without a
    timeout (a hold ends with its process, whatever kills it, since the OS drops a dead process's ``flock``). Raises
    HardwareError (exit 3) when a lock file can be neither made nor read."""

    def __init__(self, path: str, shared: bool = False) -> None:
        self.path = path
        self.shared = shared
        self._fd: int | None = None
        #: a writer's shared hold of ``<lock>.writers``, from before the turnstile to its release
        self._writer: int | None = None

    def __enter__(self) -> GpuLock:
        import fcntl

        writers = _open(self.path + ".writers")
        try:
            # a reader waits until no writer waits or holds; a writer announces itself to the readers
            fcntl.flock(writers, fcntl.LOCK_EX if self.shared else fcntl.LOCK_SH)
        except BaseException:
            os.close(writers)
            raise
        if self.shared:
            os.close(writers)
        else:
            self._writer = writers
        try:
            self._take()
        except BaseException:
            self._end_writer()
            raise
        return self

    def writers_waiting(self) -> bool:
        """Whether an exclusive hold is held or waited for now (``<lock>.writers`` cannot be taken exclusively
        without waiting): a shared hold asked for now would wait until every such writer has run. A moment's
        answer; nothing is held after it."""
        import fcntl

        writers = _open(self.path + ".writers")
        try:
            fcntl.flock(writers, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(writers)
        return False

    def _end_writer(self) -> None:
        if self._writer is not None:
            os.close(self._writer)
            self._writer = None

    def _take(self) -> None:
        import fcntl

        turn = _open(self.path + ".turn")
        try:
            fcntl.flock(turn, fcntl.LOCK_EX)
            fd = _open(self.path)
            try:
                fcntl.flock(fd, fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX)
            except BaseException:
                os.close(fd)
                raise
            self._fd = fd
        finally:
            os.close(turn)  # closing the turnstile's descriptor releases it: the next acquirer may wait for the lock

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._fd is not None:
            os.close(self._fd)  # the hold ends with its descriptor
            self._fd = None
        self._end_writer()

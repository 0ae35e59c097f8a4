"""One lock per run directory: a loop step (``--kopt-init``, ``--kopt-run``) holds it from its configure to its
end, so two steps never work on one run at once (each reads the state at its start and writes it at its end).

The lock is ``filelock``'s (an OS file lock on ``.kopt-step.lock``: a step that dies releases it with its
process), tried without waiting; its holder's pid and step are recorded beside it (``.kopt-step.json``) so the
refused step can name them.
"""

from __future__ import annotations

import datetime as _dt
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..artifacts import read_dict, write_json
from .layout import RunLayout
from .schema import loop_error


@dataclass(frozen=True, slots=True)
class StepLock:
    """The lock of one run directory, held by this process until :meth:`release`."""

    layout: RunLayout
    lock: Any

    def release(self) -> None:
        """Release the lock and forget the holder. A run folder left with nothing but the lock (a ``--kopt-init``
        whose session stopped before its state was written) is removed."""
        try:
            self.layout.lock_holder.unlink(missing_ok=True)
        finally:
            self.lock.release()
        if not self.layout.state.exists():
            try:
                self.layout.lock.unlink(missing_ok=True)
                self.layout.root.rmdir()  # only when empty
            except OSError:
                pass


def hold(run_dir: Path, mode: str) -> StepLock:
    """Take ``run_dir``'s lock for a ``mode`` step (``init`` or ``run``) without waiting. Raises the loop's
    ConfigError (exit 4) naming the holder's pid, its step and the lock file when another step holds it, or when
    the run folder cannot hold a lock file."""
    import filelock

    layout = RunLayout.of(run_dir)
    if not layout.root.is_dir():
        raise loop_error(f"{run_dir} is not a folder", [f"{run_dir}: no such folder"], path=run_dir,
                         fix="pass a run_YYYYMMDD_HHMMSS folder made by --kopt-init")
    if layout.lock.is_symlink():
        raise loop_error(f"{layout.lock} is a symbolic link", [f"{layout.lock}: the lock file must be a plain file"],
                         path=layout.lock, fix=f"delete {layout.lock} (no step is running when you do)")
    lock = filelock.FileLock(str(layout.lock), timeout=0)
    try:
        lock.acquire(blocking=False)
    except filelock.Timeout:
        holder = read_dict(layout.lock_holder) or {}
        pid = holder.get("pid", "unknown")
        since = f" since {holder['started']}" if holder.get("started") else ""
        step = f"--kopt-{holder['mode']}" if holder.get("mode") in ("init", "run") else "a loop step"
        raise loop_error(f"{run_dir} is being worked on by another loop step",
                         [f"{step} of pid {pid}{since} holds the lock {layout.lock}"],
                         fix=f"wait for that step to end (or end it: kill {pid}), then run this command again; "
                             "two steps on one run would overwrite each other's state") from None
    except OSError as exc:
        raise loop_error(f"{run_dir} cannot be locked", [f"{layout.lock}: {exc}"], path=layout.lock,
                         fix="run the step where the run directory is writable") from None
    write_json(layout.lock_holder, {"pid": os.getpid(), "mode": mode, "argv": sys.argv[1:],
                                    "started": _dt.datetime.now().isoformat(timespec="seconds")})
    return StepLock(layout, lock)


def holder(run_dir: Path) -> dict[str, Any]:
    """The recorded holder of ``run_dir``'s lock (``pid``, ``mode``, ``argv``, ``started``), {} when none is."""
    doc = read_dict(RunLayout.of(run_dir).lock_holder)
    return doc if doc is not None else {}


__all__ = ["StepLock", "hold", "holder"]

"""Process trees on Linux: every descendant of a harness process, frozen (SIGSTOP) to a fixpoint and killed.

A kernel may start threads, children and ``setsid()`` daemons; the harness process is their subreaper
(``PR_SET_CHILD_SUBREAPER``), so whatever they fork stays below it, where these walks find it.
"""

from __future__ import annotations

import os
import signal

#: Linux with CONFIG_PROC_CHILDREN: ``/proc/<pid>/task/<tid>/children`` lists a thread's children
_HAS_CHILDREN_FILES = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


def _children(pid: int) -> list[int]:
    """The children of every thread of ``pid`` ([] when it is gone)."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                out.extend(int(x) for x in f.read().split())
        except OSError:
            continue
    return out


def state(pid: int) -> bytes | None:
    """The state letter of ``pid`` in ``/proc/<pid>/stat`` (``R``, ``S``, ``T`` stopped, ``t`` traced, ``Z``
    zombie...); None when it is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3]


def is_zombie(pid: int) -> bool:
    """True when ``pid`` has exited and waits to be reaped (or is gone)."""
    return state(pid) in (None, b"Z", b"X")


def descendants(root: int, skip: set[int] | frozenset[int] = frozenset()) -> list[int]:
    """Pids of every descendant of ``root`` (Linux; [] elsewhere), leaving out (and not walking below) ``skip``:
    from each thread's ``children`` file, a walk of microseconds, fast enough to catch a process that forks its
    successor and exits every millisecond (:func:`freeze_tree`); else from the ``stat`` file of every
    process. Zombies not yet reaped are included."""
    if _HAS_CHILDREN_FILES:
        found: list[int] = []
        todo = [root]
        while todo:
            kids = [k for k in _children(todo.pop()) if k not in skip]
            found.extend(kids)
            todo.extend(kids)
        return found
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rfind(b")") + 2:].split()[1])  # the field after the state, past "(comm)"
        children.setdefault(ppid, []).append(int(name))
    out: list[int] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def freeze_tree(root: int, group: int | None = None) -> list[int]:
    """SIGSTOP every descendant of ``root`` (and, once, the process group ``group``) until a walk of the tree finds
    none that was not already stopped: a stopped process cannot fork, and one that forked and exited between two
    walks left its child below ``root`` when ``root`` is its subreaper (the harness is), where the next walk finds
    it. Zombies are noted once and not walked again, so a walk stays short however many a forking daemon leaves.
    Returns the live pids stopped; 1000 rounds bound the work."""
    stopped: list[int] = []
    seen: set[int] = set()
    dead: set[int] = set()
    for round_ in range(1000):
        new = [p for p in descendants(root, skip=dead) if p not in seen]
        if round_ and not new:
            break
        if group is not None and round_ == 0:
            try:
                os.killpg(group, signal.SIGSTOP)
            except (ProcessLookupError, PermissionError):
                pass
        for pid in new:
            try:
                os.kill(pid, signal.SIGSTOP)
            except (ProcessLookupError, PermissionError):
                pass
        seen.update(new)
        for pid in new:
            if is_zombie(pid):
                dead.add(pid)
            else:
                stopped.append(pid)
    return stopped


def resume(pids: list[int], group: int | None = None) -> None:
    """SIGCONT ``pids`` and (``group``) a process group; processes already gone are skipped."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGCONT)
        except (ProcessLookupError, PermissionError):
            pass
    if group is not None:
        try:
            os.killpg(group, signal.SIGCONT)
        except (ProcessLookupError, PermissionError):
            pass


def kill_tree(root: int, include_root: bool = True) -> None:
    """SIGKILL every descendant of ``root``, frozen first (:func:`freeze_tree`), and (``include_root``) ``root``'s
    process group."""
    for pid in freeze_tree(root, group=root if include_root else None):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    if include_root:
        try:
            os.killpg(root, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

"""Runs the harness (:mod:`pytest_kopt.harness`) in a fresh child process and maps how it ended to a gate error.

A crash (signal, abort, illegal memory access), a timeout or a Python error in the candidate fails only the item
that started the child; the pytest process stays clean of CUDA.
"""

from __future__ import annotations

import atexit
import hashlib
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .errors import CompileError, ContractError, KernelRuntimeError


def run_harness(req: dict[str, Any], *, gate: str, timeout_s: float, path: str, workdir: Path,
                prefix: list[str] | None = None, lock: Any = None, server: str | None = None) -> dict[str, Any]:
    """Run ``python -m pytest_kopt.harness`` on ``req`` and return its result dict (``ok`` is True).

    ``req["env"]`` (optional) adds environment variables; ``prefix`` wraps the command (e.g. ``ncu ...``). With
    ``server`` (an identity such as ``candidate:<kernel path>``) the request goes to a warm harness process kept for
    that identity and environment (see :class:`HarnessServer`); it is started, and torch imported, before ``lock``
    is taken, and a failed or timed-out request ends it. ``lock`` (a context manager, e.g. the per-GPU
    :class:`filelock.FileLock`) is held only while the request runs. ``<out>.npz`` stays on disk for the caller.
    Raises KernelRuntimeError (crash, CUDA error, timeout after ``timeout_s`` seconds), ContractError (the
    reference or ``setup`` broke its contract) or CompileError.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f"{gate}-", suffix=".req.json", dir=workdir)
    os.close(fd)
    out = name.removesuffix(".req.json")
    req = {**req, "out": out}
    Path(name).write_text(json.dumps(req))
    lock = lock if lock is not None else contextlib.nullcontext()
    if server is not None and not prefix:
        srv = _server_for(server, req.get("env") or {}, workdir, gate=gate, path=path)
        with lock:
            try:
                output, ended = srv.request(name, timeout_s)
            except BaseException:
                _drop(srv)
                raise
        if ended != "done":
            _drop(srv)  # ends its whole process group, whatever state it is in
            if ended == "timeout":
                raise _timeout_error(timeout_s, gate, path, output)
            if ended == "protocol":
                raise KernelRuntimeError("the harness process broke its protocol (an answer out of turn on its "
                                         "control pipe, or its log file removed)", gate=gate, path=path,
                                         details=_tail(output), fix="the kernel must not touch file descriptors "
                                         "it did not open; rerun with --kopt-fresh-process to compare")
            raise _died_error(srv.proc.returncode, gate, path, output)
        try:
            result = _result(out, output, gate, path, on_error=lambda: _drop(srv), attest=srv.attest)
            if srv.ending:
                _drop(srv)
            return result
        except (OSError, ValueError) as exc:  # result file missing or garbled: not a result this harness wrote
            _drop(srv)
            raise KernelRuntimeError(f"the harness's result file is missing or unreadable ({type(exc).__name__})",
                                     gate=gate, path=path, details=_tail(output),
                                     fix="the kernel must not touch files in the kopt work folder") from None
    env = _child_env(req.get("env") or {})
    # the attestation pipe; not under a wrapping tool (ncu, compute-sanitizer), which need not pass extra file
    # descriptors on to its target (those runs profile or check a candidate: nothing of theirs is trusted)
    ctl_r, ctl_w = os.pipe()
    attested = not prefix
    cmd = [*(prefix or []), *_python(env), name]
    cmd += ["--ctl", str(ctl_w)] if attested else []
    # its output goes to a file, not a pipe: a daemon the kernel left holding a pipe would keep it open forever
    fd, log = tempfile.mkstemp(prefix="fresh-", suffix=".log", dir=workdir)
    with lock, os.fdopen(ctl_r, "rb") as ctl, os.fdopen(fd, "wb") as sink:
        try:
            proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                    pass_fds=(ctl_w,) if attested else ())
        finally:
            os.close(ctl_w)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            # the child leads its own process group (ncu, compute-sanitizer and their targets): end all of it,
            # and whatever left the group below it
            kill_tree(proc.pid)
            proc.wait()
            raise _timeout_error(timeout_s, gate, path, _read_log(log)) from None
        except BaseException:
            kill_tree(proc.pid)  # Ctrl-C in pytest: leave no child running on the GPU
            raise
        _killpg(proc)  # what is left of its process group (the harness killed its own descendants at exit)
        os.set_blocking(ctl.fileno(), False)
        parts = (ctl.read() or b"").split()
    output = _read_log(log)
    if not Path(out + ".json").is_file():
        raise _died_error(proc.returncode, gate, path, output)
    if attested and (len(parts) != 4 or parts[0] != b"done"):
        raise KernelRuntimeError("the harness process ended without its attestation on the control pipe",
                                 gate=gate, path=path, details=_tail(output),
                                 fix="the kernel must not touch file descriptors it did not open")
    return _result(out, output, gate, path, attest=parts[3].decode() if attested else None)


_BOOT = ("import json, runpy, sys; sys.path.extend(json.loads(sys.argv.pop(1))); "
         "runpy.run_module('pytest_kopt.harness', run_name='__main__', alter_sys=True)")


def _python(env: dict[str, str]) -> list[str]:
    """How a harness process starts: -P keeps pytest's working directory (where a candidate can write, say, a
    ``statistics.py``) off the front of ``sys.path``, -s keeps the user's site-packages out, and PYTHONPATH's
    entries (taken out of ``env``) and pytest_kopt's own folder are *appended* to ``sys.path``, after the
    standard library and site-packages, so nothing there can shadow them."""
    extra = [p for p in env.pop("PYTHONPATH", "").split(os.pathsep) if p]
    extra.append(str(Path(__file__).resolve().parent.parent))
    return [sys.executable, "-P", "-s", "-c", _BOOT, json.dumps(extra)]


def _child_env(extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    # the gates decide where Triton's interpreter runs (CPU correctness only): a TRITON_INTERPRET=1 left in the
    # user's shell would make the compile and SASS gates find no compiled kernel, and GPU correctness interpret
    env.pop("TRITON_INTERPRET", None)
    env.update(extra)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _read_log(log: str, limit: int = 65536) -> str:
    """The last ``limit`` bytes of a fresh process's output file, which is then removed."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - limit))
            text = f.read().decode(errors="replace").strip()
        os.unlink(log)
    except OSError:
        return ""
    return text


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
            if _is_zombie(pid):
                dead.add(pid)
            else:
                stopped.append(pid)
    return stopped


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


def _killpg(proc: subprocess.Popen[Any]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _timeout_error(timeout_s: float, gate: str, path: str, output: str) -> KernelRuntimeError:
    return KernelRuntimeError(f"timed out after {timeout_s:g} s", gate=gate, path=path, status="TIMEOUT",
                              details=_tail(output), fix="look for an infinite loop or a deadlock; raise "
                                                         "--kopt-timeout if the kernel is simply slow")


def _died_error(returncode: int | None, gate: str, path: str, output: str) -> KernelRuntimeError:
    how = f"exit code {returncode}"
    if returncode is not None and returncode < 0:
        try:
            how = f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            how = f"killed by signal {-returncode}"
    return KernelRuntimeError(f"the child process died ({how}) before reporting", gate=gate, path=path,
                              details=_tail(output), fix="run the kernel under compute-sanitizer to find the fault")


def _result(out: str, output: str, gate: str, path: str, on_error: Any = None,
            attest: str | None = None) -> dict[str, Any]:
    """The request's result, read once and, when ``attest`` is given, checked against the SHA-256 its process sent
    on the private control pipe (another process could have rewritten the file in the work folder in between);
    its ``npz_sha`` (the reference's modes) is then as trustworthy as the rest, for
    :func:`pytest_kopt.gates.read_verified`. Raises KernelRuntimeError (TAMPERED) on a mismatch, the error the
    harness reported otherwise."""
    data = Path(out + ".json").read_bytes()
    if attest is not None and hashlib.sha256(data).hexdigest() != attest:
        if on_error is not None:
            on_error()
        raise KernelRuntimeError("the harness's result file changed after its process wrote it (another process "
                                 "writes into the kopt work folder)", gate=gate, path=path, status="TAMPERED",
                                 details=_tail(output), fix="a kernel (or what it left running) must not touch "
                                 "files in the kopt work folder")
    result: dict[str, Any] = json.loads(data)
    result["stdout"] = _tail(output, 4000)
    result["out"] = out
    if result.get("ok"):
        return result
    if on_error is not None:
        on_error()
    category, message = result.get("category"), result.get("message", "")
    details = _tail(result.get("traceback", ""), 3000)
    if category == "contract":
        raise ContractError(message, gate=gate, path=path, details=details,
                            fix="make the reference/setup follow the contract in the README")
    if category == "compile":
        raise CompileError(message, gate=gate, path=path, details=details, fix="fix the Triton compile error")
    raise KernelRuntimeError(message, gate=gate, path=path, details=details,
                             fix="the kernel raised an error at run time; see the message above")


# ------------------------------------------------------------------------------------------ warm servers

#: How many warm harness processes one pytest process keeps (least recently used ones are ended). Under xdist's
#: loadscope a worker runs one kernel's gates in a row, so one candidate and one reference process cover it.
MAX_SERVERS = 3
#: Seconds a new harness process may take to import torch and report ready.
READY_TIMEOUT_S = 180.0

_POOL: dict[tuple[str, tuple[tuple[str, str], ...]], "HarnessServer"] = {}
#: processes :func:`prestart` started that no request has used yet
_STARTING: dict[tuple[str, tuple[tuple[str, str], ...]], "HarnessServer"] = {}


class HarnessServer:
    """A warm ``python -m pytest_kopt.harness --serve`` process: torch imported once, its CUDA context created on
    the first request and kept, requests run one at a time. Requests are paths written to its stdin; it answers
    ``done`` on a private pipe (the kernel's own prints cannot fake it), its stdout and stderr go to a log file
    read back per request. It serves one identity (one candidate kernel, or one reference file), so a candidate
    never shares a process with the reference or with another candidate; a request that fails, crashes or times
    out ends it (a CUDA error can leave the context unusable) and the next request starts a fresh one."""

    def __init__(self, key: tuple[str, tuple[tuple[str, str], ...]], workdir: Path) -> None:
        self.key = key
        fd, log = tempfile.mkstemp(prefix="server-", suffix=".log", dir=workdir)
        os.close(fd)
        self.log = Path(log)
        ctl_r, ctl_w = os.pipe()
        with open(self.log, "ab") as sink:
            env = _child_env(dict(key[1]))
            self.proc = subprocess.Popen([*_python(env), "--serve", str(ctl_w)],
                                         stdin=subprocess.PIPE, stdout=sink, stderr=subprocess.STDOUT,
                                         env=env, pass_fds=(ctl_w,), start_new_session=True)
        os.close(ctl_w)
        self.ctl = os.fdopen(ctl_r, "rb", buffering=0)
        self.log_fd = os.open(self.log, os.O_RDONLY)  # kept open: the log stays readable even if it is unlinked
        self.buf = b""
        self.seq = 0
        self.stopped: list[int] | None = None  # the descendants stopped by pause(), None while running
        #: SHA-256 of the last request's result JSON, from the control pipe
        self.attest = ""
        self.ending = False

    def pause(self) -> None:
        """SIGSTOP the process group and every descendant between requests (:func:`freeze_tree`): a thread or child
        the kernel left behind cannot run while another kernel or the reference is judged or timed."""
        self.stopped = freeze_tree(self.proc.pid, self.proc.pid)  # a stopped tree cannot grow: resume() reuses it

    def resume(self) -> None:
        """SIGCONT the process group and what :meth:`pause` stopped."""
        if self.stopped is None:
            return
        for pid in self.stopped:
            try:
                os.kill(pid, signal.SIGCONT)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGCONT)
        except (ProcessLookupError, PermissionError):
            pass
        self.stopped = None

    def _line(self, timeout_s: float) -> bytes | None:
        """The next control line; None on timeout; b"" when the process closed the pipe (it ended) or wrote more
        than 4 KB without a newline (not this harness)."""
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self.buf:
            if len(self.buf) > 4096:
                return b""
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self.ctl], [], [], left)
            if not ready:
                continue
            chunk = self.ctl.read(4096)
            if not chunk:
                return b""
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line

    def wait_ready(self) -> str:
        """``ready``, ``timeout`` or ``died``."""
        line = self._line(READY_TIMEOUT_S)
        return "timeout" if line is None else "ready" if line == b"ready" else "died"

    def request(self, req_path: str, timeout_s: float) -> tuple[str, str]:
        """Run one request; returns (the tail of its part of the log, ``done`` | ``timeout`` | ``died`` |
        ``protocol``). Each request carries a sequence number that its ``done`` line must repeat."""
        start = self._log_size()
        self.seq += 1
        self.resume()
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(f"{self.seq} {req_path}\n".encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return self.output(start), "died"
        line = self._line(timeout_s)
        if line is None:
            return self.output(start), "timeout"
        if line == b"":
            # end of the control pipe: the process died (give the kernel a moment to reap it), or closed the pipe
            try:
                self.proc.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                return self.output(start), "protocol"
            return self.output(start), "died"
        parts = line.split()
        if len(parts) != 4 or parts[0] != b"done" or parts[1] != str(self.seq).encode() or self.buf:
            return self.output(start), "protocol"
        self.attest = parts[3].decode()
        self.ending = parts[2] != b"0"  # the process ends after this answer (a failed request)
        self.pause()
        return self.output(start), "done"

    def _log_size(self) -> int:
        return os.fstat(self.log_fd).st_size

    def output(self, start: int, limit: int = 65536) -> str:
        """The log from byte ``start`` (at most its last ``limit`` bytes)."""
        end = self._log_size()
        data = os.pread(self.log_fd, min(limit, max(0, end - start)), max(start, end - limit))
        return data.decode(errors="replace").strip()

    def close(self, kill: bool = False) -> None:
        """End the process (close its stdin and wait briefly, else kill), then kill whatever is left of its
        process group (children or daemons the kernel started)."""
        # the kernel's processes first, while the harness is still their subreaper (at its exit they would go to
        # init): frozen to a fixpoint, then killed
        if self.proc.poll() is None:
            kill_tree(self.proc.pid, include_root=False)
        self.resume()
        if not kill and self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                pass
        kill_tree(self.proc.pid)  # what is left: the harness, if it did not end, and its process group
        self.proc.wait()
        for f in (self.ctl, self.proc.stdin):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass
        os.close(self.log_fd)
        self.log.unlink(missing_ok=True)


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


def _is_zombie(pid: int) -> bool:
    """True when ``pid`` has exited and waits to be reaped (or is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return True
    return stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3] in (b"Z", b"X")


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


def _server_for(identity: str, env: dict[str, str], workdir: Path, *, gate: str, path: str) -> HarnessServer:
    key = (identity, tuple(sorted(env.items())))
    srv = _POOL.pop(key, None)
    if srv is not None and srv.proc.poll() is not None:
        # it was paused and idle: only another process (a kernel, or what it left running) can have ended it, and
        # a silent restart would let whatever that process planted load into the new one
        code = srv.proc.returncode
        srv.close()
        raise KernelRuntimeError(f"the warm process of {identity.split(':', 1)[0]} {path} ended between requests "
                                 f"({'killed by signal ' + str(-code) if code < 0 else 'exit ' + str(code)})",
                                 gate=gate, path=path, status="TAMPERED",
                                 fix="a kernel (or a process it left running) killed it; run the kernels in "
                                     "separate sessions to see which one (the next request starts a fresh one)")
    if srv is None:
        while len(_POOL) >= MAX_SERVERS:
            _POOL.pop(next(iter(_POOL))).close()
        if not _POOL:
            atexit.register(shutdown_servers)
        srv = _STARTING.pop(key, None) or HarnessServer(key, workdir)
        state = srv.wait_ready()
        if state != "ready":
            output = srv.output(0)
            srv.close(kill=True)
            if state == "timeout":
                raise KernelRuntimeError(f"the harness process did not start within {READY_TIMEOUT_S:g} s", gate=gate,
                                         path=path, details=_tail(output), fix="check that torch imports in this "
                                         "Python (python3 -c 'import torch')")
            raise _died_error(srv.proc.returncode, gate, path, output)
    _POOL[key] = srv  # most recently used last
    return srv


def prestart(identity: str | None, env: dict[str, str], workdir: Path) -> None:
    """Start the warm process of ``identity`` (with ``env``) now, without waiting for it, so its start (a Python
    process importing torch: seconds) overlaps other work; the first request to it waits for it as usual. Used to
    start the reference's process while the candidate's first correctness request runs. A no-op for None (fresh
    processes) or when that process is already running or starting."""
    if identity is None:
        return
    key = (identity, tuple(sorted(env.items())))
    if key in _POOL or key in _STARTING:
        return
    workdir.mkdir(parents=True, exist_ok=True)
    if not _POOL and not _STARTING:
        atexit.register(shutdown_servers)
    _STARTING[key] = HarnessServer(key, workdir)


def _drop(srv: HarnessServer) -> None:
    _POOL.pop(srv.key, None)
    srv.close(kill=True)


def shutdown_servers() -> None:
    """End every warm harness process of this pytest process (at session end, and at exit)."""
    while _POOL:
        _POOL.popitem()[1].close()
    while _STARTING:
        _STARTING.popitem()[1].close(kill=True)


def _tail(text: str, limit: int = 2000) -> str:
    return text if len(text) <= limit else "...\n" + text[-limit:]

"""Warm harness processes: one per candidate kernel and one per reference file, kept by a :class:`HarnessPool`.

The pool is an object of the pytest process (the plugin keeps it in ``config.stash`` and hands it to the gates
through their context), never a module global: an in-process pytest run (pytester's ``runpytest``) gets its own.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import select
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from ..errors import KernelRuntimeError
from .forkserver import ForkedProcess, ForkServer, start
from .forkserver import supported as forks_supported
from .runner import died_error, read_result, run_fresh, tail, timeout_error, write_request
from ..child.tree import freeze_tree, kill_tree, resume

#: How many warm harness processes one pytest process keeps (least recently used ones are ended). Under xdist's
#: loadscope a worker runs one kernel's gates in a row, so the kernel's processes (two, or one where its checks run
#: in its timing process) and the reference's two cover it (:meth:`pytest_kopt.gates.context.Context.server`).
MAX_SERVERS = 4
#: The roles whose processes time (and so warm CUPTI up while idle); the others are started with ``--no-profiler``.
PROFILED_ROLES = ("candidate", "reference")
#: The roles whose processes run the reference (never stopped between requests: nothing of a kernel runs there).
REFERENCE_ROLES = ("judge", "reference")
#: Seconds a new harness process may take to import torch and report ready.
READY_TIMEOUT_S = 180.0

Key = tuple[str, tuple[tuple[str, str], ...]]


class HarnessServer:
    """A warm ``python -m pytest_kopt.child --serve`` process: torch imported once, its CUDA context created on the
    first request and kept, requests run one at a time. Requests are paths written to its stdin; it answers
    ``done`` on a private pipe (the kernel's own prints cannot fake it), its stdout and stderr go to a log file
    read back per request. It serves one identity (one candidate kernel, or one reference file), so a candidate
    never shares a process with the reference or with another candidate; a request that fails, crashes or times
    out ends it (a CUDA error can leave the context unusable) and the next request starts a fresh one."""

    def __init__(self, key: Key, workdir: Path, forks: ForkServer | None = None) -> None:
        self.key = key
        workdir.mkdir(parents=True, exist_ok=True)
        fd, log = tempfile.mkstemp(prefix="server-", suffix=".log", dir=workdir)
        self.log = Path(log)
        ctl_r, ctl_w = os.pipe()
        stdin_r, stdin_w = os.pipe()
        role = key[0].split(":", 1)[0]
        flags = (() if role in PROFILED_ROLES else ("--no-profiler",)) + (
            ("--reference",) if role in REFERENCE_ROLES else ())
        try:
            #: a forked process (:mod:`pytest_kopt.proc.forkserver`) where the pool has a fork server, else a Popen
            self.proc = start(forks, lambda ctl: ["--serve", str(ctl), *flags], dict(key[1]), stdin_r, fd, ctl_w)
        except BaseException:
            for f in (ctl_r, stdin_w):
                os.close(f)
            raise
        finally:
            for f in (fd, ctl_w, stdin_r):
                os.close(f)
        self.stdin = os.fdopen(stdin_w, "wb")
        self.ctl = os.fdopen(ctl_r, "rb", buffering=0)
        self.log_fd = os.open(self.log, os.O_RDONLY)  # kept open: the log stays readable even if it is unlinked
        self.buf = b""
        self.seq = 0
        self.stopped: list[int] | None = None  # the descendants stopped by pause(), None while running
        #: SHA-256 of the last request's result JSON, from the control pipe
        self.attest = ""
        self.ending = False
        #: a candidate's process is stopped between requests (what the kernel left running must not run beside
        #: another kernel or the reference); the reference's keeps running, so its own start-up work (CUPTI's first
        #: session, ~4 s) goes on while the pytest process waits for other processes
        self.pausing = key[0].split(":", 1)[0] not in REFERENCE_ROLES

    def pause(self) -> None:
        """SIGSTOP the process group and every descendant between requests (:func:`freeze_tree`): a thread or child
        the kernel left behind cannot run while another kernel or the reference is judged or timed."""
        self.stopped = freeze_tree(self.proc.pid, self.proc.pid)  # a stopped tree cannot grow: resume() reuses it

    def resume(self) -> None:
        """SIGCONT the process group and what :meth:`pause` stopped."""
        if self.stopped is None:
            return
        resume(self.stopped, group=self.proc.pid)
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
        if isinstance(self.proc, ForkedProcess):
            self.proc.resolve()  # until the fork is answered this process holds a write end of the control pipe
        line = self._line(READY_TIMEOUT_S)
        return "timeout" if line is None else "ready" if line == b"ready" else "died"

    def request(self, req_path: str, timeout_s: float) -> tuple[str, str]:
        """Run one request; returns (the tail of its part of the log, ``done`` | ``timeout`` | ``died`` |
        ``protocol``). Each request carries a sequence number that its ``done`` line must repeat."""
        start = self._log_size()
        self.seq += 1
        self.resume()
        try:
            self.stdin.write(f"{self.seq} {req_path}\n".encode())
            self.stdin.flush()
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
        if self.pausing:
            self.pause()
        return self.output(start), "done"

    def _log_size(self) -> int:
        return os.fstat(self.log_fd).st_size

    def output(self, start: int, limit: int = 65536) -> str:
        """The log from byte ``start`` (at most its last ``limit`` bytes)."""
        end = self._log_size()
        data = os.pread(self.log_fd, min(limit, max(0, end - start)), max(start, end - limit))
        return data.decode(errors="replace").strip()

    def begin_close(self) -> None:
        """Ask the process to end without waiting: kill what the kernel started below it (while the harness is
        still their subreaper: at its exit they would go to init), let it run, close its stdin (its request loop
        ends). :meth:`close` then waits for it; a pool ending several asks them all first, so they tear their
        CUDA contexts down side by side rather than one after another."""
        if self.proc.poll() is None:
            kill_tree(self.proc.pid, include_root=False)
        self.resume()
        try:
            self.stdin.close()
        except OSError:
            pass

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
                if not self.stdin.closed:
                    self.stdin.close()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                pass
        kill_tree(self.proc.pid)  # what is left: the harness, if it did not end, and its process group
        self.proc.wait()
        for f in (self.ctl, self.stdin):
            try:
                f.close()
            except OSError:
                pass
        os.close(self.log_fd)
        self.log.unlink(missing_ok=True)


class HarnessPool:
    """The harness processes of one pytest process: :meth:`run` sends a request to the warm process of its
    identity (started on first use, or by :meth:`prestart`) or to a fresh process; :meth:`shutdown` ends them all
    (at session end, and at exit). At most ``max_servers`` warm processes live at once, least recently used ended
    first."""

    def __init__(self, max_servers: int = MAX_SERVERS, fork_server: bool = True) -> None:
        self.max_servers = max_servers
        #: start warm processes from a fork server (:mod:`pytest_kopt.proc.forkserver`) where the platform has one;
        #: False: each a new Python (``--kopt-no-fork-server``)
        self.fork_server = fork_server
        self.forks: ForkServer | None = None
        self.live: dict[Key, HarnessServer] = {}
        #: processes :meth:`prestart` started that no request has used yet
        self.starting: dict[Key, HarnessServer] = {}
        #: the kernels (a role's target) whose processes were started ahead of their first request (:meth:`prestart`
        #: with ``ahead``): another kernel's start leaves them running
        self.ahead_targets: set[str] = set()
        self._atexit = False
        #: samples taken per timing round key (``<measurement>-<party>``): the progress line reads them
        self.round_samples: dict[str, int] = {}

    def run(self, req: dict[str, Any], *, gate: str, timeout_s: float, path: str, workdir: Path,
            prefix: list[str] | None = None, lock: Any = None, server: str | None = None,
            timeout_hint: str | None = None) -> dict[str, Any]:
        """Run ``req`` and return its result dict (``ok`` is True); see :func:`pytest_kopt.proc.runner.run_fresh`
        for the arguments and errors. With ``server`` (an identity such as ``candidate:<kernel path>``) and no
        ``prefix`` the request goes to that identity's warm process (for the request's environment), started, and
        torch imported, before ``lock`` is taken; a failed or timed-out request ends it. A warm process that ended
        while paused between requests is TAMPERED (only another process can have killed it), never restarted
        quietly."""
        if server is None or prefix:
            return run_fresh(req, gate=gate, timeout_s=timeout_s, path=path, workdir=workdir, prefix=prefix,
                             lock=lock, timeout_hint=timeout_hint)
        name, req = write_request(req, gate, workdir)
        srv = self._server(server, req.get("env") or {}, workdir, gate=gate, path=path)
        with lock if lock is not None else contextlib.nullcontext():
            try:
                output, ended = srv.request(name, timeout_s)
            except BaseException:
                self._drop(srv)
                raise
        if ended != "done":
            self._drop(srv)  # ends its whole process group, whatever state it is in
            if ended == "timeout":
                raise timeout_error(timeout_s, gate, path, output, timeout_hint, req.get("smaller_dims"))
            if ended == "protocol":
                raise KernelRuntimeError("the harness process broke its protocol (an answer out of turn on its "
                                         "control pipe, or its log file removed)", gate=gate, path=path,
                                         details=tail(output), fix="the kernel must not touch file descriptors "
                                         "it did not open; rerun with --kopt-fresh-process to compare")
            raise self._died(srv, gate, path, output)
        try:
            result = read_result(req["out"], output, gate, path, on_error=lambda: self._drop(srv),
                                 attest=srv.attest)
        except (OSError, ValueError) as exc:  # result file missing or garbled: not a result this harness wrote
            self._drop(srv)
            raise KernelRuntimeError(f"the harness's result file is missing or unreadable ({type(exc).__name__})",
                                     gate=gate, path=path, details=tail(output),
                                     fix="the kernel must not touch files in the kopt work folder") from None
        if srv.ending:
            self._drop(srv)
        rnd = req.get("round") or {}
        if rnd.get("key") and not rnd.get("final"):  # a timing round: its samples, for the progress line
            self.round_samples[rnd["key"]] = self.round_samples.get(rnd["key"], 0) + int(rnd.get("count") or 0)
        return result

    def timing_samples(self) -> int | None:
        """The samples the first party (the candidate) of this process's timing rounds has taken since
        :attr:`round_samples` was last cleared (a round's samples count once it returns); None when none ran."""
        first = [n for key, n in self.round_samples.items() if key.endswith("-0")]
        return sum(first) if first else None

    def prestart(self, identity: str | None, env: dict[str, str], workdir: Path, ahead: bool = False) -> None:
        """Start the warm process of ``identity`` (with ``env``) now, without waiting for it, so its start (a Python
        process importing torch: seconds) overlaps other work; the first request to it waits for it as usual. A
        no-op for None (fresh processes) or when that process is already running or starting. A kernel's process
        ends the other kernels' processes that were started and never used (their kernel failed before them), but
        those of kernels started ``ahead``: the kernel a worker runs next, whose processes start while the current
        kernel's items run, and the kernels a loop's close may re-time side by side. An ``ahead`` start ends
        nothing; a kernel's own start later makes it an ordinary one."""
        if identity is None:
            return
        key = (identity, tuple(sorted(env.items())))
        role, _, target = identity.partition(":")
        if role not in REFERENCE_ROLES:
            if ahead:
                self.ahead_targets.add(target)
            else:
                self.ahead_targets.discard(target)
                keep = {target, *self.ahead_targets}
                # another kernel's processes that no request used (it failed before them)
                for other in [k for k in self.starting if k[0].partition(":")[0] not in REFERENCE_ROLES
                              and k[0].partition(":")[2] not in keep]:
                    self.starting.pop(other).close(kill=True)
        if key in self.live or key in self.starting:
            return
        self._register_atexit()
        self.starting[key] = HarnessServer(key, workdir, self._fork_server(workdir))

    def end_ahead(self, target: str) -> None:
        """End the processes of ``target`` (a kernel) started ahead that no request used (another worker took the
        kernel), and keep it no longer."""
        self.ahead_targets.discard(target)
        for key in [k for k in self.starting if k[0].partition(":")[2] == target
                    and k[0].partition(":")[0] not in REFERENCE_ROLES]:
            self.starting.pop(key).close(kill=True)

    def served(self, identity: str | None, env: dict[str, str]) -> bool:
        """True when the warm process of ``identity`` (with ``env``) is running and has answered a request."""
        srv = self.live.get((identity, tuple(sorted(env.items())))) if identity else None
        return srv is not None and srv.seq > 0 and srv.proc.poll() is None

    def pids(self, identity: str | None, env: dict[str, str]) -> list[int]:
        """The pids of the warm process of ``identity`` (with ``env``) and of what it started (those
        :meth:`HarnessServer.pause` stopped); [] when it is not running."""
        srv = self.live.get((identity, tuple(sorted(env.items())))) if identity else None
        if srv is None or srv.proc.poll() is not None:
            return []
        return sorted({srv.proc.pid, *(srv.stopped or [])})

    def end(self, identity: str | None, env: dict[str, str]) -> None:
        """End the warm process of ``identity`` (with ``env``) now, if it runs (a candidate whose process holds
        leaked device memory); the next request to it starts a fresh one."""
        srv = self.live.get((identity, tuple(sorted(env.items())))) if identity else None
        if srv is not None:
            self._drop(srv)

    def shutdown(self) -> None:
        """End every harness process of this pool (the warm ones asked first, then each waited for)."""
        for srv in self.live.values():
            srv.begin_close()
        while self.live:
            self.live.popitem()[1].close()
        while self.starting:
            self.starting.popitem()[1].close(kill=True)
        if self.forks is not None:  # after its children: each one's exit code is reaped through it
            self.forks.close()
            self.forks = None

    def _died(self, srv: HarnessServer, gate: str, path: str, output: str) -> KernelRuntimeError:
        """The error of ``srv``'s process ending before it answered (:func:`~pytest_kopt.proc.runner.died_error`),
        saying so when it died with its fork server: whoever killed that, it was not this request's kernel alone."""
        err = died_error(srv.proc.returncode, gate, path, output)
        note = self._server_died(srv)
        if note:
            err.message += f"; {note}"
            err.fix = ("a kernel of this session (or a process it left running) killed kopt's fork server, and every "
                       "harness process forked from it died with it; run the kernels in separate sessions to see "
                       "which, or rerun with --kopt-no-fork-server")
        return err

    def _server_died(self, srv: HarnessServer) -> str | None:
        """Why ``srv``'s process ended with its fork server, when it was forked and that server has ended (its
        children die with it: ``PR_SET_PDEATHSIG``), else None."""
        server = self.forks.proc if self.forks is not None and isinstance(srv.proc, ForkedProcess) else None
        if server is None or not srv.proc.forked or server.poll() is None:
            return None
        how = f"exit {server.returncode}" if server.returncode is not None else "its exit code is its parent's"
        return (f"the fork server it came from ended first ({how}): killed by another process or by the "
                "out-of-memory killer")

    def _fork_server(self, workdir: Path) -> ForkServer | None:
        """This pool's fork server, started on first use (its torch import then overlaps the pytest process's
        work); None where it is turned off or the platform lacks what it needs."""
        if self.forks is not None and self.forks.given_up:  # the session's refused this worker: its own instead
            self.forks.close()
            self.forks = None
        if self.forks is None and self.fork_server and forks_supported():
            self.forks = ForkServer(workdir)
        return self.forks

    def share_fork_server(self, workdir: Path, workers: int) -> dict[str, Any] | None:
        """An xdist controller's pool, at its configure: start its fork server now, listening for ``workers``
        local workers to attach (:class:`~pytest_kopt.proc.forkserver.ForkServer`), and return what each needs
        (JSON, for ``workerinput``); None where the pool starts no fork server, or it has one already."""
        if workers <= 0 or self.forks is not None or not self.fork_server or not forks_supported():
            return None
        self.forks = ForkServer(workdir, workers=workers)
        return self.forks.shared  # None where its socket could not be made

    def attach_fork_server(self, shared: dict[str, Any] | None) -> bool:
        """An xdist worker's pool, at its configure: its fork server is the controller's, attached to now
        (:meth:`~pytest_kopt.proc.forkserver.ForkServer.attach`); False where it cannot be (the pool then starts its
        own on first use)."""
        if self.forks is not None or not self.fork_server or not forks_supported():
            return False
        self.forks = ForkServer.attach(shared)
        return self.forks is not None

    def _register_atexit(self) -> None:
        if not self._atexit:
            atexit.register(self.shutdown)
            self._atexit = True

    def _server(self, identity: str, env: dict[str, str], workdir: Path, *, gate: str, path: str) -> HarnessServer:
        key = (identity, tuple(sorted(env.items())))
        srv = self.live.pop(key, None)
        if srv is not None and srv.proc.poll() is not None:
            # it was paused and idle: only another process (a kernel, or what it left running) can have ended it,
            # and a silent restart would let whatever that process planted load into the new one
            code = srv.proc.returncode
            srv.close()
            how = "killed by signal " + str(-code) if code is not None and code < 0 else f"exit {code}"
            note = self._server_died(srv)
            if note:
                how += f"; {note}"
            raise KernelRuntimeError(f"the warm process of {identity.split(':', 1)[0]} {path} ended between requests "
                                     f"({how})",
                                     gate=gate, path=path, status="TAMPERED",
                                     fix="a kernel (or a process it left running) killed it; run the kernels in "
                                         "separate sessions to see which one (the next request starts a fresh one)")
        if srv is None:
            while len(self.live) >= self.max_servers:
                self.live.pop(next(iter(self.live))).close()
            self._register_atexit()
            srv = self.starting.pop(key, None) or HarnessServer(key, workdir, self._fork_server(workdir))
            state = srv.wait_ready()
            if state != "ready":
                output = srv.output(0)
                srv.close(kill=True)
                if state == "timeout":
                    raise KernelRuntimeError(f"the harness process did not start within {READY_TIMEOUT_S:g} s",
                                             gate=gate, path=path, details=tail(output),
                                             fix="check that torch imports in this Python (python3 -c 'import torch')")
                raise self._died(srv, gate, path, output)
        self.live[key] = srv  # most recently used last
        return srv

    def _drop(self, srv: HarnessServer) -> None:
        self.live.pop(srv.key, None)
        srv.close(kill=True)

"""The pytest process's end of the fork server (:mod:`pytest_kopt.child.forkserver`): warm harness processes forked
from one process that imported torch once, instead of each started as a new Python that imports it.

A :class:`ForkServer` belongs to one :class:`pytest_kopt.proc.pool.HarnessPool` (one per pytest process); its
processes are :class:`ForkedProcess` objects with the part of :class:`subprocess.Popen`'s interface the pool uses
(``pid``, ``stdin``, ``poll``, ``wait``, ``returncode``). A spawn is sent at once and answered later, so a
prestart does not wait for the server's own torch import; where the server cannot fork a process (it died, it is
gone, or the process's environment differs in a variable read at import) the process is started the ordinary way,
with the same descriptors.

Under pytest-xdist the controller's server is the session's (``ForkServer(workdir, workers=N)``): each local worker
attaches to it (:meth:`ForkServer.attach`, with what :attr:`ForkServer.shared` hands it through ``workerinput``) and
is served by a copy of it forked for that worker, so torch is imported once for the session, not once per worker.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any, Callable

from ..child.forkserver import AFTER_FORK_ENV, MAX_MESSAGE, WORKER_ENV, refused
from ..child.tree import state
from .runner import harness_start

#: The descriptor number of a forked harness process's control pipe.
CTL_FD = 3
#: Seconds the server may take to answer a spawn (its own start imports torch: seconds; 17 s seen on a loaded host).
ANSWER_TIMEOUT_S = 180.0
#: Seconds it may take once it has answered one (a fork: milliseconds).
ANSWERED_TIMEOUT_S = 30.0
#: Seconds a worker may take to connect to the session's server and send its attach request (a queue of
#: connections that are no worker's: it starts a server of its own instead).
ATTACH_CONNECT_S = 2.0


def _stopped(pid: int | None) -> bool:
    """True when ``pid`` is stopped (SIGSTOP, or a tracer's stop): it answers nothing until someone resumes it."""
    return pid is not None and state(pid) in (b"T", b"t")


def supported() -> bool:
    """True where processes can be forked and awaited as this module does: Linux with ``pidfd_open`` (5.3+)."""
    if not sys.platform.startswith("linux") or not hasattr(os, "pidfd_open"):
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        return False
    return True


def start(server: "ForkServer | None", argv_for: Callable[[int], list[str]], extra_env: dict[str, str], stdin: int,
          log: int, ctl: int) -> "ForkedProcess | subprocess.Popen":
    """Start the harness process ``python -m pytest_kopt.child ARGV`` (``argv_for(n)``: its arguments when its
    control pipe is descriptor ``n``) with its environment from :func:`~pytest_kopt.proc.runner.harness_start` of
    ``extra_env``, in its own session, its stdin, its stdout and stderr (``log``) and its control pipe the given
    descriptors of this process (the caller closes them after this call): forked by ``server`` where there is one,
    else a new Python."""
    if server is not None:
        return server.spawn(argv_for, extra_env, stdin, log, ctl)
    return popen(argv_for, extra_env, stdin, log, ctl)


def popen(argv_for: Callable[[int], list[str]], extra_env: dict[str, str], stdin: int, log: int,
          ctl: int) -> subprocess.Popen:
    """:func:`start` without a fork server: a new Python process."""
    env, _, command = harness_start(extra_env)
    return subprocess.Popen([*command, *argv_for(ctl)], stdin=stdin, stdout=log,
                            stderr=subprocess.STDOUT, env=env, pass_fds=(ctl,), start_new_session=True)


class ForkServer:
    """The fork server process of one pool, started now (its torch import runs while the pytest process goes on);
    its output goes to ``fork-server-*.log`` in ``workdir``. With ``workers`` (an xdist controller's pool: its local
    workers), it also listens, in a private folder, for that many workers to attach (:attr:`shared`)."""

    def __init__(self, workdir: Path, workers: int = 0) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        env, pythonpath, command = harness_start({})
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        fd, self.log = tempfile.mkstemp(prefix="fork-server-", suffix=".log", dir=workdir)
        args, fds = ["--fork-server", str(theirs.fileno())], [theirs.fileno()]
        listener = None
        #: what a worker needs to attach (:meth:`attach`; JSON, handed through ``workerinput``), None when this
        #: server listens for none
        self.shared: dict[str, Any] | None = None
        if workers > 0:
            # the socket lives in a folder only this user can enter; a connection must also show the token
            folder = tempfile.mkdtemp(prefix="kopt-fork-")
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                listener.bind(os.path.join(folder, "s"))  # OSError: a path too long for AF_UNIX (a long TMPDIR)
                listener.listen(max(workers, 8))
            except OSError:  # the workers start their own servers
                listener.close()
                shutil.rmtree(folder, ignore_errors=True)
                listener = None
        if listener is not None:
            token = secrets.token_hex(16)
            args += ["--listen", str(listener.fileno()), "--token-sha", hashlib.sha256(token.encode()).hexdigest(),
                     "--workers", str(workers)]
            fds.append(listener.fileno())
            # listener_pid: the process that listens (this one), which a worker checks its connection's peer against
            self.shared = {"path": listener.getsockname(), "token": token, "env": env, "pythonpath": pythonpath,
                           "log": self.log, "listener_pid": os.getpid()}
        try:
            self.proc: Any = subprocess.Popen([*command, *args], stdin=subprocess.DEVNULL, stdout=fd,
                                              stderr=subprocess.STDOUT, env=env, pass_fds=tuple(fds),
                                              start_new_session=True)
        finally:
            os.close(fd)
            theirs.close()
            if listener is not None:
                listener.close()
        self._setup(env, ours, owns_log=True)

    def _setup(self, env: dict[str, str], sock: socket.socket, owns_log: bool) -> None:
        #: the environment the server imported with (its children's may differ only after the fork)
        self.env = env
        self.sock = sock
        self.owns_log = owns_log
        self.lock = threading.Lock()
        self.replies: dict[int, dict[str, Any]] = {}
        self.next_id = 0
        #: why the server cannot serve (None while it can)
        self.broken: str | None = None
        #: whether it has answered a request (its imports are done: a fork takes milliseconds)
        self.answered = False

    @classmethod
    def attach(cls, shared: dict[str, Any] | None) -> "ForkServer | None":
        """An xdist worker's server: a copy of the session's shared server (``shared``: its :attr:`shared`, as the
        controller handed it), forked for this process when it reads the request sent now (after its own torch
        import: this call does not wait for it). None where this process's harness environment is not the one the
        shared server imported with (beyond what is set after a fork and pytest-xdist's own variables), its socket
        cannot be reached (a worker started after the others attached, another host), or the process listening at
        its path is not the controller that handed it (another process of this user put a socket in its place:
        checked before the token is sent): the pool then starts a server of its own."""
        if not shared:
            return None
        env, pythonpath, _ = harness_start({})
        if pythonpath != shared.get("pythonpath") or refused(env, shared.get("env") or {},
                                                              AFTER_FORK_ENV + WORKER_ENV):
            return None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            sock.settimeout(ATTACH_CONNECT_S)
            deadline = time.monotonic() + ATTACH_CONNECT_S
            while True:  # a backlog full of strangers' connections refuses at once (EAGAIN): tried again meanwhile
                try:
                    sock.connect(str(shared["path"]))
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
            if peer(sock) != (shared["listener_pid"], os.getuid()):  # a socket put in its place: not the token's
                sock.close()
                return None
            sock.send(json.dumps({"op": "attach", "token": shared["token"], "env": env}).encode())
            sock.settimeout(None)
        except (OSError, KeyError):
            sock.close()
            return None
        self = cls.__new__(cls)
        self.log, self.shared = str(shared.get("log") or ""), None
        self._setup(env, sock, owns_log=False)
        self.proc = _Attached(self)
        return self

    @property
    def given_up(self) -> bool:
        """True for a worker's attachment that no copy of the shared server will serve: the server refused it or
        closed it before forking one (:attr:`broken` says how it ended). Its pool starts a server of its own."""
        return isinstance(self.proc, _Attached) and bool(self.broken) and self.proc.pid is None

    def spawn(self, argv_for: Callable[[int], list[str]], extra_env: dict[str, str], stdin: int, log: int,
              ctl: int) -> "ForkedProcess | subprocess.Popen":
        """A harness process (:func:`start`), forked by the server where it can, else started the ordinary way
        now (or later, when the server fails to answer)."""
        env, _, _ = harness_start(extra_env)  # PYTHONPATH out, as for the server
        if self.broken or refused(env, self.env):
            return popen(argv_for, extra_env, stdin, log, ctl)
        # ours until the fork is answered: the fallback needs them
        held = {0: os.dup(stdin), 1: os.dup(log), CTL_FD: os.dup(ctl)}
        with self.lock:
            self.next_id += 1
            rid = self.next_id
            msg = json.dumps({"id": rid, "op": "spawn", "argv": argv_for(CTL_FD), "env": env,
                              "fds": [0, 1, 2, CTL_FD]}).encode()
            try:
                socket.send_fds(self.sock, [msg], [held[0], held[1], held[1], held[CTL_FD]])
            except OSError as exc:
                self.broken = f"the fork server's socket failed ({exc})"
                _close_all(held)
                return popen(argv_for, extra_env, stdin, log, ctl)
        return ForkedProcess(self, rid, argv_for(CTL_FD), held,
                             lambda: popen(argv_for, extra_env, held[0], held[1], held[CTL_FD]))

    def answer(self, rid: int, timeout_s: float | None = None) -> dict[str, Any]:
        """The server's answer to request ``rid``; ``{"error": ...}`` when it ended, was stopped (a process of this
        user sent it SIGSTOP) or did not answer within ``timeout_s`` (default :data:`ANSWER_TIMEOUT_S` until it has
        answered once, :data:`ANSWERED_TIMEOUT_S` after)."""
        if timeout_s is None:
            timeout_s = ANSWERED_TIMEOUT_S if self.answered else ANSWER_TIMEOUT_S
        with self.lock:
            deadline = time.monotonic() + timeout_s
            while rid not in self.replies:
                if self.broken:
                    return {"error": self.broken}
                left = deadline - time.monotonic()
                ready, _, _ = select.select([self.sock], [], [], max(0.0, min(left, 1.0)))
                if not ready:
                    if _stopped(self.proc.pid):
                        self.broken = "the fork server was stopped (SIGSTOP): another process of this user stopped it"
                    elif left <= 1.0:
                        self.broken = f"the fork server did not answer within {timeout_s:g} s"
                    continue
                try:
                    data = self.sock.recv(MAX_MESSAGE)
                except OSError as exc:
                    data, self.broken = b"", f"the fork server's socket failed ({exc})"
                if not data:
                    self.broken = self.broken or "the fork server ended"
                    continue
                msg = json.loads(data)
                if not msg.get("id") and msg.get("error") == "refused":  # an attachment's answer: no copy comes
                    self.broken = "the session's fork server refused this worker's environment: " + \
                        ", ".join(map(str, msg.get("variables") or []))
                self.replies[int(msg.get("id") or 0)] = msg
                self.answered = True
            return self.replies.pop(rid)

    def reap(self, pid: int) -> int | None:
        """The exit code of ``pid`` (a process this server forked) once it ended, else None; ``-SIGKILL`` when the
        server is gone (its children died with it)."""
        with self.lock:
            self.next_id += 1
            rid = self.next_id
            try:
                if not self.broken:
                    self.sock.send(json.dumps({"id": rid, "op": "reap", "pid": pid}).encode())
            except OSError as exc:
                self.broken = f"the fork server's socket failed ({exc})"
        reply = self.answer(rid, timeout_s=10.0)
        if "error" in reply:
            return -signal.SIGKILL
        return reply.get("status")

    def stop_listening(self) -> None:
        """No more workers will attach (the session's have, or will not): remove the listening socket's folder, so
        no process can connect to it any more (connections already made are still served), and hand it to no
        worker started later (:attr:`shared` becomes None)."""
        if self.shared is not None:
            shutil.rmtree(os.path.dirname(self.shared["path"]), ignore_errors=True)
            self.shared = None

    def close(self) -> None:
        """End the server (closing its socket ends its loop; the harness processes it forked and that still run
        die with it; the copies it forked for workers live on until their own worker's socket closes) and remove
        its log (a worker's leaves the shared server's) and its listening socket's folder."""
        self.broken = self.broken or "closed"
        self.sock.close()
        if _stopped(self.proc.pid):  # it cannot see its socket close
            self.proc.kill()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.owns_log:
            Path(self.log).unlink(missing_ok=True)
        self.stop_listening()

    def output(self) -> str:
        """The server's own output (its import's errors), at most the last 4 KB."""
        try:
            return Path(self.log).read_bytes()[-4096:].decode(errors="replace").strip()
        except OSError:
            return ""


class _Attached:
    """A worker's server as :class:`ForkServer` sees its process (``pid``, ``poll``, ``wait``, ``kill``,
    ``returncode``): a process of the shared server, not this one's child, known by the pid of its first message
    (None before it), watched through a pidfd. How it ended is its parent's to read: ``poll`` and ``wait`` give 0
    once it ended, ``returncode`` stays None."""

    def __init__(self, server: ForkServer) -> None:
        self.server = server
        self.returncode: int | None = None
        self.ended = False
        self._pidfd: int | None = None

    @property
    def pid(self) -> int | None:
        pid = self.server.replies.get(0, {}).get("pid")
        if not isinstance(pid, int):
            return None
        self._fd()  # held from now on: a signal through it never reaches another process that reused the pid
        return int(pid)

    def _fd(self) -> int | None:
        pid = self.server.replies.get(0, {}).get("pid")
        if self.ended or not isinstance(pid, int):
            return None
        if self._pidfd is None:
            try:
                self._pidfd = os.pidfd_open(pid)
            except OSError:  # gone already
                self._end()
        return self._pidfd

    def _end(self) -> None:
        self.ended = True
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None

    def poll(self) -> int | None:
        return self.wait(0.0, raising=False)

    def wait(self, timeout: float | None = None, raising: bool = True) -> int | None:
        fd = self._fd()
        if fd is not None:
            if not _ended(fd, timeout, raising, "kopt-forkserver"):
                return None
            self._end()
        return 0 if self.ended else None

    def kill(self) -> None:
        fd = self._fd()
        if fd is not None:
            try:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            except OSError:
                pass


class ForkedProcess:
    """A harness process asked of a :class:`ForkServer`: :attr:`pid` waits for the fork's answer; a process the
    server could not fork is started by ``fallback`` then, and this object forwards to it."""

    def __init__(self, server: ForkServer, rid: int, argv: list[str], held: dict[int, int],
                 fallback: Callable[[], subprocess.Popen]) -> None:
        self.server = server
        self.rid = rid
        #: the harness's arguments (its command line is the server's: ``ps`` names it by ``comm``, kopt-<role>)
        self.args = argv
        self.held = held
        self.fallback = fallback
        self.popen: subprocess.Popen | None = None
        self._pid: int | None = None
        self._pidfd: int | None = None
        self.returncode: int | None = None
        self.stdin: IO[bytes] | None = None  # set by the caller (the write end of the process's stdin pipe)

    def resolve(self) -> None:
        """Wait for the fork's answer (or start the fallback): after this :attr:`pid` is the process's."""
        if self._pid is not None or self.popen is not None:
            return
        reply = self.server.answer(self.rid)
        if "pid" in reply:
            self._pid = int(reply["pid"])
            self._pidfd = os.pidfd_open(self._pid)  # a zombie until reaped: the pid stays this process's
            _close_all(self.held)
        else:
            try:
                self.popen = self.fallback()
            finally:
                _close_all(self.held)

    @property
    def pid(self) -> int:
        self.resolve()
        if self.popen is not None:
            return self.popen.pid
        assert self._pid is not None
        return self._pid

    @property
    def forked(self) -> bool:
        """True when the server forked it (False: started the ordinary way)."""
        self.resolve()
        return self.popen is None

    def poll(self) -> int | None:
        """Its exit code once it ended, else None."""
        return self.wait(timeout=0.0, raising=False)

    def wait(self, timeout: float | None = None, raising: bool = True) -> int | None:
        """Wait for it to end (at most ``timeout`` seconds) and return its exit code; raises
        :class:`subprocess.TimeoutExpired` when it still runs (with ``raising``, else returns None)."""
        self.resolve()
        if self.popen is not None:
            try:
                self.returncode = self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                if raising:
                    raise
            return self.returncode
        if self.returncode is not None:
            return self.returncode
        assert self._pidfd is not None and self._pid is not None
        if not _ended(self._pidfd, timeout, raising, self.args):
            return None
        code = self.server.reap(self._pid)
        for _ in range(100):  # the pidfd says it ended: the server's waitpid sees it at once
            if code is not None:
                break
            select.select([], [], [], 0.01)
            code = self.server.reap(self._pid)
        self.returncode = -signal.SIGKILL if code is None else code
        os.close(self._pidfd)
        return self.returncode


def peer(sock: socket.socket) -> tuple[int, int]:
    """The (pid, uid) of the process at the other end of a connected AF_UNIX socket (``SO_PEERCRED``, Linux's
    ``struct ucred``): for a connection to a listening socket, the process that called ``listen`` on it, whoever
    accepts. Raises OSError for a socket that is not a connected AF_UNIX one."""
    ucred = "iII"  # pid_t, uid_t, gid_t
    pid, uid, _gid = struct.unpack(ucred, sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize(ucred)))
    return pid, uid


def _ended(pidfd: int, timeout: float | None, raising: bool, name: str | list[str]) -> bool:
    """Whether the process of ``pidfd`` ended within ``timeout`` seconds (None: however long it takes); when it did
    not, raises :class:`subprocess.TimeoutExpired` naming ``name`` with ``raising``, else returns False."""
    if select.select([pidfd], [], [], timeout)[0]:
        return True
    if raising:
        raise subprocess.TimeoutExpired(name, timeout or 0.0)
    return False


def _close_all(fds: dict[int, int]) -> None:
    for fd in fds.values():
        try:
            os.close(fd)
        except OSError:
            pass
    fds.clear()

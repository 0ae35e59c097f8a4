"""The fork server: one process per pytest process that imports torch and numpy once and forks each warm harness
process from that state (:class:`pytest_kopt.proc.forkserver.ForkServer` is its other end).

Why: a warm harness process spends seconds importing torch (3.7 s on a quiet H100 host, 5.7 s median and 17.6 s at
most when a 32-branch close starts ~80 of them on 16 CPUs: 54% of the close's CPU time). A fork of a process that
has imported it takes ~15 ms. What makes a process a kernel's own (its environment, stdin, log, control pipe,
session) is set in the child after the fork, before the harness's request loop imports any kernel: a candidate's
code only ever runs in a child, never here, and each child runs one kernel or one reference as before.

This process never initialises CUDA (a CUDA context does not survive a fork): it imports and forks, nothing else.
Python's ``multiprocessing`` forkserver is not used: it runs with the pytest process's ``sys.path`` (where a
candidate may write a module that shadows one imported later), closes the child's stdin, and is one per
interpreter.

Protocol, over a ``SOCK_SEQPACKET`` socket (one message a datagram, JSON): ``{"id", "op": "spawn", "argv",
"env", "fds"}`` with the child's file descriptors attached (SCM_RIGHTS; ``fds`` names the number each becomes in
the child) is answered ``{"id", "pid"}`` or ``{"id", "error"}`` (``refused``: an environment that differs from
this process's in a variable read at import); ``{"id", "op": "reap", "pid"}`` of a process it forked on request
is answered ``{"id", "status"}`` (``waitpid`` without waiting: the exit code as
:attr:`subprocess.Popen.returncode` gives it, negative for a signal, or None while it runs), of any other pid
``{"id", "error"}``, as is a message that is no request. The server ends when the socket closes; its children die
with it (``PR_SET_PDEATHSIG``, set by each child's harness).

Under pytest-xdist one server serves the whole session: the controller starts it at its configure, with a
listening socket (``--listen FD``) in a private folder, and each worker, at its own configure, connects there and
sends ``{"op": "attach", "token", "env"}``: the server forks a copy of itself that serves that worker on that
connection from then on (its first message ``{"id": 0, "pid"}``), as a worker's own server would. So torch is
imported once per session, beside the workers' start, instead of once per worker at the same time (8 workers: 8
imports of 5.4 CPU-s each in a close's first 10 s, when 16 CPUs were 72% busy; H100, 2026-12-07). Only a
connection that shows the session's token (the server knows its SHA-256, ``--token-sha``) is served, and the
server stops listening once ``--workers`` workers have attached.
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import json
import os
import select
import socket
import sys
import time
import traceback
from typing import Any, Callable, NoReturn

#: Environment variables a child may have other than this process's: read after the fork (CUDA's at the first CUDA
#: call, Triton's at its first use, kopt's by the harness), never by what this process imported. Any other
#: difference is refused and the pool starts that process the ordinary way.
AFTER_FORK_ENV = ("CUDA_", "TRITON_", "KOPT_", "NVIDIA_", "PYTHONUNBUFFERED")
#: Largest message (bytes): an environment of a few hundred variables.
MAX_MESSAGE = 1 << 20
#: Variables a worker's processes have that the session's shared server, started by the controller, has not, and
#: that nothing this server imports reads: pytest-xdist's own (``PYTEST_XDIST_WORKER``, ``PYTEST_XDIST_TESTRUNUID``,
#: ``PYTEST_XDIST_WORKER_COUNT``), and the terminal's size, which a popen worker has (``COLUMNS=80``, ``LINES=24``)
#: where its controller has none.
WORKER_ENV = ("PYTEST_XDIST_", "COLUMNS", "LINES")
#: Seconds an attaching connection may take to send its request (a worker sends it with its connect).
ATTACH_TIMEOUT_S = 5.0
#: Connections waiting for their attach request at most (a worker's comes at once: more are no worker's).
MAX_PENDING = 64


def serve(sock_fd: int, listen_fd: int | None = None, token_sha: str = "", workers: int = 0) -> int:
    """Import what every harness process imports, then fork children on request until the socket closes; with
    ``listen_fd`` (a listening ``SOCK_SEQPACKET`` socket), also serve up to ``workers`` workers that attach there
    with the token whose SHA-256 is ``token_sha`` (:func:`_attach`)."""
    import gc

    _dumpable(False)  # before anything: it holds its sockets from its start
    from . import protocol  # the harness's modules, imported once

    if sys.platform.startswith("linux"):
        protocol.die_with_parent(subreaper=False)  # its children die with it (theirs is set by their harness)
    import numpy  # noqa: F401
    import torch  # noqa: F401

    _name(b"kopt-forkserver")
    gc.collect()
    gc.freeze()  # kept out of the collector's sight in every child (see protocol.serve)
    sock = socket.socket(fileno=sock_fd)
    listener = socket.socket(fileno=listen_fd) if listen_fd is not None else None
    base = dict(os.environ)
    # what this process imported decides what may differ: Triton's variables only while Triton is not imported
    after = tuple(p for p in AFTER_FORK_ENV if p != "TRITON_" or "triton" not in sys.modules)
    return _loop(sock, base, after, listener, token_sha, workers)


class _Door:
    """Where workers attach to a shared server: its ``listener`` (None once every one of the ``workers`` it waits for
    has attached, or for a server that listens for none), the connections accepted on it whose request has not come
    (``pending``: when each was accepted) and the servers forked for those attached (``attached``: reaped once they
    end)."""

    def __init__(self, listener: socket.socket | None, token_sha: str, workers: int) -> None:
        self.listener, self.token_sha, self.workers = listener, token_sha, workers
        self.pending: dict[socket.socket, float] = {}
        self.attached: set[int] = set()

    def busy(self) -> bool:
        """Whether the loop must watch more than its own socket."""
        return self.listener is not None or bool(self.pending) or bool(self.attached)

    def sockets(self) -> list[socket.socket]:
        """The door's sockets: the pending connections and the listener (a forked process closes them all)."""
        return [*self.pending, *([self.listener] if self.listener is not None else [])]

    def wait_s(self) -> float | None:
        """How long a select may wait: a second while a connection or a forked server is to be looked at again."""
        return 1.0 if self.pending or self.attached else None

    def tidy(self) -> None:
        """Close the connections that waited over :data:`ATTACH_TIMEOUT_S`; reap the forked servers that ended."""
        now = time.monotonic()
        for conn in [c for c, t in self.pending.items() if now - t > ATTACH_TIMEOUT_S]:
            del self.pending[conn]
            conn.close()
        for pid in list(self.attached):
            try:
                if _reap(pid) is None:
                    continue
            except ChildProcessError:  # reaped already
                pass
            self.attached.discard(pid)

    def accept(self, ready: list[socket.socket]) -> list[socket.socket]:
        """Accept one connection where the listener is in ``ready``; over :data:`MAX_PENDING` waiting, close the
        oldest of those that sent nothing, never one whose request has come. Returns ``ready`` with the pending
        connections whose request has come that the room-making found."""
        if self.listener is None or self.listener not in ready:
            return ready
        try:
            conn, _ = self.listener.accept()
            conn.setblocking(False)
            self.pending[conn] = time.monotonic()
        except OSError:  # one that went meanwhile
            pass
        if len(self.pending) <= MAX_PENDING:
            return ready
        sent = select.select(list(self.pending), [], [], 0)[0]
        silent = sorted((c for c in self.pending if c not in sent), key=self.pending.__getitem__)
        for conn in silent[:len(self.pending) - MAX_PENDING]:
            del self.pending[conn]
            conn.close()
        return [*ready, *(c for c in sent if c not in ready)]

    def serve(self, ready: list[socket.socket], sock: socket.socket, base: dict[str, str],
              after: tuple[str, ...]) -> None:
        """Serve each pending connection in ``ready`` (:func:`_attach`; ``sock``: the server's own socket, closed in
        what it forks); close the listener once every worker it waited for has attached."""
        for conn in [c for c in ready if c in self.pending]:
            del self.pending[conn]
            pid = _attach(conn, (sock, *self.sockets()), base, after, self.token_sha)
            if pid is not None:
                self.attached.add(pid)
                self.workers -= 1
            if self.workers <= 0 and self.listener is not None:  # every worker has its server: none else may attach
                self.listener.close()
                self.listener = None


def _loop(sock: socket.socket, base: dict[str, str], after: tuple[str, ...], listener: socket.socket | None = None,
          token_sha: str = "", workers: int = 0) -> int:
    """Answer the requests on ``sock`` until it closes; attach workers on ``listener`` meanwhile (:func:`serve`).
    A connection on ``listener`` waits among the others until its request has come (at most
    :data:`ATTACH_TIMEOUT_S`, :data:`MAX_PENDING` at once, the oldest of those that sent nothing closed first): one
    that sends nothing holds up no one."""
    door = _Door(listener, token_sha, workers)
    spawned: set[int] = set()  # the harness processes forked on request, not reaped yet
    while True:
        if door.busy():
            door.tidy()
            ready = select.select([sock, *door.sockets()], [], [], door.wait_s())[0]
            ready = door.accept(ready)
            door.serve(ready, sock, base, after)
            if sock not in ready:
                continue
        try:
            msg, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 8)
        except (ConnectionError, OSError):
            return 0
        if not msg:
            return 0
        req: Any = None
        try:
            req = json.loads(msg)
            if req["op"] == "spawn":
                reply = _spawn(sock, req, fds, base, after, tuple(door.sockets()))
                if "pid" in reply:
                    spawned.add(reply["pid"])
            elif (pid := int(req["pid"])) in spawned:  # a pid > 0: os.fork's
                reply = {"status": _reap(pid)}
                if reply["status"] is not None:
                    spawned.discard(pid)
            else:  # a worker's server (the door reaps those) or no process of this server's
                reply = {"error": f"{req['pid']} is no harness process of this server's"}
        except Exception as exc:  # a bad request answers an error; the server goes on
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            for fd in fds:
                os.close(fd)
        rid = req.get("id") if isinstance(req, dict) else None
        sock.send(json.dumps({"id": rid, **reply}).encode())


def _attach(conn: socket.socket, ours: tuple[socket.socket, ...], base: dict[str, str], after: tuple[str, ...],
            token_sha: str) -> int | None:
    """Serve the connection ``conn`` (its request has come) when its request is an attach request with the
    session's token and an environment that differs from ``base`` only after the fork (or in pytest-xdist's
    variables): fork the server that serves it, a copy of this process in a session of its own, its environment
    the worker's, ``ours`` (this server's other sockets) closed. Returns that server's pid; None for a connection
    not served (closed; answered ``{"id": 0, "error": "refused", "variables"}`` where only the environment is
    wrong). Nothing a connection sends ends this server."""
    try:
        req = json.loads(conn.recv(MAX_MESSAGE) or b"{}")
        token = str(req.get("token", "")).encode()
        if req.get("op") != "attach" or not token_sha or \
                not hmac.compare_digest(hashlib.sha256(token).hexdigest(), token_sha):
            conn.close()  # not the session's worker: nothing is said
            return None
        env = {str(k): str(v) for k, v in req["env"].items()}
        wrong = refused(env, base, after + WORKER_ENV)
        conn.setblocking(True)
        if wrong:
            conn.send(json.dumps({"id": 0, "error": "refused", "variables": wrong}).encode())
            conn.close()
            return None
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
    except Exception:  # noqa: BLE001  (malformed, nested past the recursion limit, the process limit reached)
        conn.close()
        return None
    if pid:
        conn.close()
        return pid

    def serve_worker() -> int:  # the worker's server
        for s in ours:
            s.close()
        os.setsid()
        os.environ.clear()
        os.environ.update(env)
        conn.send(json.dumps({"id": 0, "pid": os.getpid()}).encode())
        return _loop(conn, env, after)

    _child(serve_worker)


def refused(env: dict[str, str], base: dict[str, str], after: tuple[str, ...] = AFTER_FORK_ENV) -> list[str]:
    """The variables in which ``env`` differs from ``base`` (the server's environment when it imported) that
    something imported there may have read already (none of the prefixes ``after``): the child needs a process of
    its own."""
    keys = {k for k in set(env) | set(base) if env.get(k) != base.get(k)}
    return sorted(k for k in keys if not k.startswith(after))


def _spawn(sock: socket.socket, req: dict[str, Any], fds: list[int], base: dict[str, str],
           after: tuple[str, ...], others: tuple[socket.socket, ...] = ()) -> dict[str, Any]:
    env = {str(k): str(v) for k, v in req["env"].items()}
    wrong = refused(env, base, after)
    if wrong:
        return {"error": "refused", "variables": wrong}
    targets = [int(t) for t in req["fds"]]
    if len(targets) != len(fds):
        raise ValueError(f"{len(fds)} file descriptors for {len(targets)} targets")
    sys.stdout.flush()
    sys.stderr.flush()
    settled_r, settled_w = os.pipe()
    pid = os.fork()
    if pid:
        # answered once the child leads its own process group: a kill of the group right after this answer
        # reaches it
        os.close(settled_w)
        os.read(settled_r, 1)
        os.close(settled_r)
        return {"pid": pid}

    def harness() -> int:
        os.close(settled_r)
        for other in others:  # a kernel's process holds none of the workers' connections, nor the listener
            other.close()
        _become(sock, env, fds, targets, [str(a) for a in req["argv"]])
        os.close(settled_w)
        return _run([str(a) for a in req["argv"]])

    _child(harness)


def _child(body: Callable[[], int]) -> NoReturn:
    """In a fresh fork: run ``body`` and end the process with its exit code (a ``SystemExit``'s; 1 after any other
    error, printed), never returning into the server's loop."""
    code = 1
    try:
        code = body()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _become(sock: socket.socket, env: dict[str, str], fds: list[int], targets: list[int], argv: list[str]) -> None:
    """Turn this fresh child into the harness process the request describes: its own session and process group
    (the pool pauses and kills it by group), the server's socket closed (a kernel cannot ask for processes), the
    descriptors at their numbers, the environment."""
    os.setsid()
    sock.close()
    _dumpable(True)  # as a harness process started as a new Python is
    _name(b"kopt-timing" if "--no-profiler" not in argv else b"kopt-harness")
    # move every received descriptor above the targets first, so no dup2 overwrites one not yet placed
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, max(targets) + 1) for fd in fds]
    for fd in fds:
        os.close(fd)
    for src, dst in zip(high, targets):
        os.dup2(src, dst, inheritable=True)
    for src in high:
        if src not in targets:
            os.close(src)
    os.environ.clear()
    os.environ.update(env)
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # as pytest_kopt.child.__main__ sets it


def _name(name: bytes) -> None:
    """This process's name as ``ps`` and ``top`` show it (Linux ``PR_SET_NAME``, 15 bytes): a forked harness
    process's command line is the server's."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, ctypes.c_char_p(name[:15]), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _dumpable(on: bool) -> None:
    """Linux ``PR_SET_DUMPABLE``: off in the server (and the copies forked for workers), so another process of this
    user, a kernel's among them, cannot attach to it or take its sockets (ptrace, ``pidfd_getfd``: both need the
    target dumpable where the caller lacks CAP_SYS_PTRACE, whatever ``ptrace_scope`` says); on again in each
    harness process forked from it."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(4, int(on), 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except (OSError, AttributeError):
        pass


def _run(argv: list[str]) -> int:
    """The harness's entry point, as ``python -m pytest_kopt.child ARGV`` would run it."""
    from . import protocol

    sys.argv = ["pytest_kopt.child", *argv]
    protocol.restart_clock(time.time())
    return protocol.main(sys.argv)


def _reap(pid: int) -> int | None:
    """The exit code of child ``pid`` once it ended (negative: the signal that ended it), None while it runs;
    ChildProcessError when it is no child of this process (or was reaped already)."""
    done, status = os.waitpid(pid, os.WNOHANG)
    if not done:
        return None
    return os.waitstatus_to_exitcode(status)

"""One harness request in a fresh child process, and how a harness process's end maps to a gate error.

A crash (signal, abort, illegal memory access), a timeout or a Python error in the candidate fails only the item
that started the child; the pytest process stays clean of CUDA. :class:`pytest_kopt.proc.pool.HarnessPool` runs
requests in warm processes through the same result checks.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

from ..errors import NO_GPU_FIX, Blocked, CompileError, ConfigError, ContractError, KernelRuntimeError
from ..child.tree import kill_tree

#: How a harness process starts: the JSON list after it holds the folders appended to ``sys.path``.
_BOOT = ("import json, runpy, sys; sys.path.extend(json.loads(sys.argv.pop(1))); "
         "runpy.run_module('pytest_kopt.child', run_name='__main__', alter_sys=True)")


def write_request(req: dict[str, Any], gate: str, workdir: Path) -> tuple[str, dict[str, Any]]:
    """Write ``req`` (plus its ``out`` prefix) to a fresh ``<gate>-*.req.json`` in ``workdir``; returns (the
    request file, the request as written). The harness writes ``<out>.json`` and, for some modes, ``<out>.npz``."""
    workdir.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f"{gate}-", suffix=".req.json", dir=workdir)
    os.close(fd)
    req = {**req, "out": name.removesuffix(".req.json")}
    Path(name).write_text(json.dumps(req))
    return name, req


def python_command(env: dict[str, str]) -> list[str]:
    """How a harness process starts: -P keeps pytest's working directory (where a candidate can write, say, a
    ``statistics.py``) off the front of ``sys.path``, -s keeps the user's site-packages out, and PYTHONPATH's
    entries (taken out of ``env``) and pytest_kopt's own folder are *appended* to ``sys.path``, after the
    standard library and site-packages, so nothing there can shadow them."""
    extra = [p for p in env.pop("PYTHONPATH", "").split(os.pathsep) if p]
    extra.append(str(Path(__file__).resolve().parent.parent.parent))
    return [sys.executable, "-P", "-s", "-c", _BOOT, json.dumps(extra)]


#: The environment variable naming the pytest process the session started from (the xdist controller's pid, which
#: its workers inherit; else the process that starts the harness).
SESSION_PID_ENV = "KOPT_SESSION_PID"


def child_env(extra: dict[str, str]) -> dict[str, str]:
    """The environment of a harness process: this one's, plus ``extra``. A ``TRITON_INTERPRET`` from the user's
    shell is dropped: the gates decide where Triton's interpreter runs (CPU correctness only); left in, the compile
    and SASS gates would find no compiled kernel. So is pytest's ``PYTEST_CURRENT_TEST``: a harness process serves
    many items and is none of them, and a value that changes with every item made the fork server
    (:mod:`pytest_kopt.proc.forkserver`), started with another, refuse every process started during an item."""
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    env.pop("PYTEST_CURRENT_TEST", None)
    # the session's root process: a timed child counts GPU processes below it as its own session's, not as others
    env.setdefault(SESSION_PID_ENV, str(os.getpid()))
    env.update(extra)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def harness_start(extra: dict[str, str]) -> tuple[dict[str, str], str, list[str]]:
    """What a harness process starts with: its environment (:func:`child_env` of ``extra``, PYTHONPATH taken out),
    the PYTHONPATH that had (its entries go on ``sys.path`` through the command) and its command
    (:func:`python_command`, before the request's own arguments)."""
    env = child_env(dict(extra))
    pythonpath = env.get("PYTHONPATH", "")
    return env, pythonpath, python_command(env)


def run_fresh(req: dict[str, Any], *, gate: str, timeout_s: float, path: str, workdir: Path,
              prefix: list[str] | None = None, lock: Any = None, timeout_hint: str | None = None) -> dict[str, Any]:
    """Run ``req`` in a new harness process and return its result dict (``ok`` is True).

    ``req["env"]`` (optional) adds environment variables; ``prefix`` wraps the command (``ncu ...``,
    ``compute-sanitizer ...``); ``lock`` (a context manager, e.g. the per-GPU lock) is held while it runs;
    ``timeout_hint`` replaces the timeout error's fix. Without a prefix the process sends the SHA-256 of its result
    on a private pipe and the result is checked against it. ``<out>.npz`` stays on disk for the caller. Raises
    KernelRuntimeError (crash, CUDA error, TIMEOUT after ``timeout_s`` seconds, TAMPERED), ContractError (the
    reference or ``setup`` broke its contract) or CompileError."""
    with lock if lock is not None else contextlib.nullcontext():
        proc = FreshProcess(req, gate=gate, workdir=workdir, prefix=prefix)
        return proc.finish(timeout_s=timeout_s, path=path, timeout_hint=timeout_hint)


class FreshProcess:
    """A harness process for one request, started now (:func:`run_fresh` starts and finishes it under one lock;
    the ncu gate starts its profile ahead and finishes it later, see :mod:`pytest_kopt.gates.ncu`). Its output goes
    to a log file in ``workdir``; without a ``prefix`` it attests its result on a private pipe."""

    def __init__(self, req: dict[str, Any], *, gate: str, workdir: Path, prefix: list[str] | None = None) -> None:
        self.gate = gate
        name, self.req = write_request(req, gate, workdir)
        self.out = self.req["out"]
        env, _, command = harness_start(self.req.get("env") or {})
        # the attestation pipe; not under a wrapping tool (ncu, compute-sanitizer), which need not pass extra file
        # descriptors on to its target (those runs profile or check a candidate: nothing of theirs is trusted)
        ctl_r, ctl_w = os.pipe()
        self.attested = not prefix
        cmd = [*(prefix or []), *command, name]
        cmd += ["--ctl", str(ctl_w)] if self.attested else []
        # its output goes to a file, not a pipe: a daemon the kernel left holding a pipe would keep it open forever
        fd, self.log = tempfile.mkstemp(prefix="fresh-", suffix=".log", dir=workdir)
        self.ctl = os.fdopen(ctl_r, "rb")
        try:
            with os.fdopen(fd, "wb") as sink:
                self.proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, env=env,
                                             start_new_session=True, pass_fds=(ctl_w,) if self.attested else ())
        except BaseException:
            self.ctl.close()
            raise
        finally:
            os.close(ctl_w)

    def alive(self) -> bool:
        """True while the process runs."""
        return self.proc.poll() is None

    def kill(self) -> str:
        """End it and everything below it, and drop its log (a profile started ahead that is not used); returns the
        log's tail."""
        kill_tree(self.proc.pid)
        self.proc.wait()
        self.ctl.close()
        return tail(read_log(self.log), 1000)

    def finish(self, *, timeout_s: float, path: str, timeout_hint: str | None = None) -> dict[str, Any]:
        """Wait for the process (at most ``timeout_s`` seconds from now) and return its result; raises as
        :func:`run_fresh` does."""
        gate = self.gate
        with self.ctl as ctl:
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                # the child leads its own process group (ncu, compute-sanitizer and their targets): end all of it,
                # and whatever left the group below it
                kill_tree(self.proc.pid)
                self.proc.wait()
                raise timeout_error(timeout_s, gate, path, read_log(self.log), timeout_hint,
                                    self.req.get("smaller_dims")) from None
            except BaseException:
                kill_tree(self.proc.pid)  # Ctrl-C in pytest: leave no child running on the GPU
                raise
            try:  # what is left of its process group (the harness killed its own descendants at exit)
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.set_blocking(ctl.fileno(), False)
            parts = (ctl.read() or b"").split()
        output = read_log(self.log)
        if not Path(self.out + ".json").is_file():
            raise died_error(self.proc.returncode, gate, path, output)
        if self.attested and (len(parts) != 4 or parts[0] != b"done"):
            raise KernelRuntimeError("the harness process ended without its attestation on the control pipe",
                                     gate=gate, path=path, details=tail(output),
                                     fix="the kernel must not touch file descriptors it did not open")
        return read_result(self.out, output, gate, path, attest=parts[3].decode() if self.attested else None)


def read_log(log: str, limit: int = 65536) -> str:
    """The last ``limit`` bytes of a fresh process's output file, which is then removed."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - limit))
            text = f.read().decode(errors="replace").strip()
        os.unlink(log)
    except OSError:
        return ""
    return text


def timeout_error(timeout_s: float, gate: str, path: str, output: str, hint: str | None = None,
                  smaller_dims: str | None = None) -> KernelRuntimeError:
    """TIMEOUT after ``timeout_s`` seconds; ``hint`` is the fix when the caller knows more (e.g. the interpreter),
    ``smaller_dims`` the dims it suggests (the request's ``smaller_dims``: ``--kopt-dims`` text), named in it."""
    fix = hint or "look for an infinite loop or a deadlock; raise --kopt-timeout if the kernel is simply slow"
    if hint and smaller_dims:
        fix += f"; for example --kopt-dims {smaller_dims}"
    return KernelRuntimeError(f"timed out after {timeout_s:g} s", gate=gate, path=path, status="TIMEOUT",
                              details=tail(output), fix=fix)


def died_error(returncode: int | None, gate: str, path: str, output: str) -> KernelRuntimeError:
    """The process ended before writing its result: how it ended, and its output's tail."""
    how = f"exit code {returncode}"
    if returncode is not None and returncode < 0:
        try:
            how = f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            how = f"killed by signal {-returncode}"
    return KernelRuntimeError(f"the child process died ({how}) before reporting", gate=gate, path=path,
                              details=tail(output), fix="run the kernel under compute-sanitizer to find the fault")


def read_result(out: str, output: str, gate: str, path: str, on_error: Callable[[], None] | None = None,
                attest: str | None = None) -> dict[str, Any]:
    """The request's result, read once and, when ``attest`` is given, checked against the SHA-256 its process sent
    on the private control pipe (another process could have rewritten the file in the work folder in between);
    its ``npz_sha`` (the reference's modes) is then as trustworthy as the rest, for
    :func:`pytest_kopt.gates.trust.read_verified`. Raises KernelRuntimeError (TAMPERED) on a mismatch or when the
    process found its own functions replaced (``tampered``: :mod:`pytest_kopt.child.sentinels`), the error the
    harness reported otherwise (``on_error`` is called first)."""
    data = Path(out + ".json").read_bytes()
    if attest is not None and hashlib.sha256(data).hexdigest() != attest:
        if on_error is not None:
            on_error()
        raise KernelRuntimeError("the harness's result file changed after its process wrote it (another process "
                                 "writes into the kopt work folder)", gate=gate, path=path, status="TAMPERED",
                                 details=tail(output), fix="a kernel (or what it left running) must not touch "
                                 "files in the kopt work folder")
    result: dict[str, Any] = json.loads(data)
    result["stdout"] = tail(output, 4000)
    result["out"] = out
    tampered = result.get("tampered")
    if tampered:  # the process's own check (child/sentinels.py): it replaced what the harness measures with
        if on_error is not None:
            on_error()
        shown = ", ".join(map(str, tampered[:8])) + (f" and {len(tampered) - 8} more" if len(tampered) > 8 else "")
        raise KernelRuntimeError(f"the kernel's process replaced functions the harness measures or judges with: "
                                 f"{shown}", gate=gate, path=path, status="TAMPERED", details=tail(output),
                                 fix="a kernel must not patch torch's timing entry points, the harness or its "
                                     "statistics; nothing it reported in this process can be used")
    if result.get("ok"):
        return result
    if on_error is not None:
        on_error()
    category, message = result.get("category"), result.get("message", "")
    details = tail(result.get("traceback", ""), 3000) or None
    fix = result.get("fix")
    line = result.get("line")
    if result.get("path"):  # the user's own frame the error came from (child/frames.py)
        path = shown_path(result["path"])
    where = f"{path}:{line}" if line else path
    if category == "contract":
        raise ContractError(message, gate=gate, path=path, line=line, details=details,
                            fix=fix or f"make the reference/setup follow the contract in the README (see {where})")
    if category == "changed":  # a pinned file (the reference) is not what the session started with
        raise ConfigError(message, gate=gate, path=path, details=details, status="FILE_CHANGED",
                          fix=fix or "restore the file and run the session again")
    if category == "needs_gpu":  # a field format's code hard-codes "cuda": one clear skip on a machine without one
        raise Blocked("hardware", f"no GPU, and {message}", NO_GPU_FIX, details=details)
    if category == "interpreter_gap":  # Triton's interpreter cannot run what the kernel calls: no verdict on it here
        raise Blocked("hardware", f"{message}; checked on a GPU", NO_GPU_FIX)
    if category == "compile":
        raise CompileError(message, gate=gate, path=path, line=line, details=details,
                           fix=fix or "fix the Triton compile error")
    raise KernelRuntimeError(message, gate=gate, path=path, line=line, details=details,
                             fix=fix or (f"fix the error at {where} (the traceback in this item's details is the "
                                         "kernel's own code)" if line else
                                         "the kernel raised an error at run time; its traceback is in this item's "
                                         "details" if details else "the kernel raised an error at run time, the one "
                                         "the message names"))


def shown_path(path: str) -> str:
    """``path`` relative to the working folder when it is inside it (as the user typed it), else as it is."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError):
        return path


def tail(text: str, limit: int = 2000) -> str:
    """The last ``limit`` characters of ``text`` (with ``...`` in front when cut)."""
    return text if len(text) <= limit else "...\n" + text[-limit:]

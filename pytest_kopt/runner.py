"""Runs the harness (:mod:`pytest_kopt.harness`) in a fresh child process and maps how it ended to a gate error.

A crash (signal, abort, illegal memory access), a timeout or a Python error in the candidate fails only the item
that started the child; the pytest process stays clean of CUDA.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from .errors import CompileError, ContractError, KernelRuntimeError


def run_harness(req: dict[str, Any], *, gate: str, timeout_s: float, path: str, workdir: Path,
                prefix: list[str] | None = None) -> dict[str, Any]:
    """Run ``python -m pytest_kopt.harness`` on ``req`` and return its result dict (``ok`` is True).

    ``req["env"]`` (optional) adds environment variables; ``prefix`` wraps the command (e.g. ``ncu ...``).
    ``<out>.npz`` stays on disk for the caller. Raises KernelRuntimeError (crash, CUDA error, timeout after
    ``timeout_s`` seconds), ContractError (the reference or ``setup`` broke its contract) or CompileError.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f"{gate}-", suffix=".req.json", dir=workdir)
    os.close(fd)
    out = name.removesuffix(".req.json")
    req = {**req, "out": out}
    Path(name).write_text(json.dumps(req))
    env = dict(os.environ)
    env.update(req.get("env") or {})
    env.setdefault("PYTHONUNBUFFERED", "1")
    pkg_root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    cmd = [*(prefix or []), sys.executable, "-m", "pytest_kopt.harness", name]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        # the child leads its own process group (ncu, compute-sanitizer and their targets): end all of it
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        stdout, stderr = proc.communicate()
        raise KernelRuntimeError(f"timed out after {timeout_s:g} s", gate=gate, path=path, status="TIMEOUT",
                                 details=_tail((stdout or "") + (stderr or "")),
                                 fix="look for an infinite loop or a deadlock; raise --kopt-timeout if the kernel "
                                     "is simply slow") from None
    except BaseException:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # Ctrl-C in pytest: leave no child running on the GPU
        except ProcessLookupError:
            pass
        raise
    proc = subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
    result_file = Path(out + ".json")
    output = (proc.stdout + proc.stderr).strip()
    if not result_file.is_file():
        how = f"exit code {proc.returncode}"
        if proc.returncode < 0:
            try:
                how = f"killed by {signal.Signals(-proc.returncode).name}"
            except ValueError:
                how = f"killed by signal {-proc.returncode}"
        raise KernelRuntimeError(f"the child process died ({how}) before reporting", gate=gate, path=path,
                                 details=_tail(output), fix="run the kernel under compute-sanitizer to find the fault")
    result: dict[str, Any] = json.loads(result_file.read_text())
    result["stdout"] = _tail(output, 4000)
    result["out"] = out
    if result.get("ok"):
        return result
    category, message = result.get("category"), result.get("message", "")
    details = _tail(result.get("traceback", ""), 3000)
    if category == "contract":
        raise ContractError(message, gate=gate, path=path, details=details,
                            fix="make the reference/setup follow the contract in the README")
    if category == "compile":
        raise CompileError(message, gate=gate, path=path, details=details, fix="fix the Triton compile error")
    raise KernelRuntimeError(message, gate=gate, path=path, details=details,
                             fix="the kernel raised an error at run time; see the message above")


def _tail(text: str, limit: int = 2000) -> str:
    return text if len(text) <= limit else "...\n" + text[-limit:]

"""Exception types raised by the gates, each carrying the gate, the file and the fix.

The pytest layer renders them in ``repr_failure``; the exit code of a session is taken from
``KoptError.exit_code`` of the first failing gate (SKILL.md: 2 kernel validation, 3 hardware/tool/ncu,
4 configuration or static contract).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

EXIT_OK = 0
EXIT_KERNEL = 2
EXIT_HARDWARE = 3
EXIT_CONFIG = 4

#: What each of kopt's exit codes means, in words a message can carry (the README's "Reports and exit codes" table;
#: the convention is the cuda-kernel-optimizer skill's, which the package does not ship).
EXIT_MEANINGS = {
    EXIT_OK: "every gate passed or skipped with a reason",
    1: "a failure that is not a gate's (a test of your own in the session)",
    EXIT_KERNEL: "kernel validation: compile error, wrong output, crash or timeout, unstable or suspect timing, "
                 "a device memory leak",
    EXIT_HARDWARE: "hardware or tool: no GPU for a loop step, nvcc/ncu/cuobjdump missing or failing",
    EXIT_CONFIG: "configuration or contract: a bad option, a file that breaks its contract, a bad methods.json",
}


def exit_meaning(code: int) -> str:
    """``code`` and what it means: ``4 (configuration or contract: ...)``; a code kopt does not set, as itself."""
    return f"{code} ({EXIT_MEANINGS[code]})" if code in EXIT_MEANINGS else str(code)


class KoptError(Exception):
    """Base class: a gate decided against the kernel or could not run.

    Attributes: ``gate`` (gate name), ``path`` (file the problem is in, or None), ``line`` (1-based, or None),
    ``fix`` (one sentence telling the user what to change), ``status`` (a short upper-case status name used in
    the reports), ``exit_code`` (SKILL.md's exit code for this class of failure).
    """

    exit_code = EXIT_KERNEL
    status = "ERROR"

    def __init__(
        self,
        message: str,
        *,
        gate: str = "",
        path: str | None = None,
        line: int | None = None,
        fix: str | None = None,
        details: str | None = None,
        status: str | None = None,
        figures: dict | None = None,
    ) -> None:
        super().__init__(message)
        #: scalar figures of the failure (max_abs_err, mismatched, seed, ...), reported like a pass's
        self.figures = dict(figures or {})
        if status is not None:
            self.status = status
        self.message = message
        self.gate = gate
        self.path = path
        self.line = line
        self.fix = fix
        self.details = details

    def render(self) -> str:
        """Return the multi-line text shown for a failing item: location, message, details and fix."""
        where = ""
        if self.path:
            where = f"{self.path}:{self.line}: " if self.line else f"{self.path}: "
        text = f"[{self.gate or 'kopt'}] {self.status}: {where}{_without_path(self.message, self.path)}"
        if self.details:
            text += "\n" + self.details.rstrip()
        if self.fix:
            text += f"\nfix: {self.fix}"
        return text

    def __str__(self) -> str:
        return self.render()


def _without_path(message: str, path: str | None) -> str:
    """``message`` without a leading ``<path>: `` that names the same file as ``path`` (which the rendered line
    already starts with), so a failure line names its file once."""
    head, sep, rest = message.partition(": ")
    if not (sep and path and head.strip()):
        return message
    try:
        same = os.path.realpath(head) == os.path.realpath(path)
    except (OSError, ValueError):
        return message
    return rest if same else message


class ConfigError(KoptError):
    """A bad option, dims string or file path (exit code 4)."""

    exit_code = EXIT_CONFIG
    status = "CONFIG_ERROR"


class ContractError(KoptError):
    """The kernel or reference file breaks its contract (``solve`` signature, ``reference``, ``setup``; exit 4)."""

    exit_code = EXIT_CONFIG
    status = "CONTRACT_ERROR"


class TooLargeError(KoptError):
    """The case's estimated memory does not fit the GPU (or the machine): a configuration problem, smaller dims
    (exit code 4)."""

    exit_code = EXIT_CONFIG
    status = "TOO_LARGE"


class CompileError(KoptError):
    """nvcc or the Triton compiler rejected the kernel (exit code 2)."""

    status = "COMPILE_ERROR"


class IncorrectError(KoptError):
    """The kernel's output is wrong (exit 2). ``status`` names the guard that caught it: INCORRECT_NUMERICAL,
    INCORRECT_SHAPE, UNWRITTEN, CONSTANT_OUTPUT, NONDETERMINISTIC, INPUT_INDEPENDENT, STALE_OUTPUT, INPUT_MUTATED,
    OUTPUT_REPLACED or NOT_A_TENSOR (see :mod:`pytest_kopt.verdict`)."""

    status = "INCORRECT_NUMERICAL"


class KernelRuntimeError(KoptError):
    """The kernel crashed or raised a CUDA error (RUNTIME_ERROR), ran past the gate's timeout (TIMEOUT), or a file
    of the trusted reference process changed between its write and pytest's read (TAMPERED: the SHA-256 sent on
    the process's private control pipe no longer matches, or the warm reference process was killed between
    requests); exit 2."""

    status = "RUNTIME_ERROR"


class TimingError(KoptError):
    """Timing was unstable (robust CV above SKILL.md's 0.10 limit) or non-positive (exit code 2)."""

    status = "UNSTABLE_TIMING"


class LeakError(KoptError):
    """The candidate's device memory grew with the number of its timed calls (LEAK, with bytes per call; the rule:
    :func:`pytest_kopt.gates.leaks.judge_growth`); exit 2."""

    status = "LEAK"


class EmptyKernelError(KoptError):
    """A kernel function in the build's SASS writes no global memory: its work was compiled out for the target arch
    (an ``#if __CUDA_ARCH__`` guard it does not meet); exit 2."""

    status = "EMPTY_KERNEL"


class HardwareError(KoptError):
    """A GPU, a CUDA context or a required tool (nvcc, ncu, cuobjdump) is missing or failed (exit code 3)."""

    exit_code = EXIT_HARDWARE
    status = "HARDWARE_UNAVAILABLE"


class ProfilerError(KoptError):
    """ncu failed, could not read counters or produced no parseable metric (exit code 3)."""

    exit_code = EXIT_HARDWARE
    status = "NCU_ERROR"


#: What to change when a gate needs a GPU and the machine has none (the ``fix`` of its skip in the JSON report)
NO_GPU_FIX = ("run the session on a machine with an NVIDIA GPU and its driver: without one nothing compares the "
              "kernel's output with the reference or times it")
#: The fix of a GPU gate skipped for want of a GPU where the kernel's kind checks its output on the CPU (a Triton or
#: Python candidate: its correctness items run through the interpreter), so :data:`NO_GPU_FIX` would be untrue.
NO_GPU_TIMING_FIX = ("run the session on a machine with an NVIDIA GPU and its driver to time and profile the kernel "
                     "(its correctness items run here, on the CPU)")


class Blocked(Exception):
    """Raised when a gate cannot run because a prerequisite gate failed or is unavailable; rendered as a skip.
    ``fix`` is the one sentence saying what to change (the JSON report's item ``fix``); None where the cause is
    another item's failure, whose own ``fix`` says it. ``details`` (optional): the long text behind a short
    ``reason`` (an error's traceback), for the JSON report's item that met it; the items blocked after it get the
    reason only. ``local``: this item alone is blocked (one case a CPU cannot judge, as a bfloat16 case in Triton's
    interpreter); the gates that need this one are not blocked by it, so they say their own reason."""

    def __init__(self, gate: str, reason: str, fix: str | None = None, details: str | None = None,
                 local: bool = False) -> None:
        super().__init__(f"blocked by {gate}: {reason}")
        self.gate = gate
        self.reason = reason
        self.fix = fix
        self.details = details
        self.local = local


def closest(name: str, choices: Iterable[object]) -> str | None:
    """The one of ``choices`` closest to ``name`` by difflib's ratio, at least 0.6 (its default cutoff: a dim typed
    ``Nx`` for ``N``, ``--kopt-dim`` for ``--kopt-dims``), ``name`` itself left out; None when none is that close."""
    import difflib

    close = difflib.get_close_matches(name, [str(c) for c in choices if str(c) != name], n=1)
    return close[0] if close else None


def did_you_mean(name: str, choices: Iterable[object]) -> str:
    """`` (did you mean `N`?)`` when ``name`` is close to one of ``choices`` (:func:`closest`), else ``""``: for a
    message that names an unknown name."""
    close = closest(name, choices)
    return f" (did you mean `{close}`?)" if close else ""


def given_instead(name: str, given: Iterable[object]) -> str:
    """`` (--kopt-dims gives `nn`: meant `n`?)`` when a missing ``name`` is close to one of the ``given`` names
    (:func:`closest`), else ``""``."""
    close = closest(name, given)
    return f" (--kopt-dims gives `{close}`: meant `{name}`?)" if close else ""


def clip(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters at a word boundary, with ``…`` where it was cut (a whole text
    as it is)."""
    if len(text) <= limit:
        return text
    cut = text[:limit - 1]
    space = cut.rfind(" ")
    return (cut[:space] if space > limit // 2 else cut).rstrip(" ,;:") + "…"


class NotApplicable(Exception):
    """The gate does not apply to this kernel (a pure-Python candidate has nothing to compile); rendered as a skip."""

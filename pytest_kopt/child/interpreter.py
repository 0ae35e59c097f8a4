"""Errors of Triton's interpreter (``TRITON_INTERPRET=1``, set by the Triton kind for a run without a GPU) that are
gaps of the interpreter, not of the kernel: a ``libdevice`` function it does not implement, an inline assembly
block, a builder method it lacks. The kernel's CPU run reports them as a skip with the reason; a GPU checks it."""

from __future__ import annotations

import os
import re
import traceback
from pathlib import Path

#: Calls in a kernel's line that the interpreter cannot evaluate (triton 3.9: ``triton.language.extra.libdevice``'s
#: functions are stubs that return None there; ``extern_elementwise`` and ``inline_asm`` raise NotImplementedError)
_EXTERN_CALL_RE = re.compile(r"\b(libdevice\.\w+|inline_asm_elementwise|extern_elementwise)\s*\(")


def _triton_root() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return str(Path(triton.__file__).resolve().parent) + os.sep


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from (``__cause__``, else ``__context__``), outermost first."""
    out: list[BaseException] = []
    while exc is not None and exc not in out:
        out.append(exc)
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return out


def interpreter_gap(exc: BaseException) -> str | None:
    """Why ``exc``, raised by a kernel run in Triton's interpreter, is the interpreter's gap, or None when it is
    not (the kernel's own error). An exception of the chain that Triton's package raised (its innermost frame is
    under ``triton/``) is a gap when the kernel's line that called into Triton (the innermost frame outside the
    package) calls what the interpreter cannot evaluate (``libdevice.asin(...)``, ``inline_asm_elementwise``):
    "Triton's interpreter lacks libdevice.asin"; or when it is a NotImplementedError or AttributeError (a builder
    method the interpreter lacks): "Triton's interpreter cannot run `<line>` (<error>)". A kernel's own error
    raised in its own frame (a name it misspelt, an index out of range) is never a gap."""
    root = _triton_root()
    if root is None:
        return None
    for e in _chain(exc):
        frames = traceback.extract_tb(e.__traceback__)
        if not frames or not str(Path(frames[-1].filename).resolve()).startswith(root):
            continue
        outside = [f for f in frames if not str(Path(f.filename).resolve()).startswith(root)]
        line = (outside[-1].line or "").strip() if outside else ""
        call = _EXTERN_CALL_RE.search(line)
        if call:
            return f"Triton's interpreter lacks {call.group(1)}"
        if isinstance(e, (NotImplementedError, AttributeError)):
            where = f"`{line}` ({Path(outside[-1].filename).name}:{outside[-1].lineno})" if outside else "the kernel"
            return f"Triton's interpreter cannot run {where}: {type(e).__name__}: {str(e)[:200]}"
    return None


def interpreting() -> bool:
    """Whether this process runs Triton kernels in the interpreter (the Triton kind's environment without a GPU)."""
    return os.environ.get("TRITON_INTERPRET") == "1"

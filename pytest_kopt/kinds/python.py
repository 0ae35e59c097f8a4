"""Pure-Python candidates: a ``.py`` with kopt's ``setup``/``run_kernel`` contract (or a KernelBench/GPU MODE
candidate) that imports no Triton: torch code, run as it is written. Nothing to compile or disassemble; its
correctness runs on the CPU where there is no GPU."""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

from .pyfile import PyFileKind

if TYPE_CHECKING:
    from ..gates.build import BuildResult
    from ..gates.context import Context


class PythonKind(PyFileKind):
    """A ``.py`` without ``@triton.jit`` (:class:`~pytest_kopt.kinds.triton.TritonKind` claims those first)."""

    name = "python"
    what = "no @triton.jit: pure-Python candidate"
    cpu_gates = frozenset({"correctness"})
    not_applicable = MappingProxyType({
        "compile": "pure-Python candidate (no @triton.jit kernel): nothing to compile",
        "sass": "pure-Python candidate: no GPU code to disassemble"})

    def build(self, ctx: Context, root: Path) -> BuildResult:
        """No build: the file itself, keyed by its content (what a later gate's records name as its build)."""
        from ..gates.build import BuildResult
        from ..gates.trust import digest

        return BuildResult(str(ctx.kernel), digest(ctx.kernel.read_bytes()), True, 0.0, [], "")

    def compile_env(self, ctx: Context) -> dict[str, str]:
        """The session's ``TRITON_CACHE_DIR`` (a torch candidate may still call a library's Triton kernels)."""
        return {"TRITON_CACHE_DIR": str(ctx.cache_dir / "triton")}

    def candidate_env(self, ctx: Context, device: str) -> dict[str, str]:
        """:meth:`compile_env`, plus ``TRITON_INTERPRET=1`` on the CPU (a library's Triton kernels interpreted)."""
        env = self.compile_env(ctx)
        if device == "cpu":
            env["TRITON_INTERPRET"] = "1"
        return env

"""CUDA and CUTLASS kernels: a ``.cu`` with a host function ``extern "C" void solve(...)`` that launches the kernels,
built by nvcc (:mod:`pytest_kopt.kinds.nvcc`) into a shared library the harness calls through ctypes. ``const T*``
is an input, ``T*`` an output, scalars take the ``--kopt-dims`` value of the same name. A ``.cu`` that includes
CUTLASS or CuTe headers is the CUTLASS kind: the same, built with CUTLASS's include folders and flags."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ContractError, HardwareError, NotApplicable
from ..gates import contract, pycontract
from ..gates.kernel_names import own_kernels, qualified_name
from .base import Kind
from .nvcc import build_cuda

if TYPE_CHECKING:
    from ..gates.build import BuildResult
    from ..gates.context import Context

#: Bits of the C integer types, for the range check of a dim passed as one.
_INT_BITS = {"int8": 8, "int16": 16, "int32": 32, "int64": 64, "uint8": 8, "uint32": 32, "uint64": 64}


class CudaKind(Kind):
    """A ``.cu`` whose ``solve()`` launches its kernels (:class:`CutlassKind` claims the ones with CUTLASS first)."""

    name = "cuda"
    suffixes = (".cu",)
    launcher = "solve"
    graph_capture = False
    plans_candidate = False
    builds_ahead = True
    cutlass = False

    def check_tools(self, ctx: Context) -> None:
        """HardwareError when nvcc was not found."""
        if not ctx.tool("nvcc"):
            raise HardwareError("nvcc not found, so the .cu kernel cannot be built", gate="hardware",
                                fix="install the CUDA toolkit or set CUDA_HOME")

    def preflight(self, ctx: Context) -> list[contract.Param]:
        """``solve``'s signature (in the file, or in a local header it includes) against ``--kopt-dims``: every
        scalar given a value that fits its C type, no half-precision scalar by value, and the reference's
        parameters named by ``solve``'s or the dims. Returns the parameters."""
        params = self.solve_params(ctx)
        contract.check_dims(params, ctx.settings.dims, ctx.display)
        for p in params:
            if p.is_pointer:
                continue
            if p.dtype in ("float16", "bfloat16"):
                raise ContractError(f"solve() scalar `{p.ctype} {p.name}` cannot be passed from the host by value "
                                    "through the C ABI", gate="preflight", path=ctx.display, line=p.line,
                                    fix=f"take `float {p.name}` and convert inside solve()")
            v = ctx.settings.dims[p.name]
            bits = _INT_BITS.get(p.dtype)
            if bits and isinstance(v, int):
                lo, hi = (0, 2**bits - 1) if p.dtype.startswith("u") else (-(2**(bits - 1)), 2**(bits - 1) - 1)
                if not lo <= v <= hi or v < 0:
                    raise ContractError(f"--kopt-dims {p.name}={v} does not fit solve()'s `{p.ctype} {p.name}` as "
                                        "a non-negative size", gate="preflight", path=ctx.display, line=p.line,
                                        fix=f"give {p.name} a value in [0, {hi}]")
        c = pycontract.read_python(ctx.ref)
        ref_params, ref_kwargs, line = c.functions["reference"]
        known = {p.name for p in params} | set(ctx.settings.dims)
        # a parameter without a default must be given, whether or not the reference also takes **kwargs
        unknown = [n for n in (ref_params if not ref_kwargs else c.required.get("reference", [])) if n not in known]
        if unknown:
            raise ContractError(f"reference() takes {', '.join(unknown)}, which solve() and --kopt-dims do not "
                                f"provide (solve's buffers: {', '.join(p.name for p in params if p.is_pointer)})",
                                gate="preflight", path=str(ctx.ref), line=line,
                                fix="name reference()'s parameters after solve()'s, or accept **kwargs")
        return params

    def solve_params(self, ctx: Context) -> list[contract.Param]:
        """``solve``'s parameters, parsed from the file or, failing that, from a local header it includes. Raises
        the file's ContractError when neither declares it."""
        source = ctx.kernel.read_text(errors="replace")
        macros = contract.header_macros(ctx.kernel)
        try:
            return contract.parse_solve_signature(source, ctx.display, macros)
        except ContractError as exc:
            for header in contract.local_headers(ctx.kernel):
                try:
                    return contract.parse_solve_signature(header.read_text(errors="replace"), str(header), macros)
                except ContractError:
                    continue
            raise exc from None

    def runtime_dims(self, ctx: Context) -> frozenset[str] | None:
        """``solve``'s scalar parameters: a dim it does not take is compiled into the kernel. Empty when the
        signature does not parse (the preflight item says why)."""
        try:
            return frozenset(p.name for p in self.solve_params(ctx) if not p.is_pointer)
        except (ContractError, OSError):
            return frozenset()

    def describe(self, ctx: Context, params: list[Any], note: str) -> tuple[dict[str, Any], str]:
        """``kind``, the numbers of inputs and outputs; the signature as parsed."""
        sig = ", ".join(f"{'const ' if p.is_const else ''}{p.ctype}{'*' if p.is_pointer else ''} {p.name}"
                        for p in params)
        return ({"kind": self.name, "inputs": sum(p.role == "input" for p in params),
                 "outputs": sum(p.role == "output" for p in params)}, f"solve({sig}){note}")

    def build(self, ctx: Context, root: Path) -> BuildResult:
        """nvcc for ``ctx.arch`` (:func:`~pytest_kopt.kinds.nvcc.build_cuda`), with ``--kopt-timeout`` but at least
        600 s."""
        nvcc = ctx.tool("nvcc")
        return build_cuda(ctx.kernel, ctx.arch, root, nvcc, (ctx.env["tools"].get("nvcc") or {}).get("version"),
                          self.cutlass, timeout_s=max(600.0, ctx.settings.gate_timeout_s), display=ctx.display)

    def build_inputs(self, ctx: Context) -> tuple[Any, ...]:
        """Every local header the source includes (recursively), by content."""
        return (b"".join(h.read_bytes() for h in contract.local_headers(ctx.kernel)),)

    def sources(self, path: Path) -> list[Path]:
        """Every local header the ``.cu`` includes (recursively)."""
        return contract.local_headers(path)

    def prestart_check(self, ctx: Context) -> bool:
        """True: the correctness process of a ``.cu`` has no plan request to start it."""
        return True

    def sass_sources(self, ctx: Context) -> list[Path]:
        """The ``.cu`` and every local header it includes."""
        return [ctx.kernel, *contract.local_headers(ctx.kernel)]

    def own_functions(self, ctx: Context, names: list[str]) -> list[str] | None:
        """The functions whose demangled name is a ``__global__`` function of the ``.cu`` or a local header it
        includes (:func:`~pytest_kopt.gates.kernel_names.own_kernels`); a kernel compiled in from a system header
        (CUB's ``EmptyKernel<void>``, which every file that includes CUB holds and none launches) is not. None (all
        of them) when the source declares no ``__global__`` function kopt can read."""
        return own_kernels(self.sass_sources(ctx), names)

    def no_sass(self, ctx: Context, artifacts: list[str]) -> Exception:
        """NotApplicable: ``solve()`` launches no kernel of its own (copies or a library call only)."""
        return NotApplicable("the build holds no kernel function: solve() launches no kernel of its own (copies "
                             "or library calls only), so there is no SASS of its own to check")


class CutlassKind(CudaKind):
    """A ``.cu`` that includes ``cutlass/`` or ``cute/`` headers: built with CUTLASS's include folders
    (``CUTLASS_PATH``, else the ``nvidia-cutlass`` wheel) and ``--expt-relaxed-constexpr
    --expt-extended-lambda``."""

    name = "cutlass"
    cutlass = True

    def detect(self, path: Path) -> bool:
        """A ``.cu`` that includes CUTLASS or CuTe headers."""
        return path.suffix == ".cu" and contract.uses_cutlass(path)

    def own_functions(self, ctx: Context, names: list[str]) -> list[str] | None:
        """As a CUDA ``.cu``'s, plus CUTLASS's and CuTe's kernel templates (``cutlass::device_kernel<...>``): the
        source instantiates them with its own kernel, so one compiled out by CUTLASS's arch guards (an SM90 kernel
        built for ``sm_90`` rather than ``sm_90a``) is the candidate's work lost, not a library's idle kernel."""
        own = super().own_functions(ctx, names)
        if own is None:
            return None
        return [n for n in names if n in own or qualified_name(n).startswith(("cutlass::", "cute::"))]

"""The ``preflight`` gate: the kernel's and the reference's contracts, checked from their source (nothing imported
or run; the parsers are :mod:`pytest_kopt.gates.contract`)."""

from __future__ import annotations

import warnings
from typing import Any

from ..errors import ConfigError, ContractError
from ..settings import ref_shapes
from . import contract
from .context import Context, Outcome
from .inputs import REGIMES


class KoptDimsWarning(UserWarning):
    """A --kopt-dims entry that no function or solve() parameter names (likely a typo); never a failure."""


#: Bits of the C integer types, for the range check of a dim passed as one.
_INT_BITS = {"int8": 8, "int16": 16, "int32": 32, "int64": 64, "uint8": 8, "uint32": 32, "uint64": 64}


#: how the reports name each problem format
FORMAT_NAMES = {"kopt": "kopt (setup/run_kernel, reference)", "kernelbench": "KernelBench (Model/ModelNew)",
                "gpumode": "GPU MODE (generate_input/ref_kernel/custom_kernel)"}


def preflight(ctx: Context) -> list[contract.Param]:
    """The static contract check, shared by every later gate. Returns ``solve``'s parameters ([] for Triton and
    Python candidates). Raises ContractError (exit 4) naming the file, the line and the fix."""
    c = contract.check_reference(ctx.ref)
    regimes = c.constants.get("regimes")
    if "regimes" in c.constants and (not isinstance(regimes, (list, tuple)) or not regimes
                                     or any(r not in REGIMES for r in regimes)):
        raise ContractError(f"regimes = {regimes!r} is not a list of {', '.join(REGIMES)}", gate="preflight",
                            path=str(ctx.ref), fix='e.g. regimes = ["normal", "uniform", "small_int", "wide"]')
    for listed in ("dims", "benchmarks"):
        try:
            ref_shapes(ctx.ref, listed)
        except ConfigError as exc:
            raise ContractError(exc.message.split(": ", 1)[1], gate="preflight", path=str(ctx.ref),
                                line=c.constant_lines.get(listed), fix=exc.fix) from None
    inplace = c.constants.get("inplace")
    if "inplace" in c.constants and (not isinstance(inplace, (list, tuple))
                                     or not all(isinstance(v, str) for v in inplace)):
        raise ContractError(f"inplace = {inplace!r} is not a list of buffer names", gate="preflight",
                            path=str(ctx.ref), line=c.constant_lines.get("inplace"),
                            fix='name the outputs that are also inputs, e.g. inplace = ["x"]')
    extra = c.constants.get("extra_dims")
    if "extra_dims" in c.constants and (not isinstance(extra, (list, tuple)) or not all(
            isinstance(d, dict) and all(isinstance(v, (int, float)) for v in d.values()) for d in extra)):
        raise ContractError(f"extra_dims = {extra!r} is not a list of dicts of numbers", gate="preflight",
                            path=str(ctx.ref), fix='e.g. extra_dims = [{"M": 1, "N": 1}, {"M": 127, "N": 33}]')
    if ctx.kind in ("triton", "python"):
        k = contract.check_triton(ctx.kernel, ctx.settings.dims, require_jit=ctx.kind == "triton")
        fmt = FORMAT_NAMES[k.candidate_format]
        if k.candidate_format != "kopt" and k.candidate_format != c.problem_format:
            raise ContractError(f"{ctx.display} is a {fmt} candidate, but {ctx.ref.name} is a "
                                f"{FORMAT_NAMES[c.problem_format]} reference", gate="preflight", path=str(ctx.ref),
                                fix="give the problem of the candidate's format as --kopt-ref (KernelBench: class "
                                    "Model, get_inputs(); GPU MODE: generate_input(), ref_kernel())")
        if k.candidate_format == "kopt" and c.problem_format != "kopt":
            raise ContractError(f"{ctx.ref.name} is a {FORMAT_NAMES[c.problem_format]} problem, but {ctx.display} "
                                "defines neither " + ("class ModelNew" if c.problem_format == "kernelbench"
                                                      else "custom_kernel(data)") + " nor setup()/run_kernel()",
                                gate="preflight", path=ctx.display,
                                fix="define " + ("class ModelNew(nn.Module) with Model's __init__ and forward"
                                                 if c.problem_format == "kernelbench" else
                                                 "def custom_kernel(data): returns the output"))
        if k.setup_literal is not None and c.problem_format == "kopt":
            given = set(k.setup_literal[0]) | set(ctx.settings.dims)
            unknown = [n for n in c.required.get("reference", []) if n not in given]
            if unknown:
                _, _, line = c.functions["reference"]
                raise ContractError(f"reference() takes {', '.join(unknown)}, which setup()'s inputs and --kopt-dims "
                                    f"do not provide (setup's buffers: {', '.join(k.setup_literal[0])})",
                                    gate="preflight", path=str(ctx.ref), line=line,
                                    fix="name reference()'s parameters after setup()'s inputs, or give them defaults")
        return []
    source = ctx.kernel.read_text(errors="replace")
    macros = contract.header_macros(ctx.kernel)
    try:
        params = contract.parse_solve_signature(source, ctx.display, macros)
    except ContractError as exc:
        # solve() may live in a local header the .cu includes
        params = None
        for header in contract.local_headers(ctx.kernel):
            try:
                params = contract.parse_solve_signature(header.read_text(errors="replace"), str(header), macros)
                break
            except ContractError:
                continue
        if params is None:
            raise exc from None
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
                raise ContractError(f"--kopt-dims {p.name}={v} does not fit solve()'s `{p.ctype} {p.name}` as a "
                                    "non-negative size", gate="preflight", path=ctx.display, line=p.line,
                                    fix=f"give {p.name} a value in [0, {hi}]")
    ref_params, ref_kwargs, line = c.functions["reference"]
    known = {p.name for p in params} | set(ctx.settings.dims)
    # a parameter without a default must be given, whether or not the reference also takes **kwargs
    unknown = [n for n in (ref_params if not ref_kwargs else c.required.get("reference", [])) if n not in known]
    if unknown:
        raise ContractError(f"reference() takes {', '.join(unknown)}, which solve() and --kopt-dims do not provide "
                            f"(solve's buffers: {', '.join(p.name for p in params if p.is_pointer)})",
                            gate="preflight", path=str(ctx.ref), line=line,
                            fix="name reference()'s parameters after solve()'s, or accept **kwargs")
    return params


def gate_preflight(ctx: Context, case: Any = None) -> Outcome:
    """Check the kernel and reference contracts without running anything. Dims that nothing names (see
    :func:`pytest_kopt.gates.contract.unused_dims`) give a KoptDimsWarning and a note in the summary."""
    params = preflight(ctx)
    pys = [contract.read_python(ctx.ref)] + ([contract.read_python(ctx.kernel)] if ctx.kernel.suffix == ".py" else [])
    unused = contract.unused_dims(ctx.settings.dims, params, *pys)
    note = ""
    if unused:
        note = f"; --kopt-dims {', '.join(unused)} not named by solve(), setup() or ref.py (a typo?)"
        warnings.warn(KoptDimsWarning(f"{ctx.display}: {note[2:]}"), stacklevel=1)
    if ctx.kind in ("triton", "python"):
        what = "@triton.jit kernel" if ctx.kind == "triton" else "no @triton.jit: pure-Python candidate"
        k = contract.read_python(ctx.kernel)
        figures: dict[str, Any] = {"kind": ctx.kind, "format": k.candidate_format}
        if k.candidate_format != "kopt":
            found = {"kernelbench": "ModelNew found; the problem's Model, get_inputs, get_init_inputs",
                     "gpumode": "custom_kernel found; the problem's generate_input, ref_kernel"}[k.candidate_format]
            return Outcome(figures, f"{FORMAT_NAMES[k.candidate_format]} format, run as is: {found} "
                                    f"({what}){note}")
        for fn, decorators in sorted(k.tuned.items()):
            figures[f"tuned_{fn}"] = "+".join(decorators)
            if "autotune" in decorators:
                note += (f"; @triton.autotune {fn}: " + (
                    "tuned once by Triton in the compile gate, that config pinned for every later gate"
                    if ctx.gpu else "every config compiled ahead of time, correctness on the first (no GPU to tune "
                                    "on)"))
            else:
                note += f"; @triton.heuristics {fn}: its values computed at each launch, as Triton does"
        return Outcome(figures, f"{ctx.kind}: setup/run_kernel found ({what}); ref.reference found{note}")
    kind = "cutlass" if contract.uses_cutlass(ctx.kernel) else "cuda"
    sig = ", ".join(f"{'const ' if p.is_const else ''}{p.ctype}{'*' if p.is_pointer else ''} {p.name}" for p in params)
    return Outcome({"kind": kind, "inputs": sum(p.role == "input" for p in params),
                    "outputs": sum(p.role == "output" for p in params)}, f"solve({sig}){note}")

"""The ``preflight`` gate: the kernel's and the reference's contracts, checked from their source (nothing imported
or run; the parsers are :mod:`pytest_kopt.gates.contract`)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from ..errors import ConfigError, ContractError, did_you_mean
from . import contract, pycontract
from .claims import check_claims
from .context import Context, Outcome
from .inputs import REGIMES
from .shapes import ref_shapes


class KoptDimsWarning(UserWarning):
    """A --kopt-dims entry that no function or solve() parameter names (likely a typo); never a failure."""


def preflight(ctx: Context) -> list[contract.Param]:
    """The static contract check, shared by every later gate: the reference's (its literals: ``regimes``,
    ``dims``, ``benchmarks``, ``inplace``, ``extra_dims``, and its claims: ``constraints``, ``dtypes``,
    ``dtype_tolerances``, :mod:`pytest_kopt.gates.claims`), then the kernel's, which its kind checks
    (:meth:`~pytest_kopt.kinds.base.Kind.preflight`), then that the reference takes every dim
    (:func:`check_reference_dims`). Returns ``solve``'s parameters ([] for a kind without them).
    Raises ContractError (exit 4) naming the file, the line and the fix."""
    reference_advice(ctx, pycontract.read_python(ctx.ref))
    c = pycontract.check_reference(ctx.ref)
    regimes = c.constants.get("regimes")
    if "regimes" in c.constants and (not isinstance(regimes, (list, tuple)) or not regimes
                                     or any(r not in REGIMES for r in regimes)):
        raise ContractError(f"regimes = {regimes!r} is not a list of {', '.join(REGIMES)}", gate="preflight",
                            path=str(ctx.ref), fix='e.g. regimes = ["normal", "uniform", "small_int", "wide"]')
    if isinstance(regimes, (list, tuple)) and "problem" in regimes and c.problem_format == "kopt":
        raise ContractError("regimes lists 'problem', a KernelBench or GPU MODE problem's own generator; a kopt "
                            "reference's own inputs come from make_inputs() whatever the regime", gate="preflight",
                            path=str(ctx.ref), line=c.constant_lines.get("regimes"),
                            fix="leave 'problem' out (define make_inputs(seed, **dims) for inputs with structure)")
    if ctx.settings.precision and c.problem_format != "kernelbench":
        raise ContractError(f"--kopt-precision {ctx.settings.precision} casts a KernelBench problem's inputs and "
                            f"models, and {ctx.ref.name} is not a KernelBench problem", gate="preflight",
                            path=str(ctx.ref), fix="leave --kopt-precision out: the reference's own dtypes (setup(), "
                                                   "shapes(), generate_input()) are the task's")
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
    check_claims(ctx, c)
    params = ctx.kind.preflight(ctx)
    # after the kernel's: a dim the kernel needs and --kopt-dims lacks is the first thing to fix
    check_reference_dims(c, ctx.settings.dims, ctx.ref)
    return params


#: The reference's functions kopt calls with every dim as a keyword (``shapes(**dims)``, ``make_inputs(seed,
#: **dims)``, ``workload_model(**dims)``; ``reference`` gets the buffers and the dims).
DIM_TAKERS = ("shapes", "make_inputs", "workload_model", "reference")


def check_reference_dims(c: pycontract.PyContract, dims: dict[str, int | float], path: Path) -> None:
    """Every dim must be a parameter of each function of a kopt reference that kopt calls with all of them
    (:data:`DIM_TAKERS`) unless it takes ``**kwargs``: ``shapes(M, N, K)`` given ``Q=3`` raises TypeError when
    called. Raises ContractError naming the unknown dim(s), the function and the parameters it takes."""
    if c.problem_format != "kopt":  # a field format's sizes are its own globals or task.yml's (checked elsewhere)
        return
    for name in DIM_TAKERS:
        if name not in c.functions:
            continue
        params, has_kwargs, line = c.functions[name]
        unknown = [d for d in dims if d not in params]
        if has_kwargs or not unknown:
            continue
        takes = [p for p in params if p != "seed" and p != "self"]
        listed = ", ".join(unknown)
        hint = did_you_mean(unknown[0], takes) if len(unknown) == 1 else ""
        raise ContractError(f"--kopt-dims gives {listed}, which {name}() in {path.name} does not take (its "
                            f"parameters: {', '.join(takes) or 'none'}){hint}", gate="preflight", path=str(path),
                            line=line,
                            fix=f"leave {listed} out of --kopt-dims, or add {'it' if len(unknown) == 1 else 'them'} "
                                f"to {name}()'s parameters (or accept **kwargs) in {path.name}")


def reference_advice(ctx: Context, c: pycontract.PyContract) -> None:
    """A reference with neither kopt's ``reference`` nor a field format's whole entry points, told in the terms
    of the format it looks like: a GPU MODE ``reference.py`` (``generate_input(**args, seed)`` and
    ``ref_kernel(data)``), a KernelBench problem (``class Model``, ``get_inputs()``), or a candidate given as the
    reference. Raises ContractError (exit 4); returns for every other file (:func:`pycontract.check_reference`
    words kopt's own contract)."""
    if c.problem_format != "kopt" or "reference" in c.functions:
        return
    defs = set(c.functions) | set(c.classes)
    if defs & {"ModelNew", "custom_kernel"}:
        raise ContractError(f"{ctx.ref.name} defines {'class ModelNew' if 'ModelNew' in defs else 'custom_kernel'}: "
                            "a candidate, given as the reference", gate="preflight", path=str(ctx.ref),
                            fix="give the problem as --kopt-ref (KernelBench: the file with class Model and "
                                "get_inputs(); GPU MODE: reference.py) and the candidate as --kopt-baseline")
    gpumode = {"generate_input", "ref_kernel", "check_implementation"} & defs
    kernelbench = {"Model", "get_inputs", "get_init_inputs"} & defs
    if gpumode:
        missing = [n for n in ("generate_input(**args, seed)", "ref_kernel(data)") if n.split("(")[0] not in defs]
        raise ContractError(f"{ctx.ref.name} defines {', '.join(sorted(gpumode))} but no {' or '.join(missing)}: "
                            "a GPU MODE problem needs both (the inputs of each task.yml row, and the output they "
                            "are checked against)", gate="preflight", path=str(ctx.ref),
                            fix="define " + " and ".join(f"def {n}" for n in missing) + " in reference.py")
    if kernelbench:
        missing = [n for n in ("class Model(nn.Module)", "get_inputs()") if n.split("(")[0].split()[-1] not in defs]
        raise ContractError(f"{ctx.ref.name} defines {', '.join(sorted(kernelbench))} but no {' or '.join(missing)}: "
                            "a KernelBench problem needs both (the model whose forward is the task, and its "
                            "inputs)", gate="preflight", path=str(ctx.ref),
                            fix="define " + " and ".join(missing) + " in the problem file")


def gate_preflight(ctx: Context, case: Any = None) -> Outcome:
    """Check the kernel and reference contracts without running anything. Dims that nothing names (see
    :func:`pytest_kopt.gates.pycontract.unused_dims`) give a KoptDimsWarning and a note in the summary."""
    params = preflight(ctx)
    own = ctx.kind.source_contract(ctx)
    unused = pycontract.unused_dims(ctx.settings.dims, params, pycontract.read_python(ctx.ref), *([own] if own else []))
    note = ""
    if unused:
        note = f"; --kopt-dims {', '.join(unused)} not named by solve(), setup() or ref.py (a typo?)"
        warnings.warn(KoptDimsWarning(f"{ctx.display}: {note[2:]}"), stacklevel=1)
    figures, line = ctx.kind.describe(ctx, params, note)
    return Outcome(figures, line)

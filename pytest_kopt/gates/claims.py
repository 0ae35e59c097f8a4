"""What a reference claims beyond its dims, checked by the preflight gate from the source (nothing run): the sizes a
specialised kernel requires (``constraints``, :mod:`pytest_kopt.gates.edges`) and the dtypes a dtype-generic kernel
handles (``dtypes``, ``dtype_tolerances``). Each problem is a ContractError naming the file, the line and the fix."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from ..errors import ContractError
from .context import Context
from .contract import PyContract
from .edges import parse_constraints

#: The dtype names a reference's ``dtypes`` may list (torch's, without ``torch.``): the floating-point ones the
#: harness draws values for.
DTYPE_NAMES = ("float64", "float32", "float16", "bfloat16")
CONSTRAINTS_FIX = ('e.g. constraints = {"M": {"multiple_of": 128}, "K": {"min": 64}, "N": "fixed"} (keys '
                   'multiple_of, min, max: integers >= 1; "fixed": the kernel is built for the given value)')


def check_claims(ctx: Context, c: PyContract) -> None:
    """``constraints``, ``dtypes`` and ``dtype_tolerances`` of the reference ``c`` (its contract), against the
    session's dims and the kernel. Raises ContractError (exit 4)."""
    if "constraints" in c.constants:
        _, problems = parse_constraints(c.constants["constraints"], dict(ctx.settings.dims))
        if problems:
            raise ContractError("; ".join(problems), gate="preflight", path=str(ctx.ref),
                                line=c.constant_lines.get("constraints"), fix=CONSTRAINTS_FIX)
    if "dtypes" in c.constants:
        _check_dtypes(ctx, c)
    if "dtype_tolerances" in c.constants:
        value = c.constants["dtype_tolerances"]
        ok = isinstance(value, dict) and all(
            k in DTYPE_NAMES and isinstance(v, dict) and set(v) == {"atol", "rtol"}
            and all(isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x < float("inf")
                    for x in v.values()) for k, v in value.items())
        if not ok:
            raise ContractError(f"dtype_tolerances = {value!r} is not a dict of dtype name to {{\"atol\": a, "
                                "\"rtol\": r}", gate="preflight", path=str(ctx.ref),
                                line=c.constant_lines.get("dtype_tolerances"),
                                fix='e.g. dtype_tolerances = {"bfloat16": {"atol": 2e-2, "rtol": 2e-2}}')


def _check_dtypes(ctx: Context, c: PyContract) -> None:
    value = c.constants["dtypes"]
    line = c.constant_lines.get("dtypes")
    if not isinstance(value, (list, tuple)) or not value or not all(isinstance(d, str) for d in value) \
            or len(set(value)) != len(value) or any(d not in DTYPE_NAMES for d in value):
        raise ContractError(f"dtypes = {value!r} is not a list of distinct dtype names among "
                            f"{', '.join(DTYPE_NAMES)}", gate="preflight", path=str(ctx.ref), line=line,
                            fix='e.g. dtypes = ["float32", "bfloat16"] (the first is the one timed)')
    if c.problem_format != "kopt":
        raise ContractError("dtypes is kopt's contract; a KernelBench or GPU MODE problem's dtypes are its own "
                            "(KernelBench: --kopt-precision)", gate="preflight", path=str(ctx.ref), line=line,
                            fix="leave dtypes out of the problem file")
    if len(value) < 2:
        return
    if ctx.kind.launcher == "solve":
        raise ContractError(f"dtypes lists {', '.join(value)}, but {ctx.display}'s solve() fixes its buffers' "
                            "dtypes in its signature", gate="preflight", path=str(ctx.ref), line=line,
                            fix=f"list one dtype (dtypes = [{value[0]!r}]), or write one kernel per dtype")
    default = setup_dtype_default(ctx.kernel)
    if default is None:
        raise ContractError(f"dtypes lists {', '.join(value)}, but {ctx.display}'s setup() takes no dtype "
                            "parameter, so every case would run its one dtype", gate="preflight",
                            path=ctx.display, fix=f"add a parameter dtype={value[0]!r} to setup() and make the "
                                                  "buffers in that dtype (getattr(torch, dtype))")
    if default != value[0] and default != "**kwargs":
        raise ContractError(f"setup()'s dtype defaults to {default!r}, but the reference's first dtype (the one "
                            f"every gate but the dtype cases runs, timing included) is {value[0]!r}",
                            gate="preflight", path=ctx.display,
                            fix=f"give setup() dtype={value[0]!r}, or list {default!r} first in dtypes")


def setup_dtype_default(kernel: Path) -> Any:
    """The literal default of ``setup()``'s ``dtype`` parameter in the kernel file (``"**kwargs"`` when it takes
    ``**kwargs`` instead; ``"<no default>"`` for a parameter without one), None when it has none or the file has no
    ``setup`` (or does not parse)."""
    try:
        tree = ast.parse(Path(kernel).read_bytes())
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "setup":
            a = node.args
            positional = [*a.posonlyargs, *a.args]
            defaults = dict(zip([p.arg for p in positional][len(positional) - len(a.defaults):], a.defaults))
            defaults.update({p.arg: d for p, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None})
            names = [p.arg for p in (*positional, *a.kwonlyargs)]
            if "dtype" in names:
                try:
                    return ast.literal_eval(defaults["dtype"]) if "dtype" in defaults else "<no default>"
                except ValueError:
                    return "<not a literal>"
            return "**kwargs" if a.kwarg is not None else None
    return None

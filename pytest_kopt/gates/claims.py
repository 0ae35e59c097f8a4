"""What a reference claims beyond its dims, checked by the preflight gate from the source (nothing run): the sizes a
specialised kernel requires (``constraints``, :mod:`pytest_kopt.gates.edges`) and the dtypes a dtype-generic kernel
handles (``dtypes``, ``dtype_tolerances``). Each problem is a ContractError naming the file, the line and the fix."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from ..errors import ContractError
from .context import Context
from .pycontract import PyContract
from .edges import parse_constraints

#: The dtype names a reference's ``dtypes`` may list (torch's, without ``torch.``): the floating-point ones the
#: harness draws values for.
DTYPE_NAMES = ("float64", "float32", "float16", "bfloat16")
CONSTRAINTS_FIX = ('e.g. constraints = {"M": {"multiple_of": 128}, "K": {"min": 64}, "N": "fixed"} (keys '
                   'multiple_of, min, max: integers >= 1; "fixed": the kernel is built for the given value)')


#: A relative tolerance at or above this accepts an output off by its own size (|out - ref| <= rtol * |ref| holds for
#: out = 0 and for out = -ref when rtol >= 1, 2): no check of a dtype's rounding needs it.
MAX_RTOL = 1.0


def check_claims(ctx: Context, c: PyContract) -> None:
    """``constraints``, ``dtypes`` and ``dtype_tolerances`` of the reference ``c`` (its contract), against the
    session's dims and the kernel. Raises ContractError (exit 4)."""
    for name in ("constraints", "dtypes", "dtype_tolerances"):
        rewritten = rewritten_lines(ctx.ref, name)
        if rewritten:
            raise ContractError(f"{name} is changed after its literal (line {', '.join(map(str, rewritten))}): "
                                "kopt reads the one top-level literal from the source, without running ref.py, so "
                                "a change made by code would be silently left out", gate="preflight",
                                path=str(ctx.ref), line=rewritten[0],
                                fix=f"write all of {name} in the one literal" + (": " + CONSTRAINTS_FIX
                                                                               if name == "constraints" else ""))
    if c.problem_format == "kopt":
        check_keyword_calls(ctx.ref, REF_KEYWORD_CALLS)
        if Path(ctx.kernel).suffix == ".py":
            check_keyword_calls(Path(ctx.kernel), KERNEL_KEYWORD_CALLS, shown=ctx.display)
    if "constraints" in c.constants:
        _check_constraints(ctx, c)
    if "dtypes" in c.constants:
        if "dtype" in ctx.settings.dims:
            raise ContractError("--kopt-dims gives dtype, which the reference's dtypes decides: each dtype case "
                                "sets it, and every other case runs the first listed", gate="preflight",
                                path=str(ctx.ref), line=c.constant_lines.get("dtypes"),
                                fix="leave dtype out of --kopt-dims (or dims in ref.py); order dtypes so the "
                                    "one to time is first")
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
        listed = c.constants.get("dtypes")
        listed = list(listed) if isinstance(listed, (list, tuple)) else []
        if listed and listed[0] in value:  # the seeds' dtype: its tolerance is the reference's atol/rtol
            raise ContractError(f"dtype_tolerances names {listed[0]}, the first of dtypes, whose cases (the seeds) "
                                "take ref.py's atol and rtol: the entry would never be used", gate="preflight",
                                path=str(ctx.ref), line=c.constant_lines.get("dtype_tolerances"),
                                fix=f"give {listed[0]}'s tolerance as atol/rtol in ref.py and drop its entry")
        unused = [k for k in value if k not in listed]
        if unused:
            raise ContractError(f"dtype_tolerances names {', '.join(unused)}, which dtypes does not list "
                                f"({', '.join(listed) or 'no dtypes'}): no case would use "
                                f"{'it' if len(unused) == 1 else 'them'}", gate="preflight", path=str(ctx.ref),
                                line=c.constant_lines.get("dtype_tolerances"),
                                fix=f"list {', '.join(unused)} in dtypes, or drop "
                                    f"{'its' if len(unused) == 1 else 'their'} entry from dtype_tolerances")
        vacuous = [k for k, v in value.items() if v["rtol"] >= MAX_RTOL]
        if vacuous:
            raise ContractError(f"dtype_tolerances gives {', '.join(vacuous)} rtol >= {MAX_RTOL:g}: an output off "
                                "by its own size, or of the wrong sign, would pass", gate="preflight",
                                path=str(ctx.ref), line=c.constant_lines.get("dtype_tolerances"),
                                fix="give the tolerance the format's rounding needs (bfloat16: about 1.6e-2; "
                                    "float16: about 2e-3), a few times that for long reductions")


def _check_constraints(ctx: Context, c: PyContract) -> None:
    """The literal's entries, and every shape the session is given (each test shape, each ``extra_dims`` entry)
    within them: a shape the kernel does not claim is a contract error, not a run that crashes; a ``"fixed"`` dim
    must be the same in every shape."""
    value, line = c.constants["constraints"], c.constant_lines.get("constraints")
    base = dict(ctx.settings.dims) or dict(ctx.shapes[0] if ctx.shapes else {})
    shapes = [base, *(dict(s) for s in ctx.shapes), *({**base, **e} for e in ctx.extra_dims)]
    problems: list[str] = []
    for i, dims in enumerate(shapes):
        parsed, found = parse_constraints(value, dims)
        problems += [p for p in found if p not in problems]
        if i == 0 and found:
            break  # the literal itself is wrong: its problems are the first to fix
        for name, rule in parsed.items():
            if rule == "fixed" and dims.get(name) != shapes[0].get(name):
                problem = (f"constraints[{name!r}] is \"fixed\" at {name}={shapes[0].get(name)!r}, but a shape "
                           f"the session checks has {name}={dims.get(name)!r}")
                if problem not in problems:
                    problems.append(problem)
    if problems:
        where = "the given dims" if any("break" in p or "fixed" in p for p in problems) else "the literal"
        fix = (CONSTRAINTS_FIX if where == "the literal" else
               "change the shapes given (--kopt-dims, dims or extra_dims in ref.py) to sizes the kernel claims, or "
               "widen the constraint if the kernel handles those sizes")
        raise ContractError("; ".join(problems), gate="preflight", path=str(ctx.ref), line=line, fix=fix)


def rewritten_lines(path: Path, name: str) -> list[int]:
    """Lines of ``path`` (a reference) that change the module-level ``name`` other than by its one top-level
    assignment: a second assignment, an assignment inside a block (``if``, ``for``, a function), an item or
    attribute assignment (``name["M"] = ...``), or a method call on it (``name.update(...)``). [] when the file does
    not parse (the contract's own check says so)."""
    try:
        tree = ast.parse(Path(path).read_bytes())
    except (OSError, SyntaxError, ValueError):
        return []
    top = [n for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign))
           and any(isinstance(t, ast.Name) and t.id == name
                   for t in (n.targets if isinstance(n, ast.Assign) else [n.target]))]
    lines = [n.lineno for n in top[1:]]
    for node in ast.walk(tree):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        for t in targets:
            base = t
            while isinstance(base, (ast.Subscript, ast.Attribute)):
                base = base.value
            if isinstance(base, ast.Name) and base.id == name and (base is not t or node not in top):
                lines.append(node.lineno)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and isinstance(node.func.value, ast.Name) and node.func.value.id == name:
            lines.append(node.lineno)
    return sorted(set(lines))


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
    if ctx.kind.launcher == "solve":
        # one listed dtype would claim nothing shapes() and the pointer types do not already say (and could say
        # otherwise): a .cu's dtypes are its signature's
        raise ContractError(f"dtypes lists {', '.join(value)}, but {ctx.display}'s solve() fixes its buffers' "
                            "dtypes in its signature", gate="preflight", path=str(ctx.ref), line=line,
                            fix="leave dtypes out (shapes() gives each buffer's dtype, checked against solve()'s "
                                "pointers), or write one kernel per dtype")
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


#: The functions of a kopt reference and of a Python or Triton kernel that kopt calls by keyword only
#: (``reference(**buffers, **dims)``, ``shapes(**dims)``, ``make_inputs(seed=s, **dims)``,
#: ``setup(**dims, seed=s, device=d)``, ``run_kernel(**inputs)``).
REF_KEYWORD_CALLS = ("reference", "shapes", "make_inputs", "workload_model")
KERNEL_KEYWORD_CALLS = ("setup", "run_kernel")


def check_keyword_calls(path: Path, names: tuple[str, ...], shown: str | None = None) -> None:
    """A positional-only parameter (before ``/``) of a function in ``names`` that kopt calls by keyword: the call
    fails alike for every case (``reference(x, y, /, n)`` got x and y by name), so it is refused here; so is an
    ``async def`` (its call returns a coroutine). The last top-level ``def`` of a name is the one Python keeps and
    the one checked. Raises ContractError naming the file (``shown``, default ``path``), the ``def`` line and the
    parameters."""
    try:
        tree = ast.parse(Path(path).read_bytes())
    except (OSError, SyntaxError, ValueError):
        return  # the contract's own reading reports a file that does not parse
    last = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}  # the one kept
    for name in names:
        node = last.get(name)
        if isinstance(node, ast.AsyncFunctionDef):
            raise ContractError(f"{name}() is an async def: kopt calls it and uses what it returns, and an async "
                                "function returns a coroutine without running", gate="preflight",
                                path=shown or str(path), line=node.lineno, fix=f"write def {name}(...), not async def")
        if node is not None and node.args.posonlyargs:
            only = [p.arg for p in node.args.posonlyargs]
            raise ContractError(f"{name}() takes {', '.join(only)} positional-only (before its '/'), and kopt "
                                f"calls {name}() by keyword, so every call would fail alike",
                                gate="preflight", path=shown or str(path), line=node.lineno,
                                fix=f"remove the '/' from def {name}(...)")


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

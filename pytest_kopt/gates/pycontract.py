"""Static contracts of the Python files: ``ref.py`` (kopt's ``reference``, or a field format's entry points) and a
Triton or Python candidate's ``setup``/``run_kernel``.

Everything here reads source text with ``ast``: nothing is imported or run, so the preflight gate is safe in the
pytest process. Contracts follow SKILL.md's upstream (``reference(**kwargs)``) plus the ``shapes(**dims)``
extension described in the README. The C++ side (``solve``'s signature, headers) is :mod:`.contract`.
"""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ContractError, did_you_mean
from .contract import Param


@dataclass(frozen=True, slots=True)
class PyContract:
    """What a Python file defines at module level: function names with their parameters, and literal constants
    (None when not a literal) with the line of their assignment."""

    functions: dict[str, tuple[list[str], bool, int]]  # name -> (params, has **kwargs, line)
    constants: dict[str, object]
    uses_triton_jit: bool
    constant_lines: dict[str, int] = field(default_factory=dict)
    #: function name -> its parameters without a default value (what a caller must pass)
    required: dict[str, list[str]] = field(default_factory=dict)
    #: ``setup()``'s returned literal: (input names, output names, line) when it returns
    #: ``{"inputs": {"x": ...}, "outputs": ["y"]}`` written out; None when it builds the dict otherwise
    setup_literal: tuple[list[str], list[str], int] | None = None
    #: decorated function name -> the Triton decorators that tune it (``autotune``, ``heuristics``), in order
    tuned: dict[str, list[str]] = field(default_factory=dict)
    #: module-level class names
    classes: tuple[str, ...] = ()
    #: every name a module-level assignment binds (``a, b = 1, 2`` included): a KernelBench problem's sizes
    assigned: tuple[str, ...] = ()
    #: module-level functions with a ``return <value>`` in their own body (not in a nested function), lambdas, and
    #: entry points bound to what this file does not show (taken as returning)
    returns_value: frozenset[str] = frozenset()
    #: entry points whose signature this file does not show (imported, ``functools.partial``, another module's)
    unknown_signature: frozenset[str] = frozenset()
    #: the line of the first module-level relative import (``from ._impl import ...``), None when there is none
    relative_import: int | None = None
    #: the modules (absolute, as written) that entry points are imported from: ``from _impl import run_kernel``
    entry_modules: tuple[str, ...] = ()

    @property
    def problem_format(self) -> str:
        """A reference's format: ``kernelbench`` (``class Model`` and ``get_inputs``), ``gpumode``
        (``generate_input`` and ``ref_kernel``), else ``kopt`` (``reference``)."""
        if "reference" in self.functions:
            return "kopt"
        if "Model" in self.classes and "get_inputs" in self.functions:
            return "kernelbench"
        if "ref_kernel" in self.functions and "generate_input" in self.functions:
            return "gpumode"
        return "kopt"

    @property
    def candidate_format(self) -> str:
        """A candidate's format: ``kopt`` (``run_kernel``), ``kernelbench`` (``class ModelNew``), ``gpumode``
        (``custom_kernel``)."""
        if "run_kernel" in self.functions:
            return "kopt"
        if "ModelNew" in self.classes:
            return "kernelbench"
        if "custom_kernel" in self.functions:
            return "gpumode"
        return "kopt"


def _triton_decorators(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    """``autotune``/``heuristics`` for each ``@triton.autotune(...)``/``@autotune(...)`` (and heuristics) on
    ``node``."""
    out = []
    for d in node.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        name = target.attr if isinstance(target, ast.Attribute) else target.id if isinstance(target, ast.Name) else ""
        if name in ("autotune", "heuristics"):
            out.append(name)
    return out


class _NotLiteral:
    """Marks a module-level constant whose value is an expression, not a literal."""

    def __repr__(self) -> str:
        return "<an expression, not a literal>"


_NOT_LITERAL = _NotLiteral()


def read_python(path: Path, gate: str = "preflight") -> PyContract:
    """Parse a Python file with ``ast`` (no import; bytes, so a BOM or a coding cookie is honoured). Raises
    ContractError on a syntax or encoding error, with its line. Memoised on (path, mtime, size): collection asks
    for the same reference once per kernel and gate."""
    try:
        st = path.stat()
    except OSError as exc:
        raise ContractError(f"cannot be read: {exc}", gate=gate, path=str(path), fix="check the path") from None
    return _read_python(str(path), st.st_mtime_ns, st.st_size, gate)


@functools.lru_cache(maxsize=256)
def _read_python(path_str: str, mtime_ns: int, size: int, gate: str) -> PyContract:
    path = Path(path_str)
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except SyntaxError as exc:
        raise ContractError(f"syntax error: {exc.msg}", gate=gate, path=str(path), line=exc.lineno,
                            fix="fix the Python syntax") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise ContractError(f"cannot be decoded: {exc}", gate=gate, path=str(path),
                            fix="save the file as UTF-8 (or declare its coding)") from None
    except (RecursionError, MemoryError):
        raise ContractError("too deeply nested for Python's parser to read", gate=gate, path=str(path),
                            fix="split the expression into named parts") from None
    except OSError as exc:
        raise ContractError(f"cannot be read: {exc}", gate=gate, path=str(path), fix="check the path") from None
    functions: dict[str, tuple[list[str], bool, int]] = {}
    required: dict[str, list[str]] = {}
    setup_literal: tuple[list[str], list[str], int] | None = None
    constants: dict[str, object] = {}
    constant_lines: dict[str, int] = {}
    tuned: dict[str, list[str]] = {}
    returning: set[str] = set()
    unknown: set[str] = set()
    relative: int | None = None
    entry_modules: list[str] = []
    classes = tuple(n.name for n in tree.body if isinstance(n, ast.ClassDef))
    assigned = tuple(t.id for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign))
                     for target in (n.targets if isinstance(n, ast.Assign) else [n.target])
                     for t in ast.walk(target) if isinstance(t, ast.Name))

    def drop(name: str) -> None:  # a later binding that is no function replaces an earlier one
        for table in (functions, required):
            table.pop(name, None)
        returning.discard(name)
        unknown.discard(name)

    top = {id(n) for n in tree.body}  # constants are read from the top level alone (claims.rewritten_lines)
    # in order, so the last module-level binding of a name wins, as it does when the file runs
    for node in _module_level(tree.body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            drop(node.name)
            if _triton_decorators(node):
                tuned[node.name] = _triton_decorators(node)
            a = node.args
            functions[node.name] = ([x.arg for x in a.posonlyargs + a.args + a.kwonlyargs], a.kwarg is not None,
                                    node.lineno)
            required[node.name] = _required(a)
            if _returns_value(node):
                returning.add(node.name)
            if node.name == "setup":
                setup_literal = _returned_literal(node)
        elif (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)) \
                or (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None):
            name = node.targets[0].id if isinstance(node, ast.Assign) else node.target.id  # type: ignore[union-attr]
            value: ast.expr = node.value  # type: ignore[assignment]
            try:
                literal: object = ast.literal_eval(value)
            except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
                literal = _NOT_LITERAL
            if id(node) in top:
                constant_lines[name], constants[name] = node.lineno, literal
            if name not in ENTRY_POINTS:
                continue
            drop(name)
            if literal is not _NOT_LITERAL:
                continue  # `reference = None`: no function (check_reference says which line)
            if isinstance(value, ast.Lambda):
                a = value.args
                functions[name] = ([x.arg for x in a.posonlyargs + a.args + a.kwonlyargs], a.kwarg is not None,
                                   node.lineno)
                required[name] = _required(a)
                returning.add(name)  # a lambda returns its body
            elif isinstance(value, ast.Name) and value.id in functions:  # an alias of a function of this file
                functions[name] = (*functions[value.id][:2], node.lineno)
                if value.id in required:
                    required[name] = required[value.id]
                returning.update({name} if value.id in returning else ())
                unknown.update({name} if value.id in unknown else ())
            else:  # partial(...), another module's function: its signature is not in this file
                functions[name] = ([], True, node.lineno)
                returning.add(name)
                unknown.add(name)
        elif isinstance(node, ast.ImportFrom):
            if node.level and relative is None and id(node) in top:  # in a try, its except may be the fallback
                relative = node.lineno
            for alias in node.names:
                name = alias.asname or alias.name
                if name in ENTRY_POINTS:  # its signature lives in the other module
                    if not node.level and node.module and node.module not in entry_modules:
                        entry_modules.append(node.module)
                    drop(name)
                    functions[name] = ([], True, node.lineno)
                    returning.add(name)
                    unknown.add(name)
        elif isinstance(node, ast.Delete):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    drop(target.id)
    # a Triton kernel file imports triton (its @jit kernel may live in a module it imports)
    uses_jit = any(isinstance(n, ast.Import) and any(a.name.split(".")[0] == "triton" for a in n.names)
                   or isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "triton"
                   for n in ast.walk(tree))
    return PyContract(functions=functions, constants=constants, uses_triton_jit=uses_jit,
                      constant_lines=constant_lines, required=required, setup_literal=setup_literal, tuned=tuned,
                      classes=classes, assigned=assigned, returns_value=frozenset(returning),
                      unknown_signature=frozenset(unknown), relative_import=relative,
                      entry_modules=tuple(entry_modules))


#: The entry points of kopt's and the field's formats that a file may bind without a ``def``: ``reference = impl``,
#: ``run_kernel = functools.partial(...)``, ``from .impl import custom_kernel``, a lambda. Such a binding defines the
#: function for the contract (the last binding of a name wins, as when the file runs); its signature is the lambda's
#: or the aliased local function's, else unknown (taken as ``**kwargs``, so the static parameter checks leave it to
#: the run, where a wrong call fails with the file's own traceback).
ENTRY_POINTS = frozenset({"reference", "shapes", "workload_model", "setup", "run_kernel", "custom_kernel",
                          "ref_kernel", "generate_input", "check_implementation", "get_inputs", "get_init_inputs"})


def _module_level(body: list[ast.stmt]) -> list[ast.stmt]:
    """The statements of a module's body in order, with those inside its ``if``, ``try`` and ``with`` blocks (they
    run at import too: ``try: from fast import reference`` / ``except ImportError: def reference(...)``), never
    those inside a function or class."""
    out: list[ast.stmt] = []
    for node in body:
        if isinstance(node, ast.If):
            out += _module_level(node.body) + _module_level(node.orelse)
        elif isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
            out += _module_level(node.body)  # type: ignore[attr-defined]
            for handler in node.handlers:  # type: ignore[attr-defined]
                out += _module_level(handler.body)
            out += _module_level(node.orelse) + _module_level(node.finalbody)  # type: ignore[attr-defined]
        elif isinstance(node, ast.With):
            out += _module_level(node.body)
        else:
            out.append(node)
    return out


def _required(a: ast.arguments) -> list[str]:
    """The parameters a caller must pass: positional ones without a default, keyword-only ones without one."""
    positional = a.posonlyargs + a.args
    no_default = positional[:len(positional) - len(a.defaults)]
    return [x.arg for x in no_default] + [x.arg for x, d in zip(a.kwonlyargs, a.kw_defaults) if d is None]


def _returns_value(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """True when ``fn``'s own body (nested functions and classes aside) has a ``return`` with a value."""
    todo: list[ast.AST] = list(fn.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Return) and node.value is not None:
            return True
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(node))
    return False


def _returned_literal(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[list[str], list[str], int] | None:
    """(input names, output names, line) of a ``return {"inputs": {...}, "outputs": [...]}`` written out in
    ``fn`` (string keys and string list items), the last such return; None when there is none."""
    found = None
    for node in ast.walk(fn):
        if not isinstance(node, ast.Return) or not isinstance(node.value, ast.Dict):
            continue
        top = {k.value: v for k, v in zip(node.value.keys, node.value.values)
               if isinstance(k, ast.Constant) and isinstance(k.value, str)}
        ins, outs = top.get("inputs"), top.get("outputs")
        if not isinstance(ins, ast.Dict) or not isinstance(outs, (ast.List, ast.Tuple)):
            continue
        names = [k.value for k in ins.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
        listed = [e.value for e in outs.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        if len(names) == len(ins.keys) and len(listed) == len(outs.elts):
            found = (names, listed, node.lineno)
    return found


def _tolerance_ok(v: object) -> bool:
    """A tolerance literal: an int or float, finite (``1e999`` is inf, which passes any error) and >= 0."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < float("inf")


def no_relative_import(c: PyContract, path: Path) -> None:
    """Raise ContractError for a module-level relative import (``from ._impl import run_kernel``): kopt loads each
    file as a top-level module with its folder on ``sys.path``, so such an import can never run."""
    if c.relative_import is not None:
        raise ContractError("a relative import (`from .module import ...`): kopt loads this file as a top-level "
                            "module, where a relative import has no package to be relative to", gate="preflight",
                            path=str(path), line=c.relative_import,
                            fix="import by the module's own name (`from _impl import ...`): the file's folder is "
                                "on sys.path")


def check_reference(path: Path) -> PyContract:
    """Check ``ref.py``: ``reference(**kwargs)`` required; ``atol``/``rtol`` numbers >= 0 when present.

    Optional: ``workload_model(**dims) -> {"flops", "bytes_min"}``, ``shapes(**dims) -> {name: (shape, dtype)}``.
    Raises ContractError naming the file, the line and the fix.
    """
    c = read_python(path)
    no_relative_import(c, path)
    if c.problem_format != "kopt":
        return c
    if "reference" not in c.functions:
        if "reference" in c.constants:  # bound last to a literal
            raise ContractError(f"`reference = {c.constants['reference']!r}` is not a function", gate="preflight",
                                path=str(path), line=c.constant_lines.get("reference"),
                                fix="bind reference to a function: def reference(**kwargs), a lambda or an import")
        raise ContractError("no function `reference` defined", gate="preflight", path=str(path),
                            fix="define def reference(**kwargs): it reads the inputs and writes the outputs in place")
    for tol in ("atol", "rtol"):
        if tol in c.constants:
            v = c.constants[tol]
            if isinstance(v, dict) and v and all(isinstance(k, str) for k in v):
                bad = {k: x for k, x in v.items() if not _tolerance_ok(x)}
                if not bad:
                    continue
                v = bad
            if not _tolerance_ok(v):
                raise ContractError(f"{tol} = {v!r} is not a finite non-negative number literal", gate="preflight",
                                    path=str(path), line=c.constant_lines.get(tol),
                                    fix=f"write e.g. {tol} = 1e-3 at module level")
    return c


def check_triton(path: Path, dims: dict[str, int | float], require_jit: bool = True) -> PyContract:
    """Check a Triton kernel file: ``setup(**dims, seed)`` and ``run_kernel(**inputs)`` and (when
    ``require_jit``) a ``@triton.jit``; a pure-Python candidate passes ``require_jit=False``.

    Raises ContractError when one is missing, or when ``setup`` cannot take a given dim or ``seed``.
    """
    c = read_python(path)
    no_relative_import(c, path)
    if c.candidate_format != "kopt":
        return c  # ModelNew / custom_kernel: the problem file generates the inputs
    for name, fix in (("setup", "def setup(M, N, seed, device='cuda') -> {'inputs': {...}, 'outputs': [names]}"),
                      ("run_kernel", "def run_kernel(**inputs): launches the @triton.jit kernel")):
        if name not in c.functions:
            raise ContractError(f"no function `{name}` defined", gate="preflight", path=str(path), fix=fix)
    if require_jit and not imports_triton(path):  # the @jit kernel may come with the entry points it imports
        raise ContractError("no @triton.jit kernel found", gate="preflight", path=str(path),
                            fix="decorate the kernel with @triton.jit")
    params, has_kwargs, line = c.functions["setup"]
    if not has_kwargs:
        for needed in (n for n in [*dims, "seed"] if n not in params):
            raise ContractError(f"setup() has no parameter `{needed}`" + did_you_mean(needed, params),
                                gate="preflight", path=str(path), line=line,
                                fix=f"add `{needed}` to setup()'s parameters (or accept **kwargs)")
    missing = [n for n in c.required.get("setup", []) if n not in dims and n not in ("seed", "device")]
    if missing:
        raise ContractError(f"setup() needs {', '.join(missing)}, which --kopt-dims does not give", gate="preflight",
                            path=str(path), line=line,
                            fix="add " + ",".join(f"{n}=<value>" for n in missing) + " to --kopt-dims")
    negative = [f"{n}={v}" for n, v in dims.items() if isinstance(v, int) and v < 0 and n in params]
    if negative:
        raise ContractError(f"--kopt-dims {', '.join(negative)}: setup() takes sizes, and a size is not negative",
                            gate="preflight", path=str(path), line=line, fix="give non-negative sizes")
    if c.setup_literal is not None:
        ins, outs, ret_line = c.setup_literal
        returned = [o for o in outs if o not in ins]
        if returned and "run_kernel" not in c.returns_value:
            raise ContractError(f"setup() lists {', '.join(map(repr, returned))} among its outputs but not among its "
                                "inputs, so run_kernel() must return it, and run_kernel() has no return with a value",
                                gate="preflight", path=str(path), line=c.functions["run_kernel"][2],
                                fix=f"return {returned[0] if len(returned) == 1 else 'them'} from run_kernel() "
                                    f"(or allocate {returned[0]} in setup() and write it in place)")
        if not outs:
            raise ContractError("setup() lists no outputs, so nothing can be checked", gate="preflight",
                                path=str(path), line=ret_line,
                                fix='list the outputs: buffers among the inputs that the kernel writes in place ("outputs": ["y"]), '
                                    'names run_kernel() returns, or leave out "outputs" when it returns them all')
    return c


_IMPORTS_TRITON = re.compile(r"^\s*(?:import\s+triton|from\s+triton[\s.])", re.MULTILINE)


def imports_triton(path: Path, _seen: frozenset[Path] = frozenset()) -> bool:
    """True for a Python file that uses ``@triton.jit``, or whose entry points come from a module beside it that does
    (``from _impl import setup, run_kernel``, followed file to file); for one that does not parse, one whose text
    imports triton (so the preflight item can report the syntax error instead of collection failing on it)."""
    try:
        c = read_python(path)
        if c.uses_triton_jit:
            return True
        seen = _seen | {path.resolve()}
        beside = (path.parent / (m.replace(".", "/") + ".py") for m in c.entry_modules)
        return any(imports_triton(f, seen) for f in beside if f.is_file() and f.resolve() not in seen)
    except ContractError:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            return False
        return bool(_IMPORTS_TRITON.search(text))


def unused_dims(dims: dict[str, int | float], solve_params: list[Param], *contracts: PyContract) -> list[str]:
    """Dims no one names: not a scalar of ``solve()``, not a parameter of any function the given Python files
    define (``setup``, ``reference``, ``shapes``, ``workload_model``, ``make_inputs``...). Usually a typo (``HW``
    for ``W``); a function that reads a dim only through ``**kwargs`` cannot be seen, so callers warn, never fail."""
    if any(c.unknown_signature for c in contracts):
        return []  # an imported or wrapped entry point may take any dim: nothing can be called unused
    named = {p.name for p in solve_params if not p.is_pointer}
    for c in contracts:
        for params, _kwargs, _line in c.functions.values():
            named.update(params)
        if c.problem_format == "kernelbench":  # its sizes are module globals, which dims of the same name set
            named.update(c.assigned)
    return [d for d in dims if d not in named]

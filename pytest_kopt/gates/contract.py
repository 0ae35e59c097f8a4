"""Static contracts of the C++ side: CUDA/CUTLASS ``solve``'s signature, the macros and headers it sees, and which
files are Triton or CUTLASS sources.

Everything here reads source text (regex over comment-stripped C++): nothing is compiled or run, so the preflight
gate is safe in the pytest process. The contract follows SKILL.md's upstream (``extern "C" void solve(...)``). The
Python files' contracts (``ref.py``, ``setup``/``run_kernel``) are :mod:`.pycontract`.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import ContractError, given_instead

#: C type spelling -> dtype name used by the harness (torch attribute of the same name).
C_TYPES: dict[str, str] = {
    "float": "float32", "double": "float64", "__half": "float16", "half": "float16",
    "__nv_bfloat16": "bfloat16", "nv_bfloat16": "bfloat16",
    "int": "int32", "signed int": "int32", "int32_t": "int32", "unsigned int": "uint32", "unsigned": "uint32",
    "uint32_t": "uint32", "long": "int64", "long long": "int64", "long int": "int64", "int64_t": "int64",
    "size_t": "uint64", "unsigned long": "uint64", "unsigned long long": "uint64", "uint64_t": "uint64",
    "short": "int16", "int16_t": "int16", "char": "int8", "signed char": "int8", "int8_t": "int8",
    "unsigned char": "uint8", "uint8_t": "uint8", "bool": "bool",
}
_QUALIFIERS = {"const", "__restrict__", "__restrict", "restrict", "volatile", "struct"}
#: C++ keywords among the type words: never a parameter name, so `unsigned int` alone is an unnamed parameter.
_TYPE_KEYWORDS = {"int", "long", "short", "char", "signed", "unsigned", "float", "double", "bool", "void"}
_INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE)
_CUTLASS_RE = re.compile(r'#\s*include\s*[<"](cutlass|cute)/')


@dataclass(frozen=True, slots=True)
class Param:
    """One parameter of ``solve``: ``dtype`` is a harness dtype name (``float32``, ``bfloat16``, ``int32``...);
    pointers are buffers (``is_const`` -> input, else output), non-pointers are dims/scalars of the same name."""

    name: str
    ctype: str
    dtype: str
    is_pointer: bool
    is_const: bool
    line: int

    @property
    def role(self) -> str:
        """``input``, ``output`` or ``scalar``."""
        if not self.is_pointer:
            return "scalar"
        return "input" if self.is_const else "output"


def strip_comments(source: str, keep_strings: bool = False) -> str:
    """Blank out // and /* */ comments and string literals other than "C" (all strings are kept with
    ``keep_strings``), keeping offsets and newlines."""
    def blank(m: re.Match[str]) -> str:
        text = m.group(0)
        if text == '"C"' or (keep_strings and text.startswith('"')):
            return text
        return "".join(c if c == "\n" else " " for c in text)
    return re.sub(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"', blank, source, flags=re.DOTALL)


def _line_of(source: str, offset: int) -> int:
    return source.count("\n", 0, offset) + 1


#: Macros nvcc defines in the host pass that compiles ``solve`` (kopt passes no ``-D``); ``__CUDA_ARCH__`` and
#: ``__CUDA_ARCH_FEAT_*`` are defined in the device passes only, so host code sees them undefined.
_HOST_MACROS = {"__CUDACC__": "1", "__NVCC__": "1", "__cplusplus": "201703"}
_DEFINE_RE = re.compile(r"^\s*#\s*define\s+([A-Za-z_]\w*)(?!\()(?:\s+(.*?))?\s*$", re.MULTILINE)


def _eval_condition(expr: str, macros: dict[str, str]) -> bool | None:
    """The value of a preprocessor condition (``defined(X)``, ``!``, ``&&``, ``||``, comparisons, integer
    macros), an undefined macro counting as 0 as the C preprocessor does; None when it uses anything else."""
    expr = re.sub(r"defined\s*\(\s*(\w+)\s*\)|defined\s+(\w+)",
                  lambda m: "1" if (m.group(1) or m.group(2)) in macros else "0", expr)

    def value(m: re.Match[str]) -> str:
        v = macros.get(m.group(0), "0").strip() or "1"
        return v if re.fullmatch(r"-?\d+[uUlL]*", v) else "?"

    expr = re.sub(r"\b[A-Za-z_]\w*\b", value, expr)
    expr = re.sub(r"(\d+)[uUlL]+", r"\1", expr)
    py = expr.replace("&&", " and ").replace("||", " or ")
    py = re.sub(r"!(?!=)", " not ", py)
    try:
        tree = ast.parse(py.strip(), mode="eval")
    except SyntaxError:
        return None
    allowed = (ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.UAdd, ast.Compare,
               ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.Constant, ast.BinOp, ast.Add, ast.Sub,
               ast.Mult)
    if not all(isinstance(n, allowed) for n in ast.walk(tree)):
        return None
    try:
        return bool(eval(compile(tree, "<cpp-condition>", "eval"), {"__builtins__": {}}))
    except Exception:  # noqa: BLE001  (a division by zero and the like: unknown)
        return None


def _blank_disabled(text: str, macros: dict[str, str] | None = None) -> str:
    """Blank out the regions of ``#if``/``#ifdef``/``#ifndef``/``#elif``/``#else`` that the host pass of nvcc does
    not compile, keeping offsets, so a disabled ``solve`` is never taken for the real one. Conditions are judged
    with the macros ``#define``d earlier in the text (plus ``macros``, e.g. from its local headers) and the host
    pass's own (:data:`_HOST_MACROS`); a condition that cannot be judged keeps its branch (and its ``#else``)."""
    known = {**_HOST_MACROS, **(macros or {})}
    out = list(text)
    pos = 0
    # per open #if: [this branch compiled (True/False/None unknown), a branch was taken, the enclosing is compiled]
    stack: list[list[bool | None]] = []

    def live() -> bool:
        return all(f[0] is not False for f in stack)

    for ln in text.split("\n"):
        d = ln.strip()
        if d.startswith("#"):
            word = d[1:].strip().split(None, 1)
            key, rest = (word[0], word[1] if len(word) > 1 else "") if word else ("", "")
            rest = re.sub(r"//.*$", "", rest).strip()
            if key in ("if", "ifdef", "ifndef"):
                outer = live()
                name = rest.split()[0] if rest else None
                if key == "if":
                    cond = _eval_condition(rest, known)
                else:
                    cond = None if name is None else (name in known) == (key == "ifdef")
                stack.append([cond, cond is True, outer])
            elif key == "elif" and stack:
                f = stack[-1]
                cond = _eval_condition(rest, known)
                f[0] = False if f[1] else cond
                f[1] = f[1] or cond is True
            elif key == "else" and stack:
                f = stack[-1]
                f[0] = False if f[1] else (None if f[0] is None else True)
            elif key == "endif" and stack:
                stack.pop()
            elif key == "define" and live():
                m = _DEFINE_RE.match(ln)
                if m:
                    known[m.group(1)] = m.group(2) or ""
            elif key == "undef" and live() and rest:
                known.pop(rest.split()[0], None)
        elif not live():
            for i in range(pos, pos + len(ln)):
                out[i] = " "
        pos += len(ln) + 1
    return "".join(out)


def header_macros(path: Path) -> dict[str, str]:
    """The object-like macros the local headers of ``path`` ``#define`` (values as written)."""
    macros: dict[str, str] = {}
    for h in local_headers(path):
        try:
            text = h.read_text(errors="replace")
        except OSError:
            continue
        macros.update({m.group(1): m.group(2) or "" for m in _DEFINE_RE.finditer(strip_comments(text))})
    return macros


def _extern_c_blocks(text: str) -> list[tuple[int, int]]:
    """Spans of ``extern "C" { ... }`` blocks, by brace matching."""
    spans = []
    for m in re.finditer(r'extern\s+"C"\s*\{', text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        spans.append((m.end(), i))
    return spans


def _find_solve(text: str, path: str) -> re.Match[str] | None:
    """The ``solve`` definition (or declaration) with C linkage: prefixed by ``extern "C"`` (or a macro defined as
    it), or inside an ``extern "C" { }`` block. Raises ContractError for a ``__global__`` solve and for one without
    C linkage; returns None when there is no ``solve`` at all."""
    macros = set(re.findall(r'#\s*define\s+(\w+)\s+extern\s+"C"', text))
    blocks = _extern_c_blocks(text)
    found = list(re.finditer(r"\bvoid\s+solve\s*\(([^)]*)\)", text))
    if not found:
        return None
    for m in found:
        head = text[text.rfind(";", 0, m.start()) + 1:m.start()]
        head = head[max(head.rfind("}"), head.rfind("{")) + 1:]
        if "__global__" in head.split():
            raise ContractError("solve() is a __global__ kernel; it must be a host function that launches the kernels",
                                gate="preflight", path=path, line=_line_of(text, m.start()),
                                fix='write extern "C" void solve(...) { my_kernel<<<grid, block>>>(...); }')
        linked = re.search(r'extern\s+"C"', head) or any(w in macros for w in re.findall(r"\w+", head)) \
            or any(a <= m.start() < b for a, b in blocks)
        if linked:
            return m
    first = found[0]
    params = " ".join(first.group(1).split())
    raise ContractError('solve() is not declared extern "C", so its symbol name is mangled', gate="preflight",
                        path=path, line=_line_of(text, first.start()),
                        fix=f'declare it as: extern "C" void solve({params})')


def parse_solve_signature(source: str, path: str = "<kernel>", macros: dict[str, str] | None = None) -> list[Param]:
    """Parse ``extern "C" void solve(...)`` from CUDA source text into its parameters, in order.

    Raises ContractError (with ``path`` and the line) when ``solve`` is missing, not ``extern "C"``, or has a
    parameter of an unsupported type, a pointer to pointer, or no name.
    """
    text = _blank_disabled(strip_comments(source), macros)
    m = _find_solve(text, path)
    if m is None:
        raise ContractError('no host function `extern "C" void solve(...)` found', gate="preflight", path=path,
                            fix='add extern "C" void solve(...) that launches the kernel: const T* = input, '
                                'T* = output, integer scalars = dims')
    params: list[Param] = []
    start = m.start(1)
    body = m.group(1)
    if body.strip() in ("", "void"):
        raise ContractError("solve() takes no parameters", gate="preflight", path=path,
                            line=_line_of(text, m.start()), fix="pass the buffers and dims as parameters")
    offset = 0
    for raw in body.split(","):
        line = _line_of(text, start + offset + (len(raw) - len(raw.lstrip())))
        offset += len(raw) + 1
        decl = " ".join(raw.replace("*", " * ").replace("&", " & ").split())
        if "&" in decl or "[" in decl or "=" in decl:
            raise ContractError(f"solve() parameter `{decl}` is a reference, array or has a default value",
                                gate="preflight", path=path, line=line, fix="use plain pointers and scalars")
        tokens = decl.split()
        stars = tokens.count("*")
        if stars > 1:
            raise ContractError(f"solve() parameter `{decl}` is a pointer to pointer", gate="preflight", path=path,
                                line=line, fix="pass each buffer as its own T* parameter")
        star_at = tokens.index("*") if stars else len(tokens)
        before = tokens[:star_at]
        is_const = "const" in before
        words = [t for t in tokens if t not in _QUALIFIERS and t != "*"]
        if len(words) < 2 or words[-1] in _TYPE_KEYWORDS:
            raise ContractError(f"solve() parameter `{decl}` has no name", gate="preflight", path=path, line=line,
                                fix="name every parameter; scalars are matched to --kopt-dims by name")
        name = words[-1]
        ctype = " ".join(words[:-1])
        if ctype not in C_TYPES:
            raise ContractError(f"solve() parameter `{name}` has unsupported type `{ctype}`", gate="preflight",
                                path=path, line=line,
                                fix="use float, double, __half, __nv_bfloat16 or an integer type")
        params.append(Param(name=name, ctype=ctype, dtype=C_TYPES[ctype], is_pointer=bool(stars),
                            is_const=is_const, line=line))
    names = [p.name for p in params]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        # point at the first repeated declaration, where a compiler reports the redefinition
        again = next(p for i, p in enumerate(params) if p.name in names[:i])
        raise ContractError(f"solve() has duplicate parameter names {sorted(dup)}", gate="preflight", path=path,
                            line=again.line, fix="give each parameter its own name")
    if not any(p.role == "output" for p in params):
        raise ContractError("solve() has no output buffer (every pointer is const)", gate="preflight", path=path,
                            line=params[0].line, fix="drop const from the pointer(s) the kernel writes")
    return params


def uses_cutlass(path: Path) -> bool:
    """True when ``path`` or a local header it includes (transitively) includes CUTLASS or CuTe headers."""
    for f in (path, *local_headers(path)):
        try:
            if is_cutlass(f.read_text(errors="replace")):
                return True
        except OSError:
            continue
    return False


def is_cutlass(source: str) -> bool:
    """True when the source includes CUTLASS or CuTe headers (``#include <cutlass/...>`` or ``<cute/...>``)."""
    # keep string literals: `#include "cutlass/..."` is one
    return bool(_CUTLASS_RE.search(strip_comments(source, keep_strings=True)))


def check_dims(params: list[Param], dims: dict[str, int | float], path: str) -> None:
    """Every scalar of ``solve`` must have a dim of the same name; integer scalars need integer values. Raises
    ContractError naming the parameter's line and the ``--kopt-dims`` fix (and a given dim it looks mistyped as)."""
    missing = [p for p in params if not p.is_pointer and p.name not in dims]
    if missing:  # all of them at once, so one run tells the whole fix
        names = ", ".join(f"`{p.ctype} {p.name}`" for p in missing)
        raise ContractError(f"solve() scalar{'s' if len(missing) > 1 else ''} {names} "
                            f"{'have' if len(missing) > 1 else 'has'} no value in --kopt-dims"
                            + given_instead(missing[0].name, list(dims)), gate="preflight",
                            path=path, line=missing[0].line,
                            fix="add " + ",".join(f"{p.name}=<value>" for p in missing) + " to --kopt-dims")
    for p in params:
        if p.is_pointer:
            continue
        number = p.dtype.startswith("float")  # a float scalar takes an int too; neither takes a string or a tuple
        if not isinstance(dims[p.name], (int, float) if number else int) or isinstance(dims[p.name], bool):
            raise ContractError(f"solve() scalar `{p.ctype} {p.name}` is {'a number' if number else 'an integer'} but "
                                f"--kopt-dims gives {dims[p.name]!r}", gate="preflight", path=path, line=p.line,
                                fix=f"give {'a number' if number else 'an integer'} value for {p.name}")


def local_headers(source: Path, include_dirs: tuple[Path, ...] = ()) -> list[Path]:
    """All ``#include "..."`` headers reachable from ``source`` that exist beside it or in ``include_dirs``,
    recursively, sorted. System headers (``<...>``) are covered by the compiler version in the key."""
    seen: set[Path] = set()
    todo = [source]
    while todo:
        f = todo.pop()
        try:
            text = f.read_text(errors="replace")
        except OSError:
            continue
        for inc in _INCLUDE_RE.findall(text):
            for base in (f.parent, *include_dirs):
                cand = (base / inc).resolve()
                if cand.is_file():
                    if cand not in seen:
                        seen.add(cand)
                        todo.append(cand)
                    break
    return sorted(seen)

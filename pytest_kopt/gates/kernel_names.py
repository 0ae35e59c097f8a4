"""Which of a build's kernel functions a ``.cu`` defines itself: the ``__global__`` functions in its source (and the
local headers it includes), matched by name against the demangled SASS function names. A library header compiles
kernels of its own into every file that includes it (CUB's ``cub::...::detail::EmptyKernel<void>``, which CUB only
queries for its PTX version and never launches); those are not the candidate's to answer for."""

from __future__ import annotations

import re
from pathlib import Path

from ..child.cupti import demangle
from .contract import strip_comments

#: ``__global__`` and what may follow it before the function's name: a return type, qualifiers, and attribute calls
#: (``__launch_bounds__(256, 2)``, ``__cluster_dims__(2, 1, 1)``, ``__maxnreg__(64)``, ``__attribute__((...))``).
_GLOBAL_RE = re.compile(r"\b__global__\b")
_ATTRIBUTE_CALL_RE = re.compile(r"\b__\w+__\s*\((?:[^()]|\([^()]*\))*\)")
_NAME_BEFORE_PAREN_RE = re.compile(r"([A-Za-z_]\w*)\s*(?:<[^;{()]*>\s*)?\(")


def global_functions(source: str) -> set[str]:
    """The names of the ``__global__`` functions ``source`` (CUDA C++ text) declares or defines, without template
    arguments or namespaces (``template <int B> __global__ void __launch_bounds__(256) ns_k(...)`` -> ``ns_k``).
    Comments and string literals are ignored. A kernel whose declaration a macro writes is not seen: the caller treats
    an empty set as "unknown"."""
    text = strip_comments(source)
    names = set()
    for m in _GLOBAL_RE.finditer(text):
        end = min((i for i in (text.find("{", m.end()), text.find(";", m.end())) if i >= 0), default=len(text))
        head = _ATTRIBUTE_CALL_RE.sub(" ", text[m.end():end])
        found = _NAME_BEFORE_PAREN_RE.search(head)
        if found and found.group(1) not in ("__global__", "operator"):
            names.add(found.group(1))
    return names


def qualified_name(name: str) -> str:
    """The qualified name of a SASS function without its return type, template arguments or parameters, demangled
    first when it is a C++ name: ``_Z4vaddPKfS0_Pfi`` -> ``vadd``; ``void ns::k<256>(float*)`` -> ``ns::k``;
    ``_ZN3cub17CUB_300001_SM_9006detail11EmptyKernelIvEEvv`` -> ``cub::CUB_300001_SM_900::detail::EmptyKernel``; an
    ``extern "C"`` kernel's name as it is. A mangled name the demangler cannot read comes back whole (so it matches
    nothing but itself)."""
    text = demangle(name).replace("(anonymous namespace)", "_anon_")
    depth, cut = 0, len(text)
    for i, c in enumerate(text):  # the parameter list is the first "(" outside template arguments
        depth += (c == "<") - (c == ">")
        if c == "(" and depth == 0:
            cut = i
            break
    depth, kept = 0, []
    for c in text[:cut]:  # drop template arguments, which may name other functions and types
        if c == "<":
            depth += 1
        elif c == ">":
            depth -= 1
        elif depth == 0:
            kept.append(c)
    words = "".join(kept).split()
    return words[-1] if words else text  # a template's demangled name starts with its return type


def base_name(name: str) -> str:
    """The unqualified name of a SASS function (:func:`qualified_name` without its namespaces): ``vadd``, ``k``,
    ``EmptyKernel``."""
    return qualified_name(name).rpartition("::")[2]


def own_kernels(sources: list[Path], names: list[str]) -> list[str] | None:
    """Of the SASS function ``names`` (as cuobjdump prints them), those whose :func:`base_name` is a ``__global__``
    function of ``sources`` (the ``.cu`` and its local headers). None when the sources declare no ``__global__``
    function kopt can read (a macro writes them, or every kernel comes from a library template the source
    instantiates): then every function is the candidate's, as without this check. A C++ name the demangler cannot
    read (no libstdc++ here) stays the candidate's too: the rule is never switched off by a missing tool."""
    defined: set[str] = set()
    for path in sources:
        try:
            defined |= global_functions(path.read_text(errors="replace"))
        except OSError:
            continue
    if not defined:
        return None
    return [n for n in names if base_name(n) in defined or (n.startswith("_Z") and demangle(n) == n)]

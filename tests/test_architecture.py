"""The package's seams, read from its source with ``ast``: no import cycle (function-level imports included), the
harness package and the leaves importing nothing above them, no module over 600 lines, no module-level state a
function changes, and no comparison of kernel-kind names outside ``kinds/``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "pytest_kopt"
KIND_NAMES = {"cuda", "cutlass", "triton", "python"}
MUTATORS = {"append", "extend", "add", "update", "pop", "popitem", "clear", "setdefault", "remove", "discard",
            "insert", "appendleft", "move_to_end"}


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if "build" not in p.relative_to(PACKAGE).parts}


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Every pytest_kopt module ``name`` imports when its code runs (module level and inside functions; an
    ``if TYPE_CHECKING:`` block runs never), resolved to the modules of ``known`` (``from . import x`` of a
    submodule counts as importing it; importing ``a.b`` also runs the package ``a``, unless the importer is inside
    ``a``)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    skip = {id(n) for node in ast.walk(tree) if _type_checking_only(node) for n in ast.walk(node)}
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")
                up = up[: len(up) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        for t in targets:
            while t:
                # a package the importer is inside of is running already (it is being imported, or was)
                if t in known and t != name and not name.startswith(t + "."):
                    found.add(t)
                t = t.rpartition(".")[0]
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports_of(name, path, known) for name, path in mods.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm), and self-imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_the_import_graph_is_read_from_the_source() -> None:
    """The reader finds what the package really imports: a function-level import (the loop's summary imports
    nothing of the gates; the scheduler imports the ncu gate at module level) and a relative one."""
    g = graph()
    assert "pytest_kopt.gates.ncu" in g["pytest_kopt.scheduler"]
    assert "pytest_kopt.gates.contract" in g["pytest_kopt.kinds.cuda"]
    assert "pytest_kopt.kinds.base" in g["pytest_kopt.kinds.cuda"]
    assert "pytest_kopt.plugin.hookspec" in g["pytest_kopt.plugin"]


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_the_package() -> None:
    """No module reaches itself through imports, function-level ones included (they hid a cycle of seven gate
    modules before the scheduler owned the work started ahead)."""
    assert cycles(graph()) == []


def test_the_harness_package_imports_nothing_above_it() -> None:
    """``child/`` runs in the harness process: it imports only its own modules (and the standard library, numpy,
    torch, triton), never the gates, the plugin, the loop or a module shared with them."""
    g = graph()
    above = {m: sorted(d for d in deps if not d.startswith("pytest_kopt.child") and d != "pytest_kopt")
             for m, deps in g.items() if m.startswith("pytest_kopt.child")}
    assert {m: d for m, d in above.items() if d} == {}


def test_no_module_over_600_lines() -> None:
    long = {module_name(p): n for p in modules().values() if (n := len(p.read_text().splitlines())) > 600}
    assert long == {}


def module_state_changes(path: Path) -> list[str]:
    """``name: how`` for each module-level name of ``path`` that a function of it rebinds (``global``) or changes
    in place (a subscript assignment or deletion, a mutating method)."""
    tree = ast.parse(path.read_text())
    names = set()
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
            if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
        for t in targets:
            names |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
    found = []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        local = {a.arg for a in fn.args.args + fn.args.kwonlyargs}
        for node in ast.walk(fn):
            if isinstance(node, ast.Global):
                found += [f"{n}: global in {fn.name}" for n in node.names]
            elif isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
                for t in (node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]):
                    if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) and t.value.id in names \
                            and t.value.id not in local:
                        found.append(f"{t.value.id}: item set in {fn.name}")
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in MUTATORS and isinstance(node.func.value, ast.Name) \
                    and node.func.value.id in names and node.func.value.id not in local:
                found.append(f"{node.func.value.id}: .{node.func.attr}() in {fn.name}")
    return found


def test_the_state_finder_finds_a_module_cache(tmp_path: Path) -> None:
    p = tmp_path / "m.py"
    p.write_text("CACHE = {}\nSEEN = set()\nN = 0\n\ndef f(k):\n    CACHE[k] = 1\n    SEEN.add(k)\n\n"
                 "def g():\n    global N\n    N += 1\n\ndef h(CACHE):\n    CACHE[1] = 2\n")
    assert sorted(module_state_changes(p)) == ["CACHE: item set in f", "N: global in g", "SEEN: .add() in f"]


#: Per-process state of a harness process (one process serves one kernel or one reference; none of it is a
#: pytest session's): what each module keeps and why it is the process's own.
HARNESS_PROCESS_STATE = {
    "pytest_kopt.child.loader",  # the user's modules imported in this process, once per version of the file
    "pytest_kopt.child.protocol",  # this process's start-up stamps and role (a timing process or not)
    "pytest_kopt.child.timing",  # the timers of an interleaved measurement, kept between its rounds
    "pytest_kopt.child.share",  # the CUDA IPC allocations this process exported until the judge has read them
    "pytest_kopt.child.cupti",  # the profiler's backend, started once per process
    "pytest_kopt.child.clocks",  # libcuda, loaded once per process
    "pytest_kopt.child.reference",  # the reference's outputs kept per case in the judge's process
    "pytest_kopt.child.autotune",  # the autotune policy installed before a Triton file is imported
}


def test_no_module_level_session_state() -> None:
    """No module of the pytest side keeps session state in a module global (an in-process pytest run, such as
    pytester's, would inherit the last session's); a harness process's own per-process state is listed, each with
    why (:data:`HARNESS_PROCESS_STATE`)."""
    found = {}
    for name, path in modules().items():
        changes = module_state_changes(path)
        if changes and name not in HARNESS_PROCESS_STATE:
            found[name] = changes
    assert found == {}


def kind_comparisons(path: Path) -> list[str]:
    """``line: source`` of each comparison of something named ``kind`` with a kernel-kind name (``ctx.kind ==
    "cuda"``, ``req["kind"] in ("triton", "python")``)."""
    tree = ast.parse(path.read_text())
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        text = ast.unparse(node)
        consts = {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        if "kind" in text and consts & KIND_NAMES:
            out.append(f"{node.lineno}: {text}")
    return out


def test_no_kernel_kind_is_compared_outside_kinds() -> None:
    """Every difference between CUDA, CUTLASS, Triton and Python kernels is a kind's answer (``pytest_kopt/kinds``);
    nothing else compares kind names."""
    found = {name: c for name, path in modules().items()
             if not name.startswith("pytest_kopt.kinds") and (c := kind_comparisons(path))}
    assert found == {}


@pytest.mark.parametrize("snippet,hits", [("if ctx.kind == 'cuda': pass", 1), ("x = req['kind'] in ('triton',)", 1),
                                          ("if kind.name == 'other': pass", 0), ("a = b == 'cuda'", 0)])
def test_the_kind_finder(tmp_path: Path, snippet: str, hits: int) -> None:
    p = tmp_path / "m.py"
    p.write_text(snippet + "\n")
    assert len(kind_comparisons(p)) == hits


#: The leaves: what every layer reads (options, errors, defaults, seeds, the registries, typed records, statistics);
#: docs/architecture.md's "The layers" paragraph lists the same.
LEAVES = ("pytest_kopt.settings", "pytest_kopt.seeds", "pytest_kopt.errors", "pytest_kopt.defaults",
          "pytest_kopt.registry", "pytest_kopt.artifacts", "pytest_kopt.stats")


def test_the_leaves_import_nothing_above_them() -> None:
    """A leaf imports only leaves and the harness package (``child/``, the bottom floor), never a gate, the loop or
    the plugin: the settings once asked the loop's run layout for a kernel's artifact folder and the gates' ref.py
    reader for its shapes, two imports that ran back up (the plugin now hands both in)."""
    def leaf(m: str) -> bool:
        return any(m == p or m.startswith(p + ".") for p in LEAVES + ("pytest_kopt.child",)) or m == "pytest_kopt"

    above = {m: sorted(d for d in deps if not leaf(d)) for m, deps in graph().items()
             if any(m == p or m.startswith(p + ".") for p in LEAVES)}
    assert {m: d for m, d in above.items() if d} == {}
    assert "pytest_kopt.settings" in above and "pytest_kopt.artifacts.bench" in above

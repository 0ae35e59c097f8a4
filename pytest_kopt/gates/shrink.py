"""A failing correctness case shrunk to the smallest one that fails the same way, reported beside the failure:
smaller sizes where the problem's sizes are free, then simpler values, as hypothesis shrinks a failing example
(its shrinker works inside one process's test function; here every attempt is a correctness case run by the
harness, a candidate's four calls and the judge, so the search is kopt's own: greedy, deterministic, bounded).

- **Sizes**: each integer size (the case's dims; a KernelBench problem's literal module globals, tuples
  included), largest first, halved (rounded down, else rounded up where that differs: an odd tail stays odd) while
  the smaller case still fails with the same status; a size the problem
  does not allow (its code raises, the reference refuses it) is a case that does not fail alike, so the search
  stops there.
- **Values**: small integers, simplest first: all ones, then {0, 1}, then {-1, 0, 1} (kopt's ``small_int`` regime
  with a narrower range), where the problem allows kopt's regimes and the judge confirms they were used.
- **Where**: never in the process that judges its seeds (a kernel that keeps state between calls would see other
  seeds' verdicts change with the attempts): the kernel's timing process (a kernel that failed is never timed), or
  its check process where its seeds run in the timing process (``Context.server``'s ``shrink``).
- **Bounds**: :data:`MAX_ATTEMPTS` cases and :data:`BUDGET_S` seconds per shrink, each attempt under the rest of
  that budget; one shrink per status, kernel and session (``correctness/shrunk-<status>.json``): a later seed
  failing alike is pointed at it.
"""

from __future__ import annotations

import ast
import time
from pathlib import Path
from typing import Any, Callable

from ..artifacts import CORRECTNESS, read_dict, write_json
from ..settings import dims_label
from .context import Context
from .edges import FIXED, fit, parse_constraints
from .inputs import draw_plan

#: The failures a shrink looks for a smaller case of: the judge's verdicts on values. Not a crash (RUNTIME_ERROR,
#: TIMEOUT): after one the harness process is replaced (a CUDA error can leave its context unusable), so each
#: attempt would pay a process start, a few seconds, and the budget would buy three or four sizes.
SHRINKABLE = frozenset({"INCORRECT_NUMERICAL", "INCORRECT_SHAPE", "CONSTANT_OUTPUT", "NONDETERMINISTIC", "UNWRITTEN",
                        "STALE_OUTPUT", "INPUT_INDEPENDENT", "INPUT_MUTATED"})
#: Cases one shrink may run: about log2 of each size, plus the three value plans.
MAX_ATTEMPTS = 24
#: Seconds one shrink may take, so a failing session ends soon after its failure (a case of a few hundred elements
#: runs in about 0.3 s on the CPU, candidate and judge; a CUDA error costs a new process, a few seconds).
BUDGET_S = 30.0
#: Simpler values, simplest first: the range of ``small_int`` (inclusive).
SIMPLE_VALUES = ((1, 1), (0, 1), (-1, 1))
#: Module-level names of a reference that are no sizes.
NOT_SIZES = frozenset({"atol", "rtol", "regimes", "dims", "benchmarks", "extra_dims", "inplace", "outputs",
                       "constraints", "dtypes", "dtype_tolerances"})


def literal_sizes(path: Path) -> dict[str, Any]:
    """A KernelBench problem's sizes: its module-level integer literals and tuples of them (``batch_size =
    16``, ``input_shape = (3, 224, 224)``, ``a, b = 16, 32``), by name; {} when the file does not parse."""
    try:
        tree = ast.parse(Path(path).read_bytes())
    except (OSError, SyntaxError, ValueError):
        return {}
    out: dict[str, Any] = {}
    for node in tree.body:
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        target, value = node.targets[0], node.value
        pairs = list(zip(target.elts, value.elts)) if isinstance(target, ast.Tuple) and isinstance(
            value, ast.Tuple) and len(target.elts) == len(value.elts) else [(target, value)]
        for t, v in pairs:
            try:
                literal = ast.literal_eval(v)
            except (ValueError, TypeError, SyntaxError, RecursionError):
                continue
            if isinstance(t, ast.Name) and t.id not in NOT_SIZES and _size(literal):
                out[t.id] = list(literal) if isinstance(literal, tuple) else literal
    return out


def _size(v: Any) -> bool:
    if isinstance(v, (list, tuple)):
        return bool(v) and all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in v)
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def free_sizes(ctx: Context, dims: dict[str, Any]) -> dict[str, Any]:
    """The sizes a shrink may change, by name: the case's integer dims (and tuples of them), and for a KernelBench
    problem its literal module globals (:func:`literal_sizes`) under the dims given; for a kopt reference only
    those the kernel takes at run time and its ``constraints`` do not fix; those above 1, largest first."""
    found = dict(literal_sizes(ctx.ref)) if ctx.problem_format == "kernelbench" else {}
    found.update({k: v for k, v in dims.items() if _size(v)})
    if ctx.problem_format == "kopt":  # what the kernel claims: sizes it takes at run time and the reference frees
        rules = constraint_rules(ctx, dims)
        taken = ctx.kind.runtime_dims(ctx)
        found = {k: v for k, v in found.items() if rules.get(k) != FIXED and (taken is None or k in taken)}
    big = {k: v for k, v in found.items() if _weight(v) > 1}
    return dict(sorted(big.items(), key=lambda kv: -_weight(kv[1])))


def constraint_rules(ctx: Context, dims: dict[str, Any]) -> dict[str, Any]:
    """The reference's ``constraints`` by dim (:func:`pytest_kopt.gates.edges.parse_constraints`; {} for none)."""
    declared = ctx.ref_constant("constraints") if ctx.problem_format == "kopt" else None
    return parse_constraints(declared, dims)[0] if declared is not None else {}


def _within(v: Any, rule: Any) -> Any:
    """``v`` (a halved size) moved down into ``rule`` (:func:`pytest_kopt.gates.edges.fit`); tuples as they are."""
    if isinstance(v, (list, tuple)) or not rule:
        return v
    return fit(v, rule)


def _weight(v: Any) -> int:
    n = 1
    for x in v if isinstance(v, (list, tuple)) else [v]:
        n *= int(x)
    return n


def _halved(v: Any) -> Any:
    return [max(1, x // 2) for x in v] if isinstance(v, (list, tuple)) else max(1, v // 2)


def _halved_up(v: Any) -> Any:
    return [max(1, (x + 1) // 2) for x in v] if isinstance(v, (list, tuple)) else max(1, (v + 1) // 2)


def _values_label(plan: dict[str, Any]) -> str:
    lo, hi = plan.get("int_lo"), plan.get("int_hi")
    return "all ones" if (lo, hi) == (1, 1) else f"small integers in [{lo}, {hi}]"


Attempt = Callable[[dict[str, Any], float], "tuple[str, str, str, str]"]


def smallest_failure(ctx: Context, case: dict[str, Any], exc: Any, key: str, attempt: Attempt) -> dict[str, Any] | None:
    """Shrink the failing ``case`` (its failure ``exc``): ``attempt(case, timeout_s) -> (status, message,
    details, regime)`` runs one case as a correctness item would. ``key``: what the kernel's verdicts depend on in
    this session, which the record of an earlier shrink must carry to be reused. Returns ``label`` (the smallest
    failing case: its changed sizes and values, or that none fails alike), ``summary`` (for the message), ``dims``,
    ``plan``, ``status``, ``message``, ``details``, ``attempts``, ``seconds``, ``from`` (the case shrunk), or None
    when nothing about the case can be shrunk."""
    status = exc.status
    record = Path(ctx.outdir) / CORRECTNESS / f"shrunk-{status}.json"
    earlier = read_dict(record)
    if earlier and earlier.get("key") == key and isinstance(earlier.get("found"), dict):
        found = dict(earlier["found"])
        return {**found, "summary": f"shrunk earlier from {found.get('from')}: {found.get('label')} fails alike"}
    dims = dict(case.get("dims") or ctx.settings.dims)
    plan = dict(case.get("plan") or draw_plan(int(case["seed"]), int(case["index"]), ctx.regimes))
    sizes = free_sizes(ctx, dims)
    # simpler values where the problem allows kopt's regimes and the failure came from the judge's verdict (which
    # says what regime it ran: a guard of the candidate's own process does not)
    simple = "small_int" in ctx.regimes and bool(getattr(exc, "figures", {}).get("regime"))
    if not sizes and not simple:
        return None
    start, tries = time.monotonic(), 0
    best: dict[str, Any] = {"dims": {}, "plan": None, "status": status, "message": exc.message,
                            "details": str(exc.details or "").splitlines()[:6]}

    def fails(changed: dict[str, Any], trial_plan: dict[str, Any]) -> str | None:
        """The regime the attempt ran when it fails alike, else None."""
        nonlocal tries
        left = BUDGET_S - (time.monotonic() - start)
        if tries >= MAX_ATTEMPTS or left < 1.0:
            return None
        tries += 1
        got, message, details, regime = attempt({**case, "dims": {**dims, **changed}, "plan": trial_plan,
                                                 "shape": True}, min(left, ctx.settings.gate_timeout_s))
        if got != status:
            return None
        best.update(dims=dict(changed), message=message, details=details.splitlines()[:6])
        return regime or "?"

    changed: dict[str, Any] = {}
    rules = constraint_rules(ctx, dims)
    for name, value in sizes.items():
        while _weight(value) > 1:
            # half, else half rounded up where that differs: a tail bug (a grid of n // BLOCK) passes at 2048 but
            # fails at 2049, so an odd size halves through odd sizes; each within the reference's constraints
            halves = [_within(h, rules.get(name)) for h in (_halved(value), _halved_up(value))]
            tries_here = [h for h in halves if h is not None and _weight(h) < _weight(value)]
            smaller = next((h for i, h in enumerate(tries_here) if h not in tries_here[:i]
                            and fails({**changed, name: h}, plan)), None)
            if smaller is None:
                break
            changed[name], value = smaller, smaller
    if simple:
        kept = dict(best)
        for lo, hi in SIMPLE_VALUES:
            trial = {**plan, "regime": "small_int", "int_lo": lo, "int_hi": hi}
            ran = fails(dict(changed), trial)
            if ran == "small_int":
                best["plan"] = trial
                break
            best.update(kept)  # failed alike on values of its own (a problem that keeps them): not simpler ones
            if ran is not None:
                break
    order = list(dims) + [k for k in best["dims"] if k not in dims]  # the case's own order of its dims
    # a case at dims of its own (an edge or boundary shape) names them, so its minimum reads as a whole shape
    own = {k: v for k, v in dims.items() if ctx.settings.dims.get(k) != v and _size(v)}
    best["dims"] = {**own, **best["dims"]}
    shown = {k: best["dims"][k] for k in order if k in best["dims"]}
    parts = ([dims_label(shown)] if shown else []) + ([_values_label(best["plan"])] if best["plan"]
                                                                     else [])
    label = ", ".join(parts) or "no smaller size or simpler values fail alike"
    seconds = round(time.monotonic() - start, 2)
    found = {**best, "label": label, "attempts": tries, "seconds": seconds, "from": case_name(case),
             "summary": (f"shrunk to {label} ({tries} cases tried in {seconds:.1f} s), still {status}" if parts else
                         f"not shrunk: {label} ({tries} cases tried in {seconds:.1f} s)")}
    write_json(record, {"key": key, "found": found})
    return found


def case_name(case: dict[str, Any]) -> str:
    """``seed=7``, or ``n=64,seed=7`` for a case at its own dims."""
    return f"{dims_label(case['dims'])},seed={case['seed']}" if case.get("dims") else f"seed={case['seed']}"

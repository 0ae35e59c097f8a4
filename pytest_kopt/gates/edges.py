"""Edge shapes: sizes a kernel that takes its sizes at run time must handle, derived from the given dims (1, a small
prime, not a multiple of 16, just past a power of two, one off the given size), checked by the correctness gate
beside the seeds; the reference's ``constraints`` (what a specialised kernel requires) exclude the ones it never
claimed. Plain functions over dims; :func:`edge_plan` is what the correctness gate asks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..settings import dims_label

#: The categories of edge cases, in the order their items run; each is one case, not a product of sizes:
#: ``ones`` every size 1; ``prime`` every size a small prime; ``unaligned`` a size that is a multiple of 8 but of
#: no 16 (nor 32, 64, 128: a tile's tail while a vector load stays aligned); ``pow2+1`` a size just past a power of
#: two; ``near`` the given size one up (a tail at the scale of the problem).
CATEGORIES = ("ones", "prime", "unaligned", "pow2+1", "near")
#: The largest small prime: above a 32-wide tile (one full tile and a tail of 5), below a 64-wide one.
PRIME_CAP = 37
#: How much larger (as a fraction of the given dims' product of sizes) an edge case may be: the plan gate checked
#: the given dims' memory against the GPU's free memory (with a 512 MiB allowance per process), and a tail of one
#: element per dim stays within a percent of it.
PLAN_SLACK = 0.01
#: The constraint keys a reference's ``constraints`` entry may have, each a positive integer.
CONSTRAINT_KEYS = ("multiple_of", "min", "max")
#: The literal that marks a dim fixed.
FIXED = "fixed"
#: --kopt-edge-shapes's values: ``auto`` (the default: edge shapes where the format and kernel allow; in a loop
#: branch session only where the reference declares ``constraints``) and ``off``.
EDGE_MODES = ("auto", "off")


@dataclass(frozen=True, slots=True)
class EdgePlan:
    """What edge shapes a kernel gets: ``checked`` (category, dims) in run order, ``excluded`` (dims label,
    reason) for derived shapes that fitted to the reference's constraints repeat a shape already checked (or that
    no size within them can replace), ``note`` one line for the report (why there are none, or the counts),
    ``sizes`` the dims varied, ``fitted`` (checked dims label, how it was fitted) for checked shapes moved into the
    constraints."""

    checked: tuple[tuple[str, dict[str, Any]], ...] = ()
    excluded: tuple[tuple[str, str], ...] = ()
    note: str = ""
    sizes: tuple[str, ...] = field(default=())
    fitted: tuple[tuple[str, str], ...] = ()

    def figures(self) -> dict[str, Any]:
        """Scalars for every correctness item's figures (junit user_properties): ``edge_shapes`` (the note),
        ``edge_checked`` (the checked shapes' labels, ``; ``-separated) and ``edge_excluded`` (``label: reason``,
        `` | ``-separated); the empty ones left out."""
        out: dict[str, Any] = {"edge_shapes": self.note}
        if self.checked:
            out["edge_checked"] = "; ".join(dims_label(d) for _, d in self.checked)
        if self.excluded:
            out["edge_excluded"] = " | ".join(f"{label}: {why}" for label, why in self.excluded)
        if self.fitted:
            out["edge_fitted"] = " | ".join(f"{label}: {how}" for label, how in self.fitted)
        return out

    def document(self) -> dict[str, Any]:
        """The kernel's ``edges.json`` (beside its correctness records): the note, the sizes varied, the checked
        shapes (category, dims, label, and ``fitted``: how a shape was moved into the reference's constraints),
        and the excluded ones (label, reason)."""
        how = dict(self.fitted)
        return {"note": self.note, "sizes": list(self.sizes),
                "checked": [{"category": c, "dims": d, "label": dims_label(d),
                             **({"fitted": how[dims_label(d)]} if dims_label(d) in how else {})}
                            for c, d in self.checked],
                "excluded": [{"label": label, "reason": why} for label, why in self.excluded]}


def is_size(v: Any) -> bool:
    """An integer dim of at least 1 (not a bool): a size an edge shape may change. Floats (``eps``) are no sizes."""
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def small_prime(d: int) -> int:
    """The largest prime at most ``min(d, PRIME_CAP)``; 1 for ``d`` = 1."""
    for p in range(min(d, PRIME_CAP), 1, -1):
        if all(p % q for q in range(2, int(p ** 0.5) + 1)):
            return p
    return 1


def unaligned(d: int) -> int:
    """The largest size at most ``d + 7`` that is a multiple of 8 and of no 16: ``((d - 1) // 16) * 16 + 8``
    (4096 -> 4088, 64 -> 56, 1000 -> 1000)."""
    return ((d - 1) // 16) * 16 + 8


def past_pow2(d: int) -> int:
    """The largest power of two below ``d``, plus one (4096 -> 2049, 1000 -> 513); ``d`` itself below 3."""
    return 2 ** ((d - 1).bit_length() - 1) + 1 if d >= 3 else d


def category_value(category: str, d: int) -> int:
    """The size of ``category`` for a dim given as ``d``."""
    if category == "ones":
        return 1
    if category == "prime":
        return small_prime(d)
    if category == "unaligned":
        return unaligned(d)
    if category == "pow2+1":
        return past_pow2(d)
    return d + 1


def parse_constraints(value: Any, dims: dict[str, Any]) -> tuple[dict[str, dict[str, int] | str], list[str]]:
    """A reference's ``constraints`` literal: ``{dim: "fixed"}`` or ``{dim: {"multiple_of": m, "min": a, "max":
    b}}`` (any of the three keys, positive integers). Returns (the constraints by dim, problems): a problem names
    the entry and what is wrong (a dim the given dims lack, an unknown key, a value that is no positive integer, a
    given dim that breaks its own constraint). The preflight gate raises the problems; elsewhere an invalid entry
    is left out."""
    problems: list[str] = []
    out: dict[str, dict[str, int] | str] = {}
    if not isinstance(value, dict):
        return {}, [f"constraints = {value!r} is not a dict of dim name to \"fixed\" or a dict of "
                    f"{', '.join(CONSTRAINT_KEYS)}"]
    for name, entry in value.items():
        if not isinstance(name, str) or name not in dims:
            problems.append(f"constraints names {name!r}, which is not a dim ({', '.join(dims) or 'no dims'})")
            continue
        if entry == FIXED:
            out[name] = FIXED
            continue
        if not isinstance(entry, dict) or not entry:
            problems.append(f"constraints[{name!r}] = {entry!r} is neither \"fixed\" nor a dict of "
                            f"{', '.join(CONSTRAINT_KEYS)}")
            continue
        bad = [k for k in entry if k not in CONSTRAINT_KEYS]
        if bad:
            problems.append(f"constraints[{name!r}] has {', '.join(map(repr, bad))}; the keys are "
                            f"{', '.join(CONSTRAINT_KEYS)}")
            continue
        if not all(is_size(v) for v in entry.values()):
            problems.append(f"constraints[{name!r}] = {entry!r}: each value must be an integer >= 1")
            continue
        if "min" in entry and "max" in entry and entry["min"] > entry["max"]:
            problems.append(f"constraints[{name!r}] = {entry!r}: min is above max")
            continue
        if not is_size(dims[name]):
            problems.append(f"constraints[{name!r}]: {name}={dims[name]!r} is no integer size, and constraints "
                            "apply to sizes only")
            continue
        out[name] = dict(entry)
        why = violation(name, dims[name], entry)
        if why:
            problems.append(f"the given dims break constraints[{name!r}]: {why}")
    return out, problems


def violation(name: str, v: int, rule: dict[str, int] | str) -> str | None:
    """Why size ``v`` of dim ``name`` breaks ``rule`` (a constraints entry), or None."""
    if rule == FIXED or not isinstance(rule, dict):
        return None
    if "multiple_of" in rule and v % rule["multiple_of"]:
        return f"{name}={v} is not a multiple of {rule['multiple_of']}"
    if "min" in rule and v < rule["min"]:
        return f"{name}={v} is below its min {rule['min']}"
    if "max" in rule and v > rule["max"]:
        return f"{name}={v} is above its max {rule['max']}"
    return None


def fit(v: int, rule: dict[str, int] | str, up: bool = False) -> int | None:
    """The size nearest ``v`` that ``rule`` (a constraints entry) allows, rounding down to its ``multiple_of`` (up
    with ``up``: for a size derived above the given one) and clamped to its ``min``/``max`` (each moved to the
    nearest multiple inside): 1 -> 128 and 4088 -> 3968 under ``multiple_of`` 128, 4097 -> 4104 up under
    ``multiple_of`` 8. None when no size satisfies it (a ``max`` below the smallest multiple at or above ``min``)."""
    if not isinstance(rule, dict):
        return v
    m = rule.get("multiple_of", 1)
    lo = -(-rule.get("min", 1) // m) * m
    hi = rule["max"] // m * m if "max" in rule else None
    if hi is not None and hi < lo:
        return None
    w = max(lo, -(-v // m) * m if up else v // m * m)
    return min(w, hi) if hi is not None else w


def _product(dims: dict[str, Any], names: tuple[str, ...]) -> int:
    n = 1
    for k in names:
        n *= int(dims[k])
    return n


def derive(dims: dict[str, Any], sizes: tuple[str, ...], constraints: dict[str, Any],
           skip: list[dict[str, Any]] = ()) -> tuple[list[tuple[str, dict[str, Any]]], list[tuple[str, str]],
                                                     list[tuple[str, str]]]:
    """The edge cases of ``dims`` over the dims named in ``sizes`` (integer sizes the kernel takes at run time and
    no constraint fixes): one case per :data:`CATEGORIES` entry. In ``ones`` and ``prime`` every size takes the
    category's value; in the others one lead dim (the first size for ``unaligned``, the second for ``pow2+1``, the
    third for ``near``, round the sizes) takes it and the others their small prime, so a case costs about the lead
    dim's size times a few dozen per other dim, never the given dims' cost again (a 4096^3 GEMM's ``near`` case is
    37 x 37 x 4097). A size that breaks its constraint is moved to the nearest one it allows (:func:`fit`: a tiled
    GEMM's ``M`` multiple of 128 gets 128 for ``ones``, 3968 for ``unaligned``), so a specialised kernel is still
    checked off its given dims, within what it claims. A case equal to the given dims, a repeat (after fitting: the
    excluded list says which), or one above the given dims' product of sizes by more than :data:`PLAN_SLACK` is
    dropped. Returns (checked: (category, dims), excluded: (dims label as derived, reason), fitted: (checked dims
    label, how it was fitted))."""
    checked: list[tuple[str, dict[str, Any]]] = []
    excluded: list[tuple[str, str]] = []
    fitted: list[tuple[str, str]] = []
    if not sizes:
        return checked, excluded, fitted
    seen = [dict(dims), *[dict(s) for s in skip]]
    limit = _product(dims, sizes) * (1 + PLAN_SLACK) + 1
    led = 0
    for category in CATEGORIES:
        case = dict(dims)
        if category in ("ones", "prime"):
            for k in sizes:
                case[k] = category_value(category, dims[k])
        else:
            lead = sizes[led % len(sizes)]
            led += 1
            for k in sizes:
                case[k] = category_value(category, dims[k]) if k == lead else small_prime(dims[k])
        if any(case == s for s in seen) or _product(case, sizes) > limit:
            continue
        why = [w for k in sizes if (w := violation(k, case[k], constraints.get(k, {})))]
        if not why:
            seen.append(case)
            checked.append((category, case))
            continue
        # a size derived above its given one rounds up to its multiple only while that stays within PLAN_SLACK of
        # the given size: a buffer spanning that dim alone (A[M, M]) would grow past the memory the plan checked
        moved = {k: fit(case[k], constraints.get(k, {}), up=case[k] > dims[k]) for k in sizes}
        moved = {k: fit(case[k], constraints.get(k, {})) if v is not None and v > dims[k] * (1 + PLAN_SLACK) else v
                 for k, v in moved.items()}
        if any(v is None for v in moved.values()):
            excluded.append((dims_label(case), "; ".join(why) + " and no size within ref.py constraints replaces it"))
            continue
        inside = {**case, **moved}
        if any(inside == s for s in seen) or _product(inside, sizes) > limit:
            excluded.append((dims_label(case), "; ".join(why) + f" (ref.py constraints); fitted to them it is "
                             f"{dims_label(inside)}, " + ("the given dims" if inside == dims else "already checked"
                                                          if any(inside == s for s in seen) else "above the plan")))
            continue
        seen.append(inside)
        checked.append((category, inside))
        fitted.append((dims_label(inside), f"{category} {dims_label(case)} fitted to ref.py constraints ("
                       + ", ".join(f"{k} {case[k]} -> {moved[k]}" for k in sizes if moved[k] != case[k]) + ")"))
    return checked, excluded, fitted


def edge_plan(ctx: Any) -> EdgePlan:
    """The edge shapes of ``ctx``'s kernel (a :class:`~pytest_kopt.gates.context.Context`): none with
    ``--kopt-edge-shapes off``, for a KernelBench or GPU MODE problem (its shapes are its own), in a loop branch
    session (``--kopt-run``) whose reference declares no ``constraints`` (the run's dims are the contract its
    kernels were written for), or when the kernel takes no size at run time (its kind's
    :meth:`~pytest_kopt.kinds.base.Kind.runtime_dims`); else :func:`derive` over the first test shape's integer
    sizes that the kernel takes and the reference does not fix. Each case with none says why in ``note``."""
    if ctx.settings.edge_shapes == "off":
        return EdgePlan(note="off (--kopt-edge-shapes off)")
    fmt = ctx.problem_format
    if fmt != "kopt":
        name = {"kernelbench": "a KernelBench", "gpumode": "a GPU MODE"}.get(fmt, f"a {fmt}")
        return EdgePlan(note=f"none: {name} problem is checked at its own fixed shapes")
    declared = ctx.ref_constant("constraints")
    if ctx.settings.loop_mode == "run" and declared is None:
        return EdgePlan(note="none: a loop branch session checks the run's dims only (the reference declares no "
                             "constraints)")
    dims = dict(ctx.settings.dims)
    constraints, _ = parse_constraints(declared if declared is not None else {}, dims)
    taken = ctx.kind.runtime_dims(ctx)
    sizes = tuple(k for k, v in dims.items() if is_size(v) and constraints.get(k) != FIXED
                  and (taken is None or k in taken))
    if not sizes:
        return EdgePlan(note="none: the kernel takes no integer size at run time that the reference leaves free")
    skip = [*ctx.shapes, *({**dims, **e} for e in ctx.extra_dims)]
    checked, excluded, fitted = derive(dims, sizes, constraints, skip)
    note = f"{len(checked)} checked" + (f" ({len(fitted)} fitted to the reference's constraints)" if fitted else "") \
        + (f", {len(excluded)} excluded by constraints" if excluded else "") + f" (sizes {', '.join(sizes)})"
    return EdgePlan(tuple(checked), tuple(excluded), note, sizes, tuple(fitted))

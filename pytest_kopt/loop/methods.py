"""The agent's ``methods.json``, checked against the method registry and the iteration's axis budget (SKILL.md 3c)."""

from __future__ import annotations

import re
from typing import Any, Mapping

from .. import defaults
from .. import registry as registries

#: How an agent ends a run on purpose (:mod:`pytest_kopt.loop.finish`), as the empty-methods problem says it.
FINISH_HINT = 'to end the run without another close, write {"finish": "<why>"} instead'


def normalize_methods(doc: Any) -> dict[str, Any]:
    """``methods.json`` in its full form ``{"methods": [{"id": ...}, ...], ...}`` from the forms an agent writes: a
    bare list, ids as strings (``{"methods": ["memory.tma"]}``); ``{"finish": "<why>"}`` alone has no methods
    (:mod:`pytest_kopt.loop.finish`). Raises ValueError (naming what was found) for anything else: an entry that
    is neither an id nor an object with an ``id``."""
    if isinstance(doc, list):
        doc = {"methods": doc}
    if not isinstance(doc, dict):
        raise ValueError(f"methods.json holds a {type(doc).__name__}, not an object with a 'methods' list")
    if "finish" in doc and "methods" not in doc:
        doc = {**doc, "methods": []}
    listed = doc.get("methods")
    if not isinstance(listed, list):
        raise ValueError(f"'methods' is {type(listed).__name__}, not a list of method ids or objects")
    out = []
    for m in listed:
        if isinstance(m, str):
            out.append({"id": m})
        elif isinstance(m, dict) and isinstance(m.get("id"), str):
            out.append(dict(m))
        else:
            raise ValueError(f"methods entry {m!r} is neither a method id nor an object with an 'id'")
    return {**doc, "methods": out}


_OPS = {">": lambda a, b: a > b, ">=": lambda a, b: a >= b, "<": lambda a, b: a < b, "<=": lambda a, b: a <= b}


class Problem(str):
    """One broken rule of methods.json: the sentence (``str``), plus ``detail``: ``{"method", "rule", "message"}``
    and, for a trigger, ``metric``, ``op``, ``threshold`` and ``value`` (what ncu measured), so an agent acts on
    fields, not on the sentence."""

    detail: dict[str, Any]

    def __new__(cls, message: str, method: str | None, rule: str, **extra: Any) -> "Problem":
        obj = super().__new__(cls, message)
        obj.detail = {"method": method, "rule": rule, "message": message, **extra}
        return obj


def validate_methods(doc: Mapping[str, Any], registry: Mapping[str, Any], budget: Mapping[str, int],
                     state: Mapping[str, Any], arch: str | None,
                     evidence: Mapping[str, Any] | None = None) -> list[Problem]:
    """Check ``methods.json`` (``{"methods": [{"id", "axis"?, "rationale"?, "override_reason"?,
    "acknowledge_failure"?}], "skipped_higher": [...]}``) against the registry and the iteration's axis budget.

    Rules (SKILL.md 3c): known ids; axis as registered; no duplicates; per axis at most min(2, budget[axis]) and in
    total at most sum(budget), where methods of one same-budget group count once (upstream rejects such pairs by
    mistake); no conflicting pair; the arch meets the method's minimum (and ``a`` suffix where required);
    ineffective methods need ``override_reason``; implementation-failed ones ``acknowledge_failure: true``; a
    method selected in an earlier iteration, or whose registry ``trigger`` the iteration's ncu ``evidence``
    (metric -> value, from ncu_top.json) contradicts, needs ``override_reason`` (SKILL.md 3c's scan: already tried,
    trigger condition); the numerics mode (state's ``numerics_mode``, default ``reference``; :func:`numerics_problem`).
    ``arch``: the target the step builds for; None skips the arch rule (a configure-time check, before the step's
    machine is probed: the step's end checks it). A methods.json that lists no method is a problem unless it holds
    ``finish``. Returns the list of problems (empty when valid), each a sentence with its fields in ``.detail``
    (:class:`Problem`)."""
    errors: list[Problem] = []
    by_id = {m["id"]: m for m in registry["methods"]}
    chosen = list(doc.get("methods") or [])
    if not chosen:
        return [] if doc.get("finish") else [Problem(f"methods.json lists no method; {FINISH_HINT}", None, "empty")]
    ids = [m.get("id") for m in chosen]
    for dup in sorted({i for i in ids if ids.count(i) > 1}):
        errors.append(Problem(f"{dup}: listed twice", dup, "duplicate"))
    m_arch = re.match(r"sm_(\d+)([af]?)", arch or "")
    cc, suffix = (int(m_arch.group(1)), m_arch.group(2)) if m_arch else (0, "")
    for m in chosen:
        spec = by_id.get(m.get("id"))
        if spec is None:
            errors.append(Problem(f"{m.get('id')}: not in {registries.path(registries.METHODS)}", m.get("id"),
                                  "unknown"))
            continue
        if m.get("axis") not in (None, spec["axis"]):
            errors.append(Problem(f"{spec['id']}: axis is {spec['axis']}, not {m['axis']}", spec["id"], "axis"))
        if arch is not None and (cc < spec["min_arch"] or (spec.get("arch_suffix") == "a" and suffix != "a")):
            errors.append(Problem(f"{spec['id']}: needs sm_{spec['min_arch']}{spec.get('arch_suffix', '')}+, target is "
                                  f"{arch}", spec["id"], "arch"))
        if spec["id"] in state.get("ineffective_methods", []) and not m.get("override_reason"):
            errors.append(Problem(f"{spec['id']}: was ineffective before; give override_reason (changed bottleneck)",
                                  spec["id"], "ineffective_before"))
        if spec["id"] in state.get("implementation_failed_methods", []) and not m.get("acknowledge_failure"):
            errors.append(Problem(f"{spec['id']}: failed to implement before; set acknowledge_failure: true", spec["id"],
                                  "implementation_failed_before"))
        elif spec["id"] in state.get("selected_methods", []) and not m.get("override_reason") \
                and spec["id"] not in state.get("ineffective_methods", []):
            errors.append(Problem(f"{spec['id']}: already selected in an earlier iteration; give override_reason",
                                  spec["id"], "already_selected"))
        trig = spec.get("trigger") or {}
        value = (evidence or {}).get(trig.get("metric"))
        if isinstance(value, (int, float)) and trig.get("op") in _OPS and not m.get("override_reason") \
                and not _OPS[trig["op"]](value, trig["value"]):
            errors.append(Problem(f"{spec['id']}: its trigger {trig['metric']} {trig['op']} {trig['value']} does not "
                                  f"hold here ({trig['metric']} = {value:g}); give override_reason or pick a triggered "
                                  "method", spec["id"], "trigger", metric=trig["metric"], op=trig["op"],
                                  threshold=trig["value"], value=value))
        numerics = numerics_problem(spec, m, str(state.get("numerics_mode") or defaults.NUMERICS_MODE))
        if numerics is not None:
            errors.append(numerics)
    known = [i for i in ids if i in by_id]
    for a, b in registry["relations"].get("conflicts", []):
        if a in known and b in known:
            errors.append(Problem(f"{a} and {b} conflict", a, "conflict", other=b))
    groups = slots(known, registry)
    for axis in ("compute", "memory", "latency"):
        used = sum(1 for s in groups if by_id[s[0]]["axis"] == axis)
        if used > min(2, budget.get(axis, 0)):
            errors.append(Problem(f"axis {axis}: {used} method slot(s), budget {budget.get(axis, 0)} (cap 2)", None,
                                  "axis_budget", axis=axis, used=used, budget=budget.get(axis, 0)))
    if len(groups) > sum(budget.values()):
        errors.append(Problem(f"{len(groups)} method slots, total budget {sum(budget.values())}", None, "total_budget",
                              used=len(groups), budget=sum(budget.values())))
    return errors


def numerics_problem(spec: Mapping[str, Any], chosen: Mapping[str, Any], mode: str) -> Problem | None:
    """The numerics rule of one method (``spec``: its registry entry, ``semantic`` ``bitwise-preserving``,
    ``reordered`` or ``tolerance-changing``; ``chosen``: its methods.json entry) under the run's ``numerics_mode``
    (SKILL.md's compilation and numerical policy):

    - ``strict`` admits only bitwise-preserving methods, or one marked ``preconditioned: true`` (SKILL.md: "only
      bitwise-preserving or explicitly preconditioned methods");
    - ``reference`` keeps the reference's atol/rtol contract: bitwise-preserving and reordered methods (a reordered
      sum moves results within that tolerance); a tolerance-changing one (lower precision: tensor cores on
      fp16/bf16/tf32) needs the run seeded with ``approximate``;
    - ``approximate`` is that explicit opt-in: every method is admitted.

    No mode loosens or skips a correctness check: every branch and ablation is judged against the reference's
    atol/rtol on every seed (SKILL.md: approximate "still runs all correctness checks"). Returns None when the
    method is admitted."""
    semantic = spec.get("semantic")
    if mode == "strict" and semantic != "bitwise-preserving" and not chosen.get("preconditioned"):
        return Problem(f"{spec['id']}: is {semantic}, and numerics_mode strict admits only bitwise-preserving methods "
                       "(or one marked preconditioned: true with its precondition)", spec["id"], "numerics_strict",
                       semantic=semantic, numerics_mode=mode)
    if mode == "reference" and semantic == "tolerance-changing":
        return Problem(f"{spec['id']}: is tolerance-changing (it computes in lower precision), and numerics_mode "
                       "reference keeps the reference's atol/rtol contract; a run that opts in to such methods is "
                       "seeded with --kopt-numerics-mode approximate (every correctness check still runs, at the "
                       "reference's tolerance)", spec["id"], "numerics_reference", semantic=semantic,
                       numerics_mode=mode)
    return None


def slots(ids: list[str], registry: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """Group ids into budget slots: ids of one same-budget group share a slot."""
    slots: list[tuple[str, ...]] = []
    used: set[str] = set()
    for i in dict.fromkeys(ids):
        if i in used:
            continue
        group = [i]
        for pair in registry["relations"].get("same_budget", []):
            if i in pair:
                group += [j for j in pair if j != i and j in ids and j not in used]
        used.update(group)
        slots.append(tuple(group))
    return slots

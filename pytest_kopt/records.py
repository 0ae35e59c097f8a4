"""What one gate item decided, as the controller records it from the item's report (and the ``--kopt-json``
report lists it): typed, so the loop and the reports read fields, never node ids or message text."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

from .gates.table import GateTable

#: A kernel's verdict when items of it passed and none failed, but no correctness item passed: its output was never
#: compared with the reference (exit 0 all the same: nothing failed).
NOT_CHECKED = "NOT_CHECKED"


@dataclass(frozen=True, slots=True)
class GateRecord:
    """One item: ``kernel`` (its resolved path), ``gate``, ``case`` (``seed=7``, a tool, or None), ``outcome``
    (``passed``, ``failed``, ``skipped``), ``status`` (PASSED, a failure status such as INCORRECT_NUMERICAL,
    SKIPPED or NOT_APPLICABLE), ``exit_code`` (SKILL.md's code of a gate failure; None otherwise), ``blocked_by``
    (the gate whose failure or absence skipped this one), ``duration_s``, ``summary`` (a pass's one line),
    ``message`` (a failure's or skip's), ``figures`` (the item's scalar results); a failure also names ``path`` and
    ``line`` (the file it is in), ``fix`` (what to change) and ``details`` (which outputs and indices, a log tail;
    at most 4,000 characters)."""

    nodeid: str
    kernel: str
    gate: str
    case: str | None
    outcome: str
    status: str
    exit_code: int | None = None
    blocked_by: str | None = None
    duration_s: float = 0.0
    summary: str | None = None
    message: str | None = None
    figures: dict[str, Any] = field(default_factory=dict)
    path: str | None = None
    line: int | None = None
    fix: str | None = None
    details: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The record as the JSON report's item."""
        return asdict(self)

    @property
    def counts_against(self) -> bool:
        """True when this item keeps the kernel from passing the strict gates: it failed, or was skipped for a
        reason other than not applying (a pure-Python candidate has nothing to compile)."""
        return self.outcome == "failed" or (self.outcome == "skipped" and self.status != "NOT_APPLICABLE")


def kernel_verdicts(records: Iterable[GateRecord], table: GateTable) -> list[dict[str, Any]]:
    """One verdict per kernel of a session, in the order of its first record: ``name`` (the node id's file part, as the
    terminal shows it), ``kernel`` (its resolved path), ``status`` (the status of its first failed item in gate
    order, else PASSED, or SKIPPED when every item of it skipped: a selection such as ``-k "timing or ncu"`` on a
    machine without a GPU passes nothing), ``failed_gate`` and ``exit_code`` of that item (None when none failed),
    ``passed``/``failed``/``skipped`` (item counts; a NOT_APPLICABLE item is none of them), ``skipped_gates`` (the
    gates of its skipped items, in gate order), ``not_applicable_gates`` (the gates that do not apply to its kind, a
    Python candidate's compile and SASS), ``output_checked`` (a correctness item passed: without it a PASSED kernel's output was never compared
    with the reference, as on a machine without a GPU for a ``.cu``), ``timed`` (its timing passed), and from that
    timing ``median_ms`` and ``speedup_vs_ref`` (None when not timed). ``table``: the session's gates, whose order
    decides which failure comes first."""
    by: dict[str, list[GateRecord]] = {}
    for r in records:
        by.setdefault(r.nodeid.split("::")[0], []).append(r)
    out = []
    for name, recs in by.items():
        failed = min((r for r in recs if r.outcome == "failed"), key=lambda r: table.rank(r.gate), default=None)
        timing = next((r.figures for r in recs if r.gate == "timing" and r.outcome == "passed"), None)
        # a gate that does not apply to the kernel's kind (a Python candidate's compile and SASS) is no skip: nothing
        # is left for another machine to run there
        na = [r for r in recs if r.outcome == "skipped" and r.status == "NOT_APPLICABLE"]
        skips = [r for r in recs if r.outcome == "skipped" and r.status != "NOT_APPLICABLE"]
        skipped = sorted({r.gate for r in skips}, key=table.rank)
        ran = any(r.outcome == "passed" for r in recs)
        checked = any(r.gate == "correctness" and r.outcome == "passed" for r in recs)
        status = failed.status if failed else ("PASSED" if checked else NOT_CHECKED) if ran else "SKIPPED"
        out.append({"name": name, "kernel": recs[0].kernel, "status": status,
                    "failed_gate": failed.gate if failed else None,
                    "exit_code": failed.exit_code if failed else None,
                    "passed": sum(r.outcome == "passed" for r in recs),
                    "failed": sum(r.outcome == "failed" for r in recs),
                    "skipped": len(skips), "skipped_gates": skipped,
                    "not_applicable_gates": sorted({r.gate for r in na}, key=table.rank),
                    "output_checked": checked,
                    "timed": timing is not None,
                    "median_ms": (timing or {}).get("median_ms"),
                    "speedup_vs_ref": (timing or {}).get("speedup_vs_ref"),
                    **coverage([r for r in recs if r.gate == "correctness"])})
    return out


def coverage(records: list[GateRecord]) -> dict[str, Any]:
    """What a kernel's correctness items say of the shapes and dtypes beyond its seeds (every item carries them,
    :meth:`pytest_kopt.gates.edges.EdgePlan.figures`): ``edge_shapes`` (the note: counts, or why none), the edge
    shapes ``edge_checked`` (the dims labels of the planned shapes whose item passed here; when not all did, the
    note says how many were planned and how many passed) and ``edge_excluded`` (``shape``, ``reason``: what the
    reference's constraints rule out), ``edge_fitted`` (``shape``, ``fitted``: a checked shape moved into those
    constraints, from what), and ``dtypes_checked`` (the dtypes of the items that passed, in order: a dtype whose case
    failed or was refused is not one the kernel was shown to handle); None and empty
    lists when no correctness item carries them, and the plan under "not run" with empty lists when every item
    carrying them was skipped."""
    carrying = [r for r in records if r.figures.get("edge_shapes") is not None]
    ran = [r for r in carrying if r.outcome != "skipped"]
    if carrying and not ran:  # every item skipped (a .cu without a GPU): the plan is reported, nothing as checked
        note = str(carrying[0].figures["edge_shapes"]).removeprefix("planned: ")
        return {"edge_shapes": f"not run (its correctness items were skipped); planned: {note}", "edge_checked": [],
                "edge_excluded": [], "edge_fitted": [], "dtypes_checked": []}
    figs = ran[0].figures if ran else {}
    planned = [x for x in str(figs.get("edge_checked") or "").split("; ") if x]
    # the shapes checked are those whose item passed in this session, not the plan (-k, --lf or a node id may have
    # deselected some, a failure or a skip may have stopped others)
    passed = {str(r.figures.get("dims_checked")) for r in records if r.figures.get("edge_shape")
              and r.outcome == "passed"}
    checked = [x for x in planned if x in passed]
    note = figs.get("edge_shapes")
    if note is not None and len(checked) < len(planned):
        note = f"{str(note).replace(f'{len(planned)} checked', f'{len(planned)} planned', 1)}; {len(checked)} passed"
    excluded = []
    for part in str(figs.get("edge_excluded") or "").split(" | "):
        if part:
            shape, _, reason = part.partition(": ")
            excluded.append({"shape": shape, "reason": reason})
    fitted = []
    for part in str(figs.get("edge_fitted") or "").split(" | "):
        if part:
            shape, _, how = part.partition(": ")
            fitted.append({"shape": shape, "fitted": how})
    dtypes = list(dict.fromkeys(str(r.figures["dtype"]) for r in records
                                if r.outcome == "passed" and r.figures.get("dtype")))
    return {"edge_shapes": note, "edge_checked": checked, "edge_excluded": excluded,
            "edge_fitted": fitted, "dtypes_checked": dtypes}


def for_kernel(records: Iterable[GateRecord], kernel: Path) -> list[GateRecord]:
    """The records of ``kernel``'s items."""
    key = str(Path(kernel).resolve())
    return [r for r in records if r.kernel == key]


def passed(records: Iterable[GateRecord], gate: str) -> bool:
    """Whether an item of ``gate`` passed among ``records`` (a kernel's, :func:`for_kernel`): the sass gate's, for
    SASS this session dumped."""
    return any(r.gate == gate and r.outcome == "passed" for r in records)


def blocker(records: Iterable[GateRecord], strict: tuple[str, ...], table: GateTable) -> GateRecord | None:
    """The record that keeps a kernel from passing ``strict`` gates: the first failed item in ``table``'s order,
    else the first skipped (not not-applicable) item of a gate in ``strict``; None when there is none."""
    recs = list(records)
    failed = [r for r in recs if r.outcome == "failed"]
    if failed:
        return min(failed, key=lambda r: table.rank(r.gate))
    skipped = [r for r in recs if r.counts_against and r.gate in strict]
    return min(skipped, key=lambda r: table.rank(r.gate)) if skipped else None


def stage(record: GateRecord, table: GateTable) -> tuple[str, int]:
    """(stop stage, SKILL.md exit code) of a blocking record: a failure's own gate and code; a skip is charged to
    the gate that blocked it (``blocked_by``: hardware -> 3), by ``table``'s ``stop_exit``."""
    if record.outcome == "failed":
        return record.gate, int(record.exit_code or table.stop_exit(record.gate))
    where = record.blocked_by or record.gate
    return where, table.stop_exit(where)

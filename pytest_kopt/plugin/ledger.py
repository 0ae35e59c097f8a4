"""The controller's ledger: every kopt item's report as a :class:`~pytest_kopt.records.GateRecord`, SKILL.md's
exit code of the session, and the ``--kopt-json`` document."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pytest

from .. import __version__
from ..gates.table import GateTable
from ..records import GateRecord, kernel_verdicts

#: Version of the ``--kopt-json`` document (``registries/report_schema.json``).
JSON_SCHEMA_VERSION = 2


class Ledger:
    """Records, one per kopt item: its call report, or its setup report when it skipped or failed there."""

    def __init__(self, table: GateTable, kernels: tuple[Any, ...] = ()) -> None:
        self.table = table
        #: the session's kernels in order (the baseline, then each candidate as given), resolved paths as text
        self.kernels = {str(k): i for i, k in enumerate(kernels)}
        self.records: list[GateRecord] = []

    def add(self, report: pytest.TestReport) -> None:
        """Record ``report`` when it is a kopt item's deciding report."""
        if "kopt" not in report.keywords:
            return
        if report.when != "call" and not (report.when == "setup" and not report.passed):
            return
        props = dict(report.user_properties)
        message = None
        if report.skipped and isinstance(report.longrepr, tuple):
            message = report.longrepr[2].removeprefix("Skipped: ")
        elif report.failed:
            message = props.get("kopt_message") or str(report.longrepr).splitlines()[-1][:500]
        gate = props.get("kopt_gate") or report.nodeid.split("::")[-1].split("[")[0]
        status = props.get("kopt_status", "SKIPPED" if report.skipped else ("ERROR" if report.failed else "PASSED"))
        self.records.append(GateRecord(
            nodeid=report.nodeid, kernel=str(props.get("kopt_kernel", "")), gate=gate, case=props.get("kopt_case"),
            outcome=report.outcome, status=status, exit_code=props.get("kopt_exit_code"),
            blocked_by=props.get("kopt_blocked_by"), duration_s=round(report.duration, 4),
            summary=props.get("kopt_summary"), message=message, path=props.get("kopt_path"),
            line=props.get("kopt_line"), fix=props.get("kopt_fix"), details=props.get("kopt_details"),
            figures={k: v for k, v in props.items() if not k.startswith("kopt_")}))

    def exit_code(self) -> int | None:
        """SKILL.md's code (2, 3 or 4) of the earliest failing gate in table order, or None when none failed; of two
        kernels failing at the same gate, the one the session names first (the baseline, then the candidates as
        given), whatever order xdist's workers reported them in."""
        failed = [r for r in self.records if r.outcome == "failed" and r.exit_code is not None]
        if not failed:
            return None
        first = min(failed, key=lambda r: (self.table.rank(r.gate), self.kernels.get(r.kernel, len(self.kernels))))
        return int(first.exit_code)  # type: ignore[arg-type]

    def other_failures(self) -> bool:
        """True when an item failed that is no gate's failure (a crash of the plugin, or a user's own test)."""
        return any(r.outcome == "failed" and r.exit_code is None for r in self.records)

    def document(self, *, exit_code: int, settings: Any, env: dict[str, Any], comparisons: list[dict[str, Any]],
                 loop: dict[str, Any] | None) -> dict[str, Any]:
        """The ``--kopt-json`` document (``registries/report_schema.json``), NaN and inf as null. Its ``items`` and
        ``kernels`` follow the session's kernels (the baseline, then each candidate, as given; another kernel, such
        as a loop's, after them by path) and each kernel's items the gates' order, whatever order xdist's workers
        reported them in."""
        rank = {str(k): i for i, k in enumerate(settings.kernels)}
        records = sorted(self.records, key=lambda r: (rank.get(r.kernel, len(rank)), r.kernel,
                                                      self.table.rank(r.gate)))
        doc = {"schema_version": JSON_SCHEMA_VERSION, "tool": "pytest-kopt", "version": __version__,
               "exit_code": int(exit_code), "kernel": str(settings.baseline), "ref": str(settings.ref),
               "dims": settings.dims, "shapes": list(settings.shapes) or [settings.dims], "seeds": list(settings.seeds),
               "session_seed": settings.session_seed, "env": env, "outdir": str(settings.outdir),
               "items": [r.to_json() for r in records], "kernels": kernel_verdicts(records, self.table),
               "comparisons": comparisons, "loop": loop}
        return finite(doc)


@dataclass
class SessionOutcome:
    """What the controller's session end produced, shared by kopt's plugins through the session's state: the
    ``ledger`` of item records, the loop step's result (``loop``), the PR gate's and saved baselines'
    ``comparisons``, ``errors`` to show (a report that could not be written, say), and ``pytest_status``: the
    status pytest itself reported at the session's end, before kopt mapped it (its "interrupted" 2 and "internal
    error" 3 share numbers with SKILL.md's codes)."""

    ledger: Ledger
    pytest_status: int | None = None
    loop: dict[str, Any] | None = None
    comparisons: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def exit_code(self) -> int | None:
        """SKILL.md's code the terminal shows: the loop step's when there was one, else the earliest failing gate's
        (None when none failed)."""
        if self.loop is not None:
            return int(self.loop["exit_code"])
        return self.ledger.exit_code()


def finite(x: Any) -> Any:
    """``x`` with NaN/inf floats as None: JSON has no such numbers (strict parsers reject them)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite(v) for v in x]
    return x

"""The terminal concern: the ``kopt gates`` summary, one line per gate item (or per kernel with ``-q``), the time
per gate, a verdict line per kernel, the PR gate's verdicts, the loop's outcome and the
exit code with its meaning."""

from __future__ import annotations

from typing import Any

import pytest

from ..gates.table import GateTable
from ..errors import clip, exit_meaning
from ..records import NOT_CHECKED, GateRecord, kernel_verdicts
from .ledger import SessionOutcome


def _per_kernel(tr: Any, rows: list[GateRecord], table: GateTable) -> None:
    """``-q``: one line per kernel (:func:`pytest_kopt.records.kernel_verdicts`): its verdict (the first failing
    gate's status, else PASSED or, with every item skipped, SKIPPED, with the number of skipped items), the timing
    median and the speedup over the reference."""
    verdicts = kernel_verdicts(rows, table)
    width = max(len(v["name"]) for v in verdicts)
    for v in verdicts:
        note = "; ".join(x for x in (
            ", ".join(([] if v["output_checked"] or v["status"] == "SKIPPED" else ["passed, output not checked"])
                      + ([f"{v['skipped']} skipped"] if v["skipped"] else [])),
            f"{', '.join(v['not_applicable_gates'])} not applicable" if v.get("not_applicable_gates") else "") if x)
        status = f"{v['status']} at {v['failed_gate']}" if v["failed_gate"] else \
            v["status"] + (f" ({note})" if note else "")
        fig = (f"  {v['median_ms']:.4g} ms" if v["median_ms"] is not None else "") + \
            (f", {v['speedup_vs_ref']:.2f}x ref" if v["speedup_vs_ref"] is not None else "")
        tr.write_line(clip(f"{v['name']:<{width}}  {status}{fig}", 200))


def _verdicts(tr: Any, rows: list[GateRecord], table: GateTable) -> None:
    """One verdict line per kernel after the item lines (:func:`pytest_kopt.records.kernel_verdicts`), whatever its
    kind: ``NAME: PASSED: ...`` with its timing (or why it was not timed), ``NAME: NOT_CHECKED: passed, output not
    checked (why)`` (the item lines read PASSED and SKIPPED, so exit 0 is not taken for a correct output),
    ``NAME: STATUS at GATE`` for a failure,
    ``NAME: SKIPPED: ...`` when every item skipped."""
    def skip_reason(name: str, gate: str) -> str | None:
        return next((r.message for r in rows if r.nodeid.split("::")[0] == name and r.gate == gate
                     and r.outcome == "skipped" and r.message), None)

    for v in kernel_verdicts(rows, table):
        name, status = v["name"], v["status"]
        if status == NOT_CHECKED:
            why = skip_reason(name, "correctness") or "no correctness item ran"
            tr.write_line(clip(f"{name}: {NOT_CHECKED}: passed, output not checked ({why})", 400), yellow=True)
        elif v["failed_gate"]:
            tr.write_line(f"{name}: {status} at {v['failed_gate']}", red=True)
        elif status == "SKIPPED":
            tr.write_line(f"{name}: SKIPPED: every item skipped ({v['skipped']})", yellow=True)
        else:
            if v["median_ms"] is not None:
                how = f"median {v['median_ms']:.4g} ms" + (f", {v['speedup_vs_ref']:.2f}x the reference"
                                                           if v["speedup_vs_ref"] is not None else "")
            else:
                why = skip_reason(name, "timing")
                how = "output checked, not timed" + (f" ({why})" if why else "")
            # which sizes beyond the given dims were checked, or why none (constraints, the format): the report's
            # edge_shapes, said here too, so a reference whose constraints exclude every edge shape is seen
            edges = v.get("edge_shapes")
            if edges and not str(edges).startswith("off"):
                how += f"; edge shapes: {edges}"
            tr.write_line(clip(f"{name}: PASSED: {how}", 400), green=True)


def summary(tr: Any, verbosity: int, records: list[GateRecord], comparisons: list[dict[str, Any]],
            loop: dict[str, Any] | None, errors: list[str], code: int | None, table: GateTable) -> None:
    """Write the ``kopt gates`` section to pytest's terminal reporter ``tr``."""
    if not records:
        return
    tr.section("kopt gates")
    order = {r.nodeid: i for i, r in enumerate(records)}
    rows = sorted(records, key=lambda r: (r.nodeid.split("::")[0], table.rank(r.gate), order[r.nodeid]))
    several = len({r.nodeid.split("::")[0] for r in rows}) > 1
    if verbosity < 0:
        _per_kernel(tr, rows, table)
        rows = []

    def name(r: GateRecord) -> str:
        return r.nodeid if several else r.nodeid.split("::", 1)[-1]

    width = max((len(name(r)) for r in rows), default=0)
    for r in rows:
        text = r.summary if r.outcome == "passed" else (r.message or "")
        line = f"{name(r):<{width}} {r.status:<20} {text}"
        tr.write_line(clip(line, 400))
    if rows:
        _verdicts(tr, rows, table)
    per_gate: dict[str, list[float]] = {}
    for r in records:
        per_gate.setdefault(r.gate, []).append(r.duration_s)
    tr.write_line("kopt item time per gate: " + ", ".join(
        f"{g} {sum(d):.1f} s" + (f" ({len(d)})" if len(d) > 1 else "")
        for g, d in sorted(per_gate.items(), key=lambda kv: table.rank(kv[0]))))
    for c in comparisons:
        if c["verdict"] in ("NOT_TIMED", "NOT_SAVED"):
            what = "not timed (see its gates)" if c["verdict"] == "NOT_TIMED" else f"no {c['baseline']} saved"
            tr.write_line(f"kopt PR gate: {c['candidate']} {what}")
        else:
            lo, hi = c["ci95"]
            tr.write_line(f"kopt PR gate: {c['candidate']} vs {c['baseline']}: {c['verdict']}, speedup "
                          f"{c['speedup']:.3f}x [{lo:.3f}, {hi:.3f}] (threshold {c['threshold_pct']:g}%)",
                          red=c["fails"], green=c["verdict"] == "FASTER")
    if loop is not None:
        tr.write_line(f"kopt loop: {loop['message']}")
        requires = (loop.get("next") or {}).get("requires")
        if requires:  # where the next command can succeed (loop.next.requires), which the message refers to
            tr.write_line(f"kopt loop next: run on {requires}")
    for e in errors:
        tr.write_line(f"kopt: {e}", red=True)
    if code is not None:
        tr.write_line(f"kopt exit code: {exit_meaning(code)}")


class TerminalPlugin:
    """Registered on the controller (or the only process) of an active session: the summary after pytest's own."""

    def __init__(self, config: pytest.Config, outcome: SessionOutcome, table: GateTable,
                 ahead_log: list[str]) -> None:
        self.config = config
        self.outcome = outcome
        self.table = table
        self.ahead_log = ahead_log

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        """One line per gate item: outcome and its key figures (or the reason it skipped/failed); with ``-v``, what
        was done for the branches' profiles in a loop's close."""
        o = self.outcome
        summary(terminalreporter, self.config.get_verbosity(), o.ledger.records, o.comparisons, o.loop, o.errors,
                o.exit_code(), self.table)
        if self.ahead_log and self.config.get_verbosity() > 0:
            for line in self.ahead_log:
                terminalreporter.write_line(f"kopt champion profile ahead: {line}")

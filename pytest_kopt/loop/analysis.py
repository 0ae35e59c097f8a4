"""``iterv{i}/analysis.md`` (SKILL.md 3c's record of an iteration's decision), written by pytest-kopt, not asked of
the agent: at the iteration's opening with its evidence, at its close with the decision as methods.json records it
(each method's ``rationale`` and ``override_reason``, ``skipped_higher``) and the outcome.

Why not asked for: the agent's reasons already have one place with fields (methods.json), where the close reads and
checks them; a second, free-text copy that nothing reads was an empty template in every run so far. Text the agent
writes under the file's ``## Notes`` heading is kept as it is.
"""

from __future__ import annotations

from typing import Any, Mapping

from ..artifacts import read_dict, write_text
from ..errors import ConfigError
from .layout import IterationLayout
from .runstate import State

NOTES = "## Notes"


def evidence_lines(i: int, roofline: Mapping[str, Any], ncu_top: Mapping[str, Any]) -> list[str]:
    """The iteration's evidence as analysis.md shows it: the kernel profiled, the gaps, the axis budget, the top ncu
    metrics per axis."""
    b = roofline.get("axis_budget") or {}

    def gap(key: str) -> str:
        v = roofline.get(key)
        return f"{v:.2f}" if isinstance(v, (int, float)) else "unknown"

    lines = [f"# Iteration {i} analysis", "", "## Evidence (written by pytest-kopt)", "",
             f"- profile of: {ncu_top.get('evidence_of') or 'the best kernel so far'}",
             f"- gaps: Δc={gap('delta_compute')}, Δm={gap('delta_memory')}, Δl={gap('delta_latency')} "
             f"({roofline.get('method')}); bound {roofline.get('bound')}",
             f"- axis budget: compute {b.get('compute')}, memory {b.get('memory')}, latency {b.get('latency')}"]
    for axis, rows in (ncu_top.get("top") or {}).items():
        shown = ", ".join(f"{r['name']} {r['value']:.1f}{'%' if str(r.get('unit', '')).startswith('%') else ''}"
                          for r in rows if isinstance(r, dict) and isinstance(r.get("value"), (int, float)))
        lines.append(f"- top {axis} metrics: {shown or '—'}")
    return lines


def template(i: int, roofline: Mapping[str, Any], ncu_top: Mapping[str, Any]) -> str:
    """analysis.md as the iteration opens: the evidence, where the decision is written (methods.json), and an empty
    notes section the close keeps."""
    return "\n".join([*evidence_lines(i, roofline, ncu_top), "", "## Decision",
                      "", "pytest-kopt fills this section at the close from methods.json: each method's `rationale` "
                      "(and `override_reason` where a rule asks for one) and `skipped_higher` (the higher-priority "
                      "methods passed over, and why: SKILL.md 3c). Nothing in this file needs writing.", "",
                      NOTES, "", ""])


def _notes(text: str) -> str:
    """What the agent wrote under the notes heading ("" when nothing)."""
    _, sep, rest = text.partition(NOTES)
    return rest.strip() if sep else ""


def _pct(v: Any) -> str:
    return "inconclusive" if v is None else f"{v:+.1f}%"


def write_closed(it: IterationLayout, state: State, entry: Mapping[str, Any], results: list[Mapping[str, Any]]) -> None:
    """Rewrite ``analysis.md`` at the close: the evidence, the decision (methods.json's methods with their rationale
    and override reason, ``skipped_higher``), every branch's outcome, the champion against the best it was compared
    with, each method's attribution and verdict, the residual, and the agent's notes as they were."""
    from .written import read_methods  # the close has validated it; a file spoiled since reads as its ids alone

    try:
        doc = read_methods(it)
    except ConfigError:
        doc = {"methods": [{"id": m} for m in entry.get("methods", [])]}
    old = it.analysis.read_text(errors="replace") if it.analysis.is_file() else ""
    lines = [*evidence_lines(it.index, read_dict(it.roofline) or {}, read_dict(it.ncu_top) or {}), "",
             "## Decision (methods.json)", ""]
    for m in doc.get("methods") or []:
        extra = f" Override: {m['override_reason']}" if m.get("override_reason") else ""
        lines.append(f"- `{m['id']}`: {m.get('rationale') or '(no rationale given)'}{extra}")
    skipped = doc.get("skipped_higher") or []
    lines += ["", "Skipped higher-priority methods:" if skipped else "Skipped higher-priority methods: none recorded."]
    for s in skipped:
        lines.append(f"- {s.get('id')}: {s.get('reason')}" if isinstance(s, dict) else f"- {s}")
    lines += ["", "## Branches", "", "| branch | status | median ms |", "|---|---|---|"]
    for r in results:
        ms = f"{r['median_ms']:.4f}" if isinstance(r.get("median_ms"), (int, float)) else "—"
        lines.append(f"| {r['branch']} | {r.get('status')} | {ms} |")
    best = entry.get("previous_best_ms")
    lines += ["", "## Outcome", "",
              f"- champion {entry['champion']} {entry['champion_ms']:.4f} ms against the best so far "
              f"{'%.4f ms' % best if best else '(none)'} ({entry.get('previous_best_source')}): "
              f"{'improved' if entry['improved'] else 'not improved'}"]
    attr = entry.get("attribution") or {}
    for m in entry.get("methods", []):
        a = attr.get(m) or {}
        lines.append(f"- `{m}`: {(entry.get('verdicts') or {}).get(m)}; attribution {_pct(a.get('attribution_pct'))}"
                     f"{'' if a.get('attribution_pct') is not None else ' (' + str(a.get('reason')) + ')'}; "
                     f"SASS {(entry.get('sass') or {}).get(m)}")
    res = entry.get("residual")
    if res:
        share = res.get("residual_pct_of_gain")
        lines.append(f"- residual, {res['label']}: {res['residual_ms']:.4f} ms"
                     f"{'' if share is None else f' ({share:.1f}% of the gain)'}")
        if res.get("note"):
            lines.append(f"  ({res['note']})")
    lines += ["", NOTES, "", _notes(old), ""]
    write_text(it.analysis, "\n".join(lines))

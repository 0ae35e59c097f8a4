"""The CI concern, on the controller: ``--kopt-summary-md PATH`` writes a Markdown summary a CI job can post as a
pull-request comment (the verdict per kernel, the PR gate's speedup with its interval, per shape, each failure with
its fix), and under GitHub Actions (``GITHUB_ACTIONS=true``) every failing item becomes an ``::error`` annotation on
its file and line. A plugin registered only when one of them is on (pytest's ``stepwise`` pattern), reading the
outcome the report plugin builds (:class:`~pytest_kopt.plugin.ledger.SessionOutcome`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

import pytest

from ..errors import exit_meaning
from ..gates.table import GateTable
from ..records import NOT_CHECKED, GateRecord, kernel_verdicts
from .ledger import SessionOutcome
from .options import raw

#: (option name, help, metavar) of this concern's options (:mod:`pytest_kopt.plugin.options` adds them).
OPTIONS = (
    ("summary-md", "Write a Markdown summary to PATH for a CI job to post as a pull-request comment (verdict per "
                   "kernel, the PR gate's speedup with its confidence interval, per shape); under GitHub Actions it "
                   "is added to the job's step summary too", "PATH"),
)
#: The GitHub Actions variable that turns the annotations on, and the step-summary file it names.
ACTIONS_ENV, STEP_SUMMARY_ENV = "GITHUB_ACTIONS", "GITHUB_STEP_SUMMARY"
_MARK = {"PASSED": "✅", NOT_CHECKED: "⚠️", "SKIPPED": "⏭️"}


def summary_path(config: pytest.Config) -> Path | None:
    """``--kopt-summary-md``'s path, resolved against the invocation folder; None when not given."""
    path = raw(config, "summary_md")
    return Path(config.invocation_params.dir, str(path)) if path not in (None, "") else None


def in_actions() -> bool:
    """True under GitHub Actions, whose runners set ``GITHUB_ACTIONS=true``."""
    return os.environ.get(ACTIONS_ENV) == "true"


def _fmt_ms(ms: float | None) -> str:
    if ms is None:
        return ""
    return f"{ms * 1e3:.2f} µs" if ms < 0.1 else f"{ms:.4g} ms"


def _speedup(c: Mapping[str, Any]) -> str:
    lo, hi = c.get("ci95") or (None, None)
    if c.get("speedup") is None:
        return ""
    return f"{c['speedup']:.3f}x" + (f" [{lo:.3f}, {hi:.3f}]" if lo is not None and hi is not None else "")


def _cell(text: Any) -> str:
    """``text`` fit for a table cell: one line, no column separator."""
    return " ".join(str(text or "").split()).replace("|", "\\|")


def render(records: list[GateRecord], table: GateTable, comparisons: list[dict[str, Any]],
           loop: dict[str, Any] | None, exit_code: int, env: Mapping[str, Any]) -> str:
    """The Markdown summary: exit code and GPU, a table of the kernels' verdicts, the PR gate's comparisons (and per
    shape, when several were timed), the failures with their fixes, the loop's outcome."""
    gpu = (env.get("gpu") or {}).get("name") if env.get("gpu_available") else None
    where = gpu or "no GPU: the correctness of .cu kernels, timing and ncu skipped"
    lines = ["## pytest-kopt", "", f"**exit code {exit_meaning(exit_code)}** · {where}", ""]
    verdicts = kernel_verdicts(records, table)
    if verdicts:
        lines += ["| kernel | verdict | median | speedup vs reference |", "|---|---|---|---|"]
        for v in verdicts:
            verdict = f"{_MARK.get(v['status'], '❌')} {v['status']}"
            if v["failed_gate"]:
                verdict += f" at {v['failed_gate']}"
            elif v["status"] == NOT_CHECKED:
                verdict += " (passed, output not checked)"
            speed = f"{v['speedup_vs_ref']:.2f}x" if v["speedup_vs_ref"] is not None else ""
            lines.append(f"| `{_cell(v['name'])}` | {verdict} | {_fmt_ms(v['median_ms'])} | {speed} |")
        lines.append("")
    if comparisons:
        lines += ["### PR gate", "", "| candidate | baseline | verdict | speedup [95% CI] | threshold |",
                  "|---|---|---|---|---|"]
        for c in comparisons:
            threshold = f"{c['threshold_pct']:g}%" if c.get("threshold_pct") is not None else ""
            lines.append(f"| `{_cell(Path(c['candidate']).name)}` | `{_cell(Path(c['baseline']).name)}` | "
                         f"{'❌ ' if c.get('fails') else ''}{c['verdict']} | {_speedup(c)} | {threshold} |")
        for c in comparisons:
            shapes = c.get("per_shape") or []
            if shapes:
                lines += ["", f"Per shape, `{_cell(Path(c['candidate']).name)}` (the verdict is on the geometric "
                              "mean):", "", "| shape | verdict | speedup [95% CI] |", "|---|---|---|"]
                lines += [f"| `{_cell(s['shape'])}` | {s.get('verdict', 'NOT_TIMED')} | {_speedup(s)} |"
                          for s in shapes]
        lines.append("")
    failed = [r for r in records if r.outcome == "failed"]
    if failed:
        lines += ["### Failures", ""]
        for r in failed:
            where = f" (`{r.path}:{r.line}`)" if r.path and r.line else f" (`{r.path}`)" if r.path else ""
            lines.append(f"- `{_cell(r.nodeid)}` **{r.status}**{where}: {_cell(r.message)}"
                         + (f"<br>fix: {_cell(r.fix)}" if r.fix else ""))
        lines.append("")
    if loop is not None:
        lines += [f"Loop: {_cell(loop.get('message'))}", ""]
    return "\n".join(lines)


def _escape(text: str, prop: bool = False) -> str:
    """GitHub's escaping of a workflow command's message (``%``, CR, LF) and, for a property, ``:`` and ``,``."""
    out = str(text).replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return out.replace(":", "%3A").replace(",", "%2C") if prop else out


def _file(path: str | None, root: Path) -> str | None:
    """``path`` as the repository sees it: relative to ``GITHUB_WORKSPACE`` (else the root folder) when inside."""
    if not path:
        return None
    p = Path(path)
    base = Path(os.environ.get("GITHUB_WORKSPACE") or root)
    p = p if p.is_absolute() else root / p
    try:
        return p.resolve().relative_to(base.resolve()).as_posix()
    except ValueError:
        return str(p)


def annotations(records: list[GateRecord], table: GateTable, comparisons: list[dict[str, Any]],
                root: Path) -> list[str]:
    """GitHub Actions workflow commands: ``::error`` per failed item (its file and line, else the kernel's), per PR
    gate comparison that fails; ``::warning`` per kernel whose output was never checked."""
    out = []
    for r in records:
        if r.outcome != "failed":
            continue
        props = [f"file={_escape(_file(r.path or r.kernel, root) or '', True)}"]
        if r.line:
            props.append(f"line={int(r.line)}")
        props.append(f"title={_escape(f'kopt {r.gate}: {r.status}', True)}")
        text = (r.message or r.status) + (f"\nfix: {r.fix}" if r.fix else "")
        out.append(f"::error {','.join(props)}::{_escape(text)}")
    for v in kernel_verdicts(records, table):
        if v["status"] == NOT_CHECKED:
            text = f"{v['name']} passed, but its output was never compared with the reference"
            out.append(f"::warning file={_escape(_file(v['kernel'], root) or '', True)},"
                       f"title={_escape('kopt: output not checked', True)}::{_escape(text)}")
    for c in comparisons:
        if c.get("fails"):
            out.append(f"::error file={_escape(_file(c['candidate'], root) or '', True)},"
                       f"title={_escape('kopt PR gate: ' + c['verdict'], True)}::"
                       f"{_escape(Path(c['candidate']).name)} vs {_escape(Path(c['baseline']).name)}: "
                       f"{c['verdict']}, speedup {_escape(_speedup(c))}")
    return out


class SummaryMdPlugin:
    """Registered last among the concerns (it reads what the loop and the comparisons added): writes the Markdown
    summary at the session's end and, under GitHub Actions, prints the annotations after kopt's own summary."""

    def __init__(self, config: pytest.Config, table: GateTable, env: Mapping[str, Any], path: Path | None) -> None:
        self.config = config
        self.table = table
        self.env = env
        self.path = path
        self.lines: list[str] = []

    def on_record(self, record: Any) -> None:
        """Nothing: the summary is written from the ledger at the end."""

    def finish(self, session: pytest.Session, outcome: SessionOutcome) -> None:
        """Write ``--kopt-summary-md`` (and append it to ``$GITHUB_STEP_SUMMARY`` under Actions); keep the
        annotations for the terminal summary."""
        records = outcome.ledger.records
        actions = in_actions()
        if actions:
            self.lines = annotations(records, self.table, outcome.comparisons, self.config.rootpath)
        if self.path is None:
            return
        text = render(records, self.table, outcome.comparisons, outcome.loop, int(session.exitstatus), self.env)
        targets = [self.path] + ([Path(os.environ[STEP_SUMMARY_ENV])] if actions and os.environ.get(STEP_SUMMARY_ENV)
                                 else [])
        for i, target in enumerate(targets):
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                with open(target, "w" if i == 0 else "a", encoding="utf-8") as f:
                    f.write(text + "\n")
            except OSError as exc:
                outcome.errors.append(f"--kopt-summary-md: could not write {target}: {exc}")

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        """The annotations, one workflow command a line (GitHub reads them from the job's output)."""
        for line in self.lines:
            terminalreporter.write_line(line)

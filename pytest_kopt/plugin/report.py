"""The report concern, on the controller (or the only process): every kopt item's report into the ledger, the
session's exit code by SKILL.md's convention, the session-end steps of the other concerns in their order, and the
``--kopt-json`` document (pytest's ``LogXML`` pattern: a class registered in ``pytest_configure``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Protocol

import pytest

from .ledger import SessionOutcome
from .options import FAILED_SEED_CACHE_KEY
from .stash import SessionState

#: (option name, help, metavar) of this concern's options (:mod:`pytest_kopt.plugin.options` adds them).
OPTIONS = (
    ("json", "Write the session's JSON report to PATH ('-' for stdout)", "PATH"),
)


class Concern(Protocol):
    """A plugin of one concern that acts at the session's end (the loop's step, the PR gate, saved baselines):
    ``on_record`` sees each item's record as it arrives, ``finish`` adds its part to the outcome and may set the
    session's exit status."""

    def on_record(self, record: Any) -> None: ...

    def finish(self, session: pytest.Session, outcome: SessionOutcome) -> None: ...


class ReportPlugin:
    """Collects every kopt item's record, maps pytest's "tests failed" to SKILL.md's code, runs the concerns'
    session-end steps (``concerns``, in order: the loop's step, then the comparisons) and writes ``--kopt-json``."""

    def __init__(self, config: pytest.Config, state: SessionState, outcome: SessionOutcome,
                 concerns: list[Concern]) -> None:
        self.config = config
        self.state = state
        self.outcome = outcome
        self.concerns = concerns
        self.stdout_doc: str | None = None

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Keep one record per kopt item, and show it to each concern."""
        ledger = self.outcome.ledger
        before = len(ledger.records)
        ledger.add(report)
        if len(ledger.records) > before:
            for c in self.concerns:
                c.on_record(ledger.records[-1])

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        """Map pytest's "tests failed" (1) to SKILL.md's code when every failure is a gate's; run each concern's
        step; write the JSON report."""
        settings = self.state.settings
        ledger = self.outcome.ledger
        cache = getattr(self.config, "cache", None)
        if cache is not None and settings.session_seed is not None and any(r.outcome == "failed"
                                                                            for r in ledger.records):
            cache.set(FAILED_SEED_CACHE_KEY, settings.session_seed)
        self.outcome.pytest_status = int(session.exitstatus)
        code = ledger.exit_code()
        if code is not None and session.exitstatus == pytest.ExitCode.TESTS_FAILED and not ledger.other_failures():
            session.exitstatus = code
        for c in self.concerns:
            c.finish(session, self.outcome)
        if settings.json_path:
            self._write(session)

    def _write(self, session: pytest.Session) -> None:
        settings = self.state.settings
        doc = self.outcome.ledger.document(exit_code=int(session.exitstatus), settings=settings, env=self.state.env,
                                           comparisons=self.outcome.comparisons, loop=self.outcome.loop)
        if settings.json_path == "-":
            self.stdout_doc = json.dumps(doc, default=str, allow_nan=False)  # printed last, in unconfigure
            return
        try:
            Path(str(settings.json_path)).parent.mkdir(parents=True, exist_ok=True)
            Path(str(settings.json_path)).write_text(json.dumps(doc, indent=2, default=str, allow_nan=False) + "\n")
        except OSError as exc:
            self.outcome.errors.append(f"--kopt-json: could not write {settings.json_path}: {exc}")

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        """``--kopt-json -``: the document as the very last line of stdout (one line: ``tail -n 1`` reads it)."""
        if self.stdout_doc is not None:
            sys.stdout.write("\n" + self.stdout_doc + "\n")
            sys.stdout.flush()

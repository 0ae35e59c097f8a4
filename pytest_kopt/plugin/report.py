"""The report concern, on the controller (or the only process): every kopt item's report into the ledger, the
session's exit code by SKILL.md's convention, the session-end steps of the other concerns in their order, and the
``--kopt-json`` document (pytest's ``LogXML`` pattern: a class registered in ``pytest_configure``).

The document is written twice: at the session's start with ``status`` ``running`` (so a step that crashes never
leaves the previous step's report at its path, looking fresh), and at its end, ``complete``."""

from __future__ import annotations

import datetime as _dt
import json
import os
import sys
from collections.abc import Generator
from pathlib import Path
from typing import Any, Protocol

import pytest

from ..artifacts.io import cut
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

    @pytest.hookimpl(wrapper=True)
    def pytest_sessionstart(self, session: pytest.Session) -> Generator[None, None, None]:
        """Write the report as ``running`` before anything is judged (a file path only: ``-`` prints one document,
        at the end). After the other session-start hooks: pytest-xdist's sets up its workers there and, for an ssh
        gateway, refuses any existing file among the arguments that lies outside its --rsyncdir folders (the
        report's path would be one once written)."""
        yield
        settings = self.state.settings
        if settings.json_path and settings.json_path != "-":
            self._save(self.running_document())

    def running_document(self) -> dict[str, Any]:
        """The ``--kopt-json`` document while the session runs: ``status`` ``running``, ``exit_code`` null, when
        and by which process it started, the session's inputs and, in a loop step, the run as it stands with
        ``stage`` ``running``."""
        from .. import __version__
        from ..loop import state as loop_state
        from .ledger import JSON_SCHEMA_VERSION, finite

        s = self.state.settings
        started = _dt.datetime.now().isoformat(timespec="seconds")
        loop = None
        if s.loop_mode and s.run_dir is not None:
            loop = {**loop_state.run_view(s.run_dir), "status": "running", "mode": s.loop_mode,
                    "run_dir": str(s.run_dir), "exit_code": None, "stage": "running",
                    "message": f"the {s.loop_mode} step started at {started} (pid {os.getpid()}) and has not ended; "
                               "this report is rewritten when it does (status complete): one still running after "
                               "that process ended is a step that crashed, to run again"}
        return finite({"schema_version": JSON_SCHEMA_VERSION, "tool": "pytest-kopt", "version": __version__,
                       "status": "running", "started": started, "pid": os.getpid(), "exit_code": None,
                       "kernel": str(s.baseline), "ref": str(s.ref), "dims": s.dims,
                       "shapes": list(s.shapes) or [s.dims], "seeds": list(s.seeds), "session_seed": s.session_seed,
                       "env": self.state.env, "outdir": str(s.outdir), "items": [], "kernels": [],
                       "comparisons": [], "loop": loop})

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
        doc = {"status": "complete", **doc}
        if isinstance(doc.get("loop"), dict):
            doc["loop"] = {"status": "complete", **doc["loop"]}
        if settings.json_path == "-":
            self.stdout_doc = json.dumps(doc, default=str, allow_nan=False)  # printed last, in unconfigure
            return
        self._save(doc)

    def _save(self, doc: dict[str, Any]) -> None:
        """Write ``doc`` to the ``--kopt-json`` path (its folder made), atomically: a reader never sees half of it.
        A failure is kept for the terminal summary."""
        settings = self.state.settings
        try:
            path = Path(str(settings.json_path))
            path.parent.mkdir(parents=True, exist_ok=True)
            # not artifacts.io.write_text: its mkstemp file is the owner's alone (0600), and a CI job's report is
            # read by others; the name cut leaves room within the 255-byte limit
            tmp = path.with_name(f".{cut(path.name)}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(doc, indent=2, default=str, allow_nan=False) + "\n")
            os.replace(tmp, path)
        except OSError as exc:
            self.outcome.errors.append(f"--kopt-json: could not write {settings.json_path}: {exc}")

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        """``--kopt-json -``: the document as the very last line of stdout (one line: ``tail -n 1`` reads it)."""
        if self.stdout_doc is not None:
            sys.stdout.write("\n" + self.stdout_doc + "\n")
            sys.stdout.flush()

"""The progress concern, on the controller (or the only process): what is running while it runs. On a terminal, a
live note after pytest's own progress (the running items, their gate and case, seconds so far, and the timing
item's samples so far), redrawn each second and erased before pytest writes; in a CI log (not a terminal) one line
per kopt item when it ends (gate, case, status, seconds), in place of its dot; nothing under ``-q``."""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, Callable, TextIO

import pytest

#: Seconds between redraws of the live note, and how long an item runs before it is shown (a fast item's note
#: would only flicker).
TICK_S, SHOW_AFTER_S = 0.5, 1.0
#: VT100 save cursor; restore it and erase to the end of the line.
_SAVE, _ERASE = "\x1b7", "\x1b8\x1b[K"


def terminal_out() -> TextIO | None:
    """A writer on this process's own stdout as it is now, outside pytest's output capture (which redirects file
    descriptor 1 while an item runs): a duplicate of descriptor 1 when it is a terminal, else None. Called at
    configure, when capture is suspended."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # an in-process run's captured stdout
        return None
    if not os.isatty(fd):
        return None
    return os.fdopen(os.dup(fd), "w", buffering=1, encoding="utf-8", errors="replace")


def note(running: dict[str, float], now: float, samples: int | None) -> str:
    """The live note of the items in ``running`` (node id -> start, ``time.monotonic``): the one item as
    ``gate[case] 12 s`` (``, 31 samples`` for a timing item), several as ``2 running: ...``."""
    def one(nodeid: str, start: float) -> str:
        text = f"{nodeid.split('::', 1)[-1]} {now - start:.0f} s"
        if samples and nodeid.split("::", 1)[-1].startswith("timing"):
            text += f", {samples} samples"
        return text

    items = sorted(running.items(), key=lambda kv: kv[1])
    if len(items) == 1:
        return f"[kopt: {one(*items[0])}]"
    return f"[kopt: {len(items)} running: " + ", ".join(one(n, s) for n, s in items) + "]"


class ProgressPlugin:
    """Registered on the controller of a session at verbosity 0 or more. ``kernels``: the node ids of the kernel
    files (their items are kopt's); ``samples``: the timing samples so far in this process (None under xdist, where
    they are taken elsewhere); ``reset``: called at each item's start; ``out``: the terminal (None: a CI log)."""

    def __init__(self, config: pytest.Config, kernels: frozenset[str], samples: Callable[[], int | None],
                 reset: Callable[[], None], out: TextIO | None) -> None:
        self.config = config
        self.kernels = kernels
        self.samples = samples
        self.reset = reset
        self.out = out
        self.running: dict[str, float] = {}
        self.lock = threading.Lock()
        self.drawn = False
        self.shown = ""
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        #: a CI log at verbosity 0: a line per item in place of its dot (``-v`` writes a line per item already)
        self.lines = out is None and config.get_verbosity() == 0

    def _mine(self, nodeid: str) -> bool:
        return nodeid.split("::")[0] in self.kernels

    def _erase(self) -> None:
        with self.lock:
            if self.drawn and self.out is not None:
                self.out.write(_ERASE)
                self.out.flush()
            self.drawn = False

    def _draw(self) -> None:
        tr = self.config.pluginmanager.get_plugin("terminalreporter")
        tw = getattr(tr, "_tw", None)
        with self.lock:
            if self.out is None or not self.running:
                return
            now = time.monotonic()
            if now - min(self.running.values()) < SHOW_AFTER_S:
                return
            room = (getattr(tw, "fullwidth", 80) - getattr(tw, "width_of_current_line", 0)) - 2
            text = note(self.running, now, self.samples())
            if room < 12:
                return
            if len(text) > room:
                text = text[: room - 2] + "…]"
            if self.drawn and text == self.shown:
                return
            self.out.write((_ERASE if self.drawn else _SAVE) + " " + text)
            self.out.flush()
            self.drawn, self.shown = True, text

    def _loop(self) -> None:
        while not self.stop.wait(TICK_S):
            try:
                self._draw()
            except (OSError, ValueError):  # the terminal went away: no more notes
                return

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logstart(self, nodeid: str, location: Any) -> None:
        """Erase the note before pytest writes; note the item's start (and start the redraws, on a terminal)."""
        self._erase()
        if not self._mine(nodeid):
            return
        with self.lock:
            self.running[nodeid] = time.monotonic()
        self.reset()
        if self.out is not None and self.thread is None:
            self.thread = threading.Thread(target=self._loop, name="kopt-progress", daemon=True)
            self.thread.start()

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Erase the note before pytest writes the item's letter."""
        self._erase()

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logfinish(self, nodeid: str, location: Any) -> None:
        """The item has ended: drop it from the note."""
        self._erase()
        with self.lock:
            self.running.pop(nodeid, None)

    @pytest.hookimpl(tryfirst=True)
    def pytest_report_teststatus(self, report: pytest.TestReport, config: pytest.Config) -> Any:
        """In a CI log a kopt item's "letter" is a line of its own: its gate and case, status and seconds (the outcome
        still counts as pytest's)."""
        if not self.lines or not self._mine(report.nodeid):
            return None
        if report.when == "call" or (report.when == "setup" and not report.passed):
            status = dict(report.user_properties).get("kopt_status") or report.outcome.upper()
            # the file's name heads its items' lines, except under xdist (no header) or with several kernels
            several = len(self.kernels) > 1 or self.config.pluginmanager.hasplugin("dsession")
            name = report.nodeid if several else report.nodeid.split("::", 1)[-1]
            # the third is the word the short test summary puts before the node id (FAILED, SKIPPED)
            return report.outcome, f"\n  {name} {status} in {report.duration:.1f} s", report.outcome.upper()
        return None

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self) -> None:
        """No note past the items: stop the redraws and erase the last one."""
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout=2 * TICK_S)
        self._erase()

    def pytest_unconfigure(self) -> None:
        """Close the duplicate of stdout."""
        if self.out is not None:
            try:
                self.out.close()
            except OSError:
                pass

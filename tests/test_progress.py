"""The progress concern: a live note of the running items on a terminal, a line per item in a CI log, nothing
under ``-q``."""

from __future__ import annotations

import io
import shutil
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_kopt.plugin.progress import ProgressPlugin, note

REDTEAM = Path(__file__).resolve().parent / "redteam"


def test_the_note_names_the_gate_case_seconds_and_the_timing_samples() -> None:
    assert note({"k.cu::correctness[seed=7]": 10.0}, 22.4, 31) == "[kopt: correctness[seed=7] 12 s]"
    assert note({"k.cu::timing": 10.0}, 14.0, 31) == "[kopt: timing 4 s, 31 samples]"
    assert note({"a.cu::timing": 10.0, "b.cu::compile": 5.0}, 15.0, None) == \
        "[kopt: 2 running: compile 10 s, timing 5 s]"


def _plugin(out: Any, samples: int | None = None) -> ProgressPlugin:
    tw = SimpleNamespace(fullwidth=80, width_of_current_line=20)
    config: Any = SimpleNamespace(get_verbosity=lambda: 0, pluginmanager=SimpleNamespace(
        get_plugin=lambda name: SimpleNamespace(_tw=tw)))
    return ProgressPlugin(config, frozenset({"k.cu"}), lambda: samples, lambda: None, out)


def test_on_a_terminal_the_note_is_drawn_after_the_dots_and_erased_before_pytest_writes() -> None:
    out = io.StringIO()
    plugin = _plugin(out, samples=12)
    plugin.running["k.cu::timing"] = time.monotonic() - 3.2
    plugin._draw()
    plugin._draw()  # the same text: not written again
    assert out.getvalue() == "\x1b7 [kopt: timing 3 s, 12 samples]"
    plugin.pytest_runtest_logreport(report=None)  # type: ignore[arg-type]
    assert out.getvalue().endswith("\x1b8\x1b[K") and not plugin.drawn
    plugin.pytest_runtest_logstart("other.py::test_x", None)  # not a kopt item: not shown
    assert plugin.running == {"k.cu::timing": plugin.running["k.cu::timing"]}
    plugin.pytest_sessionfinish()


def test_a_note_never_wraps_the_line() -> None:
    out = io.StringIO()
    plugin = _plugin(out)
    plugin.running = {f"k.cu::correctness[seed={i}]": time.monotonic() - 5 for i in range(9)}
    plugin._draw()
    assert out.getvalue().endswith("…]") and len(out.getvalue()) <= 2 + 1 + 58


def test_in_a_ci_log_each_item_is_a_line_and_quiet_is_quiet(pytester: pytest.Pytester) -> None:
    """stdout is a pipe here, as in a CI log: each kopt item's dot becomes a line with its status and seconds; a
    test of the user's own keeps its dot; ``-q`` prints none of it."""
    for name in ("honest_python.py", "ref_softmax.py"):
        shutil.copy(REDTEAM / name, pytester.path / name)
    pytester.makepyfile(test_mine="def test_mine():\n    pass\n")
    args = ("--kopt-baseline", "honest_python.py", "--kopt-ref", "ref_softmax.py", "--kopt-dims", "M=4,N=16",
            "--kopt-seeds", "3", "-p", "no:cacheprovider")
    result = pytester.runpytest_subprocess(*args, "test_mine.py", timeout=600)
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["test_mine.py .*", "honest_python.py*", "  hardware PASSED in *.* s",
                                 "  preflight PASSED in *", "  compile NOT_APPLICABLE in *",
                                 "  correctness?seed=3? PASSED in *", "  timing SKIPPED in *"])
    quiet = pytester.runpytest_subprocess(*args, "-q", timeout=600)
    assert quiet.ret == 0 and not any(" PASSED in " in line for line in quiet.outlines), quiet.stdout.str()


def test_in_a_ci_log_the_short_summary_names_the_outcome(pytester: pytest.Pytester) -> None:
    """A CI log's short test summary (``-rf``) keeps pytest's word before a failing kopt item's node id
    (``FAILED wrong.py::correctness[seed=3] - ...``): the item's own line replaces its dot, not the word."""
    shutil.copy(REDTEAM / "ref_softmax.py", pytester.path / "ref_softmax.py")
    honest = (REDTEAM / "honest_python.py").read_text()
    pytester.makepyfile(wrong=honest.replace("torch.softmax(x, dim=-1)", "torch.softmax(x, dim=-1) * 1.5"))
    result = pytester.runpytest_subprocess("--kopt-baseline", "wrong.py", "--kopt-ref", "ref_softmax.py",
                                           "--kopt-dims", "M=4,N=16", "--kopt-seeds", "3", "--kopt-edge-shapes",
                                           "off", "-p", "no:cacheprovider", "-rf", timeout=600)
    assert result.ret == 2, result.stdout.str()
    result.stdout.fnmatch_lines(["  correctness?seed=3? INCORRECT_NUMERICAL in *",
                                 "FAILED wrong.py::correctness?seed=3? - ?correctness? INCORRECT_NUMERICAL*"])

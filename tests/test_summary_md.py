"""``--kopt-summary-md`` (the Markdown a CI job posts as a PR comment) and the GitHub Actions annotations: rendered
from records and comparisons, and end to end through the plugin."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pytest_kopt.gates.builtin import default_table
from pytest_kopt.plugin.summary_md import annotations, render
from pytest_kopt.records import GateRecord

DATA = Path(__file__).resolve().parent / "data"
REDTEAM = Path(__file__).resolve().parent / "redteam"


def rec(node: str, gate: str, outcome: str, status: str, **kw: object) -> GateRecord:
    return GateRecord(nodeid=f"{node}::{gate}", kernel=f"/w/{node}", gate=gate, case=None, outcome=outcome,
                      status=status, **kw)  # type: ignore[arg-type]


RECORDS = [rec("base.cu", "correctness", "passed", "PASSED"),
           rec("base.cu", "timing", "passed", "PASSED", figures={"median_ms": 25.37, "speedup_vs_ref": 0.0957}),
           rec("nogpu.cu", "compile", "passed", "PASSED"),
           rec("nogpu.cu", "correctness", "skipped", "SKIPPED", blocked_by="hardware"),
           rec("bad.cu", "compile", "failed", "COMPILE_ERROR", exit_code=2, path="/w/bad.cu", line=7,
               message="expected a ';'", fix="fix the syntax error | at line 7")]


def test_the_summary_has_a_verdict_per_kernel_and_each_failure_with_its_fix() -> None:
    text = render(RECORDS, default_table(), [], None, 2, {"gpu_available": True, "gpu": {"name": "NVIDIA H200"}})
    assert text.startswith("## pytest-kopt\n")
    assert "**exit code 2 (kernel validation:" in text and "NVIDIA H200" in text
    assert "| `base.cu` | ✅ PASSED | 25.37 ms | 0.10x |" in text
    assert "| `nogpu.cu` | ⚠️ NOT_CHECKED (passed, output not checked) |  |  |" in text
    assert "| `bad.cu` | ❌ COMPILE_ERROR at compile |  |  |" in text
    # a failure's text never breaks the table or the list: one line, the column separator escaped
    assert "- `bad.cu::compile` **COMPILE_ERROR** (`/w/bad.cu:7`): expected a ';'<br>fix: fix the syntax error \\| " \
           "at line 7" in text


def test_the_summary_carries_the_pr_gates_speedup_with_its_interval_per_shape() -> None:
    """The H200 run's comparison, and a three-shape one: the verdict on the geometric mean, then each shape."""
    pr = json.loads((DATA / "h200_pr_report.json").read_text())["comparisons"]
    shapes = {"baseline": "/w/main/mm.py", "candidate": "/w/pr/mm.py", "verdict": "SLOWER", "speedup": 0.831,
              "ci95": [0.829, 0.832], "threshold_pct": 3.0, "fails": True,
              "per_shape": [{"shape": "M=1024,N=1024,K=1024", "timed": True, "speedup": 0.834, "ci95": [0.83, 0.84],
                             "verdict": "SLOWER"}]}
    text = render([], default_table(), pr + [shapes], None, 2, {"gpu_available": False})
    assert "| `gemm_tiled.cu` | `naive.cu` | FASTER | 5.718x [5.712, 5.747] | 3% |" in text
    assert "| `mm.py` | `mm.py` | ❌ SLOWER | 0.831x [0.829, 0.832] | 3% |" in text
    assert "| `M=1024,N=1024,K=1024` | SLOWER | 0.834x [0.830, 0.840] |" in text
    assert "no GPU" in text


def test_annotations_name_the_file_and_line_and_escape_the_message(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GITHUB_WORKSPACE", "/w")
    fails = {"baseline": "/w/a.cu", "candidate": "/w/b.cu", "verdict": "SLOWER", "speedup": 0.5, "ci95": [0.4, 0.6],
             "fails": True}
    lines = annotations(RECORDS, default_table(), [fails], tmp_path)
    assert lines[0] == ("::error file=bad.cu,line=7,title=kopt compile%3A COMPILE_ERROR::expected a ';'%0A"
                        "fix: fix the syntax error | at line 7")
    assert lines[1].startswith("::warning file=nogpu.cu,title=kopt%3A output not checked::nogpu.cu passed")
    assert lines[2] == ("::error file=b.cu,title=kopt PR gate%3A SLOWER::b.cu vs a.cu: SLOWER, speedup 0.500x "
                        "[0.400, 0.600]")


def test_summary_md_and_annotations_end_to_end(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the plugin: a correct and a wrong candidate; the Markdown file is written, and under GitHub Actions
    the wrong one's correctness failure is an ``::error`` on its file, after kopt's summary."""
    for name in ("honest_python.py", "passthrough.py", "ref_softmax.py"):
        shutil.copy(REDTEAM / name, pytester.path / name)
    summary = pytester.path / "step_summary.md"
    summary.write_text("before\n")
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    monkeypatch.setenv("GITHUB_WORKSPACE", str(pytester.path))
    result = pytester.runpytest_subprocess(
        "--kopt-baseline", "honest_python.py", "--kopt-candidate", "passthrough.py", "--kopt-ref", "ref_softmax.py",
        "--kopt-dims", "M=4,N=16", "--kopt-seeds", "3", "--kopt-summary-md", "out/summary.md", "-p",
        "no:cacheprovider", timeout=600)
    assert result.ret == 2, result.stdout.str()[-3000:]
    text = (pytester.path / "out" / "summary.md").read_text()
    assert "| `honest_python.py` | ✅ PASSED |" in text
    assert "| `passthrough.py` | ❌ " in text and " at correctness |" in text
    assert summary.read_text() == "before\n" + text  # appended to the job's step summary
    result.stdout.fnmatch_lines(["kopt exit code: 2 *", "::error file=passthrough.py,title=kopt correctness%3A *::*"])


def test_no_summary_and_no_annotations_unless_asked(pytester: pytest.Pytester,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside GitHub Actions and without the option the plugin is not registered: no workflow command is printed."""
    for name in ("passthrough.py", "ref_softmax.py"):
        shutil.copy(REDTEAM / name, pytester.path / name)
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
    result = pytester.runpytest_subprocess("--kopt-baseline", "passthrough.py", "--kopt-ref", "ref_softmax.py",
                                           "--kopt-dims", "M=4,N=16", "--kopt-seeds", "3", "-k", "correctness",
                                           "-p", "no:cacheprovider", timeout=600)
    assert result.ret == 2
    assert not any(line.startswith("::") for line in result.outlines)

"""A ``--kopt-init`` on a machine that does not allow generation (SKILL.md step 0) stops at once: only its hardware
items run (pytest_kopt.plugin.loop.keep_hardware_only); their result would be thrown away."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from pytest_kopt.gates import hardware
from pytest_kopt.gates.builtin import default_table
from pytest_kopt.plugin import summary_md, terminal
from pytest_kopt.plugin.loop import hardware_only, keep_hardware_only
from pytest_kopt.records import GateRecord

REDTEAM = Path(__file__).parent / "redteam"


def _items(*gates: str) -> list[SimpleNamespace]:
    return [SimpleNamespace(gate=SimpleNamespace(name=g), name=g) for g in gates]


def _config(seen: list) -> SimpleNamespace:
    return SimpleNamespace(hook=SimpleNamespace(pytest_deselected=lambda items: seen.extend(items)))


@pytest.mark.parametrize(("mode", "env", "kept"), [
    ("init", {"generation_allowed": False, "reason": "no NVIDIA driver"}, ["hardware"]),
    ("init", {"generation_allowed": True}, ["hardware", "plan", "correctness", "timing"]),
    ("run", {"generation_allowed": False}, ["hardware", "plan", "correctness", "timing"]),  # its branches reported
    (None, {"generation_allowed": False}, ["hardware", "plan", "correctness", "timing"]),   # not a loop step
])
def test_only_an_init_step_without_generation_keeps_its_hardware_items_only(mode, env, kept) -> None:
    items = _items("hardware", "plan", "correctness", "timing")
    seen: list = []
    keep_hardware_only(SimpleNamespace(settings=SimpleNamespace(loop_mode=mode), env=env), _config(seen), items)
    assert [i.name for i in items] == kept
    assert sorted(i.name for i in seen) == sorted({"hardware", "plan", "correctness", "timing"} - set(kept))


class _Lines:
    """pytest's terminal reporter as terminal.summary uses it: the lines written, in order."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def section(self, title: str) -> None:
        self.lines.append(f"== {title}")

    def write_line(self, line: str, **_: object) -> None:
        self.lines.append(line)


@pytest.mark.parametrize(("unjudged", "expected", "quiet_line"), [
    (True, "k.cu: NOT_CHECKED: not judged: the loop stopped before its gates ran (kopt loop below)",
     "k.cu  NOT_CHECKED (not judged: the loop stopped before its gates ran)"),
    # a stopped step whose gates the user's -k deselected (the step did not): the line with why, as outside a loop
    (False, "k.cu: NOT_CHECKED: passed, output not checked (no correctness item ran)",
     "k.cu  NOT_CHECKED (passed, output not checked)"),
])
def test_a_stopped_init_says_its_kernel_was_not_judged(unjudged: bool, expected: str, quiet_line: str) -> None:
    """The kernel's verdict line of an init stopped at step 0 said "passed, output not checked" beside exit 3, as
    if its output had been looked at; it says the kernel was not judged, and points at the loop's line, where the
    step itself deselected the gates (SessionOutcome.unjudged), in the terminal (and with -q), the Markdown summary
    and the GitHub annotation alike."""
    rec = GateRecord("k.cu::hardware", "/x/k.cu", "hardware", None, "passed", "PASSED", summary="no GPU")
    loop = {"phase": "stopped", "message": "run stopped at hardware: generation not allowed on this machine"}
    tr = _Lines()
    terminal.summary(tr, 0, [rec], [], loop, [], 3, default_table(), unjudged)
    assert [line for line in tr.lines if line.startswith("k.cu: ")] == [expected]
    assert f"kopt loop: {loop['message']}" in tr.lines
    quiet = _Lines()  # -q: one line per kernel
    terminal.summary(quiet, -1, [rec], [], loop, [], 3, default_table(), unjudged)
    assert [line for line in quiet.lines if line.startswith("k.cu")] == [quiet_line]
    md = summary_md.render([rec], default_table(), [], loop, 3, {"gpu_available": False}, unjudged)
    row = next(line for line in md.splitlines() if line.startswith("| `k.cu`"))
    assert row.split(" | ")[1] == "⚠️ NOT_CHECKED (" + quiet_line.split("(", 1)[1]
    [warning] = summary_md.annotations([rec], default_table(), [], Path("/x"), unjudged)
    assert warning.endswith("::k.cu: not judged: the loop stopped before its gates ran" if unjudged else
                            "::k.cu passed, but its output was never compared with the reference"), warning


@pytest.mark.parametrize(("mode", "env", "unjudged"), [
    ("init", {"generation_allowed": False, "reason": "no NVIDIA driver"}, True),
    ("init", {"generation_allowed": True}, False),
    ("run", {"generation_allowed": False}, False),  # a close reports its branches as judged (or deselected by -k)
    (None, {"generation_allowed": False}, False),
])
def test_only_the_step_that_runs_its_hardware_items_only_leaves_its_kernels_unjudged(mode, env, unjudged) -> None:
    assert hardware_only(SimpleNamespace(settings=SimpleNamespace(loop_mode=mode), env=env)) is unjudged


def test_an_init_step_on_a_machine_without_a_gpu_runs_the_hardware_item_and_stops(pytester: pytest.Pytester) -> None:
    """On this machine (no GPU): exit 3 in about a second, the hardware item in the report with the reason, every
    other item deselected, ``next.requires`` naming the machine to run on."""
    if hardware.probe_gpus()["gpus"]:
        pytest.skip("a GPU is visible here: --kopt-init sets the run up (this test is for a machine without one)")
    shutil.copy(REDTEAM / "ref_softmax.py", pytester.path / "ref.py")
    shutil.copy(REDTEAM / "honest_python.py", pytester.path / "k.py")
    result = pytester.runpytest_subprocess("--kopt-baseline", "k.py", "--kopt-ref", "ref.py", "--kopt-dims",
                                           "M=64,N=64", "--kopt-init", "--kopt-json", "init.json",
                                           "--kopt-summary-md", "summary.md",
                                           "-p", "no:cacheprovider", "-p", "no:randomly")
    assert result.ret == 3
    doc = json.loads((pytester.path / "init.json").read_text())
    assert [i["gate"] for i in doc["items"]] == ["hardware"]
    figures = doc["items"][0]["figures"]
    assert (figures.get("sm_arch"), figures["build_arch"], figures["gpu_count"]) == (None, "sm_90a", 0)
    assert doc["loop"]["message"].startswith("run stopped at hardware: generation not allowed on this machine")
    assert doc["loop"]["next"]["requires"].startswith("a machine with an NVIDIA GPU")
    assert "| `k.py` | ⚠️ NOT_CHECKED (not judged: the loop stopped before its gates ran) |" in \
        (pytester.path / "summary.md").read_text()
    result.stdout.fnmatch_lines(["k.py: NOT_CHECKED: not judged: the loop stopped before its gates ran*",
                                 "kopt loop: run stopped at hardware*",
                                 "kopt loop next: run on a machine with an NVIDIA GPU*",
                                 "*1 passed, * deselected*"])

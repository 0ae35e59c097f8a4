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
from pytest_kopt.plugin import terminal
from pytest_kopt.plugin.loop import keep_hardware_only
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


@pytest.mark.parametrize(("phase", "expected", "quiet_line"), [
    ("stopped", "k.cu: NOT_CHECKED: not judged: the loop stopped before its gates ran (kopt loop below)",
     "k.cu  NOT_CHECKED (not judged: the loop stopped before its gates ran)"),
    # the same single item outside a stopped step (a -k selection): the old line, with why
    ("set_up", "k.cu: NOT_CHECKED: passed, output not checked (no correctness item ran)",
     "k.cu  NOT_CHECKED (passed, output not checked)"),
])
def test_a_stopped_init_says_its_kernel_was_not_judged(phase: str, expected: str, quiet_line: str) -> None:
    """The kernel's verdict line of an init stopped at step 0 said "passed, output not checked" beside exit 3, as
    if its output had been looked at; it says the kernel was not judged, and points at the loop's line."""
    rec = GateRecord("k.cu::hardware", "/x/k.cu", "hardware", None, "passed", "PASSED", summary="no GPU")
    tr = _Lines()
    loop = {"phase": phase, "message": "run stopped at hardware: generation not allowed on this machine"}
    terminal.summary(tr, 0, [rec], [], loop, [], 3, default_table())
    verdict = [line for line in tr.lines if line.startswith("k.cu: ")]
    assert verdict == [expected]
    assert f"kopt loop: {loop['message']}" in tr.lines
    quiet = _Lines()  # -q: one line per kernel
    terminal.summary(quiet, -1, [rec], [], loop, [], 3, default_table())
    assert [line for line in quiet.lines if line.startswith("k.cu")] == [quiet_line]


def test_an_init_step_on_a_machine_without_a_gpu_runs_the_hardware_item_and_stops(pytester: pytest.Pytester) -> None:
    """On this machine (no GPU): exit 3 in about a second, the hardware item in the report with the reason, every
    other item deselected, ``next.requires`` naming the machine to run on."""
    if hardware.probe_gpus()["gpus"]:
        pytest.skip("a GPU is visible here: --kopt-init sets the run up (this test is for a machine without one)")
    shutil.copy(REDTEAM / "ref_softmax.py", pytester.path / "ref.py")
    shutil.copy(REDTEAM / "honest_python.py", pytester.path / "k.py")
    result = pytester.runpytest_subprocess("--kopt-baseline", "k.py", "--kopt-ref", "ref.py", "--kopt-dims",
                                           "M=64,N=64", "--kopt-init", "--kopt-json", "init.json",
                                           "-p", "no:cacheprovider", "-p", "no:randomly")
    assert result.ret == 3
    doc = json.loads((pytester.path / "init.json").read_text())
    assert [i["gate"] for i in doc["items"]] == ["hardware"]
    figures = doc["items"][0]["figures"]
    assert (figures.get("sm_arch"), figures["build_arch"], figures["gpu_count"]) == (None, "sm_90a", 0)
    assert doc["loop"]["message"].startswith("run stopped at hardware: generation not allowed on this machine")
    assert doc["loop"]["next"]["requires"].startswith("a machine with an NVIDIA GPU")
    result.stdout.fnmatch_lines(["k.py: NOT_CHECKED: not judged: the loop stopped before its gates ran*",
                                 "*1 passed, * deselected*"])

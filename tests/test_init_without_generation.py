"""A ``--kopt-init`` on a machine that does not allow generation (SKILL.md step 0) stops at once: only its hardware
items run (pytest_kopt.plugin.loop.keep_hardware_only); their result would be thrown away."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from pytest_kopt.errors import HardwareError
from pytest_kopt.gates import hardware
from pytest_kopt.plugin.loop import hardware_only, keep_hardware_only

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


NO_GPU = {"generation_allowed": False, "reason": "no NVIDIA driver (libcuda.so.1 not found); missing tools: ncu",
          "gpu": None, "gpu_error": "no NVIDIA driver (libcuda.so.1 not found)", "gpus": [], "sm_arch": None,
          "tools": {"nvcc": {"path": "/usr/bin/nvcc", "version": "13.0"}, "ncu": {"path": None, "version": None}},
          "packages": {"torch": "2.13.0+cpu", "triton": "3.9.0"}}


def _hardware_ctx(tmp_path: Path, mode: str | None, env: dict) -> SimpleNamespace:
    return SimpleNamespace(env=env, settings=SimpleNamespace(outdir=tmp_path, loop_mode=mode), arch="sm_90a",
                           display="k.cu", kind=SimpleNamespace(check_tools=lambda ctx: None))


def test_the_hardware_item_of_a_set_up_that_cannot_generate_fails_with_the_step(tmp_path: Path) -> None:
    """An init stopped at step 0 (exit 3) fails its hardware item with the step's reason and the fix, its figures
    kept, so pytest's own line ("1 failed") and the kernel's verdict agree with the exit code."""
    with pytest.raises(HardwareError) as err:
        hardware.gate_hardware(_hardware_ctx(tmp_path, "init", NO_GPU))
    exc = err.value
    assert (exc.gate, exc.exit_code, exc.status) == ("hardware", 3, "HARDWARE_UNAVAILABLE")
    assert exc.message == ("the run's set-up needs a machine that allows generation (SKILL.md step 0): no NVIDIA "
                           "driver (libcuda.so.1 not found); missing tools: ncu")
    assert "loop.next.requires" in exc.fix
    assert exc.figures == {"gpu": "none", "sm_arch": None, "build_arch": "sm_90a", "gpu_count": 0,
                           "generation_allowed": False}
    assert json.loads((tmp_path / "env.json").read_text())["generation_allowed"] is False


@pytest.mark.parametrize("mode", [None, "run"])
def test_outside_a_set_up_no_gpu_is_not_the_hardware_items_failure(tmp_path: Path, mode: str | None) -> None:
    """Outside a loop the GPU gates skip with the reason; a --kopt-run there reports its branches' other items
    (and a finish needs no GPU), so the hardware item passes and says what it found."""
    out = hardware.gate_hardware(_hardware_ctx(tmp_path, mode, NO_GPU))
    assert out.figures["generation_allowed"] is False and out.figures["gpu_count"] == 0
    assert "no NVIDIA driver" in out.summary and "ncu missing" in out.summary


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
    assert doc["loop"]["next"]["runs_here"] is False  # the same command here stops the same way
    item = doc["items"][0]
    assert (item["outcome"], item["status"], item["exit_code"]) == ("failed", "HARDWARE_UNAVAILABLE", 3)
    assert "| `k.py` | ❌ HARDWARE_UNAVAILABLE at hardware |" in (pytester.path / "summary.md").read_text()
    result.stdout.fnmatch_lines(["k.py: HARDWARE_UNAVAILABLE at hardware",
                                 "kopt loop: run stopped at hardware*",
                                 "kopt loop next: run on a machine with an NVIDIA GPU*",
                                 "*1 failed, * deselected*"])


def test_an_init_whose_state_is_spoiled_on_a_machine_without_generation_is_rerun_elsewhere(
        pytester: pytest.Pytester) -> None:
    """A --kopt-init whose state.json is spoiled while it runs ends with exit 4 and a rerun; on a machine that does
    not allow generation (this one) that rerun would stop the same way, so next says to run it elsewhere (before
    the check was made where next is built, a set-up's next said runs_here True), with no word of a finish (a set-up
    has no methods.json)."""
    if hardware.probe_gpus()["gpus"]:
        pytest.skip("a GPU is visible here: this test is for a machine that does not allow generation")
    shutil.copy(REDTEAM / "ref_softmax.py", pytester.path / "ref.py")
    shutil.copy(REDTEAM / "honest_python.py", pytester.path / "k.py")
    pytester.makeconftest("""
import pathlib
def pytest_collection_finish(session):
    for state in pathlib.Path.cwd().glob("run_*/state.json"):
        state.write_text("{")
""")
    result = pytester.runpytest_subprocess("--kopt-baseline", "k.py", "--kopt-ref", "ref.py", "--kopt-dims",
                                           "M=64,N=64", "--kopt-init", "--kopt-json", "init.json",
                                           "-p", "no:cacheprovider", "-p", "no:randomly")
    doc = json.loads((pytester.path / "init.json").read_text())
    assert result.ret == 4 and doc["loop"]["exit_code"] == 4, result.stdout.str()
    nxt = doc["loop"]["next"]
    assert nxt["action"] == "fix_and_rerun" and nxt["runs_here"] is False
    assert "this one does not allow generation (" in nxt["requires"] and "finish" not in nxt["requires"]

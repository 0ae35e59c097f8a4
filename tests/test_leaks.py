"""The LEAK check of the timing gate (issue #39): the rule over device memory readings, the bench.json record built
from both sides' readings, NVML's per-process figure, the failure, the loop's branch, and on a GPU a .cu that leaks
a cudaMalloc per call against its honest twin."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from pytest_kopt.child.clocks import process_used
from pytest_kopt.errors import EXIT_KERNEL, LeakError
from pytest_kopt.gates import hardware
from pytest_kopt.gates.leaks import GRANULARITY_BYTES, ProcessMemory, assess, judge_growth, leak_error

MIB = 2**20
ROOT = Path(__file__).resolve().parents[1]
CASES = ROOT / "benchmarks" / "coverage_cases"
#: A timing process's memory after its warm-up, as NVML lists it for a harness process with torch's context, a
#: 4096^3 SGEMM's rotating sets and the L2 flush buffer (H200: 1,409 MiB)
HELD = 1409 * MIB


def test_warm_up_growth_then_flat_is_no_leak() -> None:
    """An honest kernel: torch's allocator grows one 20 MiB segment for the first refresh's temporaries, then the
    memory stays put for 1,900 samples."""
    points = [(9, HELD), (260, HELD + 20 * MIB), (511, HELD + 20 * MIB), (1012, HELD + 20 * MIB),
              (1513, HELD + 20 * MIB), (1914, HELD + 20 * MIB)]
    g = judge_growth(points)
    assert g.verdict == "flat" and g.growth_bytes == 20 * MIB and g.halves_bytes == (20 * MIB, 0)
    assert g.readings == 6 and g.span == 1905


def test_linear_growth_of_4_mib_per_call_is_a_leak_with_its_rate() -> None:
    points = [(calls, HELD + 4 * MIB * calls) for calls in (310, 612, 915, 1203, 1498)]
    g = judge_growth(points)
    assert g.verdict == "leak"
    assert g.rate == 4 * MIB and g.growth_bytes == 4 * MIB * (1498 - 310)
    # the middle reading is the one nearest the middle of the count (904): 915
    assert g.halves_bytes == (4 * MIB * (915 - 310), 4 * MIB * (1498 - 915))


def test_noise_below_the_granularity_is_no_leak() -> None:
    """NVML's figure wanders by less than a page (a context's own bookkeeping): never a leak, however it moves."""
    jitter = [0, 1 * MIB, 512 * 1024, 1536 * 1024, 2 * MIB - 4096, 1 * MIB]
    points = [(100 * (k + 1), HELD + j) for k, j in enumerate(jitter)]
    g = judge_growth(points)
    assert g.verdict == "flat" and 0 < g.growth_bytes < GRANULARITY_BYTES


def test_growth_that_stops_is_no_leak() -> None:
    """A lazily filled cache of 64 MiB that stops growing in the first half: bounded, not a leak."""
    points = [(100, HELD), (200, HELD + 32 * MIB), (300, HELD + 64 * MIB), (400, HELD + 64 * MIB),
              (500, HELD + 64 * MIB)]
    assert judge_growth(points).verdict == "flat"


def test_too_few_readings_are_not_judged() -> None:
    assert judge_growth([(10, HELD), (20, HELD + 40 * MIB)]).verdict == "too_few_readings"
    # three readings of two counts: one batch of calls, not two
    g = judge_growth([(10, HELD), (10, HELD + 8 * MIB), (20, HELD + 40 * MIB)])
    assert g.verdict == "too_few_readings" and g.readings == 2 and g.rate is None


def _result(outside: list[tuple[int, int | None]] | None, inside: list[dict], note: str | None = None) -> dict:
    """A timed candidate's result as the gate reads it: the pytest process's readings and the process's own."""
    res: dict = {"memory": {"readings": inside, "nvml_note": None,
                            "peak_call": {"torch_bytes": 0, "device_held_bytes": 2 * MIB, "bytes": 2 * MIB}}}
    if outside is not None:
        res["memory_outside"] = {"readings": [{"samples": s, "parties_min": s, "bytes": b} for s, b in outside],
                                 "note": note}
    return res


def _inside(samples: list[int], calls_per_sample: int, calls0: int, nvml: list[int | None], device: list[int],
            torch: list[int]) -> list[dict]:
    return [{"samples": s, "calls": calls0 + calls_per_sample * s, "nvml_bytes": n, "device_used_bytes": d,
             "torch_allocated_bytes": t, "torch_reserved_bytes": t} for s, n, d, t in zip(samples, nvml, device, torch)]


def test_a_cuda_malloc_per_call_read_outside_is_a_leak_per_call() -> None:
    """The leaking .cu: 2 MiB per call, 3,100 warm-up calls before the first round; the pytest process's NVML
    readings say so, and the first readings (inside the warm-up's rotating sets) are left out."""
    samples = [3, 254, 505, 756, 1007]
    calls0 = 3101
    outside = [(s, HELD + 2 * MIB * (calls0 + s)) for s in samples]
    inside = _inside(samples, 1, calls0, [None] * 5, [0] * 5, [64 * MIB] * 5)
    mem = assess(_result(outside, inside), sets=8)
    assert mem["leak"] is True and mem["check"] == "leak" and mem["basis"] == "nvml_outside"
    assert mem["bytes_per_call"] == 2 * MIB and mem["per"] == "call"
    assert mem["readings"] == 4 and mem["held_bytes"] == HELD + 2 * MIB * (calls0 + 254)
    assert mem["torch"]["check"] == "flat" and mem["peak_call_bytes"] == 2 * MIB
    err = leak_error(mem, "leak_malloc.cu")
    assert isinstance(err, LeakError) and err.status == "LEAK" and err.exit_code == EXIT_KERNEL
    assert err.figures["leak_bytes_per_call"] == 2 * MIB
    assert "2.000 MiB (2097152 bytes) per call over 4 readings" in err.render()


def test_a_kept_tensor_per_call_is_caught_by_torchs_figure_where_nvml_moves_in_segments() -> None:
    """A Triton kernel that keeps each call's 2 MiB output in a list: torch's allocated bytes grow exactly; the
    NVML figure also grows, in 20 MiB segments."""
    samples = [3, 120, 240, 360, 480]
    calls0 = 400
    torch_alloc = [40 * MIB + 2 * MIB * (calls0 + s) for s in samples]
    nvml = [HELD + 20 * MIB * -(-(2 * (calls0 + s)) // 20) for s in samples]
    inside = _inside(samples, 1, calls0, nvml, [0] * 5, torch_alloc)
    mem = assess(_result(None, inside, None), sets=8)
    assert mem["basis"] == "nvml_inside" and "not read by the pytest process" in mem["basis_note"]
    assert mem["leak"] is True and mem["torch"]["check"] == "leak" and mem["torch"]["bytes_per_call"] == 2 * MIB


def test_the_pid_namespace_fallback_is_the_device_figure_after_every_partys_warm_up() -> None:
    """Inside a container NVML lists the host's pids: neither side finds the timed process, so the device's used
    memory is judged, from the reading where the reference (the other party) had also taken more samples than
    there are rotating sets; the reference's own first allocations before then do not count."""
    samples = [3, 254, 505, 756]
    note = "the process's pid is not in NVML's process list (a container's pid namespace: NVML lists the host's pids)"
    # the reference's start (300 MiB) lands between the first two readings, then nothing grows
    device = [HELD, HELD + 300 * MIB, HELD + 300 * MIB, HELD + 300 * MIB]
    inside = _inside(samples, 1, 3000, [None] * 4, device, [64 * MIB] * 4)
    res = _result([(s, None) for s in samples], inside, note)
    res["memory_outside"]["readings"][1]["parties_min"] = 3  # the reference had taken 3 samples then
    mem = assess(res, sets=8)
    assert mem["basis"] == "device_used" and note in mem["basis_note"]
    assert mem["check"] == "too_few_readings" and mem["leak"] is None and mem["readings"] == 2


def test_no_readings_at_all_say_so() -> None:
    mem = assess({}, sets=8)
    assert mem["check"] == "not_read" and mem["leak"] is None and mem["basis"] is None


def test_nvml_figure_per_process() -> None:
    """NVML's process list: the harness and its children summed; a pid it does not list (another namespace) or
    NVML_VALUE_NOT_AVAILABLE gives no figure and says why."""
    procs = [SimpleNamespace(pid=4711, usedGpuMemory=HELD), SimpleNamespace(pid=4712, usedGpuMemory=2 * MIB),
             SimpleNamespace(pid=99, usedGpuMemory=80 * MIB)]
    assert process_used(procs, {4711, 4712}) == (HELD + 2 * MIB, None)
    used, why = process_used(procs, {123})
    assert used is None and "pid namespace" in why
    used, why = process_used([SimpleNamespace(pid=4711, usedGpuMemory=2**64 - 1)], {4711})
    assert used is None and "no per-process memory" in why


def test_without_nvidia_ml_py_the_reader_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "pynvml", None)  # an import of it raises ImportError
    reader = ProcessMemory("GPU-00000000-0000-0000-0000-000000000000")
    assert reader.read([4711]) is None and reader.note == "nvidia-ml-py is not installed in the pytest process"
    reader.close()


def test_a_leaking_branch_is_no_champion(tmp_path: Path) -> None:
    """The loop: a branch whose timing item failed LEAK did not pass (status LEAK, stopped at timing) however fast
    its bench.json says it was; the slower branch is the champion."""
    from pytest_kopt.gates.builtin import default_table
    from pytest_kopt.loop import decisions
    from pytest_kopt.loop.branch_step import branch_results
    from pytest_kopt.records import GateRecord

    kernels = []
    for b, ms in (("b1", 0.05), ("b2", 0.08)):
        k = tmp_path / b / "kernel.cu"
        k.parent.mkdir()
        k.write_text(f"// {b}\n")
        (k.parent / "bench.json").write_text(json.dumps({"timing_valid": True, "median_ms": ms,
                                                         "distribution": {}, "gpu_uuid": "GPU-1"}))
        kernels.append(k)
    ok = lambda k, g: GateRecord(f"{k}::{g}", str(k.resolve()), g, None, "passed", "PASSED")  # noqa: E731
    records = [ok(k, g) for k in kernels for g in ("compile", "correctness")] + [ok(kernels[1], "timing")]
    err = leak_error({"bytes_per_call": 2.0 * MIB, "per": "call", "readings": 4, "basis": "nvml_outside"}, "b1")
    records.append(GateRecord(f"{kernels[0]}::timing", str(kernels[0].resolve()), "timing", None, "failed", err.status,
                              exit_code=err.exit_code, message=err.message))
    results = branch_results(kernels, records, lambda k: SimpleNamespace(outdir=k.parent, gates=default_table()))
    assert [(r["passed"], r["status"], r["stage"]) for r in results] == [(False, "LEAK", "timing"),
                                                                         (True, "PASSED", None)]
    assert decisions.select_champion(results)["branch"] == "b2"


needs_nvcc = pytest.mark.skipif(hardware.find_tool("nvcc") is None, reason="nvcc not found")


@pytest.mark.gpu
@needs_nvcc
def test_gpu_a_cuda_malloc_per_call_fails_leak_and_its_twin_passes(pytester: pytest.Pytester) -> None:
    """On a GPU: benchmarks/coverage_cases/leak_malloc.cu (2 MiB cudaMalloc'd per call, never freed) fails its
    timing item with LEAK, exit 2, about 2 MiB per call; scratch_malloc.cu (the same, freed) is no LEAK: its memory
    is flat. Its timing verdict is the host-work rule's, not the leak check's: on an H100 (2026-12-05) it was SUSPECT
    (CUDA events 0.1136 ms a call, the kernel 6.69 us, the GPU idle 74.2 us a profiled call: the cudaMalloc and
    cudaFree around the kernel are more host work than the profiled calls showed), so only LEAK is ruled out here."""
    verdicts = {}
    for name in ("leak_malloc.cu", "scratch_malloc.cu"):
        report = pytester.path / f"{name}.json"
        result = pytester.runpytest_subprocess(
            "-p", "no:cacheprovider", "--kopt-baseline", str(CASES / name), "--kopt-ref", str(CASES / "ref.py"),
            "--kopt-dims", "n=524288", "--kopt-seeds", "1", "-k", "correctness or timing",
            "--kopt-outdir", str(pytester.path / name), "--kopt-json", str(report), timeout=600)
        doc = json.loads(report.read_text())
        timing = next(it for it in doc["items"] if it["gate"] == "timing")
        bench = json.loads(next((pytester.path / name).glob("**/bench.json")).read_text())
        verdicts[name] = (result.ret, timing["status"], timing["figures"], bench["memory"])
    ret, status, figures, memory = verdicts["leak_malloc.cu"]
    assert (ret, status) == (2, "LEAK"), memory
    # 2 MiB cudaMalloc'd per call (the driver maps whole 2 MiB pages; more only if it pads an allocation)
    assert 1.9 * MIB <= figures["leak_bytes_per_call"] <= 4.1 * MIB and memory["check"] == "leak"
    ret, status, figures, memory = verdicts["scratch_malloc.cu"]
    assert status != "LEAK" and "leak_bytes_per_call" not in figures, (status, memory)
    assert memory["check"] == "flat" and memory["leak"] is False and memory["growth_bytes"] == 0, memory


def test_forged_readings_are_dropped_not_a_crash() -> None:
    """The timed process's readings are the kernel's to forge: strings, negative or boolean figures are left out
    (the pytest process's own readings still decide), and a forged peak is no figure."""
    samples = [3, 254, 505, 756, 1007]
    outside = [(s, HELD + 2 * MIB * (3000 + s)) for s in samples]
    inside = [{"samples": "many", "calls": 1}, {"samples": 254, "calls": True, "nvml_bytes": -1}, "junk"]
    res = _result(outside, inside)
    res["memory"]["peak_call"] = {"torch_bytes": "0", "device_held_bytes": 0, "bytes": 0}
    mem = assess(res, sets=8)
    assert mem["leak"] is True and mem["basis"] == "nvml_outside" and mem["per"] == "sample"
    assert mem["bytes_per_call"] == 2 * MIB and mem["peak_call_bytes"] is None and mem["torch"]["check"] == "too_few_readings"
